"""Reading source files: the records of one file, each with the line it starts on.

A source file is JSONL (one object per line), a JSON array of objects (read whole: an
array cannot be streamed line by line, but its elements are decoded one at a time so that
an error names the element's line), one JSON object spread over lines (a pretty-printed
`.json` of one conversation: one record), or, with `--format text`, plain text with one
prompt per line. `.zst` files are read transparently (kimipipe/io.py). What a record's object
means is for kimipipe/prompts/formats/ to say.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from ..errors import InputError
from ..io import describe_decode_error, iter_lines, open_input


@dataclass
class SourceRecord:
    line: int  # where the record starts, for error messages (several share a line in a one-line array)
    obj: Any
    index: int = 0  # the record's position in its file: what tells records apart
    element: bool = False  # an element of a JSON array (errors then name its number)

    def located(self, shown: str) -> str:
        """`path:line`, and the element's number in a JSON array: where a summary names it."""
        return f"{shown}:{self.line}" + (f" (element {self.index + 1})" if self.element else "")

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
            if first and ended and "truncated" in str(e) and line.lstrip().startswith(b"{"):
                # The first line opens an object it does not close: not JSONL, one object.
                yield _read_one_object(path, shown, lineno)
                return
            message = describe_decode_error(e, ended)
            if first and not line.lstrip().startswith((b"{", b"[")):
                message = ("not JSON: for plain text, one prompt per line, pass --format text "
                           f"({message})")
            raise InputError(message, shown, lineno) from None
        first = False
        yield SourceRecord(lineno, obj)


def _whole_text(path: str, shown: str) -> str:
    """The whole file as UTF-8 text (invalid UTF-8 is an input error at its line)."""
    with open_input(path) as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError("invalid UTF-8", shown, data.count(b"\n", 0, e.start) + 1) from None


def _read_one_object(path: str, shown: str, lineno: int) -> SourceRecord:
    """The file as one JSON object, starting on line LINENO."""
    text = _whole_text(path, shown)
    start = len(text) - len(text.lstrip())
    try:
        obj, end = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as e:
        raise InputError(f"invalid JSON: {e.msg} (line {lineno} opens an object it does not close, "
                         "so the file is read as one JSON object: JSONL needs one whole object "
                         "per line)", shown, e.lineno) from None
    rest = len(text) - len(text[end:].lstrip())
    if rest < len(text):
        raise InputError("more data after the file's one JSON object (several records go in a "
                         "JSON array, or one per line as JSONL)", shown, 1 + text.count("\n", 0, rest))
    return SourceRecord(lineno, obj)


def _read_json_array(path: str, shown: str) -> Iterator[SourceRecord]:
    """Elements of a top-level JSON array, each with the line it starts on.

    The array is read whole (a JSON array cannot be streamed line by line); its elements
    are decoded one at a time so that an error names the element's line.
    """
    text = _whole_text(path, shown)
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
