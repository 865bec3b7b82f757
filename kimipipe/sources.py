"""Prompt sources: the dataset formats kp-prompts reads, turned into chat messages.

A source file is JSONL (one object per line), a JSON array of objects, or, with
`--format text`, plain text with one prompt per line. Each object's format is detected
from its fields (or forced with `--format`):

    sharegpt  {"conversations": [{"from": "human"|"gpt"|..., "value": str}, ...]}
              (also {"role", "content"} turns)
    openai    {"messages": [{"role": "system"|"user"|"assistant", "content": str|parts}]}
    alpaca    {"instruction": str, "input": str?, "system": str?}
    prompt    {"prompt": str} or {"text": str}

Errors name the file, the line and the JSON path inside the record.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from .errors import InputError
from .io import describe_decode_error, iter_lines, open_input

FORMATS = ("auto", "sharegpt", "openai", "alpaca", "prompt", "text")

ROLE_NAMES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bard": "assistant",
    "bing": "assistant", "model": "assistant",
    "system": "system",
}


class FormatError(Exception):
    def __init__(self, message: str, json_path: str = "$"):
        super().__init__(message)
        self.message = message
        self.json_path = json_path


@dataclass
class SourceRecord:
    line: int  # where the record starts, for error messages (several share a line in a one-line array)
    obj: Any
    index: int = 0  # the record's position in its file: what tells records apart
    element: bool = False  # an element of a JSON array (errors then name its number)

    def where(self, message: str) -> str:
        """MESSAGE located inside the record: `element N: ...` for JSON array elements."""
        return f"element {self.index + 1}: {message}" if self.element else message


def read_source(path: str, fmt: str, display: str | None = None) -> Iterator[SourceRecord]:
    """The objects of one source file with their line numbers (see module docstring)."""
    shown = display or path
    if fmt == "text":
        records = _read_text(path, shown)
    else:
        with open_input(path) as f:
            head = f.peek(1 << 12)[: 1 << 12].lstrip()
        records = _read_json_array(path, shown) if head.startswith(b"[") else _read_jsonl(path, shown)
    index = -1
    for index, record in enumerate(records):
        record.index = index
        yield record
    if index < 0:
        raise InputError("empty input: no records", shown)


def _read_text(path: str, shown: str) -> Iterator[SourceRecord]:
    for lineno, line, _ended in iter_lines(path):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"invalid UTF-8 at byte {e.start}", shown, lineno) from None
        yield SourceRecord(lineno, {"prompt": text})


def _read_jsonl(path: str, shown: str) -> Iterator[SourceRecord]:
    decoder = msgspec.json.Decoder()
    first = True
    for lineno, line, ended in iter_lines(path):
        try:
            obj = decoder.decode(line)
        except msgspec.DecodeError as e:
            message = describe_decode_error(e, ended)
            if first and not line.lstrip().startswith((b"{", b"[")):
                message = ("not JSON: for plain text, one prompt per line, pass --format text "
                           f"({message})")
            raise InputError(message, shown, lineno) from None
        first = False
        yield SourceRecord(lineno, obj)


def _read_json_array(path: str, shown: str) -> Iterator[SourceRecord]:
    """Elements of a top-level JSON array, each with the line it starts on.

    The array is read whole (a JSON array cannot be streamed line by line); its elements
    are decoded one at a time so that an error names the element's line.
    """
    with open_input(path) as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError("invalid UTF-8", shown, data.count(b"\n", 0, e.start) + 1) from None
    del data
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    line = 1 + text.count("\n", 0, pos)
    n = len(text)

    def skip_ws(i: int) -> int:
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    expect_value = True
    while True:
        start = skip_ws(pos)
        line += text.count("\n", pos, start)
        if start >= n:
            raise InputError("truncated JSON array (no closing `]`)", shown, line)
        ch = text[start]
        if ch == "]":
            rest = skip_ws(start + 1)
            if rest < n:
                raise InputError("unexpected data after the JSON array", shown,
                                 line + text.count("\n", start, rest))
            return
        if ch == ",":
            if expect_value:
                raise InputError("unexpected `,` in JSON array", shown, line)
            pos = start + 1
            expect_value = True
            continue
        if not expect_value:
            raise InputError("expected `,` or `]` between array elements", shown, line)
        try:
            obj, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError as e:
            raise InputError(f"invalid JSON: {e.msg}", shown, e.lineno) from None
        yield SourceRecord(line, obj, element=True)
        line += text.count("\n", start, end)
        pos = end
        expect_value = False


def detect_format(obj: Any) -> str:
    if not isinstance(obj, dict):
        raise FormatError(f"expected a JSON object, got {type(obj).__name__}")
    for key, fmt in (("conversations", "sharegpt"), ("messages", "openai"),
                     ("instruction", "alpaca"), ("prompt", "prompt"), ("text", "prompt")):
        if key in obj:
            return fmt
    raise FormatError(
        "cannot tell the format: expected a `conversations`, `messages`, `instruction`, "
        "`prompt` or `text` field (or force one with --format)"
    )


def _text_of(value: Any, where: str) -> str:
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
    raise FormatError(f"expected a string, got {_json_type(value)}", where)


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
            int: "number", float: "number"}.get(type(value), type(value).__name__)


def _turns(obj: dict, key: str, role_key_pairs: tuple[tuple[str, str], ...]) -> list[dict]:
    turns = obj.get(key)
    if not isinstance(turns, list):
        raise FormatError(f"expected an array, got {_json_type(turns)}", f"$.{key}")
    messages = []
    for i, turn in enumerate(turns):
        where = f"$.{key}[{i}]"
        if not isinstance(turn, dict):
            raise FormatError(f"expected an object, got {_json_type(turn)}", where)
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
        messages.append({"role": mapped, "content": _text_of(turn[content_key], f"{where}.{content_key}")})
    return messages


def to_messages(obj: Any, fmt: str) -> list[dict]:
    """The conversation a source record holds, as [{role, content}] in chat order."""
    if fmt == "auto":
        fmt = detect_format(obj)
    elif not isinstance(obj, dict):
        raise FormatError(f"expected a JSON object, got {_json_type(obj)}")
    if fmt == "sharegpt":
        return _turns(obj, "conversations", (("from", "value"), ("role", "content")))
    if fmt == "openai":
        return _turns(obj, "messages", (("role", "content"),))
    if fmt == "alpaca":
        if "instruction" not in obj:
            raise FormatError("missing field `instruction`")
        text = _text_of(obj["instruction"], "$.instruction")
        extra = obj.get("input")
        if extra:
            text = f"{text}\n\n{_text_of(extra, '$.input')}"
        messages = []
        if obj.get("system"):
            messages.append({"role": "system", "content": _text_of(obj["system"], "$.system")})
        messages.append({"role": "user", "content": text})
        return messages
    if fmt in ("prompt", "text"):
        key = "prompt" if "prompt" in obj else "text" if "text" in obj else None
        if key is None:
            raise FormatError("missing field `prompt` (or `text`)")
        return [{"role": "user", "content": _text_of(obj[key], f"$.{key}")}]
    raise FormatError(f"unknown format {fmt!r}")


def source_id(obj: Any, field: str) -> str | None:
    if not isinstance(obj, dict) or field not in obj or obj[field] is None:
        return None
    value = obj[field]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise FormatError(f"expected a string or integer id, got {_json_type(value)}", f"$.{field}")
    return str(value)
