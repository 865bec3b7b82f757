"""Identity claims (docs/kp-infer.md "Identity", infer/identity.py) that a broken copy of the
code once passed the suite with (issue 51's mutation sample): each test here fails when its
claim is broken.

Through the command line against the stand-in (`impostors=` serves another rendering under
a provider's name, `tokenizer=` counts usage as a serving stack does), except the vote on a
shared offset, which needs answers in an order a run does not promise: there the judge
(infer/identity.py IdentityJudge) is fed answers directly, counted with the real bundled
tokenizer. The offsets used are far outside the small band a host's count may differ by
(an injected system prompt is tens of tokens; the judge's are +18).
"""

from __future__ import annotations

import json

from conftest import TOKENIZER_KINDS, read_jsonl, write_jsonl
from test_infer import infer

TOKENIZER = TOKENIZER_KINDS["fast"]
SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."
UNRENDERABLE = "UNRENDERABLE"


def plain_prompts(path, n: int, prefix: str = "q"):
    """N prompts without a system message (each one an impostor's system= injects into)."""
    return write_jsonl(path, [
        {"id": f"{prefix}{i:03d}", "dataset": "B3",
         "messages": [{"role": "user", "content": f"Question {i}: why?"}]} for i in range(n)])


def test_a_provider_is_quarantined_after_exactly_identity_strikes_refused_answers(standin, tmp_path):
    """--identity-strikes 2 reaches the run, and the quarantine comes at the second refused
    answer, not the first nor the third: the identity file and stderr say 2 of 2."""
    server = standin(tokenizer=TOKENIZER, impostors={"parasail": (1, f"system={SYSTEM}")})
    prompts = plain_prompts(tmp_path / "p.jsonl", 40)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out, "--tokenizer", TOKENIZER, "--identity-strikes", "2",
              "--only-provider", "parasail", "--only-provider", "together")
    assert r.code == 0, r.stderr
    assert len(read_jsonl(out)) == 40
    [quarantined] = json.loads((tmp_path / "r.jsonl.identity.json").read_text())["quarantined"]
    assert quarantined["provider"] == "Parasail" and quarantined["refused"] == 2
    assert "2 answers refused for identity (--identity-strikes 2)" in r.stderr


def hosts_template(tmp_path, raising: bool):
    """The bundled template as every host renders it (a default system prompt first where a
    conversation has none); RAISING: one that refuses to render a prompt holding
    UNRENDERABLE, as a template's raise_exception does."""
    template = (TOKENIZER / "chat_template.jinja").read_text()
    head = ("{%- if messages[0]['role'] != 'system' -%}<|im_system|>system<|im_middle|>"
            f"{SYSTEM}<|im_end|>{{%- endif -%}}\n")
    if raising:
        head = ("{%- if messages[-1]['content'] is string and '" + UNRENDERABLE + "' in "
                "messages[-1]['content'] -%}{{- raise_exception('cannot render this') -}}"
                "{%- endif -%}\n" + head)
    return template.replace("{%- for message in messages -%}",
                            head + "{%- for message in messages -%}", 1)


def test_chat_template_reaches_the_run_and_a_prompt_it_cannot_render_is_kept_unchecked(
        standin, tmp_path):
    """The only provider renders with a default system prompt the bundled template omits:
    given that template (--chat-template), kimipipe counts as the host does (offset 0,
    nothing refused, nothing quarantined); a prompt the given template cannot render is
    answered and kept, its identity unchecked (no offset), not refused: a prompt counted
    ahead in a batch, and a conversation's later turn, counted at its answer."""
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    for f in TOKENIZER.iterdir():
        (hosts / f.name).write_bytes(f.read_bytes())
    (hosts / "chat_template.jinja").write_text(hosts_template(tmp_path, raising=False))
    given = tmp_path / "given.jinja"
    given.write_text(hosts_template(tmp_path, raising=True))
    server = standin(tokenizer=hosts)
    prompts = plain_prompts(tmp_path / "p.jsonl", 12)
    rows = read_jsonl(prompts) + [
        {"id": "odd", "dataset": "B3", "messages": [
            {"role": "user", "content": f"Say {UNRENDERABLE} back."}]},
        # a conversation's later turn is counted at its answer, not ahead in a batch
        {"id": "conv", "dataset": "B3", "messages": [{"role": "user", "content": "Hi there?"}],
         "follow_ups": [f"Now say {UNRENDERABLE}."]}]
    write_jsonl(prompts, rows)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out, "--tokenizer", TOKENIZER, "--chat-template", given,
              "--only-provider", "together", "--concurrency", "4")
    assert r.code == 0, r.stderr
    records = {rec["id"]: rec for rec in read_jsonl(out)}
    assert set(records) == {"odd", "conv#1", "conv#2", *(f"q{i:03d}" for i in range(12))}
    assert not any(rec["refused"] for rec in records.values())
    assert "quarantined provider" not in r.stderr
    assert {records[f"q{i:03d}"]["identity"]["offset"] for i in range(12)} == {0}
    assert records["conv#1"]["identity"]["offset"] == 0
    for kept_unchecked in ("odd", "conv#2"):
        assert records[kept_unchecked]["identity"].get("offset") is None


def test_preflight_calls_a_constant_offset_only_one_provider_shows_different(standin, tmp_path):
    """--preflight asks each provider once: Parasail, injecting a system prompt, is the only
    one asked a prompt without a system message (the others' are with one), so its constant
    offset is one no other provider shows: "different", and the preflight fails (exit 4)."""
    server = standin(tokenizer=TOKENIZER, impostors={"parasail": (1, f"system={SYSTEM}")})
    # the N prompt, then one per provider in name order: DeepInfra, Moonshot AI, Parasail, Together
    with_system = [{"role": "system", "content": "Be brief."}]
    rows = [{"id": f"p{i}", "dataset": "B3",
             "messages": (with_system if i != 3 else []) + [{"role": "user", "content": f"Q {i}?"}]}
            for i in range(5)]
    prompts = write_jsonl(tmp_path / "p.jsonl", rows)
    r = infer(server, "--preflight", "1", prompts, "-o", tmp_path / "r.jsonl",
              "--failures", tmp_path / "f.jsonl", "--tokenizer", TOKENIZER, "--json")
    report = json.loads(r.stdout)
    rows = {x["provider"]: x for x in report["identity"]}
    assert rows["Parasail"]["answers"] == ["p3"] and rows["Parasail"]["offset"] > 3
    assert rows["Parasail"]["verdict"] == "different"
    assert r.code == 4, r.stderr


def judge_and_answer(strikes: int = 100):
    """An IdentityJudge counting with the bundled tokenizer, and ANSWER(provider, offset, k):
    the check of that provider's answer to prompt k, counted OFFSET from kimipipe's count."""
    from kimipipe.infer.identity import IdentityJudge
    from kimipipe.openrouter.attempt import Attempt, AttemptKind
    from kimipipe.openrouter.routing import Policy
    from kimipipe.records import Message
    from kimipipe.tokenize.counting import TargetCounts
    from kimipipe.tokenize.engine import Settings

    judge = IdentityJudge(TargetCounts(Settings(tokenizer_dir=str(TOKENIZER))), Policy(),
                          endpoints=None, strikes=strikes)

    def answer(provider: str, offset: int, k: int):
        messages = [Message(role="user", content=f"Question {k}: why?")]
        count = judge.count(messages)
        attempt = Attempt(AttemptKind.OK, content="Because.", reasoning="Think.",
                          finish_reason="stop", provider=provider, prompt_tokens=count + offset,
                          completion_tokens=4)
        return judge.check(f"p{k}", messages, count, attempt)

    return judge, answer


def test_a_provider_that_switches_is_refused_as_serving_another_model_now():
    """Answers at 0, then one at +18 (honest, then redirected): refused from that answer,
    and said as what it is, not as a tokenizer whose offsets vary."""
    from kimipipe.infer.identity_votes import ACCEPT, OFF

    _judge, answer = judge_and_answer()
    assert answer("A", 0, 1).verdict == ACCEPT and answer("B", 0, 2).verdict == ACCEPT
    assert answer("A", 0, 3).verdict == ACCEPT
    switched = answer("A", 18, 4)
    assert switched.verdict == OFF
    assert "where its earlier answers were at 0..+3: it serves another model now" in switched.why


def test_a_shared_offset_needs_more_providers_than_those_at_0(tmp_path):
    """A constant shown by as many providers as count like kimipipe (2 and 2) is not
    accepted: those answers are refused; a third provider at it makes it the shared one.
    A provider alone at a constant, none at 0, is not a majority of one. (Those "at 0" are
    those inside the vendor verifier's band, 0..+3, since the band came.)"""
    from kimipipe.infer.identity_votes import ACCEPT, OFF
    from kimipipe.recorded.identity_table import VENDOR_BAND

    judge, check = judge_and_answer()

    def answer(provider: str, offset: int, k: int) -> str:
        return check(provider, offset, k).verdict

    assert answer("A", 0, 1) == ACCEPT and answer("B", 0, 2) == ACCEPT
    assert answer("C", 18, 3) == OFF
    assert answer("D", 18, 4) == OFF  # 2 at +18, 2 at 0: a tie is not enough
    band = set(VENDOR_BAND)  # 0..+3: always the target's (the vendor verifier's tolerance)
    assert judge.votes.accepted_offsets("without a system message") == band
    assert answer("E", 18, 5) == ACCEPT  # 3 against 2: the hosts' shared constant
    assert judge.votes.accepted_offsets("without a system message") == band | {18}
    assert answer("C", 18, 6) == ACCEPT
    # and one provider alone at a constant is never the shared one (at least two)
    judge, check = judge_and_answer()
    assert answer("Z", 18, 7) == OFF and judge.votes.accepted_offsets("without a system message") == band


def test_without_a_prompt_count_only_a_far_completion_ratio_on_a_long_answer_refuses():
    """An answer whose prompt side says nothing (the template cannot render its prompt: no
    count) is judged on its completion side alone: a long answer counted three times over
    is another tokenizer (refused); counted as kimipipe counts it, or short, it is kept
    unchecked (infer/identity_votes.py)."""
    from kimipipe.infer.identity_votes import LONG_ANSWER, OFF, UNCHECKED
    from kimipipe.openrouter.attempt import Attempt, AttemptKind
    from kimipipe.records import Message

    judge, _answer = judge_and_answer()
    messages = [Message(role="user", content="Tell me a long story.")]

    def answered(content: str, factor: float, k: int):
        own = judge.counts.completion_tokens("", content, False)
        attempt = Attempt(AttemptKind.OK, content=content, finish_reason="stop", provider="A",
                          prompt_tokens=50, completion_tokens=round(own * factor))
        return own, judge.check(f"p{k}", messages, None, attempt)

    own, far = answered("once upon a time " * 200, 3.0, 1)
    assert own >= LONG_ANSWER and far.offset is None
    assert far.verdict == OFF and "another tokenizer" in far.why
    assert answered("once upon a time " * 200, 1.0, 2)[1].verdict == UNCHECKED
    own, short = answered("once upon a time", 3.0, 3)
    assert own < LONG_ANSWER and short.verdict == UNCHECKED
