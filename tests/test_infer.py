"""kp-infer against the OpenRouter stand-in, through real sockets, run as a subprocess."""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import time

import pytest
from conftest import BIN, kp, read_jsonl, write_jsonl

from kimipipe.infer.identity import UNCHECKED_WARNING
from kimipipe.standin.answers import expected_answer

KEY = "sk-or-v1-testkey-0123456789abcdef"

# The rules that matter most run with the HTTP work in one worker process and in two.


def make_prompts(path, n, dataset="B3", start=0):
    rows = []
    for i in range(start, start + n):
        messages = [{"role": "user", "content": f"Question number {i}: why is {i} interesting? 你好"}]
        if i % 5 == 0:
            messages = [{"role": "system", "content": "Be brief."}, *messages]
        rows.append({"id": f"p{i:05d}", "dataset": dataset, "messages": messages,
                     "meta": {"n": i}})
    return write_jsonl(path, rows)


def infer(server, *args, env=None, timeout=180):
    return kp("infer", "--base-url", server.base_url, "--backoff-base", "0.01", *args,
              env={"OPENROUTER_API_KEY": server.api_key, **(env or {})}, timeout=timeout)


def assert_correct(records, prompts_path, **answer_args):
    prompts = {p["id"]: p for p in read_jsonl(prompts_path)}
    for rec in records:
        prompt = prompts[rec["id"]]
        assert rec["messages"] == prompt["messages"] and rec["meta"] == prompt["meta"]
        expected = expected_answer(prompt["messages"], model=rec["model"], seed=answer_args.get("seed"),
                                   reasoning=answer_args.get("reasoning", True),
                                   max_tokens=answer_args.get("max_tokens", 16384))
        assert rec["response"]["content"] == expected.content
        assert rec["response"]["reasoning"] == expected.reasoning
        assert rec["finish_reason"] == expected.finish_reason
        assert rec["usage"]["completion_tokens"] == expected.completion_tokens
        assert rec["usage"]["cost"] > 0
        assert rec["provider"] and rec["generation_id"]
        # when it was written, to the millisecond (the build report's time axis)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", rec["finished_at"])
        assert abs(datetime.datetime.fromisoformat(rec["finished_at"]).timestamp() - time.time()) < 600


def ids_of(path):
    ids = [r["id"] for r in read_jsonl(path)]
    assert len(ids) == len(set(ids)), "an ID was written twice"
    return ids


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_every_prompt_gets_its_own_answer(standin, tmp_path, stream):
    server = standin(ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 40)
    out = tmp_path / "r.jsonl"
    summary = tmp_path / "summary.json"
    r = infer(server, prompts, "-o", out, stream, "--concurrency", "16", "--summary-json", summary)
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(40)]
    assert_correct(records, prompts)
    ledger = server.ledger()
    assert len(ledger) == 40
    assert sum(x["usage"]["cost"] for x in records) == pytest.approx(sum(x["cost"] for x in ledger), rel=1e-9)
    s = json.loads(summary.read_text())
    assert s["done"] == 40 and s["exit_code"] == 0
    assert s["spend_this_run"] == pytest.approx(sum(x["cost"] for x in ledger), rel=1e-6)
    assert "40 done" in r.stderr


def test_stdout_output_and_stdin_input(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 5)
    r = kp("infer", "-", "--base-url", server.base_url, "--quiet",
           input=prompts.read_bytes(), env={"OPENROUTER_API_KEY": server.api_key})
    assert r.code == 0, r.stderr
    assert sorted(x["id"] for x in r.records()) == [f"p{i:05d}" for i in range(5)]
    assert r.stderr == ""


def test_fault_mix_still_gives_exactly_one_correct_record_each(standin, tmp_path):
    faults = {"429": 0.08, "500": 0.03, "502": 0.03, "503": 0.03, "524": 0.02, "529": 0.02,
              "error200": 0.04, "empty": 0.04, "midstream": 0.05, "cut": 0.05, "hang": 0.02,
              "heartbeat": 0.02}
    server = standin(faults=faults, retry_after=0.05, hang_seconds=60, ledger=True, seed=3)
    prompts = make_prompts(tmp_path / "p.jsonl", 80)
    out = tmp_path / "r.jsonl"
    summary = tmp_path / "s.json"
    # 2 s of silence before a timeout (as in the fault mix below): at 0.5 s a loaded machine
    # left answers the stand-in had written whole unread long enough to time out
    r = infer(server, prompts, "-o", out, "--concurrency", "20", "--idle-timeout", "2",
              "--max-attempts", "30", "--summary-json", summary)
    assert r.code == 0, r.stderr
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(80)]
    assert_correct(read_jsonl(out), prompts)
    s = json.loads(summary.read_text())
    stats = server.stats()
    injected = stats["faults"]
    assert sum(injected.values()) >= 10
    # every injected fault was seen and retried, by cause
    assert s["retries"].get("429", 0) == injected.get("429", 0)
    # stalls are timeouts: the injected ones, and any answer the client gave up on while it
    # was still coming (a loaded machine can be slower than --idle-timeout: the stand-in
    # counts those as abandoned, so the count stays exact without a timing assumption)
    assert s["retries"].get("timeout", 0) == (injected.get("hang", 0) + injected.get("heartbeat", 0)
                                              + stats["abandoned"])
    assert s["retries"].get("midstream", 0) == injected.get("midstream", 0)
    assert s["retries"].get("cut", 0) == injected.get("cut", 0)
    assert s["retries"].get("error200", 0) == injected.get("error200", 0)
    assert s["retries"].get("empty", 0) == injected.get("empty", 0)
    assert len(server.ledger()) == 80  # faults are never charged; each answer once


def test_retries_exhausted_are_failures_and_exit_4(standin, tmp_path):
    server = standin(faults={"503": 1.0})
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--max-attempts", "2", "--failures", failures)
    assert r.code == 4, r.stderr
    assert read_jsonl(out) == []
    fails = read_jsonl(failures)
    assert sorted(f["id"] for f in fails) == ["p00000", "p00001", "p00002"]
    assert all(f["kind"] == "retries_exhausted" and f["status"] == 503 and f["attempts"] == 2 for f in fails)
    server.configure(faults={})
    r = infer(server, prompts, "-o", out, "--failures", failures)  # a later run retries them
    assert r.code == 0 and len(ids_of(out)) == 3


def test_permanent_error_is_recorded_not_retried(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 2)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--failures", failures,
              "--extra-body", '{"provider": {"no_such_key": 1}}')
    assert r.code == 4, r.stderr
    fails = read_jsonl(failures)
    assert [f["status"] for f in fails] == [400, 400] and all(f["attempts"] == 1 for f in fails)
    assert server.stats()["requests"] == 2 + 0  # completions only: no retry of a 400


def test_kill_9_then_resume_loses_nothing_and_writes_no_id_twice(standin, tmp_path):
    # the stand-in answers 20 and holds the rest: the kill lands mid-run on any machine
    server = standin(latency=0.3, ledger=True)
    server.configure(hold_after=20)
    prompts = make_prompts(tmp_path / "p.jsonl", 120)
    out = tmp_path / "r.jsonl"
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    proc = subprocess.Popen([str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--base-url",
                             server.base_url, "--concurrency", "10", "--quiet"], env=env)
    deadline = time.monotonic() + 120
    while not out.exists() or len(out.read_bytes().splitlines()) < 20 or not server.stats()["held"]:
        assert proc.poll() is None and time.monotonic() < deadline, "kp-infer never reached the gate"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    server.configure(hold_after=None)
    first = ids_of(out)
    assert len(first) == 20
    with open(out, "ab") as f:  # what a crash mid-write would leave on a slower file system
        f.write(b'{"id": "p00119", "dataset": "B3", "messa')
    r = infer(server, prompts, "-o", out, "--concurrency", "10")
    assert r.code == 0, r.stderr
    assert "torn last line" in r.stderr
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(120)]
    assert_correct(read_jsonl(out), prompts)
    assert out.read_bytes().endswith(b"\n")


@pytest.mark.parametrize("mode", ["--stream", "--no-stream"], ids=["stream", "plain"])
def test_every_completion_connection_has_tcp_keepalive(standin, tmp_path, mode):
    """README (load): TCP keepalive on every completion connection, so a connection a
    middlebox dropped during a long answer is found. While the stand-in holds 6 requests open, the kernel's
    own view of every connection to it (`ss -o`: a keepalive timer is shown only for a
    socket with SO_KEEPALIVE) has the timer, streamed and plain alike."""
    import shutil
    if not shutil.which("ss"):
        pytest.skip("ss (iproute2) not installed")
    server = standin()
    server.configure(hold_after=0)
    prompts = make_prompts(tmp_path / "p.jsonl", 6)
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    proc = subprocess.Popen([str(BIN / "kp-infer"), str(prompts), "-o", str(tmp_path / "r.jsonl"),
                             "--base-url", server.base_url, "--concurrency", "6", "--quiet",
                             mode], env=env)
    try:
        deadline = time.monotonic() + 60
        while server.stats()["held"] < 6:
            assert proc.poll() is None and time.monotonic() < deadline, "requests never arrived"
            time.sleep(0.02)
        port = server.base_url.split(":")[2].split("/")[0]
        ss = subprocess.run(["ss", "-tnoH", "state", "established", "dport", f"= :{port}"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    finally:
        server.configure(hold_after=None)
    assert proc.wait(timeout=60) == 0
    assert len(ss) >= 6, ss  # one per request held (and any idle control-plane one)
    without = [line for line in ss if "timer:(keepalive" not in line]
    # every completion connection has it; the one left is the control plane's (the
    # endpoints table and balance reads: short calls over httpx, opened before these)
    assert len(ss) - len(without) == 6 and len(without) <= 1, ss


def test_max_cost_is_never_exceeded_and_raising_it_resumes(standin, tmp_path):
    server = standin(ledger=True, price_scale=1000.0)
    prompts = make_prompts(tmp_path / "p.jsonl", 60)
    out = tmp_path / "r.jsonl"
    summary = tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--concurrency", "8", "--max-tokens", "200",
              "--max-cost", "2.5", "--summary-json", summary)
    assert r.code == 3, r.stderr
    assert "--max-cost reached" in r.stderr
    spent = sum(x["cost"] for x in server.ledger())
    assert 0 < spent <= 2.5
    recorded = sum(x["usage"]["cost"] for x in read_jsonl(out))
    assert recorded == pytest.approx(spent, rel=1e-9)
    done_first = len(ids_of(out))
    assert 0 < done_first < 60
    r = infer(server, prompts, "-o", out, "--concurrency", "8", "--max-tokens", "200", "--max-cost", "4")
    # raised, not enough for all: the 60 answers cost $15 at the least ($0.25 each)
    assert r.code == 3 and "--max-cost reached" in r.stderr, r.stderr
    total = sum(x["cost"] for x in server.ledger())
    assert total <= 4 and len(ids_of(out)) > done_first


def test_token_budget_is_done_as_asked_exit_0_with_bounded_overshoot(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 60)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--concurrency", "4", "--token-budget", "1k",
              "--summary-json", summary)
    assert r.code == 0, r.stderr  # the output holds what was asked for: not a money stop
    assert "--token-budget reached" in r.stderr
    s = json.loads(summary.read_text())
    assert s["stop_reason"] == "token-budget" and s["exit_code"] == 0
    tokens = [x["usage"]["completion_tokens"] for x in read_jsonl(out)]
    assert sum(tokens) >= 1000 and len(tokens) < 60
    assert sum(tokens) - 1000 < 4 * max(tokens)  # overshoot bounded by the work in flight
    r = infer(server, prompts, "-o", out, "--concurrency", "4", "--token-budget", "1k")
    assert r.code == 0 and "0 done" in r.stderr  # the budget counts across runs


def test_402_mid_run_stops_admission_and_resumes_after_top_up(standin, tmp_path):
    server = standin(balance=0.02, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 300)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--concurrency", "4", "--max-tokens", "400",
              "--failures", failures)
    assert r.code == 3, r.stderr
    assert "402" in r.stderr
    first = ids_of(out)
    assert 0 < len(first) < 300
    assert not failures.exists() or read_jsonl(failures) == []  # a 402 is not a failure
    server.configure(balance=100.0)
    r = infer(server, prompts, "-o", out, "--concurrency", "16", "--max-tokens", "400")
    assert r.code == 0, r.stderr
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(300)]


def test_routing_violation_is_not_written_as_a_result(standin, tmp_path):
    """With no attempt left (--max-attempts 1), a violation is the prompt's failure, paid
    for (a retry with the provider ignored: test_infer_routing.py)."""
    server = standin(faults={"misroute": 0.3}, seed=5)
    prompts = make_prompts(tmp_path / "p.jsonl", 30)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    summary = tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--ignore-provider", "fireworks", "--ignore-provider", "baseten",
              "--failures", failures, "--summary-json", summary, "--max-attempts", "1")
    assert r.code == 4, r.stderr
    violations = [f for f in read_jsonl(failures) if f["kind"] == "routing_violation"]
    assert violations and all(f["cost"] > 0 for f in violations)
    # the names ignored, and (the Kimi default allows int4/unknown only) DeepInfra's FP4 turbo
    assert {f["provider"] for f in violations} <= {"Fireworks", "BaseTen", "DeepInfra Turbo"}
    for f in violations:
        assert f["message"] == (f"served by {f['provider']}: quantization fp4 not allowed"
                                if f["provider"] == "DeepInfra Turbo" else f"served by {f['provider']}: ignored")
    written = read_jsonl(out)
    assert written and all(x["provider"] in NATIVE for x in written)
    assert len(written) + len(violations) == 30
    s = json.loads(summary.read_text())
    assert s["failed"]["routing_violation"] == len(violations)
    assert s["spend_this_run"] == pytest.approx(
        sum(x["usage"]["cost"] for x in written) + sum(f["cost"] for f in violations), rel=1e-6)


@pytest.mark.parametrize("content, message", [
    ('{"id": "a", "dataset": "B3", "messages": [{"role": "user", "content": "x"}]}\n'
     '{"id": "a", "dataset": "B3", "messages": [{"role": "user", "content": "y"}]}\n',
     ":2: duplicate id 'a' (first at line 1)"),
    ('{"id": "a", "dataset": "B3", "messages": []}\n', ":1: empty `messages` at `$.messages`"),
    ('{"id": "a", "dataset": "B3", "messages": [{"role": "bot", "content": "x"}]}\n',
     ":1: Invalid enum value 'bot' at `$.messages[0].role`"),
    ('{"id": "a", "dataset": "B3", "messages": [{"role": "user", "content": "x"}]}\n{"id": "b"',
     ":2: truncated final line"),
])
def test_bad_input_sends_nothing(standin, tmp_path, content, message):
    server = standin()
    src = tmp_path / "bad.jsonl"
    src.write_text(content)
    r = infer(server, src, "-o", tmp_path / "r.jsonl")
    assert r.code == 2
    assert r.stderr.startswith(f"kp-infer: {src}{message}")
    assert server.stats()["requests"] == 0


def test_key_never_appears_in_output_logs_or_errors(standin, tmp_path):
    server = standin(api_key=KEY, faults={"500": 0.2, "error200": 0.1}, seed=1)
    prompts = make_prompts(tmp_path / "p.jsonl", 20)
    out, failures, summary = tmp_path / "r.jsonl", tmp_path / "f.jsonl", tmp_path / "s.json"
    # (12 attempts, not 8: at 30% faults one of 20 prompts fails all 8 in ~1 run of 750)
    r = infer(server, prompts, "-o", out, "--failures", failures, "--summary-json", summary,
              "--max-attempts", "12")
    assert r.code == 0, r.stderr
    wrong = kp("infer", prompts, "-o", tmp_path / "r2.jsonl", "--base-url", server.base_url,
               env={"OPENROUTER_API_KEY": KEY + "-wrong"})
    assert wrong.code == 2 and "401" in wrong.stderr
    debug = kp("infer", prompts, "-o", tmp_path / "r3.jsonl", "--base-url", "http://127.0.0.1:9/api/v1",
               "--max-attempts", "1", "--debug", env={"OPENROUTER_API_KEY": KEY})
    for blob in (r.stdout, r.stderr.encode(), out.read_bytes(), summary.read_bytes(),
                 wrong.stderr.encode(), debug.stderr.encode(), debug.stdout):
        assert KEY.encode() not in blob
        assert b"testkey" not in blob


def test_missing_key_is_a_usage_error(tmp_path):
    prompts = make_prompts(tmp_path / "p.jsonl", 1)
    env = {k: v for k, v in os.environ.items() if k != "OPENROUTER_API_KEY"}
    r = kp("infer", prompts, env={**env, "OPENROUTER_API_KEY": ""})
    assert r.code == 2 and "OPENROUTER_API_KEY" in r.stderr


def test_sigint_finishes_in_flight_then_resume_completes(standin, tmp_path):
    server = standin(latency=1.0)
    prompts = make_prompts(tmp_path / "p.jsonl", 40)
    out = tmp_path / "r.jsonl"
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    proc = subprocess.Popen([str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--base-url",
                             server.base_url, "--concurrency", "5"], env=env,
                            stderr=subprocess.PIPE)
    deadline = time.time() + 30
    while time.time() < deadline and server.stats()["in_flight"] < 5:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert b"interrupted" in err
    first = ids_of(out)
    assert len(first) >= 5  # the five in flight were finished and kept
    assert server.stats()["completions_started"] == len(first)
    r = infer(server, prompts, "-o", out, "--concurrency", "20")
    assert r.code == 0 and sorted(ids_of(out)) == [f"p{i:05d}" for i in range(40)]


def test_done_files_are_skipped(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 10)
    first = tmp_path / "part1.jsonl"
    assert infer(server, prompts, "-o", first).code == 0
    r = infer(server, prompts, "-o", tmp_path / "part2.jsonl", "--done", first)
    assert r.code == 0 and read_jsonl(tmp_path / "part2.jsonl") == []
    assert "10 skipped" in r.stderr


def test_plan_sends_no_completion_and_shows_routing(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 10)
    r = infer(server, prompts, "--plan", "--ignore-provider", "fireworks", "--ignore-provider", "baseten",
              "--max-cost", "95", "--max-tokens", "1000")
    assert r.code == 0, r.stderr
    assert server.stats()["completions_started"] == 0
    report = r.stdout.decode()  # a report: stdout (README: reports on stdout, chatter on stderr)
    lines = report.splitlines()
    assert any("Fireworks" in x and "ignored" in x for x in lines)
    assert any("BaseTen" in x and "ignored" in x for x in lines)
    assert any(x.rstrip().endswith("allowed") for x in lines)
    assert "worst case $" in report and "10 to do" in report


def test_routing_that_allows_nothing_is_refused_before_sending(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    # Fireworks exists, but serves NVFP4, which the Kimi default does not allow
    r = infer(server, prompts, "-o", tmp_path / "r.jsonl", "--only-provider", "fireworks")
    assert r.code == 2 and "--plan" in r.stderr
    assert server.stats()["completions_started"] == 0


def test_min_credits_stops_admission_when_the_balance_runs_low(standin, tmp_path):
    server = standin(balance=0.5, price_scale=100.0, latency=0.3)
    prompts = make_prompts(tmp_path / "p.jsonl", 200)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out, "--concurrency", "1", "--max-tokens", "100",
              "--min-credits", "0.3", "--credits-interval", "0.1")
    assert r.code == 3, r.stderr
    assert "below --min-credits" in r.stderr
    done = len(ids_of(out))
    assert 0 < done < 200
    # already below the threshold: nothing is sent at all
    before = server.stats()["completions_started"]
    r = infer(server, prompts, "-o", out, "--min-credits", "0.3")
    assert r.code == 3 and server.stats()["completions_started"] == before


def test_partitions_are_disjoint_and_cover_the_input(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 60)
    parts = []
    for k in (1, 2, 3):
        out = tmp_path / f"part{k}.jsonl"
        r = infer(server, prompts, "-o", out, "--partition", f"{k}/3")
        assert r.code == 0, r.stderr
        parts.append(set(ids_of(out)))
    assert all(parts)  # every part got some work
    assert not (parts[0] & parts[1]) and not (parts[0] & parts[2]) and not (parts[1] & parts[2])
    assert parts[0] | parts[1] | parts[2] == {f"p{i:05d}" for i in range(60)}
    assert server.stats()["completions_started"] == 60  # no prompt was sent twice
    bad = infer(server, prompts, "--partition", "4/3")
    assert bad.code == 2 and "K must be between 1 and N" in bad.stderr


def test_closed_output_pipe_stops_admission_quietly(standin, tmp_path):
    server = standin(latency=0.05)
    prompts = make_prompts(tmp_path / "p.jsonl", 400)
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    proc = subprocess.run(
        f"'{BIN}/kp-infer' '{prompts}' --base-url {server.base_url} --concurrency 4 --quiet | head -1",
        shell=True, capture_output=True, env=env, timeout=60)
    assert len(proc.stdout.splitlines()) == 1 and json.loads(proc.stdout)["id"].startswith("p")
    assert b"Traceback" not in proc.stderr
    assert server.stats()["completions_started"] < 100  # it stopped paying for lost answers


def test_second_sigint_cancels_in_flight_at_once(standin, tmp_path):
    server = standin(latency=30)
    prompts = make_prompts(tmp_path / "p.jsonl", 10)
    out = tmp_path / "r.jsonl"
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    proc = subprocess.Popen([str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--base-url",
                             server.base_url, "--concurrency", "5"], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while server.stats()["in_flight"] < 5:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    said = b""
    while b"Ctrl-C again" not in said:  # the first Ctrl-C is taken: it says so, and waits
        line = proc.stderr.readline()
        assert line, said
        said += line
    # the answers take 30 s: still running means the first Ctrl-C waits for them
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)  # (well before the 30 s answers could end)
    assert proc.returncode == 130, said + err
    assert read_jsonl(out) == []
    assert server.stats()["charged"] == 0  # cancelled, not waited for


def test_grace_period_bounds_the_wait_for_in_flight(standin, tmp_path):
    server = standin(latency=30, balance=100)
    prompts = make_prompts(tmp_path / "p.jsonl", 10)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    proc = subprocess.Popen([str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--base-url",
                             server.base_url, "--concurrency", "3", "--grace", "0.5",
                             "--summary-json", str(summary)], env=env, stderr=subprocess.PIPE)
    deadline = time.time() + 30
    while time.time() < deadline and server.stats()["in_flight"] < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    s = json.loads(summary.read_text())
    assert s["abandoned_in_flight"] == 3 and s["stop_reason"] == "interrupted"


def test_fault_mix_plain(standin, tmp_path):
    """Plain requests meet every fault too (streamed ones: the fault mix test above)."""
    mode = "--no-stream"
    faults = {"429": 0.08, "502": 0.05, "error200": 0.05, "empty": 0.05, "midstream": 0.05,
              "cut": 0.05, "hang": 0.03, "heartbeat": 0.03}
    server = standin(faults=faults, retry_after=0.05, hang_seconds=60, ledger=True, seed=5)
    prompts = make_prompts(tmp_path / "p.jsonl", 60)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, mode, "-o", out,
              # 2 s of silence, not 0.5: on a loaded machine an answer the stand-in has
              # already written whole (so it does not count it abandoned) can sit unread
              # for half a second, and its timeout would be a retry no fault explains.
              "--concurrency", "20", "--idle-timeout", "2", "--max-attempts", "30", "--summary-json", summary)
    assert r.code == 0, r.stderr
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(60)]
    assert_correct(read_jsonl(out), prompts)
    s = json.loads(summary.read_text())
    stats = server.stats()
    injected = stats["faults"]
    assert sum(injected.values()) >= 8
    # one retry per injected fault, and stalls are timeouts (with the answers a loaded
    # machine gave up on while they were coming: the stand-in counts them as abandoned)
    assert sum(s["retries"].values()) == sum(injected.values()) + stats["abandoned"]
    assert s["retries"].get("timeout", 0) == (injected.get("hang", 0) + injected.get("heartbeat", 0)
                                              + stats["abandoned"])
    assert s["retries"].get("cut", 0) == injected.get("cut", 0)
    assert len(server.ledger()) == 60


@pytest.mark.parametrize("stop, code", [(("--token-budget", "500"), 0), (("--max-cost", "0.5"), 3)],
                         ids=["token-budget", "max-cost"])
def test_quiet_means_nothing_on_stderr_even_for_a_stop(standin, tmp_path, stop, code):
    server = standin(price_scale=100.0)
    prompts = make_prompts(tmp_path / "p.jsonl", 30)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--concurrency", "2", "--max-tokens", "500", *stop, "--quiet",
              "--summary-json", summary)
    assert r.code == code  # the exit code says it; --quiet keeps stderr empty
    assert r.stderr == "" and r.stdout == b""
    assert json.loads(summary.read_text())["stop_reason"] == stop[0][2:]
    assert 0 < len(ids_of(out)) < 30


def test_answers_to_prompts_the_input_no_longer_holds_are_kept_and_said(standin, tmp_path):
    """A source changed under one output: kp-infer answers the new prompts into it, keeps the
    old answers (paid for) and says how many there are and how kp-tokenize leaves them out."""
    server = standin()
    out = tmp_path / "r.jsonl"
    conversation = {"id": "c", "dataset": "B3", "messages": [{"role": "user", "content": "Hi?"}],
                    "follow_ups": ["And?"]}  # in both: its turns (c#1, c#2) are the input's
    old = make_prompts(tmp_path / "old.jsonl", 4)
    write_jsonl(old, read_jsonl(old) + [conversation])
    assert infer(server, old, "-o", out, "-q").code == 0
    new = make_prompts(tmp_path / "new.jsonl", 4, start=2)  # p00002..p00005
    write_jsonl(new, read_jsonl(new) + [conversation])
    r = infer(server, new, "-o", out)
    assert r.code == 0, r.stderr
    said = " ".join(r.stderr.split())
    assert (f"kp-infer: {out} holds 2 answer(s) to prompts {new} does not hold (first: 'p00000'; "
            "an earlier source's?): kept there and counted in the spend, not sent again; "
            f"`kp-tokenize --prompts {new}` leaves them out of the training data") in said
    assert sorted(ids_of(out)) == ["c#1", "c#2"] + [f"p{i:05d}" for i in range(6)]


@pytest.mark.parametrize("output", ["r.jsonl", "r.jsonl.zst"])
def test_quiet_never_hides_a_fatal_stop_and_a_failed_start_leaves_no_empty_output(standin, tmp_path,
                                                                                  output):
    """A wrong key under --quiet: exit 2 with the stop's one line (the only line), and no
    output or failures file left empty behind it; an output that held answers stays."""
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    out, failures = tmp_path / output, tmp_path / "f.jsonl"
    r = kp("infer", prompts, "-o", out, "--failures", failures, "--base-url", server.base_url,
           "--quiet", env={"OPENROUTER_API_KEY": server.api_key + "-wrong"})
    assert r.code == 2
    assert r.stderr.splitlines() == ["kp-infer: stopped: OpenRouter rejected the API key (401); "
                                     "check OPENROUTER_API_KEY"]
    assert not out.exists() and not failures.exists()
    assert infer(server, prompts, "-o", out, "--failures", failures, "--quiet").code == 0
    kept = read_jsonl(out)
    assert len(kept) == 3
    r = kp("infer", make_prompts(tmp_path / "more.jsonl", 5), "-o", out, "--base-url",
           server.base_url, "--quiet", env={"OPENROUTER_API_KEY": server.api_key + "-wrong"})
    assert r.code == 2 and read_jsonl(out) == kept


def test_zstd_output_is_resumed_too(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 30)
    out = tmp_path / "r.jsonl.zst"
    r = infer(server, prompts, "-o", out, "--concurrency", "2", "--token-budget", "800")
    assert r.code == 0 and "--token-budget reached" in r.stderr, r.stderr
    first = ids_of(out)
    assert 0 < len(first) < 30 and out.read_bytes()[:4] == b"\x28\xb5\x2f\xfd"
    r = infer(server, prompts, "-o", out, "--concurrency", "8")
    assert r.code == 0, r.stderr
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(30)]
    assert_correct(read_jsonl(out), prompts)


NATIVE = {"Moonshot AI", "Together", "DeepInfra", "Parasail"}  # int4 or unknown in the stand-in


def test_kimi_native_weights_are_the_routing_default(standin, tmp_path):
    """No routing flags: only int4/unknown endpoints serve (the stand-in's price-weighted
    pick would land on FP4/NVFP4 ones about half the time), and no warning is printed."""
    server = standin(ledger=True, request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 60)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out, "--concurrency", "16")
    assert r.code == 0, r.stderr
    sent = server.requests()
    assert len(sent) == 60
    assert all(body["provider"]["quantizations"] == ["int4", "unknown"] for body in sent)
    assert {x["provider"] for x in read_jsonl(out)} <= NATIVE
    assert {x["provider"] for x in server.ledger()} <= NATIVE and len(server.ledger()) == 60
    # (no routing warning; the one warning is that identity is unchecked: no --tokenizer)
    assert [x for x in r.stderr.splitlines() if "warning" in x] == [UNCHECKED_WARNING]
    # the same prompts with the default lifted do reach re-quantized endpoints, with a warning
    out2 = tmp_path / "r2.jsonl"
    r = infer(server, prompts, "-o", out2, "--concurrency", "16", "--any-quantization",
              "--ignore-provider", "fireworks", "--ignore-provider", "baseten")
    assert r.code == 0, r.stderr
    assert ("kp-infer: warning: DeepInfra (deepinfra/turbo) serves moonshotai/kimi-k2.5 as fp4, "
            "re-quantized from its native int4 weights") in r.stderr
    assert "Fireworks" not in r.stderr and "BaseTen" not in r.stderr
    served = {x["generation_id"]: x["endpoint"] for x in server.ledger()}
    assert "deepinfra/turbo" in {served[x["generation_id"]] for x in read_jsonl(out2)}


def test_plan_warns_when_flags_allow_requantized_endpoints(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 5)
    r = infer(server, prompts, "--plan", "--quantization", "int4", "--quantization", "fp4")
    assert r.code == 0, r.stderr
    warned = sorted(x for x in r.stdout.decode().splitlines() if x.startswith("warning:"))
    assert warned == [
        "warning: BaseTen serves moonshotai/kimi-k2.5 as fp4, re-quantized from its native int4 weights",
        "warning: DeepInfra (deepinfra/turbo) serves moonshotai/kimi-k2.5 as fp4, re-quantized from its native int4 weights",
        "warning: to keep to the native weights, pass --quantization int4 --quantization unknown (the default)",
    ]
    r = infer(server, prompts, "--plan")
    warned = [x for x in (r.stderr + r.stdout.decode()).splitlines() if "warning" in x]
    assert r.code == 0 and len(warned) == 1 and "excluded variant (deepinfra/turbo)" in warned[0]
    verdicts = {x.split()[0]: x for x in r.stdout.decode().splitlines() if x.startswith("  ")}
    assert "quantization nvfp4 not allowed" in verdicts["Fireworks"]
    assert verdicts["Together"].rstrip().endswith("allowed")


def test_quiet_silences_the_torn_tail_note_too(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 6)
    out = tmp_path / "r.jsonl"
    assert infer(server, prompts, "-o", out, "--partition", "1/2").code == 0
    first = ids_of(out)
    with open(out, "ab") as f:  # what a crash mid-write leaves
        f.write(b'{"id": "p00005", "dataset": "B3", "messa')
    r = infer(server, prompts, "-o", out, "--quiet")
    assert r.code == 0 and r.stderr == ""
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(6)] and set(first) < set(ids_of(out))
    with open(out, "ab") as f:
        f.write(b'{"id": "p00005", "dataset": "B3", "messa')
    r = infer(server, prompts, "-o", out)  # without --quiet the repair is reported
    assert r.code == 0 and f"{out}:7: removed a torn last line" in r.stderr
