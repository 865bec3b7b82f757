"""A chat completion's answer, assembled from what the wire brought (openrouter/wire.py).

`read_plain(raw)` reads a plain body whole; `StreamAnswer` assembles a streamed one from
its SSE `data:` payloads (the Http11Pool assembler: http11.py calls `events` with the
payloads of each read). Both give an `Attempt` (openrouter/attempt.py): a complete answer,
or what went wrong. Partial text is never returned as an answer.

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

A streamed chunk is decoded through a lean view (`wire.ChunkView`: only what every chunk
needs), the chunks of one read in one decoder call (`StreamAnswer.events`).
"""

from __future__ import annotations

import itertools

import msgspec

from ..kinds import AttemptKind, RetryCause
from .attempt import Attempt, body_error, midstream_error
from .wire import (
    ChunkView,
    MessageView,
    ReasoningDetail,
    TokenLogprob,
    UsageView,
    body_decoder,
    body_without_logprobs,
    chunk_decoder,
    chunk_without_logprobs,
    chunks_decoder,
    details_decoder,
    head_decoder,
)

__all__ = ["StreamAnswer", "read_plain", "split_inline_think", "spelled_by", "tokens_joined"]


def _token_bytes(t: TokenLogprob) -> bytes:
    """A token's bytes: its `bytes`, else (null, or not bytes at all) its string's UTF-8."""
    if t.bytes is not None:
        try:
            return bytes(t.bytes)
        except ValueError:
            pass
    return t.token.encode("utf-8", "surrogatepass")


def reasoning_text(reasoning: str | None, details: list[ReasoningDetail] | None
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


def sampled_tokens(tokens: list[TokenLogprob], reasoning: str | None, content: str
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


def finish_answer(body_id, provider, model, content, reasoning: tuple[str | None, str],
                  finish_reason, usage: UsageView | None, chunks: int = 0,
                  prompt_ids: list[int] | None = None, output_ids: list[int] | None = None,
                  tokens: list[TokenLogprob] | None = None) -> Attempt:
    """The Attempt for an answer whose parts all came: OK, or a retry when it is empty."""
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

    Per chunk only the lean `ChunkView` view is decoded (several chunks of one read in one
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
        self.details: list[ReasoningDetail] = []
        self.gen_id = self.provider = self.model = self.finish_reason = None
        self.usage: UsageView | None = None
        self.chunks = 0
        self.prompt_ids: list[int] | None = None  # a self-hosted server's (vLLM: 1st chunk;
        self.output_ids: list[int] | None = None  # ... and each chunk's, joined; SGLang: sglext)
        self.tokens: list[TokenLogprob] | None = None  # token logprobs: each chunk's, in order
        self.tokens_lost = False  # a chunk's logprobs were not the schema's: none are kept

    def _has_output(self) -> bool:
        return bool(self.content or self.reasoning or self.details)

    def event(self, payload: bytes) -> Attempt | None:
        if payload == _DONE:
            return self.end(done=True)
        self.chunks += 1
        try:
            chunk = chunk_decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            chunk = chunk_without_logprobs(payload)
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
            chunks = chunks_decoder.decode(b"[" + b",".join(payloads) + b"]")
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

    def _take(self, chunk: ChunkView, payload: bytes) -> Attempt | None:
        if chunk.error is not None:
            return midstream_error(chunk.error, self._has_output())
        if self.gen_id is None:
            try:
                head = head_decoder.decode(payload)
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
                        details = details_decoder.decode(delta.reasoning_details)
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
        return finish_answer(self.gen_id, self.provider, self.model, "".join(self.content),
                             reasoning_text("".join(self.reasoning), self.details),
                             self.finish_reason, self.usage, self.chunks, self.prompt_ids,
                             self.output_ids, None if self.tokens_lost else self.tokens)


def read_plain(raw: bytes) -> Attempt:
    """A plain (non-streamed) 200 body RAW as an Attempt (the answer, or why it is none)."""
    if not raw.strip():
        return Attempt(AttemptKind.RETRY, cause=RetryCause.EMPTY, status=200, message="empty body")
    try:
        body = body_decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        body = body_without_logprobs(raw)
        if body is None:
            return Attempt(AttemptKind.RETRY, cause=RetryCause.BAD_JSON, status=200, message="body is not valid JSON")
    if body.error is not None:
        return body_error(body.error)
    if not body.choices:
        return Attempt(AttemptKind.RETRY, cause=RetryCause.EMPTY, status=200, message="no choices")
    choice = body.choices[0]
    if choice.error is not None or choice.finish_reason == "error":
        return body_error(choice.error or {"message": "finish_reason: error"})
    msg = choice.message or MessageView()
    if choice.finish_reason is None:
        return Attempt(AttemptKind.RETRY, cause=RetryCause.EMPTY, status=200, message="no finish_reason")
    sgl_prompt, sgl_output = body.sglang_ids()
    return finish_answer(body.id, body.provider, body.model, msg.content or "",
                         reasoning_text(msg.reasoning or msg.reasoning_content,
                                        msg.reasoning_details),
                         choice.finish_reason, body.usage,
                         prompt_ids=body.prompt_token_ids if sgl_prompt is None else sgl_prompt,
                         output_ids=choice.token_ids if sgl_output is None else sgl_output,
                         tokens=choice.logprobs.content if choice.logprobs is not None else None)
