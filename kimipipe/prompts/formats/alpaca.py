"""Alpaca: `{"instruction": str, "input": str?, "system": str?, "history": [[str, str]]?}`:
the instruction and its input joined by a blank line as the user turn, after the earlier
(instruction, answer) pairs of `history` (the `output` is the source's answer).

Stanford Alpaca's seed tasks (self-instruct's layout) hold the input and output in
`instances: [{"input", "output"}]`; one instance is read as `input`/`output` are, as
Alpaca's own generation script reads `instances[0]`. A record with several instances is
an error: each is a task of its own, and one record gives one conversation."""

from __future__ import annotations

from typing import Any

from ..conversation import (
    Conversation,
    FormatError,
    SourceTurn,
    content_of,
    json_type,
    plain,
    record_blocker,
    record_context,
    system_turn,
    text_of,
)

# How docs/kp-prompts.md and README.md name and describe it (`make docs` writes them).
LABEL = 'Alpaca'
RECORD = '`{"instruction", "input"?, "system"?, "history"?}`'
NOTES = (
    '`history`: earlier `[instruction, answer]` pairs; the input joined after a blank '
    'line. Stanford Alpaca\'s seed tasks (`"instances": [{"input", "output"}]`): the one '
    'instance read as `input`/`output`; several instances are an error (one record gives '
    'one conversation; give each its own)'
)
DETECT = ("instruction",)


def conversation(obj: dict) -> Conversation:
    if "instruction" not in obj:
        raise FormatError("missing field `instruction`")
    context = record_context(obj)
    turns = []
    if obj.get("system"):
        turns.append(system_turn(text_of(obj["system"], "$.system"), "$.system"))
    history = obj.get("history") or []
    if not isinstance(history, list):
        raise FormatError(f"expected an array, got {json_type(history)}", "$.history")
    for i, pair in enumerate(history):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise FormatError("expected an [instruction, answer] pair", f"$.history[{i}]")
        for j, role in enumerate(("user", "assistant")):
            text, blocker = content_of(pair[j], f"$.history[{i}][{j}]", context)
            turns.append(SourceTurn(role, text, *blocker) if blocker else plain(role, text, f"$.history[{i}]"))
    text, blocker = content_of(obj["instruction"], "$.instruction", context)
    extra, where = _input(obj)
    if extra and not blocker:
        more, blocker = content_of(extra, where, context)
        text = f"{text}\n\n{more}"
    turns.append(SourceTurn("user", "", *blocker) if blocker else plain("user", text, "$.instruction"))
    return Conversation(turns, record_blocker(obj, context))


def _input(obj: dict) -> tuple[Any, str]:
    """The record's input and its JSON path: `input`, else the one of `instances`."""
    if "input" in obj or "instances" not in obj:
        return obj.get("input"), "$.input"
    instances = obj["instances"]
    if not isinstance(instances, list):
        raise FormatError(f"expected an array, got {json_type(instances)}", "$.instances")
    if not instances:
        return None, "$.instances"
    if len(instances) > 1:
        raise FormatError(f"{len(instances)} instances: kp-prompts reads one (instruction, input) "
                          "per record; give each instance a record of its own", "$.instances")
    if not isinstance(instances[0], dict):
        raise FormatError(f"expected an object, got {json_type(instances[0])}", "$.instances[0]")
    return instances[0].get("input"), "$.instances[0].input"
