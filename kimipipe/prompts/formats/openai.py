"""OpenAI chat messages: `{"messages": [{"role": "system"|"developer"|"user"|"assistant"|
"tool", "content": str | [{"type": "text", "text": str}, ...], "tool_calls": [...]?}],
"tools": [...]?}`. LLaMA-Factory's v1 rows are this with `{"type": "text", "value": str}`
parts."""

from __future__ import annotations

from ..conversation import Conversation, turns_of

DETECT = ("messages",)


def conversation(obj: dict) -> Conversation:
    return turns_of(obj, "messages", (("role", "content"),))
