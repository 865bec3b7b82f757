"""Alpaca: `{"instruction": str, "input": str?, "system": str?}`: one user turn, the
instruction and its input joined by a blank line (the `output` is the source's answer)."""

from __future__ import annotations

from ..conversation import FormatError, text_of

DETECT = ("instruction",)


def messages(obj: dict) -> list[dict]:
    if "instruction" not in obj:
        raise FormatError("missing field `instruction`")
    text = text_of(obj["instruction"], "$.instruction")
    extra = obj.get("input")
    if extra:
        text = f"{text}\n\n{text_of(extra, '$.input')}"
    out = []
    if obj.get("system"):
        out.append({"role": "system", "content": text_of(obj["system"], "$.system")})
    out.append({"role": "user", "content": text})
    return out
