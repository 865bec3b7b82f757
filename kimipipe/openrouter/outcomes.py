"""What an HTTP transport hands back for one completion request, besides a decided answer.

The transport (`http11.Http11Pool`) returns either what the caller's assembler decided
(for a streamed answer) or one of these; `client.CompletionClient.attempt` maps them to
an `Attempt`. Plain objects with slots: thousands are made per second at 2000 in flight.

    CollectedResponse(status, headers, body)
        a response read whole: any non-200, a plain (non-streamed) request's answer, and a
        200 to a streamed request whose Content-Type is not text/event-stream (e.g. a JSON
        error body), so its message is kept. Headers lower-cased; body decompressed.
    Stalled(seconds)
        no progress for `seconds`: streamed, no `data:` line (keep-alive comments don't
        count) or no response head; plain, no byte at all.
    Broken(message, cut, stale)
        the connection failed. `cut`: a 200 head had arrived, so what was read is partial
        and must not be used. `stale`: a kept-alive connection, reused from the pool,
        closed before a single byte of the response arrived: most likely the server had
        closed it while idle and never saw the request. The transport never sends a
        request again by itself (it cannot know the server did not start on it); the
        caller decides, and counts the retry like any other.
"""

from __future__ import annotations


class CollectedResponse:
    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status, self.headers, self.body = status, headers, body


class Stalled:
    __slots__ = ("seconds",)

    def __init__(self, seconds: float):
        self.seconds = seconds


class Broken:
    __slots__ = ("message", "cut", "stale")

    def __init__(self, message: str, cut: bool, stale: bool = False):
        self.message, self.cut, self.stale = message, cut, stale
