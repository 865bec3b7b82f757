"""kp-infer samples as the model is served (docs/kp-infer.md): Kimi's presets, user flags over
them, provider.require_parameters against a provider that drops sampling, nothing invented
for an unknown model; each record's `sampling` says how. Through the command line against
the stand-in."""

from __future__ import annotations

import pytest
from conftest import read_jsonl
from helpers import MODEL
from test_infer import infer, make_prompts

from kimipipe.standin.answers import PROVIDER_OWN_SAMPLING, expected_answer

THINKING = {"temperature": 1.0, "top_p": 0.95}


INSTANT = {"temperature": 0.6, "top_p": 0.95}


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

