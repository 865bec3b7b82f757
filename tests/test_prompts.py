"""kp-prompts, run as a user runs it: formats, stable IDs, turn selection, dedup, errors."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import zstandard
from conftest import BIN, REPO, kp, public_source, read_jsonl

from kimipipe.records import Prompt, encode_line

SHAREGPT = [
    {"id": "conv-1", "conversations": [
        {"from": "human", "value": "What is 2+2?"},
        {"from": "gpt", "value": "4"},
        {"from": "human", "value": "And 3+3?"},
        {"from": "gpt", "value": "6"},
    ]},
    {"id": "conv-2", "conversations": [
        {"from": "system", "value": "Be terse."},
        {"from": "human", "value": "Hello"},
        {"from": "gpt", "value": "Hi"},
    ]},
    {"id": "conv-3", "conversations": [{"from": "gpt", "value": "I talk alone"}]},
]


def write_json(path, obj):
    path.write_text(json.dumps(obj, indent=2))
    return path


def test_sharegpt_array_keeps_conversation_up_to_last_user_turn(tmp_path):
    src = write_json(tmp_path / "sharegpt.json", SHAREGPT)
    r = kp("prompts", src, "--dataset", "B3", "--turns", "last")
    assert r.code == 0, r.stderr
    recs = r.records()
    assert [x["id"] for x in recs] == ["conv-1", "conv-2"]
    assert recs[0] == {"id": "conv-1", "dataset": "B3", "messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"}]}
    assert recs[1]["messages"][0] == {"role": "system", "content": "Be terse."}
    assert recs[1]["messages"][-1] == {"role": "user", "content": "Hello"}
    assert "wrote 2 prompts" in r.stderr and "1 without a user turn" in r.stderr


def test_turns_each_gives_one_prompt_per_user_turn_with_history(tmp_path):
    src = write_json(tmp_path / "sharegpt.json", SHAREGPT[:1])
    recs = kp("prompts", src, "--turns", "each").records()
    assert [x["id"] for x in recs] == ["conv-1#1", "conv-1#2"]
    assert [len(x["messages"]) for x in recs] == [1, 3]


def test_text_file_gives_hash_ids_stable_byte_for_byte(tmp_path):
    src = tmp_path / "questions.txt"
    src.write_text("Why is the sky blue?\n\nName three primes.\nWhy is the sky blue?\n")
    first = kp("prompts", src, "--format", "text", "--dataset", "B4")
    second = kp("prompts", src, "--format", "text", "--dataset", "B4")
    assert first.code == 0 and first.stdout == second.stdout
    recs = first.records()
    assert len(recs) == 2  # the repeated question is a duplicate
    assert all(x["id"].startswith("B4-") and len(x["id"]) == 3 + 16 for x in recs)
    assert recs[0]["messages"] == [{"role": "user", "content": "Why is the sky blue?"}]
    assert f"skipped 1 duplicate (dropped: {src}:4 repeats {src}:1)\n" in first.stderr
    other = kp("prompts", src, "--format", "text", "--dataset", "B5").records()
    assert {x["id"] for x in other}.isdisjoint({x["id"] for x in recs})


def test_hash_id_formula_is_pinned(tmp_path):
    """Resume across versions depends on it: `<dataset>-` + the first 16 hex of SHA-256 of
    the compact JSON `[dataset, messages]` with sorted keys. Literal IDs, so a change to the
    formula cannot pass unnoticed."""
    src = tmp_path / "q.txt"
    src.write_text("Why is the sky blue?\n")
    [rec] = kp("prompts", src, "--format", "text", "--dataset", "B4").records()
    assert rec["id"] == "B4-c661c6ffbf284fbd"
    conv = tmp_path / "c.jsonl"
    conv.write_text(json.dumps({"conversations": [
        {"from": "system", "value": "Be terse."}, {"from": "human", "value": "Hello"},
        {"from": "gpt", "value": "Hi"}, {"from": "human", "value": "Bye"}]}) + "\n")
    recs = kp("prompts", conv, "--dataset", "B3", "--turns", "each").records()
    assert [x["id"] for x in recs] == ["B3-0abd8902800f4281", "B3-98d95f70cbcf7aaf"]
    for x in [rec, *recs]:  # the documented formula, computed here independently
        blob = json.dumps([x["dataset"], x["messages"]], separators=(",", ":"),
                          ensure_ascii=False, sort_keys=True).encode()
        assert x["id"] == f"{x['dataset']}-{hashlib.sha256(blob).hexdigest()[:16]}"


def test_id_field_names_the_sources_own_id(tmp_path):
    src = tmp_path / "s.jsonl"
    src.write_text('{"uid": "q-1", "id": "ignored", "prompt": "first"}\n'
                   '{"uid": 7, "prompt": "second"}\n'
                   '{"prompt": "third, no uid"}\n')
    recs = kp("prompts", src, "--id-field", "uid", "--dataset", "B5").records()
    assert [x["id"] for x in recs[:2]] == ["q-1", "7"]
    assert recs[2]["id"].startswith("B5-") and len(recs[2]["id"]) == 3 + 16  # no uid: hashed
    assert [x["id"] for x in kp("prompts", src, "--dataset", "B5").records()][0] == "ignored"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"uid": ["x"], "prompt": "p"}\n')
    r = kp("prompts", bad, "--id-field", "uid")
    assert r.code == 2 and r.stderr.strip() == (
        f"kp-prompts: {bad}:1: expected a string or integer id, got array at `$.uid`")


def test_keep_duplicates_numbers_the_repeats(tmp_path):
    src = tmp_path / "q.txt"
    src.write_text("same\nsame\nsame\n")
    recs = kp("prompts", src, "--format", "text", "--keep-duplicates").records()
    ids = [x["id"] for x in recs]
    assert len(set(ids)) == 3 and ids[1] == ids[0] + "-2" and ids[2] == ids[0] + "-3"


def test_jsonl_mixed_formats_detected_per_record(tmp_path):
    src = tmp_path / "mixed.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}]},
        {"instruction": "Translate", "input": "bonjour"},
        {"prompt": "plain prompt", "meta": {"source": "x"}},
        {"text": "text field"},
        {"conversations": [{"role": "user", "content": "role/content sharegpt"}]},
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = kp("prompts", src).records()
    assert [x["messages"][-1]["content"] for x in recs] == [
        "parts", "Translate\n\nbonjour", "plain prompt", "text field", "role/content sharegpt"]
    assert recs[2]["meta"] == {"source": "x"}


def test_system_is_prepended_only_where_missing(tmp_path):
    src = write_json(tmp_path / "s.json", SHAREGPT)
    recs = kp("prompts", src, "--system", "You are Kimi.").records()
    assert recs[0]["messages"][0] == {"role": "system", "content": "You are Kimi."}
    assert recs[1]["messages"][0] == {"role": "system", "content": "Be terse."}


def test_shuffle_is_deterministic_and_limit_samples(tmp_path):
    src = tmp_path / "q.txt"
    src.write_text("".join(f"question {i}\n" for i in range(100)))
    a = kp("prompts", src, "--format", "text", "--shuffle", "--seed", "7", "--limit", "10")
    b = kp("prompts", src, "--format", "text", "--shuffle", "--seed", "7", "--limit", "10")
    c = kp("prompts", src, "--format", "text", "--shuffle", "--seed", "8", "--limit", "10")
    assert a.stdout == b.stdout and a.stdout != c.stdout
    assert len(a.records()) == 10
    texts = [x["messages"][0]["content"] for x in a.records()]
    assert texts != sorted(texts, key=lambda t: int(t.split()[1]))


def test_max_chars_filter_and_limit(tmp_path):
    src = tmp_path / "q.txt"
    src.write_text("short\n" + "x" * 50 + "\nanother\nthird one\n")
    recs = kp("prompts", src, "--format", "text", "--max-chars", "20", "--limit", "2").records()
    assert [x["messages"][0]["content"] for x in recs] == ["short", "another"]


def test_stdin_and_zstd_input_and_output(tmp_path):
    data = zstandard.ZstdCompressor().compress(json.dumps(SHAREGPT).encode())
    out = tmp_path / "p.jsonl.zst"
    r = kp("prompts", "-", "-o", out, input=data)
    assert r.code == 0, r.stderr
    assert r.stdout == b""
    assert [x["id"] for x in read_jsonl(out)] == ["conv-1", "conv-2"]


def test_duplicate_id_with_different_content_is_an_error(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text('{"id": 1, "prompt": "a"}\n{"id": 2, "prompt": "b"}\n{"id": 1, "prompt": "c"}\n')
    out = tmp_path / "out.jsonl"
    r = kp("prompts", src, "-o", out)
    assert r.code == 2
    assert r.stderr.strip() == (f"kp-prompts: {src}:3: duplicate id '1' with different content "
                                f"(first seen at {src}:1)")
    assert not out.exists()


def check_error(tmp_path, content: bytes, expected: str, *args):
    src = tmp_path / "bad.jsonl"
    src.write_bytes(content)
    out = tmp_path / "out.jsonl"
    r = kp("prompts", src, "-o", out, *args)
    assert r.code == 2, r.stderr
    assert r.stderr.strip() == f"kp-prompts: {src}:{expected}"
    assert r.stdout == b"" and not out.exists() and list(tmp_path.iterdir()) == [src]


GOOD = b'{"prompt": "fine"}\n'


def test_error_invalid_utf8(tmp_path):
    check_error(tmp_path, GOOD + b'{"prompt": "caf\xe9"}\n', "2: invalid UTF-8")


def test_error_missing_field(tmp_path):
    """The refusal names the record's fields and the fields each format is detected by (its
    shape is checked, not today's list: a new format must not break this test)."""
    src = tmp_path / "bad.jsonl"
    src.write_bytes(GOOD + b'{"question": "x"}\n')
    r = kp("prompts", src, "-o", tmp_path / "out.jsonl")
    assert r.code == 2 and r.stdout == b"", r.stderr
    said = re.fullmatch(rf"kp-prompts: {re.escape(str(src))}:2: cannot tell the format: the "
                        r"record has `question`; expected a ((?:`\w+`, )*`\w+`) or `(\w+)` field "
                        r"\(or force one with --format\) at `\$`", r.stderr.strip())
    assert said, r.stderr
    named = re.findall(r"`(\w+)`", said[1]) + [said[2]]
    assert {"conversations", "messages", "prompt"} <= set(named) and "question" not in named


def test_error_a_record_broken_over_two_lines(tmp_path):
    check_error(tmp_path, GOOD + b'{"prompt": "a\n' + b'b"}\n' + GOOD,
                "2: not a whole JSON record: the line ends before the record does (a record "
                "broken over two lines, or a line cut short)")


def test_error_wrong_type_names_json_path(tmp_path):
    check_error(tmp_path, GOOD + b'{"conversations": [{"from": "human", "value": 5}]}\n',
                "2: expected a string, got number at `$.conversations[0].value`")


def test_error_unknown_role(tmp_path):
    check_error(tmp_path, b'{"conversations": [{"from": "robot", "value": "x"}]}\n',
                "1: unknown role 'robot' (accepted: system, developer, human, user, gpt, assistant, "
                "chatgpt, bard, bing, model, function_call, observation, tool, function, ipython) "
                "at `$.conversations[0].from`")


def test_error_truncated_final_line(tmp_path):
    check_error(tmp_path, GOOD * 2 + b'{"prompt": "cut he',
                "3: truncated final line (no newline at the end: the file was cut or is still "
                "being written)")


def test_error_empty_file(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_bytes(b"")
    r = kp("prompts", src)
    assert r.code == 2 and r.stderr.strip() == f"kp-prompts: {src}: empty input: no records"


def test_error_in_json_array_names_element_line(tmp_path):
    src = tmp_path / "arr.json"
    src.write_text('[\n  {"prompt": "a"},\n  {"prompt": "b"},\n  {"prompt": 3}\n]\n')
    r = kp("prompts", src)
    assert r.code == 2
    assert r.stderr.strip() == (f"kp-prompts: {src}:4: element 3: expected a string, got number "
                                "at `$.prompt`")
    assert r.stdout == b""


def _conversations(n: int, with_ids: bool) -> list[dict]:
    convs = []
    for i in range(n):
        conv = {"conversations": [
            {"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": f"answer {i}"},
            {"from": "human", "value": f"follow-up {i}"}, {"from": "gpt", "value": "ok"}]}
        if with_ids:
            conv = {"id": f"c{i}", **conv}
        convs.append(conv)
    return convs


def _write_source(path, convs, layout):
    if layout == "one-line":  # what plain json.dump(data, f) writes
        path.write_text(json.dumps(convs))
    elif layout == "pretty":
        path.write_text(json.dumps(convs, indent=2))
    else:
        path.write_text("".join(json.dumps(c) + "\n" for c in convs))


def test_every_layout_gives_one_record_per_element_with_its_own_id(tmp_path):
    """One-line arrays (json.dump), pretty arrays and JSONL of the same data give the same
    records: one per element (two with --turns each), ids distinct, with and without ids."""
    for with_ids in (True, False):
        convs = _conversations(300, with_ids)
        for turns, per_conv in (("last", 1), ("each", 2)):
            outputs = {}
            for layout, name in (("one-line", "a.json"), ("pretty", "b.json"), ("jsonl", "c.jsonl")):
                src = tmp_path / name
                _write_source(src, convs, layout)
                r = kp("prompts", src, "--dataset", "B3", "--turns", turns)
                assert r.code == 0, r.stderr
                recs = r.records()
                assert len(recs) == 300 * per_conv, (layout, turns, with_ids)
                assert len({x["id"] for x in recs}) == 300 * per_conv, (layout, turns, with_ids)
                outputs[layout] = r.stdout
            assert outputs["one-line"] == outputs["pretty"] == outputs["jsonl"], (turns, with_ids)
            if with_ids:
                expected = [f"c{i}" for i in range(300)] if turns == "last" else \
                    [f"c{i}#{k}" for i in range(300) for k in (1, 2)]
                assert [x["id"] for x in r.records()] == expected


def test_one_line_array_error_names_the_element(tmp_path):
    src = tmp_path / "one.json"
    src.write_text(json.dumps([{"prompt": "a"}, {"prompt": "b"}, {"prompt": 3}]))
    r = kp("prompts", src)
    assert r.code == 2 and r.stdout == b""
    assert r.stderr.strip() == (f"kp-prompts: {src}:1: element 3: expected a string, got number "
                                "at `$.prompt`")
    dup = tmp_path / "dup.json"
    dup.write_text(json.dumps([{"id": 7, "prompt": "a"}, {"id": 7, "prompt": "b"}]))
    r = kp("prompts", dup)
    assert r.code == 2
    assert r.stderr.strip() == (f"kp-prompts: {dup}:1: element 2: duplicate id '7' with different "
                                f"content (first seen at {dup}:1 (element 1))")


def test_head_closes_pipe_quietly(tmp_path):
    src = tmp_path / "many.txt"
    src.write_text("".join(f"prompt number {i}\n" for i in range(50000)))
    proc = subprocess.run(
        f"'{BIN}/kp-prompts' --format text '{src}' | head -1", shell=True,
        capture_output=True, timeout=60)
    assert proc.returncode == 0
    assert len(proc.stdout.splitlines()) == 1
    assert json.loads(proc.stdout)["messages"][0]["content"] == "prompt number 0"
    assert b"Traceback" not in proc.stderr and b"Error" not in proc.stderr


def test_unknown_option_is_a_usage_error():
    r = kp("prompts", "--no-such-flag")
    assert r.code == 2 and "No such option" in r.stderr


# --- --turns all, tool and non-text records, the formats of public files -------------------

def test_turns_all_is_the_default_one_record_per_conversation(tmp_path):
    src = write_json(tmp_path / "sharegpt.json", SHAREGPT)
    r = kp("prompts", src, "--dataset", "B3")
    assert r.code == 0, r.stderr
    assert r.records() == [
        {"id": "conv-1", "dataset": "B3", "messages": [{"role": "user", "content": "What is 2+2?"}],
         "follow_ups": ["And 3+3?"]},
        {"id": "conv-2", "dataset": "B3", "messages": [{"role": "system", "content": "Be terse."},
                                                        {"role": "user", "content": "Hello"}]}]
    # the plan's unit beside the records': a conversation asks one request per user turn
    assert r.stderr == "kp-prompts: wrote 2 prompts (3 requests, one per user turn); skipped 1 without a user turn\n"
    assert kp("prompts", src, "--dataset", "B3", "--turns", "all").stdout == r.stdout


def test_old_prompt_records_decode_without_follow_ups():
    decoded = msgspec.json.decode(b'{"id":"a","dataset":"B3","messages":[{"role":"user","content":"Hi"}]}',
                                  type=Prompt)
    assert decoded.follow_ups == []
    assert b"follow_ups" not in encode_line(decoded)  # an empty list is left out, as before


def test_single_turn_prompts_keep_their_hash_ids_under_turns_all(tmp_path):
    """The default changed from `last` to `all`: a prompt without follow-ups keeps the ID
    `last` gave it, so resuming an older output of single-turn data redoes nothing."""
    src = tmp_path / "q.jsonl"
    src.write_text('{"prompt": "Why is the sky blue?"}\n'
                   '{"conversations": [{"from": "system", "value": "Be terse."}, {"from": "human", "value": "Hello"}]}\n')
    assert kp("prompts", src, "--dataset", "B4").stdout == kp("prompts", src, "--dataset", "B4",
                                                              "--turns", "last").stdout
    one = tmp_path / "one.txt"
    one.write_text("Why is the sky blue?\n")
    [rec] = kp("prompts", one, "--format", "text", "--dataset", "B4").records()
    assert rec["id"] == "B4-c661c6ffbf284fbd"  # test_hash_id_formula_is_pinned's, under `all`


OPENAI_TOOLS = [
    {"id": "t1", "messages": [
        {"role": "system", "content": "You can look things up."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Which day?"},
        {"role": "user", "content": "Today."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                                "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "Thanks!"}]},
    {"id": "t2", "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                                                             "function": {"name": "x", "arguments": "{}"}}]},
        {"role": "user", "content": "Hello?"}]},
    {"id": "t3", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "x.png"}}]}]},
    {"id": "t4", "messages": [{"role": "user", "content": "Plain"}, {"role": "assistant", "content": "Yes"}]},
]


def test_turns_all_ends_a_conversation_before_its_first_tool_turn(tmp_path):
    src = tmp_path / "tools.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in OPENAI_TOOLS))
    r = kp("prompts", src)
    assert r.code == 0, r.stderr
    recs = {x["id"]: x for x in r.records()}
    assert recs["t1"]["messages"] == [{"role": "system", "content": "You can look things up."},
                                      {"role": "user", "content": "Weather in Paris?"}]
    assert recs["t1"]["follow_ups"] == ["Today."]  # not "Thanks!": it came after the tool call
    # an assistant turn with tool_calls and content "" is a tool turn, never an empty answer
    assert "follow_ups" not in recs["t2"] and recs["t2"]["messages"] == [{"role": "user", "content": "Hi"}]
    assert sorted(recs) == ["t1", "t2", "t4"]  # t3's only user turn holds an image
    assert r.stderr == (f"kp-prompts: wrote 3 prompts (4 requests, one per user turn); "
                        f"skipped 1 with a non-text part ({src}:3); "
                        f"2 conversations ended early, before a turn that is not plain text "
                        f"(first: {src}:1, {src}:2)\n")


def test_tool_and_non_text_records_are_skipped_with_last_and_strict_is_an_error(tmp_path):
    src = tmp_path / "tools.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in OPENAI_TOOLS))
    r = kp("prompts", src, "--turns", "last")
    assert r.code == 0, r.stderr
    assert [x["id"] for x in r.records()] == ["t4"]
    assert r.stderr == (f"kp-prompts: wrote 1 prompt; skipped 2 with a tool turn ({src}:1, {src}:2), "
                        f"1 with a non-text part ({src}:3)\n")
    # The error says what kp-prompts does with the record without --strict: `last` skips
    # it; `all` keeps the conversation up to that turn, or leaves the declaration out.
    for turns, instead in (("last", "the record is skipped"),
                           ("all", "the conversation is kept up to this turn")):
        out = tmp_path / "out.jsonl"
        r = kp("prompts", src, "--turns", turns, "--strict", "-o", out)
        assert r.code == 2 and not out.exists()
        assert r.stderr.strip() == (f"kp-prompts: {src}:1: a tool turn (--strict: kp-prompts reads plain "
                                    f"chat only; without --strict {instead}) at "
                                    "`$.messages[4].tool_calls`")
    glaive = public_source("llamafactory_glaive_toolcall_en_demo.json")
    for turns, instead in (("last", "the record is skipped"), ("all", "the declaration is left out")):
        r = kp("prompts", glaive, "--strict", "--turns", turns)
        assert r.code == 2 and r.stderr.strip() == (
            f"kp-prompts: {glaive}:2: element 1: a tool declaration (--strict: kp-prompts reads plain "
            f"chat only; without --strict {instead}) at `$.tools`")
    image = tmp_path / "image.jsonl"  # t3: its only user turn holds the image
    image.write_text(json.dumps(OPENAI_TOOLS[2]) + "\n")
    r = kp("prompts", image, "--strict")
    assert r.code == 2 and "without --strict the record is skipped) at `$.messages[0].content[1]`" in r.stderr


def test_sharegpt_top_level_system_is_kept(tmp_path):
    src = write_json(tmp_path / "lf.json", [
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"},
                           {"from": "human", "value": "Bye"}], "system": "You are a pirate."},
        {"conversations": [{"from": "system", "value": "Own system."}, {"from": "human", "value": "Yo"}],
         "system": "Column system."}])
    for turns, first_len in (("all", 2), ("last", 4)):
        recs = kp("prompts", src, "--turns", turns).records()
        assert recs[0]["messages"][0] == {"role": "system", "content": "You are a pirate."}
        assert len(recs[0]["messages"]) == first_len
        assert recs[1]["messages"][0] == {"role": "system", "content": "Own system."}  # the turn wins


def test_mt_bench_questions_are_one_conversation_each(tmp_path):
    src = public_source("fastchat_mt_bench_question.jsonl")
    recs = kp("prompts", src, "--dataset", "MT").records()
    first = json.loads(src.read_text().splitlines()[0])
    assert [x["id"] for x in recs] == ["81", "82", "101"]
    assert recs[0]["messages"] == [{"role": "user", "content": first["turns"][0]}]
    assert recs[0]["follow_ups"] == first["turns"][1:]


def test_v1_value_parts_and_alpaca_history_are_read(tmp_path):
    src = tmp_path / "v1.jsonl"
    src.write_text(json.dumps({"messages": [
        {"role": "user", "content": [{"type": "text", "value": "Part one. "}, {"type": "text", "value": "Two."}]},
        {"role": "assistant", "content": [{"type": "text", "value": "Ok"}]},
        {"role": "user", "content": [{"type": "text", "value": "More?"}]}]}) + "\n"
        + json.dumps({"instruction": "And now?", "history": [["First q", "First a"]]}) + "\n")
    recs = kp("prompts", src).records()
    assert recs[0]["messages"] == [{"role": "user", "content": "Part one. Two."}]
    assert recs[0]["follow_ups"] == ["More?"]
    assert recs[1]["messages"] == [{"role": "user", "content": "First q"}]
    assert recs[1]["follow_ups"] == ["And now?"]
    last = kp("prompts", src, "--turns", "last").records()
    assert last[1]["messages"] == [{"role": "user", "content": "First q"},
                                   {"role": "assistant", "content": "First a"},
                                   {"role": "user", "content": "And now?"}]


def test_make_finds_a_jsonl_or_zst_source_and_passes_turns(tmp_path):
    """sources/D.jsonl (and .jsonl.zst) are sources, as sources/D.json is; TURNS reaches
    kp-prompts. Only the prompts stage runs: nothing is sent."""
    sources = tmp_path / "sources"
    sources.mkdir()
    rows = public_source("openai_cookbook_toy_chat_fine_tuning.jsonl").read_bytes()
    (sources / "J.jsonl").write_bytes(rows)
    (sources / "Z.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(rows))
    venv = Path(sys.executable).parent.parent
    for turns, follow_ups in (("all", 3), ("last", 0)):
        work = tmp_path / f"work-{turns}"
        targets = [work / "J.prompts.jsonl", work / "Z.prompts.jsonl"]
        proc = subprocess.run(["make", "-C", str(REPO), "--no-print-directory", *map(str, targets),
                               f"SOURCES={sources}", f"WORK={work}", f"VENV={venv}", f"TURNS={turns}",
                               "DATASETS=J Z"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert f"kp-prompts {sources}/J.jsonl --dataset J --turns {turns}" in proc.stdout
        for target in targets:
            recs = read_jsonl(target)
            assert len(recs) == 3 and sum(len(x.get("follow_ups", [])) for x in recs) == follow_ups
