"""kp-infer's routing through the command line against the stand-in: every request and
routing flag on the wire, quantization and distillation filters, provider slugs, routing
violations sent again with the provider ignored (and their money counted), and the pure
policy checks behind them."""

from __future__ import annotations

import re

import pytest
from conftest import read_jsonl
from helpers import MODEL, endpoints_table, money_is_exact
from test_infer import NATIVE, infer, make_prompts

from kimipipe.openrouter.routing import (
    Endpoint,
    Policy,
    Pricing,
    allowed_endpoints,
    routing_violation,
)


def test_max_cost_holds_when_an_excluded_pricier_endpoint_serves_anyway(standin, tmp_path):
    """The only endpoint allowed is the cheapest (DeepInfra Turbo),
    and every answer is served anyway by one the flags excluded, all pricier. Such answers
    are billed at their endpoint's price, so each request's worst case must be reserved at
    the highest price of the whole table: the stand-in's bill stays under the cap (reserved
    at the allowed endpoint's price, it billed 2.0955 under --max-cost 2)."""
    server = standin(ledger=True, price_scale=1000.0, faults={"misroute": 1.0}, seed=2)
    # fewer prompts than the cap has room for: each is sent again until the cap stops it,
    # whatever order the answers come back in
    prompts = make_prompts(tmp_path / "p.jsonl", 4)
    out, failures, summary = tmp_path / "r.jsonl", tmp_path / "f.jsonl", tmp_path / "s.json"
    flags = ("--any-quantization", "--only-provider", "deepinfra/turbo", "--concurrency", "8",
             "--max-tokens", "60", "--max-cost", "2")
    r = infer(server, prompts, "-o", out, "--failures", failures, "--summary-json", summary, *flags,
              env={"KP_PROGRESS_INTERVAL": "0.05"})
    assert r.code == 3, r.stderr
    assert "--max-cost reached" in r.stderr
    # the prompts the stop left unsent are the stop's, not failures, on the progress line too
    last = [line for line in r.stderr.splitlines() if re.match(r"kp-infer: \d+/\d+,", line)][-1]
    assert "stopping (max-cost)" in last and " failed" not in last, last
    billed = server.ledger()
    assert len(billed) > 4 and "deepinfra/turbo" not in {x["endpoint"] for x in billed}
    assert sum(x["cost"] for x in billed) <= 2
    violations = read_jsonl(failures)
    # each prompt is sent again with the violating provider ignored, and misrouted again,
    # until the cap leaves no room for another worst case: every answer billed is one
    # refused, or one from DeepInfra's int4 endpoint, which shares the allowed variant's
    # name: kept, marked unverifiable (an answer cannot name its endpoint)
    kept = read_jsonl(out)
    refused = [x for f in [*violations, *kept] for x in f["refused"]]
    assert all(x["provider"] == "DeepInfra" and x["routing"] == "unverifiable" for x in kept)
    assert len(refused) + len(kept) == len(billed)
    assert sorted(x["generation_id"] for x in [*refused, *kept]) == sorted(x["generation_id"] for x in billed)
    # (not sent again once the cap left no room: its stop, not the prompt's failure)
    assert all(f["kind"] == "stopped" and f["message"].startswith("routing_violation: ")
               for f in violations)
    assert any(len(f["refused"]) > 1 for f in [*violations, *kept])  # misrouted again
    assert sum(f["cost"] for f in violations) + sum(x["usage"]["cost"] + sum(r["cost"] for r in x["refused"])
                                                    for x in kept) == pytest.approx(
        sum(x["cost"] for x in billed), rel=1e-9)
    # a rerun counts what the failures file says was paid: still under the cap
    r = infer(server, prompts, "-o", out, "--failures", failures, *flags)
    assert r.code == 3, r.stderr
    assert sum(x["cost"] for x in server.ledger()) <= 2


def test_every_request_and_routing_flag_reaches_the_request_body(standin, tmp_path):
    server = standin(request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    rows = {p["id"]: p for p in read_jsonl(prompts)}
    flags = ("--max-tokens", "500", "--temperature", "0.3", "--top-p", "0.9", "--seed", "7",
             "--reasoning-effort", "high", "--ignore-provider", "fireworks",
             "--only-provider", "together", "--only-provider", "moonshotai", "--sort", "throughput",
             "--no-fallbacks", "--data-collection", "deny", "--max-price-prompt", "0.7",
             "--max-price-completion", "3.5",
             "--extra-body", '{"user": "tester", "provider": {"require_parameters": true}}')
    for mode in ("--stream", "--no-stream"):
        before = len(server.requests())
        r = infer(server, prompts, "-o", tmp_path / f"r{mode}.jsonl", mode, *flags)
        assert r.code == 0, r.stderr
        bodies = server.requests()[before:]
        assert len(bodies) == 3
        for body in bodies:
            prompt = next(p for p in rows.values() if p["messages"] == body["messages"])
            assert body == {
                "model": MODEL, "messages": prompt["messages"], "max_tokens": 500,
                "stream": mode == "--stream", "temperature": 0.3, "top_p": 0.9, "seed": 7,
                "reasoning": {"effort": "high"}, "user": "tester",
                "provider": {"ignore": ["fireworks"], "only": ["together", "moonshotai"],
                             "quantizations": ["int4", "unknown"], "sort": "throughput",
                             "allow_fallbacks": False, "data_collection": "deny",
                             "max_price": {"prompt": "0.7", "completion": "3.5"},
                             "enforce_distillable_text": True, "require_parameters": True}}
    # sort=throughput among the two allowed: Together (60 tok/s) beats Moonshot AI (45)
    assert {x["provider"] for x in read_jsonl(tmp_path / "r--stream.jsonl")} == {"Together"}
    r = infer(server, prompts, "-o", tmp_path / "plain.jsonl", "--no-reasoning",
              "--model", "moonshotai/kimi-k2-0905", "--any-quantization")
    assert r.code == 0, r.stderr
    for body in server.requests()[-3:]:
        assert body["reasoning"] == {"enabled": False} and body["model"] == "moonshotai/kimi-k2-0905"
        # no preset for this model: no sampling invented, so no require_parameters either
        assert body["provider"] == {"enforce_distillable_text": True}
        assert "temperature" not in body and body["max_tokens"] == 16384


def test_quantization_routes_end_to_end_and_a_violation_by_quantization_is_caught(standin, tmp_path):
    """`--quantization int4` reaches the wire, answers come from int4 endpoints only, and an
    answer served anyway by an endpoint of another quantization (Moonshot AI's `unknown`
    among them) is a routing violation, paid for and not written."""
    server = standin(request_log=True, ledger=True, faults={"misroute": 0.4}, seed=11)
    prompts = make_prompts(tmp_path / "p.jsonl", 40)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--failures", failures, "--quantization", "int4",
              "--max-attempts", "1")  # no retry with the provider ignored: each one a failure
    assert r.code == 4, r.stderr
    assert all(b["provider"]["quantizations"] == ["int4"] for b in server.requests())
    quant: dict[str, set] = {}
    for e in endpoints_table(server):
        quant.setdefault(e["provider_name"], set()).add(e["quantization"])
    written = read_jsonl(out)
    assert written and {x["provider"] for x in written} <= {p for p, q in quant.items() if "int4" in q}
    # DeepInfra names an int4 endpoint and its FP4 variant: its answers cannot be verified
    assert all(x.get("routing") == ("unverifiable" if x["provider"] == "DeepInfra" else None)
               for x in written)
    violations = read_jsonl(failures)
    assert violations and len(written) + len(violations) == 40
    for f in violations:
        assert f["kind"] == "routing_violation" and f["cost"] > 0
        [q] = quant[f["provider"]]
        assert f["message"] == f"served by {f['provider']}: quantization {q} not allowed"
    assert "Moonshot AI" in {f["provider"] for f in violations}  # `unknown` is a quantization too
    assert sum(x["cost"] for x in server.ledger()) == pytest.approx(
        sum(x["usage"]["cost"] for x in written) + sum(f["cost"] for f in violations), rel=1e-9)


def test_native_providers_are_what_the_stand_in_calls_int4_or_unknown(standin):
    """NATIVE (test_infer.py) is the stand-in's int4/unknown endpoints, not a guess."""
    table = endpoints_table(standin())
    assert NATIVE == {e["provider_name"] for e in table if e["quantization"] in ("int4", "unknown")}




def test_distillation_is_enforced_by_default_and_plan_says_whether_it_is_allowed(standin, tmp_path):
    server = standin(request_log=True, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 4)
    r = infer(server, prompts, "--plan")
    assert r.code == 0, r.stderr
    assert ("distillation: allowed by the authors of moonshotai/kimi-k2.5 (is_trainable_text); "
            "provider.enforce_distillable_text sent") in r.stdout.decode()
    r = infer(server, prompts, "-o", tmp_path / "r.jsonl")
    assert r.code == 0, r.stderr
    assert all(b["provider"]["enforce_distillable_text"] is True for b in server.requests())

    server.configure(not_distillable=True)
    r = infer(server, prompts, "--plan")
    assert r.code == 0, r.stderr
    assert "distillation: NOT allowed by the authors of moonshotai/kimi-k2.5" in r.stdout.decode()
    # a run is refused before any request (OpenRouter would route none of them)
    before = server.stats()["requests"]
    out = tmp_path / "refused.jsonl"
    r = infer(server, prompts, "-o", out)
    assert r.code == 2
    assert "do not allow distillation (is_trainable_text: false)" in r.stderr
    assert "--allow-non-distillable" in r.stderr
    assert server.stats()["requests"] == before and not out.exists()
    # the stand-in itself refuses such requests: OpenRouter's no-route 404, never billed
    billed = len(server.ledger())
    r = infer(server, prompts, "-o", out, "--extra-body",
              '{"provider": {"enforce_distillable_text": true}}', "--allow-non-distillable")
    assert r.code == 2 and "OpenRouter can route no request (a 404" in r.stderr
    assert "allow distillation" in r.stderr and len(server.ledger()) == billed
    # --allow-non-distillable: sent without the flag, answered, with a warning
    before = len(server.requests())
    r = infer(server, prompts, "-o", tmp_path / "allowed.jsonl", "--allow-non-distillable")
    assert r.code == 0, r.stderr
    assert "warning: the authors of moonshotai/kimi-k2.5 do not allow distillation" in r.stderr
    sent = server.requests()[before:]
    assert sent and all("enforce_distillable_text" not in b["provider"] for b in sent)
    assert len(read_jsonl(tmp_path / "allowed.jsonl")) == 4


def test_a_routing_violation_is_sent_again_with_the_provider_ignored(standin, tmp_path):
    """Like a missing reasoning: the answer is paid for, not kept, and the prompt is sent
    again with the provider that served it in its provider.ignore."""
    server = standin(faults={"misroute": 0.4}, seed=11, ledger=True, request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 30)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--failures", failures, "--max-attempts", "6")
    records = read_jsonl(out)
    failed = read_jsonl(failures) if failures.exists() else []
    assert len(records) + len(failed) == 30
    assert r.code == (4 if failed else 0), r.stderr
    native = {"Moonshot AI", "Together", "DeepInfra", "Parasail"}
    assert {rec["provider"] for rec in records} <= native
    # an answer misrouted to DeepInfra's FP4 variant names "DeepInfra": it cannot be told
    # from the int4 endpoint, so every DeepInfra answer is kept marked unverifiable
    served = {x["generation_id"]: x["endpoint"] for x in server.ledger()}
    assert all(rec.get("routing") == ("unverifiable" if rec["provider"] == "DeepInfra" else None)
               for rec in records)
    assert "deepinfra/turbo" in {served[rec["generation_id"]] for rec in records}
    refused = [x for rec in records for x in rec["refused"]]
    assert refused and all(x["kind"] == "routing_violation" and x["provider"] not in native
                           for x in refused)
    assert all(x["message"].startswith(f"served by {x['provider']}: ") for x in refused)
    money_is_exact(server, records, failed)
    slug = {"Fireworks": "fireworks", "BaseTen": "baseten"}
    bodies = {}
    for body in server.requests():
        bodies.setdefault(body["messages"][-1]["content"], []).append(body)
    for rec in records:
        sent = next(b for b in bodies.values() if b[0]["messages"] == rec["messages"])
        assert len(sent) == rec["attempts"] == len(rec["refused"]) + 1
        ignored = [slug[x["provider"]] for x in rec["refused"]]
        for n, body in enumerate(sent):
            assert body["provider"].get("ignore", []) == [*dict.fromkeys(ignored[:n]), "deepinfra/turbo"]


@pytest.mark.parametrize("flag, slug, hint", [
    ("--ignore-provider", "firework", "did you mean 'fireworks'?"),
    ("--only-provider", "togther", "did you mean 'together'?"),
    ("--ignore-provider", "deepinfra/trubo", "did you mean 'deepinfra/turbo'?"),
    ("--ignore-provider", "zzz", "known: baseten, deepinfra, deepinfra/turbo, fireworks, "
                                 "moonshotai, parasail, together"),
])
def test_an_unknown_provider_slug_is_refused_with_the_closest_known_one(standin, tmp_path, flag,
                                                                        slug, hint):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    for mode in (("-o", tmp_path / "r.jsonl"), ("--plan",)):
        r = infer(server, prompts, flag, slug, *mode)
        assert r.code == 2
        assert (f"kp-infer: {flag} {slug!r}: no provider of moonshotai/kimi-k2.5 is called that; "
                f"{hint}") in r.stderr
    assert server.stats()["requests"] == 0 and not (tmp_path / "r.jsonl").exists()


def test_every_way_of_naming_a_known_provider_is_accepted(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    r = infer(server, prompts, "-o", tmp_path / "r.jsonl", "--ignore-provider", "DeepInfra",
              "--ignore-provider", "FIREWORKS", "--ignore-provider", "deepinfra/turbo",
              "--only-provider", "moonshotai", "--only-provider", "Together", "--any-quantization")
    assert r.code == 0, r.stderr
    assert {x["provider"] for x in read_jsonl(tmp_path / "r.jsonl")} <= {"Moonshot AI", "Together"}


ENDPOINTS = [
    Endpoint("Moonshot AI", "moonshotai", "unknown", Pricing("0.0000006", "0.0000025")),
    Endpoint("DeepInfra", "deepinfra", "int4", Pricing("0.0000005", "0.000002")),
    Endpoint("DeepInfra", "deepinfra/turbo", "fp4", Pricing("0.0000003", "0.0000012")),
    Endpoint("Fireworks", "fireworks", "nvfp4", Pricing("0.0000004", "0.0000015")),
    Endpoint("BaseTen", "baseten", "fp4", Pricing("0.0000003", "0.0000011")),
]


def test_ignore_matches_variants_and_quantization_filter():
    policy = Policy(ignore=["fireworks", "baseten"])
    assert [e.tag for e in allowed_endpoints(policy, ENDPOINTS)] == ["moonshotai", "deepinfra", "deepinfra/turbo"]
    policy = Policy(ignore=["deepinfra"])
    assert [e.tag for e in allowed_endpoints(policy, ENDPOINTS)] == ["moonshotai", "fireworks", "baseten"]
    policy = Policy(quantizations=["int4", "unknown"])
    assert [e.tag for e in allowed_endpoints(policy, ENDPOINTS)] == ["moonshotai", "deepinfra"]


def test_routing_violation_checks_name_and_quantization():
    policy = Policy(ignore=["fireworks", "baseten"])
    assert routing_violation(policy, "Fireworks", ENDPOINTS) == "served by Fireworks: ignored"
    assert routing_violation(policy, "Moonshot AI", ENDPOINTS) is None
    assert routing_violation(policy, "BaseTen", None) == "served by BaseTen: ignored"
    only_int4 = Policy(quantizations=["int4"])
    assert "quantization unknown" in routing_violation(only_int4, "Moonshot AI", ENDPOINTS)
    # DeepInfra serves both int4 and fp4 endpoints under one name: allowed if any matches
    assert routing_violation(only_int4, "DeepInfra", ENDPOINTS) is None

