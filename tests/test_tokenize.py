"""kp-tokenize on both tokenizer kinds (HF fast, and Kimi-style tiktoken with its own code),
and on Kimi K2.5's real tokenizer (its 163,840-entry vocabulary, loaded through Moonshot's
tokenization_kimi.py: the `real` parameter).

Expected IDs are computed independently through transformers itself: the prompt with
`apply_chat_template(..., tokenize=True)`, the model's text with each kind's documented way
of encoding plain text. What the engine makes of records (the IDs, rejects, refusals and the
flags that shape them) is checked by running the command in this process
(`tokenize_in_process`: its `main`, its exit code, stdout and stderr, one worker); what
belongs to the process (input and output files, resume, stdin, worker processes, signals,
staying offline by itself) by `kp-tokenize` in a subprocess as a user runs it, with the
environment the suite was started with (nothing here sets HF_HUB_OFFLINE).
"""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path

import pytest
import zstandard
from conftest import (
    BIN,
    REAL_TOKENIZER,
    TOKENIZER_KINDS,
    is_tiktoken,
    kp,
    read_jsonl,
    response_record,
    tokenize_in_process,
    write_jsonl,
)
from helpers import children, time_left, wait_for, whole_lines

from kimipipe.tokenize.load import load_tokenizer

# Tests of flags and files (not of IDs) run on Kimi's own kind only.
KIMI = TOKENIZER_KINDS["tiktoken"]


def tokenize(*args, input: bytes | None = None):
    """`kp-tokenize ARGS` as a subprocess: its exit code, stdout and stderr."""
    return kp("tokenize", *args, input=input)


@cache
def hf(directory) -> object:
    return load_tokenizer(directory, trust_remote_code=True)


def plain(directory, text: str) -> list[int]:
    """TEXT as ordinary text (special-token strings not matched), each kind's own way."""
    tok = hf(directory)
    if is_tiktoken(directory):
        return tok.encode(text, allow_special_tokens=False)
    return tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def tid(directory, token: str) -> int:
    return hf(directory).convert_tokens_to_ids(token)


def prompt_ids(directory, messages, thinking=True) -> list[int]:
    out = hf(directory).apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                            thinking=thinking, return_dict=False)
    return list(out)


def run_one(tmp_path, directory, record, *extra):
    src = write_jsonl(tmp_path / "responses.jsonl", [record])
    return tokenize_in_process(src, "--tokenizer", directory, "--trust-remote-code", "--workers",
                               "1", *extra)


# One kp-tokenize run per tokenizer kind carries every single-record case below (loading
# Kimi K2.5's real tokenizer alone is ~0.7 CPU-s); each test checks its own record of it.
MULTI_TURN = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye?"}]
INJECTED_CONTENT = "Type <|im_end|> then <think>x</think> and [EOS]<|im_user|>."
INJECTED_REASONING = "Should I write </think>? Or <|im_end|>?"
UNICODE_CONTENT = "  你好，世界！ 😀👍🏽🇫🇷 e\u0301 n\u0303 Zürich \n\n\t trailing  \n"
UNICODE_REASONING = "\n  思考中… ∑∫√∞  \n"
CASES = [
    response_record("r1", "What is 2+2?", content="It is 4.", reasoning="Two and two make four."),
    response_record("m", MULTI_TURN, content="Bye.", reasoning="ok"),
    response_record("e", "Hi", content="Hello"),
    response_record("t1", "Hi", content="", reasoning="Let me think about th", finish_reason="length"),
    response_record("t2", "Hi", content="The answer is", reasoning="Easy.", finish_reason="length"),
    response_record("ec", "Hi", content="", reasoning="Nothing to say."),
    response_record("inj", "Show tokens", content=INJECTED_CONTENT, reasoning=INJECTED_REASONING),
    response_record("u", "多语言 🎉 e\u0301?", content=UNICODE_CONTENT, reasoning=UNICODE_REASONING),
    # a stack with no reasoning parser: reasoning</think>content in the content (think_tags.py)
    response_record("lone", "Hi", content="Let me see.</think>It is 5."),
    response_record("lone-cut", "Hi", content="Short.</think>The ans", finish_reason="length"),
]


@pytest.fixture(scope="module")
def batch_runs(tmp_path_factory):
    runs = {}

    def run(directory):
        if directory not in runs:
            src = write_jsonl(tmp_path_factory.mktemp("cases") / "responses.jsonl", CASES)
            r = tokenize_in_process(src, "--tokenizer", directory, "--trust-remote-code",
                                    "--workers", "1")
            assert r.code == 0, r.stderr
            runs[directory] = (r, {x["id"]: x for x in r.records()})
        return runs[directory]
    return run


@pytest.fixture
def case(batch_runs, kimi_tokenizer):
    """The output record of case ID in this tokenizer kind's run."""
    return lambda rid: batch_runs(kimi_tokenizer)[1][rid]


def test_the_cases_run_writes_each_in_order_and_counts_them(batch_runs, kimi_tokenizer):
    r, by_id = batch_runs(kimi_tokenizer)
    assert [x["id"] for x in r.records()] == [c["id"] for c in CASES]
    assert "wrote 10 records" in r.stderr and "rejected 0" in r.stderr
    assert "1 with no reasoning" in r.stderr and "3 truncated turns" in r.stderr


def test_single_turn_ids_are_template_prompt_then_reasoning_think_content_end(case, kimi_tokenizer):
    d = kimi_tokenizer
    rec, out = CASES[0], case("r1")
    assert out["input_ids"] == prompt_ids(d, rec["messages"])
    assert out["input_ids"][-1] == tid(d, "<think>")
    assert out["output_ids"] == (plain(d, "Two and two make four.") + [tid(d, "</think>")]
                                 + plain(d, "It is 4.") + [tid(d, "<|im_end|>")])
    # Fields of the response record pass through, in order, before the new ones.
    assert list(out)[:len(rec)] == list(rec) and out["finish_reason"] == "stop"
    assert hf(d).decode(out["input_ids"] + out["output_ids"]) == (
        "<|im_user|>user<|im_middle|>What is 2+2?<|im_end|><|im_assistant|>assistant<|im_middle|>"
        "<think>Two and two make four.</think>It is 4.<|im_end|>")


def test_multi_turn_history_renders_with_empty_think_and_no_extra_system(case, kimi_tokenizer):
    d = kimi_tokenizer
    out = case("m")
    assert out["input_ids"] == prompt_ids(d, MULTI_TURN)
    assert hf(d).decode(out["input_ids"]) == (
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>Hello!<|im_end|>"
        "<|im_user|>user<|im_middle|>Bye?<|im_end|><|im_assistant|>assistant<|im_middle|><think>")


@pytest.fixture(scope="module")
def no_thinking_runs(tmp_path_factory):
    """One `--no-thinking` run per tokenizer kind, for the two tests below: an answer, a
    content holding a lone </think>, and an answer with reasoning (rejected, line 3)."""
    runs = {}

    def run(directory):
        if directory not in runs:
            tmp = tmp_path_factory.mktemp("no-thinking")
            rows = [response_record("n", "Hi", content="Hello there."),
                    response_record("nl", "Hi", content="a</think>b"),
                    response_record("x", "Hi", content="Hello", reasoning="hmm")]
            src = write_jsonl(tmp / "responses.jsonl", rows)
            rejects = tmp / "rejects.jsonl"
            r = tokenize_in_process(src, "--tokenizer", directory, "--trust-remote-code",
                                    "--workers", "1", "--no-thinking", "--rejects", rejects)
            runs[directory] = (r, rejects, rows)
        return runs[directory]
    return run


def test_no_thinking_prompt_closes_think_and_turn_is_content_end(no_thinking_runs, kimi_tokenizer):
    d = kimi_tokenizer
    r, _, (rec, _lone, _) = no_thinking_runs(d)
    out, out_lone = r.records()  # (and not the rejected third: next test)
    assert out["input_ids"] == prompt_ids(d, rec["messages"], thinking=False)
    assert out["input_ids"][-2:] == [tid(d, "<think>"), tid(d, "</think>")]
    assert out["output_ids"] == plain(d, "Hello there.") + [tid(d, "<|im_end|>")]
    # the prompt closed the think block: a </think> in the content is text
    assert out_lone["output_ids"] == plain(d, "a</think>b") + [tid(d, "<|im_end|>")]
    assert "reasoning_source" not in out_lone


def test_no_thinking_rejects_a_response_that_has_reasoning(no_thinking_runs, kimi_tokenizer):
    r, rejects, _ = no_thinking_runs(kimi_tokenizer)
    assert r.code == 4, r.stderr  # done, one record rejected
    assert [x["id"] for x in r.records()] == ["n", "nl"]  # nothing written for it
    [rej] = read_jsonl(rejects)
    assert rej["id"] == "x" and rej["line"] == 3 and "--no-thinking" in rej["reason"]


def test_reasoning_before_a_lone_think_close_gets_the_structural_token(case, kimi_tokenizer):
    """No reasoning, one </think> and no <think> in the content: the text before it was the
    reasoning, and that </think> the model's control token, not text."""
    d = kimi_tokenizer
    out = case("lone")
    assert out["output_ids"] == (plain(d, "Let me see.") + [tid(d, "</think>")] + plain(d, "It is 5.")
                                 + [tid(d, "<|im_end|>")])
    assert out["reasoning_source"] == "inline"
    assert out["response"] == {"content": "Let me see.</think>It is 5."}  # passed through as it came
    cut = case("lone-cut")
    assert cut["output_ids"] == plain(d, "Short.") + [tid(d, "</think>")] + plain(d, "The ans")
    assert "reasoning_source" not in case("r1")


def test_thinking_without_reasoning_closes_think_at_once(case, kimi_tokenizer):
    d = kimi_tokenizer
    assert case("e")["output_ids"] == [tid(d, "</think>")] + plain(d, "Hello") + [tid(d, "<|im_end|>")]


def test_truncated_in_reasoning_has_no_think_close_and_no_end(case, kimi_tokenizer):
    out = case("t1")
    assert out["output_ids"] == plain(kimi_tokenizer, "Let me think about th")
    assert out["finish_reason"] == "length"


def test_truncated_in_content_has_think_close_but_no_end(case, kimi_tokenizer):
    d = kimi_tokenizer
    assert case("t2")["output_ids"] == plain(d, "Easy.") + [tid(d, "</think>")] + plain(d, "The answer is")


def test_drop_truncated_leaves_cut_turns_out(tmp_path):
    kimi_tokenizer = KIMI  # the flags do not depend on the kind
    src = write_jsonl(tmp_path / "r.jsonl", [
        response_record("a", "Hi", content="ok", reasoning="r"),
        response_record("b", "Hi", content="cu", reasoning="r", finish_reason="length")])
    r = tokenize_in_process(src, "--tokenizer", kimi_tokenizer, "--trust-remote-code",
                            "--workers", "1", "--drop-truncated")
    assert r.code == 0 and [x["id"] for x in r.records()] == ["a"]
    assert "dropped 1 truncated" in r.stderr


def test_empty_content_after_reasoning(case, kimi_tokenizer):
    d = kimi_tokenizer
    assert case("ec")["output_ids"] == plain(d, "Nothing to say.") + [tid(d, "</think>"), tid(d, "<|im_end|>")]


def test_cut_turn_with_no_text_at_all_is_rejected(tmp_path):
    kimi_tokenizer = KIMI  # the flags do not depend on the kind
    rec = response_record("z", "Hi", content="", reasoning="", finish_reason="length")
    r = run_one(tmp_path, kimi_tokenizer, rec)
    assert r.code == 4 and "nothing was generated" in r.stderr


def test_special_token_strings_in_generated_text_stay_text(case, kimi_tokenizer):
    d = kimi_tokenizer
    content, reasoning = INJECTED_CONTENT, INJECTED_REASONING
    out = case("inj")
    control = {tid(d, t) for t in ("<|im_end|>", "<think>", "</think>", "[EOS]", "<|im_user|>")}
    # Exactly two control tokens in the turn: the structural </think> and <|im_end|>.
    assert [i for i in out["output_ids"] if i in control] == [tid(d, "</think>"), tid(d, "<|im_end|>")]
    assert out["output_ids"] == (plain(d, reasoning) + [tid(d, "</think>")] + plain(d, content)
                                 + [tid(d, "<|im_end|>")])
    assert hf(d).decode(out["output_ids"]) == reasoning + "</think>" + content + "<|im_end|>"


def test_the_trap_exists_the_default_encode_makes_control_tokens(kimi_tokenizer):
    """Why plain-text encoding matters: each kind's everyday encode turns the string into the token."""
    d = kimi_tokenizer
    tok = hf(d)
    everyday = tok.encode("a<|im_end|>b") if is_tiktoken(d) else \
        tok("a<|im_end|>b", add_special_tokens=False)["input_ids"]
    assert tid(d, "<|im_end|>") in everyday
    assert tid(d, "<|im_end|>") not in plain(d, "a<|im_end|>b")


def test_whitespace_and_unicode_are_kept_verbatim(case, kimi_tokenizer):
    d = kimi_tokenizer
    content, reasoning = UNICODE_CONTENT, UNICODE_REASONING
    out = case("u")
    assert out["output_ids"] == (plain(d, reasoning) + [tid(d, "</think>")] + plain(d, content)
                                 + [tid(d, "<|im_end|>")])
    assert hf(d).decode(out["output_ids"]).startswith(reasoning + "</think>" + content)
    assert out["response"]["content"] == content


def test_max_length_flags_or_drops_long_rows(tmp_path):
    kimi_tokenizer = KIMI  # the flags do not depend on the kind
    src = write_jsonl(tmp_path / "r.jsonl", [
        response_record("short", "Hi", content="ok"),
        response_record("long", "Hi " * 40, content="word " * 40)])
    args = (src, "--tokenizer", kimi_tokenizer, "--trust-remote-code", "--workers", "1", "--max-length", "30")
    flagged = tokenize_in_process(*args).records()
    assert [x.get("over_max_length", False) for x in flagged] == [False, True]
    r = tokenize_in_process(*args, "--drop-long")
    assert [x["id"] for x in r.records()] == ["short"] and "1 over --max-length" in r.stderr
    r = tokenize_in_process(src, "--tokenizer", kimi_tokenizer, "--trust-remote-code", "--workers",
                            "1", "--drop-long")
    assert r.code == 2 and "--drop-long needs --max-length" in r.stderr


def test_drop_text_keeps_ids_and_metadata_only(tmp_path):
    kimi_tokenizer = KIMI  # the flags do not depend on the kind
    [out] = run_one(tmp_path, kimi_tokenizer, response_record("d", "Hi", content="ok"), "--drop-text").records()
    assert "messages" not in out and "response" not in out
    assert {"id", "dataset", "finish_reason", "usage", "input_ids", "output_ids"} <= set(out)


def test_resume_skips_ids_already_in_output_and_repairs_a_torn_line(tmp_path):
    kimi_tokenizer = KIMI  # the flags do not depend on the kind
    rows = [response_record(f"r{i}", f"Question {i}?", content=f"Answer {i}.", reasoning="r") for i in range(6)]
    src = write_jsonl(tmp_path / "r.jsonl", rows[:3])
    out = tmp_path / "tokens.jsonl"
    base = ("--tokenizer", kimi_tokenizer, "--trust-remote-code", "--workers", "1", "-o", out)
    assert tokenize_in_process(src, *base).code == 0  # the run to resume
    with open(out, "ab") as f:
        f.write(b'{"id": "r9", "input_ids": [1, 2')  # a crash mid-line
    write_jsonl(src, rows)
    r = tokenize(src, *base)
    assert r.code == 0, r.stderr
    assert "skipped 3 already in the output" in r.stderr and "wrote 3 records" in r.stderr
    assert [x["id"] for x in read_jsonl(out)] == [f"r{i}" for i in range(6)]
    fresh = tokenize_in_process(src, *base[:-2])  # what one run of everything writes
    assert [json.dumps(x) for x in read_jsonl(out)] == [json.dumps(x) for x in fresh.records()]


def test_an_output_holding_rows_the_input_no_longer_gives_is_refused_or_pruned(tmp_path):
    """A source changed under one output: `--prompts` tokenizes only the answers to the
    current prompts (by ID, and by the messages and user turns they were asked with: a
    prompt fixed under its old ID, a conversation's changed follow-up), and rows of the
    output its input no longer gives are refused (exit 2, one line) or, with --prune,
    removed; the responses file is never touched."""
    def turn(conv, n, follow_ups):
        messages = [{"role": "user", "content": f"{conv}?"}]
        for j in range(n - 1):
            messages += [{"role": "assistant", "content": f"{conv} answer {j}"},
                         {"role": "user", "content": follow_ups[j]}]
        return response_record(f"{conv}#{n}", messages, content=f"{conv} turn {n}.") | {
            "conversation": conv, "turn": n, "turns": 2, "history_reasoning": "drop"}

    old = [response_record(f"a{i}", f"Old {i}?", content=f"Answer {i}.") for i in range(3)]
    base = ("--tokenizer", KIMI, "--trust-remote-code", "--workers", "1")
    out = tmp_path / "tokens.jsonl.zst"
    assert tokenize_in_process(write_jsonl(tmp_path / "old.jsonl", old), *base, "-o", out).code == 0
    new = [response_record("b0", "New 0?", content="New answer."), turn("c1", 1, []),
           turn("c1", 2, ["More?"]), turn("c2", 1, []), turn("c2", 2, ["Old follow-up?"])]
    responses = write_jsonl(tmp_path / "responses.jsonl", old + new)  # kp-infer resumed: both
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [
        {"id": "a0", "dataset": "T", "messages": [{"role": "user", "content": "Old 0, fixed?"}]},
        {"id": "b0", "dataset": "T", "messages": [{"role": "user", "content": "New 0?"}]},
        {"id": "c1", "dataset": "T", "messages": [{"role": "user", "content": "c1?"}],
         "follow_ups": ["More?"]},
        {"id": "c2", "dataset": "T", "messages": [{"role": "user", "content": "c2?"}],
         "follow_ups": ["New follow-up?"]}])
    answers = responses.read_bytes()
    r = tokenize_in_process(responses, *base, "-o", out, "--prompts", prompts)
    assert r.code == 2
    assert r.stderr.strip().splitlines()[-1] == (
        f"kp-tokenize: {out} holds 3 rows that {prompts}'s answers in {responses} does not give "
        f"(first: 'a0'): an earlier input's, never to be trained on beside this one's; rerun "
        f"with --prune to remove them from {out}, or write to a new output")
    r = tokenize(responses, *base, "-o", out, "--prompts", prompts, "--prune")
    assert r.code == 0, r.stderr
    assert "left out 4 answers to prompts --prompts does not hold" in r.stderr
    assert "removed 3 rows of an earlier input (--prune)" in r.stderr
    assert sorted(x["id"] for x in read_jsonl(out)) == ["b0", "c1#1", "c1#2", "c2#1"]
    assert out.read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # still zstd
    assert responses.read_bytes() == answers  # the paid answers, untouched
    # without --prompts, the input's own IDs are what an output may hold
    plain = tmp_path / "plain.jsonl"
    assert tokenize_in_process(responses, *base, "-o", plain).code == 0
    r = tokenize_in_process(write_jsonl(tmp_path / "new.jsonl", new), *base, "-o", plain)
    assert r.code == 2 and f"{plain} holds 3 rows that {tmp_path / 'new.jsonl'} does not give" in r.stderr


def test_a_pipe_is_tokenized_as_its_records_arrive(tmp_path):
    """`kp-infer ... | kp-tokenize -`: records are written a batch (64) at a time while the
    pipe stays open, not once a megabyte has arrived or the writer has ended (plain and
    zstd), so a slow producer's records reach the output as it makes them."""
    rows = [response_record(f"r{i}", f"Question {i}?", content=f"Answer {i}.") for i in range(64)]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)  # ~20 KB
    compressor = zstandard.ZstdCompressor()
    for name, chunk in (("plain", data), ("zstd", compressor.compress(data))):
        out = tmp_path / f"{name}.jsonl"
        proc = subprocess.Popen([str(BIN / "kp-tokenize"), "-", "--tokenizer", KIMI,
                                 "--trust-remote-code", "--workers", "1", "-o", str(out), "-q"],
                                stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            proc.stdin.write(chunk)
            proc.stdin.flush()  # and the pipe stays open
            wait_for(lambda out=out: out.exists() and len(whole_lines(out)) == 64,
                     f"the {name} pipe's 64 records in the output while it is open", timeout=60)
            assert proc.poll() is None
        finally:
            proc.stdin.close()  # the end of the input: it ends
            err = proc.stderr.read()
            proc.wait(timeout=time_left())
        assert proc.returncode == 0, err.decode()


TEMPLATE_THAT_FAILS_SOMETIMES = """\
{%- for m in messages -%}
{%- if 'REJECT' in m['content'] -%}{{ raise_exception('refusing ' + m['content']) }}{%- endif -%}
<|im_user|>user<|im_middle|>{{ m['content'] }}<|im_end|>
{%- endfor -%}
<|im_assistant|>assistant<|im_middle|>{% if 'OPEN' in messages[-1]['content'] %}<think></think>{% else %}<think>{% endif %}"""


def test_failures_go_to_rejects_exit_4_and_strict_stops_with_2(tmp_path):
    kimi_tokenizer = KIMI  # the flags do not depend on the kind
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE_THAT_FAILS_SOMETIMES)
    src = write_jsonl(tmp_path / "r.jsonl", [
        response_record("good1", "fine", content="a"),
        response_record("bad1", "REJECT me", content="b"),
        response_record("bad2", "OPEN wrong", content="c"),
        response_record("good2", "fine too", content="d")])
    rejects = tmp_path / "rejects.jsonl"
    base = (src, "--tokenizer", kimi_tokenizer, "--trust-remote-code", "--workers", "1",
            "--chat-template", template)
    r = tokenize_in_process(*base, "--rejects", rejects)
    assert r.code == 4, r.stderr
    assert [x["id"] for x in r.records()] == ["good1", "good2"]
    rej = read_jsonl(rejects)
    assert [(x["id"], x["line"]) for x in rej] == [("bad1", 2), ("bad2", 3)]
    assert "refusing REJECT me" in rej[0]["reason"] and "does not end with '<think>'" in rej[1]["reason"]
    assert "rejected 2 (see" in r.stderr
    s = tokenize_in_process(*base, "--strict")
    assert s.code == 2 and [x["id"] for x in s.records()] == ["good1"]
    assert "bad1 (input line 2): chat template failed" in s.stderr


def test_wrong_preset_is_a_usage_error_before_any_output(tmp_path, kimi_tokenizer):
    out = tmp_path / "t.jsonl"
    src = write_jsonl(tmp_path / "r.jsonl", [response_record("a", "Hi", content="ok")])
    base = (src, "--tokenizer", kimi_tokenizer, "--trust-remote-code", "--workers", "1")
    r = tokenize_in_process(*base, "--preset", "qwen3", "-o", out)
    assert r.code == 2 and "preset qwen3" in r.stderr and not out.exists()
    r = tokenize_in_process(*base, "--preset", "deepseek-r1")
    assert r.code == 2 and "'<｜end▁of▁sentence｜>' is not a single control token" in r.stderr


def test_missing_tokenizer_is_one_line_exit_2(tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", [response_record("a", "Hi", content="ok")])
    r = tokenize(src, "--tokenizer", tmp_path / "nope")
    assert r.code == 2 and r.stderr.count("\n") == 1 and "no such directory" in r.stderr
    r = tokenize(src, "--tokenizer", "someone/not-in-the-cache")
    assert r.code == 2 and "local Hugging Face cache" in r.stderr


def test_tiktoken_kind_needs_trust_remote_code(tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", [response_record("a", "Hi", content="ok")])
    r = tokenize(src, "--tokenizer", TOKENIZER_KINDS["tiktoken"])
    assert r.code == 2 and "tokenization_kimi.py" in r.stderr and "--trust-remote-code" in r.stderr


@pytest.mark.timeout(180)
def test_workers_keep_input_order_and_match_one_process(tmp_path, kimi_tokenizer):
    """2 worker processes (a subprocess, as a user runs it) give byte-identical output to one
    process (the command run in this one)."""
    d = kimi_tokenizer
    rows = [response_record(f"w{i}", f"Question number {i}: {'why ' * (i % 7)}?",
                            content=f"Answer {i} " * (1 + i % 5), reasoning="think " * (i % 4),
                            finish_reason="length" if i % 11 == 0 else "stop") for i in range(300)]
    src = write_jsonl(tmp_path / "r.jsonl", rows)
    one = tokenize_in_process(src, "--tokenizer", d, "--trust-remote-code", "--workers", "1")
    two = kp("tokenize", src, "--tokenizer", d, "--trust-remote-code", "--workers", "2")
    assert one.code == 0 and two.code == 0, two.stderr
    assert two.stdout == one.stdout
    assert [x["id"] for x in two.records()] == [r["id"] for r in rows]


def test_rerun_with_everything_done_writes_nothing(tmp_path):
    kimi_tokenizer = KIMI  # the flags do not depend on the kind
    src = write_jsonl(tmp_path / "r.jsonl", [response_record("a", "Hi", content="ok")])
    out = tmp_path / "t.jsonl"
    base = (src, "--tokenizer", kimi_tokenizer, "--trust-remote-code", "--workers", "1", "-o", out)
    assert tokenize_in_process(*base).code == 0  # everything done
    before = out.read_bytes()
    r = tokenize(*base)
    assert r.code == 0 and out.read_bytes() == before
    assert "wrote 0 records" in r.stderr and "skipped 1 already in the output" in r.stderr


@pytest.mark.timeout(120)
def test_strict_with_worker_processes_stops_cleanly(tmp_path):
    kimi_tokenizer = KIMI  # the flags do not depend on the kind
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE_THAT_FAILS_SOMETIMES)
    rows = [response_record(f"g{i}", "fine", content="a") for i in range(150)]
    rows.insert(140, response_record("bad", "REJECT", content="x"))
    src = write_jsonl(tmp_path / "r.jsonl", rows)
    r = kp("tokenize", src, "--tokenizer", kimi_tokenizer, "--trust-remote-code", "--workers", "2", "--strict",
           "--chat-template", template, timeout=60)
    assert r.code == 2 and "bad (input line 141)" in r.stderr
    assert [x["id"] for x in r.records()] == [f"g{i}" for i in range(140)]


@pytest.mark.timeout(120)
def test_bad_line_with_worker_processes_keeps_the_records_before_it(tmp_path):
    kimi_tokenizer = KIMI  # the flags do not depend on the kind
    rows = [json.dumps(response_record(f"g{i}", "fine", content="a")) for i in range(150)]
    src = tmp_path / "r.jsonl"
    src.write_text("\n".join(rows[:130] + ['{"id": "broken"'] + rows[130:]) + "\n")
    out = tmp_path / "t.jsonl"
    r = kp("tokenize", src, "--tokenizer", kimi_tokenizer, "--trust-remote-code", "--workers", "2", "-o", out,
           timeout=60)
    assert r.code == 2 and f"{src}:131: " in r.stderr
    assert [x["id"] for x in read_jsonl(out)] == [f"g{i}" for i in range(130)]


def test_template_that_renders_finished_turns_unlike_the_preset_is_refused(tmp_path, kimi_tokenizer):
    template = (kimi_tokenizer / "chat_template.jinja").read_text()
    bad = template.replace("<think>{{- message['reasoning_content'] -}}</think>",
                           "<think>{{- message['reasoning_content'] -}}</think>{{ '\\n' }}")
    assert bad != template
    (tmp_path / "t.jinja").write_text(bad)
    src = write_jsonl(tmp_path / "r.jsonl", [response_record("a", "Hi", content="ok")])
    r = tokenize_in_process(src, "--tokenizer", kimi_tokenizer, "--trust-remote-code",
                            "--workers", "1", "--chat-template", tmp_path / "t.jinja")
    assert r.code == 2 and r.stdout == b""
    assert "renders a finished turn as 'REASONING-7f3a</think>\\nCONTENT-7f3a<|im_end|>'" in r.stderr


def _tokenizing_from_an_open_pipe(tmp_path, records: int, given: int):
    """kp-tokenize (2 workers, the fast tokenizer) on a pipe the test keeps open, fed the
    first GIVEN of RECORDS generated responses, once its first records are out: (the
    process, the whole input file, the output, the arguments but the input). Input is read
    in blocks of 1 MiB (kimipipe/io.py) and 2 workers hold 6 batches of 64: GIVEN must be
    over ~2 MiB of these ~2.4 KB records for the first ones to come out while the pipe is
    open (800 are not, 900 are)."""
    import subprocess
    import sys
    import time

    from conftest import REPO
    sys.path.insert(0, str(REPO / "bench"))
    from bench_tokenize import make_responses

    src = tmp_path / "r.jsonl"
    make_responses(src, records)
    out = tmp_path / "t.jsonl"
    common = ["--tokenizer", str(TOKENIZER_KINDS["fast"]), "--workers", "2", "--drop-text",
              "-q", "-o", str(out)]
    proc = subprocess.Popen([str(BIN / "kp-tokenize"), "-", *common], stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    lines = src.read_bytes().splitlines(keepends=True)
    proc.stdin.write(b"".join(lines[:given]))
    proc.stdin.flush()
    while proc.poll() is None and (not out.exists() or out.stat().st_size == 0):
        time.sleep(0.01)  # (a wait on a condition: records in the output)
    return proc, src, out, common


@pytest.mark.timeout(120)
def test_ctrl_c_with_workers_exits_130_and_a_rerun_completes_exactly(tmp_path):
    """Ctrl-C mid-run: exit 130, whole records only, and the same command finishes the rest.
    The first run reads its input from a pipe the test keeps open, so it cannot finish
    before the SIGINT lands (no race with a fast machine): the signal comes once records
    are in the output and half the input is still to come."""
    import signal
    import subprocess

    proc, src, out, common = _tokenizing_from_an_open_pipe(tmp_path, 2000, 1000)
    assert proc.poll() is None  # its input is still open: it cannot have finished
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert err.decode().strip() == "kp-tokenize: interrupted"
    partial = read_jsonl(out)
    assert 0 < len(partial) <= 1000
    assert subprocess.run([str(BIN / "kp-tokenize"), str(src), *common]).returncode == 0
    assert [x["id"] for x in read_jsonl(out)] == [f"b-{i}" for i in range(2000)]




@pytest.mark.timeout(120)
def test_a_worker_killed_mid_run_stops_the_command_with_one_line_and_a_rerun_completes(tmp_path):
    """A worker process that dies (the OOM killer, a kill -9) ends the run with exit 1 and
    one line saying so, never a hang; the output holds whole records only, and the same
    command finishes the rest. The input comes from a pipe the test keeps open, so the
    worker is killed while the run is still going."""
    import signal
    import subprocess

    proc, src, out, common = _tokenizing_from_an_open_pipe(tmp_path, 2000, 1000)
    workers = children(proc.pid)
    assert proc.poll() is None and len(workers) == 2
    import os
    os.kill(workers[0], signal.SIGKILL)
    try:  # (it may have stopped already, on a batch in flight to the dead worker)
        proc.stdin.write(b"".join(src.read_bytes().splitlines(keepends=True)[1000:]))
        proc.stdin.close()
    except BrokenPipeError:
        pass
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1, err
    assert err.strip() == ("kp-tokenize: a worker process ended unexpectedly (exit code -9); "
                           "rerun the same command to resume")
    partial = read_jsonl(out)  # whole lines only
    assert 0 < len(partial) < 2000
    assert subprocess.run([str(BIN / "kp-tokenize"), str(src), *common]).returncode == 0
    assert [x["id"] for x in read_jsonl(out)] == [f"b-{i}" for i in range(2000)]


def test_partitions_split_the_records_disjointly_and_completely(tmp_path):
    rows = [response_record(f"r{i}", f"question {i}", f"answer {i}", reasoning=f"think {i}")
            for i in range(40)]
    src = write_jsonl(tmp_path / "responses.jsonl", rows)
    parts = []
    for k in (1, 2):
        out = tmp_path / f"t{k}.jsonl"
        r = tokenize_in_process(src, "--tokenizer", TOKENIZER_KINDS["fast"], "--workers", "1",
                                "-o", out, "--partition", f"{k}/2", "--quiet")
        assert r.code == 0, r.stderr
        parts.append({x["id"] for x in read_jsonl(out)})
    assert parts[0] and parts[1] and not parts[0] & parts[1]
    assert parts[0] | parts[1] == {f"r{i}" for i in range(40)}


OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE",
                     "HF_HUB_DISABLE_TELEMETRY", "HF_ENDPOINT", "NO_PROXY", "no_proxy")


def _can_unshare_network() -> bool:
    import shutil
    import subprocess
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-n", "true"], capture_output=True).returncode == 0


def test_nothing_is_downloaded_with_no_offline_variable_set(tmp_path):
    """README: nothing is downloaded at run time. No offline variable in the environment
    (kp-tokenize must go offline by itself), a fresh HF_HOME whose cache holds the model,
    and every proxy variable pointing at a socket this test listens on: an HTTP(S) request
    of any library would connect there. kp-tokenize works, by model name from the cache
    and by directory, and nothing connects. Then both run again in a network namespace
    with no network at all (`unshare -n`) and give the same output; where `unshare -n` is
    not allowed that part skips (after the first has passed), which CI (KP_NO_SKIP) turns
    into an error."""
    import os
    import socket
    import subprocess
    import threading

    from conftest import BIN, fake_hf_cache

    src = write_jsonl(tmp_path / "r.jsonl", [response_record("a", "Hi", content="ok", reasoning="r")])
    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(16)
    connected = []

    def refuse():  # note and drop every connection: a client fails fast, the test sees it
        while True:
            try:
                conn, _ = trap.accept()
            except OSError:
                return
            connected.append(conn.recv(200))
            conn.close()

    threading.Thread(target=refuse, daemon=True).start()
    proxy = f"http://127.0.0.1:{trap.getsockname()[1]}"
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_VARIABLES}
    env.update(fake_hf_cache(tmp_path / "hf", TOKENIZER_KINDS["tiktoken"]))
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env[name] = proxy
    commands = [[str(BIN / "kp-tokenize"), str(src), "--tokenizer", "moonshotai/Kimi-K2.5",
                 "--trust-remote-code", "--workers", "1"],
                [str(BIN / "kp-tokenize"), str(src), "--tokenizer", str(TOKENIZER_KINDS["fast"]),
                 "--workers", "1"]]
    def outputs(commands) -> list[bytes]:
        got = []
        for argv in commands:
            proc = subprocess.run(argv, env=env, capture_output=True, timeout=120)
            assert not connected, (argv, connected)
            assert proc.returncode == 0, (argv, proc.stderr.decode())
            got.append(proc.stdout)
        return got

    try:
        trapped = outputs(commands)
        assert all(json.loads(x)["output_ids"] for x in trapped)
        if not _can_unshare_network():
            pytest.skip("cannot run `unshare -n` here (needs root or user namespaces)")
        # the same without any network
        assert outputs([["unshare", "-n", *c] for c in commands]) == trapped
    finally:
        trap.close()


def test_a_tokenizer_without_a_chat_template_is_refused_naming_where_the_template_comes_from(tmp_path):
    """Kimi K2.5's real tokenizer files hold no chat template: the refusal says which file
    of the model's repository holds it and the `hf download` line that fetches it into the
    tokenizer's directory (docs/kp-tokenize.md), before any record is read."""
    if not (REAL_TOKENIZER / "tiktoken.model").is_file():
        pytest.skip(f"Kimi K2.5's real tokenizer files are not in {REAL_TOKENIZER}")
    bare = tmp_path / "kimi-k2.5"
    bare.mkdir()
    for f in REAL_TOKENIZER.iterdir():
        if f.is_file() and f.name != "chat_template.jinja":
            (bare / f.name).symlink_to(f.resolve())
    src = write_jsonl(tmp_path / "r.jsonl", [response_record("a", "Hi", content="ok")])
    r = tokenize_in_process(src, "--tokenizer", bare, "--trust-remote-code", "--workers", "1")
    assert r.code == 2 and r.stdout == b""
    assert (f"has no chat template: the model's is its repository's chat_template.jinja "
            f"(Kimi K2.5: `hf download moonshotai/Kimi-K2.5 chat_template.jinja --local-dir "
            f"{bare}`, docs/kp-tokenize.md); download it there, or pass --chat-template FILE"
            in r.stderr), r.stderr
    assert "Traceback" not in r.stderr
    docs = (Path(__file__).parent.parent / "docs" / "kp-tokenize.md").read_text()
    assert "hf download moonshotai/Kimi-K2.5" in docs and "chat_template.jinja" in docs
