"""ShareGPT: `{"conversations": [{"from": "human"|"gpt"|"system"|..., "value": str}, ...],
"system": str?, "tools": str?}` (also with `{"role", "content"}` turns, as LLaMA-Factory's
`tags` allow). The top-level `system` (LLaMA-Factory's schema) is the system prompt where
the turns bring none of their own; `function_call`/`observation` turns are tool turns."""

from __future__ import annotations

from ..conversation import Conversation, system_turn, text_of, turns_of

# How docs/kp-prompts.md and README.md name and describe it (`make docs` writes them).
LABEL = 'ShareGPT'
RECORD = '`{"conversations": [{"from", "value"}, ...], "system"?, "tools"?}`'
NOTES = (
    'also `{"role", "content"}` turns; the top-level `system` (LLaMA-Factory) is the '
    "system prompt where the turns have none; LLaVA's rows (`image` + `<image>`) are this "
    'with media'
)
DETECT = ("conversations",)


def conversation(obj: dict) -> Conversation:
    conv = turns_of(obj, "conversations", (("from", "value"), ("role", "content")))
    system = obj.get("system")
    if system is not None and system != "" and not (conv.turns and conv.turns[0].role == "system"):
        conv.turns.insert(0, system_turn(text_of(system, "$.system"), "$.system"))
    return conv
