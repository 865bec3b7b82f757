"""What kimipipe reads of a chat completion on the wire: msgspec views and their decoders.

A plain answer's body (`BodyView`), a generation's cost (`GenerationView`), a streamed chunk (`ChunkView`, the lean view read from
every chunk, and `ChunkHead`, read once per stream for who answered), and the lenient
twins (`Lenient*`) that read a body or a chunk whose `logprobs` are not the schema's shape
without them (the answer is kept: it was paid for). msgspec skips every field not named
here without making objects, so a field kimipipe starts to read is one more optional field
on the view that carries it (a new field gets a default, a type never changes).

The answer is assembled from these in openrouter/answer.py; the HTTP in openrouter/client.py.
"""

from __future__ import annotations

import msgspec


# Typed views of what we read from the wire; msgspec skips every other field fast.
# gc=False: decoded JSON cannot form reference cycles, and thousands of these are made
# per second while streaming; the garbage collector need not track them.
class ReasoningDetail(msgspec.Struct, gc=False):
    type: str | None = None
    text: str | None = None


class Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None  # vLLM's and SGLang's reasoning parsers
    reasoning_details: list[ReasoningDetail] | None = None


class MessageView(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None  # vLLM's and SGLang's reasoning parsers
    reasoning_details: list[ReasoningDetail] | None = None


class TokenLogprob(msgspec.Struct, gc=False):
    """One sampled token of `logprobs.content[]` (OpenAPI ChatTokenLogprob): its `token`
    string and its `bytes` (null: the string's UTF-8 stands for them); logprob and
    top_logprobs unread. (Byte values are small ints: CPython shares them, so a token's
    list costs one allocation.)"""

    token: str = ""
    bytes: list[int] | None = None



class Logprobs(msgspec.Struct, gc=False):
    content: list[TokenLogprob] | None = None


class Choice(msgspec.Struct, gc=False):
    delta: Delta | None = None
    message: MessageView | None = None
    finish_reason: str | None = None
    error: dict | None = None
    token_ids: list[int] | None = None  # vLLM's return_token_ids (a stream: this chunk's)
    logprobs: Logprobs | None = None  # the sampled tokens (`logprobs: true`)


class CompletionDetails(msgspec.Struct, gc=False):
    reasoning_tokens: int | None = None


class PromptDetails(msgspec.Struct, gc=False):
    cached_tokens: int | None = None


class UsageView(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None
    completion_tokens_details: CompletionDetails | None = None
    prompt_tokens_details: PromptDetails | None = None


class SglExt(msgspec.Struct, gc=False):
    """SGLang's response-level extension (return_input_ids_in_sglext, ..._output_ids_...):
    the prompt's IDs, and the generated IDs of each choice; streamed, in one chunk."""

    input_ids: list[int] | None = None
    output_ids: list[list[int]] | None = None


class BodyView(msgspec.Struct, gc=False):
    id: str | None = None
    provider: str | None = None
    model: str | None = None
    choices: list[Choice] | None = None
    usage: UsageView | None = None
    error: dict | None = None
    prompt_token_ids: list[int] | None = None  # vLLM's return_token_ids (a stream: 1st chunk)
    sglext: SglExt | None = None  # SGLang's IDs (infer/servers.py)

    def sglang_ids(self) -> tuple[list[int] | None, list[int] | None]:
        """(prompt IDs, the first choice's generated IDs) from `sglext`, (None, None) without."""
        ext = self.sglext
        if ext is None:
            return None, None
        return ext.input_ids, (ext.output_ids[0] if ext.output_ids else None)


body_decoder = msgspec.json.Decoder(BodyView)


class LenientChoice(Choice, gc=False):
    logprobs: msgspec.Raw = msgspec.Raw(b"null")  # any shape: read as none


class LenientBody(BodyView, gc=False):
    choices: list[LenientChoice] | None = None


_lenient_decoder = msgspec.json.Decoder(LenientBody)


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


def body_without_logprobs(raw: bytes) -> BodyView | None:
    return _read_without_logprobs(_lenient_decoder, raw)


_NO_RAW = msgspec.Raw()


class ChunkDelta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None  # vLLM's and SGLang's reasoning parsers
    # OpenRouter repeats `reasoning` in `reasoning_details`: kept undecoded (a slice of the
    # chunk's bytes) and decoded only in a delta that has no `reasoning` of its own
    reasoning_details: msgspec.Raw = _NO_RAW


class ChunkChoice(msgspec.Struct, gc=False):
    delta: ChunkDelta | None = None
    finish_reason: str | None = None
    error: dict | None = None
    token_ids: list[int] | None = None  # vLLM's return_token_ids: this chunk's
    logprobs: Logprobs | None = None  # this chunk's sampled tokens (`logprobs: true`)


class ChunkView(msgspec.Struct, gc=False):
    """One streamed chunk, only what StreamAnswer reads of every chunk: msgspec skips the
    rest (id, model, provider, object, created, ...) without making objects.

    A field that must be read from every chunk (each choice's `logprobs`) is one more
    optional field on `ChunkChoice`, gathered in a list per answer by
    `StreamAnswer._take` and joined once in `StreamAnswer.end`."""

    choices: list[ChunkChoice] | None = None
    usage: UsageView | None = None
    error: dict | None = None
    prompt_token_ids: list[int] | None = None  # vLLM's return_token_ids: the 1st chunk
    sglext: SglExt | None = None  # SGLang's IDs, in a chunk of their own

    def sglang_ids(self) -> tuple[list[int] | None, list[int] | None]:
        return BodyView.sglang_ids(self)


class ChunkHead(msgspec.Struct, gc=False):
    """Who answered: read from the first chunk that names its generation (not every chunk)."""

    id: str | None = None
    provider: str | None = None
    model: str | None = None


class LenientChunkChoice(ChunkChoice, gc=False):
    logprobs: msgspec.Raw = msgspec.Raw(b"null")  # any shape: read as none


class LenientChunk(ChunkView, gc=False):
    choices: list[LenientChunkChoice] | None = None


_lenient_chunk_decoder = msgspec.json.Decoder(LenientChunk)


def chunk_without_logprobs(raw: bytes) -> ChunkView | None:
    return _read_without_logprobs(_lenient_chunk_decoder, raw)


chunk_decoder = msgspec.json.Decoder(ChunkView)
chunks_decoder = msgspec.json.Decoder(list[ChunkView])
head_decoder = msgspec.json.Decoder(ChunkHead)
details_decoder = msgspec.json.Decoder(list[ReasoningDetail] | None)


class GenerationData(msgspec.Struct, gc=False):
    total_cost: float  # USD; an int is taken as a float, a bool or a string is not


class GenerationView(msgspec.Struct, gc=False):
    """`GET /generation?id=`'s answer: what one generation cost (openrouter/client.py)."""

    data: GenerationData


generation_decoder = msgspec.json.Decoder(GenerationView)
