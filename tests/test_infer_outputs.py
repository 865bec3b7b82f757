"""kp-infer's outputs: one writer each, checked before anything is done, and stops that say
what to do next (issue 19 item 1, issue 18 items 3 and 9), through the CLI and the Makefile
against the stand-in."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections import Counter

import pytest
from conftest import BIN, read_jsonl
from helpers import whole_lines
from test_infer import assert_correct, ids_of, infer, make_prompts
from test_make import make_command

from kimipipe.standin.answers import user_text_sha256


def wait_for_lines(path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while len(whole_lines(path)) < n:
        assert proc.poll() is None, "the first run ended before the second started"
        assert time.monotonic() < deadline, f"{path} did not reach {n} records"
        time.sleep(0.05)


def paid_once_each(server, prompts_path) -> None:
    """The stand-in billed every prompt of PROMPTS_PATH exactly once."""
    paid = Counter(x["request_user_text_sha256"] for x in server.ledger())
    expected = {user_text_sha256(p["messages"]) for p in read_jsonl(prompts_path)}
    assert set(paid) == expected and set(paid.values()) == {1}


def test_a_second_kp_infer_on_one_output_refuses_at_once(standin, tmp_path):
    server = standin(latency=0.2, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 600)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    first = subprocess.Popen([str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--failures",
                              str(failures), "--base-url", server.base_url, "--concurrency", "8",
                              "--quiet"], env=env, stderr=subprocess.PIPE)
    try:
        wait_for_lines(out, 20, first)
        second = infer(server, prompts, "-o", out)
        assert second.code == 2 and second.stdout == b""
        assert second.stderr.startswith(
            f"kp-infer: {out} is being written by kp-infer PID {first.pid} on "
            f"{socket.gethostname()} since ")
        assert second.stderr.count("\n") == 1 and "wait for that run to end" in second.stderr
        # another output, the same failures file: refused too, and nothing of it is left
        other = tmp_path / "other.jsonl"
        third = infer(server, prompts, "-o", other, "--failures", failures)
        assert third.code == 2 and third.stderr.startswith(
            f"kp-infer: {failures} is being written by kp-infer PID {first.pid} on ")
        assert not other.exists() and not (tmp_path / ".other.jsonl.lock").exists()
        assert first.poll() is None  # the refusals came while the first was still running
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err.decode()
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(600)]
    assert_correct(read_jsonl(out), prompts)
    paid_once_each(server, prompts)  # nothing paid twice
    stats = server.stats()
    assert stats["completions_started"] == 600
    assert stats["endpoint_requests"]["endpoints"] == 1  # the refused runs read nothing
    assert sorted(os.listdir(tmp_path)) == ["f.jsonl", "p.jsonl", "r.jsonl", "standin-0"]  # no lock


def test_a_second_make_all_stops_at_the_locked_output(standin, tmp_path):
    server = standin(latency=0.2, ledger=True)
    cmd, env = make_command(server, tmp_path, "all", CONCURRENCY=4, TURNS="last")  # (the ledger keys by last user text)
    responses = tmp_path / "work" / "D1.responses.jsonl"
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)
    try:
        wait_for_lines(responses, 10, first)
        # the first build must still be answering when the second reaches kp-infer, however
        # loaded the machine: slow answers while the second runs, fast ones after
        server.configure(latency=8.0)
        second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert first.poll() is None
        server.configure(latency=0.05)
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, 9)
            first.wait()
    assert second.returncode != 0
    assert f"kp-infer: {responses} is being written by kp-infer PID " in second.stderr
    assert "D1.responses.done] Error 2" in second.stderr  # make stopped at that stage
    assert first.returncode == 0, err.decode()
    ids = [x["id"] for x in read_jsonl(responses)]
    assert len(ids) == len(set(ids)) == 260
    manifest = json.loads((tmp_path / "shards" / "D1" / "manifest.json").read_text())
    assert manifest["totals"]["records"] == 260
    paid_once_each(server, tmp_path / "work" / "D1.prompts.jsonl")
    assert not [p for p in (tmp_path / "work").iterdir() if p.name.endswith(".lock")]


@pytest.mark.parametrize("option", ["--summary-json", "-o", "--failures", "--rescue"])
def test_an_output_that_cannot_be_written_is_refused_before_anything(standin, tmp_path, option):
    """Checked first: exit 2, one line, no request (not even the endpoints table), no file
    created, no lock file. Before, an unwritable --summary-json paid for every answer and
    then exited 1."""
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 5)
    outputs = {"-o": tmp_path / "r.jsonl", "--failures": tmp_path / "f.jsonl",
               "--summary-json": tmp_path / "s.json", "--rescue": tmp_path / "rescue"}
    if option == "--rescue":
        bad = tmp_path / "a-file"
        bad.write_text("")
        problem = "is a file"
    else:
        bad = tmp_path / "a-dir"
        bad.mkdir()
        problem = "is a directory"
    outputs[option] = bad
    before = sorted(os.listdir(tmp_path))
    r = infer(server, prompts, *[x for pair in outputs.items() for x in pair])
    assert r.code == 2, r.stderr
    assert r.stderr == f"kp-infer: cannot write {option} {bad}: {problem}\n"
    assert server.stats()["requests"] == 0
    assert sorted(os.listdir(tmp_path)) == before
    missing = tmp_path / "no-such-dir" / "s.json"
    r = infer(server, prompts, "-o", tmp_path / "r.jsonl", "--summary-json", missing)
    assert r.code == 2 and r.stderr == (f"kp-infer: cannot write --summary-json {missing}: no such "
                                        f"directory: {missing.parent}\n")
    assert sorted(os.listdir(tmp_path)) == before and server.stats()["requests"] == 0


def test_exit_4_names_the_failures_file_and_says_a_rerun_retries(standin, tmp_path):
    server = standin(faults={"503": 1.0})
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--max-attempts", "1", "--failures", failures)
    assert r.code == 4, r.stderr
    assert r.stderr.rstrip().splitlines()[-1] == (
        f"  finished with 3 permanent failures: see {failures}; rerun the same command to retry "
        "the prompts that failed")
    r = infer(server, prompts, "-o", out, "--max-attempts", "1")
    assert r.code == 4 and r.stderr.rstrip().splitlines()[-1] == (
        "  finished with 3 permanent failures; rerun the same command to retry the prompts that "
        "failed (add --failures FILE to keep why each failed)")
    server.configure(faults={})
    r = infer(server, prompts, "-o", out, "--failures", failures)  # as it says: a rerun retries
    assert r.code == 0 and sorted(ids_of(out)) == ["p00000", "p00001", "p00002"]


def test_a_closed_output_pipe_reports_what_it_paid_for_and_could_not_write(standin, tmp_path):
    """Without -q the summary counts the answers paid for that stdout could not take, and
    their cost (the -q case, silent with exit 0, is test_infer's)."""
    server = standin(latency=0.05, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 400)
    summary = tmp_path / "s.json"
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    proc = subprocess.run(
        f"'{BIN}/kp-infer' '{prompts}' --base-url {server.base_url} --concurrency 4 "
        f"--summary-json '{summary}' | head -1", shell=True, capture_output=True, env=env, timeout=120)
    assert len(proc.stdout.splitlines()) == 1
    err = proc.stderr.decode()
    s = json.loads(summary.read_text())
    lost = s["paid_not_written"]
    assert s["exit_code"] == 0 and s["stop_reason"] == "closed-pipe"
    assert lost["answers"] >= 1 and lost["rescued"] == 0 and lost["rescue_file"] is None
    ledger = server.ledger()
    assert s["done"] + lost["answers"] == len(ledger)  # every answer paid for is counted
    assert s["spend_this_run"] == pytest.approx(sum(x["cost"] for x in ledger), rel=1e-6)
    assert (f"  paid for but not written (stdout was closed): {lost['answers']:,} "
            f"answer{'s' if lost['answers'] != 1 else ''}, ${lost['cost']:.6f}") in err
    assert "Traceback" not in err
