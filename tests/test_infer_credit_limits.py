"""kp-infer under OpenRouter's three credit limits (docs/standin.md), through the command line
against the stand-in over loopback: the in-flight budget is a wait, the balance and the
key/workspace/guardrail budgets are money stops (exit 3) that fail no prompt, moderation's
403 is the prompt's own failure, and the money in flight is sized to the balance."""

from __future__ import annotations

import json
import threading
import time

import pytest
from conftest import read_jsonl, write_jsonl
from test_infer import ids_of, infer, make_prompts


def run(server, prompts, tmp_path, *flags, name="r", env=None):
    """One kp-infer run over PROMPTS into tmp_path/NAME.jsonl: (result, summary, failures)."""
    out, failures, summary = (tmp_path / f"{name}.jsonl", tmp_path / f"{name}.failures.jsonl",
                              tmp_path / f"{name}.summary.json")
    r = infer(server, prompts, "-o", out, "--failures", failures, "--summary-json", summary, *flags,
              env=env)
    failed = read_jsonl(failures) if failures.exists() else []
    return r, json.loads(summary.read_text()), failed


def billed_and_kept(server, out) -> tuple[set, set]:
    """The generations the stand-in billed, and those the output holds."""
    return ({line["generation_id"] for line in server.ledger()},
            {rec["generation_id"] for rec in read_jsonl(out)})


def test_in_flight_402s_are_waits_and_every_prompt_is_answered(standin, tmp_path):
    """$0.10 pays for every answer but holds ~4 worst cases at once (ratio 0.5; 30 need 2.5x that): the run
    waits on in-flight 402s (not attempts: --max-attempts 1) and spends exactly the bill."""
    server = standin(balance=0.10, inflight_ratio=0.5, settle=0.01, latency=0.2, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 30)
    r, summary, failed = run(server, prompts, tmp_path, "--max-tokens", "4096",
                             "--concurrency", "30", "--max-attempts", "1",
                             env={"KP_PROGRESS_INTERVAL": "1"})
    assert r.code == 0, r.stderr
    assert summary["done"] == 30 and failed == [] and summary["stop_reason"] is None
    refused = server.stats()["refusals"]["402"].get("in_flight_budget_exhausted", 0)
    assert summary["retries"].get("402-inflight", 0) == refused
    assert summary["limit_refusals"].get("402 in_flight_budget_exhausted", 0) == refused
    assert summary["spend_this_run"] == pytest.approx(sum(x["cost"] for x in server.ledger()), abs=1e-9)
    billed, kept = billed_and_kept(server, tmp_path / "r.jsonl")
    assert billed == kept and len(kept) == 30
    # sized to the balance from the first request: what was read, and the ceiling learned
    money = summary["money_in_flight"]
    assert money["balance_read"] == pytest.approx(0.10)
    assert money["peak"] <= 0.10 * 1.2 + 1e-9  # never above MAX_RATIO x the balance
    assert " in flight of $" in r.stderr  # the progress line shows the money in flight


def test_money_short_spends_the_balance_down_and_a_top_up_finishes(standin, tmp_path):
    """The balance runs down to less than two requests' worst case (the in-flight budget
    is half of it): exit 3, every billed answer kept, no failure; a top-up finishes."""
    server = standin(balance=0.008, inflight_ratio=0.5, settle=0.01, latency=0.05, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 60)
    flags = ("--max-tokens", "256", "--concurrency", "16")
    r, summary, failed = run(server, prompts, tmp_path, *flags)
    assert r.code == 3, r.stderr
    assert summary["stop_reason"] == "payment" and failed == []
    limit = summary["limit"]
    assert limit["limit_source"] == "openrouter_credits" and limit["status"] == 402
    left = server.stats()["balance_remaining"]
    assert 0 <= left < 2 * limit["worst_case_request"]
    billed, kept = billed_and_kept(server, tmp_path / "r.jsonl")
    assert billed == kept and 0 < len(kept) < 60
    said = " ".join(r.stderr.split())
    assert "add credits (or lower --max-tokens)" in said and "worst case" in said
    server.configure(balance=1.0)
    r, summary, failed = run(server, prompts, tmp_path, *flags)
    assert r.code == 0, r.stderr
    assert sorted(ids_of(tmp_path / "r.jsonl")) == [f"p{i:05d}" for i in range(60)]
    billed, kept = billed_and_kept(server, tmp_path / "r.jsonl")
    assert billed == kept  # nothing paid twice, nothing paid and lost


@pytest.mark.parametrize("status", [403, 402])
def test_key_limit_is_a_money_stop_that_fails_no_prompt(standin, tmp_path, status):
    """The key's limit is lowered to what is spent once 10 answers are billed (the stand-in
    holds the 11th on until then): every request after that is refused with STATUS
    (limit_source openrouter_key_limit)."""
    server = standin(key_limit=10.0, limit_status=status, latency=0.1, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 60)
    flags = ("--max-tokens", "512", "--concurrency", "4", "--max-attempts", "1")
    lowered = []

    server.configure(hold_after=10)  # 10 answers, then the stand-in holds the rest ...

    def reach_the_limit():
        while len(server.ledger()) < 10 or not server.stats()["held"]:
            time.sleep(0.01)
        lowered.append(server.stats()["total_usage"])
        # ... and lets them go only with the limit lowered (one change): no request can
        # slip past it, however slow this thread is
        server.configure(key_limit=lowered[0], hold_after=None)

    watcher = threading.Thread(target=reach_the_limit, daemon=True)
    watcher.start()
    r, summary, failed = run(server, prompts, tmp_path, *flags)
    watcher.join(timeout=30)
    assert r.code == 3, r.stderr
    assert summary["stop_reason"] == "key-limit" and failed == [] and summary["failed"] == {}
    limit = summary["limit"]
    assert limit["limit_source"] == "openrouter_key_limit" and limit["status"] == status
    assert limit["limit_usd"] == pytest.approx(lowered[0]) and limit["scope"] == "key_limit"
    assert server.stats()["refusals"][str(status)].get("openrouter_key_limit")
    assert summary["money_in_flight"]["balance_read"] == pytest.approx(10.0)  # /key's limit_remaining
    billed, kept = billed_and_kept(server, tmp_path / "r.jsonl")
    assert billed == kept and len(kept) == 10
    said = " ".join(r.stderr.split())
    assert "key's spending limit" in said and f"limit ${limit['limit_usd']:g}" in said
    server.configure(key_limit=None)
    r, summary, failed = run(server, prompts, tmp_path, *flags)
    assert r.code == 0, r.stderr
    assert sorted(ids_of(tmp_path / "r.jsonl")) == [f"p{i:05d}" for i in range(60)]


def test_workspace_budget_names_its_limit(standin, tmp_path):
    server = standin(workspace_budget=0.004, limit_reset="daily")
    prompts = make_prompts(tmp_path / "p.jsonl", 30)
    r, summary, failed = run(server, prompts, tmp_path, "--max-tokens", "512", "--concurrency", "4")
    assert r.code == 3 and summary["stop_reason"] == "workspace-budget" and failed == []
    assert summary["limit"]["scope"] == "workspace" and summary["limit"]["resets_at"]
    assert f"resets at {summary['limit']['resets_at']}" in r.stderr


def test_moderation_403s_fail_their_prompts_and_the_rest_is_answered(standin, tmp_path):
    server = standin(moderation_marker="FLAGME")
    rows = read_jsonl(make_prompts(tmp_path / "p.jsonl", 20))
    for i, row in enumerate(rows):
        row["messages"][-1]["content"] += " FLAGME" if i % 5 == 0 else ""
    prompts = write_jsonl(tmp_path / "p.jsonl", rows)
    r, summary, failed = run(server, prompts, tmp_path, "--max-tokens", "512")
    assert r.code == 4, r.stderr
    assert sorted(f["id"] for f in failed) == [f"p{i:05d}" for i in range(0, 20, 5)]
    assert summary["failed"] == {"http_403": 4} and summary["stop_reason"] is None
    assert sorted(ids_of(tmp_path / "r.jsonl")) == [f"p{i:05d}" for i in range(20) if i % 5]


def test_plan_sizes_the_money_in_flight_to_the_balance(standin, tmp_path):
    server = standin(balance=3.0)
    prompts = make_prompts(tmp_path / "p.jsonl", 10)
    r = infer(server, prompts, "--plan", "--json", "--concurrency", "2000", "--max-tokens", "4096")
    assert r.code == 0, r.stderr
    data = json.loads(r.stdout)
    flight, worst = data["in_flight"], data["cost"]["worst_case_request"]
    assert flight["balance"] == 3.0 and flight["concurrency"] == 2000
    assert flight["worst_case_request"] == pytest.approx(worst, abs=1e-6)
    assert flight["requests"] == int(3.0 / worst)
    allowing = flight["max_tokens_for_concurrency"]
    completion = data["prices"]["bound"]["completion"] / 1e6
    prompt_part = worst - 4096 * completion
    assert prompt_part + allowing * completion <= 3.0 / 2000 < prompt_part + (allowing + 1) * completion
    r = infer(server, prompts, "--plan", "--concurrency", "2000", "--max-tokens", "4096")
    text = r.stdout.decode()
    assert f"covers {flight['requests']:,} requests' worst case" in text
    assert f"--max-tokens {allowing:,} would let all 2,000 be in flight" in text


@pytest.mark.parametrize("credits_mode", ["forbidden", "zeros"])
def test_a_normal_key_learns_the_money_in_flight_from_402s_alone(standin, tmp_path, credits_mode):
    """The common live case: a normal key with no limit of its own, so /credits is refused
    (403, management keys only) or answers zeros, and /key has no limit_remaining: the
    balance is unknown. The run starts with no ceiling, learns one from the in-flight 402s,
    and answers every prompt at the bill, as when the balance could be read."""
    server = standin(balance=0.10, inflight_ratio=0.5, settle=0.01, latency=0.2, ledger=True,
                     credits_mode=credits_mode)
    prompts = make_prompts(tmp_path / "p.jsonl", 30)
    r, summary, failed = run(server, prompts, tmp_path, "--max-tokens", "4096",
                             "--concurrency", "30", "--max-attempts", "1")
    assert r.code == 0, r.stderr
    assert summary["done"] == 30 and failed == [] and summary["stop_reason"] is None
    refused = server.stats()["refusals"]["402"].get("in_flight_budget_exhausted", 0)
    assert refused > 0 and summary["retries"].get("402-inflight", 0) == refused
    money = summary["money_in_flight"]
    assert money["balance_read"] is None and money["ratio_end"] is None
    # all 30 went at once (no ceiling yet: $0.37 of worst cases), then bursts of 402s cut
    # the learned ceiling, by at most half a burst, near OpenRouter's $0.05 (0.5 x $0.10)
    assert money["cuts"] >= 2 and money["peak"] > 0.3
    assert 0.025 <= money["ceiling_end"] <= 0.10
    assert summary["spend_this_run"] == pytest.approx(sum(x["cost"] for x in server.ledger()), abs=1e-9)
    billed, kept = billed_and_kept(server, tmp_path / "r.jsonl")
    assert billed == kept and len(kept) == 30
