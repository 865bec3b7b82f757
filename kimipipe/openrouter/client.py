"""One chat completion attempt against OpenRouter: the HTTP layer of kp-infer.

`CompletionClient.attempt(body, stream)` sends one request and returns an `Attempt`
(openrouter/attempt.py): a complete answer, or what went wrong, classified as retry,
permanent, payment, auth or no_route. Partial text is never returned as an answer.

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
waking the reading task per segment), Http11Pool less on both. The client holds no run
state, so it can live in a worker process (kimipipe/infer/process_pool.py). A streamed
chunk is decoded through a lean view (`_Chunk`: only what every chunk needs), the chunks
of one read in one decoder call (`StreamAnswer.events`).

Reasoning is read from `reasoning`, else the `reasoning.text` entries of
`reasoning_details`, else a leading `<think>...</think>` in the content (then cut from it;
an unclosed `<think>` in an answer cut by `max_tokens` is all reasoning); the Attempt says
which (`reasoning_source`: field, details or inline).

Token logprobs (`logprobs: true`): each choice's `logprobs.content[]` tokens are kept in
order (a stream: each chunk's appended; nothing is done for a chunk without them) and
joined once, at the answer's end (`sampled_tokens`): each token's length in bytes, and
their bytes unless they are exactly the answer's text. No tokenizer is read here. A chunk
whose `logprobs` are not the schema's shape is read without them (the answer is kept; it
was paid for) and the answer keeps no tokens.
"""

from __future__ import annotations

import itertools

import msgspec

from ..errors import redact
from ..kinds import AttemptKind, RetryCause
from .attempt import Attempt, body_error, error_attempt, midstream_error, retry_after_seconds
from .http11 import Http11Pool
from .outcomes import Broken, CollectedResponse, Stalled
from .proxy import ProxyError

__all__ = ["Attempt", "CompletionClient", "StreamAnswer", "split_inline_think", "spelled_by",
           "tokens_joined"]


# Typed views of what we read from the wire; msgspec skips every other field fast.
# gc=False: decoded JSON cannot form reference cycles, and thousands of these are made
# per second while streaming; the garbage collector need not track them.
class _ReasoningDetail(msgspec.Struct, gc=False):
    type: str | None = None
    text: str | None = None


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None  # vLLM's and SGLang's reasoning parsers
    reasoning_details: list[_ReasoningDetail] | None = None


class _Message(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None  # vLLM's and SGLang's reasoning parsers
    reasoning_details: list[_ReasoningDetail] | None = None


class _TokenLogprob(msgspec.Struct, gc=False):
    """One sampled token of `logprobs.content[]` (OpenAPI ChatTokenLogprob): its `token`
    string and its `bytes` (null: the string's UTF-8 stands for them); logprob and
    top_logprobs unread. (Byte values are small ints: CPython shares them, so a token's
    list costs one allocation.)"""

    token: str = ""
    bytes: list[int] | None = None


def _token_bytes(t: _TokenLogprob) -> bytes:
    """A token's bytes: its `bytes`, else (null, or not bytes at all) its string's UTF-8."""
    if t.bytes is not None:
        try:
            return bytes(t.bytes)
        except ValueError:
            pass
    return t.token.encode("utf-8", "surrogatepass")


class _Logprobs(msgspec.Struct, gc=False):
    content: list[_TokenLogprob] | None = None


class _Choice(msgspec.Struct, gc=False):
    delta: _Delta | None = None
    message: _Message | None = None
    finish_reason: str | None = None
    error: dict | None = None
    token_ids: list[int] | None = None  # vLLM's return_token_ids (a stream: this chunk's)
    logprobs: _Logprobs | None = None  # the sampled tokens (`logprobs: true`)


class _CompletionDetails(msgspec.Struct, gc=False):
    reasoning_tokens: int | None = None


class _PromptDetails(msgspec.Struct, gc=False):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None
    completion_tokens_details: _CompletionDetails | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _SglExt(msgspec.Struct, gc=False):
    """SGLang's response-level extension (return_input_ids_in_sglext, ..._output_ids_...):
    the prompt's IDs, and the generated IDs of each choice; streamed, in one chunk."""

    input_ids: list[int] | None = None
    output_ids: list[list[int]] | None = None


class _Body(msgspec.Struct, gc=False):
    id: str | None = None
    provider: str | None = None
    model: str | None = None
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: dict | None = None
    prompt_token_ids: list[int] | None = None  # vLLM's return_token_ids (a stream: 1st chunk)
    sglext: _SglExt | None = None  # SGLang's IDs (infer/servers.py)

    def sglang_ids(self) -> tuple[list[int] | None, list[int] | None]:
        """(prompt IDs, the first choice's generated IDs) from `sglext`, (None, None) without."""
        ext = self.sglext
        if ext is None:
            return None, None
        return ext.input_ids, (ext.output_ids[0] if ext.output_ids else None)


_body_decoder = msgspec.json.Decoder(_Body)


class _LenientChoice(_Choice, gc=False):
    logprobs: msgspec.Raw = msgspec.Raw(b"null")  # any shape: read as none


class _LenientBody(_Body, gc=False):
    choices: list[_LenientChoice] | None = None


_lenient_decoder = msgspec.json.Decoder(_LenientBody)


def _read_without_logprobs(decoder: msgspec.json.Decoder, raw: bytes):
    """RAW (a body, or a chunk) read by the lenient DECODER with its `logprobs` left out,
    for one whose logprobs are not the schema's shape: the answer is kept (it was paid
    for), its tokens are not. None when it is not a body (a chunk) even so."""
    try:
        read = decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    for choice in read.choices or ():
        choice.logprobs = None
    return read


def _without_logprobs(raw: bytes) -> _Body | None:
    return _read_without_logprobs(_lenient_decoder, raw)


def _reasoning_text(reasoning: str | None, details: list[_ReasoningDetail] | None
                    ) -> tuple[str | None, str]:
    """(the reasoning, where it came from: `field`, `details` or "" for none)."""
    if reasoning:
        return reasoning, "field"
    if details:
        text = "".join(d.text or "" for d in details if d.type == "reasoning.text")
        return (text, "details") if text else (None, "")
    return None, ""


def split_inline_think(content: str, reasoning: str | None, cut: bool = False
                       ) -> tuple[str, str | None]:
    """Providers that put reasoning inline as a leading `<think>...</think>` in content.

    CUT (`finish_reason: length`): a `<think>` that never closed is reasoning that ran into
    `max_tokens`, all of it (the content never began)."""
    if reasoning is None and content.startswith("<think>"):
        end = content.find("</think>")
        if end >= 0:
            return content[end + len("</think>"):], content[len("<think>"):end]
        if cut:
            return "", content[len("<think>"):]
    return content, reasoning


# An answer's tokens are kept only while their bytes stay within this many times the
# answer's text (plus a little): a record's size stays bounded whatever a provider sends.
TOKENS_MAX_RATIO = 2
TOKENS_MAX_SLACK = 4096


def sampled_tokens(tokens: list[_TokenLogprob], reasoning: str | None, content: str
                   ) -> tuple[list[int], bytes | None, str, int] | None:
    """An answer's tokens, joined once at its end: (each token's length in bytes, their
    bytes joined or None where they are exactly a text of the answer, which text: "answer"
    (reasoning then content) or "content", how many had null `bytes`). None when there are
    none, or more bytes than the bound above.

    The bytes are each token's `bytes` (the token string's UTF-8 only where they are null,
    or not bytes at all): the strings of a partial UTF-8 token are not its bytes, and a
    token whose bytes are wrong must not pass for its string. With no null, all are joined
    in one C call."""
    if not tokens:
        return None
    lists = [t.bytes for t in tokens]
    nulls = lists.count(None)
    joined = lengths = None
    if not nulls:
        try:
            joined = bytes(itertools.chain.from_iterable(lists))
            lengths = list(map(len, lists))
        except ValueError:  # an integer past 255: each token on its own, below
            joined = None
    if joined is None:
        pieces = [_token_bytes(t) for t in tokens]
        joined = b"".join(pieces)
        lengths = list(map(len, pieces))
    answer = ((reasoning or "") + content).encode("utf-8")
    if len(joined) > TOKENS_MAX_RATIO * len(answer) + TOKENS_MAX_SLACK:
        return None
    return (lengths, *spelled_by(joined, reasoning, content), nulls)


def spelled_by(joined: bytes, reasoning: str | None, content: str) -> tuple[bytes | None, str]:
    """(the tokens' bytes JOINED, or None where they are exactly a text of the answer;
    which text: "answer", "content", or "" for none)."""
    content_bytes = content.encode("utf-8")
    if joined == (reasoning or "").encode("utf-8") + content_bytes:
        return None, "answer"
    if joined == content_bytes:
        return None, "content"
    return joined, ""


def tokens_joined(answer: Attempt) -> bytes | None:
    """ANSWER's sampled tokens' bytes, joined (None: it has none)."""
    if answer.token_lengths is None:
        return None
    if answer.token_spells == "answer":
        return ((answer.reasoning or "") + answer.content).encode("utf-8")
    if answer.token_spells == "content":
        return answer.content.encode("utf-8")
    return answer.token_data


def _finish(body_id, provider, model, content, reasoning: tuple[str | None, str], finish_reason,
            usage: _Usage | None, chunks: int = 0, prompt_ids: list[int] | None = None,
            output_ids: list[int] | None = None,
            tokens: list[_TokenLogprob] | None = None) -> Attempt:
    text, source = reasoning
    content, text = split_inline_think(content, text or None, cut=finish_reason == "length")
    if text and not source:
        source = "inline"
    if not content and not text:
        return Attempt(AttemptKind.RETRY, cause=RetryCause.EMPTY, status=200, message="empty output")
    details = usage.completion_tokens_details if usage else None
    cached = usage.prompt_tokens_details if usage else None
    joined = sampled_tokens(tokens, text, content) if tokens else None
    return Attempt(
        AttemptKind.OK, status=200, content=content, reasoning=text, finish_reason=finish_reason,
        provider=provider, model=model, generation_id=body_id,
        prompt_tokens=(usage.prompt_tokens or 0) if usage else 0,
        completion_tokens=(usage.completion_tokens or 0) if usage else 0,
        reasoning_tokens=(details.reasoning_tokens or 0) if details else 0,
        cost=usage.cost if usage else None, chunks=chunks, reasoning_source=source,
        cached_tokens=(cached.cached_tokens or 0) if cached else 0,
        usage_seen=usage is not None, prompt_ids=prompt_ids, output_ids=output_ids,
        token_lengths=joined[0] if joined else None, token_data=joined[1] if joined else None,
        token_spells=joined[2] if joined else "", token_nulls=joined[3] if joined else 0,
    )


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

    async def attempt(self, body: bytes, stream: bool) -> Attempt:
        assert self._entered, "use `async with CompletionClient(...)`"
        try:
            outcome = await self._pool.post(body, StreamAnswer(self._stopped) if stream else None)
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
                return self._read_plain(outcome.body)
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

    @staticmethod
    def _read_plain(raw: bytes) -> Attempt:
        if not raw.strip():
            return Attempt(AttemptKind.RETRY, cause=RetryCause.EMPTY, status=200, message="empty body")
        try:
            body = _body_decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            body = _without_logprobs(raw)
            if body is None:
                return Attempt(AttemptKind.RETRY, cause=RetryCause.BAD_JSON, status=200, message="body is not valid JSON")
        if body.error is not None:
            return body_error(body.error)
        if not body.choices:
            return Attempt(AttemptKind.RETRY, cause=RetryCause.EMPTY, status=200, message="no choices")
        choice = body.choices[0]
        if choice.error is not None or choice.finish_reason == "error":
            return body_error(choice.error or {"message": "finish_reason: error"})
        msg = choice.message or _Message()
        if choice.finish_reason is None:
            return Attempt(AttemptKind.RETRY, cause=RetryCause.EMPTY, status=200, message="no finish_reason")
        sgl_prompt, sgl_output = body.sglang_ids()
        return _finish(body.id, body.provider, body.model, msg.content or "",
                       _reasoning_text(msg.reasoning or msg.reasoning_content,
                                       msg.reasoning_details),
                       choice.finish_reason, body.usage,
                       prompt_ids=body.prompt_token_ids if sgl_prompt is None else sgl_prompt,
                       output_ids=choice.token_ids if sgl_output is None else sgl_output,
                       tokens=choice.logprobs.content if choice.logprobs is not None else None)


_NO_RAW = msgspec.Raw()


class _ChunkDelta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None  # vLLM's and SGLang's reasoning parsers
    # OpenRouter repeats `reasoning` in `reasoning_details`: kept undecoded (a slice of the
    # chunk's bytes) and decoded only in a delta that has no `reasoning` of its own
    reasoning_details: msgspec.Raw = _NO_RAW


class _ChunkChoice(msgspec.Struct, gc=False):
    delta: _ChunkDelta | None = None
    finish_reason: str | None = None
    error: dict | None = None
    token_ids: list[int] | None = None  # vLLM's return_token_ids: this chunk's
    logprobs: _Logprobs | None = None  # this chunk's sampled tokens (`logprobs: true`)


class _Chunk(msgspec.Struct, gc=False):
    """One streamed chunk, only what StreamAnswer reads of every chunk: msgspec skips the
    rest (id, model, provider, object, created, ...) without making objects.

    A field that must be read from every chunk (each choice's `logprobs`) is one more
    optional field on `_ChunkChoice`, gathered in a list per answer by
    `StreamAnswer._take` and joined once in `StreamAnswer.end`."""

    choices: list[_ChunkChoice] | None = None
    usage: _Usage | None = None
    error: dict | None = None
    prompt_token_ids: list[int] | None = None  # vLLM's return_token_ids: the 1st chunk
    sglext: _SglExt | None = None  # SGLang's IDs, in a chunk of their own

    def sglang_ids(self) -> tuple[list[int] | None, list[int] | None]:
        return _Body.sglang_ids(self)


class _ChunkHead(msgspec.Struct, gc=False):
    """Who answered: read from the first chunk that names its generation (not every chunk)."""

    id: str | None = None
    provider: str | None = None
    model: str | None = None


class _LenientChunkChoice(_ChunkChoice, gc=False):
    logprobs: msgspec.Raw = msgspec.Raw(b"null")  # any shape: read as none


class _LenientChunk(_Chunk, gc=False):
    choices: list[_LenientChunkChoice] | None = None


_lenient_chunk_decoder = msgspec.json.Decoder(_LenientChunk)


def _chunk_without_logprobs(raw: bytes) -> _Chunk | None:
    return _read_without_logprobs(_lenient_chunk_decoder, raw)


_chunk_decoder = msgspec.json.Decoder(_Chunk)
_chunks_decoder = msgspec.json.Decoder(list[_Chunk])
_head_decoder = msgspec.json.Decoder(_ChunkHead)
_details_decoder = msgspec.json.Decoder(list[_ReasoningDetail] | None)
_NOT_JSON = "stream chunk is not valid JSON"
_DONE = b"[DONE]"


def _not_json() -> Attempt:
    return Attempt(AttemptKind.RETRY, cause=RetryCause.BAD_JSON, status=200, message=_NOT_JSON)


class StreamAnswer:
    """Assembles one streamed answer from its SSE `data:` payloads (the Http11Pool assembler).

    `events(payloads)` takes the payloads one read of the socket brought, in order, and
    returns an Attempt once the answer is decided ([DONE], an error chunk, a chunk that is
    not JSON), else None; `event(payload)` is the same for one. `end()` gives the Attempt
    for a body that ended without [DONE]. Partial text is never returned as an answer.

    Per chunk only the lean `_Chunk` view is decoded (several chunks of one read in one
    decoder call) and its text appended; the generation's id, provider and model are read
    once, `reasoning_details` only from a chunk without `reasoning`, and everything else
    (joining, the reasoning's source, the Attempt) waits for the end of the answer.
    """

    __slots__ = ("content", "reasoning", "details", "gen_id", "provider", "model",
                 "finish_reason", "usage", "chunks", "prompt_ids", "output_ids", "tokens",
                 "tokens_lost", "stopped", "abandon")

    def __init__(self, stopped: set[str] | frozenset[str] = frozenset()) -> None:
        # providers (lower-case) whose streams are closed as soon as they are known: the
        # client's set, shared by every stream (`CompletionClient.cancel_streams_of`)
        self.stopped = stopped
        self.abandon = False  # decided by `cancel`: the connection is closed (http11.py)
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.details: list[_ReasoningDetail] = []
        self.gen_id = self.provider = self.model = self.finish_reason = None
        self.usage: _Usage | None = None
        self.chunks = 0
        self.prompt_ids: list[int] | None = None  # a self-hosted server's (vLLM: 1st chunk;
        self.output_ids: list[int] | None = None  # ... and each chunk's, joined; SGLang: sglext)
        self.tokens: list[_TokenLogprob] | None = None  # token logprobs: each chunk's, in order
        self.tokens_lost = False  # a chunk's logprobs were not the schema's: none are kept

    def _has_output(self) -> bool:
        return bool(self.content or self.reasoning or self.details)

    def event(self, payload: bytes) -> Attempt | None:
        if payload == _DONE:
            return self.end(done=True)
        self.chunks += 1
        try:
            chunk = _chunk_decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            chunk = _chunk_without_logprobs(payload)
            if chunk is None:
                return _not_json()
            self.tokens_lost = True
        return self._take(chunk, payload)

    def events(self, payloads: list[bytes]) -> Attempt | None:
        if len(payloads) == 1:  # the usual read: one chunk
            return self.event(payloads[0])
        done = _DONE in payloads
        if done:  # what follows [DONE] is not part of the answer
            payloads = payloads[:payloads.index(_DONE)]
        try:  # one decoder call for the whole read
            chunks = _chunks_decoder.decode(b"[" + b",".join(payloads) + b"]")
        except (msgspec.DecodeError, msgspec.ValidationError):
            chunks = None
        # (a payload that is itself several values, "{...},{...}", would not decode alone)
        if chunks is None or len(chunks) != len(payloads):
            for payload in payloads:  # decided at the first payload that is not a chunk
                outcome = self.event(payload)
                if outcome is not None:
                    return outcome
        else:
            self.chunks += len(payloads)
            take = self._take
            for chunk, payload in zip(chunks, payloads, strict=True):
                outcome = take(chunk, payload)
                if outcome is not None:
                    return outcome
        return self.end(done=True) if done else None

    def _take(self, chunk: _Chunk, payload: bytes) -> Attempt | None:
        if chunk.error is not None:
            return midstream_error(chunk.error, self._has_output())
        if self.gen_id is None:
            try:
                head = _head_decoder.decode(payload)
            except msgspec.ValidationError:
                return _not_json()
            self.gen_id, self.provider, self.model = head.id, head.provider, head.model
            if self.stopped and (self.provider or "").lower() in self.stopped:
                return self.cancel()  # (sent before its provider was quarantined)
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.prompt_token_ids is not None:
            self.prompt_ids = chunk.prompt_token_ids
        if chunk.sglext is not None:  # SGLang: every ID at once, in a chunk of its own
            sgl_prompt, sgl_output = chunk.sglang_ids()
            if sgl_prompt is not None:
                self.prompt_ids = sgl_prompt
            if sgl_output is not None:
                self.output_ids = sgl_output
        for choice in chunk.choices or ():
            finish = choice.finish_reason
            if choice.error is not None or finish == "error":
                return midstream_error(choice.error or {"message": "finish_reason: error"}, self._has_output())
            if choice.token_ids is not None:
                if self.output_ids is None:
                    self.output_ids = []
                self.output_ids.extend(choice.token_ids)
            if choice.logprobs is not None and choice.logprobs.content:
                if self.tokens is None:
                    self.tokens = []
                self.tokens.extend(choice.logprobs.content)
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    self.content.append(delta.content)
                if delta.reasoning or delta.reasoning_content:
                    self.reasoning.append(delta.reasoning or delta.reasoning_content)
                elif delta.reasoning_details:
                    try:
                        details = _details_decoder.decode(delta.reasoning_details)
                    except msgspec.ValidationError:
                        return _not_json()
                    if details:
                        self.details.extend(details)
            if finish is not None:
                self.finish_reason = finish
        return None

    def cancel(self) -> Attempt | None:
        """Give up this stream (its provider was quarantined): the Attempt that says so,
        with the generation's id for its cost (GET /generation: a cancelled generation may
        be billed), and `abandon` set so that the connection is closed, which is what
        stops the generation at the providers that honour a cancel. None when the answer
        is whole already (its finish and usage came): it ends as usual, its cost known."""
        if self.finish_reason is not None and self.usage is not None:
            return None
        self.abandon = True
        return Attempt(AttemptKind.CANCELLED, status=200, provider=self.provider,
                       model=self.model, generation_id=self.gen_id, chunks=self.chunks,
                       usage_seen=False, message=(
                           f"stream closed after {self.chunks} chunks: its provider "
                           f"{self.provider} was quarantined for identity"))

    def salvage(self) -> Attempt | None:
        """The connection broke before `[DONE]`: the answer when its finish and its usage
        came (all `[DONE]` adds is the end; the answer is whole and billed), else None."""
        if self.finish_reason is None or self.usage is None:
            return None
        return self.end()

    def end(self, done: bool = False) -> Attempt:
        if self.finish_reason is None or (not done and self.usage is None):
            # Without a finish_reason the answer is partial; without [DONE] and usage we
            # cannot tell what was billed. Never saved as a result.
            if done and not self._has_output():
                return Attempt(AttemptKind.RETRY, cause=RetryCause.EMPTY, status=200, message="stream with no output")
            return Attempt(AttemptKind.RETRY, cause=RetryCause.CUT, status=200, message="stream ended early")
        return _finish(self.gen_id, self.provider, self.model, "".join(self.content),
                       _reasoning_text("".join(self.reasoning), self.details), self.finish_reason,
                       self.usage, self.chunks, self.prompt_ids, self.output_ids,
                       None if self.tokens_lost else self.tokens)
