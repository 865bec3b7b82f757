"""Reasoning left in the content by a stack that runs Kimi without a reasoning parser.

Kimi's generation prompt ends with `<think>` (the opener is part of the prompt, not of the
generation), so a serving stack with no reasoning parser returns everything the model
generated as content: the reasoning, a lone `</think>`, then the answer. Such an answer
has no reasoning and a content holding exactly one `</think>` and no `<think>`: the text
before the `</think>` is the reasoning (`reasoning_source: inline`), the text after it the
content. Anything else (two closers, an opener, reasoning already given) is left as it
came: where the split falls would be a guess.

Used by kp-infer when it reads an answer (openrouter/answer.py) and by kp-tokenize for
records written by other clients (tokenize/engine.py). Pure: no I/O, no state.
"""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
INLINE = "inline"  # the reasoning_source of reasoning recovered from the content


def split_lone_think_close(content: str, reasoning: str | None) -> tuple[str, str] | None:
    """(content after the `</think>`, reasoning before it) for an answer whose reasoning is
    empty and whose content holds one `</think>` and no `<think>`; None for any other."""
    if reasoning or content.count(THINK_CLOSE) != 1 or THINK_OPEN in content:
        return None
    before, after = content.split(THINK_CLOSE)
    return after, before
