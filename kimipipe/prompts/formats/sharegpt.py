"""ShareGPT: `{"conversations": [{"from": "human"|"gpt"|"system"|..., "value": str}, ...]}`
(also with `{"role", "content"}` turns, as LLaMA-Factory's `tags` allow)."""

from __future__ import annotations

from ..conversation import turns_of

DETECT = ("conversations",)


def messages(obj: dict) -> list[dict]:
    return turns_of(obj, "conversations", (("from", "value"), ("role", "content")))
