"""What kp-tokenize reads of a response record, and the message fields it refuses to guess.

kp-tokenize rebuilds the prompt the model saw by rendering each message's `role` and
`content` through the chat template, which is exactly what kp-infer sends. A response
record made by another client may carry more in its messages, and the template would have
rendered some of it differently:

- `name`, `tool_calls`, `tool_call_id`: chat templates render these (a speaker's name in
  the role header, tool calls, tool results), so role and content alone would give other
  IDs than the model saw. Refused, naming the field.
- `content` as a list of parts: text parts are passed to the template as they are (it
  renders them as the serving stack does); any other part (an image, audio, a file) is
  refused, naming the part.
- `reasoning_content` on an earlier assistant turn: most templates drop the reasoning of
  finished turns (Kimi K2.5's does), and then it changes nothing and is accepted; where
  the template keeps it, the rendering changes and it is refused (`Engine` renders the
  conversation with and without it to tell).
- `reasoning` on an earlier assistant turn is what kp-infer sends back in a conversation's
  history under `--history-reasoning keep` (the record's messages are exactly as sent): it
  is passed to the template as that turn's `reasoning_content`, so the history renders as
  the template renders it (K2.5's drops it, K2.6's `preserve_thinking` keeps it). Under
  `drop` the message has no reasoning, and the template renders the turn as history
  (`<think></think>` for K2.5).

A refusal is an input error (`PATH:LINE`, exit 2). `--ignore-extra-fields` renders role and
content only instead (non-text parts left out), as kp-infer would have sent them. Not an
assistant turn that is its `tool_calls` alone (`content` null, empty, or no text part):
role and content would render it as an empty assistant turn, a prompt kp-infer could never
have sent, so it is refused with or without the flag (`empty_tool_call_turn`).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

from ..records import ResponseText, SampledIds, SampledTokens

RENDERED_FIELDS = ("name", "tool_calls", "tool_call_id")


class ContentPart(Struct):
    type: str
    text: str | None = None


class SeenMessage(Struct):
    """A message as another client may have recorded it (kp-infer writes role and content)."""

    role: Literal["system", "user", "assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: Any = None  # (any JSON: only whether it is there matters)
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # sent back by kp-infer (--history-reasoning keep)


class ProviderCounts(Struct):
    """The provider's own token counts (`usage`), the second opinion on each row."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class TokenizeInput(Struct):
    """The fields of a response record kp-tokenize uses; the rest is passed through."""

    id: str
    messages: list[SeenMessage]
    response: ResponseText
    finish_reason: str | None
    provider: str | None = None
    usage: ProviderCounts | None = None
    reasoning_source: str | None = None
    sampled_ids: SampledIds | None = None  # a self-hosted server's own IDs (docs/servers.md)
    sampled_tokens: SampledTokens | None = None  # token logprobs' tokens (tokenize/resegment.py)
    conversation: str | None = None  # a conversation's turn: its prompt's id (records.Turn)
    # with the id, which answer a row was made from: a prompt fixed under its id is answered
    # again, and its new answer's row replaces the old one's (tokenize/current.py)
    generation_id: str | None = None


DECODER = msgspec.json.Decoder(TokenizeInput)


def _is_text(part: ContentPart) -> bool:
    return part.type == "text" and part.text is not None


def unrenderable_field(messages: list[SeenMessage]) -> str | None:
    """Why MESSAGES cannot be rendered from role and content alone (the first field), or None."""
    for i, m in enumerate(messages):
        for name in RENDERED_FIELDS:
            value = getattr(m, name)
            if value is None or value == "" or value == [] or value == {}:
                continue
            return (f"`$.messages[{i}].{name}`: the chat template renders `{name}`, and kp-tokenize "
                    "renders a message's role and content only, so the IDs would not be what the "
                    "model saw; --ignore-extra-fields renders role and content only (as kp-infer "
                    "sends them)")
        if isinstance(m.content, list):
            for j, part in enumerate(m.content):
                if not _is_text(part):
                    return (f"`$.messages[{i}].content[{j}]`: a {part.type!r} content part; "
                            "kp-tokenize renders text only; --ignore-extra-fields leaves other "
                            "parts out")
    return None


def _has_text(m: SeenMessage) -> bool:
    if isinstance(m.content, list):
        return any(_is_text(p) and p.text for p in m.content)
    return bool(m.content)


def empty_tool_call_turn(messages: list[SeenMessage]) -> str | None:
    """Why MESSAGES cannot be rendered from role and content even when asked to
    (--ignore-extra-fields): an assistant turn whose tool calls are all it holds."""
    for i, m in enumerate(messages):
        if m.role == "assistant" and m.tool_calls not in (None, "", [], {}) and not _has_text(m):
            return (f"`$.messages[{i}].tool_calls`: this assistant turn is its tool calls (its "
                    "content is empty); role and content alone would render an empty assistant "
                    "turn, a prompt kp-infer could never have sent, so it is refused even with "
                    "--ignore-extra-fields")
    return None


def _content(m: SeenMessage) -> Any:
    if isinstance(m.content, list):
        return [{"type": "text", "text": p.text} for p in m.content if _is_text(p)]
    return m.content if m.content is not None else ""


def template_messages(messages: list[SeenMessage]) -> list[dict]:
    """The conversation as the template gets it: role and content (text parts only), and
    the reasoning kp-infer sent back on an earlier turn (`reasoning`, see above)."""
    return [{"role": m.role, "content": _content(m)} if not m.reasoning else
            {"role": m.role, "content": _content(m), "reasoning_content": m.reasoning}
            for m in messages]


def with_history_reasoning(messages: list[SeenMessage]) -> tuple[list[dict], int] | None:
    """The conversation with earlier turns' `reasoning_content`, and the first such message;
    None when no message carries any."""
    first = next((i for i, m in enumerate(messages) if m.reasoning_content), None)
    if first is None:
        return None
    out = template_messages(messages)
    for d, m in zip(out, messages, strict=True):
        if m.reasoning_content:
            d["reasoning_content"] = m.reasoning_content
    return out, first


def history_reasoning_refusal(index: int) -> str:
    return (f"`$.messages[{index}].reasoning_content`: this chat template renders the reasoning "
            "of earlier turns, and kp-tokenize renders a message's role and content only, so "
            "the IDs would not be what the model saw; --ignore-extra-fields renders role and "
            "content only (as kp-infer sends them)")
