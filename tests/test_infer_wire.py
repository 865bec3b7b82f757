"""kp-infer against the wire as OpenRouter documents it (docs/openrouter.md): both stream shapes, the
availability bodies, endpoint variants, nulls in the endpoints table, the request headers.

Every test runs kp-infer as a user does, against the stand-in switched to the documented
variant (kimipipe/standin/config.py: stream_usage, midstream_code, unavailable,
endpoint_nulls)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import BIN, read_jsonl, write_jsonl
from helpers import stderr_after, wait_for
from test_infer import assert_correct, ids_of, infer, make_prompts

from kimipipe.standin.availability import AVAILABILITY, unavailable_error

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


# -- 2. error.availability ------------------------------------------------------------------

@pytest.mark.parametrize("code, status", [("model_deprecated", 404), ("region_restricted", 403)])
def test_a_non_retryable_availability_error_on_the_first_request_stops_the_run(standin, tmp_path,
                                                                               code, status):
    """"Always switch on availability.retryable, not just the code": a 404 or a 403 that
    says the model cannot be served stops the run at once (exit 2), naming the code, the
    models and the providers; no prompt is failed for it."""
    server = standin(unavailable=code)
    prompts = make_prompts(tmp_path / "p.jsonl", 40)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--failures", failures, "--concurrency", "4")
    assert r.code == 2, r.stderr
    assert f"kp-infer: {code} (HTTP {status}, not retryable): " in r.stderr
    assert "models: moonshotai/kimi-k2.5; providers: " in r.stderr and "Together" in r.stderr
    # nothing answered: the empty output a fatal stop leaves is removed (issue 49)
    assert not out.exists() and (not failures.exists() or read_jsonl(failures) == [])
    assert server.stats()["requests"] <= 4  # the first requests in flight: no retry, no more


def test_a_model_retired_mid_run_stops_resumably_and_the_rerun_finishes(standin, tmp_path):
    """The hosts retire the model under a long run: the stand-in answers 10 and holds the
    rest at its gate, then lets them go already retired (one change), so the retirement
    lands while the run provably has work left on any machine. The run stops at once
    (exit 2) with exactly the 10 answers paid for kept and no prompt failed; the same
    command resumes once the model is served again, paying nothing twice."""
    server = standin(ledger=True)
    server.configure(hold_after=10)
    prompts = make_prompts(tmp_path / "p.jsonl", 60)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    proc = subprocess.Popen([str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--failures",
                             str(failures), "--base-url", server.base_url, "--concurrency", "4",
                             "--backoff-base", "0.01"],
                            env={**os.environ, "OPENROUTER_API_KEY": server.api_key},
                            stderr=subprocess.PIPE)

    def retire_it_under_the_run():
        wait_for(lambda: len(server.ledger()) == 10 and server.stats()["held"]
                 or proc.poll() is not None, "10 answers and the next held at the gate", 60)
        assert proc.poll() is None, "the run ended before the gate"
        server.configure(unavailable="model_deprecated", hold_after=None)

    stderr = stderr_after(proc, retire_it_under_the_run, timeout=60).decode()
    assert proc.returncode == 2, stderr
    assert "model_deprecated (HTTP 404, not retryable)" in stderr
    assert len(ids_of(out)) == 10 and (not failures.exists() or read_jsonl(failures) == [])
    assert len(server.ledger()) == 10  # every answer paid for is kept
    server.configure(unavailable=None)  # served again (or another model): the same command resumes
    r = infer(server, prompts, "-o", out, "--failures", failures)
    assert r.code == 0, r.stderr
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(60)]
    assert len(server.ledger()) == 60  # nothing paid twice


@pytest.mark.parametrize("code", sorted(AVAILABILITY))
def test_the_availability_flag_decides_not_the_status(code):
    """OpenRouter's errors docs: "always switch on `availability.retryable`, not just the
    code". The stand-in sends each code with the flag the docs give it, so a run only
    meets retryable 429s and 503s, which are retried by their status anyway; this holds
    the rule itself: each documented body (the stand-in's own), its flag as sent and
    flipped, is classified by the flag alone. Retryable: retried after its
    `availability.retry_after` (over the Retry-After header), whatever the status (a
    `no_endpoints` 404 marked retryable included); not retryable: the run stops, even on a
    429 or a 503, with the code, the models and the providers named."""
    from kimipipe.kinds import AttemptKind
    from kimipipe.openrouter.attempt import error_attempt
    for retryable in (True, False):
        status, body, _ = unavailable_error(code, "moonshotai/kimi-k2.5", ["Together"], 2.5)
        body["error"]["availability"].update(retryable=retryable,
                                             retry_after=2.5 if retryable else None)
        attempt = error_attempt(status, body, 9.0, "")
        assert attempt.status == status and attempt.code == code
        if retryable:
            assert attempt.kind == AttemptKind.RETRY and attempt.retry_after == 2.5, attempt
        else:
            assert attempt.kind == AttemptKind.NO_ROUTE, attempt
            assert attempt.message.startswith(f"{code} (HTTP {status}, not retryable): ")
            assert "models: moonshotai/kimi-k2.5; providers: Together" in attempt.message


def test_capacity_exhausted_is_retried_after_its_retry_after(standin, tmp_path):
    """429 capacity_exhausted (retryable: true) with availability.retry_after: retried, and
    every prompt answered once it clears; a failure keeps the error's error_type."""
    server = standin(faults={"429": 0.3}, retry_after=0.05, seed=4, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 30)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--summary-json", summary, "--max-attempts", "20")
    assert r.code == 0, r.stderr
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(30)]
    assert json.loads(summary.read_text())["retries"]["429"] == server.stats()["faults"]["429"]
    # one attempt only: the failure record says how OpenRouter typed the error
    server.configure(faults={"502": 1.0})
    failures = tmp_path / "f.jsonl"
    r = infer(server, make_prompts(tmp_path / "q.jsonl", 2, start=100), "-o", tmp_path / "q.out",
              "--failures", failures, "--max-attempts", "1")
    assert r.code == 4, r.stderr
    assert [f["error_type"] for f in read_jsonl(failures)] == ["provider_unavailable"] * 2


@pytest.mark.parametrize("code", ["429", "408", "provider_overloaded", "server_error"])
def test_midstream_errors_with_4xx_and_string_codes_are_retried(standin, tmp_path, code):
    server = standin(faults={"midstream": 0.4}, midstream_code=code, seed=6, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 20)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--summary-json", summary, "--max-attempts", "20")
    assert r.code == 0, r.stderr
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(20)]
    assert_correct(read_jsonl(out), prompts)
    assert json.loads(summary.read_text())["retries"]["midstream"] == server.stats()["faults"]["midstream"]


# -- 7. provenance and hygiene on every request ---------------------------------------------

def test_every_completion_asks_for_no_cache_and_names_kimipipe(standin, tmp_path):
    """X-OpenRouter-Cache: false (a cached answer is a verbatim duplicate at $0, whatever
    the sampling) and the current X-OpenRouter-Title, on the run's requests and the
    preflight's, which are sent by the run's own client (User-Agent: kimipipe, http11.py)."""
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 6)
    out = tmp_path / "r.jsonl"
    assert infer(server, "--preflight", "2", prompts, "-o", out).code == 0
    assert infer(server, prompts, "-o", out).code == 0
    headers = server.stats()["completion_headers"]
    assert headers["X-OpenRouter-Cache"] == {"false": 6}
    assert headers["X-OpenRouter-Title"] == {"kimipipe": 6}
    assert headers["HTTP-Referer"] == {"https://github.com/kimipipe/kimipipe": 6}
    assert server.stats()["user_agents"]["completions"] == {"kimipipe": 6}


# -- 4. nulls in the endpoints table --------------------------------------------------------

def test_nulls_in_the_endpoints_table_are_read(standin, tmp_path):
    """The live table leaves quantization, max_completion_tokens, optional pricing keys and
    supported_parameters null or out. A null quantization is `unknown` (allowed by Kimi's
    default, as OpenRouter's filter allows it), null supported_parameters is "not known"
    (not excluded by require_parameters); plan, preflight and run read the table."""
    server = standin(endpoint_nulls=True, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 10)
    out = tmp_path / "r.jsonl"
    r = infer(server, "--plan", "--json", prompts)
    assert r.code == 0, r.stderr
    routes = {x["tag"]: x for x in json.loads(r.stdout)["routes"]}
    assert routes["moonshotai"]["quantization"] is None and routes["moonshotai"]["allowed"]
    assert routes["parasail"]["allowed"]  # supported_parameters null: not excluded
    r = infer(server, "--plan", prompts)
    assert r.code == 0 and "Moonshot AI" in r.stdout.decode()
    r = infer(server, "--preflight", "2", prompts, "-o", out, "--json")
    assert r.code == 0, r.stdout.decode() + r.stderr
    r = infer(server, prompts, "-o", out)
    assert r.code == 0, r.stderr
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(10)]
    assert {x["provider"] for x in read_jsonl(out)} <= {"Moonshot AI", "Together", "DeepInfra", "Parasail"}


# -- 6. a systematic failure stops the run early --------------------------------------------

def test_every_request_refused_the_same_way_stops_the_run_early(standin, tmp_path):
    """A request OpenRouter refuses whatever the prompt (here a provider key it does not
    know: 400) is a configuration error: after 50 identical permanent failures in a row
    with no answer the run stops, exit 2, naming the status and the message and suggesting
    --preflight, instead of writing a failure line for every prompt. Answers kept."""
    server = standin(request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 300)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, make_prompts(tmp_path / "few.jsonl", 5), "-o", out)
    assert r.code == 0, r.stderr
    r = infer(server, prompts, "-o", out, "--failures", failures, "--concurrency", "8",
              "--extra-body", '{"provider": {"prefer": ["together"]}}',
              "--summary-json", tmp_path / "s.json")
    assert r.code == 2, r.stderr
    assert ("kp-infer: 50 requests in a row failed the same way, with no answer in between: "
            "HTTP 400: Unrecognized key(s) in provider: prefer") in r.stderr
    assert "check it with --preflight" in r.stderr
    failed = read_jsonl(failures)
    assert 50 <= len(failed) < 50 + 8 and {f["status"] for f in failed} == {400}
    assert len(server.requests()) < 50 + 8 + 5  # the first 5, then no more than one window
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(5)]  # answered, kept
    assert json.loads((tmp_path / "s.json").read_text())["stop_reason"] == "systematic-failure"


def test_answers_between_identical_refusals_restart_the_count(standin, tmp_path):
    """The early stop is for a run that gets nothing but the same refusal: one that mostly
    works is not stopped. Here every other prompt is refused by moderation the same way
    (one provider: the message names it), 60 identical refusals in all but never 50 with
    no answer in between, so the run answers the rest and ends as any run with failures
    does (exit 4: the 60 in --failures, for a rerun to retry), not as "systematic"."""
    server = standin(moderation_marker="FLAGME", ledger=True)
    rows = read_jsonl(make_prompts(tmp_path / "p.jsonl", 120))
    for row in rows[::2]:
        row["messages"][-1]["content"] += " FLAGME"
    prompts = write_jsonl(tmp_path / "p.jsonl", rows)
    out, failures, summary = tmp_path / "r.jsonl", tmp_path / "f.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--failures", failures, "--concurrency", "8",
              "--only-provider", "together", "--summary-json", summary)
    assert r.code == 4, r.stderr
    assert "in a row failed the same way" not in r.stderr
    failed = read_jsonl(failures)
    assert sorted(f["id"] for f in failed) == [f"p{i:05d}" for i in range(0, 120, 2)]
    assert len({(f["status"], f["message"]) for f in failed}) == 1  # all refused the same way
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(1, 120, 2)]
    s = json.loads(summary.read_text())
    assert s["stop_reason"] is None and s["failed"] == {"http_403": 60}


def test_plan_and_preflight_warn_when_one_endpoint_alone_is_allowed(standin, tmp_path):
    """Hosts retire Kimi K2.5 (one lists 2026-11-18): with one endpoint left allowed, its
    retirement or its capacity stops the run. --plan and --preflight say so beforehand."""
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 4)
    warning = "only one endpoint is allowed (Together, together)"
    r = infer(server, "--plan", prompts, "--only-provider", "together")
    assert r.code == 0 and f"warning: {warning}" in r.stdout.decode()
    r = infer(server, "--preflight", "1", prompts, "-o", tmp_path / "r.jsonl", "--json",
              "--only-provider", "together")
    assert r.code == 0, r.stdout.decode() + r.stderr
    checks = json.loads(r.stdout)["checks"]
    assert {"check": "routing", "verdict": "warn", "detail": warning + ": if it retires the model "
            "or runs out of capacity, the run stops"} in checks
    r = infer(server, "--plan", prompts)  # four allowed: no such warning
    assert "only one endpoint" not in r.stdout.decode()
