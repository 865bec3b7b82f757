"""The build: token records from many inputs -> a new shard set in DIR, swapped in whole,
with its manifest and its dataset card (card.py)."""

from __future__ import annotations

import datetime
import itertools
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .. import __version__
from ..errors import InputError, display_path
from ..io import iter_records
from . import card as cards
from .formats import DEFAULT, FORMATS
from .manifest import ManifestOptions, ShardManifest, ShardTotals
from .provenance import Provenance
from .readback import Lengths
from .rows import TOKEN_RECORD_DECODER, Drops, Row, RowBuilder, eval_point, id_fingerprint
from .shuffle import ExternalShuffle
from .writer import CARD, DirectoryLock, ShardInfo, ShardSet

MANIFEST_VERSION = 1


@dataclass
class ShardOptions:
    fmt: str = DEFAULT  # a name in formats.FORMATS
    prefix: str = "shard"
    records_per_shard: int | None = None
    tokens_per_shard: int | None = None
    compression_level: int = 3
    shuffle: bool = False
    seed: int = 0
    shuffle_memory: int = 1 << 30
    tmp_dir: str | None = None
    eval_fraction: float = 0.0
    min_output_tokens: int = 1
    max_length: int | None = None
    truncate: bool = False
    on_duplicate: str = "drop"


@dataclass
class BuildResult:
    manifest: ShardManifest
    shards: list[ShardInfo]
    drops: Drops
    read: int
    lengths: Lengths = field(default_factory=Lengths)
    card_written: bool = True  # False: DIR/README.md is not a kp-shard card, left as it was


def _duplicate(rid: str, path: str, line: int) -> InputError:
    return InputError(f"duplicate id {rid!r} (an earlier input row has it; "
                      "--on-duplicate drop keeps the first)", path, line)


def build_shards(inputs: list[str], out_dir: str, opts: ShardOptions, command: str,
                 on_record: Callable[[], None] = lambda: None,
                 collect_lengths: bool = False,
                 card: cards.CardInputs | None = None) -> BuildResult:
    """Read every input, write the new set under temporary names, then swap it in, with
    its card (README.md, from the manifest and CARD) unless one not kp-shard's is there.

    A bad input line raises InputError before anything is swapped: the old set stays.
    """
    provenance = Provenance()
    builder = RowBuilder(FORMATS[opts.fmt], opts.min_output_tokens, opts.max_length, opts.truncate,
                         provenance=provenance)
    drops = builder.drops
    card = card or cards.CardInputs()
    cards.read_inputs(card)  # a bad summary or plan stops the run before it reads an input
    lengths = Lengths()
    read = 0

    def rows() -> Iterator[tuple[int, int, str, Row]]:
        nonlocal read
        for source, path in enumerate(inputs):
            for lineno, rec, line in iter_records(path, TOKEN_RECORD_DECODER, keep_newline=True,
                                                  expect="tokens"):
                read += 1
                on_record()
                row = builder.build(rec, line)
                if row is not None:
                    split = "eval" if eval_point(row.split_key or row.id) < opts.eval_fraction else "train"
                    yield source, lineno, split, row

    # The first row is read before the output directory is touched: an empty input or a
    # bad first line leaves it as it was (not even created).
    all_rows = rows()
    first = next(all_rows, None)
    if first is not None:
        all_rows = itertools.chain([first], all_rows)
    with DirectoryLock(out_dir):
        shards = ShardSet(out_dir, opts.prefix, level=opts.compression_level,
                          records_per_shard=opts.records_per_shard,
                          tokens_per_shard=opts.tokens_per_shard,
                          container=FORMATS[opts.fmt].container)
        spill = None
        try:
            if opts.shuffle:
                spill_dir = os.path.join(opts.tmp_dir or out_dir, f".kp-shard-spill-{os.getpid()}")
                spill = ExternalShuffle(spill_dir, opts.seed, opts.shuffle_memory)
                for source, lineno, split, row in all_rows:
                    spill.add(split, row, source, lineno)
                # Repeats of an id share its key, so they arrive in one run of equal keys,
                # in input order; a run almost always holds a single id.
                run_key, run_ids = None, set()
                for item in spill.drain():
                    if item.key != run_key:
                        run_key, run_ids = item.key, set()
                    elif item.row.id in run_ids:
                        if opts.on_duplicate == "error":
                            raise _duplicate(item.row.id, display_path(inputs[item.source]), item.line)
                        drops.duplicate_id += 1
                        continue
                    run_ids.add(item.row.id)
                    shards.add(item.split, item.row)
                    _count(provenance, item.row)
                    if collect_lengths:
                        lengths.add(item.row.input_tokens, item.row.output_tokens)
            else:
                seen: set[int] = set()
                for source, lineno, split, row in all_rows:
                    fp = id_fingerprint(row.id)
                    if fp in seen:
                        if opts.on_duplicate == "error":
                            raise _duplicate(row.id, display_path(inputs[source]), lineno)
                        drops.duplicate_id += 1
                        continue
                    seen.add(fp)
                    shards.add(split, row)
                    _count(provenance, row)
                    if collect_lengths:
                        lengths.add(row.input_tokens, row.output_tokens)
            finished = shards.close()
            manifest = make_manifest(finished, opts, inputs, command, drops, builder.truncated, read,
                                     provenance)
            ours, old = cards.existing_card(out_dir)
            text = cards.render(manifest, card, old.get("license")) if ours else None
            shards.commit(manifest, text)
        except BaseException:
            shards.discard()
            if spill is not None:
                shutil.rmtree(spill.directory, ignore_errors=True)
            raise
    return BuildResult(manifest, finished, drops, read, lengths, card_written=ours)


def _count(provenance: Provenance, row: Row) -> None:
    provenance.count(row.profile, row.input_tokens, row.output_tokens, row.prompt_delta,
                     row.completion_delta)


def write_card(directory: str, manifest: ShardManifest, inputs: cards.CardInputs) -> str:
    """(Re)write DIRECTORY's card from its manifest and INPUTS (`kp-shard card`); its path.
    InputError if a README.md there is not a kp-shard card."""
    from .writer import fsync_dir, temp_name, write_synced

    cards.read_inputs(inputs)  # (a bad one is named before the lock is taken)
    with DirectoryLock(directory):
        ours, old = cards.existing_card(directory)
        path = os.path.join(directory, CARD)
        if not ours:
            raise InputError(f"not a kp-shard card (no `{cards.MARKER}` line): left as it is; "
                             "move it away to have kp-shard write one", path)
        tmp = os.path.join(directory, temp_name(CARD))
        write_synced(tmp, cards.render(manifest, inputs, old.get("license")))
        os.replace(tmp, path)
        fsync_dir(directory)
    return path

def _sum(shards: list[ShardInfo], split: str | None = None) -> ShardTotals:
    chosen = [s for s in shards if split is None or s.split == split]
    return ShardTotals(
        shards=len(chosen),
        records=sum(s.records for s in chosen),
        input_tokens=sum(s.input_tokens for s in chosen),
        output_tokens=sum(s.output_tokens for s in chosen),
        bytes=sum(s.bytes for s in chosen),
        uncompressed_bytes=sum(s.uncompressed_bytes for s in chosen),
    )


def make_manifest(shards: list[ShardInfo], opts: ShardOptions, inputs: list[str], command: str,
                  drops: Drops, truncated: int, read: int,
                  provenance: Provenance | None = None) -> ShardManifest:
    return ShardManifest(
        manifest_version=MANIFEST_VERSION,
        kimipipe_version=__version__,
        created=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        command=command,
        format=opts.fmt,
        row_schema=FORMATS[opts.fmt].row_schema,
        options=ManifestOptions(
            name=opts.prefix,
            records_per_shard=opts.records_per_shard,
            tokens_per_shard=opts.tokens_per_shard,
            compression_level=opts.compression_level,
            shuffle=opts.shuffle,
            seed=opts.seed if opts.shuffle else None,
            eval_fraction=opts.eval_fraction,
            eval_split=("blake2b(conversation or id, digest_size=8, person='kp-shard-eval') "
                        "/ 2**64 < eval_fraction"),
            min_output_tokens=opts.min_output_tokens,
            max_length=opts.max_length,
            truncate=opts.truncate,
            on_duplicate=opts.on_duplicate,
        ),
        inputs=[display_path(p) for p in inputs],
        records_read=read,
        dropped=drops.as_dict(),
        truncated=truncated,
        splits={split: _sum(shards, split) for split in ("train", "eval")
                if any(s.split == split for s in shards)},
        totals=_sum(shards),
        shards=list(shards),
        provenance=provenance.summary() if provenance is not None else None,
    )
