"""The streamed chunk decode (openrouter/client.py StreamAnswer, openrouter/http11.py) against
the per-event decode it replaced (tests/stream_reference.py), and kp-infer's streamed records
against its plain ones.

The lean path decodes only what a chunk needs, several chunks of one read in one call, and
leaves `reasoning_details` undecoded beside `reasoning`; what it keeps must not change. So
every stream the stand-in sends (each fault, quirk and usage shape of OpenRouter's API, and
vLLM's and SGLang's), captured as the raw bytes of its HTTP response, and hand-made streams
for what the stand-in never sends, are read both ways, each split into reads in several
ways, and the Attempts compared byte for byte (each as a msgpack array of its fields).
"""

from __future__ import annotations

import asyncio
import json
import random
import socket

import msgspec
import pytest
from stream_reference import ReferenceAnswer, dechunk, reference_outcome, sse_payloads

from kimipipe.openrouter.answer import StreamAnswer
from kimipipe.openrouter.http11 import Http11Pool, _Connection
from kimipipe.openrouter.outcomes import Broken
from kimipipe.standin.testing import StandIn


def encode(attempt) -> bytes:
    """ATTEMPT as a msgpack array of all its fields: two Attempts equal byte for byte."""
    return msgspec.msgpack.encode(msgspec.structs.astuple(attempt))


def capture(server: StandIn, body: dict, headers: dict | None = None) -> list[bytes]:
    """One streamed completion's raw response from SERVER, as the socket gave it (recv by recv)."""
    data = json.dumps(body).encode()
    path = "/api/v1" if server.mode == "openrouter" else "/v1"
    head = [f"POST {path}/chat/completions HTTP/1.1", "Host: 127.0.0.1", "Connection: close",
            f"Authorization: Bearer {server.api_key}", "Content-Type: application/json",
            f"Content-Length: {len(data)}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    segments = []
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        while True:
            try:
                got = sock.recv(1 << 16)
            except ConnectionResetError:  # a `cut` fault aborts the connection
                break
            if not got:
                break
            segments.append(got)
    return segments


# (live settings of the stand-in, the request's extra fields): every shape of stream it sends
OPENROUTER_CASES = [
    ({}, {}),
    ({}, {"reasoning": {"enabled": False}}),
    ({"stream_usage": "finish-chunk"}, {}),
    ({"faults": {"midstream": 1.0}}, {}),
    ({"faults": {"midstream": 1.0}, "midstream_code": "provider_overloaded"}, {}),
    ({"faults": {"cut": 1.0}}, {}),
    ({"faults": {"error200": 1.0}}, {}),
    ({"faults": {"empty": 1.0}}, {}),
    ({"faults": {"zero": 1.0}}, {}),
    ({"faults": {"misroute": 1.0}}, {}),
    ({"drop_reasoning": {"together": 1.0}}, {}),
    ({"inline_reasoning": ["together"]}, {}),
    ({"unopened_reasoning": ["together"]}, {}),
    ({"no_usage_rate": 1.0}, {}),
    ({"no_cost_rate": 1.0}, {}),
    # token logprobs, each variant the stand-in serves (standin/logprobs.py)
    *(({"logprobs": {"together": variant}}, {"logprobs": True, "top_logprobs": 0})
      for variant in ("all", "content", "null-bytes", "specials", "gap", "bad-bytes")),
]
DEFAULTS = {"faults": {}, "stream_usage": "own-chunk", "midstream_code": "502", "drop_reasoning": {},
            "inline_reasoning": [], "unopened_reasoning": [], "no_usage_rate": 0.0, "no_cost_rate": 0.0, "logprobs": {}}


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> list[tuple[str, list[bytes]]]:
    """(what it is, the raw response in the reads it came in) for ~60 streams."""
    out = []
    prompts = [(f"Tell me about {i}", max_tokens) for i, max_tokens in enumerate((8, 40, 400))]
    with StandIn(seed=11, workdir=tmp_path_factory.mktemp("standin")) as server:
        for settings, extra in OPENROUTER_CASES:
            server.configure(**{**DEFAULTS, **settings})
            for text, max_tokens in prompts:
                body = {"model": "moonshotai/kimi-k2.5", "stream": True, "max_tokens": max_tokens,
                        "messages": [{"role": "user", "content": text}],
                        "provider": {"only": ["together"]}, **extra}
                out.append((f"{settings} {extra} max_tokens={max_tokens}", capture(server, body)))
    for mode in ("vllm", "sglang"):
        with StandIn(mode=mode, seed=11, workdir=tmp_path_factory.mktemp(mode)) as server:
            for text, max_tokens in prompts:
                body = {"model": "moonshotai/kimi-k2.5", "stream": True, "max_tokens": max_tokens,
                        "messages": [{"role": "user", "content": text}],
                        "stream_options": {"include_usage": True}}
                if mode == "vllm":
                    body["return_token_ids"] = True
                else:
                    body["return_input_ids_in_sglext"] = body["return_output_ids_in_sglext"] = True
                out.append((f"{mode} max_tokens={max_tokens}", capture(server, body)))
    return out


def feed(pieces: list[bytes]):
    """PIECES (one whole response) into a connection read by read; the outcome, as Attempt
    bytes or "broken"."""
    class Transport:
        def write(self, data):
            pass

        def abort(self):
            pass

        def is_closing(self):
            return False

    async def run():
        conn = _Connection(Http11Pool("http://127.0.0.1:9/api/v1/chat/completions", {}))
        conn.connection_made(Transport())
        future = asyncio.get_running_loop().create_future()
        conn.start(b"POST ...", future, StreamAnswer())
        for piece in pieces:
            conn.data_received(piece)
        if not future.done():
            conn.connection_lost(None)
        return future.result()

    outcome = asyncio.run(run())
    return "broken" if isinstance(outcome, Broken) else encode(outcome)


def splits(raw: bytes, segments: list[bytes], rng: random.Random) -> dict[str, list[bytes]]:
    cuts = sorted(rng.sample(range(1, len(raw)), min(40, len(raw) - 1)))
    return {
        "as received": segments,
        "one read": [raw],
        "every 7 bytes": [raw[i:i + 7] for i in range(0, len(raw), 7)],
        "every 1500 bytes": [raw[i:i + 1500] for i in range(0, len(raw), 1500)],
        "random cuts": [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)],
    }


def expected(raw: bytes):
    outcome = reference_outcome(raw)
    return outcome if outcome == "broken" else encode(outcome)


def test_the_standins_streams_come_out_as_the_per_event_decode_made_them(captured):
    rng = random.Random(5)
    kinds = set()
    for what, segments in captured:
        raw = b"".join(segments)
        assert raw.startswith(b"HTTP/1.1 200"), (what, raw[:200])
        want = expected(raw)
        kinds.add("broken" if want == "broken" else msgspec.msgpack.decode(want)[0])
        for how, pieces in splits(raw, segments, rng).items():
            assert feed(pieces) == want, (what, how)
    assert kinds == {"ok", "retry", "broken"}  # answers, faults and cuts were all compared


def test_several_chunks_in_one_call_come_out_as_one_by_one(captured):
    """A read that brings many chunks hands them over at once (one decoder call)."""
    for what, segments in captured:
        raw = b"".join(segments)
        want = expected(raw)
        if want == "broken":
            continue
        data = raw[raw.index(b"\r\n\r\n") + 4:]
        payloads = sse_payloads(dechunk(data)[0])
        for size in (2, 3, len(payloads)):
            answer, outcome = StreamAnswer(), None
            for i in range(0, len(payloads), size):
                outcome = answer.events(payloads[i:i + size])
                if outcome is not None:
                    break
            outcome = outcome or answer.end()
            assert encode(outcome) == want, (what, size)


def chunk(delta=None, finish=None, **top) -> dict:
    choice = {"index": 0, "delta": delta if delta is not None else {}, "finish_reason": finish}
    return {"id": "gen-9", "provider": "Moonshot AI", "model": "moonshotai/kimi-k2.5",
            "choices": [choice], **top}


USAGE = {"id": "gen-9", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}
DETAILS = [{"type": "reasoning.text", "text": "plan "}, {"type": "reasoning.summary", "summary": "s"}]

# Streams the stand-in never sends, as lists of `data:` payloads (dicts are JSON-encoded).
HAND_MADE = {
    "reasoning only in reasoning_details": [
        chunk({"content": "", "reasoning_details": DETAILS}), chunk({"content": "x"}),
        chunk({}, "stop"), USAGE, "[DONE]"],
    "reasoning_details null, empty, beside reasoning": [
        chunk({"reasoning_details": None}), chunk({"reasoning_details": []}),
        chunk({"reasoning": "r ", "reasoning_details": DETAILS}), chunk({"content": "c"}, "stop"),
        USAGE, "[DONE]"],
    "reasoning_content (vLLM, SGLang)": [
        chunk({"reasoning_content": "think "}), chunk({"content": "done"}, "length"), USAGE, "[DONE]"],
    "no id before the third chunk": [
        {"choices": [{"delta": {"content": "a"}}]}, {"provider": "P1", "choices": []},
        chunk({"content": "b"}, "stop", provider="P2"), USAGE, "[DONE]"],
    "no id at all": [
        {"provider": "P1", "choices": [{"delta": {"content": "a"}, "finish_reason": "stop"}]},
        {"provider": "P2", "model": "m", "choices": []}, USAGE, "[DONE]"],
    "two choices": [
        {"id": "g", "choices": [{"delta": {"content": "a"}}, {"delta": {"reasoning": "r"}}]},
        {"id": "g", "choices": [{"delta": {}, "finish_reason": "stop"}, {"delta": {"content": "b"}}]},
        USAGE, "[DONE]"],
    "choices null, a comment's neighbour": [
        {"id": "g", "choices": None}, chunk({"content": "z"}, "stop"), USAGE, "[DONE]"],
    "chunks after [DONE] are not read": [
        chunk({"content": "a"}, "stop"), USAGE, "[DONE]", chunk({"content": "late"}), "not json"],
    "[DONE] with spaces, data: without its space, CRLF": [
        b'data:{"id":"g","choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}\r\n\r\n',
        USAGE, b"data:   [DONE]  \r\n\r\n"],
    "token IDs per chunk, prompt IDs first": [
        chunk({"content": "a"}, prompt_token_ids=[1, 2]) | {"choices": [{"delta": {"content": "a"}, "token_ids": [5]}]},
        {"id": "gen-9", "choices": [{"delta": {"content": "b"}, "token_ids": [6, 7], "finish_reason": "stop"}]},
        USAGE, "[DONE]"],
    "bad JSON after output": [chunk({"content": "a"}), "{not json", chunk({}, "stop"), USAGE, "[DONE]"],
    "two objects in one payload": [chunk({"content": "a"}), '{"id":"g"},{"id":"h"}', USAGE, "[DONE]"],
    "an empty payload": [chunk({"content": "a"}), "", chunk({}, "stop"), USAGE, "[DONE]"],
    "a payload that is not an object": [chunk({"content": "a"}), "[1, 2]", USAGE, "[DONE]"],
    "content of the wrong type": [chunk({"content": 5}), USAGE, "[DONE]"],
    "reasoning_details of the wrong type, read": [chunk({"reasoning_details": "x"}), USAGE, "[DONE]"],
    "an error chunk after output": [
        chunk({"content": "a"}), {"id": "g", "error": {"code": 502, "message": "boom"}}, "[DONE]"],
    "an error in a choice": [
        chunk({"content": "a"}), {"id": "g", "choices": [{"error": {"code": 429, "message": "slow"}}]}],
    "finish_reason error": [chunk({"content": "a"}), chunk({}, "error"), "[DONE]"],
    "an error before any output": [{"id": "g", "error": {"code": 401, "message": "no"}}],
    "usage in the finish chunk, no [DONE]": [
        chunk({"content": "a"}), chunk({}, "stop", usage={"prompt_tokens": 1, "completion_tokens": 1})],
    "SGLang's IDs in a chunk of their own": [
        chunk({"reasoning_content": "r"}), chunk({"content": "c"}, "stop"),
        {"id": "g", "choices": [], "sglext": {"input_ids": [1], "output_ids": [[2, 3]]}}, USAGE, "[DONE]"],
}


def sse(payloads: list) -> list[bytes]:
    """One event per payload: a dict as JSON, a str as it is, bytes as the whole event."""
    return [p if isinstance(p, bytes) else
            b"data: " + (p if isinstance(p, str) else json.dumps(p, ensure_ascii=False)).encode()
            + b"\n\n" for p in payloads]


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def http_chunks(events: list[bytes]) -> list[bytes]:
    """Each event its own HTTP chunk (as OpenRouter writes them), then the last chunk."""
    return [f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events] + [b"0\r\n\r\n"]


def response(events: list[bytes]) -> bytes:
    return SSE_HEAD + b"".join(http_chunks(events))


@pytest.mark.parametrize("name", sorted(HAND_MADE))
def test_hand_made_streams_come_out_as_the_per_event_decode_made_them(name):
    events = sse(HAND_MADE[name])
    events.insert(1, b": OPENROUTER PROCESSING\n\n")
    raw = response(events)
    want = expected(raw)
    reads = http_chunks(events)
    reads[0] = SSE_HEAD + reads[0]
    for how, pieces in splits(raw, reads, random.Random(name)).items():
        assert feed(pieces) == want, how
    # and the whole body as one HTTP chunk (every event in one callback of one read)
    assert feed([response([b"".join(events)])]) == want


def test_a_malformed_field_that_is_never_read_no_longer_fails_the_chunk():
    """The one difference from the per-event decode, and on purpose: it validated every
    field of every chunk, so a later chunk's `id` of the wrong type, or a `reasoning_details`
    beside the `reasoning` it repeats, made the whole answer a bad_json retry. The lean
    decode reads neither from such a chunk (both are skipped, unvalidated), so the answer
    is kept. A field that is read is still checked (the hand-made streams above)."""
    payloads = sse([chunk({"content": "a"}), chunk({"reasoning": "r", "reasoning_details": "x"}) | {"id": 5},
                    chunk({}, "stop"), USAGE, "[DONE]"])
    raw = response(payloads)
    assert msgspec.msgpack.decode(expected(raw))[:2] == ["retry", "bad_json"]
    attempt = msgspec.msgpack.decode(feed([raw]))
    assert attempt[0] == "ok"
    answer = ReferenceAnswer()  # the same stream without the malformed fields: the same answer
    for p in sse_payloads(b"".join(sse([chunk({"content": "a"}), chunk({"reasoning": "r"}),
                                        chunk({}, "stop"), USAGE, "[DONE]"]))):
        if (outcome := answer.event(p)) is not None:
            break
    assert encode(outcome) == feed([raw])


def test_streamed_records_through_paced_turns_are_the_plain_records(standin, tmp_path, kp_run):
    """End to end: the same prompts streamed with more streams open than PACE_FROM (so
    kp-infer's loop reads in paced turns, several chunks a read), and sent
    plain, to one provider of a stand-in whose answers are a function of the request: the
    records are the same but for what names the generation and when it ended."""
    from kimipipe.infer.transport import PACE_FROM

    prompts = tmp_path / "prompts.jsonl"
    n = PACE_FROM + 32
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "dataset": "d", "messages": [
        {"role": "user", "content": f"Stream {i} of {n}"}]}) + "\n" for i in range(n)))
    server = standin(latency=0.5, tokens_per_second=400)
    records = {}
    for mode in ("--stream", "--no-stream"):
        out = tmp_path / f"out{mode}.jsonl"
        r = kp_run("infer", prompts, "-o", out, "--base-url", server.base_url, "-q", mode,
                   "--concurrency", n, "--max-tokens", 200,
                   "--only-provider", "moonshotai", env={"OPENROUTER_API_KEY": server.api_key})
        assert r.code == 0, r.stderr
        rows = sorted((json.loads(line) for line in out.read_text().splitlines()),
                      key=lambda row: row["id"])
        for row in rows:
            for key in ("generation_id", "latency_s", "finished_at"):
                row.pop(key)
        records[mode] = rows
    assert len(records["--stream"]) == n
    assert records["--stream"] == records["--no-stream"]
    assert {row["finish_reason"] for row in records["--stream"]} == {"stop", "length"}
    assert all(row["response"]["reasoning"] for row in records["--stream"])


def test_an_event_line_past_the_limit_breaks_the_stream():
    """A 200 that never ends its line is not a stream: past 16 MiB the connection is dropped
    (the line is kept whole meanwhile, whatever the reads it comes in)."""
    from kimipipe.openrouter import http11

    line = b"data: " + b"x" * http11._MAX_EVENT_LINE
    size, end = b"%x\r\n" % len(line), b"\r\n" + b"".join(http_chunks([]))  # a whole response
    for pieces in ([SSE_HEAD + size + line + end], [SSE_HEAD, size, line[:99], line[99:], end]):
        assert feed(pieces) == "broken"  # not a `cut` answer: the connection is not reused
    ok = [SSE_HEAD + b"".join(http_chunks(sse([chunk({"content": "a" * 1000}, "stop"), USAGE, "[DONE]"])))]
    assert msgspec.msgpack.decode(feed(ok))[0] == "ok"
