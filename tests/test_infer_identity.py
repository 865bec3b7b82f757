"""kp-infer --tokenizer: every kept answer is the target model's, by its own token counts.

Through the command line against the stand-in, which counts usage with a tokenizer as a
serving stack does (`tokenizer=`) and can serve another model under a provider's name from
its N-th answer (`impostors=`, kimipipe/standin/impostors.py). The bundled mini tokenizer
keeps each kp-infer start cheap (the real one is bench/bench_identity.py's).
"""

from __future__ import annotations

import json

import pytest
from conftest import TOKENIZER_KINDS, kp, read_jsonl, write_jsonl
from helpers import money_is_exact
from test_infer import infer, make_prompts

from kimipipe.infer.identity import PROBATION

TOKENIZER = TOKENIZER_KINDS["fast"]
SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."


def impostor_answers(server) -> set[str]:
    """The generation ids the stand-in's impostors served (its ledger marks them)."""
    return {x["generation_id"] for x in server.ledger() if x.get("impostor")}


def test_an_impostor_from_its_20th_answer_loses_no_prompt_and_none_of_it_is_kept(standin, tmp_path):
    """A provider honest for 19 answers, then another model (DeepInfra's announced redirect
    of Kimi K2.5 to K3): caught on its first wrong answer, every later answer of it refused
    (paid, counted) and its prompt answered elsewhere, quarantined once (named on stderr
    with its offset and an example); a resume, with or without --tokenizer, keeps it
    quarantined (OUTPUT.identity.json) and a run without --tokenizer warns once."""
    server = standin(tokenizer=TOKENIZER, impostors={"parasail": 20}, ledger=True,
                     request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 60)
    out, failures, summary = tmp_path / "r.jsonl", tmp_path / "f.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--failures", failures, "--summary-json", summary,
              "--tokenizer", TOKENIZER, "--only-provider", "parasail", "--only-provider", "together")
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert sorted(x["id"] for x in records) == [f"p{i:05d}" for i in range(60)]  # none lost
    impostor = impostor_answers(server)
    assert impostor and not impostor & {x["generation_id"] for x in records}  # none kept
    refused = [x for rec in records for x in rec["refused"]]
    assert {x["generation_id"] for x in refused if x["kind"] == "identity"} == impostor
    money_is_exact(server, records, read_jsonl(failures) if failures.exists() else [])
    honest = [x for x in records if x["provider"] == "Parasail"]
    assert len(honest) == 19 and all(x["identity"]["offset"] == 0 for x in honest)
    assert r.stderr.count("kp-infer: quarantined provider Parasail (parasail)") == 1
    assert "its prompt counts are typically" in r.stderr and "e.g. p" in r.stderr
    rows = {x["provider"]: x for x in json.loads(summary.read_text())["identity"]["providers"]}
    # (its streams in flight at the quarantine are cancelled, not judged: those it billed
    # all the same, having finished them, are refused on the records as "stream closed")
    cancelled_billed = sum(1 for x in refused if x["message"].startswith("stream closed after")
                           and x["generation_id"] in impostor)
    assert rows["Parasail"]["quarantined"]
    assert rows["Parasail"]["refused"] + cancelled_billed == len(impostor)
    assert not rows["Together"]["quarantined"] and rows["Together"]["offset"] == 0
    state = json.loads((tmp_path / "r.jsonl.identity.json").read_text())
    assert [q["provider"] for q in state["quarantined"]] == ["Parasail"]
    # kp-infer report shows the same from the files (the identity file beside the output)
    report = kp("infer", "report", out, "--json")
    assert report.code == 0, report.stderr
    shown = {x["provider"]: x for x in json.loads(report.stdout)["identity"]}
    assert shown["Parasail"]["quarantined"] and shown["Parasail"]["refused"] == len(impostor)
    assert shown["Together"]["checked"] == rows["Together"]["checked"] and not shown["Together"]["quarantined"]
    # resume: ten prompts more, and no --tokenizer: the quarantine holds, the warning says why
    make_prompts(prompts, 70)
    before = len(server.requests())
    r = infer(server, prompts, "-o", out, "--only-provider", "parasail", "--only-provider", "together")
    assert r.code == 0, r.stderr
    assert "Parasail stays quarantined" in r.stderr
    assert r.stderr.count("answers' identity is unchecked") == 1 and "--tokenizer DIR" in r.stderr
    sent = server.requests()[before:]
    assert len(sent) == 10 and all("parasail" in body["provider"]["ignore"] for body in sent)
    assert len(read_jsonl(out)) == 70


def test_a_constant_template_offset_shared_by_all_is_not_quarantined(standin, tmp_path):
    """Every host adds a default system prompt that the template kimipipe was given omits:
    all providers agree on one constant offset (on prompts without a system message; 0 on
    those with one), so nothing is refused or quarantined, and the summary says so with the
    prompt as kimipipe rendered it. A conversation's later turns are counted with their
    whole history, the very count kp-tokenize's input_ids then have."""
    hosts = tmp_path / "hosts-template"
    hosts.mkdir()
    for f in TOKENIZER.iterdir():
        (hosts / f.name).write_bytes(f.read_bytes())
    template = (hosts / "chat_template.jinja").read_text()
    (hosts / "chat_template.jinja").write_text(template.replace(
        "{%- for message in messages -%}",
        "{%- if messages[0]['role'] != 'system' -%}<|im_system|>system<|im_middle|>"
        f"{SYSTEM}<|im_end|>{{%- endif -%}}\n{{%- for message in messages -%}}", 1))
    server = standin(tokenizer=hosts, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 30)
    rows = read_jsonl(prompts) + [
        {"id": f"c{i}", "dataset": "B3", "messages": [{"role": "user", "content": f"Tell me {i}."}],
         "follow_ups": ["And why?", "Say it in one line."]} for i in range(6)]
    write_jsonl(prompts, rows)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--summary-json", summary, "--tokenizer", TOKENIZER)
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert len(records) == 30 + 6 * 3 and not any(rec["refused"] for rec in records)
    assert not (tmp_path / "r.jsonl.identity.json").exists() and "quarantined provider" not in r.stderr
    offsets = {rec["identity"]["offset"] for rec in records if rec["messages"][0]["role"] != "system"}
    assert len(offsets) == 1 and min(offsets) > 0  # one constant: the hosts' system prompt
    assert {rec["identity"]["offset"] for rec in records if rec["messages"][0]["role"] == "system"} == {0}
    [shared] = json.loads(summary.read_text())["identity"]["shared_offsets"]
    assert shared["prompts"] == "without a system message" and len(shared["providers"]) >= 2
    assert shared["rendered"].startswith("<|im_user|>user<|im_middle|>")
    assert "the chat template kimipipe renders with differs from theirs" in r.stderr
    # kimipipe's count is kp-tokenize's input_ids, later turns and their history included
    tokens = tmp_path / "t.jsonl"
    t = kp("tokenize", out, "--tokenizer", TOKENIZER, "-o", tokens, "--quiet")
    assert t.code == 0, t.stderr
    counted = {rec["id"]: rec["identity"]["prompt_tokens"] for rec in records}
    assert {rec["id"]: len(rec["input_ids"]) for rec in read_jsonl(tokens)} == counted
    assert any(rec["id"].endswith("#3") for rec in records)


def test_a_single_provider_that_is_off_is_reported_not_silently_kept(standin, tmp_path):
    """A provider that adds its own system prompt from its first answer: among others at 0
    it is quarantined and the others answer everything; as the only provider, kimipipe
    cannot tell it from its own template and keeps nothing of it: the run stops (exit 2,
    resumable), having paid for at most the probation's requests, not --concurrency's."""
    server = standin(tokenizer=TOKENIZER, impostors={"parasail": (1, f"system={SYSTEM}")},
                     ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 40)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out, "--tokenizer", TOKENIZER)
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert len(records) == 40  # (its answers to prompts with a system message: untouched)
    assert "kp-infer: quarantined provider Parasail" in r.stderr
    assert not impostor_answers(server) & {rec["generation_id"] for rec in records}
    # the only provider, off by a constant: reported, nothing of it kept, the run stops
    server.configure(impostors={"together": (1, f"system={SYSTEM}")})
    plain = write_jsonl(tmp_path / "plain.jsonl", [  # (no system message: each one injected)
        {"id": f"q{i}", "dataset": "B3", "messages": [{"role": "user", "content": f"Q {i}?"}]}
        for i in range(80)])
    alone, failures, summary = tmp_path / "alone.jsonl", tmp_path / "f.jsonl", tmp_path / "s.json"
    paid = len(server.ledger())
    r = infer(server, plain, "-o", alone, "--failures", failures, "--summary-json", summary,
              "--tokenizer", TOKENIZER, "--only-provider", "together", "--concurrency", "64")
    assert r.code == 2, r.stderr
    assert not alone.exists() or read_jsonl(alone) == []
    assert "quarantined provider Together" in r.stderr
    assert "stopped: no provider left that serves the target model" in r.stderr
    assert "--chat-template" in r.stderr  # (its offset is one constant: what to check)
    stopped = json.loads(summary.read_text())
    assert stopped["stop_reason"] == "identity"
    assert stopped["identity"]["quarantined"][0]["provider"] == "Together"
    lost = server.ledger()[paid:]
    assert 0 < len(lost) <= 2 * PROBATION  # not 64 in flight
    failed = read_jsonl(failures)  # every answer paid for, on a failure line: rerun resumes
    assert sum(f["cost"] for f in failed) == pytest.approx(sum(x["cost"] for x in lost), rel=1e-9)
    assert ("no other provider is left to tell whether it or the chat template differs"
            in failed[0]["refused"][0]["message"])


def test_preflight_checks_identity_per_provider(standin, tmp_path):
    """--preflight asks every allowed provider once (provider.only) and shows provider /
    offset / completion ratio / verdict; another model's answer is refused (not kept, its
    cost in --failures) and fails the preflight (exit 4); the endpoints left are named."""
    server = standin(tokenizer=TOKENIZER, impostors={"parasail": (1, f"system={SYSTEM}")},
                     ledger=True, request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 8)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, "--preflight", "1", prompts, "-o", out, "--failures", failures,
              "--tokenizer", TOKENIZER, "--json")
    assert r.code == 4, r.stderr
    report = json.loads(r.stdout)
    rows = {x["provider"]: x for x in report["identity"]}
    assert set(rows) == {"DeepInfra", "Moonshot AI", "Parasail", "Together"}
    assert rows["Parasail"]["verdict"] == "different" and rows["Parasail"]["offset"] > 0
    for name in ("DeepInfra", "Moonshot AI", "Together"):
        assert rows[name]["verdict"] == "same model and template" and rows[name]["offset"] == 0
        assert rows[name]["completion_ratio"] == 1.0
    only = [b["provider"]["only"] for b in server.requests() if "only" in b["provider"]]
    assert sorted(only) == [["deepinfra"], ["moonshotai"], ["parasail"], ["together"]]
    checks = {c["check"]: c for c in report["checks"]}
    assert checks["identity Parasail"]["verdict"] == "fail"
    assert checks["availability"]["verdict"] == "pass" and "4 endpoint(s)" in checks["availability"]["detail"]
    kept = read_jsonl(out)
    assert "Parasail" not in {x["provider"] for x in kept} and len(kept) == report["requests"] - 1
    assert [f["refused"][0]["kind"] for f in read_jsonl(failures)] == ["identity"]
    text = infer(server, "--preflight", "1", prompts, "-o", out, "--tokenizer", TOKENIZER,
                 "--only-provider", "together")
    assert text.code == 0, text.stderr
    shown = text.stdout.decode()
    assert "provider" in shown and "compl ratio" in shown and "same model and template" in shown
    assert "1 endpoint(s) of moonshotai/kimi-k2.5 left" in shown and "docs/real-run.md" in shown


def test_a_tokenizer_that_does_not_load_is_exit_2_before_any_request(standin, tmp_path):
    """No such directory, a tokenizer.json that does not parse, a tokenizer without a chat
    template: exit 2, one line naming it, and no completion sent (run and preflight)."""
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer_config.json").write_text(
        (TOKENIZER / "tokenizer_config.json").read_text())
    (broken / "tokenizer.json").write_text("{not json")
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).write_bytes((TOKENIZER / name).read_bytes())
    for directory, said in ((tmp_path / "nowhere", "no such directory"),
                            (broken, "cannot load the tokenizer"),
                            (bare, "has no chat template")):
        for extra in ((), ("--preflight", "1")):
            r = infer(server, prompts, "-o", tmp_path / "r.jsonl", "--tokenizer", directory, *extra)
            assert r.code == 2, r.stderr
            assert said in r.stderr and "Traceback" not in r.stderr
    assert server.stats()["requests"] == 0
