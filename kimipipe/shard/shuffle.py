"""A deterministic shuffle in bounded memory: hash buckets on disk, then sort each bucket.

Every row gets a key, a 64-bit keyed BLAKE2b hash of its ID under the seed. The shuffled
order is simply the rows sorted by key, so it depends only on the seed and the set of IDs:
not on the order or the grouping of the inputs, nor on the shard sizes.

It is computed as a two-level external sort:
1. spill: each row goes to one of 64 bucket files chosen by the top 6 bits of its key;
   rows are buffered per bucket (256 KiB each, 16 MiB in all) and written as zstd frames
   at level 1, so the spill costs about a quarter of the rows' size on disk;
2. drain: buckets are read back in key order; each is loaded whole and sorted by key
   (Python's sort is stable, so repeats of an ID keep their input order and the first one
   wins). A bucket larger than the memory budget is split again by the next 6 bits of the
   key, recursively, before it is loaded.

Memory therefore stays near `memory_budget` + 16 MiB whatever the input size; disk use is
the compressed size of the rows kept. Duplicate IDs land in the same bucket and end up
next to each other, which is where they are found (exactly, by ID) in this mode.
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import zstandard

from ..ids import row_shuffle_key  # (the hash: ids.py)
from ..io import zstd_reader
from .rows import Row

FANOUT_BITS = 6
FANOUT = 1 << FANOUT_BITS
_BUFFER = 256 << 10
# key, split, source, line, in, out, id length, row length, profile, deltas (rows.Row)
_HEADER = struct.Struct("<QBIQIIIIIii")
_ROW_OVERHEAD = 200  # bytes of Python objects around each loaded row, for the budget
SPLITS = ("train", "eval")


@dataclass
class Spilled:
    key: int
    split: str
    source: int
    line: int
    row: Row


class _Buckets:
    """FANOUT bucket files under DIRECTORY, written in compressed chunks."""

    def __init__(self, directory: str, shift: int):
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.shift = shift
        self.buffers = [bytearray() for _ in range(FANOUT)]
        self.sizes = [0] * FANOUT  # uncompressed bytes per bucket
        self.counts = [0] * FANOUT
        self.cctx = zstandard.ZstdCompressor(level=1)

    def path(self, i: int) -> str:
        return os.path.join(self.directory, f"{i:02d}.zst")

    def add(self, item: Spilled) -> None:
        i = (item.key >> self.shift) & (FANOUT - 1)
        ident = item.row.id.encode()
        buf = self.buffers[i]
        buf += _HEADER.pack(item.key, SPLITS.index(item.split), item.source, item.line,
                            item.row.input_tokens, item.row.output_tokens, len(ident),
                            len(item.row.data), item.row.profile, item.row.prompt_delta,
                            item.row.completion_delta)
        buf += ident
        buf += item.row.data
        self.sizes[i] += _HEADER.size + len(ident) + len(item.row.data)
        self.counts[i] += 1
        if len(buf) >= _BUFFER:
            self._flush(i)

    def _flush(self, i: int) -> None:
        if self.buffers[i]:
            with open(self.path(i), "ab") as f:
                f.write(self.cctx.compress(self.buffers[i]))
            self.buffers[i].clear()

    def finish(self) -> None:
        for i in range(FANOUT):
            self._flush(i)
        self.buffers = []


def _read_bucket(path: str) -> Iterator[Spilled]:
    with open(path, "rb") as raw, zstd_reader(raw) as f:
        while head := f.read(_HEADER.size):
            (key, split, source, line, n_in, n_out, id_len, row_len, profile, prompt_delta,
             completion_delta) = _HEADER.unpack(head)
            ident = f.read(id_len).decode()
            data = f.read(row_len)
            yield Spilled(key, SPLITS[split], source, line,
                          Row(ident, n_in, n_out, data, profile=profile, prompt_delta=prompt_delta,
                              completion_delta=completion_delta))



class ExternalShuffle:
    """Rows in (any number), rows out in key order, holding at most about MEMORY_BUDGET."""

    def __init__(self, directory: str, seed: int, memory_budget: int):
        self.directory = directory
        self.seed = seed
        self.memory_budget = memory_budget
        self._top = _Buckets(os.path.join(directory, "0"), 64 - FANOUT_BITS)
        self.buckets_split = 0

    def add(self, split: str, row: Row, source: int, line: int) -> None:
        self._top.add(Spilled(row_shuffle_key(self.seed, row.id), split, source, line, row))

    def drain(self) -> Iterator[Spilled]:
        """Every row in key order (repeats of an ID adjacent, in input order)."""
        self._top.finish()
        yield from self._drain(self._top, depth=1)
        shutil.rmtree(self.directory, ignore_errors=True)

    def _drain(self, buckets: _Buckets, depth: int) -> Iterator[Spilled]:
        for i in range(FANOUT):
            path = buckets.path(i)
            if not buckets.counts[i]:
                continue
            need = buckets.sizes[i] + buckets.counts[i] * _ROW_OVERHEAD
            shift = buckets.shift - FANOUT_BITS
            if need > self.memory_budget and shift >= 0:
                self.buckets_split += 1
                sub = _Buckets(os.path.join(buckets.directory, f"{i:02d}"), shift)
                for item in _read_bucket(path):
                    sub.add(item)
                os.unlink(path)
                sub.finish()
                yield from self._drain(sub, depth + 1)
                continue
            items = list(_read_bucket(path))
            os.unlink(path)
            items.sort(key=lambda item: item.key)
            yield from items
