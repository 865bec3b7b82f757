"""Conversations asked turn by turn (prompts with `follow_ups`), through kp-infer as a
subprocess against the stand-in on loopback.

The stand-in answers a later turn from its whole history (its hash is in the answer and
seeds it: kimipipe/standin/answers.py), so an answer proves what its request carried. The
tests rebuild each turn's history from the records alone (the prompt's messages, each
earlier turn's own answer, the next user turn) and check it against what the stand-in
received (its request log) and answered (its ledger)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
from conftest import BIN, TOKENIZER_KINDS, kp, read_jsonl, tokenize_in_process, write_jsonl
from helpers import wait_for, whole_lines
from test_infer import infer

from kimipipe.recorded.asked import answers_prompt, prompt_key
from kimipipe.records import Message
from kimipipe.standin.answers import answer_for_request, history_sha256

# Words the source's own assistant answers held: kp-prompts drops them, and no request
# may carry them (they ride on the prompt record's `meta` here, as a trap).
SOURCE_ANSWER = "SOURCE-ANSWER-GPT4"


def make_conversations(path, n, turns=3, start=0, follow_up=lambda c, k: f"follow-up {k} of {c}"):
    rows = []
    for i in range(start, start + n):
        cid = f"c{i:04d}"
        messages = [{"role": "user", "content": f"Conversation {i} opens: why? 你好"}]
        if i % 3 == 0:
            messages = [{"role": "system", "content": "Be brief."}, *messages]
        rows.append({"id": cid, "dataset": "B3", "messages": messages,
                     "follow_ups": [follow_up(cid, k) for k in range(2, turns + 1)],
                     "meta": {"source_answers": [SOURCE_ANSWER]}})
    return write_jsonl(path, rows)


def by_conversation(records):
    out: dict[str, dict[int, dict]] = {}
    for rec in records:
        out.setdefault(rec["conversation"], {})[rec["turn"]] = rec
    return out


def expected_history(prompt, turns: dict[int, dict], k: int, keep: bool = False) -> list[dict]:
    """Turn K's messages from the prompt and the earlier turns' records alone."""
    messages = [dict(m) for m in prompt["messages"]]
    for j in range(1, k):
        answer = turns[j]["response"]
        assistant = {"role": "assistant", "content": answer["content"]}
        if keep and answer.get("reasoning"):
            assistant["reasoning"] = answer["reasoning"]
        messages += [assistant, {"role": "user", "content": prompt["follow_ups"][j - 1]}]
    return messages


def assert_chained(records, prompts_path, requests, *, keep=False):
    """Each turn was asked with exactly the earlier turns' own answers, and its answer is
    the stand-in's answer to that history; every request of a conversation carries its
    session_id."""
    prompts = {p["id"]: p for p in read_jsonl(prompts_path)}
    sent = {}
    for body in requests:
        sent.setdefault(history_sha256(body["messages"]), []).append(body)
    for cid, turns in by_conversation(records).items():
        prompt = prompts[cid]
        for k, rec in turns.items():
            assert rec["id"] == f"{cid}#{k}" and rec["turns"] == 1 + len(prompt["follow_ups"])
            assert rec["history_reasoning"] == ("keep" if keep else "drop")
            history = expected_history(prompt, turns, k, keep)
            assert rec["messages"] == history
            bodies = sent[history_sha256(history)]  # the stand-in got exactly this history
            assert all(b["session_id"] == cid and b["messages"] == history for b in bodies)
            answer = answer_for_request(bodies[-1])
            assert rec["response"]["content"] == answer.content
            assert rec["response"]["reasoning"] == answer.reasoning
            assert rec["finish_reason"] == answer.finish_reason
            if k > 1:
                assert f"[h:{history_sha256(history)[:12]}]" in answer.content
    for body in requests:
        text = json.dumps(body, ensure_ascii=False)
        assert SOURCE_ANSWER not in text
        if not keep:
            assert all("reasoning" not in m for m in body["messages"])


@pytest.mark.parametrize("policy", ["drop", "keep"])
def test_each_turn_is_asked_on_the_models_own_earlier_answers(standin, tmp_path, policy):
    server = standin(request_log=True, ledger=True)
    prompts = make_conversations(tmp_path / "p.jsonl", 12, turns=3)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, "-o", out, "--concurrency", "5", "--history-reasoning", policy,
              "--summary-json", summary)
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert sorted(x["id"] for x in records) == sorted(f"c{i:04d}#{k}" for i in range(12)
                                                       for k in (1, 2, 3))
    requests = server.requests()
    assert len(requests) == 36 == len(server.ledger())
    assert_chained(records, prompts, requests, keep=policy == "keep")
    if policy == "keep":  # the earlier reasoning really went back, and changed the answers
        assert all(m.get("reasoning") for x in records if x["turn"] > 1
                   for m in x["messages"] if m["role"] == "assistant")
    s = json.loads(summary.read_text())
    assert s["conversations"] == {"turns_by_number": {"1": 12, "2": 12, "3": 12}, "done": 12,
                                  "cut": 0, "turns_not_sent": 0}
    # the stand-in's prompt cache served the history each later turn repeats
    assert s["tokens"]["cached"] == sum(x["usage"]["cached_tokens"] for x in records) > 0
    assert all(x["usage"]["cached_tokens"] > 0 for x in records if x["turn"] > 1)
    assert "conversations: 12 finished" in r.stderr and "prompt tokens cached" in r.stderr
    # the progress line's last frame: requests (turns) and conversations
    assert "kp-infer: 36/36, conversations 12 done, 0 in progress" in r.stderr
    report = json.loads(kp("infer", "report", out, "--json").stdout)
    assert report["turns"] == {"conversations": 12, "by_number": {"1": 12, "2": 12, "3": 12}}
    assert report["prompt_tokens"]["cached"] == s["tokens"]["cached"]
    assert 0 < report["prompt_tokens"]["cached_share"] < 1
    # a rerun has nothing left to send
    r = infer(server, prompts, "-o", out, "--history-reasoning", policy)
    assert r.code == 0 and len(server.requests()) == 36


def test_kill_9_mid_conversation_then_resume_asks_every_turn_once(standin, tmp_path):
    """The stand-in answers 30 turns (so some conversations are past their first) and holds
    the next window at its gate; it then lets those 6 start but answer slowly, and the kill
    lands while they are generating. They are paid for all the same (bill_cancelled: a
    provider that finishes, and bills, a generation whose client went away): the turns
    paid and not kept are exactly the 6 in flight. The resume asks every turn not kept
    once, each on the turns already in the output."""
    server = standin(ledger=True, request_log=True, bill_cancelled=True)
    server.configure(hold_after=30)
    prompts = make_conversations(tmp_path / "p.jsonl", 24, turns=3)
    out = tmp_path / "r.jsonl"
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    proc = subprocess.Popen([str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--base-url",
                             server.base_url, "--concurrency", "6", "--quiet"], env=env)
    try:
        wait_for(lambda: len(whole_lines(out)) == 30 and server.stats()["held"] == 6
                 or proc.poll() is not None, "30 turns written and the next 6 held", 60)
        assert proc.poll() is None, "the run ended before the gate"
        server.configure(latency=60.0, hold_after=36)  # the 6 start, and take their time
        wait_for(lambda: server.stats()["completions_started"] == 36, "the 6 to start", 30)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    wait_for(lambda: server.stats()["abandoned"] == 6, "the stand-in to see the 6 go", 30)
    server.configure(latency=0.0, hold_after=None)
    first = read_jsonl(out)
    assert len(first) == 30 and any(x["turn"] > 1 for x in first)
    paid_first = len(server.ledger())
    assert paid_first - len(first) == 6  # paid and not kept: the turns in flight, no more
    r = infer(server, prompts, "-o", out, "--concurrency", "6")
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    ids = [x["id"] for x in records]
    assert len(ids) == len(set(ids)) == 72
    # every turn paid once, but for the ones in flight at the kill
    assert len(server.ledger()) - len(records) == 6
    # the rerun sent only the turns not kept, each once, on the turns already in the output
    assert len(server.requests()) - 36 == 72 - len(first)
    assert_chained(records, prompts, server.requests())


def test_a_turn_cut_by_max_tokens_ends_its_conversation(standin, tmp_path):
    server = standin(request_log=True)
    prompts = make_conversations(tmp_path / "p.jsonl", 20, turns=3)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    # answers run 40-240 tokens (reasoning and content): most turns are cut at 120
    r = infer(server, prompts, "-o", out, "--max-tokens", "120", "--summary-json", summary)
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    convs = by_conversation(records)
    cut = 0
    for turns in convs.values():
        last = max(turns)
        assert sorted(turns) == list(range(1, last + 1))
        assert all(turns[k]["finish_reason"] == "stop" for k in range(1, last))
        if turns[last]["finish_reason"] == "length":
            cut += 1  # kept and marked; nothing after it was asked
        else:
            assert last == 3
    assert 0 < cut < 20
    assert len(server.requests()) == len(records)
    s = json.loads(summary.read_text())
    assert s["conversations"]["cut"] == cut
    assert s["conversations"]["done"] == 20 - cut
    assert s["conversations"]["turns_not_sent"] == sum(3 - max(t) for t in convs.values())
    assert_chained(records, prompts, server.requests())
    # a cut conversation is finished: a rerun sends nothing
    r = infer(server, prompts, "-o", out, "--max-tokens", "120")
    assert r.code == 0 and len(server.requests()) == len(records)


def test_a_failed_turn_is_retried_by_a_rerun_which_continues_the_conversation(standin, tmp_path):
    server = standin(request_log=True, moderation_marker="FLAGGED")
    # the second turn of every third conversation is refused by moderation (403: permanent)
    prompts = make_conversations(
        tmp_path / "p.jsonl", 9, turns=3,
        follow_up=lambda c, k: f"follow-up {k} of {c}" + (" FLAGGED" if k == 2 and int(c[1:]) % 3 == 0 else ""))
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--failures", failures)
    assert r.code == 4, r.stderr
    failed = read_jsonl(failures)
    assert sorted(f["id"] for f in failed) == ["c0000#2", "c0003#2", "c0006#2"]
    assert all(f["status"] == 403 for f in failed)
    convs = by_conversation(read_jsonl(out))
    assert all(sorted(convs[c]) == [1] for c in ("c0000", "c0003", "c0006"))
    assert sum(len(t) for t in convs.values()) == 3 + 6 * 3
    server.configure(moderation_marker=None)
    r = infer(server, prompts, "-o", out, "--failures", failures)
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert len(records) == 27 and len({x["id"] for x in records}) == 27
    # (the refused turn 2 was sent twice, on the same history: the rerun's is the answer)
    assert_chained(records, prompts, server.requests())


def test_a_resume_with_other_settings_is_refused_unless_allow_mixed(standin, tmp_path):
    server = standin()
    prompts = make_conversations(tmp_path / "p.jsonl", 4, turns=2)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out, "--sample", "2")
    assert r.code == 0, r.stderr
    before = out.read_bytes()
    r = infer(server, prompts, "-o", out, "--temperature", "0.5")
    assert r.code == 2
    assert "sampling.temperature 1.0" in r.stderr and "0.5" in r.stderr and "--allow-mixed" in r.stderr
    r = infer(server, prompts, "-o", out, "--history-reasoning", "keep")
    assert r.code == 2 and "history_reasoning drop" in r.stderr
    r = infer(server, prompts, "-o", out, "--seed", "7")
    assert r.code == 2 and "sampling.seed null" in r.stderr
    assert out.read_bytes() == before  # nothing sent, nothing written
    # max_tokens may change (where an answer may be cut; lowered to fit the money left)
    r = infer(server, prompts, "-o", out, "--sample", "2", "--max-tokens", "999")
    assert r.code == 0, r.stderr
    r = infer(server, prompts, "-o", out, "--temperature", "0.5", "--allow-mixed")
    assert r.code == 0, r.stderr
    assert len(read_jsonl(out)) == 8


def test_conversations_answered_as_single_prompts_are_refused_unless_allow_mixed(standin, tmp_path):
    """An output written from `--turns last` prompts holds one answer per conversation, on
    the source's history, under the conversation's own id. Resumed with the same
    conversations as `--turns all` records, those ids would be skipped as done and their
    single off-policy answers kept: exit 2 naming the file and the first id, nothing sent;
    --allow-mixed keeps them (and says so)."""
    server = standin(ledger=True)
    conversations = read_jsonl(make_conversations(tmp_path / "c.jsonl", 4, turns=2))
    last = write_jsonl(tmp_path / "last.jsonl", [
        {k: v for k, v in c.items() if k != "follow_ups"} for c in conversations])
    out = tmp_path / "r.jsonl"
    r = infer(server, last, "-o", out)
    assert r.code == 0, r.stderr
    before, billed = out.read_bytes(), len(server.ledger())
    r = infer(server, tmp_path / "c.jsonl", "-o", out)
    assert r.code == 2, r.stderr
    said = " ".join(r.stderr.split())
    assert f"{out}: 4 conversation(s)" in said and "'c0000'" in said and "--allow-mixed" in said
    assert out.read_bytes() == before and len(server.ledger()) == billed  # nothing sent
    r = infer(server, tmp_path / "c.jsonl", "-o", out, "--allow-mixed")
    assert r.code == 0 and "kept (--allow-mixed)" in r.stderr
    assert len(server.ledger()) == billed


def test_single_turn_prompts_keep_their_ids_beside_conversations(standin, tmp_path):
    server = standin(request_log=True)
    rows = read_jsonl(make_conversations(tmp_path / "c.jsonl", 2, turns=2))
    rows.append({"id": "single", "dataset": "B3", "messages": [{"role": "user", "content": "hi"}]})
    prompts = write_jsonl(tmp_path / "p.jsonl", rows)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out)
    assert r.code == 0, r.stderr
    single = [x for x in read_jsonl(out) if "conversation" not in x]
    assert [x["id"] for x in single] == ["single"] and "turn" not in single[0]
    assert [b for b in server.requests() if "session_id" not in b] == [
        b for b in server.requests() if b["messages"][-1]["content"] == "hi"]


def test_eval_split_keeps_each_conversation_on_one_side(tmp_path):
    rows = []
    for i in range(60):
        for k in (1, 2, 3):
            rows.append({"id": f"conv{i}#{k}", "dataset": "B3", "conversation": f"conv{i}",
                         "turn": k, "turns": 3, "input_ids": [1, 2, 3 + k], "output_ids": [4, 5]})
    tokens = write_jsonl(tmp_path / "t.jsonl", rows)
    r = kp("shard", tokens, "--out", tmp_path / "shards", "--eval-fraction", "0.3",
           "--format", "raw")
    assert r.code == 0, r.stderr
    side = {}
    for path in sorted((tmp_path / "shards").glob("*.jsonl.zst")):
        split = "eval" if "-eval-" in path.name else "train"
        for rec in read_jsonl(path):
            side.setdefault(rec["conversation"], set()).add(split)
    assert len(side) == 60 and all(len(s) == 1 for s in side.values())
    assert {s for sides in side.values() for s in sides} == {"train", "eval"}


def test_plan_counts_conversations_and_turns_and_grows_each_turns_prompt(standin, tmp_path):
    server = standin(price_scale=1000.0)
    prompts = make_conversations(tmp_path / "p.jsonl", 10, turns=3)
    singles = write_jsonl(tmp_path / "s.jsonl", [
        {**{k: v for k, v in row.items() if k != "follow_ups"}} for row in read_jsonl(prompts)])
    out = tmp_path / "r.jsonl"

    def plan(path, *flags):
        r = infer(server, path, "-o", out, "--plan", "--json", "--max-tokens", "1000", *flags)
        assert r.code == 0, r.stderr
        return json.loads(r.stdout)

    alone, conv = plan(singles), plan(prompts)
    assert conv["prompts"]["todo"] == 10 and conv["requests"]["todo"] == 30
    assert conv["requests"]["conversations"] == conv["requests"]["conversations_todo"] == 10
    # turns 2 and 3 carry 1 and 2 earlier answers (assumed at half of --max-tokens: 500)
    assert conv["requests"]["history_answer_tokens"] == 500
    assert not conv["requests"]["history_answer_measured"]
    assert conv["prompt_tokens"]["per_prompt"] > alone["prompt_tokens"]["per_prompt"] + 500
    assert conv["cost"]["expected"] > 3 * alone["cost"]["expected"]
    assert conv["cost"]["worst_case_request"] > alone["cost"]["worst_case_request"]
    # after a pilot, the earlier answers are counted at their measured length (content only)
    r = infer(server, prompts, "-o", out, "--sample", "2", "--max-tokens", "1000")
    assert r.code == 0, r.stderr
    measured = plan(prompts)
    assert measured["requests"]["todo"] == 24 and measured["requests"]["history_answer_measured"]
    records = read_jsonl(out)
    content = sum(x["usage"]["completion_tokens"] - x["usage"]["reasoning_tokens"] for x in records)
    assert measured["requests"]["history_answer_tokens"] == round(content / len(records), 1)


def test_preflight_keeps_a_conversations_first_turn_and_the_run_goes_on(standin, tmp_path):
    server = standin(request_log=True)
    prompts = make_conversations(tmp_path / "p.jsonl", 4, turns=2)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out, "--preflight", "2")
    assert r.code == 0, r.stderr  # every check passed
    kept = read_jsonl(out)
    assert [x["id"] for x in kept] == ["c0000#1", "c0001#1"]
    # the two first turns go at once: in either order
    assert sorted(b["session_id"] for b in server.requests()) == ["c0000", "c0001"]
    r = infer(server, prompts, "-o", out)
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert len(records) == 8
    assert_chained(records, prompts, server.requests())


@pytest.mark.parametrize("policy", ["drop", "keep"])
def test_kp_tokenize_makes_one_row_per_turn_with_the_history_as_the_template_renders_it(
        standin, tmp_path, policy):
    from transformers import AutoTokenizer

    server = standin()
    prompts = make_conversations(tmp_path / "p.jsonl", 3, turns=3)
    out, tokens = tmp_path / "r.jsonl", tmp_path / "t.jsonl"
    r = infer(server, prompts, "-o", out, "--history-reasoning", policy)
    assert r.code == 0, r.stderr
    r = tokenize_in_process(out, "--tokenizer", TOKENIZER_KINDS["fast"], "-o", tokens, "--workers", "1")
    assert r.code == 0, r.stderr
    rows = {x["id"]: x for x in read_jsonl(tokens)}
    records = {x["id"]: x for x in read_jsonl(out)}
    assert sorted(rows) == sorted(records) and len(rows) == 9
    tok = AutoTokenizer.from_pretrained(TOKENIZER_KINDS["fast"])
    for rid, row in rows.items():
        rec = records[rid]
        prompt = tok.decode(row["input_ids"])
        # each earlier turn as history: an empty think block and its content, never its
        # reasoning (K2.5's template drops it, also when it was sent back under keep)
        for m in rec["messages"]:
            if m["role"] == "assistant":
                assert f"<|im_middle|><think></think>{m['content']}<|im_end|>" in prompt
        for k in range(1, rec["turn"]):
            earlier = records[f"{rec['conversation']}#{k}"]["response"]["reasoning"]
            assert earlier not in prompt
        assert prompt.endswith(f"{rec['messages'][-1]['content']}<|im_end|>"
                               "<|im_assistant|>assistant<|im_middle|><think>")
        assert tok.decode(row["output_ids"]) == (
            f"{rec['response']['reasoning']}</think>{rec['response']['content']}<|im_end|>")


def test_make_all_with_turns_all_builds_shards_of_whole_conversations(standin, tmp_path):
    from test_make import TOKENIZER, make

    server = standin(ledger=True, tokenizer=TOKENIZER)  # (make checks identity against it)
    r = make(server, tmp_path, "all", TURNS="all",
             SHARD_FLAGS="--eval-fraction 0.2 --format raw")
    assert r.returncode == 0, r.stderr + r.stdout
    responses = read_jsonl(tmp_path / "work" / "D1.responses.jsonl")
    turns = [x for x in responses if "conversation" in x]
    assert turns and any(x["turn"] > 1 for x in turns)  # the sample's conversations, turn by turn
    assert len(server.ledger()) == len(responses)
    manifest = json.loads((tmp_path / "shards" / "D1" / "kp-shard.manifest").read_text())
    assert manifest["records_read"] == len(responses)  # one token row per turn record
    assert set(manifest["splits"]) == {"train", "eval"}
    side = {}
    for path in (tmp_path / "shards" / "D1").glob("*.jsonl.zst"):
        for row in read_jsonl(path):
            key = row.get("conversation") or row["id"]
            side.setdefault(key, set()).add("eval" if "-eval-" in path.name else "train")
    assert all(len(s) == 1 for s in side.values())
    # a changed sampling flag reruns the responses stage, which says so instead of
    # resuming into a mixed file; nothing is sent
    sent = server.stats()["requests"]
    r = make(server, tmp_path, "all", TURNS="all", SHARD_FLAGS="--eval-fraction 0.2 --format raw",
             INFER_FLAGS="--backoff-base 0.05 --quiet --temperature 0.5")
    assert r.returncode == 2, r.stderr + r.stdout
    assert "sampling.temperature 1.0" in r.stderr and "--allow-mixed" in r.stderr
    assert server.stats()["requests"] == sent


def current_turns(records, prompts_path):
    """The records asked on the prompts as PROMPTS_PATH holds them now: per conversation,
    turn k's record whose messages are the prompt's, each earlier current turn's answer and
    the prompt's follow-ups (rebuilt from the records alone, turn by turn)."""
    prompts = {p["id"]: p for p in read_jsonl(prompts_path)}
    out: dict[str, dict[int, dict]] = {}
    for cid, prompt in prompts.items():
        turns: dict[int, dict] = {}
        for k in range(1, 2 + len(prompt["follow_ups"])):
            history = expected_history(prompt, turns, k)
            asked = [x for x in records if x.get("conversation") == cid and x["turn"] == k
                     and x["messages"] == history]
            if not asked:
                break
            assert len(asked) == 1, f"{cid}#{k} answered twice on the same history"
            turns[k] = asked[0]
        out[cid] = turns
    return out


def fix_conversations(path):
    """A source fixed under the same IDs: c0001's opening, c0002's second follow-up (its
    turn 3), c0003's first (its turn 2); c0000 as it was. The turns each asks again."""
    rows = read_jsonl(path)
    rows[1]["messages"][-1]["content"] += " (fixed)"
    rows[2]["follow_ups"][1] += " (fixed)"
    rows[3]["follow_ups"][0] += " (fixed)"
    write_jsonl(path, rows)
    return {"c0001": [1, 2, 3], "c0002": [3], "c0003": [2, 3]}


def test_a_conversation_fixed_under_its_id_is_asked_again_from_the_turn_that_changed(
        standin, tmp_path):
    """A conversation whose opening is fixed is asked again from turn 1; one whose k-th
    follow-up is fixed from turn k+1, on its earlier turns (the model's own answers to the
    same messages). Exactly those turns are paid; the old turns stay in the output (paid,
    in the spend), are never taken as history, and kp-tokenize --prompts trains on the
    current turns alone; a rerun sends nothing."""
    server = standin(ledger=True, request_log=True)
    prompts = make_conversations(tmp_path / "p.jsonl", 4, turns=3)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    r = infer(server, prompts, "-o", out)
    assert r.code == 0, r.stderr
    before = out.read_bytes()
    assert len(server.ledger()) == 12
    again = fix_conversations(prompts)
    # --plan counts the turns to send
    r = infer(server, prompts, "-o", out, "--plan", "--json")
    assert r.code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["requests"]["todo"] == 6 and plan["requests"]["conversations_todo"] == 3
    assert plan["prompts"]["todo"] == 3 and plan["prompts"]["done"] == 1
    r = infer(server, prompts, "-o", out, "--summary-json", summary)
    assert r.code == 0, r.stderr
    said = " ".join(r.stderr.split())
    assert "turns of 3 conversation(s)" in said and "'c0001', asked again from turn 1" in said
    # exactly the re-asked turns were paid, each once
    ledger = server.ledger()
    assert len(ledger) == 12 + 6
    records = read_jsonl(out)
    assert out.read_bytes().startswith(before) and len(records) == 18  # the old turns stay
    new = records[12:]
    assert sorted((x["conversation"], x["turn"]) for x in new) == sorted(
        (c, k) for c, ks in again.items() for k in ks)
    current = current_turns(records, prompts)
    assert all(sorted(turns) == [1, 2, 3] for turns in current.values())
    for cid, turns in current.items():  # the earlier turns that still match are reused
        assert [k for k, x in turns.items() if x in new] == again.get(cid, [])
    kept = [x for turns in current.values() for x in turns.values()]
    assert_chained(kept, prompts, server.requests())
    s = json.loads(summary.read_text())
    assert s["done"] == 6 and s["skipped"] == 1
    assert s["conversations"] == {"turns_by_number": {"1": 1, "2": 2, "3": 3}, "done": 3,
                                  "cut": 0, "turns_not_sent": 0}
    assert s["spend_total"] == pytest.approx(sum(x["usage"]["cost"] for x in records))
    assert "kp-infer: 6/6, conversations 3 done, 0 in progress" in r.stderr
    # a rerun sends nothing, and says nothing is asked again
    r = infer(server, prompts, "-o", out)
    assert r.code == 0, r.stderr
    assert len(server.ledger()) == 18 and len(server.requests()) == 18
    assert "asked again" not in r.stderr and len(read_jsonl(out)) == 18
    # kp-tokenize --prompts: the current turns' rows alone, each its own answer's
    tokens = tmp_path / "t.jsonl"
    r = tokenize_in_process(out, "--tokenizer", TOKENIZER_KINDS["fast"], "-o", tokens,
                            "--workers", "1", "--prompts", prompts)
    assert r.code == 0, r.stderr
    assert sorted((t["id"], t["generation_id"]) for t in read_jsonl(tokens)) == sorted(
        (x["id"], x["generation_id"]) for x in kept)


def test_kill_9_mid_reask_then_resume_asks_every_turn_once(standin, tmp_path):
    """Every conversation's opening fixed; the re-ask is killed (-9) once 8 of its 18 turns
    are written and the next ones wait at the stand-in's gate (never answered, never
    paid). The resume goes on from the new turns written, never from the old ones: every
    turn of the new versions paid exactly once, chained on the new answers."""
    server = standin(ledger=True, request_log=True)
    prompts = make_conversations(tmp_path / "p.jsonl", 6, turns=3)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out)
    assert r.code == 0, r.stderr
    rows = read_jsonl(prompts)
    for row in rows:
        row["messages"][-1]["content"] += " (fixed)"
    write_jsonl(prompts, rows)
    server.configure(hold_after=18 + 8)
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    proc = subprocess.Popen([str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--base-url",
                             server.base_url, "--concurrency", "6", "--quiet"], env=env)
    try:
        wait_for(lambda: len(whole_lines(out)) == 26 and server.stats()["held"] >= 1
                 or proc.poll() is not None, "8 new turns written and the next held", 60)
        assert proc.poll() is None, "the run ended before the gate"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    server.configure(hold_after=None)
    first = read_jsonl(out)
    assert len(first) == 26 and any(x["turn"] > 1 for x in first[18:])
    assert len(server.ledger()) == 26
    r = infer(server, prompts, "-o", out, "--concurrency", "6")
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert len(records) == 36 and records[:26] == first
    assert len(server.ledger()) == 36  # each new turn paid once
    ids = [x["id"] for x in records]
    assert all(ids.count(i) == 2 for i in ids)
    current = current_turns(records, prompts)
    assert all(sorted(turns) == [1, 2, 3] for turns in current.values())
    kept = [x for turns in current.values() for x in turns.values()]
    assert all(x in records[18:] for x in kept)
    assert_chained(kept, prompts, server.requests())


def test_a_reasked_turns_answer_in_the_rescue_file_is_taken_in_beside_the_old_turn(
        standin, tmp_path):
    """A run asking again the first turn of a conversation fixed under its id paid for its
    answer and could not write it (the rescue file holds it, and a line the output holds
    already). The next run takes the new answer in beside the old turn of the same id (an
    answer is told by its id and the messages it was asked with, not its id alone), then
    goes on from it: only turn 2 is asked again."""
    import hashlib

    server = standin(ledger=True)
    prompts = make_conversations(tmp_path / "p.jsonl", 1, turns=2)
    out, rescue = tmp_path / "r.jsonl", tmp_path / "rescue"
    rescue.mkdir(mode=0o700)
    r = infer(server, prompts, "-o", out, "--rescue", rescue)
    assert r.code == 0, r.stderr
    old = read_jsonl(out)
    rows = read_jsonl(prompts)
    rows[0]["messages"][-1]["content"] += " (fixed)"
    write_jsonl(prompts, rows)
    again = {**old[0], "messages": rows[0]["messages"],
             "generation_id": old[0]["generation_id"] + "-again"}
    digest = hashlib.sha256(str(out).encode()).hexdigest()[:16]
    (rescue / f"r.jsonl.{digest}.jsonl").write_text(
        json.dumps(old[1]) + "\n" + json.dumps(again) + "\n")
    r = infer(server, prompts, "-o", out, "--rescue", rescue)
    assert r.code == 0, r.stderr
    assert "took in 1 answer " in r.stderr
    records = read_jsonl(out)
    assert records[:3] == [*old, again] and len(records) == 4
    assert len(server.ledger()) == 3  # turn 2 alone was paid again
    assert records[3]["id"] == "c0000#2"
    assert records[3]["messages"] == expected_history(rows[0], {1: again}, 2)


def test_a_conversation_given_more_or_fewer_follow_ups_goes_on_or_ends_as_the_input_says(
        standin, tmp_path):
    """The turns a conversation has are the input's now: one given a third follow-up is
    asked its turn 4 on its three turns; one whose last follow-up is gone ends at turn 2,
    and its turn 3 (asked on a user turn the input no longer holds) is not trained on."""
    server = standin(ledger=True)
    prompts = make_conversations(tmp_path / "p.jsonl", 2, turns=3)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out)
    assert r.code == 0, r.stderr
    rows = read_jsonl(prompts)
    rows[0]["follow_ups"].append("follow-up 4 of c0000")
    rows[1]["follow_ups"].pop()
    write_jsonl(prompts, rows)
    r = infer(server, prompts, "-o", out)
    assert r.code == 0, r.stderr
    assert "1 skipped" in r.stderr
    records = read_jsonl(out)
    assert [x["id"] for x in records[6:]] == ["c0000#4"] and len(server.ledger()) == 7
    turns = by_conversation(records)["c0000"]
    assert records[6]["messages"] == expected_history(rows[0], turns, 4)
    r = infer(server, prompts, "-o", out)
    assert r.code == 0 and len(server.ledger()) == 7
    tokens = tmp_path / "t.jsonl"
    r = tokenize_in_process(out, "--tokenizer", TOKENIZER_KINDS["fast"], "-o", tokens,
                            "--workers", "1", "--prompts", prompts)
    assert r.code == 0, r.stderr
    assert sorted(t["id"] for t in read_jsonl(tokens)) == [
        "c0000#1", "c0000#2", "c0000#3", "c0000#4", "c0001#1", "c0001#2"]


def test_a_turn_answers_a_prompt_only_as_it_is_asked_now():
    """recorded/asked.py `answers_prompt`, the one test kp-infer's resume and kp-tokenize
    --prompts apply: turn k's messages are the prompt's opening, then for each earlier turn
    an assistant answer (any) and the next follow-up as a user turn."""
    def m(role, content):
        return Message(role=role, content=content)

    opening = [m("system", "Be brief."), m("user", "why?")]
    key = prompt_key(opening, ["and then?", "so?"])
    assert key.turns == 3
    turn3 = [*opening, m("assistant", "A"), m("user", "and then?"), m("assistant", "B"),
             m("user", "so?")]
    for k in (1, 2, 3):
        assert answers_prompt(key, turn3[:2 * k])
    assert not answers_prompt(key, [*turn3, m("assistant", "C"), m("user", "so?")])  # no turn 4
    assert not answers_prompt(key, turn3[:5])  # a trailing answer is no turn
    assert not answers_prompt(key, [m("user", "why?"), *turn3[2:]])  # the opening differs
    assert not answers_prompt(key, [*opening, m("assistant", "A"), m("user", "and then!")])
    assert not answers_prompt(key, [*opening, m("user", "A"), m("user", "and then?")])  # roles
    assert not answers_prompt(key, [*opening, m("assistant", "A"), m("assistant", "and then?")])
    assert not answers_prompt(key, opening[1:])  # fewer messages than its opening
    single = prompt_key(opening)
    assert answers_prompt(single, opening) and single.turns == 1
    assert not answers_prompt(single, turn3[:4])
