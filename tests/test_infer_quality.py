"""What kp-infer buys is what a drafter needs (issue 14): answers sampled as the model is
served, routed only where distillation is allowed, with their reasoning verified, compared
provider by provider (`kp-infer report`), and a preflight before the money goes. Each rule
through the command line against the stand-in, with its provider quirks: a provider that
ignores temperature/top_p, one that drops the reasoning, one that puts it inline, and a
model whose authors forbid distillation."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import zstandard
from conftest import kp, read_jsonl
from helpers import MODEL
from test_infer import infer, make_prompts

from kimipipe.standin.answers import PROVIDER_OWN_SAMPLING, expected_answer

THINKING = {"temperature": 1.0, "top_p": 0.95}
INSTANT = {"temperature": 0.6, "top_p": 0.95}


def by_user_text(server) -> dict[str, dict]:
    """The stand-in's ledger lines by the sha256 of their prompt's user text."""
    return {line["request_user_text_sha256"]: line for line in server.ledger()}


# --- 1. sampled as served ---------------------------------------------------------------

@pytest.mark.parametrize("mode, sampling, reasoning", [
    ((), THINKING, {"enabled": True}),
    (("--no-reasoning",), INSTANT, {"enabled": False}),
], ids=["thinking", "instant"])
def test_kimi_is_sampled_as_served_and_each_record_says_how(standin, tmp_path, mode, sampling,
                                                            reasoning):
    server = standin(request_log=True, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 12)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out, "--max-tokens", "3000", *mode)
    assert r.code == 0, r.stderr
    for body in server.requests():
        assert {k: body[k] for k in ("temperature", "top_p")} == sampling
        assert body["reasoning"] == reasoning
        assert body["provider"]["require_parameters"] is True
        assert "seed" not in body
    records = read_jsonl(out)
    assert len(records) == 12
    for rec in records:
        assert rec["sampling"] == {"max_tokens": 3000, **sampling, "reasoning": reasoning,
                                   "require_parameters": True}
    # the provider applied exactly that (the stand-in's ledger), and the answers are the
    # model's as served: the same as an answer to a request that sent nothing
    assert all(line["sampling"] == sampling and line["sampling_dropped"] == []
               for line in server.ledger())
    prompts_by_id = {p["id"]: p for p in read_jsonl(prompts)}
    for rec in records:
        want = expected_answer(prompts_by_id[rec["id"]]["messages"], model=MODEL, seed=None,
                               reasoning=not mode, max_tokens=3000)
        assert (rec["response"]["content"], rec["response"]["reasoning"]) == (want.content,
                                                                              want.reasoning)


def test_kimi_k26_has_its_own_preset_sampled_and_routed_as_k25(standin, tmp_path):
    """K2.6, K2.5's successor: the same native INT4 routing default and the same sampling
    as served (top_p fixed at 0.95; temperature 1.0 thinking, 0.6 instant)."""
    from kimipipe.openrouter.models import preset_for

    assert preset_for("moonshotai/kimi-k2.6") is not None
    server = standin(request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 4)
    for mode, sampling, reasoning in (((), THINKING, {"enabled": True}),
                                      (("--no-reasoning",), INSTANT, {"enabled": False})):
        out = tmp_path / f"r{len(mode)}.jsonl"
        r = infer(server, prompts, "-o", out, "-m", "moonshotai/kimi-k2.6", *mode)
        assert r.code == 0, r.stderr
        records = read_jsonl(out)
        assert len(records) == 4 and {x["model"] for x in records} == {"moonshotai/kimi-k2.6"}
        assert all(x["sampling"]["reasoning"] == reasoning for x in records)
        assert all({k: x["sampling"][k] for k in ("temperature", "top_p")} == sampling
                   for x in records)
    bodies = server.requests()
    assert len(bodies) == 8 and {b["model"] for b in bodies} == {"moonshotai/kimi-k2.6"}
    assert all(b["provider"]["quantizations"] == ["int4", "unknown"] for b in bodies)
    assert all(b["provider"]["require_parameters"] is True for b in bodies)
    assert [(b["temperature"], b["top_p"]) for b in bodies] == [(1.0, 0.95)] * 4 + [(0.6, 0.95)] * 4


def test_user_flags_win_over_the_preset(standin, tmp_path):
    server = standin(request_log=True, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 6)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out, "--temperature", "0.3", "--seed", "5",
              "--max-tokens", "2000")
    assert r.code == 0, r.stderr
    for body in server.requests():
        assert (body["temperature"], body["top_p"], body["seed"]) == (0.3, 0.95, 5)
    prompts_by_id = {p["id"]: p for p in read_jsonl(prompts)}
    for rec in read_jsonl(out):
        assert rec["sampling"] == {"max_tokens": 2000, "temperature": 0.3, "top_p": 0.95,
                                   "seed": 5, "reasoning": {"enabled": True},
                                   "require_parameters": True}
        want = expected_answer(prompts_by_id[rec["id"]]["messages"], model=MODEL, seed=5,
                               reasoning=True, max_tokens=2000, temperature=0.3, top_p=0.95)
        assert rec["response"]["content"] == want.content  # sampled at 0.3, observably
    assert {line["sampling"]["temperature"] for line in server.ledger()} == {0.3}
    # --extra-body is what is sent, so it is what the record says
    out2 = tmp_path / "r2.jsonl"
    r = infer(server, prompts, "-o", out2, "--extra-body", '{"top_p": 0.8, "top_k": 40}')
    assert r.code == 0, r.stderr
    assert all(rec["sampling"]["top_p"] == 0.8 and rec["sampling"]["top_k"] == 40
               for rec in read_jsonl(out2))
    r = infer(server, prompts, "-o", tmp_path / "r3.jsonl", "--extra-body", '{"temperature": "hot"}')
    assert r.code == 2 and "--extra-body" in r.stderr and "temperature" in r.stderr
    assert not (tmp_path / "r3.jsonl").exists()


def test_require_parameters_keeps_a_provider_that_drops_sampling_out(standin, tmp_path):
    """Together ignores temperature/top_p in this stand-in: with require_parameters (the
    default) it never serves and nothing is dropped; with --no-require-parameters it
    serves, samples at its own values, and the answers differ from the model's."""
    server = standin(ignore_sampling=["together"], ledger=True, request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 40)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out, "--concurrency", "8")
    assert r.code == 0, r.stderr
    served = {line["provider"] for line in server.ledger()}
    assert "Together" not in served and len(served) >= 2
    assert all(line["sampling_dropped"] == [] for line in server.ledger())
    r = infer(server, prompts, "--plan")
    together = next(x for x in r.stdout.decode().splitlines() if x.lstrip().startswith("Together"))
    assert together.rstrip().endswith("does not support temperature, top_p (require_parameters)")

    loose = tmp_path / "loose.jsonl"
    before = len(server.ledger())
    r = infer(server, prompts, "-o", loose, "--no-require-parameters", "--only-provider", "together")
    assert r.code == 0, r.stderr
    assert all("require_parameters" not in body["provider"] for body in server.requests()[before:])
    lines = server.ledger()[before:]
    assert lines and all(line["sampling"] == PROVIDER_OWN_SAMPLING
                         and line["sampling_dropped"] == ["temperature", "top_p"] for line in lines)
    prompts_by_id = {p["id"]: p for p in read_jsonl(prompts)}
    for rec in read_jsonl(loose):
        assert "require_parameters" not in rec["sampling"]  # the record says it was not enforced
        as_served = expected_answer(prompts_by_id[rec["id"]]["messages"], model=MODEL, seed=None,
                                    reasoning=True, max_tokens=16384)
        assert rec["response"]["content"] != as_served.content


def test_an_unknown_model_gets_no_invented_sampling(standin, tmp_path):
    server = standin(request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    out = tmp_path / "r.jsonl"
    flags = ("--model", "moonshotai/kimi-k2-0905", "--any-quantization")
    r = infer(server, prompts, "-o", out, *flags)
    assert r.code == 0, r.stderr
    for body in server.requests():
        assert not {"temperature", "top_p", "reasoning"} & set(body)
        assert "require_parameters" not in body["provider"]
    assert all(rec["sampling"] == {"max_tokens": 16384} for rec in read_jsonl(out))
    r = infer(server, prompts, "--plan", *flags)
    assert r.code == 0, r.stderr
    assert ("sampling: no preset for moonshotai/kimi-k2-0905: no default is invented; nothing "
            "sent, each provider samples at its own defaults") in r.stdout.decode()
    r = infer(server, prompts, "--plan")
    assert "sampling: temperature 1.0, top_p 0.95 (moonshotai/kimi-k2.5 as served in thinking " \
           "mode)" in r.stdout.decode()
    r = infer(server, prompts, "--plan", "--no-reasoning", "--temperature", "0.5")
    assert ("sampling: temperature 0.5, top_p 0.95 (moonshotai/kimi-k2.5 as served in instant "
            "mode; set by you: temperature)") in r.stdout.decode()
    r = infer(server, prompts, "--plan", "--no-require-parameters")
    assert "warning: without provider.require_parameters" in r.stdout.decode()



# --- 2. distillation-permitted routing ----------------------------------------------------

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


# --- 3. reasoning verified, like routing ------------------------------------------------

def money_is_exact(server, records, failures=()):
    """Every answer billed is in a record (kept or refused before it) or a failure line."""
    billed = {x["generation_id"]: x["cost"] for x in server.ledger()}
    kept = {r["generation_id"]: r["usage"]["cost"] for r in records}
    refused = {x["generation_id"]: x["cost"] for r in [*records, *failures] for x in r["refused"]}
    assert not set(kept) & set(refused)
    assert {**kept, **refused} == pytest.approx(billed, rel=1e-12)
    assert sum(f["cost"] for f in failures) == pytest.approx(
        sum(x["cost"] for f in failures for x in f["refused"]), rel=1e-12)


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


# --- 4. providers compared: the summary's table and `kp-infer report` ----------------------

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
    assert r.code in (0, 4), r.stderr
    records = read_jsonl(out)
    failed = read_jsonl(failures) if failures.exists() else []
    s = json.loads(summary.read_text())
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
                                  for k in ("routing_violation", "no_reasoning", "think_marker")}
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


# --- 5. the preflight ----------------------------------------------------------------------

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


# --- issue 18 item 6: an unknown provider slug -------------------------------------------

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
