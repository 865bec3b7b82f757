"""The records that flow between kimipipe's stages: the contract of the pipeline.

One msgspec Struct per record kind. Every stage reads the previous stage's record,
validates the fields it needs, and passes through every field it does not own, so that
a pipeline can be cut and resumed at any stage:

    kp-prompts  -> Prompt    {id, dataset, messages, meta?}
    kp-infer    -> Response  Prompt + {response, finish_reason, model, provider,
                                       generation_id, usage, attempts}
    kp-tokenize -> Tokens    Response + {input_ids, output_ids}

Schema evolution follows msgspec's rules: new fields get defaults, types never change.
Decoders and encoders are built once here and reused (msgspec's perf tips).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Raw, Struct

Role = Literal["system", "user", "assistant"]


class Message(Struct, omit_defaults=True):
    role: Role
    content: str


class Prompt(Struct, omit_defaults=True):
    id: str
    dataset: str
    messages: list[Message]
    meta: dict[str, Any] | None = None


class ResponseText(Struct):
    content: str
    reasoning: str | None = None


class Usage(Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float = 0.0


class Response(Struct, omit_defaults=True):
    id: str
    dataset: str
    messages: list[Message]
    response: ResponseText
    finish_reason: str | None
    model: str
    provider: str | None
    generation_id: str | None
    usage: Usage
    attempts: int = 1
    meta: dict[str, Any] | None = None


class Tokens(Struct, omit_defaults=True):
    id: str
    dataset: str
    input_ids: list[int]
    output_ids: list[int]
    finish_reason: str | None = None


class IdOnly(Struct):
    """What resume needs from a finished record: its id (msgspec skips the rest fast)."""

    id: str


class CostOnly(Struct):
    """What budget accounting needs from a finished response record."""

    id: str
    usage: Usage = msgspec.field(default_factory=Usage)


RECORD_TYPES: dict[str, type[Struct]] = {
    "prompt": Prompt,
    "response": Response,
    "tokens": Tokens,
}

_encoder = msgspec.json.Encoder()
_passthrough_decoder = msgspec.json.Decoder(dict[str, Raw])


def encode_line(obj: Any, buffer: bytearray | None = None) -> bytes:
    """One record as one JSON line, newline included."""
    buf = bytearray() if buffer is None else buffer
    _encoder.encode_into(obj, buf)
    buf.extend(b"\n")
    return bytes(buf)


def decode_passthrough(line: bytes) -> dict[str, Raw]:
    """The record's fields as undecoded JSON, to carry fields a stage does not own."""
    return _passthrough_decoder.decode(line)


def merge_fields(passthrough: dict[str, Raw] | None, owned: dict[str, Any]) -> dict[str, Any]:
    """The input record with the stage's own fields written over it (key order kept)."""
    out: dict[str, Any] = dict(passthrough) if passthrough else {}
    out.update(owned)
    return out


def struct_fields(obj: Struct) -> dict[str, Any]:
    """A Struct's fields, leaving out those at their default (as its encoder would)."""
    return msgspec.to_builtins(obj)
