"""Self-hosted servers (vLLM, SGLang) as sources of answers, beside or instead of OpenRouter.

`kp-infer --server URL` (repeatable) sends prompts to OpenAI-compatible servers of one's
own (docs/servers.md). A run's transport is then a `Sources`: the servers, each with its
own concurrency (`--server-concurrency`), and OpenRouter's transport when `--openrouter`
is given too (implied when no `--server` is). Each attempt goes to the source with room
whose share of its slots in flight is lowest (`Sources.pick`), so faster servers, which
free their slots sooner, take more prompts; the run's concurrency limit is the sum of the
sources' slots.

To a server, the body kimipipe would send OpenRouter (openrouter/request.py) is sent as
that server takes it (`server_body`): no `provider` object (OpenRouter's routing), thinking
on/off as `chat_template_kwargs` (`thinking`, Kimi's template variable, and
`enable_thinking`, Qwen's and DeepSeek's) instead of the `reasoning` object, vLLM's
`return_token_ids: true` (the sampled IDs come back: `sampled_ids` on the record; SGLang
and older vLLM ignore it), and `stream_options.include_usage` (vLLM and SGLang send usage
in a stream only when asked). The bearer token is `KP_SERVER_API_KEY` (default `EMPTY`):
the OpenRouter key never goes to a server.

A server's answer costs nothing (`cost` 0: no money cap counts it, the token budget does),
its record's `provider` is the server (`host:port`) and its `api` the server's host. A
server that cannot be reached (connection refused or reset, a cut answer) is set aside
for a cooldown that doubles while it stays down (2 s to 60 s), and the attempt is retried
elsewhere as any other failed attempt (backoff, `--max-attempts`); while every server is
down and there is no OpenRouter, the attempts are sent anyway (one may be back). No
source gets more than its slots: with one set aside, an attempt waits for a free slot of
the others (or the end of the cooldown).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import msgspec

from ..kinds import RetryCause
from ..openrouter.attempt import Attempt
from ..openrouter.client import CompletionClient
from .api import api_of

DEFAULT_SERVER_CONCURRENCY = 64
COOLDOWN_MIN, COOLDOWN_MAX = 2.0, 60.0
DOWN_CAUSES = (RetryCause.CONNECTION, RetryCause.CUT, RetryCause.STALE, RetryCause.TIMEOUT)
# OpenRouter's own fields, meaningless to a self-hosted server
OPENROUTER_ONLY = ("provider", "reasoning", "reasoning_effort", "include_reasoning",
                   "transforms", "models", "route", "usage")

_json = msgspec.json


def server_name(url: str) -> str:
    """How a record names a server (its `provider`): host:port of its URL."""
    parts = urlsplit(url)
    host = parts.hostname or url
    return f"{host}:{parts.port}" if parts.port else host


def thinking_asked(body: dict) -> bool | None:
    """Thinking on/off as the OpenRouter body asks it (None: the model's default)."""
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict):
        if reasoning.get("enabled") is False or reasoning.get("effort") == "none":
            return False
        if reasoning.get("enabled") or reasoning.get("effort") or reasoning.get("max_tokens"):
            return True
    return None


def server_body(body: bytes) -> bytes:
    """The request for a self-hosted server, from the OpenRouter request BODY."""
    fields = _json.decode(body)
    thinking = thinking_asked(fields)
    for name in OPENROUTER_ONLY:
        fields.pop(name, None)
    if thinking is not None:
        kwargs = fields.get("chat_template_kwargs")
        kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
        kwargs.setdefault("thinking", thinking)
        kwargs.setdefault("enable_thinking", thinking)
        fields["chat_template_kwargs"] = kwargs
    fields.setdefault("return_token_ids", True)
    if fields.get("stream"):
        fields["stream_options"] = {**(fields.get("stream_options") or {}), "include_usage": True}
    return _json.encode(fields)


@dataclass
class Source:
    """One place answers come from: a server, or OpenRouter (`server` False)."""

    name: str
    transport: object  # CompletionClient, or OpenRouter's transport (infer/process_pool.py)
    capacity: int
    server: bool = True
    api: str | None = None
    in_flight: int = 0
    down_until: float = 0.0
    cooldown: float = COOLDOWN_MIN
    sent: int = field(default=0)

    def up(self, now: float) -> bool:
        return now >= self.down_until


class Sources:
    """The run's transport over several sources (see the module docstring)."""

    def __init__(self, sources: list[Source]):
        self.sources = sources
        self._freed = asyncio.Event()  # set whenever a slot of some source is given back

    @classmethod
    def for_run(cls, servers: list[str], concurrency: int, idle_timeout: float,
                openrouter=None, openrouter_concurrency: int = 0) -> Sources:
        key = os.environ.get("KP_SERVER_API_KEY") or "EMPTY"
        sources = [Source(server_name(url), CompletionClient(url, key, idle_timeout=idle_timeout),
                          concurrency, api=api_of(url)) for url in servers]
        if openrouter is not None:
            sources.append(Source("openrouter", openrouter, openrouter_concurrency, server=False))
        return cls(sources)

    @property
    def capacity(self) -> int:
        return sum(s.capacity for s in self.sources)

    async def __aenter__(self) -> Sources:
        for s in self.sources:
            await s.transport.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        for s in self.sources:
            await s.transport.__aexit__(*exc)

    def pick(self) -> Source | None:
        """The source with room whose slots are least in use, among those up (all of them
        while none is); None when none of those has a free slot."""
        now = time.monotonic()
        up = [s for s in self.sources if s.up(now)] or self.sources
        room = [s for s in up if s.in_flight < s.capacity]
        return min(room, key=lambda s: (s.in_flight / s.capacity, s.sent)) if room else None

    async def _source(self) -> Source:
        """A source with a free slot: the run admits up to every source's slots, so with a
        server set aside the others' fill up, and an attempt waits here for one of their
        slots (or for the cooldown to end) rather than going past a server's concurrency."""
        while (source := self.pick()) is None:
            self._freed.clear()
            try:
                await asyncio.wait_for(self._freed.wait(), timeout=COOLDOWN_MIN)
            except TimeoutError:
                pass
        return source

    async def attempt(self, body: bytes, stream: bool) -> Attempt:
        source = await self._source()
        source.in_flight += 1
        source.sent += 1
        try:
            if not source.server:
                return await source.transport.attempt(body, stream)
            result = await source.transport.attempt(server_body(body), stream)
        finally:
            source.in_flight -= 1
            self._freed.set()
        if result.cause in DOWN_CAUSES:
            source.down_until = time.monotonic() + source.cooldown
            source.cooldown = min(COOLDOWN_MAX, source.cooldown * 2)
            result.message = f"{source.name}: {result.message}"
        else:
            source.cooldown = COOLDOWN_MIN
        # what the server answered is the server's: its name, its host, no bill
        result.provider = source.name
        result.api = source.api
        if result.cost is None:
            result.cost = 0.0
        return result
