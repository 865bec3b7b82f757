"""kp-tokenize: response records in, the target model's exact token IDs out.

Usage:
    kp-tokenize B3.responses.jsonl --tokenizer ./kimi-k2.5 --trust-remote-code -o B3.tokens.jsonl
    kp-tokenize responses.jsonl.zst --tokenizer ./kimi-k2.5 --trust-remote-code --drop-text \\
        --max-length 32768 --drop-long --rejects B3.rejects.jsonl | kp-shard --out shards/B3
    kp-tokenize r.jsonl --tokenizer Qwen/Qwen3-8B --preset qwen3 --no-thinking --strict

Schema (one JSON object per line): the response record's fields, passed through, plus
    {"prompt_tokens_delta": int?, "completion_tokens_delta": int?, "reasoning_source": str?,
     "input_ids": [int], "output_ids": [int], "over_max_length": true?}
`input_ids` is the record's messages rendered by the model's chat template with the
generation prompt (thinking on: ending `<think>`; --no-thinking: `<think></think>`), as the
serving stack tokenizes it. `output_ids` is the generated turn: for Kimi K2.5
`enc(reasoning) + [</think>] + enc(content) + [<|im_end|>]`; a `finish_reason: "length"`
turn ends where its text ends; any other finish_reason (`content_filter`, `error`, null) is
rejected: the turn did not end, so no end-of-turn token may follow it. --drop-text leaves
out `messages` and `response`.
Rejects file lines: {"id", "line", "reason"}; it is rewritten on each run, and as rejected
records are never in the output, a rerun tries them again and lists those that fail still.

Messages are rendered from their role and content, as kp-infer sends them. A message
carrying more that the template would render (`name`, `tool_calls`, `tool_call_id`,
non-text content parts, earlier turns' `reasoning_content` under a template that keeps
it) stops the command with PATH:LINE naming the field, unless --ignore-extra-fields
(kimipipe/tokenize/fields.py).

The deltas are the provider's usage counts minus kimipipe's (the completion's without the
structural tokens kp-tokenize inserts); the summary tabulates them per provider, warns
about a provider (or a template) that renders prompts otherwise, and --max-prompt-delta N
rejects rows further off (kimipipe/tokenize/deltas.py). A response with no reasoning whose
content holds one `</think>` and no `<think>` (no reasoning parser) has the text before it
as its reasoning (`reasoning_source: inline`; kimipipe/think_tags.py).

A record with the model's sampled IDs (a server's `sampled_ids`, or the `sampled_tokens` of
token logprobs, `kp-infer --logprobs`) gets them as `output_ids` where they prove out,
part by part (`output_ids_source` "sampled" or "partial", `sampled_parts`, `reencoded_ids`,
`resegmented`), else the re-encoding with `sampled_fallback` saying why; the summary
tabulates, per provider, how often re-encoding differs from what was sampled
(kimipipe/tokenize/resegment.py, docs/kp-tokenize.md).

Every row is verified (decode(input_ids + output_ids) == rendered prompt + rendered turn,
and no control token inside the model's text); failures go to --rejects and make the exit
code 4 (--strict: stop at the first one, exit 2). Streaming, bounded memory; --workers
processes keep the input order. With -o FILE, records whose id is already in FILE are
skipped and new ones appended (a torn last line is repaired first); FILE is locked for the
run (a second kp-tokenize on it exits 2), and a write the disk refuses leaves FILE ending
with its last whole record (exit 3: free space, rerun). A bad input line stops the command
with PATH:LINE (records before it are already written; rerun resumes).
Nothing is downloaded: --tokenizer is a directory or a name in the local Hugging Face cache.
`--check` loads the tokenizer and template as a run would and exits (no input read):
`make check` uses it to find a missing tokenizer before any money is spent.
"""

from __future__ import annotations

import functools
import itertools
import os
from contextlib import closing

import click

from ..cli import (
    DEBUG,
    INPUT,
    OUTPUT,
    PARTITION,
    QUIET,
    counted,
    kp_command,
    progress,
    run_command,
    say,
)
from ..errors import ExitCode, InputError, KPError
from ..io import (
    OutputLock,
    RecordWriter,
    check_writable,
    iter_records,
    require_distinct,
    scan_done,
)
from ..options import CommandSettings, fields_for, option
from ..partition import in_partition
from ..records import Rejected, encode_line
from ..tokenize import fields
from ..tokenize.engine import Engine, Settings, spawned_worker
from ..tokenize.load import prepare_tokenizer_dir
from ..tokenize.render import PRESETS
from ..tokenize.stats import Summary

BATCH_RECORDS = 64
BATCH_BYTES = 1 << 20


EXAMPLES = """
    kp-tokenize B3.responses.jsonl --tokenizer ./kimi-k2.5 --trust-remote-code \\
        -o B3.tokens.jsonl.zst --rejects B3.rejects.jsonl
    kp-tokenize r.jsonl --tokenizer ./kimi-k2.5 --trust-remote-code --drop-text \\
        --max-length 32768 --drop-long | kp-shard --out shards/B3
    kp-tokenize r.jsonl --tokenizer Qwen/Qwen3-8B --preset qwen3 --no-thinking --strict
"""


def _batches(path: str, done: set[str], summary: Summary, partition=None,
             ignore_extra_fields: bool = False):
    """(line number, raw line) batches of the records still to do, validated as responses."""
    batch: list[tuple[int, bytes]] = []
    size = 0
    try:
        for lineno, rec, line in iter_records(path, fields.DECODER, expect="response"):
            refusal = (fields.empty_tool_call_turn(rec.messages) if ignore_extra_fields
                       else fields.unrenderable_field(rec.messages))
            if refusal:
                raise InputError(refusal, path, lineno)
            if rec.id in done:
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


class TokenizeSettings(CommandSettings):
    """kp-tokenize's command line, one field per option, in --help order."""

    input: str = INPUT()
    tokenizer_spec: str = option(
        "--tokenizer", required=True, metavar="DIR",
        help="The target model's tokenizer: a local directory, or a model name already in "
             "the local Hugging Face cache (nothing is downloaded).")
    output: str = OUTPUT(
        help="Output file (`-` = stdout; `.zst` compresses). An existing file is resumed.")
    trust_remote_code: bool = option(
        "--trust-remote-code", is_flag=True, fills=Settings,
        help="Run the tokenizer code the directory ships (Kimi K2.5's tokenization_kimi.py).")
    chat_template: str | None = option(
        "--chat-template", type=click.Path(exists=True, dir_okay=False), default=None,
        help="A Jinja chat template file to use instead of the directory's.")
    preset: str = option(
        "--preset", type=click.Choice(["auto", *PRESETS]), default="auto", show_default=True,
        fills=Settings,
        help="Layout of the generated turn; `auto` picks it from the tokenizer's tokens.")
    thinking: bool = option(
        "--thinking/--no-thinking", default=True, show_default=True, fills=Settings,
        help="How the prompts were rendered: with thinking (prompt ends <think>) or without.")
    drop_truncated: bool = option(
        "--drop-truncated", is_flag=True, fills=Settings,
        help="Leave out turns cut by finish_reason length.")
    max_length: int | None = option(
        "--max-length", type=click.IntRange(min=1), default=None, fills=Settings,
        help="Rows with more IDs in all are flagged (`over_max_length`), or dropped with --drop-long.")
    drop_long: bool = option(
        "--drop-long", is_flag=True, fills=Settings,
        help="With --max-length: leave longer rows out.")
    drop_text: bool = option(
        "--drop-text", is_flag=True, fills=Settings,
        help="Leave `messages` and `response` out of the output.")
    rejects: str | None = option(
        "--rejects", type=click.Path(allow_dash=False), default=None,
        help="Write records that fail verification here, with the reason (JSON lines).")
    strict: bool = option(
        "--strict", is_flag=True, fills=Settings,
        help="Stop at the first record that fails verification (exit 2).")
    ignore_extra_fields: bool = option(
        "--ignore-extra-fields", is_flag=True, fills=Settings,
        help="Render each message's role and content only, leaving out fields the template "
             "would render (name, tool_calls, tool_call_id, non-text parts, earlier turns' "
             "reasoning_content) instead of stopping at them.")
    max_prompt_delta: int | None = option(
        "--max-prompt-delta", type=click.IntRange(min=0), default=None, metavar="N",
        fills=Settings,
        help="Reject rows whose provider-counted usage.prompt_tokens is more than N "
             "away from len(input_ids) (rows with no provider count pass).")
    workers: int | None = option(
        "--workers", type=click.IntRange(min=1), default=None,
        help="Worker processes (default: all cores).")
    check: bool = option(
        "--check", is_flag=True,
        help="Load the tokenizer and chat template as a run would, say what was loaded "
             "(stdout), and exit: no input is read, no output written (`make check`).")
    partition: tuple[int, int] | None = PARTITION()
    quiet: bool = QUIET()
    debug: bool = DEBUG(fills=Settings)  # (run_command reads it too: tracebacks)


def _settings(o: TokenizeSettings) -> Settings:
    """The engine's settings: the chat template's text (--chat-template), then the
    tokenizer's directory, prepared."""
    template_text = None
    if o.chat_template:
        with open(o.chat_template, encoding="utf-8") as f:
            template_text = f.read()
    directory = prepare_tokenizer_dir(o.tokenizer_spec, o.trust_remote_code)
    return Settings(**fields_for(o, Settings), chat_template=template_text,
                    tokenizer_dir=str(directory))


@kp_command("kp-tokenize", settings=TokenizeSettings, examples=EXAMPLES)
def cli(o: TokenizeSettings) -> int:
    """Rebuild the token IDs the target model saw and produced, from response records."""
    input, output, rejects, quiet = o.input, o.output, o.rejects, o.quiet
    if o.drop_long and o.max_length is None:
        raise click.UsageError("--drop-long needs --max-length")
    if not o.check:
        require_distinct(output, input)
        check_writable(output, "-o")
        if rejects:
            require_distinct(rejects, input)
            require_distinct(rejects, output)
            check_writable(rejects, "--rejects")
    settings = _settings(o)
    if o.check:  # what a run would load, loaded and checked the same way; a report: stdout
        click.echo(f"kp-tokenize: {o.tokenizer_spec}: {Engine(settings).describe()}")
        return ExitCode.OK
    workers = o.workers or os.cpu_count() or 1
    if workers > 1:
        # One process per core does the work; the tokenizers library's own threads would only
        # compete (and it refuses them after a fork anyway).
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    summary = Summary()
    with OutputLock(output, "kp-tokenize", note=lambda text: say(f"kp-tokenize: {text}", quiet)):
        engine = Engine(settings)  # loads and checks everything before any output is touched
        say(f"kp-tokenize: {engine.describe()}, {counted(workers, 'worker')}", quiet)
        done = scan_done(output, quiet=quiet) if output != "-" else set()
        _run(engine, workers, _batches(input, done, summary, o.partition, o.ignore_extra_fields),
             summary, output, rejects, o.strict, quiet, input)
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


main = run_command(cli)
