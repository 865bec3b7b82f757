"""Output files for every stage: whole records only, checked before any work.

- `RecordWriter`: whole JSON lines to stdout, a plain file or a `.zst` file; a write the
  OS refuses (full disk, file size limit, I/O error) leaves the file cut back to its last
  whole record and raises `OutputWriteError` (see the class docstring).
- `AtomicOutput`: a file that appears under its name only when complete.
- `check_writable(path, option)` / `check_writable_dir(path, option)`: refuse, before any
  work is done, an output that cannot be written (exit 2, one line, nothing created).
"""

from __future__ import annotations

import errno
import os
import stat
import sys

import zstandard

from .errors import ExitCode, KPError


class OutputWriteError(KPError):
    """A write to an output file failed (full disk, file too large, I/O error).

    Raised by RecordWriter after it has cut the file back to its last whole record, so the
    file holds whole lines only (see RecordWriter). `error` is the OSError; `path` the file.
    Exit 3 when the disk or a size limit refused (resumable once there is room), else 1.
    """

    def __init__(self, path: str, error: OSError, cut_back: bool = True):
        self.path = path
        self.error = error
        resource = error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        then = ("free some space and rerun the same command to resume" if resource
                else "rerun the same command to resume")
        if cut_back:
            state = "it ends with its last whole record"
        else:
            state = "it could not be cut back to its last whole record (the next run repairs it)"
        super().__init__(f"cannot write {path}: {error.strerror or error}; {state}; {then}",
                         ExitCode.BUDGET if resource else ExitCode.ERROR)


class _FdSink:
    """Where a zstd stream writer puts its frames: a file descriptor, bytes counted."""

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.size = size  # bytes in the file

    def write(self, data) -> int:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            self.size += n
            view = view[n:]
        return len(data)

    def flush(self) -> None:
        pass


# A raw zstd block, empty, marked last: it ends a frame (frames are written without a
# content checksum, so nothing else is needed after the last block).
_END_OF_FRAME = b"\x01\x00\x00"


class RecordWriter:
    """Writes whole JSON lines to stdout (`-`), a plain file, or a `.zst` file.

    With `append=True` an existing file is continued (a zstd file gets a new frame, which
    every zstd reader reads across).

    Files: each `write_line(data)` (one or more whole lines) reaches the OS before it
    returns, and lands whole or not at all. When the OS refuses a write (ENOSPC, EFBIG,
    EIO, ...), the file is cut back to where it stood before that call, and
    OutputWriteError is raised; the writer is then closed. A plain file is truncated to its
    size before the call; a zstd file to the end of the last block written (each call
    ends a block), and its frame is ended there with an empty last block, so the file
    decompresses to whole lines (if even those 3 bytes do not fit, the frame is left open
    after whole lines: kimipipe's readers read it, the next resume closes it).
    `durable=True` also flushes stdout after every call.

    `keep_whole=False` (for a file that is thrown away when a write fails, as AtomicOutput
    does) skips the per-call block flush of a zstd file and lets OSError through as it is.
    `compress`: zstd or not (default: by the `.zst` suffix of PATH).
    """

    def __init__(self, path: str, *, append: bool = False, durable: bool = False, level: int = 3,
                 keep_whole: bool = True, compress: bool | None = None):
        self.path = path
        self.durable = durable
        self.keep_whole = keep_whole
        self._fd: int | None = None
        self._zst = None
        self._sink: _FdSink | None = None
        self._stdout = None
        self._size = 0  # plain file: its size; zstd: the end of the last whole block
        self._frame_start = 0
        if path == "-":
            self._stdout = sys.stdout.buffer
            return
        # O_APPEND always: after a cut-back, the next bytes go to the new end.
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        self._fd = os.open(path, flags, 0o644)
        self._size = self._frame_start = os.fstat(self._fd).st_size
        if path.endswith(".zst") if compress is None else compress:
            self._sink = _FdSink(self._fd, self._size)
            # No content checksum: a frame ended by _END_OF_FRAME after a failed write could
            # not carry one.
            self._zst = zstandard.ZstdCompressor(level=level, write_checksum=False).stream_writer(
                self._sink, closefd=False)

    def write_line(self, line: bytes) -> None:
        if self._zst is not None:
            try:
                self._zst.write(line)
                if self.keep_whole or self.durable:
                    self._zst.flush(zstandard.FLUSH_BLOCK)
                    self._size = self._sink.size
            except OSError as e:
                if not self.keep_whole:
                    raise
                self._fail(e)
        elif self._fd is not None:
            before = self._size
            view = memoryview(line)
            try:
                while view:
                    n = os.write(self._fd, view)
                    self._size += n
                    view = view[n:]
            except OSError as e:
                if not self.keep_whole:
                    raise
                self._size = before
                self._fail(e)
        elif self._stdout is not None:
            self._stdout.write(line)
            if self.durable:
                self._stdout.flush()
        else:
            raise ValueError(f"{self.path}: write after close")

    def _fail(self, error: OSError) -> None:
        """Cut the file back to its last whole record, close, and raise OutputWriteError."""
        fd, self._fd = self._fd, None
        zst, self._zst = self._zst, None
        del zst  # its state is past the cut: never flushed again
        cut_back = True
        try:
            os.ftruncate(fd, self._size)
            if self._sink is not None and self._size > self._frame_start:
                try:
                    _write_all(fd, _END_OF_FRAME)
                except OSError:
                    os.ftruncate(fd, self._size)  # left open after whole lines
        except OSError:
            cut_back = False
        finally:
            os.close(fd)
        raise OutputWriteError(self.path, error, cut_back) from error

    def flush(self) -> None:
        if self._zst is not None:
            try:
                self._zst.flush(zstandard.FLUSH_BLOCK)
                self._size = self._sink.size
            except OSError as e:
                if not self.keep_whole:
                    raise
                self._fail(e)
        elif self._stdout is not None:
            self._stdout.flush()

    def close(self) -> None:
        if self._zst is not None:
            try:
                self._zst.close()  # ends the frame
            except OSError as e:
                if not self.keep_whole:
                    raise
                self._fail(e)
            self._zst = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        elif self._stdout is not None:
            self._stdout.flush()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class AtomicOutput:
    """An output file that appears under its name only when complete (temp name + rename).

    For stages that write a finished product rather than an append-only log; stdout is
    passed straight through.
    """

    def __init__(self, path: str, **writer_args):
        self.path = path
        self.tmp = path if path == "-" else f"{path}.tmp-{os.getpid()}"
        # Compressed by the final name's suffix (the temporary name has none); a failed
        # write needs no cut-back: the file is discarded.
        writer_args.setdefault("compress", path.endswith(".zst"))
        self.writer = RecordWriter(self.tmp, keep_whole=False, **writer_args)

    def commit(self) -> None:
        self.writer.close()
        if self.path != "-":
            os.replace(self.tmp, self.path)

    def discard(self) -> None:
        self.writer.close()
        if self.path != "-" and os.path.exists(self.tmp):
            os.unlink(self.tmp)


def _exists_as(path: str) -> str | None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        return e.strerror
    return "dir" if stat.S_ISDIR(mode) else "file"


def _nearest_dir(path: str) -> str:
    """The deepest existing ancestor of PATH (what must be writable to create PATH)."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    return parent


def _dir_problem(directory: str) -> str | None:
    if not os.path.isdir(directory):
        return f"{directory} is not a directory"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"the directory {directory} is not writable"
    return None


def check_writable(path: str, option: str = "-o", *, in_place: bool = True) -> None:
    """Refuse (exit 2) output file PATH if it cannot be written; create nothing.

    IN_PLACE: the file is appended to or rewritten where it is (its directory must still
    take the lock file or a repair sidecar); False: it is written under a temporary name
    and renamed (AtomicOutput), which the directory alone decides.
    """
    if path == "-":
        return
    kind = _exists_as(path)
    problem = None
    if kind == "dir":
        problem = "is a directory"
    elif kind == "file":
        if in_place:
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_APPEND))  # opened, not changed
            except OSError as e:
                problem = e.strerror
        problem = problem or _dir_problem(os.path.dirname(os.path.abspath(path)))
    elif kind is None:
        parent = os.path.dirname(os.path.abspath(path))
        problem = (f"no such directory: {parent}" if not os.path.exists(parent)
                   else _dir_problem(parent))
    else:
        problem = kind
    if problem:
        raise KPError(f"cannot write {option} {path}: {problem}", ExitCode.USAGE)


def check_writable_dir(path: str, option: str = "--out") -> None:
    """Refuse (exit 2) output directory PATH if it cannot be created or written into."""
    kind = _exists_as(path)
    if kind == "file":
        problem = "is a file"
    elif kind == "dir":
        problem = _dir_problem(path)
    elif kind is None:
        nearest = _nearest_dir(path)
        problem = _dir_problem(nearest) and f"cannot create it: {_dir_problem(nearest)}"
    else:
        problem = kind
    if problem:
        raise KPError(f"cannot write {option} {path}: {problem}", ExitCode.USAGE)
