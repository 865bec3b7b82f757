"""The reference for kp-infer's streamed answers: how a stream was assembled before the
chunk decode was made lean (tests/test_stream_decode.py compares the two).

One full decode (`wire.BodyView`, every field kimipipe knows) of each `data:` payload, in
order, on its own: the plain, per-event way. It is kept here, not in the product, as the
oracle the lean path (`answer.StreamAnswer`: lean `ChunkView` views, several chunks of one
read in one decoder call, `reasoning_details` left undecoded beside `reasoning`) must
agree with, Attempt for Attempt.
"""

from __future__ import annotations

import msgspec

from kimipipe.kinds import AttemptKind, RetryCause
from kimipipe.openrouter.answer import finish_answer, reasoning_text
from kimipipe.openrouter.attempt import Attempt, midstream_error
from kimipipe.openrouter.wire import body_decoder, body_without_logprobs


class ReferenceAnswer:
    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.details: list = []
        self.gen_id = self.provider = self.model = self.finish_reason = None
        self.usage = None
        self.chunks = 0
        self.prompt_ids: list[int] | None = None
        self.output_ids: list[int] | None = None
        self.tokens: list | None = None  # token logprobs, each chunk's in order
        self.tokens_lost = False

    def _has_output(self) -> bool:
        return bool(self.content or self.reasoning or self.details)

    def event(self, payload: bytes) -> Attempt | None:
        if payload == b"[DONE]":
            return self.end(done=True)
        self.chunks += 1
        try:
            chunk = body_decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            chunk = body_without_logprobs(payload)  # logprobs not the schema's: read without
            if chunk is None:
                return Attempt(AttemptKind.RETRY, cause=RetryCause.BAD_JSON, status=200,
                               message="stream chunk is not valid JSON")
            self.tokens_lost = True
        if chunk.error is not None:
            return midstream_error(chunk.error, self._has_output())
        if self.gen_id is None:
            self.gen_id, self.provider, self.model = chunk.id, chunk.provider, chunk.model
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.prompt_token_ids is not None:
            self.prompt_ids = chunk.prompt_token_ids
        if chunk.sglext is not None:
            sgl_prompt, sgl_output = chunk.sglang_ids()
            if sgl_prompt is not None:
                self.prompt_ids = sgl_prompt
            if sgl_output is not None:
                self.output_ids = sgl_output
        for choice in chunk.choices or ():
            if choice.error is not None or choice.finish_reason == "error":
                return midstream_error(choice.error or {"message": "finish_reason: error"},
                                       self._has_output())
            if choice.token_ids is not None:
                if self.output_ids is None:
                    self.output_ids = []
                self.output_ids.extend(choice.token_ids)
            if choice.logprobs is not None and choice.logprobs.content:
                self.tokens = (self.tokens or []) + choice.logprobs.content
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    self.content.append(delta.content)
                if delta.reasoning or delta.reasoning_content:
                    self.reasoning.append(delta.reasoning or delta.reasoning_content)
                elif delta.reasoning_details:
                    self.details.extend(delta.reasoning_details)
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason
        return None

    def end(self, done: bool = False) -> Attempt:
        if self.finish_reason is None or (not done and self.usage is None):
            if done and not self._has_output():
                return Attempt(AttemptKind.RETRY, cause=RetryCause.EMPTY, status=200,
                               message="stream with no output")
            return Attempt(AttemptKind.RETRY, cause=RetryCause.CUT, status=200,
                           message="stream ended early")
        return finish_answer(self.gen_id, self.provider, self.model, "".join(self.content),
                       reasoning_text("".join(self.reasoning), self.details), self.finish_reason,
                       self.usage, self.chunks, self.prompt_ids, self.output_ids,
                       None if self.tokens_lost else self.tokens)


def sse_payloads(body: bytes) -> list[bytes]:
    """The `data:` payloads of the complete lines of an event-stream body, stripped."""
    lines = body.split(b"\n")[:-1]  # the last piece has no newline yet: not a line
    return [line[5:].strip() for line in lines if line.startswith(b"data:")]


def dechunk(body: bytes) -> tuple[bytes, bool]:
    """A chunked transfer body's data, and whether its last chunk (size 0) came."""
    out, pos = b"", 0
    while True:
        nl = body.find(b"\r\n", pos)
        if nl < 0:
            return out, False
        size = int(body[pos:nl].split(b";")[0], 16)
        if size == 0:
            return out, True
        if len(body) < nl + 2 + size:
            return out + body[nl + 2:], False
        out += body[nl + 2:nl + 2 + size]
        pos = nl + 2 + size + 2


def reference_outcome(response: bytes):
    """What a whole raw 200 event-stream RESPONSE (head and chunked body, as the server
    sent it, up to where it closed) comes to by the reference: the Attempt, or "broken"
    for a body cut before its end with nothing decided."""
    body = response[response.index(b"\r\n\r\n") + 4:]
    data, complete = dechunk(body)
    answer = ReferenceAnswer()
    for payload in sse_payloads(data):
        outcome = answer.event(payload)
        if outcome is not None:
            return outcome
    return answer.end() if complete else "broken"
