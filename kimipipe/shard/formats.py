"""kp-shard's row formats, registered in one table: `FORMATS`, name -> RowFormat.

A format says how a row is built from a token record (`build`, on the hot path: bytes in,
bytes out), what `verify` decodes a row as and checks in it (`row`, `check`), and what
`stats` decodes for the lengths alone (`lengths`, `count`: the ID lists as Raw, never as
ints); what files hold the rows (`container`: zstd JSON lines, or Parquet through
shard/parquet.py, with its `suffix`), and the features a Hugging Face `datasets` loader
gets (`features`, the dataset card's). `--format`'s choices, the manifest's `format` and
`row_schema`, verify, stats and the card all read this table, so a new format is one entry
here. A manifest naming a format that is not here is an error that names the manifest and
the formats known (`row_format`), never read as another format.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec
from msgspec import Raw, Struct

from ..errors import InputError
from ..records import decode_passthrough


class Unreadable(Exception):
    """A shard that cannot be read at all (not zstd, not Parquet, wrong columns): why, as
    verify and stats say it."""



_encode = msgspec.json.Encoder().encode

JSONL, PARQUET = "jsonl", "parquet"
SUFFIXES = {JSONL: ".jsonl.zst", PARQUET: ".parquet"}
# Token IDs fit int32 (Kimi's vocabulary is 163,840), a mask value int8: half and an eighth
# of the int64 a JSON loader would infer, in memory and in a trainer's Arrow cache. The
# card declares these for both containers, so `datasets` gives the same features for each.
EAGLE_FEATURES = [{"name": "id", "dtype": "string"},
                  {"name": "input_ids", "list": "int32"},
                  {"name": "loss_mask", "list": "int8"}]


@dataclass(frozen=True)
class RowFormat:
    """One row format (see the module docstring for what each part is for)."""

    name: str
    help: str  # --format's help, after "NAME: "
    row_schema: dict[str, str] | str  # the manifest's `row_schema`
    # build(id, prompt, n_in, output, n_out, line, cut) -> the row's line, newline included:
    # prompt and output are the compact bodies of the ID lists (output already cut when
    # `cut`), line the token record as read.
    build: Callable[[str, bytes, int, bytes, int, bytes, bool], bytes]
    row: type[Struct]  # what verify decodes a row as
    # check(row) -> (id, input tokens, output tokens), or what is wrong with the row
    check: Callable[[Struct], tuple[str, int, int] | str]
    lengths: type[Struct]  # what stats decodes a row as
    count: Callable[[Struct], tuple[int, int]]  # (input tokens, output tokens) of a lengths row
    container: str = JSONL  # JSONL or PARQUET: the files' kind
    # The card's `dataset_info.features` (the Hub's list form), which `datasets` casts the
    # rows to; None: the rows' fields vary (raw), left for the loader to infer.
    features: list[dict] | None = None

    @property
    def suffix(self) -> str:
        return SUFFIXES[self.container]


def _count_ids(raw: Raw) -> int:
    text = bytes(raw)
    return text.count(b",") + 1 if text.strip(b" []\t\r\n") else 0


# eagle: what speculators and SpecForge read.

def eagle_row(record_id: str, prompt: bytes, n_in: int, output: bytes, n_out: int,
              line: bytes, cut: bool) -> bytes:
    """`{"id","input_ids": prompt+output,"loss_mask": [0]*n_in+[1]*n_out}` as one line
    (from the lists alone: LINE and CUT unused)."""
    return b"".join((
        b'{"id":', _encode(record_id),
        b',"input_ids":[', prompt, b"," if n_in else b"", output,
        b'],"loss_mask":[', b"0," * n_in, b"1," * (n_out - 1), b'1]}\n',
    ))


class EagleRow(Struct):
    id: str
    input_ids: list[int]
    loss_mask: list[int]


class EagleLengths(Struct):
    input_ids: Raw
    loss_mask: Raw


def _check_eagle(row: EagleRow) -> tuple[str, int, int] | str:
    if len(row.input_ids) != len(row.loss_mask):
        return f"input_ids has {len(row.input_ids)} tokens but loss_mask {len(row.loss_mask)}"
    ones = row.loss_mask.count(1)
    zeros = row.loss_mask.count(0)
    if ones + zeros != len(row.loss_mask):
        return "loss_mask holds values other than 0 and 1"
    if ones == 0:
        return "loss_mask has no 1: the row teaches nothing (trainers drop it)"
    return row.id, zeros, ones


def _count_eagle(row: EagleLengths) -> tuple[int, int]:
    ones = bytes(row.loss_mask).count(b"1")
    return _count_ids(row.input_ids) - ones, ones


EAGLE = RowFormat(
    name="eagle",
    help="{id, input_ids, loss_mask} rows for speculators/SpecForge",
    row_schema={"id": "str", "input_ids": "prompt + output token IDs",
                "loss_mask": "0 per prompt token, 1 per output token"},
    build=eagle_row,
    row=EagleRow, check=_check_eagle, lengths=EagleLengths, count=_count_eagle,
    features=EAGLE_FEATURES,
)


# parquet: eagle's rows, in Parquet files (shard/parquet.py writes and reads them).

def ids_body(record_id: str, prompt: bytes, n_in: int, output: bytes, n_out: int,
             line: bytes, cut: bool) -> bytes:
    """The row's `input_ids` as the compact body of the list (prompt, then output): what
    the Parquet writer parses, a row group at a time; the mask follows from the counts."""
    return b"".join((prompt, b"," if n_in else b"", output))


PARQUET_FORMAT = RowFormat(
    name="parquet",
    help="eagle's rows in Parquet files, row groups of at most 1,000 rows or 3M tokens "
         "(needs pyarrow: pip install 'kimipipe[parquet]')",
    row_schema=EAGLE.row_schema,
    build=ids_body,
    row=EagleRow, check=_check_eagle, lengths=EagleLengths, count=_count_eagle,
    container=PARQUET, features=EAGLE_FEATURES,
)


# raw: the token records as they came.

def raw_row(record_id: str, prompt: bytes, n_in: int, output: bytes, n_out: int,
            line: bytes, cut: bool) -> bytes:
    """The token record as it came (LINE), made compact; with its output cut when CUT."""
    if cut:
        fields = decode_passthrough(line)
        fields["output_ids"] = Raw(b"[" + output + b"]")  # in place: the key order kept
        line = _encode(fields)
    return msgspec.json.format(line, indent=-1) + b"\n"


class RawRow(Struct):
    id: str
    input_ids: list[int]
    output_ids: list[int]


class RawLengths(Struct):
    input_ids: Raw
    output_ids: Raw


def _check_raw(row: RawRow) -> tuple[str, int, int] | str:
    if not row.output_ids:
        return "output_ids is empty"
    return row.id, len(row.input_ids), len(row.output_ids)


RAW = RowFormat(
    name="raw",
    help="the token records as they came",
    row_schema="token records as read (records.Tokens)",
    build=raw_row,
    row=RawRow, check=_check_raw, lengths=RawLengths,
    count=lambda row: (_count_ids(row.input_ids), _count_ids(row.output_ids)),
)


FORMATS: dict[str, RowFormat] = {f.name: f for f in (EAGLE, RAW, PARQUET_FORMAT)}
DEFAULT = EAGLE.name


def unknown_format(name: object) -> str:
    """What is wrong with a manifest whose format is NAME (not in FORMATS)."""
    return f"unknown row format {name!r} (kp-shard knows {', '.join(FORMATS)})"


def row_format(name: object, path: str) -> RowFormat:
    """The format called NAME, read from the manifest at PATH; InputError if none is."""
    fmt = FORMATS.get(name) if isinstance(name, str) else None
    if fmt is None:
        raise InputError(unknown_format(name), path)
    return fmt
