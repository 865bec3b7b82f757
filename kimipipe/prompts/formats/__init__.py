"""The source formats kp-prompts reads: one module per format, listed in FORMATS.

A format module gives `DETECT` (the fields that identify its records, for `--format
auto`) and `messages(obj)` (the record's conversation as [{role, content}] in chat order,
or FormatError naming the JSON path of what is wrong). Adding a format is one module and
one entry in FORMATS; `--format` offers every entry, `auto` tries them in table order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..conversation import FormatError, json_type
from . import alpaca, openai, prompt, sharegpt


@dataclass(frozen=True)
class SourceFormat:
    detect: tuple[str, ...]  # a record with one of these fields is of this format
    messages: Callable[[dict], list[dict]]


FORMATS: dict[str, SourceFormat] = {
    "sharegpt": SourceFormat(sharegpt.DETECT, sharegpt.messages),
    "openai": SourceFormat(openai.DETECT, openai.messages),
    "alpaca": SourceFormat(alpaca.DETECT, alpaca.messages),
    "prompt": SourceFormat(prompt.DETECT, prompt.messages),
}
# `text` is a file layout (one prompt per line, kimipipe/prompts/reading.py) read as `prompt`.
FORMAT_CHOICES = ("auto", *FORMATS, "text")


def detect_format(obj: Any) -> str:
    if not isinstance(obj, dict):
        raise FormatError(f"expected a JSON object, got {type(obj).__name__}")
    for name, fmt in FORMATS.items():
        if any(key in obj for key in fmt.detect):
            return name
    fields = [key for fmt in FORMATS.values() for key in fmt.detect]
    listed = ", ".join(f"`{k}`" for k in fields[:-1]) + f" or `{fields[-1]}`"
    raise FormatError(f"cannot tell the format: expected a {listed} field (or force one with --format)")


def to_messages(obj: Any, fmt: str) -> list[dict]:
    """The conversation a source record holds, as [{role, content}] in chat order."""
    if fmt == "auto":
        fmt = detect_format(obj)
    elif not isinstance(obj, dict):
        raise FormatError(f"expected a JSON object, got {json_type(obj)}")
    if fmt == "text":
        fmt = "prompt"
    if fmt not in FORMATS:
        raise FormatError(f"unknown format {fmt!r}")
    return FORMATS[fmt].messages(obj)


def source_id(obj: Any, field: str) -> str | None:
    if not isinstance(obj, dict) or field not in obj or obj[field] is None:
        return None
    value = obj[field]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise FormatError(f"expected a string or integer id, got {json_type(value)}", f"$.{field}")
    return str(value)
