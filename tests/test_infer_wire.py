"""kp-infer against the wire as OpenRouter documents it (issue 24): both stream shapes, the
availability bodies, endpoint variants, nulls in the endpoints table, the request headers.

Every test runs kp-infer as a user does, against the stand-in switched to the documented
variant (kimipipe/standin/config.py: stream_usage, midstream_code, unavailable,
endpoint_nulls)."""

from __future__ import annotations

import json

import pytest
from conftest import read_jsonl
from test_infer import assert_correct, ids_of, infer, make_prompts


# -- 1. both stream shapes ------------------------------------------------------------------

@pytest.mark.parametrize("shape, said", [("own-chunk", "own chunk"),
                                         ("finish-chunk", "finish chunk")])
def test_preflight_and_run_take_both_stream_shapes(standin, tmp_path, shape, said):
    """OpenRouter's streaming reference: the usage comes in a last chunk of its own
    (`choices: []`) or on the finish chunk. Both pass the preflight, which says which it
    saw, and a run books the same money from both."""
    server = standin(ledger=True, stream_usage=shape)
    prompts = make_prompts(tmp_path / "p.jsonl", 12)
    out = tmp_path / "r.jsonl"
    r = infer(server, "--preflight", "2", prompts, "-o", out, "--json")
    assert r.code == 0, r.stdout.decode() + r.stderr
    report = json.loads(r.stdout)
    assert report["passed"] is True
    assert [a["usage_shape"] for a in report["answers"]] == [said, said]
    details = {c["check"]: c["detail"] for c in report["checks"]}
    assert f"usage on the {said}" in details["answer 1: stream"]
    r = infer(server, prompts, "-o", out, "--summary-json", tmp_path / "s.json")
    assert r.code == 0, r.stderr
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(12)]
    records = read_jsonl(out)
    assert_correct(records, prompts)
    billed = server.ledger()
    assert len(billed) == 12
    assert sum(x["usage"]["cost"] for x in records) == pytest.approx(sum(x["cost"] for x in billed))


# -- 3. endpoint variants under one provider name -------------------------------------------

def test_an_answer_from_a_variant_under_an_allowed_name_is_marked_unverifiable(standin, tmp_path):
    """DeepInfra lists its int4 endpoint and its FP4 turbo variant under one name, told apart
    by the tag only, and an answer names the provider, never the endpoint. The request keeps
    the variant out by its tag (provider.ignore), and every DeepInfra answer, which could be
    either, is kept marked `"routing": "unverifiable"` and counted, not passed as verified."""
    server = standin(faults={"misroute": 0.5}, seed=3, ledger=True, request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 30)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = infer(server, "--plan", prompts)
    assert r.code == 0, r.stderr
    assert ("warning: DeepInfra names an allowed endpoint (deepinfra) and an excluded variant "
            "(deepinfra/turbo)") in r.stdout.decode()
    r = infer(server, prompts, "-o", out, "--failures", tmp_path / "f.jsonl",
              "--max-attempts", "8", "--summary-json", summary)
    assert r.code == 0, r.stderr
    assert all("deepinfra/turbo" in b["provider"]["ignore"] for b in server.requests())
    served = {x["generation_id"]: x["endpoint"] for x in server.ledger()}
    records = read_jsonl(out)
    from_variant = [x for x in records if served[x["generation_id"]] == "deepinfra/turbo"]
    assert from_variant, "the seed no longer misroutes an answer to the variant"
    assert all(x["provider"] == "DeepInfra" for x in from_variant)
    marked = [x for x in records if x.get("routing") == "unverifiable"]
    assert marked == [x for x in records if x["provider"] == "DeepInfra"]
    assert json.loads(summary.read_text())["routing_unverifiable"] == {"DeepInfra": len(marked)}
    assert "routing unverifiable" in r.stderr
