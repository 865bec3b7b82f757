"""`kp-infer --preflight [N]`: every check in a pass/fail table (or --json), exit 4 on a
failed one, its answers kept in -o (not paid twice), the cost of refused answers counted,
-o needed, --max-cost respected."""

from __future__ import annotations

import json

import pytest
from conftest import read_jsonl
from test_infer import infer, make_prompts


def test_preflight_checks_every_assumption_and_keeps_its_answers(standin, tmp_path):
    server = standin(ledger=True, latency=0.6, keepalive_interval=0.1)
    prompts = make_prompts(tmp_path / "p.jsonl", 6)
    out = tmp_path / "r.jsonl"
    r = infer(server, "--preflight", prompts, "-o", out, "--json")  # N left out: 3
    assert r.code == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["passed"] is True and report["requests"] == 3
    verdicts = {c["check"]: c["verdict"] for c in report["checks"]}
    assert verdicts.pop("endpoints table") == verdicts.pop("distillation") == "pass"
    assert verdicts.pop("balance") == verdicts.pop("requests at once") == "pass"
    assert verdicts.pop("routing") == "warn"  # DeepInfra names an excluded variant too
    assert verdicts.pop("token logprobs") == "pass"  # (not asked: no endpoint lists them)
    assert verdicts.pop("availability") == "pass"  # four endpoints left
    assert verdicts.pop("identity") == "warn"  # unchecked: no --tokenizer
    assert verdicts == {f"answer {i}: {what}": "pass" for i in (1, 2, 3)
                        for what in ("status", "provider", "reasoning", "cost", "finish", "stream")}
    details = {c["check"]: c["detail"] for c in report["checks"]}
    assert "from field" in details["answer 1: reasoning"]
    for a in report["answers"]:
        assert a["usage_shape"] == "own chunk" and a["done"] and a["comments"] > 0 and a["reasoning_source"] == "field"
    # the answers are kept, as a run writes them, and billed once
    kept = read_jsonl(out)
    assert sorted(x["id"] for x in kept) == sorted(a["id"] for a in report["answers"])
    assert all(rec["sampling"]["temperature"] == 1.0 and rec["latency_s"] > 0 for rec in kept)
    assert report["spend"] == pytest.approx(sum(x["cost"] for x in server.ledger()), rel=1e-9)
    r = infer(server, prompts, "-o", out)
    assert r.code == 0, r.stderr
    assert "3 skipped" in r.stderr and len(server.ledger()) == 6 and len(read_jsonl(out)) == 6
    # nothing left to do: the checks that need no answer still run
    r = infer(server, prompts, "-o", out, "--preflight", "2")
    assert r.code == 0 and "no prompt left to send" in r.stdout.decode()
    assert len(server.ledger()) == 6


def test_preflight_fails_on_a_missing_reasoning_and_counts_what_it_paid(standin, tmp_path):
    server = standin(ledger=True, drop_reasoning={"together": 1.0}, key_limit=0.2)
    prompts = make_prompts(tmp_path / "p.jsonl", 4)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--failures", failures, "--only-provider", "together",
              "--preflight", "2", "--no-stream")
    assert r.code == 4, r.stderr
    table = r.stdout.decode()
    assert "preflight: FAILED: 2 failed" in table
    rows = {line.split("  ")[1].strip(): line for line in table.splitlines()[2:-1]}
    assert "fail" in rows["answer 1: reasoning"] and "no_reasoning" in rows["answer 1: reasoning"]
    assert "skip" in rows["answer 2: stream"] and "--no-stream" in rows["answer 2: stream"]
    assert "pass" in rows["answer 1: provider"] and "Together: int4" in rows["answer 1: provider"]
    # a $0.2 key limit covers 4 requests' worst case at once, not --concurrency 64
    assert "warn" in rows["requests at once"] and "fewer than --concurrency 64" in rows["requests at once"]
    assert read_jsonl(out) == []
    failed = read_jsonl(failures)
    assert [f["kind"] for f in failed] == ["no_reasoning"] * 2
    assert sum(f["cost"] for f in failed) == pytest.approx(sum(x["cost"] for x in server.ledger()), rel=1e-9)


def test_preflight_refuses_what_it_cannot_keep_or_afford(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 4)
    r = infer(server, prompts, "--preflight")
    assert r.code == 2 and "give -o FILE" in r.stderr
    r = infer(server, prompts, "-o", tmp_path / "r.jsonl", "--preflight", "--max-cost", "0.001")
    assert r.code == 3 and "leaves no room for the preflight's 3 requests" in r.stderr
    assert server.stats()["requests"] == 0 and not (tmp_path / "r.jsonl").exists()

