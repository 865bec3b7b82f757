"""The completion transport (kimipipe/openrouter/http11.py, connect.py) and its answer assembly.

Two kinds of test: the parser fed one whole response split at every byte boundary (in the
middle of `data:`, of a UTF-8 character, of a chunk-size line, of a CRLF), and real
sockets: a raw asyncio server on 127.0.0.1 that answers with scripted bytes, written in
separate pieces, so the client meets the same boundaries across TCP segments, plus
closes, stalls, keep-alive reuse and error statuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import shutil
import socket
import ssl
import subprocess
import zlib

import pytest

from kimipipe.openrouter.answer import StreamAnswer
from kimipipe.openrouter.client import CompletionClient
from kimipipe.openrouter.http11 import Http11Pool, _Connection
from kimipipe.openrouter.outcomes import Broken, CollectedResponse

KEY = "sk-or-test"


def event(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def delta_event(**delta) -> bytes:
    return event({"id": "gen-1", "provider": "Moonshot AI", "model": "moonshotai/kimi-k2.5",
                  "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})


FINISH = event({"id": "gen-1", "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}]})
USAGE = event({"id": "gen-1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5,
                                                        "cost": 0.25,
                                                        "completion_tokens_details": {"reasoning_tokens": 2}}})
DONE = b"data: [DONE]\n\n"
COMMENT = b": OPENROUTER PROCESSING\n\n"

# Reasoning then content, with multi-byte UTF-8 (CJK, emoji, accents) and CRLF line ends.
EVENTS = [
    COMMENT,
    delta_event(content="", reasoning="思考 "),
    delta_event(content="", reasoning="café 🙂"),
    COMMENT,
    delta_event(content="数据 "),
    delta_event(content="résumé 🚀").replace(b"\n\n", b"\r\n\r\n"),
    delta_event(content=" done").replace(b"data: ", b"data:"),  # the space is optional
    FINISH, USAGE, DONE,
]


def chunked(pieces: list[bytes], extension: bool = False) -> bytes:
    out = b""
    for p in pieces:
        out += f"{len(p):x}{';ext=1' if extension else ''}\r\n".encode() + p + b"\r\n"
    return out + b"0\r\nX-Trailer: 1\r\n\r\n"


def head(status: int = 200, **headers) -> bytes:
    lines = [f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


SSE_HEAD = head(200, Content_Type="text/event-stream", Transfer_Encoding="chunked")
RESPONSE = SSE_HEAD + chunked(EVENTS, extension=True)


def check_answer(attempt) -> None:
    assert attempt.kind == "ok", attempt
    assert attempt.content == "数据 résumé 🚀 done"
    assert attempt.reasoning == "思考 café 🙂"
    assert attempt.chunks == 7  # data: lines with JSON (not comments, not [DONE])
    assert (attempt.prompt_tokens, attempt.completion_tokens, attempt.reasoning_tokens) == (7, 5, 2)
    assert attempt.cost == 0.25 and attempt.finish_reason == "stop"
    assert (attempt.generation_id, attempt.provider) == ("gen-1", "Moonshot AI")


# -- the parser, every split ----------------------------------------------------------------

class _FakeTransport:
    def __init__(self):
        self.written = b""
        self.aborted = False

    def write(self, data):
        self.written += data

    def abort(self):
        self.aborted = True

    def is_closing(self):
        return self.aborted


def feed(pieces: list[bytes]):
    """Feed one response to a parser in PIECES; return (outcome, connection, pool)."""
    async def run():
        pool = Http11Pool("http://127.0.0.1:9/api/v1/chat/completions", {})
        conn = _Connection(pool)
        conn.connection_made(_FakeTransport())
        future = asyncio.get_running_loop().create_future()
        conn.start(b"POST ...", future, StreamAnswer())
        for piece in pieces:
            conn.data_received(piece)
        if not future.done():
            conn.connection_lost(None)
        return future.result(), conn, pool

    return asyncio.run(run())


def as_attempt(outcome):
    from kimipipe.openrouter.attempt import Attempt
    assert isinstance(outcome, Attempt), outcome
    return outcome


def test_one_piece_gives_the_whole_answer_and_keeps_the_connection():
    outcome, conn, pool = feed([RESPONSE])
    check_answer(as_attempt(outcome))
    assert pool._idle == [conn] and not conn.transport.aborted  # read to its end: reusable


def test_every_two_piece_split():
    for cut in range(1, len(RESPONSE)):
        outcome, conn, pool = feed([RESPONSE[:cut], RESPONSE[cut:]])
        check_answer(as_attempt(outcome))
        assert pool._idle == [conn], cut


def test_one_byte_at_a_time():
    outcome, conn, pool = feed([RESPONSE[i:i + 1] for i in range(len(RESPONSE))])
    check_answer(as_attempt(outcome))
    assert pool._idle == [conn]


def test_splits_land_inside_data_a_utf8_character_and_a_size_line():
    # the boundaries this suite is about, named, so a change to RESPONSE can't lose them
    assert b"dat" in RESPONSE and "🙂".encode()[:2] in RESPONSE
    for marker in (b"data:", "🙂".encode(), b";ext=1\r\n", b"\r\n0\r\n"):
        at = RESPONSE.index(marker) + len(marker) // 2
        outcome, _, _ = feed([RESPONSE[:at], RESPONSE[at:]])
        check_answer(as_attempt(outcome))


def test_content_length_and_until_close_bodies():
    body = b"".join(EVENTS)
    outcome, conn, pool = feed([head(200, Content_Length=len(body)) + body[:50], body[50:]])
    check_answer(as_attempt(outcome))
    assert pool._idle == [conn]
    outcome, conn, pool = feed([head(200, Content_Type="text/event-stream") + body[:99], body[99:]])
    check_answer(as_attempt(outcome))  # decided at [DONE]; the connection ends the body
    assert pool._idle == []


def test_reasoning_details_fallback():
    details = [{"type": "reasoning.text", "text": "plan ", "format": "unknown"},
               {"type": "reasoning.summary", "summary": "skip me"}]
    events = [delta_event(content="", reasoning_details=details), delta_event(content="x"),
              FINISH, USAGE, DONE]
    attempt = as_attempt(feed([SSE_HEAD + chunked(events)])[0])
    assert attempt.kind == "ok" and attempt.reasoning == "plan " and attempt.content == "x"


@pytest.mark.parametrize(("events", "cause"), [
    ([event({"id": "g", "error": {"code": 502, "message": "Provider returned error"}})], "error200"),
    ([delta_event(content="part"),
      event({"id": "g", "error": {"code": 502, "message": "boom"},
             "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]})], "midstream"),
    ([event({"id": "g", "choices": []}), DONE], "empty"),
    ([delta_event(content="part"), DONE], "cut"),             # no finish_reason: partial
    ([delta_event(content="part"), FINISH], "cut"),           # no [DONE] and no usage
    ([b"data: {not json\n\n"], "bad_json"),
])
def test_stream_faults_are_classified(events, cause):
    attempt = as_attempt(feed([SSE_HEAD + chunked(events)])[0])
    assert (attempt.kind, attempt.cause) == ("retry", cause)
    assert attempt.content == ""  # partial text is never returned


def test_connection_lost_mid_chunk_is_a_cut_and_not_reused():
    outcome, conn, pool = feed([RESPONSE[:RESPONSE.index("café".encode())]])
    assert isinstance(outcome, Broken) and outcome.cut
    assert pool._idle == []


def test_error_status_body_is_collected_whole():
    body = json.dumps({"error": {"code": 429, "message": "slow down"}}).encode()
    outcome, conn, pool = feed([head(429, Retry_After="3", Transfer_Encoding="chunked")
                                + chunked([body[:10], body[10:]])])
    assert isinstance(outcome, CollectedResponse) and outcome.status == 429
    assert json.loads(outcome.body) == {"error": {"code": 429, "message": "slow down"}}
    assert outcome.headers["retry-after"] == "3" and pool._idle == [conn]


def test_bad_framing_breaks_the_connection():
    outcome, conn, _ = feed([SSE_HEAD + b"zz\r\n"])
    assert isinstance(outcome, Broken) and conn.transport.aborted
    outcome, conn, _ = feed([b"SSH-2.0-OpenSSH\r\n\r\n"])
    assert isinstance(outcome, Broken) and not outcome.cut


# -- real sockets ---------------------------------------------------------------------------

class ScriptedServer:
    """A raw HTTP/1.1 server on 127.0.0.1: each request is answered by the next script,
    a list of byte pieces (written one by one, with a pause so they arrive as separate
    segments) and then "keep" (wait for the next request), "close" or "hang"."""

    def __init__(self, scripts: list[tuple[list[bytes], str]], ssl_context=None,
                 host: str = "127.0.0.1", port: int = 0):
        self.scripts = list(scripts)
        self.ssl_context = ssl_context
        self.host, self.listen_port = host, port
        self.connections = 0
        self.requests: list[bytes] = []

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, self.host, self.listen_port,
                                                 ssl=self.ssl_context)
        self.port = self.server.sockets[0].getsockname()[1]
        scheme = "https" if self.ssl_context else "http"
        self.base_url = f"{scheme}://127.0.0.1:{self.port}/api/v1"
        return self

    async def __aexit__(self, *exc):
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.connections += 1
        try:
            while self.scripts:
                head_bytes = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head_bytes.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                self.requests.append(head_bytes + await reader.readexactly(length))
                pieces, then = self.scripts.pop(0)
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.005)
                if then == "hang":
                    await asyncio.sleep(30)
                if then != "keep":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def pieces_at(data: bytes, markers: list[bytes]) -> list[bytes]:
    """DATA split in the middle of each marker (first occurrence after the previous cut)."""
    out, start = [], 0
    for marker in markers:
        at = data.index(marker, start) + max(1, len(marker) // 2)
        out.append(data[start:at])
        start = at
    return out + [data[start:]]


AWKWARD = pieces_at(RESPONSE, [b"HTTP/1.1 2", b"\r\n\r\n", b";ext=1", b"data:", "思".encode(),
                               "🙂".encode(), b"\r\n\r\n", b"[DONE]", b"\r\n0\r\n", b"X-Trailer"])


async def until(condition, what: str, timeout: float = 30.0) -> None:
    """Wait for CONDITION (polled); the deadline only guards against a hang."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def back_in_pool(pool) -> None:
    """A streamed answer is decided at [DONE]; its connection returns to the pool once the
    body's last bytes (sent after pauses here) have arrived, or is closed."""
    await until(lambda: not pool._active, "the connection to be released")


def run_client(server_scripts, requests: int = 1, idle_timeout: float = 5.0):
    async def go():
        async with ScriptedServer(server_scripts) as server:
            async with CompletionClient(server.base_url, KEY, idle_timeout=idle_timeout) as client:
                results = []
                for _ in range(requests):
                    results.append(await client.attempt(b'{"stream": true}', True))
                    await back_in_pool(client._pool)
            return results, server

    return asyncio.run(go())


def test_real_socket_awkward_boundaries_then_keep_alive_reuse():
    (first, second), server = run_client([(AWKWARD, "keep"), ([RESPONSE], "keep")], requests=2)
    check_answer(first)
    check_answer(second)
    assert server.connections == 1  # the second request reused the first connection
    request = server.requests[0]
    assert request.startswith(b"POST /api/v1/chat/completions HTTP/1.1\r\n")
    assert f"Authorization: Bearer {KEY}".encode() in request and request.endswith(b'{"stream": true}')


def test_real_socket_connection_the_server_closed_after_an_answer_is_not_reused():
    async def go():
        async with ScriptedServer([([RESPONSE], "close"), ([RESPONSE], "keep")]) as server:
            async with CompletionClient(server.base_url, KEY) as client:
                first = await client.attempt(b"{}", True)
                await back_in_pool(client._pool)
                await until(lambda: not client._pool._idle or client._pool._idle[0].closed,
                            "the server's close to arrive")
                second = await client.attempt(b"{}", True)
            return first, second, server.connections

    first, second, connections = asyncio.run(go())
    check_answer(first)
    check_answer(second)
    assert connections == 2


def test_real_socket_cut_stream_is_a_retryable_cut():
    (attempt,), _ = run_client([(AWKWARD[:5], "close")])
    assert (attempt.kind, attempt.cause) == ("retry", "cut") and attempt.content == ""


def test_real_socket_heartbeats_alone_stall_out():
    script = [SSE_HEAD] + [chunked([COMMENT])[:-len(b"0\r\nX-Trailer: 1\r\n\r\n")]] * 20
    (attempt,), _ = run_client([(script, "hang")], idle_timeout=0.3)
    assert (attempt.kind, attempt.cause) == ("retry", "timeout")


def test_real_socket_no_head_at_all_stalls_out():
    (attempt,), _ = run_client([([], "hang")], idle_timeout=0.3)
    assert (attempt.kind, attempt.cause) == ("retry", "timeout")


def test_real_socket_error_statuses():
    body = gzip.compress(json.dumps({"error": {"code": 402, "message": "Insufficient credits"}}).encode())
    scripts = [
        ([head(429, Retry_After="7", Content_Length=2) + b"{}"], "keep"),
        ([head(402, Content_Encoding="gzip", Content_Length=len(body)) + body], "keep"),
        ([head(503, Transfer_Encoding="chunked") + chunked([b"upstream down"])], "keep"),
    ]
    (a429, a402, a503), server = run_client(scripts, requests=3)
    assert (a429.kind, a429.status, a429.retry_after) == ("retry", 429, 7.0)
    assert (a402.kind, a402.message) == ("payment", "Insufficient credits")
    assert (a503.kind, a503.cause) == ("retry", "503")
    assert server.connections == 1


def test_refused_connection_is_a_connection_retry():
    async def go():
        with refusing_address() as (_, port):
            async with CompletionClient(f"http://127.0.0.1:{port}/api/v1", KEY) as client:
                return await client.attempt(b"{}", True)

    attempt = asyncio.run(go())
    assert (attempt.kind, attempt.cause) == ("retry", "connection")


# -- plain (non-streamed) bodies over the same connections ----------------------------------

PLAIN_BODY = json.dumps({
    "id": "gen-2", "provider": "Moonshot AI", "model": "moonshotai/kimi-k2.5",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "数据 🚀", "reasoning": "思考"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 4, "cost": 0.5},
}, ensure_ascii=False).encode()


def check_plain(attempt) -> None:
    assert attempt.kind == "ok", attempt
    assert (attempt.content, attempt.reasoning, attempt.finish_reason) == ("数据 🚀", "思考", "stop")
    assert (attempt.prompt_tokens, attempt.completion_tokens, attempt.cost) == (3, 4, 0.5)


def run_plain(scripts, requests: int = 1, idle_timeout: float = 5.0):
    async def go():
        async with ScriptedServer(scripts) as server:
            async with CompletionClient(server.base_url, KEY, idle_timeout=idle_timeout) as client:
                results = []
                for _ in range(requests):
                    results.append(await client.attempt(b'{"stream": false}', False))
            return results, server

    return asyncio.run(go())


def test_plain_bodies_length_chunked_gzip_and_until_close():
    gz = gzip.compress(PLAIN_BODY)
    with_length = head(200, Content_Length=len(PLAIN_BODY)) + PLAIN_BODY
    scripts = [
        (pieces_at(with_length, [b"\r\n\r\n", "数".encode(), "🚀".encode()]), "keep"),
        (pieces_at(head(200, Transfer_Encoding="chunked") + chunked([PLAIN_BODY[:30], PLAIN_BODY[30:]]),
                   ["思".encode(), b"\r\n0"]), "keep"),
        ([head(200, Content_Encoding="gzip", Content_Length=len(gz)) + gz[:20], gz[20:]], "keep"),
        ([head(200, Content_Type="application/json") + PLAIN_BODY[:40], PLAIN_BODY[40:]], "close"),
    ]
    results, server = run_plain(scripts, requests=4)
    for attempt in results:
        check_plain(attempt)
    assert server.connections == 1  # the first three on one connection; the last ends it
    assert b"Accept: application/json" in server.requests[0]


def test_plain_faults():
    half = head(200, Content_Length=len(PLAIN_BODY)) + PLAIN_BODY[:50]
    empty_choices = json.dumps({"id": "g", "choices": []}).encode()
    error_body = json.dumps({"id": "g", "error": {"code": 502, "message": "upstream"}}).encode()
    scripts = [
        ([half], "close"),                                                        # cut
        ([head(200, Content_Length=len(empty_choices)) + empty_choices], "keep"),  # empty
        ([head(200, Content_Length=len(error_body)) + error_body], "keep"),        # error200
        ([head(200, Content_Length=4) + b"{not"], "keep"),                         # bad_json
    ]
    results, _ = run_plain(scripts, requests=4)
    assert [(a.kind, a.cause) for a in results] == [
        ("retry", "cut"), ("retry", "empty"), ("retry", "error200"), ("retry", "bad_json")]


def test_plain_silence_is_a_timeout_but_slow_bytes_are_not():
    trickle = head(200, Content_Length=len(PLAIN_BODY)) + PLAIN_BODY
    slow = [trickle[i:i + 40] for i in range(0, len(trickle), 40)]  # 5 ms apart, under the limit
    (ok, stalled), _ = run_plain([(slow, "keep"), ([head(200, Content_Length=10)], "hang")],
                                 requests=2, idle_timeout=0.3)
    check_plain(ok)
    assert (stalled.kind, stalled.cause) == ("retry", "timeout")


# -- TLS (what OpenRouter speaks) -------------------------------------------------------------

@pytest.fixture
def certificate(tmp_path):
    if not shutil.which("openssl"):
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    return server, client


def test_tls_stream_and_plain_on_one_connection(certificate):
    server_ctx, client_ctx = certificate

    async def go():
        scripts = [(AWKWARD, "keep"), ([head(200, Content_Length=len(PLAIN_BODY)) + PLAIN_BODY], "keep")]
        async with ScriptedServer(scripts, ssl_context=server_ctx) as server:
            pool = Http11Pool(server.base_url + "/chat/completions", {}, ssl_context=client_ctx)
            async with pool:
                streamed = await pool.post(b"{}", StreamAnswer())
                await back_in_pool(pool)
                plain = await pool.post(b"{}")
            return streamed, plain, server.connections

    streamed, plain, connections = asyncio.run(go())
    check_answer(streamed)
    assert isinstance(plain, CollectedResponse) and plain.status == 200 and plain.body == PLAIN_BODY
    assert connections == 1


def test_tls_untrusted_certificate_is_refused(certificate):
    server_ctx, _ = certificate

    async def go():
        async with ScriptedServer([([RESPONSE], "keep")], ssl_context=server_ctx) as server:
            async with CompletionClient(server.base_url, KEY) as client:  # system trust store
                return await client.attempt(b"{}", True)

    attempt = asyncio.run(go())
    assert (attempt.kind, attempt.cause) == ("retry", "connection")
    assert "certificate" in attempt.message.lower()


# -- RFC 9112: what a strict client must do ---------------------------------------------------

@pytest.mark.parametrize("size", [b"-1", b"0x1a", b"1_0", b" 1a", b"1a ", b"+1a", b""])
def test_chunk_sizes_are_plain_hex_digits(size):
    body = delta_event(content="x")
    outcome, conn, pool = feed([SSE_HEAD + size + b"\r\n" + body + b"\r\n0\r\n\r\n"])
    assert isinstance(outcome, Broken) and outcome.cut and "chunk size" in outcome.message
    assert conn.transport.aborted and pool._idle == []


@pytest.mark.parametrize("length", [b"-1", b"0x1a", b"1_0", b"+26", b"26, 26", b"2 6"])
def test_content_length_is_plain_digits(length):
    body = b"x" * 26
    outcome, conn, pool = feed([b"HTTP/1.1 429 Error\r\nContent-Length: " + length + b"\r\n\r\n" + body])
    assert isinstance(outcome, Broken) and "content-length" in outcome.message.lower()
    assert conn.transport.aborted and pool._idle == []


def test_two_content_lengths_are_an_error():
    outcome, conn, _ = feed([b"HTTP/1.1 429 Error\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}"])
    assert isinstance(outcome, Broken) and conn.transport.aborted


@pytest.mark.parametrize("order", ["cl-first", "te-first"])
def test_content_length_with_chunked_is_an_error_and_the_connection_closes(order):
    te, cl = b"Transfer-Encoding: chunked\r\n", b"Content-Length: 5\r\n"
    fields = cl + te if order == "cl-first" else te + cl
    outcome, conn, pool = feed([b"HTTP/1.1 200 OK\r\n" + fields + b"\r\n" + chunked(EVENTS)])
    assert isinstance(outcome, Broken) and "content-length" in outcome.message.lower()
    assert conn.transport.aborted and pool._idle == []


def test_other_transfer_codings_are_refused():
    outcome, conn, _ = feed([head(200, Transfer_Encoding="gzip, chunked") + chunked(EVENTS)])
    assert isinstance(outcome, Broken) and "transfer-encoding" in outcome.message
    assert conn.transport.aborted


def test_obs_fold_header_lines_are_unfolded():
    body = json.dumps({"error": {"code": 429, "message": "slow down"}}).encode()
    response = (b"HTTP/1.1 429 Too Many\r\nX-Note: first\r\n  second\r\n\tthird\r\n"
                b"Retry-After:\r\n 3\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    for cut in (None, response.index(b"\r\n  second") + 1, response.index(b"\tthird")):
        pieces = [response] if cut is None else [response[:cut], response[cut:]]
        outcome, conn, pool = feed(pieces)
        assert isinstance(outcome, CollectedResponse), outcome
        assert outcome.headers["x-note"] == "first second third"
        assert outcome.headers["retry-after"] == "3" and json.loads(outcome.body)["error"]["code"] == 429
        assert pool._idle == [conn]
    # an SSE head with a folded line streams as usual
    folded = SSE_HEAD.replace(b"Content-Type: text/event-stream", b"Content-Type:\r\n text/event-stream")
    check_answer(as_attempt(feed([folded + chunked(EVENTS)])[0]))


def test_whitespace_before_the_first_header_is_refused():
    outcome, conn, _ = feed([b"HTTP/1.1 200 OK\r\n Content-Length: 2\r\n\r\n{}"])
    assert isinstance(outcome, Broken) and conn.transport.aborted


def test_1xx_heads_are_skipped():
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
    outcome, conn, pool = feed([interim[:30], interim[30:] + RESPONSE])
    check_answer(as_attempt(outcome))
    assert pool._idle == [conn]


def test_bytes_after_the_end_of_a_response_close_the_connection():
    outcome, conn, pool = feed([RESPONSE + b"HTTP/1.1 200 OK\r\n\r\n"])
    check_answer(as_attempt(outcome))  # the answer was whole; the connection is not trusted
    assert conn.transport.aborted and pool._idle == []


def test_a_head_over_the_limit_is_refused():
    outcome, conn, _ = feed([b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 70_000 + b"\r\n\r\n"])
    assert isinstance(outcome, Broken) and "head too large" in outcome.message


def test_truncated_gzip_is_detected_even_with_a_matching_length():
    whole = gzip.compress(PLAIN_BODY)
    short = whole[:-12]  # the deflate stream and gzip trailer cut, the length header honest
    outcome, conn, pool = feed_plain([head(200, Content_Encoding="gzip", Content_Length=len(short)) + short])
    assert isinstance(outcome, Broken) and "ends early" in outcome.message and outcome.cut
    assert conn.transport.aborted and pool._idle == []
    outcome, conn, pool = feed_plain([head(200, Content_Encoding="gzip", Transfer_Encoding="chunked")
                                      + chunked([short])])
    assert isinstance(outcome, Broken) and "ends early" in outcome.message
    # until-close: the close ends the body, and the body must end the gzip stream too
    outcome, _, _ = feed_plain([head(200, Content_Encoding="gzip") + short])
    assert isinstance(outcome, Broken) and "ends early" in outcome.message
    outcome, _, _ = feed_plain([head(200, Content_Encoding="gzip") + whole])
    assert isinstance(outcome, CollectedResponse) and outcome.body == PLAIN_BODY


@pytest.mark.parametrize("wbits", [15, -15], ids=["zlib-wrapped", "raw"])
def test_deflate_zlib_wrapped_or_raw(wbits):
    compressor = zlib.compressobj(wbits=wbits)
    data = compressor.compress(PLAIN_BODY) + compressor.flush()
    for cut in (1, 2, 3, len(data) // 2):
        outcome, conn, pool = feed_plain([head(200, Content_Encoding="deflate", Content_Length=len(data))
                                          + data[:cut], data[cut:]])
        assert isinstance(outcome, CollectedResponse) and outcome.body == PLAIN_BODY
        assert pool._idle == [conn]


def test_a_200_to_a_stream_request_that_is_not_a_stream_is_read_whole():
    error = json.dumps({"error": {"code": 502, "message": "Upstream idle timeout"}}).encode()
    outcome, conn, pool = feed([head(200, Content_Type="application/json; charset=utf-8",
                                     Content_Length=len(error)) + error])
    assert isinstance(outcome, CollectedResponse) and outcome.body == error
    assert pool._idle == [conn]


def test_streamed_request_answered_with_json_keeps_its_message():
    error = json.dumps({"error": {"code": 502, "message": "Upstream idle timeout"}}).encode()
    scripts = [([head(200, Content_Type="application/json", Content_Length=len(error)) + error], "keep"),
               ([head(200, Content_Type="application/json", Transfer_Encoding="chunked")
                 + chunked([PLAIN_BODY[:25], PLAIN_BODY[25:]])], "keep")]
    (as_error, as_answer), server = run_client(scripts, requests=2)
    assert (as_error.kind, as_error.cause, as_error.message) == ("retry", "error200", "Upstream idle timeout")
    check_plain(as_answer)  # the server ignored "stream": true and sent the whole answer
    assert server.connections == 1


def feed_plain(pieces: list[bytes]):
    """feed() for a plain (non-streamed) request."""
    async def run():
        pool = Http11Pool("http://127.0.0.1:9/api/v1/chat/completions", {})
        conn = _Connection(pool)
        conn.connection_made(_FakeTransport())
        future = asyncio.get_running_loop().create_future()
        conn.start(b"POST ...", future, None)
        for piece in pieces:
            conn.data_received(piece)
        if not future.done():
            conn.connection_lost(None)
        return future.result(), conn, pool

    return asyncio.run(run())


@pytest.mark.parametrize(("url", "host"), [
    ("https://[2001:db8::1]/api/v1/chat/completions", "[2001:db8::1]"),
    ("http://[::1]/api/v1/chat/completions", "[::1]"),
    ("http://[::1]:8080/api/v1/chat/completions", "[::1]:8080"),
    ("https://openrouter.ai/api/v1/chat/completions", "openrouter.ai"),
    ("https://openrouter.ai:8443/api/v1/chat/completions", "openrouter.ai:8443"),
    ("http://127.0.0.1:80/api/v1/chat/completions", "127.0.0.1"),
])
def test_host_header(url, host):
    pool = Http11Pool(url, {})
    assert f"\r\nHost: {host}\r\n".encode() in pool._stream_head


def test_ipv6_loopback_on_a_real_socket():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")

    async def go():
        scripted = ScriptedServer([([RESPONSE], "keep")], host="::1")
        try:  # bound on port 0, its port read back: no port closed and bound again
            await scripted.__aenter__()
        except OSError:
            pytest.skip("no IPv6 loopback")
        try:
            async with CompletionClient(f"http://[::1]:{scripted.port}/api/v1", KEY) as client:
                attempt = await client.attempt(b"{}", True)
            return attempt, scripted.requests[0]
        finally:
            await scripted.__aexit__(None, None, None)

    attempt, request = asyncio.run(go())
    check_answer(attempt)
    assert b"\r\nHost: [::1]:" in request


@pytest.mark.parametrize("bad", ["sk-or-1\r\nX-Injected: 1", "sk-or-1\nsk-or-2", "sk-or-\x00", "sk-or-\x7f"])
def test_header_values_with_control_characters_are_refused(bad):
    with pytest.raises(ValueError) as error:
        CompletionClient("http://127.0.0.1:9/api/v1", bad)
    assert "Authorization" in str(error.value) and bad not in str(error.value)
    with pytest.raises(ValueError):
        CompletionClient("http://127.0.0.1:9/api/v1", KEY, extra_headers={"X-Title": bad})
    with pytest.raises(ValueError):
        CompletionClient("http://127.0.0.1:9/api/v1", KEY, extra_headers={"Bad Name": "x"})
    with pytest.raises(ValueError):
        Http11Pool("http://127.0.0.1:9/api v1/chat", {})


def test_kp_infer_refuses_a_key_file_with_a_line_break(standin, tmp_path):
    from conftest import kp, write_jsonl

    server = standin(request_log=True)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "dataset": "t", "messages": [{"role": "user", "content": "hi"}]}])
    key_file = tmp_path / "key"
    key_file.write_text(f"{server.api_key}\nX-Injected: 1\n")
    r = kp("infer", prompts, "--base-url", server.base_url, "--api-key-file", key_file, "-o", tmp_path / "r.jsonl")
    assert r.code == 2 and "control character" in r.stderr, r.stderr
    assert server.api_key not in r.stderr and server.requests() == []
    r = kp("credits", "--base-url", server.base_url, "--api-key-file", key_file)
    assert r.code == 2 and "control character" in r.stderr and server.api_key not in r.stderr


# -- a request is sent once; the caller counts every resend ----------------------------------

def test_reused_connection_closed_before_answering_is_a_counted_stale_attempt():
    async def go():
        scripts = [([RESPONSE], "keep"), ([], "close"), ([RESPONSE], "keep")]
        async with ScriptedServer(scripts) as server:
            async with CompletionClient(server.base_url, KEY) as client:
                first = await client.attempt(b"{}", True)
                await back_in_pool(client._pool)
                assert len(client._pool._idle) == 1
                stale = await client.attempt(b"{}", True)
                sent_so_far = len(server.requests)
                third = await client.attempt(b"{}", True)
            return first, stale, sent_so_far, third, server

    first, stale, sent_so_far, third, server = asyncio.run(go())
    check_answer(first)
    assert (stale.kind, stale.cause) == ("retry", "stale") and "kept-alive" in stale.message
    assert sent_so_far == 2  # not sent again behind the caller's back
    check_answer(third)
    assert len(server.requests) == 3 and server.connections == 2


def test_fresh_connection_closed_before_answering_is_not_stale():
    (attempt,), server = run_client([([], "close")])
    assert (attempt.kind, attempt.cause) == ("retry", "connection")
    assert len(server.requests) == 1


def test_reused_connection_that_answered_a_byte_is_not_stale():
    (first, second), server = run_client([([RESPONSE], "keep"), ([b"HTTP/1.1 2"], "close")], requests=2)
    check_answer(first)
    assert (second.kind, second.cause) == ("retry", "connection")
    assert len(server.requests) == 2 and server.connections == 1


# -- DNS: every address, Happy Eyeballs, lookups refreshed after failures ------------------------

class BlackHole:
    """A loopback address that swallows SYNs: a listener whose accept queue is full."""

    def __enter__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.address = self.listener.getsockname()
        self.fillers = []
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(self.address)
            except BlockingIOError:
                pass
            self.fillers.append(s)
        return self

    def __exit__(self, *exc):
        for s in [*self.fillers, self.listener]:
            s.close()


@contextlib.contextmanager
def refusing_address():
    """A loopback address whose connections are refused, for as long as the block runs: a
    socket bound there and not listening (RST to a SYN). Held, not closed: a port closed
    and named later could be bound by another process by the time it is tried."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()


def fake_dns(answers: list[list[tuple[str, int]]]):
    """A getaddrinfo that gives the next of ANSWERS on each lookup (the last one repeats)."""
    calls = []

    async def getaddrinfo(host, port, **kwargs):
        calls.append(host)
        answer = answers[min(len(calls), len(answers)) - 1]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", address) for address in answer]

    return getaddrinfo, calls


def test_every_address_is_tried_and_a_black_hole_does_not_eat_the_timeout():
    async def go():
        with BlackHole() as hole, refusing_address() as refused:
            async with ScriptedServer([([RESPONSE], "keep")]) as server:
                answers = [[hole.address, refused, ("127.0.0.1", server.port)]]
                getaddrinfo, calls = fake_dns(answers)
                asyncio.get_running_loop().getaddrinfo = getaddrinfo
                async with CompletionClient(f"http://api.test:{server.port}/api/v1", KEY,
                                            connect_timeout=10) as client:
                    attempt = await client.attempt(b"{}", True)
                return attempt, server.requests, calls

    attempt, requests, calls = asyncio.run(go())
    # tried one after the other, the black hole alone would have used the whole timeout
    check_answer(attempt)
    assert len(requests) == 1 and b"\r\nHost: api.test:" in requests[0]
    assert calls == ["api.test"]


def test_addresses_are_looked_up_again_after_connects_fail():
    async def go():
        async with ScriptedServer([([RESPONSE], "keep")]) as server:
            with refusing_address() as refused:
                getaddrinfo, calls = fake_dns([[refused], [("127.0.0.1", server.port)]])
                asyncio.get_running_loop().getaddrinfo = getaddrinfo
                async with CompletionClient(f"http://api.test:{server.port}/api/v1", KEY) as client:
                    first = await client.attempt(b"{}", True)
                    second = await client.attempt(b"{}", True)
            return first, second, calls

    first, second, calls = asyncio.run(go())
    assert (first.kind, first.cause) == ("retry", "connection")
    check_answer(second)
    assert calls == ["api.test", "api.test"]


def test_interleave_alternates_families():
    from kimipipe.openrouter.connect import interleave

    v6 = [(socket.AF_INET6, 1, 6, "", (f"::{i}", 1, 0, 0)) for i in range(3)]
    v4 = [(socket.AF_INET, 1, 6, "", (f"10.0.0.{i}", 1)) for i in range(2)]
    assert [a[4][0] for a in interleave(v6 + v4)] == ["::0", "10.0.0.0", "::1", "10.0.0.1", "::2"]
    assert [a[4][0] for a in interleave(v4 + v6)] == ["10.0.0.0", "::0", "10.0.0.1", "::1", "::2"]


def test_a_proxy_whose_name_does_not_resolve_is_named_in_the_error():
    async def go():
        async def getaddrinfo(host, port, **kwargs):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

        asyncio.get_running_loop().getaddrinfo = getaddrinfo
        async with CompletionClient("https://openrouter.test/api/v1", KEY,
                                    proxy="http://user:pw-secret@proxy.test:3128") as client:
            return await client.attempt(b"{}", True)

    attempt = asyncio.run(go())
    assert (attempt.kind, attempt.cause) == ("retry", "proxy")
    assert "cannot reach proxy proxy.test:3128" in attempt.message and "pw-secret" not in attempt.message
