"""kp-shard: token records in, training-ready shards (zstd JSONL or Parquet), a manifest
and a dataset card out.

Usage:
    kp-tokenize B3.responses.jsonl --tokenizer ./kimi-k2.5 | kp-shard --out shards/B3
    kp-shard B3.tokens.jsonl B4.tokens.jsonl.zst --out shards/all --shuffle --seed 1 \\
        --eval-fraction 0.01 --max-length 32768 --truncate --tokens-per-shard 50M
    kp-shard verify shards/B3 shards/B4 # or: kp-shard --verify DIR; a parent of sets: verify shards
    kp-shard stats shards/all           # length histogram on stdout (or --stats on a build)
    kp-shard card shards/B3 --summary work/B3.infer-summary.json --plan work/B3.plan.json
    kp-shard export shards/B3 --for specforge --out train/B3 --target ./Kimi-K2.5

Schema (one compact JSON object per line, in DIR/<name>-train-00000.jsonl.zst ...):
    --format eagle (default), what speculators and SpecForge (`data.prompts_path`) read:
        {"id": str, "input_ids": [int, ...], "loss_mask": [0|1, ...]}
        input_ids = the record's input_ids (prompt) + output_ids (generation);
        loss_mask = 0 per prompt token, 1 per output token (same length, at least one 1).
    --format raw: the token records as they came (records.Tokens with its pass-through
        fields), compacted; with --truncate, output_ids cut.
    --format parquet: eagle's rows in DIR/<name>-train-00000.parquet ... (pyarrow, the
        `parquet` extra; shard/parquet.py).
    DIR/kp-shard.manifest (JSON; older sets: manifest.json): per shard its file, split, records, input_tokens (mask 0),
        output_tokens (mask 1), bytes, uncompressed_bytes, sha256; per-split and overall
        totals; the command line, the format, the options, the drop counts, and
        `provenance`: what the token records say of the rows kept (shard/provenance.py).
    DIR/README.md: the dataset card (shard/card.py), which `datasets.load_dataset(DIR)`
        reads: the splits' files, the features, and where the rows came from.

Rows kept: records with no output_ids, shorter than --min-output-tokens, or (with
--max-length, unless --truncate) longer than --max-length tokens are dropped and counted;
a repeated id keeps its first row (--on-duplicate error stops instead). --eval-fraction F
puts a row in the eval split (<name>-eval-00000.jsonl.zst ...) when a hash of its id alone
(a conversation's turn: of its `conversation`, so a conversation is never split) falls
below F: stable across reruns, inputs and datasets. --shuffle orders rows by a seeded
hash of their id, computed by an external bucket sort whose memory stays near
--shuffle-memory whatever the input size (kimipipe/shard/shuffle.py).

Streaming: rows are written as they are read; every file is written under a hidden
temporary name and the whole set is swapped in when complete, so an interrupted run
leaves the previous set (or no manifest) and never a file that looks finished. Rerunning
replaces the set; shards of the old set are removed only after the new manifest is in place.

export writes a set as the files one trainer reads (shard/export.py): train.jsonl (and
eval.jsonl), plus a config that trainer's own validator accepts (SpecForge's
specforge.yaml and vocab_mapping.py, speculators' speculators.yaml), checking each shard
against the manifest as it copies it.

verify, stats, card and export take any number of directories, each a set or a parent of sets
(every subdirectory holding a manifest). Their report goes to stdout: verify prints each
problem as DIR/FILE[:LINE]: what is wrong, and DIR: OK (...) for a good set (not with -q);
exit 2 if any set has a problem. Everything else (progress, the build's summary) is on
stderr.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import sys

import click

from ..cli import KPCommand, KPGroup, kp_command, run_command
from ..errors import ExitCode, InputError, KPError
from ..io import check_writable_dir
from ..options import (
    COUNT,
    DEBUG,
    INPUTS,
    QUIET,
    SIZE,
    CommandSettings,
    argument,
    fields_for,
    option,
)
from ..shard import (
    ShardOptions,
    build_shards,
    read_lengths,
    render_histogram,
    shard_sets,
    verify,
)
from ..shard.build import write_card
from ..shard.card import CardInputs
from ..shard.export import DEFAULT_DRAFT_VOCAB, DEFAULT_TARGET, TRAINERS, ExportOptions, export_sets
from ..shard.formats import DEFAULT, FORMATS, PARQUET
from ..shard.manifest import ShardManifest
from ..shard.readback import read_manifest
from ..terminal import counted, progress, say

DEFAULT_RECORDS_PER_SHARD = 10_000


EXAMPLES = """
    kp-shard B3.tokens.jsonl.zst --out shards/B3 --max-length 32768 --truncate
    kp-tokenize r.jsonl --tokenizer ./kimi-k2.5 --trust-remote-code | kp-shard --out shards/B3
    kp-shard b3.jsonl b4.jsonl --out shards/all --shuffle --seed 1 --eval-fraction 0.01
    kp-shard verify shards/B3 shards/B4
    kp-shard stats shards/B3 | less
    kp-shard B3.tokens.jsonl.zst --out shards/B3 --format parquet --eval-fraction 0.01
    kp-shard card shards/B3 --summary work/B3.infer-summary.json --plan work/B3.plan.json
"""

# The card's inputs: options of a build (its card) and of `kp-shard card DIR`.
SUMMARIES = functools.partial(
    option, "--summary", type=click.Path(dir_okay=False), multiple=True, fills=CardInputs,
    help="kp-infer's --summary-json FILE of the answers' run, for the card (repeatable).")
PLANS = functools.partial(
    option, "--plan", type=click.Path(dir_okay=False), multiple=True, fills=CardInputs,
    help="kp-infer's --plan --json FILE, for the card: the model asked for and each "
         "provider's quantization (repeatable).")
SOURCES = functools.partial(
    option, "--source", multiple=True, fills=CardInputs,
    help="The prompts' source file, as the card names it (repeatable).")
COMMANDS = functools.partial(
    option, "--command", multiple=True, fills=CardInputs,
    help="A command that made the token records, shown in the card (repeatable).")
# A set or a parent of sets, for verify, stats and card
DIRS = functools.partial(argument, nargs=-1, required=True, metavar="DIR...",
                         type=click.Path(file_okay=False))
CARD = "Dataset card"


class ShardSettings(CommandSettings):
    """kp-shard's command line (the build, and the words as options: --verify, ...)."""

    inputs: list[str] = INPUTS()
    out_dir: str | None = option(
        "-o", "--out", type=click.Path(), section="Options",
        help="Directory for the shards, kp-shard.manifest and the card (created if missing).")
    fmt: str = option(
        "--format", type=click.Choice(list(FORMATS)), default=DEFAULT, show_default=True,
        section="Options", fills=ShardOptions,
        help="; ".join(f"{f.name}: {f.help}" for f in FORMATS.values()) + ".")
    records_per_shard: int | None = option(
        "--records-per-shard", type=COUNT, default=None, section="Options",
        help=f"Rows per shard (default {DEFAULT_RECORDS_PER_SHARD:,} unless "
             "--tokens-per-shard is given; both may be set: the first limit reached).")
    tokens_per_shard: int | None = option(
        "--tokens-per-shard", type=COUNT, default=None, section="Options", fills=ShardOptions,
        help="At most N tokens (prompt + output) per shard, e.g. 50M; a single longer "
             "row gets a shard of its own.")
    compression_level: int = option(
        "--compression-level", type=click.IntRange(1, 22), default=3, show_default=True,
        section="Options", fills=ShardOptions, help="zstd level (multi-threaded over all cores).")
    prefix: str = option(
        "--name", default="shard", show_default=True, section="Options", fills=ShardOptions,
        help="Shard file prefix: PREFIX-00000.jsonl.zst, PREFIX-eval-00000.jsonl.zst.")
    shuffle: bool = option(
        "--shuffle", is_flag=True, section="Options", fills=ShardOptions,
        help="Order rows by a seeded hash of their id (bounded memory, deterministic).")
    seed: int = option(
        "--seed", type=int, default=0, show_default=True, section="Options", fills=ShardOptions,
        help="Seed for --shuffle.")
    shuffle_memory: int = option(
        "--shuffle-memory", type=SIZE, default="1G", show_default=True, section="Options",
        fills=ShardOptions,
        help="Memory for --shuffle's in-memory stage (bigger buckets are split again).")
    tmp_dir: str | None = option(
        "--tmp-dir", type=click.Path(), default=None, section="Options", fills=ShardOptions,
        help="Where --shuffle spills rows (default: inside --out; ~1/4 of the rows' size).")
    eval_fraction: float = option(
        "--eval-fraction", type=click.FloatRange(0, 1, max_open=True), default=0.0,
        show_default=True, section="Options", fills=ShardOptions,
        help="Share of ids (by a hash of the id, or of a turn's conversation) written to the eval split.")
    min_output_tokens: int = option(
        "--min-output-tokens", type=click.IntRange(min=1), default=1, show_default=True,
        section="Options", fills=ShardOptions,
        help="Drop rows with fewer output tokens (after --truncate).")
    max_length: int | None = option(
        "--max-length", type=click.IntRange(min=1), default=None, section="Options",
        fills=ShardOptions,
        help="Drop rows longer than N tokens (prompt + output), or cut them with --truncate.")
    truncate: bool = option(
        "--truncate", is_flag=True, section="Options", fills=ShardOptions,
        help="With --max-length: cut long rows' output instead of dropping them "
             "(rows whose prompt alone reaches N are still dropped).")
    on_duplicate: str = option(
        "--on-duplicate", type=click.Choice(["drop", "error"]), default="drop",
        show_default=True, section="Options", fills=ShardOptions,
        help="A repeated id: keep the first row, or stop (exit 2).")
    show_stats: bool = option(
        "--stats", is_flag=True, section="Options",
        help="After the build, print the length histogram to stdout.")
    verify_dirs: list[str] = option(
        "--verify", type=click.Path(file_okay=False), multiple=True, section="Options",
        help="Check the set in DIR (or each set under DIR) against its manifest and the "
             "format; repeatable; exit 0 or 2.")
    stats_dirs: list[str] = option(
        "--stats-of", type=click.Path(file_okay=False), multiple=True, section="Options",
        help="Print the length histogram of the set in DIR (or each set under DIR) to "
             "stdout and exit; repeatable.")
    card_dirs: list[str] = option(
        "--card", type=click.Path(file_okay=False), multiple=True, section="Options",
        help="(Re)write the dataset card (README.md) of the set in DIR (or each set "
             "under DIR) and exit; repeatable.")
    summaries: list[str] = SUMMARIES(section=CARD)
    plans: list[str] = PLANS(section=CARD)
    sources: list[str] = SOURCES(section=CARD)
    commands: list[str] = COMMANDS(section=CARD)
    quiet: bool = QUIET(section="Options")
    debug: bool = DEBUG(section="Options")


class _Build(KPCommand):
    """Keeps its command line, for the manifest's `command`."""

    def parse_args(self, ctx, args):
        ctx.meta["kp_shard_argv"] = list(args)
        return super().parse_args(ctx, args)


@kp_command("kp-shard", settings=ShardSettings, sections=["Options", CARD], examples=EXAMPLES,
            cls=_Build, epilog=(
    "Also: `kp-shard verify DIR...` (= --verify DIR), `kp-shard stats DIR...` "
    "(= --stats-of DIR) and `kp-shard card DIR...` (= --card DIR): each DIR a shard set or "
    "a parent of several; verify's and stats' report on stdout."))
def build(o: ShardSettings) -> int:
    """Write token records (default: stdin) as training shards in --out DIR."""
    card = CardInputs(**fields_for(o, CardInputs))
    if sum(map(bool, (o.verify_dirs, o.stats_dirs, o.card_dirs))) > 1:
        raise InputError("verify, stats and card: one at a time")
    if o.verify_dirs or o.stats_dirs or o.card_dirs:  # (further DIRs may come as inputs)
        sets = _sets([*o.verify_dirs, *o.stats_dirs, *o.card_dirs, *o.inputs])
        if o.card_dirs:
            return _card(sets, card, o.quiet)
        return _verify(sets, o.quiet) if o.verify_dirs else _stats(sets)
    out_dir = o.out_dir
    if out_dir is None:
        raise InputError("--out DIR is required (or use verify DIR / stats DIR / card DIR)")
    if FORMATS[o.fmt].container == PARQUET:
        from ..shard.parquet import require

        require("--format parquet")  # before any input is read
    check_writable_dir(out_dir, "--out")
    if o.tmp_dir is not None:
        check_writable_dir(o.tmp_dir, "--tmp-dir")
    inputs = o.inputs or ["-"]
    if inputs.count("-") > 1:
        raise InputError("stdin (`-`) can be read only once")
    if o.truncate and o.max_length is None:
        raise InputError("--truncate needs --max-length")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", o.prefix):
        raise InputError(f"--name {o.prefix!r}: use letters, digits, `.`, `_` and `-`")
    # rows per shard: DEFAULT_RECORDS_PER_SHARD unless a limit is given
    given = o.records_per_shard is not None or o.tokens_per_shard is not None
    opts = ShardOptions(**fields_for(o, ShardOptions),
                        records_per_shard=o.records_per_shard if given else DEFAULT_RECORDS_PER_SHARD)
    argv = click.get_current_context().meta.get("kp_shard_argv", sys.argv[1:])
    command = shlex.join(["kp-shard", *argv])
    if o.quiet:  # (no bar: tqdm is not even imported)
        result = build_shards(inputs, out_dir, opts, command, collect_lengths=o.show_stats,
                              card=card)
    else:
        with progress(desc="kp-shard", unit="rec", quiet=o.quiet) as bar:
            result = build_shards(inputs, out_dir, opts, command,
                                  on_record=lambda: bar.update(1), collect_lengths=o.show_stats,
                                  card=card)
    _summary(result, out_dir, o.quiet)
    if not result.card_written:
        say(f"kp-shard: warning: {os.path.join(out_dir, 'README.md')} is not a kp-shard card: "
            "left as it is, and datasets.load_dataset reads its YAML, not the manifest's "
            "files (move it away and run kp-shard card DIR)", o.quiet)
    if o.show_stats:  # a report asked for: stdout, even with --quiet
        click.echo(render_histogram(result.lengths, _stats_title(out_dir, result.manifest)))
    return ExitCode.OK


class VerifySettings(CommandSettings):
    dirs: list[str] = DIRS()
    quiet: bool = option("-q", "--quiet", is_flag=True,
                         help="Print the problems only, not the OK lines.")
    debug: bool = DEBUG(hidden=True)


@kp_command("kp-shard verify", settings=VerifySettings,
            examples="kp-shard verify shards/B3 shards/B4\nkp-shard verify shards")
def verify_word(o: VerifySettings) -> int:
    """Check shard sets, trusting nothing: each shard's size and SHA-256 against the
    manifest, every row's format (input_ids and loss_mask of equal length, ...), the counts
    of records and tokens, no id twice, no unlisted *.jsonl.zst in the directory. Each DIR
    is a set or a parent of sets (every subdirectory holding a manifest). The report
    goes to stdout: each problem as DIR/FILE[:LINE]: what is wrong, and DIR: OK (...) for a
    good set."""
    return _verify(_sets(o.dirs), o.quiet)


class StatsSettings(CommandSettings):
    dirs: list[str] = DIRS()
    quiet: bool = QUIET(hidden=True)  # (its report is on stdout: nothing to silence)
    debug: bool = DEBUG(hidden=True)


@kp_command("kp-shard stats", settings=StatsSettings,
            examples="kp-shard stats shards/B3 | less\nkp-shard stats shards")
def stats_word(o: StatsSettings) -> int:
    """Row lengths of shard sets, on stdout: prompt, output and total tokens per row
    (percentiles), then rows per length bin with the share a trainer's max_length of that
    size keeps whole. Each DIR is a set or a parent of sets."""
    return _stats(_sets(o.dirs))


class CardSettings(CommandSettings):
    dirs: list[str] = DIRS()
    summaries: list[str] = SUMMARIES()
    plans: list[str] = PLANS()
    sources: list[str] = SOURCES()
    commands: list[str] = COMMANDS()
    quiet: bool = QUIET(hidden=True)  # (its help, as it was, does not list it)
    debug: bool = DEBUG(hidden=True)


@kp_command("kp-shard card", settings=CardSettings, examples=(
    "kp-shard card shards/B3 --summary work/B3.infer-summary.json --plan work/B3.plan.json\n"
    "kp-shard card shards"))
def card_word(o: CardSettings) -> int:
    """(Re)write the dataset card, DIR/README.md, in the Hugging Face Hub's format: the YAML
    that datasets.load_dataset(DIR) reads (each split's files, the features), and where the
    rows came from (the manifest's counts; with --summary and --plan, the answers' run and
    the providers' quantizations). A build writes one too, from the manifest. A README.md
    that kp-shard did not write is left alone (exit 2). `license` is yours to set: a
    rewrite keeps it."""
    return _card(_sets(o.dirs), CardInputs(**fields_for(o, CardInputs)), o.quiet)


class ExportSettings(CommandSettings):
    dirs: list[str] = DIRS()
    trainer: str = option(
        "--for", type=click.Choice(list(TRAINERS)), required=True, fills=ExportOptions,
        help="The trainer: " + "; ".join(f"{t.name}: {t.help}" for t in TRAINERS.values()) + ".")
    out_dir: str = option(
        "-o", "--out", type=click.Path(file_okay=False), required=True, fills=ExportOptions,
        help="Directory for the trainer's files (created if missing; those files replaced).")
    target: str = option(
        "--target", default=DEFAULT_TARGET, show_default=True, metavar="MODEL",
        fills=ExportOptions,
        help="The target model the configs name: a local directory (made absolute; its "
             "config.json gives the vocabulary size) or a Hugging Face id.")
    draft_vocab_size: int = option(
        "--draft-vocab-size", type=click.IntRange(min=1), default=DEFAULT_DRAFT_VOCAB,
        show_default=True, fills=ExportOptions,
        help="The drafter's vocabulary, for the vocab mapping (d2t/t2d) the configs ask for.")
    quiet: bool = QUIET()
    debug: bool = DEBUG(hidden=True)


@kp_command("kp-shard export", settings=ExportSettings, examples=(
    "kp-shard export shards/B3 --for specforge --out train/B3 --target ./Kimi-K2.5\n"
    "kp-shard export shards --for speculators --out train/all"))
def export_word(o: ExportSettings) -> int:
    """Write shard sets as the files one trainer reads, in --out DIR: train.jsonl (and
    eval.jsonl when the sets have an eval split), one {"id", "input_ids", "loss_mask"} row
    a line, as one plain file (neither trainer reads zstd or Parquet shards); and the
    trainer's config: specforge.yaml (SpecForge 0.2.0's load_config accepts it) with
    vocab_mapping.py, which makes its vocab mapping with SpecForge's own function; or
    speculators.yaml (speculators 0.9.0 train --config). Sequence lengths are the longest
    row's. Each shard is checked against the manifest as it is copied (a mismatch: exit 2,
    --out left as it was). The next commands go to stderr and head each config."""
    check_writable_dir(o.out_dir, "--out")
    result = export_sets(_sets(o.dirs), ExportOptions(**fields_for(o, ExportOptions)))
    splits = "; ".join(f"{split} {counted(n, 'row')}, {counted(result.tokens[split], 'token')}"
                       for split, n in result.rows.items() if n)
    say(f"kp-shard: exported {splits} (longest row {result.longest:,} tokens) to "
        + ", ".join(result.files), o.quiet)
    for step in result.next_steps:
        say(f"  next: {step}", o.quiet)
    return ExitCode.OK


def _sets(given: list[str]) -> list[str]:
    """Each DIR's shard sets: itself, or every subdirectory holding a manifest."""
    return [d for directory in given for d in shard_sets(directory)]


def _summary(result, out_dir: str, quiet: bool) -> None:
    m = result.manifest
    parts = []
    for split, totals in m.splits.items():
        tokens = totals.input_tokens + totals.output_tokens
        parts.append(f"{split} {counted(totals.records, 'row')}, {counted(tokens, 'token')} "
                     f"in {counted(totals.shards, 'shard')}")
    dropped = {k: v for k, v in m.dropped.items() if v}
    text = f"kp-shard: read {counted(result.read, 'record')}; wrote " + (
        "; ".join(parts) if parts else "no rows") + f" to {out_dir} ({counted(m.totals.bytes, 'byte')})"
    if m.truncated:
        text += f"; truncated {m.truncated:,}"
    if dropped:
        text += "; dropped " + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in dropped.items())
    say(text, quiet)
    if not parts:
        say("kp-shard: warning: every record was dropped; the set is empty", quiet)


def _stats_title(directory: str, manifest: ShardManifest) -> str:
    splits = ", ".join(f"{k} {v.records:,}" for k, v in manifest.splits.items())
    return (f"kp-shard stats: {directory} ({manifest.format}, "
            f"{counted(len(manifest.shards), 'shard')}; rows: {splits or 'none'})")


def _card(sets: list[str], card: CardInputs, quiet: bool) -> int:
    """Rewrite every set's card; the summaries, plans and commands belong to one set."""
    if len(sets) > 1 and (card.summaries or card.plans or card.sources or card.commands):
        raise InputError(f"card: {len(sets)} sets, but --summary, --plan, --source and "
                         "--command describe one: give one DIR")
    for directory in sets:
        path = write_card(directory, read_manifest(directory), card)
        say(f"kp-shard: wrote {path}", quiet)
    return ExitCode.OK


def _stats(sets: list[str]) -> int:
    for k, directory in enumerate(sets):
        manifest, lengths = read_lengths(directory)
        click.echo(("\n" if k else "") + render_histogram(lengths, _stats_title(directory, manifest)))
    return ExitCode.OK


def _verify(sets: list[str], quiet: bool) -> int:
    """Check every set, the report on stdout; exit 2 when any has a problem."""
    bad: list[tuple[str, int]] = []
    for directory in sets:
        try:
            report = verify(directory)
        except InputError as e:  # no manifest, or an unreadable one: this set's only problem
            click.echo(e.message)
            bad.append((directory, 1))
            continue
        for problem in report.problems:
            click.echo(os.path.join(directory, problem))
        if report.problems:
            bad.append((directory, len(report.problems)))
        elif not quiet:
            click.echo(f"{directory}: OK ({counted(report.shards, 'shard')}, "
                       f"{counted(report.records, 'row')}, {counted(report.tokens, 'token')})")
    if len(bad) == 1 and len(sets) == 1:
        raise KPError(f"verify: {bad[0][0]}: {counted(bad[0][1], 'problem')}", ExitCode.USAGE)
    if bad:
        raise KPError(f"verify: {len(bad)} of {counted(len(sets), 'set')} with problems: "
                      + ", ".join(d for d, _ in bad), ExitCode.USAGE)
    return ExitCode.OK


cli = KPGroup(build, [verify_word, stats_word, card_word, export_word])
main = run_command(cli)
