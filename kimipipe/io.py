"""Files and streams for every stage: inputs, outputs, line errors, resume.

- `open_input(path)`: `-` is stdin; zstd input is recognised by its magic bytes, whatever
  the file is called.
- `iter_records(path, type)`: one validated Struct per line, with the raw line for
  pass-through; a bad line raises InputError `PATH:LINE: what is wrong` (msgspec's path
  in the record, e.g. `$.messages[0].role`).
- `RecordWriter`: one whole line per write; `durable=True` flushes each record to the OS
  as it is written, so `kill -9` loses no written record and never tears a line in a
  plain file (a zstd file may lose its unfinished last block, which `scan_done` repairs).
- `scan_done(path)`: the IDs already in an output file, after repairing a torn last line
  left by a crash (the torn record's ID is not counted, so it is redone).
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
from .records import IdOnly

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
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
        data = self._rest.read(len(b))
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
        data = self._reader.read(len(b))
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
    if text.startswith("Invalid UTF-8"):
        return "invalid UTF-8"
    return text.replace(" - at `", " at `")


def iter_records(path: str, decoder: msgspec.json.Decoder,
                 keep_newline: bool = False) -> Iterator[tuple[int, object, bytes]]:
    """(line number, record, raw line) for every record of PATH, validated by DECODER.

    Raises InputError naming PATH and the line for a bad line, and for an input with no
    records at all. KEEP_NEWLINE: see `iter_lines`.
    """
    count = 0
    for lineno, line, ended in iter_lines(path, keep_newline):
        try:
            record = decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise InputError(describe_decode_error(e, ended), path, lineno) from None
        count += 1
        yield lineno, record, line
    if count == 0:
        raise InputError("empty input: no records", path)


class RecordWriter:
    """Writes whole JSON lines to stdout (`-`), a plain file, or a `.zst` file.

    With `append=True` an existing file is continued (a zstd file gets a new frame, which
    every zstd reader reads across). With `durable=True` each line reaches the OS as soon
    as it is written; a plain file then never holds a torn line, whatever kills us.
    """

    def __init__(self, path: str, *, append: bool = False, durable: bool = False, level: int = 3):
        self.path = path
        self.durable = durable
        self._fd: int | None = None
        self._zst = None
        self._zst_file = None
        self._stdout = None
        if path == "-":
            self._stdout = sys.stdout.buffer
        elif path.endswith(".zst"):
            self._zst_file = open(path, "ab" if append else "wb")
            self._zst = zstandard.ZstdCompressor(level=level).stream_writer(
                self._zst_file, closefd=False
            )
        else:
            flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
            self._fd = os.open(path, flags, 0o644)

    def write_line(self, line: bytes) -> None:
        if self._fd is not None:
            view = memoryview(line)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        elif self._zst is not None:
            self._zst.write(line)
            if self.durable:
                self._zst.flush(zstandard.FLUSH_BLOCK)
                self._zst_file.flush()
        else:
            self._stdout.write(line)
            if self.durable:
                self._stdout.flush()

    def flush(self) -> None:
        if self._zst is not None:
            self._zst.flush(zstandard.FLUSH_BLOCK)
            self._zst_file.flush()
        elif self._stdout is not None:
            self._stdout.flush()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        elif self._zst is not None:
            self._zst.close()
            self._zst_file.close()
            self._zst = None
        elif self._stdout is not None:
            self._stdout.flush()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AtomicOutput:
    """An output file that appears under its name only when complete (temp name + rename).

    For stages that write a finished product rather than an append-only log; stdout is
    passed straight through.
    """

    def __init__(self, path: str, **writer_args):
        self.path = path
        self.tmp = path if path == "-" else f"{path}.tmp-{os.getpid()}"
        self.writer = RecordWriter(self.tmp, **writer_args)

    def commit(self) -> None:
        self.writer.close()
        if self.path != "-":
            os.replace(self.tmp, self.path)

    def discard(self) -> None:
        self.writer.close()
        if self.path != "-" and os.path.exists(self.tmp):
            os.unlink(self.tmp)


_id_decoder = msgspec.json.Decoder(IdOnly)


def _complete_lines_of_zst(path: str) -> tuple[bytes, bool]:
    """The whole lines a (possibly torn) zstd file holds, and whether anything was cut.

    Frames are walked one by one: a reader that reads across frames stops quietly at an
    unfinished last frame, which would hide the tear and corrupt the next append.
    """
    out = bytearray()
    torn = False
    dctx = zstandard.ZstdDecompressor()
    frame = dctx.decompressobj()
    started = False
    with open(path, "rb") as f:
        while not torn and (chunk := f.read(1 << 20)):
            while chunk:
                started = True
                try:
                    out += frame.decompress(chunk)
                except zstandard.ZstdError:
                    torn = True
                    break
                if not frame.eof:
                    break
                chunk = frame.unused_data
                frame = dctx.decompressobj()
                started = False
    if started and not frame.eof:
        torn = True
    end = out.rfind(b"\n") + 1
    if end != len(out):
        torn = True
    return bytes(out[:end]), torn


def repair_torn_tail(path: str) -> int | None:
    """Cut a torn last line (a crash mid-write) off PATH; return its line number, if any."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    with open(path, "rb") as f:
        is_zst = f.read(4) == ZSTD_MAGIC
    if is_zst:
        data, torn = _complete_lines_of_zst(path)
        if not torn:
            return None
        tmp = f"{path}.repair-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(zstandard.ZstdCompressor(level=3).compress(data))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return data.count(b"\n") + 1
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        pos = size
        block = 1 << 16
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                cut = start + nl + 1
                break
            pos = start
        else:
            cut = 0
        if cut == size:
            return None
        f.seek(0)
        complete_lines = 0
        remaining = cut
        while remaining:
            buf = f.read(min(remaining, 1 << 20))
            complete_lines += buf.count(b"\n")
            remaining -= len(buf)
        f.truncate(cut)
        return complete_lines + 1


def scan_done(path: str, *, repair: bool = True,
              report: Callable[[str], None] | None = None) -> set[str]:
    """IDs already in output file PATH (empty set if it does not exist).

    A torn last line is repaired first (when `repair`; said through REPORT, see
    `repair_and_report`), so its ID is redone. Any other unreadable line is an error: it
    may hold paid work, and it is not ours to drop.
    """
    if repair:
        repair_and_report(path, report)
    return {record.id for record in iter_finished(path, _id_decoder)}


def repair_and_report(path: str, report: Callable[[str], None] | None = None) -> None:
    """Cut a torn last line off an output file before resuming it, and say so: through
    REPORT, the caller's quiet-aware writer, else on stderr."""
    if path == "-" or not os.path.exists(path):
        return
    torn = repair_torn_tail(path)
    if torn is not None:
        message = (f"kimipipe: {path}:{torn}: removed a torn last line left by an interrupted "
                   "run; that record will be redone")
        if report is not None:
            report(message)
        else:
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


def require_distinct(out: str, *inputs: str) -> None:
    """Refuse to write over one of our own inputs."""
    if out == "-":
        return
    for p in inputs:
        if p != "-" and os.path.exists(p) and os.path.exists(out) and os.path.samefile(p, out):
            raise KPError(f"output {out} is also an input", exit_code=2)
