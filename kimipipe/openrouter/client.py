"""One chat completion attempt against OpenRouter, classified: the HTTP layer of kp-infer.

`CompletionClient.attempt(body, stream)` sends one request and returns an `Attempt`:
either a complete answer (`kind == "ok"`) or what went wrong, sorted into what the
caller must do about it (OPENROUTER.md, "Errors"):

    ok         a complete answer: keep it
    retry      transient (408/429/5xx/524/529, connection errors, idle stalls, 200 with an
               error body, empty choices or empty output, mid-stream error, cut stream):
               retry with backoff, honouring `retry_after`
    permanent  400/403/413/422 and other 4xx: record as failed, no retry this run
    payment    402: the balance cannot cover the request: stop admitting work
    auth       401: bad key: stop the run
    no_route   404 (e.g. constraint_filtered): a configuration error: stop the run

Partial text is never returned as an answer. Streams are read with a read-idle timeout
on *data*: keep-alive comments (`: OPENROUTER PROCESSING`) do not count as progress, so a
stream that only sends heartbeats stalls out. A total timeout is never used: reasoning
streams of many minutes are normal. TCP keepalive is on for every connection, so a
connection a NAT dropped silently becomes an error instead of a hang.

Requests go through `http11.Http11Pool`: keep-alive HTTP/1.1 connections read by an asyncio
Protocol that frames with llhttp and splits SSE inside `data_received` and assembles a
streamed answer (`StreamAnswer`) without waking a coroutine per TCP segment. Measured
at 1000-2000 in flight (../shared/PERFORMANCE.md, bench/README.md): httpx's own pool ~49
ms of CPU per request, aiohttp ~0.5-0.75 ms and ~22-26 µs per streamed event (most of it
in waking the reading task per segment), Http11Pool less on both. The client holds no
run state, so it can live in a worker process (kimipipe/infer/workers.py).
"""

from __future__ import annotations

import msgspec

from ..errors import redact
from .http11 import Http11Pool
from .outcomes import Broken, CollectedResponse, Stalled
from .proxy import ProxyError

RETRYABLE_STATUSES = {408, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 525, 526, 529}


class Attempt(msgspec.Struct, omit_defaults=True, array_like=True):
    """The outcome of one HTTP attempt (sent between processes as msgpack: keep it flat)."""

    kind: str  # ok | retry | permanent | payment | auth | no_route
    cause: str = ""  # for retries/failures: "429", "502", "timeout", "cut", "error200", ...
    status: int = 0
    code: str = ""
    message: str = ""
    retry_after: float | None = None
    content: str = ""
    reasoning: str | None = None
    finish_reason: str | None = None
    provider: str | None = None
    model: str | None = None
    generation_id: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float | None = None
    chunks: int = 0


# Typed views of what we read from the wire; msgspec skips every other field fast.
# gc=False: decoded JSON cannot form reference cycles, and thousands of these are made
# per second while streaming; the garbage collector need not track them.
class _ReasoningDetail(msgspec.Struct, gc=False):
    type: str | None = None
    text: str | None = None


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning: str | None = None
    reasoning_details: list[_ReasoningDetail] | None = None


class _Message(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning: str | None = None
    reasoning_details: list[_ReasoningDetail] | None = None


class _Choice(msgspec.Struct, gc=False):
    delta: _Delta | None = None
    message: _Message | None = None
    finish_reason: str | None = None
    error: dict | None = None


class _CompletionDetails(msgspec.Struct, gc=False):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None
    completion_tokens_details: _CompletionDetails | None = None


class _Body(msgspec.Struct, gc=False):
    id: str | None = None
    provider: str | None = None
    model: str | None = None
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: dict | None = None


_body_decoder = msgspec.json.Decoder(_Body)


def _retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _reasoning_text(reasoning: str | None, details: list[_ReasoningDetail] | None) -> str | None:
    if reasoning:
        return reasoning
    if details:
        text = "".join(d.text or "" for d in details if d.type == "reasoning.text")
        return text or None
    return None


def split_inline_think(content: str, reasoning: str | None) -> tuple[str, str | None]:
    """Providers that put reasoning inline as a leading `<think>...</think>` in content."""
    if reasoning is None and content.startswith("<think>"):
        end = content.find("</think>")
        if end >= 0:
            return content[end + len("</think>"):], content[len("<think>"):end]
    return content, reasoning


def _error_attempt(status: int, payload: dict | None, retry_after: float | None,
                   default_message: str) -> Attempt:
    err = (payload or {}).get("error") if isinstance(payload, dict) else None
    err = err if isinstance(err, dict) else {}
    message = redact(str(err.get("message") or default_message))[:500]
    code = str(err.get("code") or status)
    availability = err.get("availability") or (payload or {}).get("availability")
    if isinstance(availability, dict):
        ra = availability.get("retry_after")
        if isinstance(ra, (int, float)):
            retry_after = float(ra)
        avail_code = availability.get("code")
        if avail_code:
            code = str(avail_code)
        if "retryable" in availability:
            kind = "retry" if availability["retryable"] else ("no_route" if status == 404 else "permanent")
            return Attempt(kind, cause=str(status), status=status, code=code, message=message,
                           retry_after=retry_after)
    if status == 401:
        kind = "auth"
    elif status == 402:
        kind = "payment"
    elif status == 404:
        kind = "no_route"
    elif status in RETRYABLE_STATUSES or status >= 500:
        kind = "retry"
    else:
        kind = "permanent"
    return Attempt(kind, cause=str(status), status=status, code=code, message=message,
                   retry_after=retry_after)


def _finish(body_id, provider, model, content, reasoning, finish_reason, usage: _Usage | None,
            chunks: int = 0) -> Attempt:
    content, reasoning = split_inline_think(content, reasoning or None)
    if not content and not reasoning:
        return Attempt("retry", cause="empty", status=200, message="empty output")
    details = usage.completion_tokens_details if usage else None
    return Attempt(
        "ok", status=200, content=content, reasoning=reasoning, finish_reason=finish_reason,
        provider=provider, model=model, generation_id=body_id,
        prompt_tokens=(usage.prompt_tokens or 0) if usage else 0,
        completion_tokens=(usage.completion_tokens or 0) if usage else 0,
        reasoning_tokens=(details.reasoning_tokens or 0) if details else 0,
        cost=usage.cost if usage else None, chunks=chunks,
    )


class CompletionClient:
    """Sends chat completion attempts over one Http11Pool (many keep-alive connections)."""

    def __init__(self, base_url: str, api_key: str, *, idle_timeout: float = 120.0,
                 connect_timeout: float = 30.0, extra_headers: dict[str, str] | None = None,
                 proxy: str | None = None):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.idle_timeout = idle_timeout
        self._connect_timeout = connect_timeout
        headers = {
            "Authorization": f"Bearer {api_key}",
            "Content-Type": "application/json",
            "HTTP-Referer": "https://github.com/kimipipe/kimipipe",
            "X-Title": "kimipipe",
            **(extra_headers or {}),
        }
        self._pool = Http11Pool(self.url, headers, idle_timeout=idle_timeout,
                                connect_timeout=connect_timeout, proxy=proxy)
        self._entered = False

    async def __aenter__(self) -> CompletionClient:
        await self._pool.__aenter__()
        self._entered = True
        return self

    async def __aexit__(self, *exc) -> None:
        await self._pool.__aexit__(*exc)

    async def attempt(self, body: bytes, stream: bool) -> Attempt:
        assert self._entered, "use `async with CompletionClient(...)`"
        try:
            outcome = await self._pool.post(body, StreamAnswer() if stream else None)
        except TimeoutError:
            return Attempt("retry", cause="timeout", message=f"no connection within {self._connect_timeout:g} s")
        except ProxyError as e:  # its message names the proxy, never its credentials
            return Attempt("retry", cause="proxy", message=redact(str(e))[:300])
        except OSError as e:
            return Attempt("retry", cause="connection", message=redact(f"{type(e).__name__}: {e}")[:300])
        if isinstance(outcome, Attempt):
            return outcome
        if isinstance(outcome, CollectedResponse):
            if outcome.status == 200:
                return self._read_plain(outcome.body)
            try:
                payload = msgspec.json.decode(outcome.body) if outcome.body.strip() else None
            except msgspec.DecodeError:
                payload = None
            return _error_attempt(outcome.status, payload,
                                  _retry_after_seconds(outcome.headers.get("retry-after")),
                                  f"HTTP {outcome.status}")
        if isinstance(outcome, Stalled):
            what = "data" if stream else "bytes"
            return Attempt("retry", cause="timeout", message=f"no {what} for {outcome.seconds:g} s")
        assert isinstance(outcome, Broken), outcome
        # stale: a reused keep-alive connection closed before answering; sent again only as
        # the caller's next attempt, counted under its own cause
        cause = "cut" if outcome.cut else "stale" if outcome.stale else "connection"
        return Attempt("retry", cause=cause, message=redact(outcome.message)[:300])

    @staticmethod
    def _read_plain(raw: bytes) -> Attempt:
        if not raw.strip():
            return Attempt("retry", cause="empty", status=200, message="empty body")
        try:
            body = _body_decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return Attempt("retry", cause="bad_json", status=200, message="body is not valid JSON")
        if body.error is not None:
            return _body_error(body.error)
        if not body.choices:
            return Attempt("retry", cause="empty", status=200, message="no choices")
        choice = body.choices[0]
        if choice.error is not None or choice.finish_reason == "error":
            return _body_error(choice.error or {"message": "finish_reason: error"})
        msg = choice.message or _Message()
        if choice.finish_reason is None:
            return Attempt("retry", cause="empty", status=200, message="no finish_reason")
        return _finish(body.id, body.provider, body.model, msg.content or "",
                       _reasoning_text(msg.reasoning, msg.reasoning_details),
                       choice.finish_reason, body.usage)



def _body_error(error: dict) -> Attempt:
    code = error.get("code") if isinstance(error, dict) else None
    message = redact(str(error.get("message") if isinstance(error, dict) else error))[:500]
    status = code if isinstance(code, int) else 200
    if status in (401, 402, 404) or (400 <= status < 500 and status not in RETRYABLE_STATUSES):
        return _error_attempt(status, {"error": error}, None, message)
    return Attempt("retry", cause="error200", status=200, code=str(code or ""), message=message)


def _midstream(error: dict, after_output: bool) -> Attempt:
    """An error chunk: `midstream` once output has flowed, else like a 200 error body."""
    attempt = _body_error(error)
    if attempt.kind == "retry" and after_output:
        attempt.cause = "midstream"
    return attempt


class StreamAnswer:
    """Assembles one streamed answer from its SSE `data:` payloads (the Http11Pool assembler).

    `event(payload)` returns an Attempt once the answer is decided ([DONE], an error chunk,
    a chunk that is not JSON), else None; `end()` gives the Attempt for a body that ended
    without [DONE]. Partial text is never returned as an answer.
    """

    __slots__ = ("content", "reasoning", "details", "gen_id", "provider", "model",
                 "finish_reason", "usage", "chunks")

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.details: list[_ReasoningDetail] = []
        self.gen_id = self.provider = self.model = self.finish_reason = None
        self.usage: _Usage | None = None
        self.chunks = 0

    def _has_output(self) -> bool:
        return bool(self.content or self.reasoning or self.details)

    def event(self, payload: bytes) -> Attempt | None:
        if payload == b"[DONE]":
            return self.end(done=True)
        self.chunks += 1
        try:
            chunk = _body_decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return Attempt("retry", cause="bad_json", status=200, message="stream chunk is not valid JSON")
        if chunk.error is not None:
            return _midstream(chunk.error, self._has_output())
        if self.gen_id is None:
            self.gen_id, self.provider, self.model = chunk.id, chunk.provider, chunk.model
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices or ():
            if choice.error is not None or choice.finish_reason == "error":
                return _midstream(choice.error or {"message": "finish_reason: error"}, self._has_output())
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    self.content.append(delta.content)
                if delta.reasoning:
                    self.reasoning.append(delta.reasoning)
                elif delta.reasoning_details:
                    self.details.extend(delta.reasoning_details)
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason
        return None

    def end(self, done: bool = False) -> Attempt:
        if self.finish_reason is None or (not done and self.usage is None):
            # Without a finish_reason the answer is partial; without [DONE] and usage we
            # cannot tell what was billed. Never saved as a result.
            if done and not self._has_output():
                return Attempt("retry", cause="empty", status=200, message="stream with no output")
            return Attempt("retry", cause="cut", status=200, message="stream ended early")
        return _finish(self.gen_id, self.provider, self.model, "".join(self.content),
                       _reasoning_text("".join(self.reasoning), self.details), self.finish_reason,
                       self.usage, self.chunks)
