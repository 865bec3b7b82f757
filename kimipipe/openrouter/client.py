"""One chat completion attempt against OpenRouter (or a self-hosted server): kp-infer's HTTP.

`CompletionClient.attempt(body, stream)` sends one request and returns an `Attempt`
(openrouter/attempt.py): a complete answer, or what went wrong, classified as retry,
permanent, payment, auth or no_route. The answer is assembled by openrouter/answer.py
(`StreamAnswer` for a stream, `read_plain` for a whole body) from the views of
openrouter/wire.py.

Streams are read with a read-idle timeout on *data*: keep-alive comments
(`: OPENROUTER PROCESSING`) do not count as progress, so a stream that only sends
heartbeats stalls out. A total timeout is never used: reasoning streams of many minutes
are normal. TCP keepalive is on for every connection, so a connection a NAT dropped
silently becomes an error instead of a hang.

Requests go through `http11.Http11Pool`: keep-alive HTTP/1.1 connections read by an asyncio
Protocol that frames with llhttp and splits SSE inside `data_received` and assembles a
streamed answer (`StreamAnswer`) without waking a coroutine per TCP segment. Measured
at 1000-2000 in flight (bench/README.md, docs/performance.md): httpx's own pool ~49 ms of
CPU per request, aiohttp ~0.5-0.75 ms and ~17-27 µs per streamed event (most of it in
waking the reading task per segment), Http11Pool less on both.
"""

from __future__ import annotations

from urllib.parse import quote, urlsplit

import msgspec

from ..errors import redact
from ..kinds import AttemptKind, RetryCause
from .answer import StreamAnswer, read_plain
from .attempt import Attempt, error_attempt, retry_after_seconds
from .http11 import Http11Pool
from .outcomes import Broken, CollectedResponse, Stalled
from .proxy import ProxyError
from .wire import generation_decoder

__all__ = ["COMPLETION_HEADERS", "CompletionClient"]


# Sent with every completion (the run's and the preflight's). X-OpenRouter-Title is the
# current name of the attribution header (X-Title, its old name, is still accepted).
# X-OpenRouter-Cache false: response caching (off by default, but a preset or an account
# setting can turn it on) returns an earlier answer verbatim, at $0, whatever the
# sampling: a duplicate training sample, silently.
COMPLETION_HEADERS = {
    "HTTP-Referer": "https://github.com/kimipipe/kimipipe",
    "X-OpenRouter-Title": "kimipipe",
    "X-OpenRouter-Cache": "false",
}


class CompletionClient:
    """Sends chat completion attempts over one Http11Pool (many keep-alive connections)."""

    def __init__(self, base_url: str, api_key: str, *, idle_timeout: float = 120.0,
                 connect_timeout: float = 30.0, extra_headers: dict[str, str] | None = None,
                 proxy: str | None = None):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self._base_path = urlsplit(base_url).path.rstrip("/")
        self.idle_timeout = idle_timeout
        self._connect_timeout = connect_timeout
        headers = {
            "Authorization": f"Bearer {api_key}",
            "Content-Type": "application/json",
            **COMPLETION_HEADERS,
            **(extra_headers or {}),
        }
        self._pool = Http11Pool(self.url, headers, idle_timeout=idle_timeout,
                                connect_timeout=connect_timeout, proxy=proxy)
        self._entered = False
        self._stopped: set[str] = set()  # providers whose streams are cancelled (lower-case)

    async def __aenter__(self) -> CompletionClient:
        await self._pool.__aenter__()
        self._entered = True
        return self

    async def __aexit__(self, *exc) -> None:
        await self._pool.__aexit__(*exc)

    async def get(self, path: str) -> tuple[int, bytes]:
        """GET the base URL's PATH over the completions' own connections: (status, body).
        OSError (ConnectionError for a broken or stalled answer), TimeoutError or
        ProxyError when no answer came; no message holds the key."""
        assert self._entered, "use `async with CompletionClient(...)`"
        outcome = await self._pool.get(self._base_path + path)
        if isinstance(outcome, CollectedResponse):
            return outcome.status, outcome.body
        if isinstance(outcome, Stalled):
            raise ConnectionError(f"no bytes for {outcome.seconds:g} s")
        raise ConnectionError(redact(outcome.message)[:300])

    async def generation_cost(self, generation_id: str) -> float | None:
        """`GET /generation?id=`'s `total_cost` (USD) of a generation; None while OpenRouter
        has it not yet (404: it can for a few seconds after the answer). ValueError for any
        other answer, or a 200 without a number (infer/costs.py asks again, then estimates)."""
        status, body = await self.get("/generation?id=" + quote(generation_id, safe=""))
        if status == 404:
            return None
        if status != 200:
            raise ValueError(f"GET /generation answered {status}")
        try:
            return generation_decoder.decode(body).data.total_cost
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise ValueError("GET /generation answered 200 without a total_cost") from None

    @property
    def in_flight(self) -> int:
        return self._pool.in_flight

    def cancel_streams_of(self, provider: str) -> int:
        """Close the streams in flight whose first chunk named PROVIDER, and every later one
        as soon as its first chunk does: each ends as an `AttemptKind.CANCELLED` Attempt.
        A plain (non-streamed) request names its provider only in its whole answer, so it
        cannot be told apart before it ends: it runs on. How many were closed now."""
        name = provider.lower()
        self._stopped.add(name)
        return self._pool.abandon(
            lambda a: a.cancel() if isinstance(a, StreamAnswer) and a.provider is not None
            and a.provider.lower() == name else None)

    async def attempt(self, body: bytes, stream: bool, answer: StreamAnswer | None = None
                      ) -> Attempt:
        """One request; ANSWER: the assembler of a streamed one, when not the run's own
        `StreamAnswer` (the preflight's tapped one: openrouter/probe.py)."""
        assert self._entered, "use `async with CompletionClient(...)`"
        if stream and answer is None:
            answer = StreamAnswer(self._stopped)
        try:
            outcome = await self._pool.post(body, answer if stream else None)
        except TimeoutError:
            return Attempt(AttemptKind.RETRY, cause=RetryCause.TIMEOUT, message=f"no connection within {self._connect_timeout:g} s")
        except ProxyError as e:  # its message names the proxy, never its credentials
            return Attempt(AttemptKind.RETRY, cause=RetryCause.PROXY, message=redact(str(e))[:300])
        except OSError as e:
            return Attempt(AttemptKind.RETRY, cause=RetryCause.CONNECTION, message=redact(f"{type(e).__name__}: {e}")[:300])
        if isinstance(outcome, Attempt):
            return outcome
        if isinstance(outcome, CollectedResponse):
            if outcome.status == 200:
                return read_plain(outcome.body)
            try:
                payload = msgspec.json.decode(outcome.body) if outcome.body.strip() else None
            except msgspec.DecodeError:
                payload = None
            return error_attempt(outcome.status, payload,
                                 retry_after_seconds(outcome.headers.get("retry-after")),
                                 f"HTTP {outcome.status}")
        if isinstance(outcome, Stalled):
            what = "data" if stream else "bytes"
            return Attempt(AttemptKind.RETRY, cause=RetryCause.TIMEOUT, message=f"no {what} for {outcome.seconds:g} s")
        assert isinstance(outcome, Broken), outcome
        # stale: a reused keep-alive connection closed before answering; sent again only as
        # the caller's next attempt, counted under its own cause
        cause = (RetryCause.CUT if outcome.cut else RetryCause.STALE if outcome.stale
                 else RetryCause.CONNECTION)
        return Attempt(AttemptKind.RETRY, cause=cause, message=redact(outcome.message)[:300])
