"""A kp-tokenize run: response records in, token records out, in input order.

`run_tokenize(settings, input, output, rejects, ...)` is what commands/tokenize.py calls,
once its options are checked. It locks OUTPUT for the run (a second kp-tokenize on it exits
2), loads the engine (tokenize/engine.py: the tokenizer and template, checked before any
output is touched), skips the answers OUTPUT holds rows of already (by id and generation
id; a torn last line repaired first), and streams the rest in batches (`BATCH_RECORDS` records or
`BATCH_BYTES` bytes) through the engine: in this process, or in `--workers` processes that
keep the input order (tokenize/pool.py). Each batch's records are written in one go, its
rejects logged to `--rejects` (the first three said; `--strict` stops at the first, exit
2). A bad input line stops the run with PATH:LINE once the records before it are written.
The summary (tokenize/stats.py) goes to stderr; the exit code is 4 when a record was
rejected. `--prompts FILE` tokenizes only the answers to FILE's prompts; an output that
holds rows the input did not give (an earlier input's) is refused at the end of the run,
exit 2, or pruned (`--prune`): tokenize/current.py.
"""

from __future__ import annotations

import functools
import itertools
import os
from contextlib import closing

from ..errors import ExitCode, InputError, KPError
from ..io import OutputLock, RecordWriter, iter_records
from ..partition import in_partition
from ..records import Rejected, encode_line
from ..terminal import counted, progress, say
from . import fields
from .current import Prompts, Row, prune_output, scan_rows, stale_rows
from .engine import Engine, Settings, spawned_worker
from .stats import Summary

BATCH_RECORDS = 64
BATCH_BYTES = 1 << 20


def _batches(path: str, done: set[Row], summary: Summary, partition=None,
             ignore_extra_fields: bool = False, prompts: Prompts | None = None,
             given: set[Row] | None = None):
    """(line number, raw line) batches of the records still to do (DONE: the answers the
    output has rows of, by id and generation id), validated as responses. PROMPTS: only the
    answers to them (tokenize/current.py); GIVEN collects the answers the input gives, done
    or not, for the output's check at the end."""
    batch: list[tuple[int, bytes]] = []
    size = 0
    try:
        for lineno, rec, line in iter_records(path, fields.DECODER, expect="response"):
            refusal = (fields.empty_tool_call_turn(rec.messages) if ignore_extra_fields
                       else fields.unrenderable_field(rec.messages))
            if refusal:
                raise InputError(refusal, path, lineno)
            if prompts is not None and not prompts.holds(rec.id, rec.conversation, rec.messages):
                summary.not_current += 1
                continue
            row = (rec.id, rec.generation_id)
            if given is not None:
                given.add(row)
            if row in done:
                summary.skipped_done += 1
                continue
            if not in_partition(rec.id, partition):
                continue
            batch.append((lineno, line))
            size += len(line)
            if len(batch) >= BATCH_RECORDS or size >= BATCH_BYTES:
                yield batch
                batch, size = [], 0
    except KPError:  # a bad line: the records before it are still done, then it stops
        if batch:
            yield batch
        raise
    if batch:
        yield batch


def _outcomes_inline(engine: Engine, batches):
    for batch in batches:
        yield engine.process(batch)


def _outcomes_in_pool(engine: Engine, workers: int, batches):
    """Each batch's outcomes, in input order, from WORKERS processes (tokenize/pool.py).

    Workers are forked from this process where the platform allows, so they start with the
    tokenizer already loaded (a spawned worker would import transformers and load it again).
    """
    from ..tokenize.pool import WorkerPool  # (multiprocessing: not needed by --help or --workers 1)

    pool = WorkerPool(workers, fork_setup=lambda: engine.process,
                      spawn_setup=functools.partial(spawned_worker, engine.settings))
    finished = False
    try:
        yield from pool.map(batches)
        finished = True
    finally:
        pool.close(abort=not finished)


def _write_outcomes(outcomes, summary: Summary, writer: RecordWriter,
                    reject_writer: RecordWriter | None, strict: bool, quiet: bool,
                    input_path: str) -> None:
    """One batch's outcomes: records written in one go, rejects logged (fatal with --strict)."""
    lines: list[bytes] = []
    for o in outcomes:
        if o.kind == "invalid":  # the records before it are written, then it stops
            if lines:
                writer.write_line(b"".join(lines))
            raise InputError(o.reason, input_path, o.line)
        summary.add(o)
        if o.kind == "ok":
            lines.append(o.payload)
        elif o.kind == "reject":
            if reject_writer:
                reject_writer.write_line(encode_line(Rejected(o.id, o.line, o.reason)))
            if strict:
                writer.write_line(b"".join(lines))
                raise KPError(f"{o.id} (input line {o.line}): {o.reason}", exit_code=ExitCode.USAGE)
            if summary.rejected <= 3:
                say(f"kp-tokenize: rejected {o.id} (input line {o.line}): {o.reason}", quiet)
    if lines:
        writer.write_line(b"".join(lines))


def run_tokenize(settings: Settings, input: str, output: str, rejects: str | None, *,
                 workers: int | None = None, partition=None, quiet: bool = False,
                 prompts: str | None = None, prune: bool = False) -> int:
    """The run (see the module docstring); its exit code. WORKERS: processes (None: one
    per core). PROMPTS: a prompts file, only whose answers are tokenized; PRUNE: rows of
    OUTPUT the input does not give are removed instead of refused (tokenize/current.py)."""
    workers = workers or os.cpu_count() or 1
    if workers > 1:
        # One process per core does the work; the tokenizers library's own threads would only
        # compete (and it refuses them after a fork anyway).
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    summary = Summary()
    with OutputLock(output, "kp-tokenize", note=lambda text: say(f"kp-tokenize: {text}", quiet)):
        current = Prompts(prompts) if prompts else None  # (a bad line: before the tokenizer's load)
        engine = Engine(settings)  # loads and checks everything before any output is touched
        say(f"kp-tokenize: {engine.describe()}, {counted(workers, 'worker')}", quiet)
        done = scan_rows(output, quiet=quiet)
        given: set[Row] = set()
        _run(engine, workers, _batches(input, done, summary, partition,
                                       settings.ignore_extra_fields, current, given),
             summary, output, rejects, settings.strict, quiet, input)
        stale = stale_rows(done, given)
        if stale and not prune:
            of = f"{prompts}'s answers in {input}" if prompts else input
            raise KPError(
                f"{output} holds {counted(len(stale), 'row')} that {of} does not give "
                f"(first: {stale[0][0]!r}): an earlier input's, never to be trained on beside "
                f"this one's; rerun with --prune to remove them from {output}, or write to "
                "a new output", exit_code=ExitCode.USAGE)
        if stale:
            summary.pruned = prune_output(output, set(stale))
    say(summary.report(output, rejects), quiet)
    for line in summary.deltas_report():
        say(line, quiet)
    if summary.rejected:
        say(summary.rejects_note(output, rejects), quiet)
        return ExitCode.PARTIAL
    return ExitCode.OK


def _run(engine: Engine, workers: int, batches, summary: Summary, output: str,
         rejects: str | None, strict: bool, quiet: bool, input_path: str) -> None:
    # The first batch is read before any output is opened: an empty input or a bad first
    # line leaves every file as it was.
    first = next(batches, None)
    if first is None:
        return
    batches = itertools.chain([first], batches)
    writer = RecordWriter(output, append=True)
    reject_writer = RecordWriter(rejects) if rejects else None
    bar = progress(desc="kp-tokenize", unit="rec", quiet=quiet)
    try:
        if workers > 1:
            results = _outcomes_in_pool(engine, workers, batches)
        else:
            results = _outcomes_inline(engine, batches)
        with closing(results):
            for outcomes in results:
                _write_outcomes(outcomes, summary, writer, reject_writer, strict, quiet, input_path)
                bar.update(len(outcomes))
    finally:
        bar.close()
        writer.close()
        if reject_writer:
            reject_writer.close()
