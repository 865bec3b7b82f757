"""A bare prompt: `{"prompt": str}` or `{"text": str}`, one user turn (also what
`--format text` makes of each line)."""

from __future__ import annotations

from ..conversation import Conversation, FormatError, plain, text_of

DETECT = ("prompt", "text")


def conversation(obj: dict) -> Conversation:
    key = "prompt" if "prompt" in obj else "text" if "text" in obj else None
    if key is None:
        raise FormatError("missing field `prompt` (or `text`)")
    return Conversation([plain("user", text_of(obj[key], f"$.{key}"), f"$.{key}")])
