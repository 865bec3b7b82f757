"""Alpaca: `{"instruction": str, "input": str?, "system": str?, "history": [[str, str]]?}`:
the instruction and its input joined by a blank line as the user turn, after the earlier
(instruction, answer) pairs of `history` (the `output` is the source's answer)."""

from __future__ import annotations

from ..conversation import (
    Conversation,
    FormatError,
    Turn,
    content_of,
    json_type,
    plain,
    record_blocker,
    record_context,
    text_of,
)

DETECT = ("instruction",)


def conversation(obj: dict) -> Conversation:
    if "instruction" not in obj:
        raise FormatError("missing field `instruction`")
    context = record_context(obj)
    turns = []
    if obj.get("system"):
        turns.append(plain("system", text_of(obj["system"], "$.system"), "$.system"))
    history = obj.get("history") or []
    if not isinstance(history, list):
        raise FormatError(f"expected an array, got {json_type(history)}", "$.history")
    for i, pair in enumerate(history):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise FormatError("expected an [instruction, answer] pair", f"$.history[{i}]")
        for j, role in enumerate(("user", "assistant")):
            text, blocker = content_of(pair[j], f"$.history[{i}][{j}]", context)
            turns.append(Turn(role, text, *blocker) if blocker else plain(role, text, f"$.history[{i}]"))
    text, blocker = content_of(obj["instruction"], "$.instruction", context)
    extra = obj.get("input")
    if extra and not blocker:
        more, blocker = content_of(extra, "$.input", context)
        text = f"{text}\n\n{more}"
    turns.append(Turn("user", "", *blocker) if blocker else plain("user", text, "$.instruction"))
    return Conversation(turns, record_blocker(obj, context))
