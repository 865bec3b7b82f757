"""kp-infer --tokenizer: the identity check held to the model owner's standard.

Moonshot's Kimi Vendor Verifier accepts a vendor's usage.prompt_tokens from the expected
count to three above it (MAX_PROMPT_TOKEN_OVERCOUNT = 3): honest stacks overcount a little.
kp-infer takes an answer inside that band as the target's (recorded/identity_table.py
VENDOR_BAND, infer/identity.py), and still refuses what is another model: another tokenizer,
an injected default system prompt, a provider that switches mid-run, an undercount.

Through the command line against the stand-in, which counts usage with a tokenizer as a
serving stack does, overcounts per provider as an honest stack may (`usage_offsets=`,
`--usage-offset PROVIDER=N`) and serves another model from a provider's N-th answer
(`impostors=`). The bundled mini tokenizer keeps each start cheap; the +18 of an injected
system prompt is measured on Kimi K2.5's real vocabulary (`real_tokenizer`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from conftest import TOKENIZER_KINDS, kp, read_jsonl, write_jsonl
from test_infer import infer, make_prompts

from kimipipe.infer.identity import PROBATION, TRIAL, IdentityJudge
from kimipipe.infer.identity_votes import ACCEPT, OFF
from kimipipe.openrouter.attempt import Attempt
from kimipipe.openrouter.routing import Endpoint, Policy
from kimipipe.recorded.identity_table import VENDOR_BAND
from kimipipe.records import Message

TOKENIZER = TOKENIZER_KINDS["fast"]
# Kimi K2-Instruct's default system prompt, the one a host's template may add
SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."
HONEST = {"moonshotai": 0, "together": 1, "deepinfra": 2, "parasail": 3}
FIVE = ("--quantization", "int4", "--quantization", "unknown", "--quantization", "nvfp4")


def impostor_answers(server) -> set[str]:
    return {x["generation_id"] for x in server.ledger() if x.get("impostor")}


def by_provider(summary) -> dict:
    return {x["provider"]: x for x in json.loads(summary.read_text())["identity"]["providers"]}


def test_the_band_is_the_vendor_verifiers():
    """0 to +3 inclusive: MAX_PROMPT_TOKEN_OVERCOUNT = 3, no undercount."""
    assert list(VENDOR_BAND) == [0, 1, 2, 3]


def test_honest_providers_inside_the_band_are_never_refused(standin, tmp_path):
    """The issue's run: four honest providers at +0, +1, +2, +3 and one that turns into
    another model after 20 answers, 600 prompts at --concurrency 40: no honest answer
    refused, no honest provider quarantined, the impostor caught and none of its answers
    kept; the summary says where each offset lies against the tolerance."""
    server = standin(tokenizer=TOKENIZER, usage_offsets=HONEST, impostors={"fireworks": 20},
                     ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 600)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--summary-json", summary, "--tokenizer", TOKENIZER,
              "--concurrency", "40", *FIVE)
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert len(records) == 600
    impostor = impostor_answers(server)
    assert impostor and not impostor & {rec["generation_id"] for rec in records}
    refused = [x for rec in records for x in rec["refused"]]
    assert {x["generation_id"] for x in refused} == impostor  # no honest answer refused
    expected = {"Moonshot AI": 0, "Together": 1, "DeepInfra": 2, "Parasail": 3,
                "Fireworks": 0}  # (the impostor's first 19 answers: honest, kept)
    assert {rec["provider"]: rec["identity"]["offset"] for rec in records} == expected
    del expected["Fireworks"]
    rows = by_provider(summary)
    for name, offset in expected.items():
        assert not rows[name]["quarantined"] and rows[name]["refused"] == 0
        assert rows[name]["band"] == f"{offset:+d}: inside the vendor verifier's tolerance"
    assert rows["Fireworks"]["quarantined"]
    assert r.stderr.count("kp-infer: quarantined provider") == 1
    assert "+2: inside the vendor verifier's tolerance" in r.stderr  # (the summary's table)
    report = kp("infer", "report", out, "--json")  # (the same from the files)
    assert report.code == 0, report.stderr
    shown = {x["provider"]: x["band"] for x in json.loads(report.stdout)["identity"]}
    assert shown["Parasail"] == "+3: inside the vendor verifier's tolerance"


def test_an_undercount_and_another_tokenizer_stay_caught(standin, tmp_path):
    """Among honest providers inside the band: one that counts one token fewer (the
    verifier accepts no undercount) and one with another tokenizer from its first answer
    (offsets that vary with the prompt) are quarantined, none of their answers kept."""
    server = standin(tokenizer=TOKENIZER, usage_offsets={"moonshotai": 2, "parasail": -1},
                     impostors={"together": 1}, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 120)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--summary-json", summary, "--tokenizer", TOKENIZER,
              "--concurrency", "8")
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert len(records) == 120
    assert {rec["provider"] for rec in records} == {"Moonshot AI", "DeepInfra"}
    rows = by_provider(summary)
    assert rows["Parasail"]["quarantined"] and rows["Parasail"]["refused_offset"] == -1
    # (its offsets vary with the prompt; the few answers judged before its quarantine,
    # its streams in flight then cancelled, may happen to share one: seen, -20 three times)
    assert rows["Together"]["quarantined"] and rows["Together"]["offsets"]
    assert not rows["Moonshot AI"]["quarantined"] and rows["Moonshot AI"]["refused"] == 0
    messages = [x["message"] for rec in records for x in rec["refused"] if x["provider"] == "Parasail"]
    assert messages and "an undercount, which the vendor verifier accepts from no host" in messages[0]
    varied = [x for rec in records for x in rec["refused"] if x["provider"] == "Together"]
    assert varied and {x["kind"] for x in varied} == {"identity"}
    assert not {x.get("offset") for x in varied} & set(range(4))  # (a cancelled one has none)


def test_an_injected_system_prompt_is_18_tokens_outside_the_band(standin, tmp_path, real_tokenizer):
    """On Kimi K2.5's real vocabulary, K2-Instruct's default system prompt injected by one
    host is +18: outside the band, refused and quarantined among honest hosts that
    overcount by +1 and +3."""
    server = standin(tokenizer=real_tokenizer, usage_offsets={"together": 1, "deepinfra": 3},
                     impostors={"parasail": (1, f"system={SYSTEM}")}, ledger=True)
    plain = write_jsonl(tmp_path / "p.jsonl", [
        {"id": f"q{i}", "dataset": "B3", "messages": [{"role": "user", "content": f"Q {i}?"}]}
        for i in range(60)])
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = infer(server, plain, "-o", out, "--summary-json", summary, "--tokenizer", real_tokenizer,
              "--trust-remote-code", "--concurrency", "8")
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert len(records) == 60 and "Parasail" not in {rec["provider"] for rec in records}
    rows = by_provider(summary)
    assert rows["Parasail"]["quarantined"] and rows["Parasail"]["refused_offset"] == 18
    assert rows["Parasail"]["band"] == "+18: outside the vendor verifier's tolerance"
    assert not rows["Together"]["refused"] and not rows["DeepInfra"]["refused"]


def test_a_shared_constant_outside_the_band_keeps_todays_rule(standin, tmp_path):
    """Three hosts at +7 (a default system prompt kimipipe's template omits): the shared
    constant, accepted and said as today; a fourth at +1 is inside the band: kept too."""
    server = standin(tokenizer=TOKENIZER, usage_offsets={"moonshotai": 7, "together": 7,
                                                         "deepinfra": 7, "parasail": 1})
    prompts = make_prompts(tmp_path / "p.jsonl", 80)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--summary-json", summary, "--tokenizer", TOKENIZER,
              "--concurrency", "8")
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert len(records) == 80 and not any(rec["refused"] for rec in records)
    assert "quarantined provider" not in r.stderr
    assert "count prompts" in r.stderr and "+7 tokens from kimipipe's rendering" in r.stderr
    shared = json.loads(summary.read_text())["identity"]["shared_offsets"]
    assert {s["offset"] for s in shared} == {7}
    assert by_provider(summary)["Parasail"]["offset"] == 1
    # two at +7 against two inside the band: a tie makes no shared constant (as against
    # two at 0 today): the two at +7 are refused and quarantined, the band's kept
    server.configure(usage_offsets={"moonshotai": 7, "together": 7, "deepinfra": 1,
                                    "parasail": 2})
    out, summary = tmp_path / "tie.jsonl", tmp_path / "tie.json"
    r = infer(server, prompts, "-o", out, "--summary-json", summary, "--tokenizer", TOKENIZER,
              "--concurrency", "8")
    assert r.code == 0, r.stderr
    assert {rec["provider"] for rec in read_jsonl(out)} == {"DeepInfra", "Parasail"}
    rows = by_provider(summary)
    assert rows["Moonshot AI"]["quarantined"] and rows["Together"]["quarantined"]
    assert not rows["DeepInfra"]["refused"] and not rows["Parasail"]["refused"]


def test_a_provider_new_to_the_run_gets_a_small_share_until_trusted(standin, tmp_path):
    """Fireworks (the cheapest: the largest share of OpenRouter's price-weighted routing)
    serves another model from its first answer, at --concurrency 200, with 40 strikes
    before a quarantine (so that it outlives the probation's 16 in flight): once the
    probation is over at most TRIAL requests in flight may reach a provider not trusted
    yet, so it is paid for at most its strikes' answers and the trial's (the run may end
    before it reaches its strikes), not its share of 200 in flight (~70, over 100 answers
    before a quarantine); the honest providers answer everything."""
    server = standin(tokenizer=TOKENIZER, usage_offsets=HONEST, impostors={"fireworks": 1},
                     latency=0.5, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 600)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--summary-json", summary, "--tokenizer", TOKENIZER,
              "--concurrency", "200", "--no-stream", "--identity-strikes", "40", *FIVE)
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert len(records) == 600 and {rec["provider"] for rec in records} == {
        "Moonshot AI", "Together", "DeepInfra", "Parasail"}
    paid = impostor_answers(server)
    assert 0 < len(paid) <= 40 + TRIAL + PROBATION
    assert by_provider(summary)["Fireworks"]["refused"] == len(paid)


def test_preflight_shows_each_offset_against_the_band(standin, tmp_path):
    """--preflight: a provider at +2 passes, its verdict "+2: inside the vendor verifier's
    tolerance"; one at +5 alone is different (exit 4)."""
    server = standin(tokenizer=TOKENIZER, usage_offsets={"together": 1, "deepinfra": 2})
    prompts = make_prompts(tmp_path / "p.jsonl", 8)
    r = infer(server, "--preflight", "1", prompts, "-o", tmp_path / "r.jsonl", "--tokenizer",
              TOKENIZER, "--json")
    assert r.code == 0, r.stderr
    report = json.loads(r.stdout)
    rows = {x["provider"]: x for x in report["identity"]}
    assert rows["DeepInfra"]["verdict"] == "+2: inside the vendor verifier's tolerance"
    assert rows["Together"]["band"] == ["+1: inside the vendor verifier's tolerance"]
    assert rows["Moonshot AI"]["verdict"] == "same model and template"
    checks = {c["check"]: c["verdict"] for c in report["checks"]}
    assert checks["identity DeepInfra"] == checks["identity Together"] == "pass"
    server.configure(usage_offsets={"deepinfra": 5})
    text = infer(server, "--preflight", "1", prompts, "-o", tmp_path / "r2.jsonl",
                 "--tokenizer", TOKENIZER)
    assert text.code == 4, text.stderr
    shown = text.stdout.decode()
    assert "different" in shown and "tolerance, 0..+3" in shown


# -- the judge's rule on one provider's answers (the command's runs above hold the rest) --
class _Counts:
    """kimipipe's count of a prompt: its number of characters (any fixed rule will do)."""

    @staticmethod
    def prompt_tokens(messages) -> int:
        return sum(len(m.content) for m in messages)

    @staticmethod
    def completion_tokens(reasoning, content, truncated) -> int:
        return len(content)


def _answer(provider: str, prompt_tokens: int) -> Attempt:
    return Attempt("ok", provider=provider, prompt_tokens=prompt_tokens, completion_tokens=4,
                   content="four", usage_seen=True, finish_reason="stop")


def test_an_answer_inside_the_band_by_chance_after_refusals_is_refused():
    """Another tokenizer whose count lands inside the band on one prompt, after answers of
    it were refused at varying offsets, is not taken for the target's; an honest provider's
    band answers are, at each of 0..+3, and one below the band is not."""
    async def judged():
        judge = IdentityJudge(_Counts(), Policy(), None, strikes=99, wait=0.0)
        prompt = [Message(role="user", content="x" * 40)]
        verdicts = {}
        for offset in (0, 1, 2, 3):
            verdicts[offset] = judge.check(f"h{offset}", prompt, 40, _answer("Honest", 40 + offset)).verdict
        first = judge.check("o1", prompt, 40, _answer("Other", 40 + 9))
        if first.verdict != OFF:
            await judge.settle(first, asyncio.Event())
        second = judge.check("o2", prompt, 40, _answer("Other", 40 - 6))
        chance = judge.check("o3", prompt, 40, _answer("Other", 40 + 2))
        under = judge.check("u1", prompt, 40, _answer("Under", 40 - 1))
        if under.verdict != OFF:
            await judge.settle(under, asyncio.Event())
        return verdicts, first, second, chance, under

    verdicts, first, second, chance, under = asyncio.run(judged())
    assert verdicts == {0: ACCEPT, 1: ACCEPT, 2: ACCEPT, 3: ACCEPT}
    assert first.verdict == second.verdict == OFF
    assert chance.verdict == OFF and "inside the vendor verifier's tolerance by chance" in chance.why
    assert under.verdict == OFF


@pytest.mark.parametrize("spec", ["parasail=x", "parasail", "nowhere=2"])
def test_a_bad_usage_offset_is_one_clear_line(spec):
    """The stand-in's --usage-offset: PROVIDER=N with N an integer and a provider it lists."""
    proc = subprocess.run([sys.executable, "-m", "kimipipe.standin", "--usage-offset", spec],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--usage-offset" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_route_gives_a_provider_not_trusted_a_small_share():
    """Nothing trusted: every attempt routed as the prompt is (the probation bounds the
    run). Once Together is trusted: TRIAL attempts in flight may reach Parasail, the rest
    ignore it until a trial comes back; Parasail accepted: all trusted; Together refused
    (it switched): on trial again."""
    endpoints = [Endpoint(provider_name="Together", tag="together"),
                 Endpoint(provider_name="Parasail", tag="parasail")]
    policy = Policy()
    judge = IdentityJudge(_Counts(), policy, endpoints, strikes=99, wait=0.0)
    prompt = [Message(role="user", content="x" * 40)]
    assert judge.route(policy) == (policy, False) and judge.on_probation
    assert judge.check("a", prompt, 40, _answer("Together", 41)).verdict == ACCEPT
    trials = [judge.route(policy) for _ in range(TRIAL)]
    assert all(routed is policy and on_trial for routed, on_trial in trials)
    narrowed, on_trial = judge.route(policy)
    assert not on_trial and narrowed.ignore == ["parasail"]
    judge.on_trial -= 1  # (as `routed` does when an attempt on trial comes back)
    assert judge.route(policy) == (policy, True)  # (room for one more)
    assert judge.on_probation  # (Parasail not trusted yet)
    assert judge.check("b", prompt, 40, _answer("Parasail", 40)).verdict == ACCEPT
    assert judge.route(policy) == (policy, False) and not judge.on_probation
    switched = judge.check("c", prompt, 40, _answer("Together", 40 + 30))
    assert switched.verdict == OFF and "it serves another model now" in switched.why
    judge.on_trial = 0
    assert judge.route(policy) == (policy, True)
    assert all(judge.route(policy)[1] for _ in range(TRIAL - 1))
    assert judge.route(policy)[0].ignore == ["together"]


def test_routed_counts_a_trial_back_however_its_attempt_ends():
    """`routed` sends each attempt with `route`'s policy, and an attempt on trial frees its
    place when it comes back, answered or raising (a cancel)."""
    endpoints = [Endpoint(provider_name="Together", tag="together"),
                 Endpoint(provider_name="Parasail", tag="parasail")]
    policy = Policy()
    judge = IdentityJudge(_Counts(), policy, endpoints, strikes=99, wait=0.0)
    judge.check("a", [Message(role="user", content="x")], 1, _answer("Together", 1))
    sent = []

    async def send(routed):
        sent.append(routed.ignore)
        return _answer("Together", 1)

    async def cancelled(routed):
        raise asyncio.CancelledError

    async def attempts():
        for _ in range(3 * TRIAL):
            await judge.routed(policy, send)
        with pytest.raises(asyncio.CancelledError):
            await judge.routed(policy, cancelled)

    asyncio.run(attempts())
    assert sent == [[]] * (3 * TRIAL) and judge.on_trial == 0
