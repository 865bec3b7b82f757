"""Money claims (docs/servers.md, docs/money.md) that a broken copy of the code once passed the
suite with (issue 51's mutation sample): each test here fails when its claim is broken.

Against two stand-ins, one a vLLM server (`mode="vllm"`, its `hold_after` gate holding the
prompts it was given) and one OpenRouter (its ledger: what was billed), with kp-infer run as
a user runs it.
"""

from __future__ import annotations

import json
import os
import subprocess

from conftest import BIN, kp, read_jsonl
from helpers import stderr_after, wait_for
from test_servers import write_prompts


def test_a_server_prompt_moves_to_openrouter_only_when_its_worst_case_fits_the_caps(
        standin, tmp_path):
    """The only server dies holding both prompts, and --max-cost is below one request's
    worst case: neither moves to OpenRouter (nothing billed there, the cap kept); they are
    sent to the server again until --max-attempts, and written as failures for a rerun."""
    server = standin(mode="vllm")
    openrouter = standin(ledger=True)
    server.configure(hold_after=0)
    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    proc = subprocess.Popen(
        [str(BIN / "kp-infer"), prompts, "-o", out, "--failures", failures,
         "--server", server.base_url, "--server-concurrency", "2", "--openrouter",
         "--concurrency", "2", "--backoff-base", "0.05", "--max-attempts", "3",
         "--max-tokens", "256", "--max-cost", "0.000001"],
        env={**os.environ, **openrouter.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def kill_the_server_holding_two():
        wait_for(lambda: server.stats()["held"] >= 2, "two prompts held by the server", 60)
        server.proc.kill()
        server.proc.wait()

    stderr = stderr_after(proc, kill_the_server_holding_two).decode()
    assert openrouter.ledger() == [] and openrouter.stats()["requests"] == 0, stderr
    assert not out.exists() or read_jsonl(out) == []
    assert sorted(f["id"] for f in read_jsonl(failures)) == ["q0", "q1"], stderr
    assert proc.returncode == 4, stderr


def test_a_server_prompt_that_moves_reserves_its_worst_case(standin, tmp_path):
    """--max-cost holds one request's worst case and a half: of the two prompts a dead server
    held, the first to move reserves its worst case, so the second finds no room while the
    first is in flight (OpenRouter holds it here) and stays with the servers, failing at
    --max-attempts; the first is then answered. One billed, one failure line."""
    server = standin(mode="vllm")
    openrouter = standin(ledger=True)
    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    plan = kp("infer", prompts, "--plan", "--json", "--max-tokens", "256",
              "--base-url", openrouter.base_url, env=openrouter.env)
    assert plan.code == 0, plan.stderr
    worst = json.loads(plan.stdout)["cost"]["worst_case_request"]
    server.configure(hold_after=0)
    openrouter.configure(hold_after=0)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    proc = subprocess.Popen(
        [str(BIN / "kp-infer"), prompts, "-o", out, "--failures", failures,
         "--server", server.base_url, "--server-concurrency", "2", "--openrouter",
         "--concurrency", "2", "--backoff-base", "0.05", "--max-attempts", "3",
         "--max-tokens", "256", "--max-cost", f"{1.5 * worst:.10f}"],
        env={**os.environ, **openrouter.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def kill_the_server_then_release_the_moved_one():
        wait_for(lambda: server.stats()["held"] >= 2, "two prompts held by the server", 60)
        server.proc.kill()
        server.proc.wait()
        wait_for(lambda: failures.exists() and len(read_jsonl(failures)) == 1,
                 "the prompt with no room to fail at --max-attempts", 60)
        assert openrouter.stats()["held"] == 1
        openrouter.configure(hold_after=None)

    stderr = stderr_after(proc, kill_the_server_then_release_the_moved_one).decode()
    assert proc.returncode == 4, stderr
    [answered], [failed] = read_jsonl(out), read_jsonl(failures)
    assert {answered["id"], failed["id"]} == {"q0", "q1"}
    assert len(openrouter.ledger()) == 1
    assert sum(line["cost"] for line in openrouter.ledger()) <= 1.5 * worst


def test_a_server_prompt_stays_with_the_servers_while_one_is_up(standin, tmp_path):
    """Two servers, OpenRouter beside them with ample money: the server holding a prompt dies,
    the other is up, so the prompt is sent to that one, not moved to OpenRouter (billed)."""
    dying, alive = standin(mode="vllm"), standin(mode="vllm")
    openrouter = standin(ledger=True)
    dying.configure(hold_after=0)
    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    out = tmp_path / "r.jsonl"
    proc = subprocess.Popen(
        [str(BIN / "kp-infer"), prompts, "-o", out, "--server", dying.base_url,
         "--server", alive.base_url, "--server-concurrency", "1", "--openrouter",
         "--concurrency", "2", "--backoff-base", "0.05", "--max-cost", "5"],
        env={**os.environ, **openrouter.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def kill_the_server_holding_one():
        wait_for(lambda: dying.stats()["held"] >= 1, "a prompt held by the dying server", 60)
        dying.proc.kill()
        dying.proc.wait()

    stderr = stderr_after(proc, kill_the_server_holding_one).decode()
    assert proc.returncode == 0, stderr
    records = read_jsonl(out)
    assert sorted(rec["id"] for rec in records) == ["q0", "q1"]
    assert {rec["provider"] for rec in records} == {f"127.0.0.1:{alive.port}"}
    assert openrouter.ledger() == [] and openrouter.stats()["requests"] == 0
