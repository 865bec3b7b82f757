"""OpenAI chat messages: `{"messages": [{"role": "system"|"user"|"assistant", "content":
str | [{"type": "text", "text": str}, ...]}, ...]}`."""

from __future__ import annotations

from ..conversation import turns_of

DETECT = ("messages",)


def messages(obj: dict) -> list[dict]:
    return turns_of(obj, "messages", (("role", "content"),))
