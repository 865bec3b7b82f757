"""The record contract (kimipipe/records.py): each stage's real output, made by running the
commands against the stand-in and the bundled tokenizer, decodes with the next stage's
Struct, holds no field the contract does not declare (besides what it passed through), and
kp-shard's byte-level fast path reads the very field names records.py declares."""

from __future__ import annotations

import json

import msgspec
from conftest import REPO, TOKENIZER_KINDS, kp

from kimipipe.records import (
    Failure,
    Generation,
    Prompt,
    Rejected,
    Response,
    ResponseText,
    TokenIds,
    Tokens,
    Turn,
    Usage,
    decode_passthrough,
    encode_over,
)

SOURCE = REPO / "kimipipe" / "data" / "demo" / "sharegpt.json"


def fields(struct_type) -> set[str]:
    return set(struct_type.__struct_encode_fields__)


def lines(path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines() if line.strip()]


def decode_all(path, struct_type) -> list:
    decoder = msgspec.json.Decoder(struct_type)
    return [decoder.decode(line) for line in lines(path)]


def test_each_stage_output_decodes_with_the_next_stage_struct(standin, tmp_path):
    server = standin(faults={"misroute": 0.3}, seed=5)
    env = {"OPENROUTER_API_KEY": server.api_key}

    # kp-prompts -> Prompt (what kp-infer reads)
    prompts = tmp_path / "prompts.jsonl"
    # --turns last: one request per prompt, so answers + failures = prompts (turns: test_infer_conversations.py)
    r = kp("prompts", SOURCE, "--dataset", "C", "--limit", "24", "--turns", "last", "-o", prompts)
    assert r.code == 0, r.stderr
    assert len(decode_all(prompts, Prompt)) == 24
    assert all(set(json.loads(line)) <= fields(Prompt) for line in lines(prompts))

    # a field another tool added to the prompts passes through every stage
    tagged = tmp_path / "tagged.jsonl"
    tagged.write_bytes(b"".join(line[:-1] + b',"origin":{"tool":"x","n":[1,2]}}\n' for line in lines(prompts)))

    # kp-infer -> Response (what kp-tokenize reads), and Failure lines
    responses, failures = tmp_path / "responses.jsonl", tmp_path / "failures.jsonl"
    r = kp("infer", tagged, "-o", responses, "--failures", failures, "--base-url", server.base_url,
           "--backoff-base", "0.01", "--ignore-provider", "fireworks", "--ignore-provider", "baseten",
           "--max-attempts", "1", env=env)
    assert r.code == 4, r.stderr  # the misrouted answers are failures (no retry left), paid for
    answered = decode_all(responses, Response)
    failed = decode_all(failures, Failure)
    assert answered and failed and len(answered) + len(failed) == 24
    assert all(f.kind == "routing_violation" and f.cost > 0 and f.provider for f in failed)
    for line in lines(responses):
        record = json.loads(line)
        assert record["origin"] == {"tool": "x", "n": [1, 2]}
        assert set(record) == (fields(Prompt) & set(record)) | fields(Generation) | {"origin"}
        assert list(record)[-len(fields(Generation)):] == list(Generation.__struct_encode_fields__)
    assert all(set(json.loads(line)) <= fields(Failure) for line in lines(failures))
    # (a conversation's turn also carries records.Turn: tests/test_infer_conversations.py)
    assert fields(Response) == fields(Prompt) | fields(Turn) | fields(Generation)

    # kp-tokenize -> Tokens (what kp-shard reads), and Rejected lines
    tokens, rejects = tmp_path / "tokens.jsonl", tmp_path / "rejects.jsonl"
    tokenizer = TOKENIZER_KINDS["fast"]
    r = kp("tokenize", responses, "--tokenizer", tokenizer, "-o", tokens, "--workers", "1")
    assert r.code == 0, r.stderr
    token_records = decode_all(tokens, Tokens)
    assert [t.id for t in token_records] == [a.id for a in answered]
    from kimipipe.shard.rows import TokenRecordDecoder

    fast = TokenRecordDecoder()
    for line, response_line in zip(lines(tokens), lines(responses), strict=True):
        record, response = json.loads(line), json.loads(response_line)
        # the stand-in reports usage: each row carries the provider's counts against ours
        assert set(record) == set(response) | {"input_ids", "output_ids", "prompt_tokens_delta",
                                               "completion_tokens_delta"}
        assert list(record)[-2:] == ["input_ids", "output_ids"]  # where kp-shard looks first
        lists = fast.decode(line)
        assert (lists.n_in, lists.n_out) == (len(record["input_ids"]), len(record["output_ids"]))
    r = kp("tokenize", responses, "--tokenizer", tokenizer, "--no-thinking", "-o", tmp_path / "none.jsonl",
           "--rejects", rejects, "--workers", "1")
    assert r.code == 4, r.stderr  # every answer has reasoning: none renders without thinking
    assert [x.id for x in decode_all(rejects, Rejected)] == [a.id for a in answered]

    # kp-shard takes the token records as they are
    shards = tmp_path / "shards"
    r = kp("shard", tokens, "--out", shards)
    assert r.code == 0, r.stderr
    assert kp("shard", "verify", shards).code == 0
    assert json.loads((shards / "kp-shard.manifest").read_text())["totals"]["records"] == len(answered)


def test_kp_shard_fast_path_reads_the_names_records_declares():
    from kimipipe.shard import rows

    for name, key in (("input_ids", rows._INPUT_KEY), ("output_ids", rows._OUTPUT_KEY)):
        assert key == msgspec.json.encode(name)
        assert name in fields(TokenIds) and name in fields(Tokens)
    assert rows._INPUT_OPEN == rows._INPUT_KEY + b":["
    assert rows._OUTPUT_AT_END == b"]," + rows._OUTPUT_KEY + b":["
    # TokenIds writes the two lists last (but for a flag), in the order the end path expects
    assert list(TokenIds.__struct_encode_fields__)[-3:] == ["input_ids", "output_ids",
                                                            "over_max_length"]


def test_response_is_a_prompt_with_the_generation_fields():
    declared = {f.name: (f.type, f.default) for f in msgspec.structs.fields(Response)}
    for part in (Prompt, Generation):
        for f in msgspec.structs.fields(part):
            assert declared[f.name] == (f.type, f.default), f.name
    for f in msgspec.structs.fields(Turn):  # only a conversation's turns have them
        assert declared[f.name] == (f.type | None, None), f.name
    assert set(declared) == fields(Prompt) | fields(Turn) | fields(Generation)


def test_encode_over_keeps_passthrough_and_writes_own_fields_last():
    line = b'{"id":"a","input_ids":[9],"x":{"deep":[1]},"over_max_length":true,"z":1}'
    out = encode_over(decode_passthrough(line), TokenIds(input_ids=[1, 2], output_ids=[3]))
    # the stage owns every field it declares: a stale value is dropped, an omitted default stays out
    assert out == b'{"id":"a","x":{"deep":[1]},"z":1,"input_ids":[1,2],"output_ids":[3]}\n'
    out = encode_over({}, TokenIds(input_ids=[], output_ids=[4], over_max_length=True))
    assert json.loads(out) == {"input_ids": [], "output_ids": [4], "over_max_length": True}
    generation = Generation(response=ResponseText(content="c"), finish_reason=None, model="m",
                            provider=None, generation_id=None, usage=Usage())
    out = json.loads(encode_over(decode_passthrough(b'{"id":"b","attempts":7}'), generation))
    assert out["attempts"] == 1 and list(out)[0] == "id"  # attempts is always written

