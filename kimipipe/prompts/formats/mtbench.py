"""MT-Bench questions (FastChat's `question.jsonl`): `{"question_id": int, "category": str,
"turns": [str, ...], "reference": [str, ...]?}`: user turns only, no answers. Arena-Hard
v0.1 writes each turn as an object, `"turns": [{"content": str}]`. With `--turns all` the
first turn is the prompt and the later ones its follow-ups, each asked after the model's
own answer; `last` and `each` need source answers for the history and refuse. Their id
is `question_id`."""

from __future__ import annotations

from ..conversation import (
    Conversation,
    FormatError,
    SourceTurn,
    content_of,
    json_type,
    record_blocker,
    record_context,
)

# How docs/kp-prompts.md and README.md name and describe it (`make docs` writes them).
LABEL = 'MT-Bench'
RECORD = '`{"question_id", "turns": [str, ...]}`'
NOTES = (
    "FastChat's MT-Bench and Vicuna-bench `question.jsonl`, Arena-Hard v0.1 (turns "
    '`{"content": str}`): user turns only, read with `--turns all`; the id is '
    '`question_id`'
)
DETECT = ("turns",)
ID_FIELD = "question_id"


def conversation(obj: dict) -> Conversation:
    turns = obj.get("turns")
    if not isinstance(turns, list) or not turns:
        raise FormatError(f"expected a non-empty array of strings, got {json_type(turns)}", "$.turns")
    context = record_context(obj)
    out = []
    for i, turn in enumerate(turns):
        where = f"$.turns[{i}]"
        if isinstance(turn, dict) and "content" in turn:
            turn, where = turn["content"], f"{where}.content"
        elif not isinstance(turn, str):
            raise FormatError(f'expected a string or {{"content": str}}, got {json_type(turn)}', where)
        text, blocker = content_of(turn, where, context)
        out.append(SourceTurn("user", "", *blocker) if blocker else SourceTurn("user", text, None, where))
    return Conversation(out, record_blocker(obj, context), has_answers=False)
