"""A bare prompt: `{"prompt": str}` or `{"text": str}`, one user turn (also what
`--format text` makes of each line). A record with media (`image`, `images`, ...) is not
plain text, as in every format."""

from __future__ import annotations

from ..conversation import (
    Conversation,
    FormatError,
    SourceTurn,
    content_of,
    record_blocker,
    record_context,
)

# How docs/kp-prompts.md and README.md name and describe it (`make docs` writes them).
LABEL = '`prompt`/`text` objects'
RECORD = '`{"prompt"}` or `{"text"}`'
NOTES = (
    'one user turn'
)
DETECT = ("prompt", "text")


def conversation(obj: dict) -> Conversation:
    key = "prompt" if "prompt" in obj else "text" if "text" in obj else None
    if key is None:
        raise FormatError("missing field `prompt` (or `text`)")
    context = record_context(obj)
    text, blocker = content_of(obj[key], f"$.{key}", context)
    turn = SourceTurn("user", "", *blocker) if blocker else SourceTurn("user", text, None, f"$.{key}")
    return Conversation([turn], record_blocker(obj, context))
