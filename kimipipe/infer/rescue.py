"""Paid answers the output could not take: saved in a rescue file, taken in by the next run.

When a write to `-o` fails (a full disk, a file size limit, an I/O error), the output is cut
back to its last whole record (output.RecordWriter) and the run stops; the answers of that
write and of every request still in flight are paid for all the same. They go to a rescue
file on another filesystem, and the next run over the same output appends them to it
before it sends anything, so none is lost and none is paid for twice. Failure records
that `--failures` could not take are kept the same way (a routing violation's record
carries a cost that counts against `--max-cost`).

Path rule (the next run finds the file without being told):

    RESCUE_DIR/<file name>.<first 16 hex digits of SHA-256 of the absolute path>.jsonl

RESCUE_DIR is `--rescue DIR`, default `<temp dir>/kimipipe-rescue-<uid>` (the temp dir is
$TMPDIR, else /tmp; one directory per user, mode 0700, since the records are the user's
data). The next run must be given the same `--rescue DIR` (or none both times), on the
same host, with the output at the same absolute path.

Format: exactly the lines the target file would have held (JSON lines, plain even for a
`.zst` target), so `cat RESCUE >> OUTPUT` does by hand what the next run does. Taking a
file in appends the lines whose record is not in the target yet (by ID and the messages
asked, for the output: a prompt fixed under its ID is answered again under it; for the
failures file, lines not already there), then removes the rescue file; a run stopped
half-way through is safe to repeat.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from collections.abc import Callable

import msgspec

from ..errors import ExitCode, InputError, KPError
from ..io import (
    OutputWriteError,
    RecordWriter,
    check_writable_dir,
    iter_lines,
    repair_and_report,
)
from ..recorded.asked import prompt_digest
from ..records import Failure, IdOnly, Message, Response, record_cost
from ..terminal import counted
from .config import Files


def default_rescue_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"kimipipe-rescue-{os.getuid()}")


def rescue_path(target: str, rescue_dir: str | None = None) -> str:
    """Where the records TARGET could not take are kept (see the module docstring)."""
    absolute = os.path.abspath(target)
    digest = hashlib.sha256(absolute.encode()).hexdigest()[:16]
    return os.path.join(rescue_dir or default_rescue_dir(),
                        f"{os.path.basename(absolute)}.{digest}.jsonl")


def check_rescue_dir(rescue_dir: str | None) -> None:
    """Refuse (exit 2), before any work, a rescue directory that could not be used; create
    nothing (the directory is made only when an answer has to be rescued)."""
    option = "--rescue" if rescue_dir else "the rescue directory"
    directory = rescue_dir or default_rescue_dir()
    check_writable_dir(directory, option)
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or (rescue_dir is None and st.st_uid != os.getuid()):
        # the shared temp dir: a directory planted by someone else is not ours to write into
        raise KPError(f"cannot use {option} {directory}: it is a symbolic link or belongs to "
                      "another user; pass --rescue DIR", ExitCode.USAGE)


class Rescue:
    """The rescue file of one target file (opened on the first record saved)."""

    def __init__(self, target: str, rescue_dir: str | None):
        self.target = target
        self.path = rescue_path(target, rescue_dir)
        self.writer: RecordWriter | None = None
        self.saved = 0
        self.error: str | None = None  # why a record could not be saved either

    def save(self, line: bytes) -> bool:
        """Keep LINE; False when the rescue file cannot take it either."""
        if self.error is not None:
            return False
        try:
            if self.writer is None:
                os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
                self.writer = RecordWriter(self.path, append=True, durable=True, compress=False)
            self.writer.write_line(line)
        except (OSError, OutputWriteError) as e:
            self.error = e.message if isinstance(e, KPError) else f"{self.path}: {e.strerror or e}"
            self.writer = None
            return False
        self.saved += 1
        return True

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except (OSError, KPError):
                pass
            self.writer = None


class _Answer(IdOnly):
    """Which request a record answers: its id and the messages it was asked with (a prompt
    fixed under its id, or a conversation's turn, is answered again under the same id, with
    other messages: infer/resume.py)."""

    messages: list[Message]


_id_decoder = msgspec.json.Decoder(_Answer)
_response_decoder = msgspec.json.Decoder(Response)
_failure_decoder = msgspec.json.Decoder(Failure)


def take_in(target: str, rescue_dir: str | None, decoder: msgspec.json.Decoder, *,
            by_id: bool, say: Callable[[str], None], what: str) -> tuple[int, float]:
    """Append the rescued records of TARGET to it, then remove the rescue file.

    Every line is checked with DECODER first (a bad line stops the run: exit 2, the rescue
    file kept). BY_ID: a record whose ID is in TARGET already is not appended again (the
    output); else a line already in TARGET is not (the failures file). Returns (records
    appended, their cost). Run it with TARGET's lock held, after its torn tail is repaired.
    An answer is told by its ID and the messages it was asked with (recorded/asked.py): the
    new answer to a prompt (or turn) fixed under its ID and asked again is taken in beside
    the old answer; a second answer to the same request is not.
    """
    path = rescue_path(target, rescue_dir)
    if not os.path.exists(path):
        return 0, 0.0
    repair_and_report(path, report=say)  # a rescue cut short by a kill: its last line redone
    rescued = []
    for lineno, line, _ended in iter_lines(path):
        try:
            rescued.append((decoder.decode(line), line))
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise InputError(f"not a {what} ({e}); the file holds records paid for: "
                             "fix or remove this line, then rerun", path, lineno) from None
    have: set = set()
    if os.path.exists(target):
        for _lineno, line, _ended in iter_lines(target):
            have.add(_answer_key(_id_decoder.decode(line)) if by_id else line)
    added, cost = 0, 0.0
    writer = RecordWriter(target, append=True, durable=True)
    try:
        for record, line in rescued:
            key = _answer_key(record) if by_id else line
            if key in have:
                continue
            writer.write_line(line + b"\n")  # raises OutputWriteError: the rescue file stays
            have.add(key)
            added += 1
            cost += _cost_of(record)
    finally:
        writer.close()
    os.unlink(path)
    if added:
        say(f"kp-infer: took in {counted(added, what)} (${cost:.6f}) kept in {path} by an "
            f"earlier run that could not write them to {target}; they are not sent again")
    else:
        say(f"kp-infer: removed {path}: its records are in {target} already")
    return added, cost


def _answer_key(record) -> tuple[str, bytes]:
    return record.id, prompt_digest(record.messages)


def take_in_rescued(files: Files, say: Callable[[str], None]) -> int:
    """Append what earlier runs paid for but could not write (see above) to OUTPUT
    and the failures file, after repairing their torn tails; the answers taken in."""
    answers = 0
    if files.output != "-":
        repair_and_report(files.output, report=say)
        answers, _cost = take_in(files.output, files.rescue_dir, _response_decoder, by_id=True,
                                 say=say, what="answer")
    if files.failures:
        repair_and_report(files.failures, report=say)
        take_in(files.failures, files.rescue_dir, _failure_decoder, by_id=False, say=say,
                what="failure record")
    return answers


def _cost_of(record) -> float:
    """What a rescued Response or Failure cost (records.record_cost)."""
    usage = getattr(record, "usage", None)
    return record_cost(None if usage is None else usage.cost,
                       (r.cost for r in getattr(record, "refused", ())),
                       getattr(record, "cost", 0.0) or 0.0)
