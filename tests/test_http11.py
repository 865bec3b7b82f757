"""The streamed-completion transport (kimipipe/openrouter/http11.py) and its answer assembly.

Two kinds of test: the parser fed one whole response split at every byte boundary (in the
middle of `data:`, of a UTF-8 character, of a chunk-size line, of a CRLF), and real
sockets: a raw asyncio server on 127.0.0.1 that answers with scripted bytes, written in
separate pieces, so the client meets the same boundaries across TCP segments, plus
closes, stalls, keep-alive reuse and error statuses.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import ssl
import subprocess

import pytest

from kimipipe.openrouter.client import CompletionClient, StreamAnswer
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
    from kimipipe.openrouter.client import Attempt
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

    def __init__(self, scripts: list[tuple[list[bytes], str]], ssl_context=None):
        self.scripts = list(scripts)
        self.ssl_context = ssl_context
        self.connections = 0
        self.requests: list[bytes] = []

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl_context)
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


def run_client(server_scripts, requests: int = 1, idle_timeout: float = 5.0):
    async def go():
        async with ScriptedServer(server_scripts) as server:
            async with CompletionClient(server.base_url, KEY, idle_timeout=idle_timeout) as client:
                results = []
                for _ in range(requests):
                    results.append(await client.attempt(b'{"stream": true}', True))
                    # decided at [DONE]; the connection returns to the pool once the body's
                    # last bytes (sent after pauses here) have arrived
                    await asyncio.sleep(0.1)
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


def test_real_socket_server_closing_an_idle_connection_is_retried_on_a_new_one():
    # first answer, then the server closes; the client's pooled connection is stale
    async def go():
        async with ScriptedServer([([RESPONSE], "close"), ([RESPONSE], "keep")]) as server:
            async with CompletionClient(server.base_url, KEY) as client:
                first = await client.attempt(b"{}", True)
                await asyncio.sleep(0.05)
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
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
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
                await asyncio.sleep(0.1)
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
