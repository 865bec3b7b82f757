"""Parquet shards (`--format parquet`): eagle's rows as Parquet files, through pyarrow.

pyarrow is an extra (`pip install 'kimipipe[parquet]'`; some 165 MB installed, too much
to force on every install): `require` imports it, or stops with one line naming the extra
(exit 2) before any input is read or any file is written. Nothing else in kimipipe
imports it.

The file: `id` string, `input_ids` list<int32>, `loss_mask` list<int8> (formats.py's
EAGLE_FEATURES), zstd at --compression-level. A row group closes at ROW_GROUP_ROWS rows or
ROW_GROUP_TOKENS tokens: a streaming reader (`datasets` with streaming=True, a trainer's
data loader) holds one row group at a time, some 15 MB of columns, and a row group is big
enough to compress as well as the whole file does.

Rows arrive as the body of their `input_ids` list (formats.ids_body: already validated as
non-negative integers by rows.py); a row group's bodies are parsed in one numpy call and
the mask is made from the counts, so the rows are those of the JSONL layout exactly. A
full row group is parsed, encoded and compressed by a thread of its own while the next one
fills (at most one waits: memory stays near two row groups), as zstd's threads do for
the JSONL layout.

Reading back (verify, stats): row group by row group, checked with numpy: each row's
`input_ids` and `loss_mask` of equal length, the mask only 0s and 1s with at least one 1,
no null. Problems are reported by row number (from 1, over the whole file).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import msgspec

from ..errors import ExitCode, KPError
from .formats import Unreadable

ROW_GROUP_ROWS = 1_000
ROW_GROUP_TOKENS = 3_000_000  # x 5 bytes (int32 + int8): ~15 MB of columns a row group
_INT32_MAX = 2**31 - 1
_COLUMNS = ("id", "input_ids", "loss_mask")
INSTALL = "pip install 'kimipipe[parquet]' (or pip install pyarrow)"


def require(what: str):
    """(pyarrow, pyarrow.parquet, numpy), or KPError (exit 2) naming WHAT needs them."""
    try:
        import numpy
        import pyarrow
        import pyarrow.parquet
    except ImportError as e:
        raise KPError(f"{what} needs pyarrow, which is not installed ({e.name or e}): {INSTALL}",
                      ExitCode.USAGE) from None
    return pyarrow, pyarrow.parquet, numpy


def schema():
    pa, _, _ = require("--format parquet")
    return pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int32())),
                      ("loss_mask", pa.list_(pa.int8()))])


def file_sha256(path: str) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


class ParquetShard:
    """One Parquet shard being written under a temporary name (writer.py's ShardFile for
    Parquet: the same attributes and calls)."""

    def __init__(self, tmp: str, level: int):
        pa, pq, np = require("--format parquet")
        self._pa, self._np = pa, np
        self._schema = schema()
        self.tmp = tmp
        self._writer = pq.ParquetWriter(
            tmp, self._schema, compression="zstd", compression_level=level,
            # the mask: runs of 0s and 1s, a few bytes a row group; the IDs: a 163,840-word
            # vocabulary overflows a dictionary page, so they are written plain (then zstd)
            use_dictionary=["loss_mask.list.element"], write_statistics=False)
        self._ids: list[str] = []
        self._bodies: list[bytes] = []
        self._n_in: list[int] = []
        self._n_out: list[int] = []
        self._group_tokens = 0
        self.uncompressed = 0  # the columns' bytes in memory (Arrow), summed over row groups
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kp-shard-parquet")
        self._pending: Future | None = None

    def add(self, rid: str, body: bytes, n_in: int, n_out: int) -> None:
        self._ids.append(rid)
        self._bodies.append(body)
        self._n_in.append(n_in)
        self._n_out.append(n_out)
        self._group_tokens += n_in + n_out
        if len(self._ids) >= ROW_GROUP_ROWS or self._group_tokens >= ROW_GROUP_TOKENS:
            self._flush()

    def _flush(self) -> None:
        """Hand the row group over to the encoder thread (after the one before it)."""
        if not self._ids:
            return
        self._wait()
        group = (self._ids, self._bodies, self._n_in, self._n_out)
        self._ids, self._bodies, self._n_in, self._n_out = [], [], [], []
        self._group_tokens = 0
        self._pending = self._encoder.submit(self._write_group, *group)

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()  # (an error of the encoder thread is raised here)

    def _write_group(self, ids: list[str], bodies: list[bytes], n_ins: list[int],
                     n_outs: list[int]) -> None:
        pa, np = self._pa, self._np
        n_in = np.array(n_ins, dtype=np.int64)
        n_out = np.array(n_outs, dtype=np.int64)
        offsets = np.zeros(len(ids) + 1, dtype=np.int32)
        np.cumsum(n_in + n_out, out=offsets[1:])
        # (rows.py proved each body `N(,N)*` of non-negative integers: parsing is all left)
        values = np.fromstring(b",".join(bodies), dtype=np.int64, sep=",")
        if values.size != offsets[-1]:
            raise AssertionError(f"parquet: parsed {values.size} IDs, expected {offsets[-1]}")
        if values.size and values.max() > _INT32_MAX:
            raise KPError(f"token ID {int(values.max())} does not fit a Parquet int32 column "
                          "(use --format eagle)", ExitCode.USAGE)
        mask = np.repeat(np.tile(np.array([0, 1], dtype=np.int8), len(ids)),
                         np.column_stack((n_in, n_out)).ravel())
        arrow_offsets = pa.array(offsets)
        table = pa.Table.from_arrays(
            [pa.array(ids, pa.string()),
             pa.ListArray.from_arrays(arrow_offsets, pa.array(values.astype(np.int32))),
             pa.ListArray.from_arrays(arrow_offsets, pa.array(mask))],
            schema=self._schema)
        self._writer.write_table(table, row_group_size=len(ids))
        self.uncompressed += table.nbytes

    def close(self) -> tuple[int, str]:
        """Finish the file (its last row group, the footer), fsync it; (bytes, sha256)."""
        self._flush()
        self._wait()
        self._encoder.shutdown()
        self._writer.close()
        fd = os.open(self.tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return os.path.getsize(self.tmp), file_sha256(self.tmp)

    def abandon(self) -> None:
        try:
            self._encoder.shutdown(wait=True)
            self._writer.close()
        except Exception:
            pass  # a half-written file is deleted next anyway
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)


def _open(path: str):
    pa, pq, _ = require("reading a Parquet shard set")
    try:
        f = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise Unreadable(f"cannot read as Parquet: {e}") from None
    names = f.schema_arrow.names
    if list(names) != list(_COLUMNS):
        raise Unreadable(f"columns {names}, expected {list(_COLUMNS)}")
    return f


def _batches(f) -> Iterator:
    pa, _, _ = require("reading a Parquet shard set")
    try:
        for i in range(f.num_row_groups):
            yield f.read_row_group(i)
    except (pa.ArrowException, OSError) as e:
        raise Unreadable(f"cannot read as Parquet: {e}") from None


def checked_rows(path: str) -> Iterator[tuple[int, tuple[str, int, int] | str]]:
    """(row number from 1, (id, input tokens, output tokens) or what is wrong with the row)
    of every row of the Parquet shard at PATH; Unreadable if the file cannot be read."""
    _, _, np = require("reading a Parquet shard set")
    row = 0
    for table in _batches(_open(path)):
        ids = table.column("id").combine_chunks()
        inputs = table.column("input_ids").combine_chunks()
        masks = table.column("loss_mask").combine_chunks()
        in_len = np.asarray(inputs.value_lengths().fill_null(-1))
        mask_len = np.asarray(masks.value_lengths().fill_null(-1))
        in_off = np.asarray(inputs.offsets)
        mask_off = np.asarray(masks.offsets)
        # The common case in a few whole-array passes: no null, IDs >= 0, mask values 0/1
        # (then a row's ones are a difference of the mask's running sum); the running
        # counts of each kind of bad value only where there is one, to name its rows.
        id_values, mask_values = _values(inputs.values, -1, np), _values(masks.values, 2, np)
        bad_mask = _bad_mask(mask_values)
        ones_before = np.concatenate(([0], np.cumsum(mask_values == 1 if bad_mask else mask_values,
                                                     dtype=np.int64)))
        zeros_before = None
        if bad_mask:
            zeros_before = np.concatenate(([0], np.cumsum(mask_values == 0, dtype=np.int64)))
        negative_before = None
        if id_values.size and id_values.min() < 0:
            negative_before = np.concatenate(([0], np.cumsum(id_values < 0, dtype=np.int64)))
        id_list = ids.to_pylist()
        for k in range(len(table)):
            row += 1
            if id_list[k] is None:
                yield row, "id is null"
                continue
            if in_len[k] < 0 or mask_len[k] < 0:
                yield row, "input_ids or loss_mask is null"
                continue
            if in_len[k] != mask_len[k]:
                yield row, f"input_ids has {in_len[k]} tokens but loss_mask {mask_len[k]}"
                continue
            # (offsets index the backing `values`, whatever slice the column is)
            a, b = mask_off[k], mask_off[k + 1]
            ones = int(ones_before[b] - ones_before[a])
            zeros = int(b - a - ones if zeros_before is None else zeros_before[b] - zeros_before[a])
            i0, i1 = in_off[k], in_off[k + 1]
            if negative_before is not None and negative_before[i1] != negative_before[i0]:
                yield row, "input_ids holds a null or negative ID"
            elif ones + zeros != mask_len[k]:
                yield row, "loss_mask holds values other than 0 and 1"
            elif ones == 0:
                yield row, "loss_mask has no 1: the row teaches nothing (trainers drop it)"
            else:
                yield row, (id_list[k], zeros, ones)


def _values(array, null_as: int, np):
    """A list column's values as numpy (nulls, where there are any, as NULL_AS)."""
    return np.asarray(array if array.null_count == 0 else array.fill_null(null_as))


def _bad_mask(values) -> bool:
    """Whether a mask's values hold anything but 0 and 1."""
    return bool(values.size) and (values.min() < 0 or values.max() > 1)


def row_lengths(path: str) -> Iterator[tuple[int, int]]:
    """(input tokens, output tokens) of every row (mask 0s and 1s); Unreadable as above."""
    _, _, np = require("reading a Parquet shard set")
    for table in _batches(_open(path)):
        masks = table.column("loss_mask").combine_chunks()
        off = np.asarray(masks.offsets)
        ones_before = np.concatenate(([0], np.cumsum(np.asarray(masks.values) == 1)))
        lengths = np.diff(off)
        ones = ones_before[off[1:]] - ones_before[off[:-1]]
        yield from zip((lengths - ones).tolist(), ones.tolist(), strict=True)


def eagle_lines(path: str) -> Iterator[bytes]:
    """The rows of the Parquet shard at PATH as eagle JSON lines ({"id", "input_ids",
    "loss_mask"}, newline included), what a JSONL set holds; a row group at a time."""
    encode = msgspec.json.Encoder().encode
    for table in _batches(_open(path)):
        for row in table.to_pylist():
            yield encode(row) + b"\n"
