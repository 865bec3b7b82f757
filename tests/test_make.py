"""The Makefile as users drive it: full builds, resume after stops, one stage rerun, the demo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, read_jsonl

VENV = Path(sys.executable).parent.parent
SOURCE = REPO / "kimipipe" / "data" / "demo" / "sharegpt.json"
TOKENIZER = REPO / "kimipipe" / "data" / "tokenizers" / "kimi-k2.5-mini-fast"


def make(server, tmp_path, *args, **variables):
    settings = {"DATASETS": "D1", "SOURCE_D1": SOURCE, "WORK": tmp_path / "work",
                "SHARDS": tmp_path / "shards", "VENV": VENV, "BASE_URL": server.base_url,
                "TOKENIZER": TOKENIZER, "CONCURRENCY": 16, "MAX_COST": 1, "TOKEN_BUDGET": "",
                "MAX_TOKENS": 1024, "MIN_CREDITS": 1, "INFER_FLAGS": "--backoff-base 0.05 --quiet",
                "TOKENIZE_FLAGS": "--quiet", **variables}
    cmd = ["make", "-C", str(REPO), *args, *(f"{k}={v}" for k, v in settings.items())]
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_full_build_then_nothing_to_redo(standin, tmp_path):
    server = standin(faults={"429": 0.05, "502": 0.05}, retry_after=0.05, ledger=True)
    r = make(server, tmp_path, "all")
    assert r.returncode == 0, r.stderr + r.stdout
    manifest = json.loads((tmp_path / "shards" / "D1" / "manifest.json").read_text())
    assert manifest["totals"]["records"] == 260
    assert len(server.ledger()) == 260
    for stage in ("responses", "tokens"):
        assert (tmp_path / "work" / f"D1.{stage}.done").exists()
    again = make(server, tmp_path, "all")
    assert again.returncode == 0
    assert "kp-infer" not in again.stdout and "kp-tokenize" not in again.stdout
    assert len(server.ledger()) == 260  # nothing paid twice


def test_money_stop_halts_the_build_and_raising_the_cap_resumes(standin, tmp_path):
    server = standin(price_scale=200.0, ledger=True)
    r = make(server, tmp_path, "all", MAX_COST=1)
    assert r.returncode != 0
    assert "stopped by MAX_COST, the balance or MIN_CREDITS (exit 3)" in r.stderr
    assert not (tmp_path / "work" / "D1.responses.done").exists()  # never mistaken for finished
    assert not (tmp_path / "shards" / "D1").exists()
    first = len(read_jsonl(tmp_path / "work" / "D1.responses.jsonl"))
    assert 0 < first < 260
    r = make(server, tmp_path, "all", MAX_COST=100)
    assert r.returncode == 0, r.stderr
    ids = [x["id"] for x in read_jsonl(tmp_path / "work" / "D1.responses.jsonl")]
    assert len(ids) == len(set(ids)) == 260
    assert len(server.ledger()) == 260


def test_token_budget_finishes_a_dataset_and_raising_it_continues(standin, tmp_path):
    server = standin()
    r = make(server, tmp_path, "all", TOKEN_BUDGET="3k")
    assert r.returncode == 0, r.stderr
    first = len(read_jsonl(tmp_path / "work" / "D1.responses.jsonl"))
    assert 0 < first < 260
    manifest = json.loads((tmp_path / "shards" / "D1" / "manifest.json").read_text())
    assert manifest["totals"]["records"] == first
    r = make(server, tmp_path, "all", TOKEN_BUDGET="6k")  # a new budget: that stage resumes
    assert r.returncode == 0, r.stderr
    second = len(read_jsonl(tmp_path / "work" / "D1.responses.jsonl"))
    assert second > first
    manifest = json.loads((tmp_path / "shards" / "D1" / "manifest.json").read_text())
    assert manifest["totals"]["records"] == second


def test_one_stage_reruns_from_saved_files(standin, tmp_path):
    server = standin(ledger=True)
    assert make(server, tmp_path, "all").returncode == 0
    tokens = tmp_path / "work" / "D1.tokens.jsonl.zst"
    before = tokens.stat().st_mtime_ns
    r = make(server, tmp_path, "D1.tokens", TOKENIZE_FLAGS="")
    assert r.returncode == 0, r.stderr
    assert tokens.stat().st_mtime_ns != before
    assert "kp-tokenize: wrote 260 records" in r.stderr
    assert "kp-infer" not in r.stderr + r.stdout and "kp-prompts" not in r.stderr + r.stdout
    assert len(server.ledger()) == 260


def test_credits_guard_refuses_to_start_spending(standin, tmp_path):
    server = standin(balance=0.5)
    r = make(server, tmp_path, "all", MIN_CREDITS=2)
    assert r.returncode != 0 and "exit 3" in r.stderr
    assert server.stats()["completions_started"] == 0
    credits = make(server, tmp_path, "credits")
    assert credits.returncode == 0 and "0.5" in credits.stdout


def test_make_demo_runs_the_whole_pipeline_offline(tmp_path):
    out = tmp_path / "demo"
    r = subprocess.run(["make", "-C", str(REPO), "demo", f"VENV={VENV}", f"DEMO_OUT={out}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "demo: done, offline" in r.stderr
    assert "responses      260 (failed: 0)" in r.stderr
    assert "(verified)" in r.stderr
    manifest = json.loads((out / "shards" / "demo" / "manifest.json").read_text())
    assert manifest["totals"]["records"] == 260
    # the stand-in is gone: its port no longer answers
    port = int((out / "standin" / "port").read_text())
    import socket
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
