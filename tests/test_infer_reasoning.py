"""kp-infer verifies the reasoning it buys: an answer without it is sent again with its
provider ignored (a failure paid for after --max-attempts), inline reasoning split, a think
tag left in the content refused, a lone </think> recovered, a length cut kept and marked;
and the extraction order behind it."""

from __future__ import annotations

import json

import msgspec
import pytest
from conftest import read_jsonl
from helpers import MODEL, money_is_exact
from test_infer import infer, make_prompts

from kimipipe.openrouter.answer import reasoning_text, split_inline_think
from kimipipe.openrouter.wire import MessageView, ReasoningDetail
from kimipipe.standin.answers import expected_answer


def test_an_answer_without_reasoning_is_sent_again_with_its_provider_ignored(standin, tmp_path):
    server = standin(drop_reasoning={"together": 1.0}, ledger=True, request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 40)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--summary-json", summary, "--concurrency", "8")
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert len(records) == 40
    assert all(rec["response"]["reasoning"] and rec["provider"] != "Together" for rec in records)
    refused = [x for rec in records for x in rec["refused"]]
    together = [x for x in server.ledger() if x["provider"] == "Together"]
    assert together and all(x["reasoning_dropped"] for x in together)
    assert len(refused) == len(together)
    assert all(x["kind"] == "no_reasoning" and x["provider"] == "Together" and x["cost"] > 0
               for x in refused)
    for rec in records:
        assert rec["attempts"] == len(rec["refused"]) + 1
    money_is_exact(server, records)
    # the second request of a refused prompt ignores Together (the body was rebuilt)
    bodies = {}
    for body in server.requests():
        bodies.setdefault(body["messages"][-1]["content"], []).append(body)
    retried = [b for b in bodies.values() if len(b) > 1]
    assert len(retried) == len(refused)
    for first, second in retried:
        # (deepinfra/turbo: the excluded variant under an allowed name, kept out by the request)
        assert first["provider"]["ignore"] == ["deepinfra/turbo"]
        assert second["provider"]["ignore"] == ["together", "deepinfra/turbo"]
        assert {k: v for k, v in second.items() if k != "provider"} == \
               {k: v for k, v in first.items() if k != "provider"}
    s = json.loads(summary.read_text())
    assert s["refused"] == {"no_reasoning": {"Together": len(refused)}}
    assert s["retries"]["no_reasoning"] == len(refused)
    assert s["spend_this_run"] == pytest.approx(sum(x["cost"] for x in server.ledger()), rel=1e-6)
    assert f"no_reasoning Together {len(refused)}" in r.stderr
    # a rerun counts the refused answers' cost too (they are on the records)
    r = infer(server, prompts, "-o", out, "--summary-json", summary)
    assert r.code == 0 and json.loads(summary.read_text())["spend_total"] == pytest.approx(
        sum(x["cost"] for x in server.ledger()), rel=1e-6)


def test_after_max_attempts_it_is_a_no_reasoning_failure_paid_for(standin, tmp_path):
    """The only provider allowed drops every reasoning: ignoring it would leave no route,
    so it is asked again as it is, and after --max-attempts the prompt is a failure."""
    server = standin(drop_reasoning={"together": 1.0}, ledger=True, request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 4)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--failures", failures, "--only-provider", "together",
              "--max-attempts", "3")
    assert r.code == 4, r.stderr
    assert read_jsonl(out) == []
    failed = read_jsonl(failures)
    assert len(failed) == 4 and len(server.ledger()) == 12
    for f in failed:
        assert (f["kind"], f["attempts"], f["provider"], f["status"]) == ("no_reasoning", 3, "Together", 200)
        assert [x["kind"] for x in f["refused"]] == ["no_reasoning"] * 3
        assert f["generation_id"] == f["refused"][-1]["generation_id"]
    money_is_exact(server, [], failed)
    assert all("ignore" not in b["provider"] for b in server.requests())
    # a rerun counts what the failures file says was paid
    summary = tmp_path / "s.json"
    infer(server, prompts, "-o", out, "--failures", failures, "--only-provider", "together",
          "--max-attempts", "1", "--summary-json", summary)
    assert json.loads(summary.read_text())["spend_total"] == pytest.approx(
        sum(x["cost"] for x in server.ledger()), rel=1e-6)


def test_inline_reasoning_is_split_and_a_think_tag_left_in_the_content_is_refused(standin, tmp_path):
    """Parasail puts the reasoning inline. A block that splits cleanly is kept (reasoning
    split off); when a literal tag in the text leaves one in the content after the split,
    where the block ended is uncertain: a think_marker, failed after --max-attempts (the
    only provider allowed). An answer whose reasoning came in its own field keeps a tag the
    model wrote in its content."""
    server = standin(inline_reasoning=["parasail"], ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 60)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--failures", failures, "--only-provider", "parasail",
              "--max-attempts", "2")
    kept, failed = read_jsonl(out), read_jsonl(failures)
    assert len(kept) + len(failed) == 60 and kept
    by_id = {p["id"]: p for p in read_jsonl(prompts)}
    for rec in kept:
        want = expected_answer(by_id[rec["id"]]["messages"], model=MODEL, seed=None,
                               reasoning=True, max_tokens=16384)
        assert "</think>" not in want.reasoning
        assert "<think>" not in want.content and "</think>" not in want.content
        assert rec["response"]["reasoning"] == f"\n{want.reasoning}\n"  # verbatim, as split
        assert rec["response"]["content"] == f"\n\n{want.content}"
    for f in failed:
        want = expected_answer(by_id[f["id"]]["messages"], model=MODEL, seed=None,
                               reasoning=True, max_tokens=16384)
        assert "</think>" in want.reasoning or "<think>" in want.content or "</think>" in want.content
        assert f["kind"] == "think_marker" and len(f["refused"]) == 2
    assert failed, "the stand-in's literal tags should make at least one split uncertain"
    assert r.code == 4, r.stderr
    money_is_exact(server, kept, failed)
    # the same prompts from a provider with a reasoning field: every one kept, tags and all
    out2 = tmp_path / "r2.jsonl"
    r = infer(server, prompts, "-o", out2, "--only-provider", "together")
    assert r.code == 0, r.stderr
    records = read_jsonl(out2)
    assert len(records) == 60 and all(not rec["refused"] for rec in records)
    assert any("</think>" in rec["response"]["content"] or "<think>" in rec["response"]["content"]
               for rec in records)


def test_reasoning_before_a_lone_think_close_is_recovered_as_inline(standin, tmp_path):
    """A stack with no reasoning parser (the `<think>` was the prompt's) returns
    reasoning</think>content as content: the text before the one `</think>` is the
    reasoning (`reasoning_source: inline`), kept, not refused. A literal tag the model
    wrote makes a second tag: where the reasoning ended is then a guess (think_marker)."""
    server = standin(unopened_reasoning=["parasail"], ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 40)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--failures", failures, "--only-provider", "parasail",
              "--max-attempts", "1")
    kept = read_jsonl(out)
    failed = read_jsonl(failures) if failures.exists() else []
    assert len(kept) + len(failed) == 40 and kept
    assert r.code == (4 if failed else 0), r.stderr
    by_id = {p["id"]: p for p in read_jsonl(prompts)}
    for rec in kept:
        want = expected_answer(by_id[rec["id"]]["messages"], model=MODEL, seed=None,
                               reasoning=True, max_tokens=16384)
        assert rec["response"] == {"content": want.content, "reasoning": want.reasoning}
        assert rec["reasoning_source"] == "inline" and not rec["refused"]
    for f in failed:
        want = expected_answer(by_id[f["id"]]["messages"], model=MODEL, seed=None,
                               reasoning=True, max_tokens=16384)
        text = want.reasoning + want.content
        assert "</think>" in text or "<think>" in text
        assert f["kind"] == "think_marker"
    money_is_exact(server, kept, failed)
    # a reasoning field: the source says so
    out2 = tmp_path / "r2.jsonl"
    assert infer(server, prompts, "-o", out2, "--only-provider", "together").code == 0
    assert {rec["reasoning_source"] for rec in read_jsonl(out2)} == {"field"}


def test_reasoning_cut_by_max_tokens_is_kept_and_marked(standin, tmp_path):
    server = standin(inline_reasoning=["parasail"])
    prompts = make_prompts(tmp_path / "p.jsonl", 10)
    by_id = {p["id"]: p for p in read_jsonl(prompts)}
    for provider in ("parasail", "together"):  # inline, and in the reasoning field
        out = tmp_path / f"{provider}.jsonl"
        r = infer(server, prompts, "-o", out, "--only-provider", provider, "--max-tokens", "5")
        assert r.code == 0, r.stderr
        records = read_jsonl(out)
        assert len(records) == 10
        for rec in records:
            want = expected_answer(by_id[rec["id"]]["messages"], model=MODEL, seed=None,
                                   reasoning=True, max_tokens=5)
            assert rec["finish_reason"] == "length" and not rec["refused"]
            assert rec["response"]["content"] == ""
            assert rec["response"]["reasoning"] == (f"\n{want.reasoning}" if provider == "parasail"
                                                    else want.reasoning)


def test_reasoning_extraction_order():
    def details(rows):  # as the client decodes them from the wire
        return msgspec.json.decode(msgspec.json.encode(rows), type=list[ReasoningDetail])

    # (the text, where it came from: the reasoning field, else reasoning_details)
    assert reasoning_text("direct", details([{"type": "reasoning.text", "text": "x"}])) == (
        "direct", "field")
    assert reasoning_text(None, details([{"type": "reasoning.text", "text": "a"},
                                          {"type": "reasoning.summary", "summary": "s"},
                                          {"type": "reasoning.text", "text": "b"}])) == ("ab", "details")
    assert reasoning_text("", None) == (None, "")
    assert split_inline_think("<think>plan</think>answer", None) == ("answer", "plan")
    assert split_inline_think("<think>plan</think>answer", "real") == ("<think>plan</think>answer", "real")
    assert split_inline_think("no think", None) == ("no think", None)
    # an inline block cut by max_tokens before it closed: all reasoning, only when cut
    assert split_inline_think("<think>plan and", None) == ("<think>plan and", None)
    assert split_inline_think("<think>plan and", None, cut=True) == ("", "plan and")
    assert MessageView().content is None

