"""Reading a finished shard set back: `verify` (trust nothing) and `stats` (lengths).

verify checks the set against its manifest and every row against the format:
- the manifest is readable and names only plain files in its directory;
- each shard exists, has the manifest's size and SHA-256, and decompresses (a Parquet
  shard: reads as Parquet, with the columns `id`, `input_ids`, `loss_mask`);
- each row is one JSON object per line, checked by its format (formats.py): `eagle` rows
  have `id` (string), `input_ids` and `loss_mask` of equal length, the mask only 0s and
  1s with at least one 1; `raw` rows have `input_ids` and a non-empty `output_ids`;
  `parquet` rows are checked as `eagle` rows are (parquet.py), by row number;
- each shard's counts of records, input (mask 0) and output (mask 1) tokens match the
  manifest, and so do the totals; no ID appears twice in the set;
- no `*.jsonl.zst` or `*.parquet` lies in the directory that the manifest does not list
  (a trainer that globs the directory would read it);
- a dataset card (README.md) that kp-shard wrote lists, per split, exactly the manifest's
  files (`datasets.load_dataset` reads the card's lists: a stale card reads other files).
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec
import zstandard

from ..errors import InputError
from ..io import zstd_reader
from . import card as cards
from .formats import (
    DEFAULT,
    FORMATS,
    PARQUET,
    RowFormat,
    Unreadable,
    row_format,
    unknown_format,
)
from .manifest import ShardManifest
from .rows import id_fingerprint
from .writer import CARD, LEGACY_MANIFEST, MANIFEST, SHARD_SUFFIXES, manifest_path

MAX_ROW_PROBLEMS = 10


_manifest_decoder = msgspec.json.Decoder(ShardManifest)
NO_MANIFEST = f"no {MANIFEST}: not a kp-shard directory, or its run did not finish"


def has_manifest(directory: str) -> bool:
    """Whether DIRECTORY holds a shard set's manifest (ours, or an older set's)."""
    return any(os.path.isfile(os.path.join(directory, name))
               for name in (MANIFEST, LEGACY_MANIFEST))


def read_manifest(directory: str) -> ShardManifest:
    """DIRECTORY's manifest, decoded (`shard/manifest.py` ShardManifest)."""
    path = manifest_path(directory)
    try:
        with open(path, "rb") as f:
            return _manifest_decoder.decode(f.read())
    except FileNotFoundError:
        raise InputError(NO_MANIFEST, directory) from None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        raise InputError(f"unreadable manifest: {e}", path) from None


def load_manifest(directory: str) -> dict:
    """DIRECTORY's manifest as plain JSON, for `verify` alone: it checks a manifest that
    may have been damaged or edited, so it reads one field at a time and reports each
    that is wrong (a decode would stop at the first)."""
    path = manifest_path(directory)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise InputError(NO_MANIFEST, directory) from None
    except (OSError, ValueError) as e:
        raise InputError(f"unreadable manifest: {e}", path) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
        raise InputError("manifest has no `shards` list", path)
    return manifest


def shard_sets(directory: str) -> list[str]:
    """DIRECTORY if it holds a set; else its subdirectories that do (a parent of several
    sets, e.g. shards/ with shards/B3, shards/B4); else DIRECTORY (whose check then says
    what is missing)."""
    if has_manifest(directory) or not os.path.isdir(directory):
        return [directory]
    subsets = sorted(os.path.join(directory, name) for name in os.listdir(directory)
                     if has_manifest(os.path.join(directory, name)))
    return subsets or [directory]


def iter_shard_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a shard; zstd errors propagate as zstandard.ZstdError."""
    with open(path, "rb") as raw, zstd_reader(raw) as f:
        yield from enumerate(f, 1)


def checked_rows(fmt: RowFormat, path: str) -> Iterator[tuple[str, tuple[str, int, int] | str]]:
    """(where in the shard, as `:LINE` or ` row N`; (id, input tokens, output tokens) or
    what is wrong with the row) of every row of the shard at PATH; Unreadable if the file
    cannot be read."""
    if fmt.container == PARQUET:
        from . import parquet

        for n, result in parquet.checked_rows(path):
            yield f" row {n}", result
        return
    decoder = msgspec.json.Decoder(fmt.row)
    try:
        for lineno, line in iter_shard_lines(path):
            yield f":{lineno}", _check_row(fmt, line, decoder)
    except zstandard.ZstdError as e:
        raise Unreadable(f"cannot decompress: {e}") from None


def row_lengths(fmt: RowFormat, path: str) -> Iterator[tuple[int, int]]:
    """(input tokens, output tokens) of every row of a shard (InputError naming a bad one)."""
    if fmt.container == PARQUET:
        from . import parquet

        try:
            yield from parquet.row_lengths(path)
        except FileNotFoundError:
            raise InputError("missing shard (run verify)", path) from None
        except Unreadable as e:
            raise InputError(f"{e} (run verify)", path) from None
        return
    decoder = msgspec.json.Decoder(fmt.lengths)
    try:
        for lineno, line in iter_shard_lines(path):
            try:
                row = decoder.decode(line)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                raise InputError(str(e), path, lineno) from None
            yield fmt.count(row)
    except FileNotFoundError:
        raise InputError("missing shard (run verify)", path) from None
    except zstandard.ZstdError as e:
        raise InputError(f"cannot decompress: {e} (run verify)", path) from None



@dataclass
class VerifyReport:
    problems: list[str] = field(default_factory=list)
    shards: int = 0
    records: int = 0
    tokens: int = 0

    def problem(self, text: str) -> None:
        self.problems.append(text)


def _check_row(fmt: RowFormat, line: bytes, decoder) -> tuple[str, int, int] | str:
    """(id, input tokens, output tokens) of a good row, or what is wrong with it."""
    if not line.endswith(b"\n"):
        return "last line has no newline (cut short?)"
    try:
        row = decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        return str(e).replace(" - at `", " at `")
    return fmt.check(row)


def verify(directory: str) -> VerifyReport:
    report = VerifyReport()
    manifest = load_manifest(directory)
    mname = os.path.basename(manifest_path(directory))  # (an older set's: manifest.json)
    fmt = FORMATS.get(manifest.get("format", DEFAULT))  # (.get: a damaged one may hold a list)
    if fmt is None:
        report.problem(f"{mname}: {unknown_format(manifest.get('format'))}")
        return report
    if fmt.container == PARQUET:
        from .parquet import require

        require(f"verifying {directory} (a Parquet set)")
    seen_ids: dict[int, str] = {}
    listed: set[str] = set()
    sums = {"records": 0, "input_tokens": 0, "output_tokens": 0, "bytes": 0}
    for entry in manifest["shards"]:
        name = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(name, str) or os.path.basename(name) != name or not name:
            report.problem(f"{mname}: bad shard entry {entry!r}")
            continue
        listed.add(name)
        report.shards += 1
        for key in sums:
            sums[key] += entry.get(key, 0) if isinstance(entry.get(key), int) else 0
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            report.problem(f"{name}: missing (listed in the manifest)")
            continue
        size = os.path.getsize(path)
        if size != entry.get("bytes"):
            report.problem(f"{name}: {size} bytes, the manifest says {entry.get('bytes')}")
        sha = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                sha.update(chunk)
        if sha.hexdigest() != entry.get("sha256"):
            report.problem(f"{name}: sha256 {sha.hexdigest()} does not match the manifest's "
                           f"{entry.get('sha256')} (corrupted or replaced)")
        records = in_tokens = out_tokens = 0
        row_problems = 0
        try:
            for where, result in checked_rows(fmt, path):
                if isinstance(result, str):
                    row_problems += 1
                    if row_problems <= MAX_ROW_PROBLEMS:
                        report.problem(f"{name}{where}: {result}")
                    continue
                rid, n_in, n_out = result
                records += 1
                in_tokens += n_in
                out_tokens += n_out
                fp = id_fingerprint(rid)
                first = seen_ids.get(fp)
                if first is not None:
                    report.problem(f"{name}{where}: id {rid!r} repeats (first in {first})")
                else:
                    seen_ids[fp] = f"{name}{where}"
        except Unreadable as e:
            report.problem(f"{name}: {e}")
            continue
        if row_problems > MAX_ROW_PROBLEMS:
            report.problem(f"{name}: ... and {row_problems - MAX_ROW_PROBLEMS} more bad rows")
        report.records += records
        report.tokens += in_tokens + out_tokens
        for key, found in (("records", records), ("input_tokens", in_tokens),
                           ("output_tokens", out_tokens)):
            if row_problems == 0 and entry.get(key) != found:
                report.problem(f"{name}: holds {found} {key.replace('_', ' ')}, "
                               f"the manifest says {entry.get(key)}")
    totals = manifest.get("totals")
    if isinstance(totals, dict):
        for key, value in sums.items():
            if totals.get(key) != value:
                report.problem(f"{mname}: totals.{key} is {totals.get(key)}, "
                               f"the shards add up to {value}")
    else:
        report.problem(f"{mname}: no totals")
    for name in sorted(os.listdir(directory)):
        if name.endswith(SHARD_SUFFIXES) and name not in listed:
            suffix = next(x for x in SHARD_SUFFIXES if name.endswith(x))
            report.problem(f"{name}: not in the manifest (a trainer globbing *{suffix} "
                           "would read it)")
    _check_card(directory, manifest, report)
    return report


def _check_card(directory: str, manifest: dict, report: VerifyReport) -> None:
    """A kp-shard card must list the manifest's files, split by split (no card: nothing
    to check; a README.md of someone else's: not ours to judge)."""
    ours, meta = cards.existing_card(directory)
    if not ours or not os.path.exists(os.path.join(directory, CARD)):
        return
    listed: dict[str, list[str]] = {}
    for entry in manifest["shards"]:
        if isinstance(entry, dict) and isinstance(entry.get("file"), str):
            listed.setdefault(str(entry.get("split")), []).append(entry["file"])
    found: dict[str, list[str]] = {}
    try:
        for config in meta.get("configs") or []:
            for item in config.get("data_files") or []:
                paths = item["path"]
                found[str(item["split"])] = [paths] if isinstance(paths, str) else list(paths)
    except (AttributeError, KeyError, TypeError):
        found = {"?": []}
    if found != listed:
        report.problem(f"{CARD}: its data_files do not list the manifest's files, split by "
                       "split (datasets.load_dataset reads the card's; rewrite it: "
                       "kp-shard card DIR)")


@dataclass
class Lengths:
    """Token counts per row, for the histogram (4 bytes per row per column)."""

    prompt: array = field(default_factory=lambda: array("I"))
    output: array = field(default_factory=lambda: array("I"))

    def add(self, n_in: int, n_out: int) -> None:
        self.prompt.append(n_in)
        self.output.append(n_out)


def read_lengths(directory: str) -> tuple[ShardManifest, Lengths]:
    """The manifest and the prompt/output lengths of every row of the set in DIRECTORY."""
    manifest = read_manifest(directory)
    fmt = row_format(manifest.format, manifest_path(directory))
    if fmt.container == PARQUET:
        from .parquet import require

        require(f"reading {directory} (a Parquet set)")
    lengths = Lengths()
    for entry in manifest.shards:
        for n_in, n_out in row_lengths(fmt, os.path.join(directory, entry.file)):
            lengths.add(n_in, n_out)
    return manifest, lengths


EDGES = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]


def _percentile(sorted_values: list[int], q: float) -> int:
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _human(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def render_histogram(lengths: Lengths, title: str) -> str:
    """A table of prompt, output and total lengths: percentiles, then rows per length bin
    with the share of rows a trainer's `max_length` of that size keeps whole."""
    prompt = sorted(lengths.prompt)
    output = sorted(lengths.output)
    total = sorted(a + b for a, b in zip(lengths.prompt, lengths.output, strict=True))
    n = len(total)
    lines = [title, f"{'tokens per row':<16}{'prompt':>10}{'output':>10}{'total':>10}"]
    if n == 0:
        lines.append("  (no rows)")
        return "\n".join(lines)
    for label, q in (("min", 0.0), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        lines.append(f"  {label:<14}" + "".join(
            f"{_percentile(col, q):>10}" for col in (prompt, output, total)))
    lines.append(f"  {'max':<14}{prompt[-1]:>10}{output[-1]:>10}{total[-1]:>10}")
    lines.append(f"  {'mean':<14}" + "".join(
        f"{sum(col) / n:>10.0f}" for col in (prompt, output, total)))
    lines.append("")
    lines.append(f"{'length up to':<16}{'prompt':>10}{'output':>10}{'total':>10}"
                 f"{'kept whole':>12}  rows by total length")
    edges = [e for e in EDGES if e < total[-1]]
    edges.append(next((e for e in EDGES if e >= total[-1]), total[-1]))
    columns = (prompt, output, total)
    widest = 1
    rows = []
    below = [0, 0, 0]
    for edge in edges:
        upto = [bisect_right(col, edge) for col in columns]
        counts = [u - b for u, b in zip(upto, below, strict=True)]
        below = upto
        widest = max(widest, counts[2])
        rows.append((edge, counts, upto[2]))
    for edge, (cp, co, ct), kept in rows:
        bar = "#" * round(40 * ct / widest)
        lines.append(f"  {_human(edge):<14}{cp:>10}{co:>10}{ct:>10}"
                     f"{100 * kept / n:>11.1f}%  {bar}")
    return "\n".join(lines)
