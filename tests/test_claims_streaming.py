"""Streaming claims (openrouter/http11.py, "the answer is decided as the bytes arrive") that a
broken copy of the code once passed the suite with (issue 51's mutation sample): each read's
`data:` payloads reach the answer in that read, so an answer is decided at `[DONE]` while the
body stays open, and data arriving resets the stall clock (heartbeats do not).

Real sockets: test_http11.py's scripted server on 127.0.0.1, and one here that paces its
events. The pacing is far inside the stall limit (an event every 0.05 s against 0.4 s), and
the whole stream lasts several limits: only a clock that data does not reset runs out.
"""

from __future__ import annotations

import asyncio

from test_http11 import (
    COMMENT,
    DONE,
    FINISH,
    KEY,
    SSE_HEAD,
    USAGE,
    ScriptedServer,
    check_answer,
    chunked,
    delta_event,
)

from kimipipe.openrouter.client import CompletionClient

# the events of test_http11's answer, without the chunked body's end ("0\r\n...\r\n")
_BODY_END = b"0\r\nX-Trailer: 1\r\n\r\n"


def test_an_answer_is_decided_at_done_while_the_body_stays_open():
    """[DONE] arrives and the server keeps the body open (no last chunk, no close): the
    answer is returned then, not after a stall or at the body's end."""
    from test_http11 import EVENTS

    pieces = [SSE_HEAD] + [chunked([e])[:-len(_BODY_END)] for e in EVENTS]

    async def go():
        async with ScriptedServer([(pieces, "hang")]) as server:
            async with CompletionClient(server.base_url, KEY, idle_timeout=60) as client:
                # (the deadline only guards against a hang: the answer comes at [DONE])
                return await asyncio.wait_for(client.attempt(b'{"stream": true}', True), 20)

    check_answer(asyncio.run(go()))


class PacedServer(ScriptedServer):
    """Writes each piece PAUSE seconds after the last (ScriptedServer writes them 5 ms apart)."""

    def __init__(self, pieces: list[bytes], pause: float):
        super().__init__([(pieces, "keep")])
        self.pause = pause

    async def _serve(self, reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
            for piece in self.scripts[0][0]:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(self.pause)
            await asyncio.sleep(30)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def test_data_arriving_resets_the_stall_clock():
    """A stream whose events come 0.05 s apart for 1.2 s, with a 0.4 s stall limit: never a
    stall, the whole answer kept."""
    words = [delta_event(content=f"w{i} ") for i in range(24)]
    pieces = [SSE_HEAD] + [chunked([e])[:-len(_BODY_END)] for e in [*words, FINISH, USAGE, DONE]]

    async def go():
        async with PacedServer(pieces, pause=0.05) as server:
            async with CompletionClient(server.base_url, KEY, idle_timeout=0.4) as client:
                return await client.attempt(b'{"stream": true}', True)

    attempt = asyncio.run(go())
    assert attempt.kind == "ok", attempt
    assert attempt.content == "".join(f"w{i} " for i in range(24))


def test_heartbeats_alone_do_not_reset_the_stall_clock():
    """A stream that sends nothing but heartbeats (`: OPENROUTER PROCESSING`), every 0.05 s
    for far longer than the 0.4 s stall limit, stalls out: only data resets the clock."""
    pieces = [SSE_HEAD] + [chunked([COMMENT])[:-len(_BODY_END)]] * 400

    async def go():
        async with PacedServer(pieces, pause=0.05) as server:
            async with CompletionClient(server.base_url, KEY, idle_timeout=0.4) as client:
                # (the deadline only guards against a hang: the stall comes at 0.4 s)
                return await asyncio.wait_for(client.attempt(b'{"stream": true}', True), 10)

    attempt = asyncio.run(go())
    assert (attempt.kind, attempt.cause) == ("retry", "timeout")
