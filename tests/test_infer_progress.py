"""kp-infer's progress line and its stops (docs/kp-infer.md), through the command line.

The line fits an 80-column terminal (a pseudo-terminal of 80x24) with its essentials first;
when stderr is not a terminal it is printed as plain lines now and then (no `\\r` frames);
a Ctrl-C or a SIGTERM in every phase of a run ends it within --grace (exit 130, whole
lines, nothing paid for twice on the resume).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import time

from conftest import BIN, read_jsonl, write_jsonl
from helpers import paid_once_each
from test_infer import ids_of, infer, make_prompts

from kimipipe.infer.progress import ProgressSnapshot, progress_line

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PROGRESS = re.compile(r"^(kp-infer: )?\d[\d,]*/\d[\d,]*\b")  # a progress frame, not a message
WHOLE_PART_AT_END = re.compile(
    r"(^(kp-infer: )?[\d,]+/[\d,]+|\(max \d+\)|after 429s\)|all sent|waiting for [-\w ]+|"
    r"\$[\d.,]+ (of \$[\d.,]+|spent|in flight of \$[\d.,]+)|429s [\d,]+|[\d,]+ failed|(ETA|oldest) (\d+h\d\dm|\d+m\d\ds|\d+s)|"
    r"retries [\d,]+|in back-off|[\d,]+ tok/s|tok left)$")


def start(server, *args, **popen) -> subprocess.Popen:
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key, **popen.pop("env", {})}
    return subprocess.Popen([str(BIN / "kp-infer"), *map(str, args), "--base-url", server.base_url],
                            env=env, **popen)


def wait_until(condition, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"kp-infer ended before {what}"
        assert time.monotonic() < deadline, f"no {what}"
        time.sleep(0.05)


def run_in_terminal(server, *args, columns: int = 80, rows: int = 24) -> tuple[int, str]:
    """kp-infer ARGS with stderr on a pseudo-terminal of COLUMNS x ROWS: (exit code, what it drew)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    proc = start(server, *args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    drawn = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        assert ready, "kp-infer drew nothing for 120 s"
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the other end closed
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    return proc.wait(timeout=60), drawn.decode("utf-8", "replace")


def test_progress_line_fits_an_80_column_terminal_with_its_essentials(standin, tmp_path):
    server = standin(latency=0.4, faults={"429": 0.25}, retry_after=0.05, seed=3, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 12)
    out = tmp_path / "r.jsonl"
    code, drawn = run_in_terminal(server, prompts, "-o", out, "--concurrency", "4",
                                  "--max-cost", "5", "--backoff-base", "0.05")
    assert code == 0, drawn
    frames = [ANSI.sub("", f) for f in re.split(r"[\r\n]", drawn)]
    progress = [f.rstrip() for f in frames if PROGRESS.match(f)]
    assert len(progress) >= 3, drawn
    assert all(len(f) <= 80 for f in progress), [f for f in progress if len(f) > 80]
    # fitted by leaving whole parts off, not cut at the edge of the terminal
    cut = [f for f in progress if not WHOLE_PART_AT_END.search(f)]
    assert not cut, cut
    seen = "\n".join(progress)
    assert "/12" in progress[-1].split(",")[0] and "12/12" in progress[-1]
    assert re.search(r"\d+ in flight \((max 4|limit \d after 429s)\)", seen), seen
    assert "of $5" in seen and "ETA " in seen and "429s " in seen, seen
    assert "█" not in seen and "|" not in seen  # no bar graphics at 80 columns
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(12)]


def test_plain_progress_lines_when_stderr_is_not_a_terminal(standin, tmp_path):
    server = standin(latency=0.3)
    prompts = make_prompts(tmp_path / "p.jsonl", 8)
    r = infer(server, prompts, "-o", tmp_path / "r.jsonl", "--concurrency", "2",
              env={"KP_PROGRESS_INTERVAL": "0.2"})
    assert r.code == 0, r.stderr
    assert "\r" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("kp-infer: ") and PROGRESS.match(x)]
    assert len(lines) >= 3, r.stderr  # the first, some every 0.2 s over ~1.2 s, the last
    assert lines[0] == "kp-infer: 0/8"  # drawn as the run starts
    assert all(re.match(r"kp-infer: \d/8, \d in flight", x) for x in lines[1:]), lines
    assert lines[-1].startswith("kp-infer: 8/8, 0 in flight, all sent, $")
    quiet = infer(server, prompts, "-o", tmp_path / "q.jsonl", "--quiet",
                  env={"KP_PROGRESS_INTERVAL": "0.05"})
    assert quiet.code == 0 and quiet.stderr == ""


def test_the_progress_line_shows_the_cap_that_binds(standin, tmp_path):
    """--max-cost 95 (make's MAX_COST default) with --total-cost 5 binding: the line shows the
    build's spend (another dataset's file counted) of $5 total, not this output's of $95."""
    server = standin(latency=0.2)
    prompts = make_prompts(tmp_path / "p.jsonl", 6)
    other = write_jsonl(tmp_path / "B4.responses.jsonl", [
        {"id": "x", "dataset": "B4", "api": "127.0.0.1", "generation_id": "gen-standin-x",
         "usage": {"prompt_tokens": 1, "completion_tokens": 1, "cost": 1.25}}])
    r = infer(server, prompts, "-o", tmp_path / "r.jsonl", "--concurrency", "2",
              "--max-cost", "95", "--total-cost", "5", "--spent-in", other,
              env={"KP_PROGRESS_INTERVAL": "0.2"})
    assert r.code == 0, r.stderr
    last = [x for x in r.stderr.splitlines() if x.startswith("kp-infer: 6/6")][-1]
    spent = sum(x["usage"]["cost"] for x in read_jsonl(tmp_path / "r.jsonl")) + 1.25
    assert f", ${spent:.2f} of $5 total" in last and "of $95" not in r.stderr, last
    r = infer(server, prompts, "-o", tmp_path / "s.jsonl", "--max-cost", "3",
              "--total-cost", "50", "--spent-in", other, env={"KP_PROGRESS_INTERVAL": "0.2"})
    assert r.code == 0 and ", $" in r.stderr and " of $3," in r.stderr and "total" not in r.stderr


def test_progress_line_reads_right_and_fits_any_width():
    """The formatting alone (a pure function of a snapshot): a count above a shrunk limit
    says why, the money-in-flight slot shows when set, and every width is honoured."""
    snap = ProgressSnapshot(finished=123_456, total=400_000, failed=12, in_flight=95, limit=75,
                            concurrency=100, spent=123.45, cap=1000, rate_limited=1_234,
                            eta=7_300, oldest=185, retries=56, backing_off=7, tokens_per_s=45_678,
                            tokens_left=12_345_678)
    line = progress_line(snap, 79)
    assert line == "123,456/400,000, 95 in flight (limit 75 after 429s), $123.45 of $1,000"
    assert progress_line(snap, 110).startswith(f"{line}, 429s 1,234, 12 failed, ETA 2h01m")
    for width in (20, 40, 60, 79, 80, 99, 100, 132, 200):
        assert len(progress_line(snap, width)) <= width
    assert "[" in progress_line(snap, 250)  # a bar only where there is room for it
    whole = progress_line(snap)
    assert whole.startswith("kp-infer: ") and "oldest 3m05s" in whole and "2h01m" in whole
    assert "12 failed" in whole
    assert "in flight of" not in whole
    snap.money_in_flight = (0.4, 2.0)
    assert "$123.45 of $1,000, $0.4000 in flight of $2, 429s" in progress_line(snap)
    snap.waiting = "--max-cost room"
    assert "95 in flight, waiting for --max-cost room, " in progress_line(snap, 79)
    snap.stopping, snap.grace_left = "interrupted", 41
    assert "95 in flight, stopping (interrupted), 41s grace left, $123.45" in progress_line(snap, 90)


# -- Ctrl-C and SIGTERM in every phase -------------------------------------------------------

def test_sigint_after_the_last_admission_is_bounded_by_grace(standin, tmp_path):
    """The last prompts are in flight and admission is over: a Ctrl-C waits --grace for
    them, not until they finish (it once waited for them all). Through worker processes."""
    server = standin(latency=3, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 6)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    proc = start(server, prompts, "-o", out, "--concurrency", "3", "--grace",
                 "0.3", "--summary-json", summary, stderr=subprocess.PIPE)
    wait_until(lambda: server.stats()["completions_started"] == 6, proc, "the last admission")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)  # grace 0.3 s + a generous margin; not 3 s x ...
    assert proc.returncode == 130, err
    s = json.loads(summary.read_text())
    assert s["stop_reason"] == "interrupted" and s["abandoned_in_flight"] == 3, s
    assert s["done"] == 3 and len(ids_of(out)) == 3  # whole lines: the 3 answered before
    assert out.read_bytes().endswith(b"\n")
    server.configure(latency=0)
    r = infer(server, prompts, "-o", out)
    assert r.code == 0, r.stderr
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(6)]
    paid_once_each(server, prompts)  # the 3 cancelled were not billed, nothing twice


def test_sigint_during_backoff_ends_at_once(standin, tmp_path):
    """Every request is rate-limited and waits a minute's Retry-After: a Ctrl-C does not
    wait it out (nothing is in flight), exits 130, and the resume finishes the work."""
    server = standin(faults={"429": 1.0}, retry_after=60, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    out = tmp_path / "r.jsonl"
    proc = start(server, prompts, "-o", out, "--concurrency", "3",
                 stderr=subprocess.PIPE)
    wait_until(lambda: server.stats()["completions_started"] >= 3, proc, "three 429s")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)  # not the 60 s of Retry-After
    assert proc.returncode == 130, err
    assert b"interrupted" in err and read_jsonl(out) == []
    server.configure(faults={})
    r = infer(server, prompts, "-o", out)
    assert r.code == 0 and len(ids_of(out)) == 3
    paid_once_each(server, prompts)


def test_sigterm_while_reading_the_input_exits_130(standin, tmp_path):
    """Before anything is sent (the input still arriving on stdin), SIGTERM is a Ctrl-C:
    exit 130 and the one line, not a silent death; the output's lock is released."""
    server = standin()
    out = tmp_path / "r.jsonl"
    proc = start(server, "-", "-o", out, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(make_prompts(tmp_path / "p.jsonl", 2).read_bytes())
    proc.stdin.flush()  # and the pipe left open: kp-infer is still reading its input
    wait_until(lambda: (tmp_path / ".r.jsonl.lock").exists(), proc, "the output's lock")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert b"interrupted" in err
    assert server.stats()["completions_started"] == 0
    r = infer(server, tmp_path / "p.jsonl", "-o", out)  # not locked out
    assert r.code == 0 and len(ids_of(out)) == 2


def test_sigterm_during_the_preflight_exits_130_at_once(standin, tmp_path):
    """--preflight's few requests hang: SIGTERM ends it like a Ctrl-C (exit 130, one line),
    not a silent death, and not after the answers."""
    server = standin(latency=60)
    prompts = make_prompts(tmp_path / "p.jsonl", 2)
    proc = start(server, prompts, "-o", tmp_path / "r.jsonl", "--preflight", "2",
                 stderr=subprocess.PIPE)
    wait_until(lambda: server.stats()["in_flight"] == 2, proc, "the preflight's requests")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)  # not the 60 s the answers take
    assert proc.returncode == 130, err
    assert b"interrupted" in err and b"Traceback" not in err


def test_the_progress_total_never_moves_when_conversations_end_early(standin, tmp_path):
    """20 conversations of 3 turns (60 requests planned), most cut by --max-tokens before
    their last turn: every line says /60, and the turns that will not be sent are said
    apart, as the summary counts them."""
    from test_infer_conversations import make_conversations

    server = standin(latency=0.05)
    prompts = make_conversations(tmp_path / "p.jsonl", 20, turns=3)
    summary = tmp_path / "s.json"
    r = infer(server, prompts, "-o", tmp_path / "r.jsonl", "--max-tokens", "120",
              "--concurrency", "4", "--summary-json", summary, env={"KP_PROGRESS_INTERVAL": "0.05"})
    assert r.code == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if PROGRESS.match(x)]
    assert len(lines) >= 3, r.stderr
    assert {re.match(r"kp-infer: \d+/(\d+)", x).group(1) for x in lines} == {"60"}, lines
    not_sent = json.loads(summary.read_text())["conversations"]["turns_not_sent"]
    answered = len(read_jsonl(tmp_path / "r.jsonl"))
    assert not_sent > 0 and answered + not_sent == 60
    assert lines[-1].startswith(f"kp-infer: {answered}/60, conversations 20 done, 0 in progress, "
                                f"{not_sent} later turns not sent"), lines[-1]
