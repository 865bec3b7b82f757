"""kp-prompts, run as a user runs it: formats, stable IDs, turn selection, dedup, errors."""

from __future__ import annotations

import hashlib
import json
import subprocess

import zstandard
from conftest import BIN, kp, read_jsonl

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
    check_error(tmp_path, GOOD + b'{"question": "x"}\n',
                "2: cannot tell the format: expected a `conversations`, `messages`, `instruction`, "
                "`prompt`, `text` or `turns` field (or force one with --format) at `$`")


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
