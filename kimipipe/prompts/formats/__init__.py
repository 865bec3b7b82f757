"""The source formats kp-prompts reads: one module per format, listed in FORMATS.

A format module gives `DETECT` (the fields that identify its records, for `--format
auto`), `conversation(obj)` (the record as a Conversation, kimipipe/prompts/conversation.py:
its turns in chat order, what cannot be regenerated marked, or FormatError naming the JSON
path of what is wrong) and, where it is not `id`, `ID_FIELD` (the field holding a record's
own id), and `LABEL`, `RECORD`, `NOTES`: how the docs name and describe it (`make docs`
writes the format lists of README.md and docs/kp-prompts.md, and `--help` lists the labels,
from FORMATS). Adding a format is one module and one entry in FORMATS; `--format` offers
every entry, and `auto` tries them in table order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..conversation import Conversation, FormatError, json_type
from . import alpaca, mtbench, oasst, openai, prompt, sharegpt


@dataclass(frozen=True)
class SourceFormat:
    detect: tuple[str, ...]  # a record with one of these fields is of this format
    conversation: Callable[[dict], Conversation]
    # Where a record's own id is (of several, the first it has), unless --id-field says.
    id_field: str | tuple[str, ...]
    label: str  # its name in prose ("ShareGPT")
    record: str  # a record's shape, for the docs' table
    notes: str  # what else the docs' table says of it

    @classmethod
    def of(cls, module: ModuleType) -> SourceFormat:
        return cls(module.DETECT, module.conversation, getattr(module, "ID_FIELD", "id"),
                   module.LABEL, module.RECORD, module.NOTES)


FORMATS: dict[str, SourceFormat] = {
    "sharegpt": SourceFormat.of(sharegpt),
    "openai": SourceFormat.of(openai),
    "alpaca": SourceFormat.of(alpaca),
    # before `prompt`: an OpenAssistant message has a `text`, a tree a `prompt` object
    "oasst": SourceFormat.of(oasst),
    "prompt": SourceFormat.of(prompt),
    "mtbench": SourceFormat.of(mtbench),
}
# `text` is a file layout (one prompt per line, kimipipe/prompts/reading.py) read as `prompt`.
FORMAT_CHOICES = ("auto", *FORMATS, "text")


def format_labels() -> str:
    """Every format in prose, for --help and README.md ("ShareGPT, ..., plain text")."""
    return ", ".join(f.label for f in FORMATS.values()) + ", plain text"


def format_table() -> str:
    """docs/kp-prompts.md's table of formats, in detection order."""
    rows = [f"| `{name}` | {f.record} | {f.notes} |" for name, f in FORMATS.items()]
    return "\n".join(["| format | a record | notes |", "|---|---|---|", *rows]) + "\n"


def detect_format(obj: Any) -> str:
    if not isinstance(obj, dict):
        raise FormatError(f"expected a JSON object, got {json_type(obj)}")
    for name, fmt in FORMATS.items():
        if any(key in obj for key in fmt.detect):
            return name
    fields = [key for fmt in FORMATS.values() for key in fmt.detect]
    listed = ", ".join(f"`{k}`" for k in fields[:-1]) + f" or `{fields[-1]}`"
    has = ", ".join(f"`{k}`" for k in list(obj)[:8]) + (", ..." if len(obj) > 8 else "")
    raise FormatError(f"cannot tell the format: the record has {has or 'no field'}; expected a "
                      f"{listed} field (or force one with --format)")


def read_record(obj: Any, fmt: str, id_field: str | None) -> tuple[Conversation, str | None]:
    """The conversation a source record holds, and its own id (None: none given)."""
    if fmt == "auto":
        fmt = detect_format(obj)
    elif not isinstance(obj, dict):
        raise FormatError(f"expected a JSON object, got {json_type(obj)}")
    if fmt == "text":
        fmt = "prompt"
    source_format = FORMATS[fmt]
    return source_format.conversation(obj), source_id(obj, id_field or source_format.id_field)


def source_id(obj: dict, field: str | tuple[str, ...]) -> str | None:
    if not isinstance(field, str):  # the first of these the record has
        field = next((f for f in field if obj.get(f) is not None), field[0])
    if obj.get(field) is None:
        return None
    value = obj[field]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise FormatError(f"expected a string or integer id, got {json_type(value)}", f"$.{field}")
    return str(value)
