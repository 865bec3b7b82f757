"""One writer per output: kp-tokenize's -o, and kp-infer's -o and --failures, are locked for
the run (kimipipe/locks.py); a second `make all` stops at the locked output.

A second process on the same output refuses at once (exit 2) naming the holder; a lock
left by a killed process is taken over; one naming another host is reported with how to
clear it; inputs are never locked; no lock file outlives a run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import pytest
from conftest import BIN, TOKENIZER_KINDS, kp, read_jsonl, response_record, write_jsonl
from helpers import paid_once_each, stderr_after, time_left, wait_for, whole_lines
from test_infer import assert_correct, ids_of, infer, make_prompts
from test_make import TOKENIZER, make_command

from kimipipe.locks import OutputLock, OutputLocked, lock_path

FAST = TOKENIZER_KINDS["fast"]


def records(n, start=0):
    return [response_record(f"r{i}", f"Question {i}?", content=f"Answer {i}.", reasoning="r")
            for i in range(start, start + n)]


def tokenize(*args, **kwargs):
    return kp("tokenize", "--tokenizer", FAST, "--workers", "1", *args, **kwargs)


def files_in(folder) -> list[str]:
    return sorted(os.listdir(folder))


def test_the_lock_names_its_holder_and_goes_when_released(tmp_path):
    out = str(tmp_path / "t.jsonl")
    with OutputLock(out, "kp-test") as lock:
        assert lock.lock_file == str(tmp_path / ".t.jsonl.lock") == lock_path(out)
        holder = json.loads(open(lock.lock_file).read())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        assert holder["command"] == "kp-test" and holder["since"]
        with pytest.raises(OutputLocked, match=f"kp-test PID {os.getpid()} on "):
            OutputLock(out, "kp-other").acquire()
    assert files_in(tmp_path) == []
    with OutputLock("-", "kp-test"):  # stdout: nothing to lock
        assert files_in(tmp_path) == []


def test_a_second_kp_tokenize_on_one_output_refuses_at_once(tmp_path):
    out = tmp_path / "t.jsonl"
    src = write_jsonl(tmp_path / "r.jsonl", records(3))
    args = [str(BIN / "kp-tokenize"), "-", "--tokenizer", str(FAST), "--workers", "1", "-q",
            "-o", str(out)]
    first = subprocess.Popen(args, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:  # it holds the lock while it waits for its input
        lock = tmp_path / ".t.jsonl.lock"
        while first.poll() is None and not (lock.exists() and lock.read_text().strip()):
            time.sleep(0.02)
        assert first.poll() is None
        second = tokenize(src, "-o", out)
        assert second.code == 2 and second.stdout == b""
        assert (f"kp-tokenize: {out} is being written by kp-tokenize PID {first.pid} on "
                f"{socket.gethostname()} since ") in second.stderr
        assert "wait for that run to end, or stop it" in second.stderr
        assert second.stderr.count("\n") == 1
        _, err = first.communicate(src.read_bytes(), timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err.decode()
    assert [r["id"] for r in read_jsonl(out)] == ["r0", "r1", "r2"]  # written once
    assert files_in(tmp_path) == ["r.jsonl", "t.jsonl"]  # the lock went with the run


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path):
    out = tmp_path / "t.jsonl"
    args = [str(BIN / "kp-tokenize"), "-", "--tokenizer", str(FAST), "-o", str(out)]
    killed = subprocess.Popen(args, stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
    lock = tmp_path / ".t.jsonl.lock"
    while killed.poll() is None and not (lock.exists() and lock.read_text().strip()):
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert lock.exists()  # a kill leaves the file; the kernel released the flock
    src = write_jsonl(tmp_path / "r.jsonl", records(2))
    r = tokenize(src, "-o", out)
    assert r.code == 0, r.stderr
    assert (f"kp-tokenize: {out}: took over the lock left by kp-tokenize PID {killed.pid} on "
            f"{socket.gethostname()} since ") in r.stderr and "no longer running" in r.stderr
    assert [x["id"] for x in read_jsonl(out)] == ["r0", "r1"]
    assert not lock.exists()


def test_a_lock_naming_another_host_is_reported_with_how_to_clear_it(tmp_path):
    out = tmp_path / "t.jsonl"
    lock = tmp_path / ".t.jsonl.lock"
    holder = {"pid": 4242, "host": "gpu-node-7.example", "since": "2025-01-02T03:04:05+00:00",
              "command": "kp-tokenize"}
    lock.write_text(json.dumps(holder) + "\n")
    src = write_jsonl(tmp_path / "r.jsonl", records(1))
    r = tokenize(src, "-o", out)
    assert r.code == 2 and not out.exists()
    assert r.stderr.strip() == (
        f"kp-tokenize: {out} is locked by kp-tokenize PID 4242 on gpu-node-7.example since "
        f"2025-01-02T03:04:05+00:00 (lock {lock}); this host cannot tell whether that run still "
        f"goes on (on NFS, locks may not reach across hosts). If it does not, remove {lock} and "
        "rerun")
    assert json.loads(lock.read_text()) == holder  # someone else's: left as it was
    lock.unlink()
    assert tokenize(src, "-o", out).code == 0


def test_inputs_are_read_never_locked(tmp_path):
    """The responses file may be locked by the kp-infer still writing it: reading it is fine."""
    src = write_jsonl(tmp_path / "r.jsonl", records(2))
    with OutputLock(str(src), "kp-infer"):
        r = tokenize(src, "-q")
        assert r.code == 0 and len(r.records()) == 2
        assert files_in(tmp_path) == [".r.jsonl.lock", "r.jsonl"]  # ours, none of its own


def test_no_lock_file_outlives_a_failed_run(tmp_path):
    out = tmp_path / "t.jsonl"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(records(1)[0]) + "\n" + '{"id": "x"}\n')
    r = tokenize(bad, "-o", out)
    assert r.code == 2 and f"{bad}:2: " in r.stderr
    assert files_in(tmp_path) == ["bad.jsonl", "t.jsonl"]


def wait_for_lines(path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while len(whole_lines(path)) < n:
        assert proc.poll() is None, "the first run ended before the second started"
        assert time.monotonic() < deadline, f"{path} did not reach {n} records"
        time.sleep(0.05)


def test_a_second_kp_infer_on_one_output_refuses_at_once(standin, tmp_path):
    # the stand-in answers 20 and holds the rest until the test lets them go: the first
    # run provably still runs while the second and third try, on any machine
    server = standin(latency=0.02, ledger=True)
    server.configure(hold_after=20)
    prompts = make_prompts(tmp_path / "p.jsonl", 120)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    first = subprocess.Popen([str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--failures",
                              str(failures), "--base-url", server.base_url, "--concurrency", "8",
                              "--quiet"], env=env, stderr=subprocess.PIPE)
    other = tmp_path / "other.jsonl"

    def refuse_two_while_the_first_is_held():
        wait_for_lines(out, 20, first)
        wait_for(lambda: server.stats()["held"], "the stand-in to hold the first run's requests")
        second = infer(server, prompts, "-o", out)
        assert second.code == 2 and second.stdout == b""
        assert second.stderr.startswith(
            f"kp-infer: {out} is being written by kp-infer PID {first.pid} on "
            f"{socket.gethostname()} since ")
        assert second.stderr.count("\n") == 1 and "wait for that run to end" in second.stderr
        # another output, the same failures file: refused too, and nothing of it is left
        third = infer(server, prompts, "-o", other, "--failures", failures)
        assert third.code == 2 and third.stderr.startswith(
            f"kp-infer: {failures} is being written by kp-infer PID {first.pid} on ")
        assert not other.exists() and not (tmp_path / ".other.jsonl.lock").exists()
        assert first.poll() is None  # the refusals came while the first was still running
        server.configure(hold_after=None)

    err = stderr_after(first, refuse_two_while_the_first_is_held, timeout=time_left())
    assert first.returncode == 0, err.decode()
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(120)]
    assert_correct(read_jsonl(out), prompts)
    paid_once_each(server, prompts)  # nothing paid twice
    stats = server.stats()
    assert stats["completions_started"] == 120
    assert stats["endpoint_requests"]["endpoints"] == 1  # the refused runs read nothing
    assert sorted(os.listdir(tmp_path)) == ["f.jsonl", "p.jsonl", "r.jsonl", "standin-0"]  # no lock


def test_a_second_make_all_stops_at_the_locked_output(standin, tmp_path):
    # the first build must still be answering when the second reaches kp-infer, however
    # loaded the machine: the stand-in answers 10 and holds the rest until the second is done
    # (counting with make's TOKENIZER, as kp-infer checks every answer against it)
    server = standin(latency=0.02, ledger=True, tokenizer=TOKENIZER)
    server.configure(hold_after=10)
    cmd, env = make_command(server, tmp_path, "all", CONCURRENCY=4, TURNS="last")  # (the ledger keys by last user text)
    responses = tmp_path / "work" / "D1.responses.jsonl"
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)
    try:
        wait_for_lines(responses, 10, first)
        wait_for(lambda: server.stats()["held"], "the stand-in to hold the first build's requests")
        second = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                timeout=time_left())
        assert first.poll() is None
        server.configure(hold_after=None)
        _, err = first.communicate(timeout=time_left())
    finally:
        if first.poll() is None:
            os.killpg(first.pid, 9)
            first.wait()
    assert second.returncode == 2, second.stderr  # make's status when a recipe fails
    assert f"kp-infer: {responses} is being written by kp-infer PID " in second.stderr
    assert "D1.responses.done] Error 2" in second.stderr  # make stopped at that stage
    assert first.returncode == 0, err.decode()
    ids = [x["id"] for x in read_jsonl(responses)]
    assert len(ids) == len(set(ids)) == 260
    manifest = json.loads((tmp_path / "shards" / "D1" / "kp-shard.manifest").read_text())
    assert manifest["totals"]["records"] == 260
    paid_once_each(server, tmp_path / "work" / "D1.prompts.jsonl")
    assert not [p for p in (tmp_path / "work").iterdir() if p.name.endswith(".lock")]

