"""kp-infer compares providers: the summary's by_provider and `kp-infer report FILE...`
(text, --json, .zst, stdin, older lines, bad input) from the same files on disk."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import zstandard
from conftest import kp, read_jsonl
from helpers import MODEL
from test_infer import infer, make_prompts


def rows_by_name(rows):
    return {r["provider"]: r for r in rows}


def kp_report(*args, input=None):
    """`kp-infer report ...`, as a user types it (no API key, no server needed)."""
    return kp("infer", *args, input=input)


def test_the_summary_compares_providers_and_report_reads_the_same_from_disk(standin, tmp_path):
    server = standin(drop_reasoning={"together": 0.5}, inline_reasoning=["parasail"],
                     latency=0.01, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 60)
    out, failures, summary = tmp_path / "r.jsonl", tmp_path / "f.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--failures", failures, "--summary-json", summary,
              "--max-attempts", "2", "--concurrency", "8")
    records = read_jsonl(out)
    failed = read_jsonl(failures) if failures.exists() else []
    s = json.loads(summary.read_text())
    # Two codes are right, and the files say which: a prompt fails only when both its
    # attempts are refused (Together's drop, then Parasail's think marker), and the
    # stand-in draws Together's drops in the order requests arrive, which the scheduling
    # decides. Exit 4 exactly when a failure line was written, else 0.
    assert r.code == (4 if failed else 0), r.stderr
    assert s["failed"] == dict(Counter(f["kind"] for f in failed))
    rows = rows_by_name(s["by_provider"])
    assert sum(x["answers"] for x in rows.values()) == s["done"] == len(records)
    # every figure of a row, recomputed from the records and failure lines
    for name, row in rows.items():
        mine = [rec for rec in records if rec["provider"] == name]
        tokens = sorted(rec["usage"]["completion_tokens"] for rec in mine)
        assert row["answers"] == len(mine)
        assert row["share"] == pytest.approx(len(mine) / len(records), abs=1e-4)
        if mine:
            assert row["completion_tokens"]["mean"] == pytest.approx(sum(tokens) / len(tokens), abs=0.0501)
            assert row["completion_tokens"]["p95"] == tokens[max(0, -(-95 * len(tokens) // 100) - 1)]
            assert row["completion_tokens"]["max"] == tokens[-1]
            assert row["reasoning_share"] == pytest.approx(
                sum(rec["usage"]["reasoning_tokens"] for rec in mine) / sum(tokens), abs=1e-4)
            cost = sum(rec["usage"]["cost"] for rec in mine)
            assert row["usd_per_m_output"] == pytest.approx(cost * 1e6 / sum(tokens), abs=1e-4)
            assert row["finish_reasons"] == {"stop": len(mine)}
            assert row["latency_s"]["p50"] > 0 and row["tokens_per_s"] > 0
        refusals = [x for rec in [*records, *failed] for x in rec["refused"] if x["provider"] == name]
        assert row["refused"] == {k: sum(x["kind"] == k for x in refusals)
                                  for k in ("routing_violation", "no_reasoning", "think_marker",
                                            "identity")}
        assert row["refused_cost"] == pytest.approx(sum(x["cost"] for x in refusals), abs=1e-9)
    assert rows["Together"]["refused"]["no_reasoning"] > 0
    assert rows["Parasail"]["reasoning_share"] == 0.0  # inline: it bills no reasoning tokens
    assert "by provider (refused r/n/t" in r.stderr and "lat p95" in r.stderr

    # kp-infer report: the same table from the files on disk
    rep = kp_report("report", out, failures, "--json")
    assert rep.code == 0, rep.stderr
    report = json.loads(rep.stdout)
    assert report["answers"] == len(records) and report["files"] == [str(out), str(failures)]
    assert report["failures"] == dict(Counter(f["kind"] for f in failed))
    assert report["refused"] == sum(len(x["refused"]) for x in [*records, *failed])
    assert report["spend"] == pytest.approx(sum(x["cost"] for x in server.ledger()), rel=1e-9)
    assert report["sampling"] == [{"answers": len(records), "sampling": records[0]["sampling"]}]
    timing = {"tokens_per_s", "latency_s"}  # the records keep the latency to the millisecond
    for name, row in rows_by_name(report["by_provider"]).items():
        assert {k: v for k, v in row.items() if k not in timing} == \
               {k: v for k, v in rows[name].items() if k not in timing}
        lat = sorted(rec["latency_s"] for rec in records if rec["provider"] == name)
        if lat:
            assert row["latency_s"]["p50"] == lat[-(-len(lat) // 2) - 1]
            assert row["tokens_per_s"] == pytest.approx(
                sum(rec["usage"]["completion_tokens"] for rec in records if rec["provider"] == name)
                / sum(lat), abs=0.0501)  # rounded to 0.1; the sums run in another order
    edges, counts = report["histogram"]["upto"], report["histogram"]["by_provider"]
    for name, bins in counts.items():
        tokens = [rec["usage"]["completion_tokens"] for rec in records if rec["provider"] == name]
        assert bins == [sum(1 for t in tokens if (edges[i - 1] if i else 0) < t <= e)
                        for i, e in enumerate(edges)]
    assert list(counts) == [row["provider"] for row in report["by_provider"] if row["answers"]]

    # the text: totals, the table, a histogram per provider; .zst, stdin and --report alike
    text = kp_report("report", out, failures)
    assert text.code == 0
    shown = text.stdout.decode()
    assert shown.startswith(f"kp-infer report: 2 file(s), {len(records)} answers")
    assert "refused r/n/t" in shown and "completion tokens per answer, by provider" in shown
    for name in counts:
        assert f"\n{name} ({len([x for x in records if x['provider'] == name])} answers)\n" in shown
    zst = tmp_path / "r.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(out.read_bytes()))
    again = kp_report("--report", zst, "--report", "-", "--json", input=failures.read_bytes())
    assert again.code == 0, again.stderr
    assert json.loads(again.stdout)["by_provider"] == report["by_provider"]


def test_report_reads_older_lines_and_refuses_what_is_not_a_result(standin, tmp_path):
    server = standin()
    old_failure = {"id": "a", "dataset": "B3", "kind": "routing_violation", "status": 200,
                   "code": "", "message": "served by Fireworks: ignored", "attempts": 1,
                   "time": "2026-01-01T00:00:00Z", "provider": "Fireworks", "cost": 0.25}
    other = {**old_failure, "id": "b", "kind": "retries_exhausted", "status": 503,
             "provider": None, "cost": 0.0}
    old_record = {"id": "c", "dataset": "B3", "messages": [{"role": "user", "content": "x"}],
                  "response": {"content": "y", "reasoning": "z"}, "finish_reason": "length",
                  "model": MODEL, "provider": "Together", "generation_id": "g",
                  "usage": {"prompt_tokens": 1, "completion_tokens": 10, "reasoning_tokens": 4,
                            "cost": 0.5}, "attempts": 1}
    f = tmp_path / "old.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in (old_failure, other, old_record))
                 + '{"id": "d", "data')  # a run still writing
    r = kp_report("report", f, "--json")
    assert r.code == 0, r.stderr
    assert f"{f}:4: skipped an unfinished last line" in r.stderr
    report = json.loads(r.stdout)
    assert report["failures"] == {"routing_violation": 1, "retries_exhausted": 1}
    assert report["refused"] == 1 and report["spend"] == 0.75
    assert report["sampling"] == [{"sampling": None, "answers": 1}]
    rows = rows_by_name(report["by_provider"])
    assert rows["Fireworks"]["answers"] == 0 and rows["Fireworks"]["refused"]["routing_violation"] == 1
    assert rows["Together"]["finish_reasons"] == {"length": 1}
    assert rows["Together"]["latency_s"] == {"p50": None, "p95": None}
    assert rows["Together"]["tokens_per_s"] is None
    assert "not recorded (older records)" in kp_report("report", f).stdout.decode()
    prompts = make_prompts(tmp_path / "p.jsonl", 2)
    r = kp_report("report", prompts)
    assert r.code == 2 and f"{prompts}:1: neither a response record nor a failure line" in r.stderr
    # a prompts file literally named `report` is still an INPUT
    (tmp_path / "report").write_bytes(prompts.read_bytes())
    r = kp("infer", "report", "--plan", "--base-url", server.base_url, cwd=tmp_path)
    assert r.code == 0 and "2 in the input, 2 to do" in r.stdout.decode(), r.stderr



def test_summary_json_dash_is_stdout_and_refused_when_the_records_are_there(standin, tmp_path):
    """`--summary-json -` prints the summary on stdout (it wrote a file named `-` before);
    with `-o -` stdout carries the records, so the pair is refused before any request."""
    server = standin(ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out, "--summary-json", "-", "--quiet")
    assert r.code == 0, r.stderr
    assert json.loads(r.stdout)["done"] == 3 and len(read_jsonl(out)) == 3
    assert not os.path.exists("-")  # no file named - in the working directory
    r = infer(server, prompts, "-o", "-", "--summary-json", "-")
    assert r.code == 2 and "--summary-json - and -o - both want stdout" in r.stderr
    assert len(server.ledger()) == 3  # the refused run sent nothing
