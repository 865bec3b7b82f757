"""MT-Bench questions (FastChat's `question.jsonl`): `{"question_id": int, "category": str,
"turns": [str, ...], "reference": [str, ...]?}`: user turns only, no answers. With
`--turns all` the first turn is the prompt and the later ones its follow-ups, each asked
after the model's own answer; `last` and `each` need source answers for the history and
refuse. Their id is `question_id`."""

from __future__ import annotations

from ..conversation import Conversation, FormatError, json_type, plain

DETECT = ("turns",)
ID_FIELD = "question_id"


def conversation(obj: dict) -> Conversation:
    turns = obj.get("turns")
    if not isinstance(turns, list) or not turns:
        raise FormatError(f"expected a non-empty array of strings, got {json_type(turns)}", "$.turns")
    out = []
    for i, text in enumerate(turns):
        if not isinstance(text, str):
            raise FormatError(f"expected a string, got {json_type(text)}", f"$.turns[{i}]")
        out.append(plain("user", text, f"$.turns[{i}]"))
    return Conversation(out, has_answers=False)
