"""OpenAI chat messages: `{"messages": [{"role": "system"|"developer"|"user"|"assistant"|
"tool", "content": str | [{"type": "text", "text": str}, ...], "tool_calls": [...]?}],
"tools": [...]?}`. LLaMA-Factory's v1 rows are this with `{"type": "text", "value": str}`
parts."""

from __future__ import annotations

from ..conversation import Conversation, turns_of

# How docs/kp-prompts.md and README.md name and describe it (`make docs` writes them).
LABEL = 'OpenAI `messages`'
RECORD = '`{"messages": [{"role", "content"}, ...], "tools"?}`'
NOTES = (
    'content a string or parts: `{"type": "text", "text"}` (OpenAI) or `{"type": "text", '
    '"value"}` (LLaMA-Factory v1)'
)
DETECT = ("messages",)


def conversation(obj: dict) -> Conversation:
    return turns_of(obj, "messages", (("role", "content"),))
