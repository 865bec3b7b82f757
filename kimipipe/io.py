"""Files and streams for every stage: inputs, outputs, line errors, resume.

- `open_input(path)`: `-` is stdin; zstd input is recognised by its magic bytes, whatever
  the file is called.
- `iter_records(path, type)`: one validated Struct per line, with the raw line for
  pass-through; a bad line raises InputError `PATH:LINE: what is wrong` (msgspec's path
  in the record, e.g. `$.messages[0].role`).
  Given `expect` (the record kind the stage reads), a record of another stage is named
  with the stage to run first (`a prompt record ...: run kp-infer on this file first`).
- `scan_done(path)`: the IDs already in an output file, after repairing a torn last line
  left by a crash (the torn record's ID is not counted, so it is redone; kimipipe/tail_repair.py).
- Outputs (kimipipe/writers.py, re-exported here): `RecordWriter` writes whole lines and,
  when the OS refuses a write, cuts the file back to its last whole record
  (`OutputWriteError`); `AtomicOutput`; `check_writable`. The one-writer lock on an output
  is `OutputLock` (kimipipe/locks.py).
"""

from __future__ import annotations

import io
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from typing import BinaryIO, TypeVar

import msgspec
import zstandard

from .errors import InputError, KPError
from .locks import OutputLock, OutputLocked, lock_path
from .records import IdOnly
from .tail_repair import ZSTD_MAGIC, CorruptOutput, repair_torn_tail
from .writers import (
    AtomicOutput,
    OutputWriteError,
    RecordWriter,
    check_writable,
    check_writable_dir,
)

__all__ = ["AtomicOutput", "OutputLock", "OutputLocked", "OutputWriteError", "RecordWriter",
           "check_writable", "check_writable_dir", "describe_decode_error", "finished_records",
           "iter_finished",
           "iter_lines", "iter_records", "lock_path", "open_input", "repair_and_report",
           "repair_torn_tail", "require_distinct", "scan_done", "zstd_reader"]

T = TypeVar("T")


class _Prefixed(io.RawIOBase):
    """A stream with some already-read bytes put back in front (for sniffing pipes)."""

    def __init__(self, head: bytes, rest: BinaryIO):
        self._head = head
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self._head:
            n = min(len(b), len(self._head))
            b[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        # read1: what has arrived, up to len(b), so that a pipe's records are read as they
        # come (read(n) would wait for a whole buffer's worth, 1 MiB, or the end)
        data = self._rest.read1(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if self._rest is not sys.stdin.buffer:
            self._rest.close()
        super().close()


class _ZstdRaw(io.RawIOBase):
    def __init__(self, reader):
        self._reader = reader

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self._reader.read1(len(b))  # (what can be decompressed now: see _Prefixed)
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._reader.close()
        super().close()


def open_input(path: str) -> io.BufferedReader:
    """Open PATH (or stdin for `-`) for binary line reading, decompressing zstd by content."""
    if path == "-":
        raw: BinaryIO = sys.stdin.buffer
    else:
        try:
            raw = open(path, "rb")
        except OSError as e:
            raise InputError(f"cannot open: {e.strerror}", path) from None
    head = raw.read(4)
    stream = _Prefixed(head, raw)
    if head == ZSTD_MAGIC:
        return zstd_reader(stream)
    return io.BufferedReader(stream, buffer_size=1 << 20)


def zstd_reader(compressed: BinaryIO) -> io.BufferedReader:
    """A buffered, line-iterable reader of zstd data (all frames) from a binary stream."""
    reader = zstandard.ZstdDecompressor().stream_reader(compressed, read_across_frames=True)
    return io.BufferedReader(_ZstdRaw(reader), buffer_size=1 << 20)


def iter_lines(path: str, keep_newline: bool = False) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, line without its newline, whether it ended with a newline).

    Blank lines are skipped. A corrupt or truncated zstd stream is an input error.
    KEEP_NEWLINE leaves the line as read, newline included (no copy of each line: for a
    consumer that takes trailing whitespace, as msgspec's decoders do).
    """
    with open_input(path) as f:
        lineno = 0
        try:
            for line in f:
                lineno += 1
                ended = line.endswith(b"\n")
                body = line.rstrip(b"\r\n") if ended and not keep_newline else line
                if not body or body.isspace():  # no copy of every line
                    continue
                yield lineno, body, ended
        except zstandard.ZstdError as e:
            raise InputError(f"corrupt zstd data after line {lineno}: {e}", path) from None


def describe_decode_error(err: Exception, ended: bool) -> str:
    text = str(err)
    if not ended and "truncated" in text:
        return "truncated final line (no newline at the end: the file was cut or is still being written)"
    if "truncated" in text:  # (msgspec's "Input data was truncated", inside the file)
        return ("not a whole JSON record: the line ends before the record does (a record "
                "broken over two lines, or a line cut short)")
    if text.startswith("Invalid UTF-8"):
        return "invalid UTF-8"
    return text.replace(" - at `", " at `")


# The pipeline's record kinds in order, with the stage that writes each and its field.
_STAGES = [("prompt", "kp-prompts", "messages"), ("response", "kp-infer", "response"),
           ("tokens", "kp-tokenize", "input_ids")]
_KIND_NAMES = {"prompt": "a prompt record", "response": "a response record",
               "tokens": "a token record"}
_passthrough = msgspec.json.Decoder(dict[str, msgspec.Raw])


def record_kind(line: bytes) -> str | None:
    """Which stage's record LINE is (by its fields), or None."""
    try:
        fields = _passthrough.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    for kind, _writer, field in reversed(_STAGES):
        if field in fields:
            return kind
    return None


def stage_hint(line: bytes, expect: str) -> str | None:
    """What to run first when LINE is another stage's record than EXPECT, else None."""
    kind = record_kind(line)
    if kind is None or kind == expect:
        return None
    order = [k for k, _w, _f in _STAGES]
    have, want = order.index(kind), order.index(expect)
    reader = _STAGES[want + 1][1] if want + 1 < len(_STAGES) else "kp-shard"
    what = f"{_KIND_NAMES[kind]} (it has no `{_STAGES[want][2]}`)"
    if have < want:
        first = ", then ".join(_STAGES[i][1] for i in range(have + 1, want + 1))
        return f"{what}: {reader} reads {_KIND_NAMES[expect][2:]}s; run {first} on this file first"
    goes_to = _STAGES[have + 1][1] if have + 1 < len(_STAGES) else "kp-shard"
    return (f"{_KIND_NAMES[kind]} ({_STAGES[have][1]}'s output): {reader} reads "
            f"{_KIND_NAMES[expect][2:]}s; give this file to {goes_to}")


def iter_records(path: str, decoder: msgspec.json.Decoder, keep_newline: bool = False,
                 expect: str | None = None, shown: str | None = None
                 ) -> Iterator[tuple[int, object, bytes]]:
    """(line number, record, raw line) for every record of PATH, validated by DECODER.

    Raises InputError naming PATH (or SHOWN: `<stdin>` for a spooled stdin) and the line
    for a bad line, and for an input with no records at all. KEEP_NEWLINE: see
    `iter_lines`. EXPECT (`prompt`, `response`, `tokens`): the kind the stage reads, so
    that another stage's record gets a hint.
    """
    shown = shown or path
    count = 0
    for lineno, line, ended in iter_lines(path, keep_newline):
        try:
            record = decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            hint = stage_hint(line, expect) if expect and isinstance(e, msgspec.ValidationError) else None
            raise InputError(hint or describe_decode_error(e, ended), shown, lineno) from None
        count += 1
        yield lineno, record, line
    if count == 0:
        raise InputError("empty input: no records", shown)


_id_decoder = msgspec.json.Decoder(IdOnly)


def scan_done(path: str, *, repair: bool = True, quiet: bool = False,
              report: Callable[[str], None] | None = None) -> set[str]:
    """IDs already in output file PATH (empty set if it does not exist).

    A torn last line is repaired first (when `repair`; said through REPORT, see
    `repair_and_report`), so its ID is redone. Any other unreadable line is an error: it
    may hold paid work, and it is not ours to drop. Take the output's lock (OutputLock)
    first: a repair writes.
    """
    if repair:
        repair_and_report(path, report, quiet=quiet)
    return {record.id for record in iter_finished(path, _id_decoder)}


def repair_and_report(path: str, report: Callable[[str], None] | None = None, *,
                      quiet: bool = False) -> None:
    """Cut a torn last line off an output file before resuming it, and say so: through
    REPORT (the caller's quiet-aware writer), else on stderr unless QUIET."""
    if path == "-" or not os.path.exists(path):
        return
    try:
        torn = repair_torn_tail(path)
    except CorruptOutput as e:
        raise InputError(str(e), path) from None
    if torn is None:
        return
    message = (f"kimipipe: {path}:{torn}: removed a torn last line left by an interrupted "
               "run; that record will be redone")
    if report is not None:
        report(message)
    elif not quiet:
        print(message, file=sys.stderr)


def spool_stdin(directory: str) -> str:
    """Copy standard input to a file in DIRECTORY, for a command that reads its input
    twice (validation first, then the work); returns the file's path."""
    path = os.path.join(directory, "stdin")
    with open(path, "wb") as f:
        shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
    return path


def iter_finished(path: str, decoder: msgspec.json.Decoder) -> Iterator:
    """The records of an output file written by an earlier run (after `scan_done` repaired it)."""
    if path == "-" or not os.path.exists(path):
        return
    for lineno, line, _ended in iter_lines(path):
        try:
            yield decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise InputError(describe_decode_error(e, True), path, lineno) from None


def finished_records(path: str, decoder: msgspec.json.Decoder) -> Iterator:
    """The whole records of a file another process may be writing: a last line without its
    newline is being written, and is left alone (neither read nor repaired)."""
    if path == "-" or not os.path.exists(path):
        return
    for lineno, line, ended in iter_lines(path):
        if not ended:
            return
        try:
            yield decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise InputError(describe_decode_error(e, True), path, lineno) from None


def require_distinct(out: str, *inputs: str) -> None:
    """Refuse to write over one of our own inputs."""
    if out == "-":
        return
    for p in inputs:
        if p != "-" and os.path.exists(p) and os.path.exists(out) and os.path.samefile(p, out):
            raise KPError(f"output {out} is also an input", exit_code=2)
