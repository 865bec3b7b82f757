"""What every source format gives: a conversation as chat messages, and the error a bad
record raises (FormatError, with the JSON path inside the record: `$.conversations[2].from`).
"""

from __future__ import annotations

from typing import Any


class FormatError(Exception):
    def __init__(self, message: str, json_path: str = "$"):
        super().__init__(message)
        self.message = message
        self.json_path = json_path


def json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
            int: "number", float: "number"}.get(type(value), type(value).__name__)


def text_of(value: Any, where: str) -> str:
    """A turn's text: a string, or OpenAI content parts that are all text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # OpenAI content parts
        texts = []
        for i, part in enumerate(value):
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                raise FormatError("only text content parts are supported", f"{where}[{i}]")
        return "".join(texts)
    raise FormatError(f"expected a string, got {json_type(value)}", where)


ROLE_NAMES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bard": "assistant",
    "bing": "assistant", "model": "assistant",
    "system": "system",
}


def turns_of(obj: dict, key: str, role_key_pairs: tuple[tuple[str, str], ...]) -> list[dict]:
    """OBJ[KEY] as messages: a list of turns, each naming its role and content under one of
    ROLE_KEY_PAIRS (`from`/`value` for ShareGPT, `role`/`content` for OpenAI)."""
    turns = obj.get(key)
    if not isinstance(turns, list):
        raise FormatError(f"expected an array, got {json_type(turns)}", f"$.{key}")
    messages = []
    for i, turn in enumerate(turns):
        where = f"$.{key}[{i}]"
        if not isinstance(turn, dict):
            raise FormatError(f"expected an object, got {json_type(turn)}", where)
        for role_key, content_key in role_key_pairs:  # noqa: B007 (used after the loop)
            if role_key in turn:
                break
        else:
            names = " or ".join(f"`{r}`" for r, _ in role_key_pairs)
            raise FormatError(f"turn has no {names} field", where)
        role = turn[role_key]
        mapped = ROLE_NAMES.get(role.lower()) if isinstance(role, str) else None
        if mapped is None:
            raise FormatError(f"unknown role {role!r}", f"{where}.{role_key}")
        if content_key not in turn:
            raise FormatError(f"turn has no `{content_key}` field", where)
        messages.append({"role": mapped, "content": text_of(turn[content_key], f"{where}.{content_key}")})
    return messages
