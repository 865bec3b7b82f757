"""kp-tokenize refuses what it cannot render faithfully, and tokenizes only turns that ended.

A response record from another client may carry message fields the chat template renders
(name, tool calls, non-text parts, earlier reasoning): rendering role and content alone
would give IDs the model never saw, so kp-tokenize stops (PATH:LINE, exit 2) unless
--ignore-extra-fields. A turn that did not end with `stop` or `length` is rejected.
"""

from __future__ import annotations

import json

import pytest
from conftest import (
    TOKENIZER_KINDS,
    kp,
    read_jsonl,
    response_record,
    tokenize_in_process,
    tokenizer_dir,
    write_jsonl,
)

FAST = TOKENIZER_KINDS["fast"]
# The refusals hold on the bundled fast kind and on Kimi K2.5's real tokenizer.
KINDS = ["fast", "real"]


def tokenize(*args, directory=FAST):
    """kp-tokenize on DIRECTORY's tokenizer, one worker, run in this process (what is
    checked here is the engine's: conftest.tokenize_in_process)."""
    return tokenize_in_process("--tokenizer", directory, "--trust-remote-code", "--workers", "1",
                               *args)


def good(rid="g"):
    return response_record(rid, "Hi", content="Hello.", reasoning="Greet back.")


def with_message_fields(rid="x", **fields):
    rec = response_record(rid, [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "What is 2+2?"},
                                {"role": "assistant", "content": "4."},
                                {"role": "user", "content": "And 3+3?"}],
                          content="6.", reasoning="Add.")
    for index, extra in fields.items():
        rec["messages"][int(index[1:])].update(extra)
    return rec


FIELD_CASES = [
    ("m1", {"name": "alice"}, "`$.messages[1].name`"),
    ("m2", {"tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "add", "arguments": "{}"}}]},
     "`$.messages[2].tool_calls`"),
    ("m3", {"tool_call_id": "c1"}, "`$.messages[3].tool_call_id`"),
    ("m1", {"content": [{"type": "text", "text": "What is "},
                        {"type": "image_url", "image_url": {"url": "data:..."}}]},
     "`$.messages[1].content[1]`: a 'image_url' content part"),
]


# Every case on the fast kind; on the real tokenizer one of them: the check reads the
# messages only, before any token is made, and each case loads the real tokenizer (~0.7 s).
@pytest.mark.parametrize("kind, index, extra, field",
                         [("fast", *c) for c in FIELD_CASES] + [("real", *FIELD_CASES[1])])
def test_fields_the_template_renders_stop_with_path_line(request, tmp_path, index, extra, field, kind):
    src = write_jsonl(tmp_path / "r.jsonl", [good("a"), with_message_fields("b", **{index: extra})])
    out = tmp_path / "t.jsonl"
    r = tokenize(src, "-o", out, directory=tokenizer_dir(request, kind))
    assert r.code == 2, r.stderr
    assert f"kp-tokenize: {src}:2: {field}" in r.stderr and "--ignore-extra-fields" in r.stderr
    assert [x["id"] for x in read_jsonl(out)] == ["a"]  # the records before it are written


def test_ignore_extra_fields_renders_role_and_content_only(tmp_path):
    """--ignore-extra-fields: each record gets the IDs of the same record without the field
    (one run for every case, one for their plain twins)."""
    plains, extras = [], []
    for k, (index, extra, _field) in enumerate(FIELD_CASES):
        plain = with_message_fields(f"c{k}")
        if index == "m1" and "content" in extra:
            plain["messages"][1]["content"] = "What is "
        plains.append(plain)
        extras.append(with_message_fields(f"c{k}", **{index: extra}))
    want = tokenize(write_jsonl(tmp_path / "plain.jsonl", plains), "-q")
    got = tokenize(write_jsonl(tmp_path / "extra.jsonl", extras), "-q", "--ignore-extra-fields")
    assert want.code == got.code == 0, got.stderr
    assert len(want.records()) == len(got.records()) == len(FIELD_CASES)
    for w, g in zip(want.records(), got.records(), strict=True):
        assert g["id"] == w["id"]
        assert (g["input_ids"], g["output_ids"]) == (w["input_ids"], w["output_ids"])
        assert g["messages"] != w["messages"]  # the record itself passes through as it came


def test_empty_extra_fields_and_text_parts_are_rendered_as_given(tmp_path):
    """`name: null`, `tool_calls: []` render nothing; text parts go to the template as parts."""
    rec = with_message_fields("p", m1={"name": None, "tool_calls": [],
                                       "content": [{"type": "text", "text": "What is "},
                                                   {"type": "text", "text": "2+2?"}]})
    r = tokenize(write_jsonl(tmp_path / "r.jsonl", [rec, with_message_fields("w")]), "-q")
    assert r.code == 0, r.stderr
    got, want = r.records()
    assert (got["id"], want["id"]) == ("p", "w") and got["input_ids"] == want["input_ids"]


KEEPS_REASONING = (FAST / "chat_template.jinja").read_text().replace(
    "{%- if preserve_thinking is defined and preserve_thinking and message.get('reasoning_content') -%}",
    "{%- if message.get('reasoning_content') -%}")


@pytest.mark.parametrize("workers, kind", [("1", "fast"), ("2", "fast"), ("1", "real")])
def test_earlier_reasoning_is_refused_only_where_the_template_renders_it(request, tmp_path, workers,
                                                                          kind):
    assert KEEPS_REASONING != (FAST / "chat_template.jinja").read_text()
    template = tmp_path / "keeps.jinja"
    template.write_text(KEEPS_REASONING)
    rows = [good(f"g{i}") for i in range(5)]
    rows.append(with_message_fields("r", m2={"reasoning_content": "Two and two."}))
    rows.append(with_message_fields("plain"))  # the same conversation without it
    src = write_jsonl(tmp_path / "r.jsonl", rows)
    d = tokenizer_dir(request, kind)
    base = (src, "--tokenizer", d, "--trust-remote-code", "--workers", workers, "-q")
    # worker processes: a subprocess, as a user runs it
    run = tokenize_in_process if workers == "1" else (lambda *a: kp("tokenize", *a))

    # Kimi K2.5's template drops finished turns' reasoning: nothing the model saw is missing.
    dropped = run(*base)
    assert dropped.code == 0, dropped.stderr
    by_id = {x["id"]: x for x in dropped.records()}
    assert by_id["r"]["input_ids"] == by_id["plain"]["input_ids"]

    # A template that renders it: the record stops the command, naming the field.
    kept = run(*base, "--chat-template", template)
    assert kept.code == 2
    assert f"{src}:6: `$.messages[2].reasoning_content`: this chat template renders" in kept.stderr
    assert [x["id"] for x in kept.records()] == [f"g{i}" for i in range(5)]
    ignored = run(*base, "--chat-template", template, "--ignore-extra-fields")
    assert ignored.code == 0 and len(ignored.records()) == 7


@pytest.mark.parametrize("kind", KINDS)
def test_ignore_extra_fields_refuses_an_assistant_turn_that_is_its_tool_calls(request, tmp_path, kind):
    """Content null (or empty) and tool_calls holding the turn: role and content would
    render an empty assistant turn, which kp-infer could never have sent. Refused with
    PATH:LINE with the flag as without it; a turn with text beside its calls renders."""
    calls = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]
    with_text = with_message_fields("t", m2={"tool_calls": calls})  # content "4." beside them
    rows = [good("a"), with_text, with_message_fields("b", m2={"content": None, "tool_calls": calls}),
            with_message_fields("c", m2={"content": "", "tool_calls": calls})]
    src = write_jsonl(tmp_path / "r.jsonl", rows)
    d = tokenizer_dir(request, kind)
    for flags in ([], ["--ignore-extra-fields"]):
        out = tmp_path / f"t{len(flags)}.jsonl"
        r = tokenize(src, "-o", out, *flags, directory=d)
        assert r.code == 2, r.stderr
        line = 3 if flags else 2  # without the flag the tool calls beside text stop it first
        assert f"kp-tokenize: {src}:{line}: `$.messages[2].tool_calls`" in r.stderr
        assert [x["id"] for x in read_jsonl(out)] == (["a", "t"] if flags else ["a"])
    assert "an empty assistant turn" in r.stderr
    r = tokenize(write_jsonl(tmp_path / "c.jsonl", [rows[3]]), "--ignore-extra-fields", directory=d)
    assert r.code == 2 and f"{tmp_path / 'c.jsonl'}:1: `$.messages[2].tool_calls`" in r.stderr


UNENDED = ["content_filter", "error", None, "tool_calls"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_turn_that_did_not_end_is_rejected_not_given_an_end(request, tmp_path, kind):
    rows = [good("a")]
    for k, reason in enumerate(UNENDED):
        rows.append(response_record(f"cut{k}", "Hi", content="Partial", reasoning="r",
                                    finish_reason=reason))
    rows.append(good("b"))
    src = write_jsonl(tmp_path / "r.jsonl", rows)
    rejects = tmp_path / "rejects.jsonl"
    out = tmp_path / "t.jsonl"
    d = tokenizer_dir(request, kind)
    r = tokenize(src, "-o", out, "--rejects", rejects, directory=d)
    assert r.code == 4, r.stderr
    assert [x["id"] for x in read_jsonl(out)] == ["a", "b"]
    rejected = read_jsonl(rejects)
    assert [(x["id"], x["line"]) for x in rejected] == [(f"cut{k}", k + 2) for k in range(len(UNENDED))]
    for rej, reason in zip(rejected, UNENDED, strict=True):
        assert rej["reason"].startswith(f"finish_reason {json.dumps(reason)}: the turn did not end")
        assert "<|im_end|>" in rej["reason"]
    assert f"rejected {len(UNENDED)} (see" in r.stderr
    # exit 4 names the rejects file and says what a rerun does
    assert (f"kp-tokenize: {len(UNENDED)} records rejected (listed with their reasons in {rejects}); "
            f"they are not in {out}, and rerunning the same command tries them again") in r.stderr
    strict = tokenize(src, "--strict", directory=d)
    assert strict.code == 2 and "cut0 (input line 2): finish_reason" in strict.stderr


def test_stop_and_length_turns_are_still_tokenized(tmp_path):
    rows = [good("s"), response_record("l", "Hi", content="Par", reasoning="r", finish_reason="length")]
    r = tokenize(write_jsonl(tmp_path / "r.jsonl", rows), "-q")
    assert r.code == 0 and [x["id"] for x in r.records()] == ["s", "l"]


def test_exit_4_without_a_rejects_file_says_how_to_keep_them(tmp_path):
    rows = [good("a"), response_record("e", "Hi", content="x", finish_reason="error")]
    r = tokenize(write_jsonl(tmp_path / "r.jsonl", rows))
    assert r.code == 4
    assert ("kp-tokenize: 1 record rejected (the first 1 shown above; --rejects FILE lists them "
            "all); they are not in the output, and rerunning the same command tries them again"
            ) in r.stderr


def test_records_of_another_stage_name_the_stage_to_run(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", [
        {"id": "p1", "dataset": "B3", "messages": [{"role": "user", "content": "Hi"}]}])
    r = tokenize(prompts)
    assert r.code == 2
    assert r.stderr.strip().endswith(
        f"kp-tokenize: {prompts}:1: a prompt record (it has no `response`): kp-tokenize reads "
        "response records; run kp-infer on this file first")
    tokens = write_jsonl(tmp_path / "t.jsonl", [  # as written with --drop-text
        {"id": "t", "dataset": "B3", "finish_reason": "stop", "input_ids": [1], "output_ids": [2]}])
    r = tokenize(tokens)
    assert r.code == 2 and (f"{tokens}:1: a token record (kp-tokenize's output): kp-tokenize reads "
                            "response records; give this file to kp-shard") in r.stderr
