"""Where a kp-infer run's results go: response records, failure records, the rescue file.

Before anything is read or sent, every file the run will write (`-o`, `--failures`,
`--summary-json`, the rescue directory) is checked writable (`check_outputs`: exit 2,
nothing created). `-o` and `--failures` are then locked for the whole run
(`output_locks`: a lock file beside each, kimipipe/locks.py): a second kp-infer on either
refuses at once (exit 2) naming who holds it, because two runs on one output would both
pay for what neither has written yet, and two on one failures file would count each
other's paid failures and could cut each other's records off after a failed write.
`--done` files are only read, never locked; the run is prepared (infer/prepare.py) and
run with the locks held. An output or failures file the run created and wrote no record to
after a fatal stop (exit 1 or 2: a wrong key, no route) is removed as the locks are let go.

A response record is the prompt line as it came (every field passed through, undecoded)
with kp-infer's own fields, `records.Generation` (`api`: who answered, recorded/api.py),
written over it; it is written whole and flushed as the answer arrives (`durable`), so
`kill -9` never loses a written answer nor tears a line of a plain file. A prompt given up on this run goes to `--failures` as a
`records.Failure` line (its cost set when the failed answer was paid for).

A write the output refuses (a full disk, a file size limit, an I/O error; RecordWriter has
cut the file back to its last whole record) stops the run; that answer and every one still
arriving are paid for, so they go to the rescue file (infer/rescue.py), which the next run
takes in first. Each write says what became of its record (`Kept`): WRITTEN, RESCUED or
LOST (stdout closed, or the rescue file failed too).

Which answers are results at all (routing, reasoning, think markers) is
infer/acceptance.py.
"""

from __future__ import annotations

import base64
import errno
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from enum import StrEnum

from ..errors import ExitCode, KPError, redact
from ..io import (
    OutputLock,
    OutputWriteError,
    RecordWriter,
    check_writable,
    iter_lines,
    require_distinct,
)
from ..kinds import StopReason
from ..openrouter.attempt import Attempt
from ..recorded.api import api_of
from ..records import (
    Failure,
    Generation,
    Identity,
    Prompt,
    Refusal,
    ResponseText,
    SampledIds,
    SampledTokens,
    Sampling,
    Usage,
    decode_passthrough,
    encode_line,
    encode_over,
)
from .config import Files, RunConfig
from .rescue import Rescue, check_rescue_dir
from .servers import server_sampling


class Kept(StrEnum):
    """What became of one record written."""

    WRITTEN = "written"
    RESCUED = "rescued"  # the file refused it: in the rescue file, for the next run
    LOST = "lost"  # refused, and no rescue file took it (stdout closed, or it failed too)


WRITTEN, RESCUED, LOST = Kept.WRITTEN, Kept.RESCUED, Kept.LOST


def check_outputs(files: Files) -> None:
    """Refuse (exit 2, one line, nothing created) an output the run could not write: all
    of them, before a lock is taken or a request sent (an unwritable --summary-json found
    after the run would have paid for every answer and then failed)."""
    require_distinct(files.output, files.input)
    check_writable(files.output, "-o")
    if files.failures:
        require_distinct(files.failures, files.input, files.output)
        check_writable(files.failures, "--failures")
    if files.summary_json == "-" and files.output == "-":
        raise KPError("--summary-json - and -o - both want stdout: give one of them a file",
                      ExitCode.USAGE)
    if files.summary_json and files.summary_json != "-":
        require_distinct(files.summary_json, files.input, files.output,
                         *([files.failures] if files.failures else []))
        check_writable(files.summary_json, "--summary-json", in_place=False)
    if files.output != "-" or files.failures:
        check_rescue_dir(files.rescue_dir)


@contextmanager
def output_locks(files: Files, plan: bool, say: Callable[[str], None]) -> Iterator[RunStart]:
    """Hold the locks of -o and --failures (FILES'; see the module docstring). Not for
    --plan (PLAN): it only reads them (no repair, no rescue taken in), and `make plan` may run
    beside a build that is writing them."""
    def note(text: str) -> None:
        say(f"kp-infer: {text}")

    paths = [] if plan else [p for p in (files.output, files.failures) if p and p != "-"]
    new = [p for p in paths if not os.path.exists(p)]
    start = RunStart()
    with ExitStack() as stack:
        for path in paths:
            stack.enter_context(OutputLock(path, "kp-infer", note=note))
        try:
            yield start
        except KPError:
            _remove_if_empty(new)  # (the locks still held)
            raise
        if start.fatal:
            _remove_if_empty(new)


class RunStart:
    """What output_locks is told of how the run ended: `fatal` (exit 1 or 2: a wrong key, no
    route), after which a file the run created and wrote no record to is removed."""

    fatal: bool = False


def _remove_if_empty(created: list[str]) -> None:
    """A file this run created and wrote no record to, after a fatal stop, is removed: an
    empty output left behind reads as a run that answered nothing. (A run that finished,
    was interrupted or stopped for money keeps it, empty or not.)"""
    for path in created:
        try:
            if os.path.getsize(path) == 0 or not any(True for _ in iter_lines(path)):
                os.unlink(path)
        except (OSError, KPError):
            pass  # unreadable: not ours to judge; left as it is


def generation_fields(answer: Attempt, attempts: int, model: str,
                      sampling: Sampling | None = None, cost: float | None = None,
                      cost_source: str = "usage") -> Generation:
    """kp-infer's fields of a response record, from an `ok` attempt (MODEL if it names none).

    COST: what the answer cost, settled (infer/costs.py) when its usage showed none; an
    answer without a cost is never written as free."""
    if cost is None:
        cost = answer.cost
    if cost is None:
        raise ValueError("an answer's cost must be settled before its record is written "
                         "(infer/costs.py)")
    return Generation(
        response=ResponseText(content=answer.content, reasoning=answer.reasoning),
        finish_reason=answer.finish_reason,
        model=answer.model or model,
        provider=answer.provider,
        generation_id=answer.generation_id,
        usage=Usage(prompt_tokens=answer.prompt_tokens, completion_tokens=answer.completion_tokens,
                    reasoning_tokens=answer.reasoning_tokens, cost=cost,
                    cached_tokens=answer.cached_tokens),
        attempts=attempts,
        sampling=sampling,
        cost_source=cost_source,
        reasoning_source=answer.reasoning_source or None,
        sampled_ids=(None if answer.output_ids is None
                     else SampledIds(output=answer.output_ids, prompt=answer.prompt_ids)),
        sampled_tokens=sampled_tokens_of(answer),
        cut_by=answer.cut_by or None,
    )


def sampled_tokens_of(answer: Attempt) -> SampledTokens | None:
    """The record's `sampled_tokens` from an answer's token logprobs (None without)."""
    if answer.token_lengths is None:
        return None
    return SampledTokens(
        lengths=answer.token_lengths, spells=answer.token_spells or None,
        data=None if answer.token_data is None else base64.b64encode(answer.token_data).decode(),
        null_bytes=answer.token_nulls)


def failure_record(prompt: Prompt, kind: str, attempt: Attempt, attempts: int, *,
                   provider: str | None = None, cost: float = 0.0,
                   generation_id: str | None = None,
                   refused: list[Refusal] | None = None,
                   retried: dict[str, int] | None = None) -> Failure:
    """A failure line; COST is what was paid for this prompt this run (its REFUSED answers)."""
    return Failure(
        id=prompt.id, dataset=prompt.dataset, kind=kind, status=attempt.status,
        code=attempt.code or attempt.cause, message=redact(attempt.message), attempts=attempts,
        time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        provider=provider or None, generation_id=generation_id or None, cost=cost,
        refused=list(refused or ()), error_type=attempt.error_type or None,
        retried=dict(retried or {}),
    )


class Destination:
    """One file of the run (the output, or --failures) and the rescue file behind it."""

    def __init__(self, path: str, rescue: Rescue | None):
        self.path = path
        self.rescue = rescue
        self.writer: RecordWriter | None = None  # None: not opened, or refused a write
        self.error: OSError | None = None  # why it refused one

    def open(self) -> None:
        self.writer = RecordWriter(self.path, append=True, durable=True)

    def write(self, line: bytes) -> Kept:
        if self.writer is not None:
            try:
                self.writer.write_line(line)
                return WRITTEN
            except (OSError, OutputWriteError) as e:
                # (the writer has closed itself; a closed stdout is closed for good too)
                self.writer = None
                self.error = e.error if isinstance(e, OutputWriteError) else e
        if self.rescue is not None and self.rescue.save(line):
            return RESCUED
        return LOST

    def close(self) -> None:
        if self.writer is not None:
            try:  # (a .zst file's frame is ended here; if even that fails, the next run does)
                self.writer.close()
            except (OSError, KPError):
                pass  # a closed pipe or a full disk: already reported as an output stop
        self.writer = None
        if self.rescue is not None:
            self.rescue.close()


class Output:
    """The output file and the failures file of one run (`open()`, then `close()`)."""

    def __init__(self, config: RunConfig):
        self.config = config
        self.sampling = config.request.sampling(config.policy)  # the same for every prompt
        # a --server's answer: what a server was sent (no OpenRouter fields: infer/servers.py)
        self.server_sampling = (server_sampling(config.request.fields(config.policy))
                                if config.sending.servers else None)
        # who answers: on every record (recorded/api.py); a server's answer names its host
        self.api = api_of(config.sending.base_url if config.sending.openrouter or not config.sending.servers
                          else config.sending.servers[0])
        self.rescues = {name: Rescue(path, config.files.rescue_dir)
                        for name, path in (("output", config.files.output), ("failures", config.files.failures))
                        if path and path != "-"}
        self.responses = Destination(config.files.output, self.rescues.get("output"))
        self.failures = (Destination(config.files.failures, self.rescues.get("failures"))
                         if config.files.failures else None)
        self.error: OSError | None = None  # the first write either file refused
        self.error_file: str | None = None
        self._said = False  # the refused write told (once)

    def open(self) -> None:
        self.responses.open()
        if self.failures is not None:
            self.failures.open()

    def close(self) -> None:
        for destination in (self.responses, self.failures):
            if destination is not None:
                destination.close()

    def write_response(self, prompt_line: bytes, answer: Attempt, attempts: int, *,
                       refused: list[Refusal] | None = None, latency: float | None = None,
                       cost: float | None = None, cost_source: str = "usage",
                       identity: Identity | None = None,
                       retried: dict[str, int] | None = None) -> Kept:
        """Write the response record of PROMPT_LINE: WRITTEN, RESCUED or LOST (COST and
        COST_SOURCE: as settled by infer/costs.py when the answer's usage showed none;
        IDENTITY: kimipipe's counts it was checked against, infer/identity.py)."""
        server = answer.api is not None and self.server_sampling is not None
        fields = generation_fields(answer, attempts, self.config.request.model,
                                   self.server_sampling if server else self.sampling,
                                   cost, cost_source)
        fields.refused = list(refused or ())
        fields.latency_s = round(latency, 3) if latency is not None else None
        now = time.time()
        fields.finished_at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
        fields.api = answer.api or self.api  # a server's answer: its host
        fields.identity = identity
        fields.retried = dict(retried) if retried else None
        if not server and answer.provider in self.config.policy.unverifiable_names:
            # its name covers an excluded variant too (openrouter/routing.py: mixed_names):
            # kept, but not verifiable; counted in the summary (report.py)
            fields.routing = "unverifiable"
        return self._write(self.responses, encode_over(decode_passthrough(prompt_line), fields))

    def write_failure(self, failure: Failure) -> Kept:
        if self.failures is None:
            return WRITTEN  # (not asked to keep them)
        failure.api = self.api
        return self._write(self.failures, encode_line(failure))

    def _write(self, destination: Destination, line: bytes) -> Kept:
        refused_before = destination.error
        kept = destination.write(line)
        if destination.error is not refused_before and self.error is None:
            self.error, self.error_file = destination.error, destination.path
        return kept

    @property
    def disk_full(self) -> bool:
        """The write that failed was refused for room (a full disk, a quota, a size limit)."""
        return self.error is not None and self.error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

    @property
    def write_error(self) -> str | None:
        """`PATH: why` of the first write a file refused (None: none did, or stdout was
        closed: a reader gone is no error of a file)."""
        if self.error is None or self.error_file == "-":
            return None
        return f"{self.error_file}: {self.error.strerror or self.error}"

    def rescue_files(self) -> dict[str, str]:
        """{"output"|"failures": path} of the rescue files that kept a record, once a file
        refused a write (for the summary)."""
        if self.write_error is None:
            return {}
        return {name: r.path for name, r in self.rescues.items() if r.saved}

    def refusal(self) -> tuple[StopReason, str | None]:
        """What a refused write means for the run: the stop it makes (the reader of stdout
        gone, a full disk, another write error) and, the first time a file refuses one, the
        line that says so and where the answers still arriving are kept."""
        if self.error_file == "-":
            return StopReason.CLOSED_PIPE, None
        note = None
        if not self._said:
            self._said = True
            rescue = self.rescues.get("failures" if self.error_file == self.config.files.failures
                                      else "output")
            note = (f"kp-infer: cannot write {self.write_error} (it ends with its last whole "
                    "record); answers paid for that it cannot take are kept in "
                    f"{rescue.path} for the next run")
        return (StopReason.DISK if self.disk_full else StopReason.OUTPUT), note
