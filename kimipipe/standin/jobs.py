"""One accepted completion, served plain or streamed, with its fault if any.

The server (`server.py`) does every check that can refuse a request; a `Job` is what is
left: latency (with keep-alive comments), the answer at the configured token rate, the
charge, and the faults that happen after the headers (error bodies at HTTP 200, empty
choices, mid-stream errors, cut connections, hangs, keep-alive-only streams).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from aiohttp import web

from .answers import Answer, user_text_sha256
from .billing import billed_prices
from .config import Config
from .providers import StandinEndpoint
from .sessions import CACHE_READ_FACTOR
from .wire import GenerationStats, encode, json_response

COMMENT = b": OPENROUTER PROCESSING\n\n"
DONE = b"data: [DONE]\n\n"
# Streamed tokens go out one write (one HTTP chunk, one TCP segment) each, as OpenRouter
# sends them, so a client wakes up per chunk as it would on a real stream; only above 100
# tokens a second do the tokens due within one 10 ms tick share a write, which bounds the
# stand-in's timers and writes per stream.
MIN_WRITE_INTERVAL = 0.01
# --midstream-code -> (error.code, metadata.error_type, message), as the errors docs show them
MIDSTREAM_ERRORS = {
    "502": (502, "provider_unavailable", "Provider returned error"),
    "429": (429, "rate_limit_exceeded", "Rate limit exceeded upstream"),
    "408": (408, "timeout", "Provider timed out"),
    "provider_overloaded": ("provider_overloaded", "provider_overloaded", "Provider overloaded"),
    "server_error": ("server_error", "server", "Internal server error"),
}


class Books(Protocol):
    """What a Job reports to: the server's books of generations and charges
    (server.StandinState keeps them; a Job never reads them)."""

    config: Config

    def draw_usage_shown(self) -> str: ...

    def charge(self, gen: GenerationStats, user_sha: str, extra: dict | None = None) -> None: ...

    def remember_unbilled(self, gen: GenerationStats) -> None: ...

    def abandoned_unbilled(self, gen: GenerationStats) -> None: ...

    def count_abandoned(self) -> None: ...


class Job:
    """One accepted completion: serves it plain or streamed, with its fault if any."""

    def __init__(self, server: Books, request: web.Request, body: dict, answer: Answer,
                 endpoint: StandinEndpoint, fault: str | None, created: int, gen_id: str,
                 started: float, ledger_extra: dict | None = None, cached_tokens: int = 0,
                 logprobs: tuple[list, list] | None = None):
        self.server = server
        self.config = server.config
        self.request = request
        self.body = body
        self.answer = answer
        self.endpoint = endpoint
        self.fault = fault
        self.created = created
        self.gen_id = gen_id
        self.started = started
        self.model = body["model"]
        self.headers = {"X-Generation-Id": gen_id}
        self.charged = False
        self.shown = "cost"   # what its usage shows of the cost: cost | no_cost | none (billing.py)
        self.ledger_extra = ledger_extra   # what the ledger line adds (sampling, quirks)
        self.cached_tokens = min(cached_tokens, answer.prompt_tokens)  # read from the cache
        # a token-by-token provider's sampled tokens (logprobs.py): the reasoning's and the
        # content's, each (the byte offset where it ends, its logprobs entry or None); None:
        # not such a provider. Their entries are shown when the request asks for logprobs.
        self.logprobs = logprobs
        self.logprobs_shown = logprobs is not None and body.get("logprobs") is True

    # -- shared pieces ------------------------------------------------------------------
    def _prices(self) -> tuple[float, float]:
        """USD per token this generation is billed at (billing.py: overrides, discount, scale)."""
        return billed_prices(self.endpoint, self.config, self.answer.prompt_tokens)

    def _prompt_cost(self) -> float:
        """The prompt at its price, its cached tokens (sessions.py) at the cache-read price."""
        prompt, _completion = self._prices()
        cached = self.cached_tokens
        return ((self.answer.prompt_tokens - cached) + cached * CACHE_READ_FACTOR) * prompt

    def _cost(self) -> float:
        _prompt, completion = self._prices()
        return self._prompt_cost() + self.answer.completion_tokens * completion

    def _charge(self, first_token_at: float, streamed: bool) -> float:
        self.charged = True
        self.shown = self.server.draw_usage_shown()
        now = time.monotonic()
        cost = self._cost()
        self.server.charge(GenerationStats(
            self.gen_id, self.endpoint.provider_name, self.model, self.answer.prompt_tokens,
            self.answer.completion_tokens, self.answer.reasoning_tokens, cost,
            self.answer.finish_reason, self.created, first_token_at - self.started,
            now - first_token_at, streamed), user_text_sha256(self.body["messages"]),
            # the endpoint by its tag: the answer names only the provider, which can cover
            # several endpoints (deepinfra and deepinfra/turbo are both "DeepInfra")
            {"endpoint": self.endpoint.tag, **(self.ledger_extra or {}),
             **({"fault": "usagecut"} if self.fault == "usagecut" else {})})
        return cost

    def _usage(self, cost: float) -> dict | None:
        """The answer's `usage` (None: it shows none; without `cost` when it shows none)."""
        if self.shown == "none":
            return None
        a = self.answer
        prompt, completion = self._prices()
        usage = {
            "prompt_tokens": a.prompt_tokens,
            "completion_tokens": a.completion_tokens,
            "total_tokens": a.prompt_tokens + a.completion_tokens,
            "completion_tokens_details": {"reasoning_tokens": a.reasoning_tokens},
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            "cost": cost,
            "is_byok": False,
            "cost_details": {
                "upstream_inference_cost": cost,
                "upstream_inference_prompt_cost": self._prompt_cost(),
                "upstream_inference_completions_cost": a.completion_tokens * completion,
            },
        }
        if self.shown == "no_cost":
            del usage["cost"], usage["cost_details"]
        return usage

    def _zero_usage(self) -> dict:
        """A zero-completion answer (the `zero` fault): remembered for /generation at $0,
        never charged (OpenRouter's zero-completion insurance, billing.py)."""
        a = self.answer
        self.server.remember_unbilled(GenerationStats(
            self.gen_id, self.endpoint.provider_name, self.model, a.prompt_tokens, 0, 0, 0.0,
            None, self.created, 0.0, 0.0, bool(self.body.get("stream"))))
        return {"prompt_tokens": a.prompt_tokens, "completion_tokens": 0,
                "total_tokens": a.prompt_tokens, "completion_tokens_details": {"reasoning_tokens": 0},
                "prompt_tokens_details": {"cached_tokens": 0}, "cost": 0, "is_byok": False,
                "cost_details": {"upstream_inference_cost": 0}}

    def _error_obj(self, midstream: bool = False) -> dict:
        """The error object of a 200 error body or (MIDSTREAM) of a stream's error chunk,
        whose code can be a 4xx or 5xx number or a string (`--midstream-code`)."""
        code, error_type, message = MIDSTREAM_ERRORS[self.config.midstream_code if midstream else "502"]
        return {"code": code, "message": message,
                "metadata": {"error_type": error_type,
                             "provider_code": "upstream_error",
                             "provider_name": self.endpoint.provider_name}}

    def _head(self, obj: str) -> dict:
        return {"id": self.gen_id, "provider": self.endpoint.provider_name, "model": self.model,
                "object": obj, "created": self.created}

    def _generation_seconds(self) -> float:
        tps = self.config.tokens_per_second
        return self.answer.completion_tokens / tps if tps > 0 else 0.0

    async def _prepare(self, resp: web.StreamResponse) -> None:
        self.request["standin_status"] = resp.status
        await resp.prepare(self.request)

    async def _abort(self) -> None:
        """Cut the connection after what was written has left: transport.abort() drops what
        asyncio still buffers, which would cut a usagecut answer before its usage."""
        transport = self.request.transport
        if transport is None:
            return
        for _ in range(200):  # a reader that takes nothing for 2 s gets the cut as it stands
            if not transport.get_write_buffer_size():
                break
            await asyncio.sleep(0.01)
        transport.abort()

    # -- plain --------------------------------------------------------------------------
    async def plain(self) -> web.StreamResponse:
        try:
            return await self._plain()
        except (asyncio.CancelledError, ConnectionError):
            self._bill_if_cancelled(streamed=False)
            raise

    async def stream(self) -> web.StreamResponse:
        try:
            return await self._stream()
        except (asyncio.CancelledError, ConnectionError):
            self._bill_if_cancelled(streamed=True)
            raise

    def _bill_if_cancelled(self, streamed: bool) -> None:
        """Some providers finish (and bill) a generation whose client went away; with
        `bill_cancelled` the stand-in does the same for an accepted, fault-free request.
        Such a request is counted (stats' `abandoned`): a client that gave up on an answer
        that was coming (an idle timeout on a slow machine) is told apart from one that
        met an injected stall."""
        if not self.charged and self.fault in (None, "misroute"):
            self.server.count_abandoned()
            if self.config.bill_cancelled:
                self._charge(time.monotonic(), streamed)
            else:
                self.server.abandoned_unbilled(GenerationStats(
                    self.gen_id, self.endpoint.provider_name, self.model, 0, 0, 0, 0.0,
                    "cancelled", self.created, 0.0, 0.0, streamed, cancelled=True))

    async def _plain(self) -> web.StreamResponse:
        fault = self.fault
        if fault in ("hang", "heartbeat"):
            resp = web.StreamResponse(status=200, headers=self.headers)
            resp.content_type = "application/json"
            await self._prepare(resp)
            await asyncio.sleep(self.config.hang_seconds)
            await self._abort()
            return resp
        await asyncio.sleep(self.config.latency + self._generation_seconds())
        head = self._head("chat.completion")
        if fault in ("error200", "midstream"):
            return json_response({**head, "error": self._error_obj()}, headers=self.headers)
        if fault == "empty":
            return json_response({**head, "choices": [], "system_fingerprint": None},
                                 headers=self.headers)
        if fault == "zero":
            return json_response({**head, "system_fingerprint": None, "choices": [{
                "index": 0, "logprobs": None, "finish_reason": None, "native_finish_reason": None,
                "message": {"role": "assistant", "content": "", "refusal": None, "reasoning": None}}],
                "usage": self._zero_usage()}, headers=self.headers)
        a = self.answer
        logprobs = None
        if self.logprobs_shown:
            logprobs = {"content": [e for _, e in (*self.logprobs[0], *self.logprobs[1])
                                    if e is not None], "refusal": None}
        message: dict = {"role": "assistant", "content": a.content, "refusal": None,
                         "reasoning": a.reasoning}
        if a.reasoning is not None:
            message["reasoning_details"] = [{"type": "reasoning.text", "text": a.reasoning,
                                             "format": "unknown", "index": 0}]
        body = {**head, "system_fingerprint": None, "choices": [{
            "index": 0, "logprobs": logprobs, "finish_reason": a.finish_reason,
            "native_finish_reason": a.finish_reason, "message": message}]}
        if fault == "cut":
            body["usage"] = self._usage(self._cost())
            data = encode(body)
            resp = web.StreamResponse(status=200, headers=self.headers)
            resp.content_type = "application/json"
            resp.content_length = len(data)
            await self._prepare(resp)
            await resp.write(data[: len(data) // 2])
            await self._abort()
            return resp
        first = time.monotonic()
        usage = self._usage(self._charge(first, streamed=False))
        if usage is not None:
            body["usage"] = usage
        return web.Response(body=encode(body), headers=self.headers,
                            content_type="application/json")

    # -- streamed -----------------------------------------------------------------------
    def _templates(self) -> tuple[bytes, bytes]:
        head = encode(self._head("chat.completion.chunk"))[:-1]   # drop the closing brace
        return (b"data: " + head + b',"choices":[{"index":0,"delta":{"role":"assistant",',
                b'},"finish_reason":null,"native_finish_reason":null,"logprobs":null}]}\n\n')

    async def _keepalive(self, resp: web.StreamResponse, seconds: float) -> None:
        """Keep-alive comments while the model "thinks": one now, then every interval."""
        if seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        interval = min(self.config.keepalive_interval, seconds)
        while True:
            await resp.write(COMMENT)
            left = end - loop.time()
            if left <= 0:
                return
            await asyncio.sleep(min(interval, left))
            if loop.time() >= end:
                return

    async def _stream(self) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={
            **self.headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await self._prepare(resp)
        fault = self.fault
        if fault == "hang":
            await asyncio.sleep(self.config.hang_seconds)
            await self._abort()
            return resp
        if fault == "heartbeat":
            while True:
                await resp.write(COMMENT)
                await asyncio.sleep(self.config.keepalive_interval)
        await self._keepalive(resp, self.config.latency)
        prefix, suffix = self._templates()
        if fault == "error200":
            await resp.write(b"data: " + encode({**self._head("chat.completion.chunk"),
                                                  "error": self._error_obj()}) + b"\n\n")
            return resp
        if fault == "empty":
            await resp.write(b"data: " + encode({**self._head("chat.completion.chunk"),
                                                  "choices": []}) + b"\n\n" + DONE)
            return resp
        if fault == "zero":
            await resp.write(prefix + b'"content":""' + suffix + b"data: " + encode(
                {**self._head("chat.completion.chunk"), "choices": [], "usage": self._zero_usage()})
                + b"\n\n" + DONE)
            return resp
        a = self.answer
        reasoning_pieces, content_pieces = a.reasoning_pieces, a.content_pieces
        reasoning_ends = [suffix] * len(reasoning_pieces)
        content_ends = [suffix] * len(content_pieces)
        if self.logprobs is not None:  # a chunk per token
            from .logprobs import token_pieces

            reasoning_pieces, entries = token_pieces(a.reasoning or "", self.logprobs[0])
            reasoning_ends = self._logprob_suffixes(entries)
            content_pieces, entries = token_pieces(a.content, self.logprobs[1])
            content_ends = self._logprob_suffixes(entries)
            if not a.reasoning:
                reasoning_pieces, reasoning_ends = (), []
        chunks = [prefix + b'"content":"","reasoning":' + encode(p)
                  + b',"reasoning_details":[{"type":"reasoning.text","text":' + encode(p)
                  + b',"format":"unknown","index":0}]' + end
                  for p, end in zip(reasoning_pieces, reasoning_ends, strict=True)]
        chunks += [prefix + b'"content":' + encode(p) + end
                   for p, end in zip(content_pieces, content_ends, strict=True)]
        if fault in ("midstream", "cut"):
            chunks = chunks[: max(1, len(chunks) // 2)]
        first = time.monotonic()
        await self._send_tokens(resp, chunks)
        if fault == "cut":
            await self._abort()
            return resp
        if fault == "midstream":
            await resp.write(b"data: " + encode({
                **self._head("chat.completion.chunk"), "error": self._error_obj(midstream=True),
                "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error",
                             "native_finish_reason": "error"}]}) + b"\n\n")
            return resp
        cost = self._charge(first, streamed=True)
        finish = encode(a.finish_reason)
        usage = self._usage(cost)
        # OpenRouter sends the usage in one of two shapes (--stream-usage): a last chunk of
        # its own with `choices: []`, or a last finish chunk (empty delta, finish_reason
        # repeated) that carries it.
        last_choices = [] if self.config.stream_usage == "own-chunk" else [{
            "index": 0, "delta": {}, "finish_reason": a.finish_reason,
            "native_finish_reason": a.finish_reason, "logprobs": None}]
        tail = (prefix + b'"content":""},"finish_reason":' + finish
                + b',"native_finish_reason":' + finish + b',"logprobs":null}]}\n\n'
                + (b"" if usage is None else b"data: " + encode({
                    **self._head("chat.completion.chunk"), "choices": last_choices,
                    "usage": usage}) + b"\n\n"))
        if fault == "usagecut":  # the answer whole and billed, the stream cut before [DONE]
            await resp.write(tail)
            await self._abort()
            return resp
        await resp.write(tail + DONE)
        return resp

    def _logprob_suffixes(self, entries: list[list[dict]]) -> list[bytes]:
        """Each chunk's ending, with the logprobs of its tokens when they are shown
        (`logprobs: null` otherwise)."""
        out = []
        for mine in entries:
            shown = mine and self.logprobs_shown
            logprobs = encode({"content": mine, "refusal": None}) if shown else b"null"
            out.append(b'},"finish_reason":null,"native_finish_reason":null,"logprobs":'
                       + logprobs + b"}]}\n\n")
        return out

    async def _send_tokens(self, resp: web.StreamResponse, chunks: list[bytes]) -> None:
        """One SSE event per token at the configured rate, each its own write up to 100 a
        second; beyond that the tokens due within one tick share one (MIN_WRITE_INTERVAL)."""
        tps = self.config.tokens_per_second
        if tps <= 0 or not chunks:
            if chunks:
                await resp.write(b"".join(chunks))
            return
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        sent = 0
        n = len(chunks)
        while sent < n:
            due = min(n, int((loop.time() - t0) * tps) + 1)
            if due > sent:
                await resp.write(b"".join(chunks[sent:due]))
                sent = due
            if sent < n:
                next_at = t0 + (sent + 1) / tps
                await asyncio.sleep(max(MIN_WRITE_INTERVAL, next_at - loop.time()))
