"""The suite's way of starting kp-* commands (tests/forked.py) against the console scripts.

Most tests run a command through conftest.kp, a child of a fork server that has the
commands imported. What a test reads of a command (exit code, stdout, stderr, files it
wrote, the requests it sent) must be what the console script, started by a shell, gives:
each case here runs both ways and compares them whole.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import time

import forked
import pytest
from conftest import BIN, EXEC_ALWAYS, TOKENIZER_KINDS, kp, response_record, write_jsonl
from helpers import children, wait_for

KEY = "sk-or-v1-forked-0123456789-secret"

# (KP_EXEC=1 starts no command from the servers: nothing here to compare)
pytestmark = pytest.mark.skipif(EXEC_ALWAYS, reason="KP_EXEC=1: no fork servers")


def both(command, *args, **kw):
    """The command run forked and as its script: both results, the forked one checked to
    have come from the fork server."""
    runs0 = forked.SERVER.runs
    fork = kp(command, *args, start="fork", **kw)
    assert forked.SERVER.runs == runs0 + 1, "the fork server did not run it"
    exec_ = kp(command, *args, start="exec", **kw)
    assert forked.SERVER.runs == runs0 + 1
    return fork, exec_


def same(a, b):
    assert (a.code, a.stdout, a.stderr) == (b.code, b.stdout, b.stderr)


def test_a_filter_reads_stdin_writes_stdout_and_files_in_its_own_cwd(tmp_path):
    lines = b"".join(json.dumps({"id": f"p{i}", "conversations": [
        {"from": "human", "value": f"question {i}"}]}).encode() + b"\n" for i in range(5))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fork = kp("prompts", "-", "--dataset", "B3", "-o", "out.jsonl", input=lines,
              cwd=tmp_path / "a", start="fork")
    exec_ = kp("prompts", "-", "--dataset", "B3", "-o", "out.jsonl", input=lines,
               cwd=tmp_path / "b", start="exec")
    same(fork, exec_)
    assert fork.code == 0
    written = (tmp_path / "a" / "out.jsonl").read_bytes()
    assert written and written == (tmp_path / "b" / "out.jsonl").read_bytes()
    # and to stdout, for a pipe
    fork, exec_ = both("prompts", "-", "--dataset", "B3", input=lines, cwd=tmp_path)
    same(fork, exec_)
    assert fork.stdout == written


@pytest.mark.parametrize("args", [
    ("infer", "--concurrency", "0", "p.jsonl"),  # a usage error: click's, exit 2
    ("shard", "verify", "no-such-dir"),  # a word of a group, its own error
    ("tokenize", "--help"),
    ("credits",),  # no key: its message, exit 2
])
def test_errors_help_and_exit_codes_are_the_scripts(tmp_path, args):
    env = {"OPENROUTER_API_KEY": ""}
    fork, exec_ = both(*args, cwd=tmp_path, env=env)
    same(fork, exec_)


def test_the_environment_is_the_runs_own_and_the_key_stays_out(standin, tmp_path):
    server = standin()
    env = {"OPENROUTER_BASE_URL": server.base_url, "OPENROUTER_API_KEY": server.api_key}
    fork, exec_ = both("credits", "--json", env=env, cwd=tmp_path)
    same(fork, exec_)
    assert fork.code == 0 and json.loads(fork.stdout)
    wrong = {**env, "OPENROUTER_API_KEY": KEY}  # refused (401): the key is not echoed
    fork, exec_ = both("credits", env=wrong, cwd=tmp_path)
    same(fork, exec_)
    assert fork.code != 0 and KEY not in fork.stderr


def test_a_run_past_its_timeout_is_killed(tmp_path):
    fifo = tmp_path / "never"
    os.mkfifo(fifo)  # opening it for reading blocks: the command never ends by itself
    with pytest.raises(subprocess.TimeoutExpired):
        kp("prompts", str(fifo), "--dataset", "B3", timeout=2, start="fork")
    assert not forked.SERVER.running(), "the timed-out child was left running"


def test_an_environment_the_interpreter_reads_at_start_is_started_fresh(tmp_path):
    """PYTHON* and the locale are read as an interpreter starts: a fork would inherit the
    server's, so such a run is the script's."""
    runs0 = forked.SERVER.runs
    r = kp("prompts", "--help", env={"PYTHONIOENCODING": "latin-1"}, cwd=tmp_path)
    assert r.code == 0 and forked.SERVER.runs == runs0


@pytest.mark.parametrize("kind", sorted(TOKENIZER_KINDS))
def test_kp_tokenize_forked_with_transformers_imported_is_the_scripts(tmp_path, kind):
    """kp-tokenize (and kp-infer --tokenizer) fork from the server that has transformers
    imported: the same IDs, summary and exit code as the script, with its own environment
    (the commands' variables) and a rejected record among them."""
    src = write_jsonl(tmp_path / "r.jsonl", [
        response_record("a", "What is 2+2?", content="It is 4.", reasoning="Two and two."),
        response_record("b", "Hi", content="", reasoning="Let me", finish_reason="length"),
        response_record("c", "Hi", content="", finish_reason="length")])  # (rejected: no text)
    args = ("--tokenizer", TOKENIZER_KINDS[kind], "--trust-remote-code", "--workers", "2")
    env = {"KP_UNUSED": "1"}
    hot = forked.SERVER.hot.runs
    fork = kp("tokenize", src, *args, "-o", tmp_path / "fork.jsonl", env=env, start="fork")
    assert forked.SERVER.hot.runs == hot + 1, f"not forked from the warm server: {forked.SERVER.differs}"
    exec_ = kp("tokenize", src, *args, "-o", tmp_path / "exec.jsonl", env=env, start="exec")
    assert fork.code == exec_.code == 4
    said = [re.sub(r"\[[^\]]*/s\]", "[timing]", r.stderr.replace(name, "OUT"))  # (a bar's rate)
            for r, name in ((fork, "fork.jsonl"), (exec_, "exec.jsonl"))]
    assert said[0] == said[1] and "rejected c" in said[0]
    assert (tmp_path / "fork.jsonl").read_bytes() == (tmp_path / "exec.jsonl").read_bytes()
    # an environment transformers reads as it is imported: the cold server, which it imports in
    hot = forked.SERVER.hot.runs
    r = kp("tokenize", src, *args, "-o", tmp_path / "cold.jsonl", start="fork",
           env={"HF_HOME": str(tmp_path / "hf")})
    assert forked.SERVER.hot.runs == hot and r.code == 4
    assert (tmp_path / "cold.jsonl").read_bytes() == (tmp_path / "exec.jsonl").read_bytes()


# --- make's shims (Servers.shim_bin) ------------------------------------------------------

def shim(command: str) -> str:
    return os.path.join(forked.SERVER.shim_bin(BIN), f"kp-{command}")


def test_a_shim_runs_the_command_on_its_own_descriptors_with_its_exit_code(tmp_path):
    """As make starts it: the shim's stdin, stdout and stderr are the command's own (a pipe
    into the next command, a file), and its exit code is the command's."""
    lines = b"".join(json.dumps({"id": f"p{i}", "conversations": [
        {"from": "human", "value": f"question {i}"}]}).encode() + b"\n" for i in range(5))
    src = tmp_path / "s.jsonl"
    src.write_bytes(lines)
    cpu0 = forked.SERVER.cpu
    with open(src, "rb") as stdin:
        via = subprocess.run([shim("prompts"), "-", "--dataset", "B3"], stdin=stdin,
                             capture_output=True, cwd=tmp_path, timeout=60)
        stdin.seek(0)
        real = subprocess.run([str(BIN / "kp-prompts"), "-", "--dataset", "B3"], stdin=stdin,
                              capture_output=True, cwd=tmp_path, timeout=60)
    assert (via.returncode, via.stdout, via.stderr) == (real.returncode, real.stdout, real.stderr)
    assert via.returncode == 0 and via.stdout.count(b"\n") == 5
    assert forked.SERVER.cpu > cpu0  # forked, and its CPU counted
    bad = subprocess.run([shim("infer"), "--concurrency", "0", "p.jsonl"], capture_output=True,
                         cwd=tmp_path, timeout=60)
    real = subprocess.run([str(BIN / "kp-infer"), "--concurrency", "0", "p.jsonl"],
                          capture_output=True, cwd=tmp_path, timeout=60)
    assert (bad.returncode, bad.stderr) == (real.returncode, real.stderr) and bad.returncode == 2


def _blocked(argv, tmp_path):
    """ARGV started on a FIFO nobody writes (it blocks opening it), once it is in place."""
    fifo = tmp_path / f"fifo{len(list(tmp_path.iterdir()))}"
    os.mkfifo(fifo)
    proc = subprocess.Popen([*argv, str(fifo), "--dataset", "B3"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=tmp_path)
    return proc


def _writer_once_read(fifo, proc, timeout: float = 120):
    """The FIFO's write end, opened once the command has opened it to read: from then on
    the command is blocked reading it, past its start (imports, signal handling). Opening
    the write end without blocking fails (ENXIO) until a reader is there."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
        assert proc.poll() is None and time.monotonic() < deadline, "the command never read its input"
        time.sleep(0.02)


def _states(shim_pid: int) -> dict:
    """The shim's and the fork servers' children's state, signal masks and kernel wait."""
    def state(pid):
        try:
            status = dict(line.split(":\t", 1) for line in
                          open(f"/proc/{pid}/status").read().splitlines() if ":\t" in line)
            wchan = open(f"/proc/{pid}/wchan").read()
        except OSError as e:
            return str(e)
        return {k: status.get(k, "").strip() for k in ("State", "SigPnd", "ShdPnd", "SigBlk",
                                                        "SigIgn", "SigCgt")} | {"wchan": wchan}
    servers = [s.proc.pid for s in (forked.SERVER.cold, forked.SERVER.hot) if s.proc]
    return {"shim": state(shim_pid)} | {f"server {p}": state(p) for p in servers} | {
        f"child {c}": state(c) for p in servers for c in children(p)}


def test_a_shim_passes_a_signal_on_and_ends_as_the_command_did(tmp_path):
    """SIGINT to a command blocked reading its input: the shim passes it on and ends as the
    command run directly does (exit 130, its one line). The signal goes once the command
    reads (a fixed sleep sent it, on a loaded machine, to an interpreter still importing:
    a KeyboardInterrupt traceback, -2)."""
    ends = []
    for argv in ([shim("prompts")], [str(BIN / "kp-prompts")]):
        proc = _blocked(argv, tmp_path)
        writer = _writer_once_read(tmp_path / f"fifo{len(ends)}", proc)
        try:
            proc.send_signal(signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:  # (once on CI: what each process was doing)
                raise AssertionError(f"no end 60 s after SIGINT: {_states(proc.pid)}") from None
        finally:
            os.close(writer)
        ends.append((proc.returncode, out, err))
    assert ends[0] == ends[1]
    assert ends[0][0] == 130 and ends[0][2].split(b"\n")[-2].startswith(b"kp-prompts: interrupted")


def test_a_shim_killed_takes_its_command_with_it(tmp_path):
    """make's process group killed (SIGKILL): the shims die, and so do their commands."""
    server = forked.SERVER
    shim("prompts")  # (the servers started)
    before = set(children(server.cold.proc.pid))
    proc = _blocked([shim("prompts")], tmp_path)
    wait_for(lambda: set(children(server.cold.proc.pid)) - before, "the shim's command",
             timeout=30)
    (command,) = set(children(server.cold.proc.pid)) - before
    proc.kill()
    proc.wait()
    wait_for(lambda: command not in children(server.cold.proc.pid),
             "the command to end with its shim", timeout=30)
