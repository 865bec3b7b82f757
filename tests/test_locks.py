"""One writer per output: kp-tokenize's -o is locked for the run (kimipipe/locks.py).

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
