"""A bare prompt: `{"prompt": str}` or `{"text": str}`, one user turn (also what
`--format text` makes of each line)."""

from __future__ import annotations

from ..conversation import FormatError, text_of

DETECT = ("prompt", "text")


def messages(obj: dict) -> list[dict]:
    key = "prompt" if "prompt" in obj else "text" if "text" in obj else None
    if key is None:
        raise FormatError("missing field `prompt` (or `text`)")
    return [{"role": "user", "content": text_of(obj[key], f"$.{key}")}]
