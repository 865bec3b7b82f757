"""Cutting a torn last record off an output file before a run resumes it.

A crash (kill -9, power loss, a full disk) can leave an append-only output ending in the
middle of a record. Resuming must first cut that partial record off, or the next record
would be glued to it; every record before it is kept as it is.

Plain files: the bytes after the last newline are cut (the file is read backwards from its
end for the newline, so the cost does not grow with the file).

zstd files (kimipipe appends one frame per run and flushes a block per record or batch):
1. The frame structure is walked from the start: frame headers and block headers only, no
   decompression, so this reads a few bytes per block. It gives the start of the last data
   frame, and whether that frame is whole (last block and checksum present) or torn.
2. The last frame alone is decompressed, streaming, to see whether its text ends with a
   newline. A whole frame that does is an untorn file: it has been read, not written.
3. Otherwise the last frame is the torn one. Its whole lines are recompressed, streaming,
   into a new frame in a hidden sidecar file beside the output (`.NAME.repair-at-OFFSET`);
   the output is cut at the torn frame's start and the sidecar appended; the sidecar goes.
   Memory stays bounded by one line plus zstd's window, whatever the frame's size, and
   every frame before the torn one keeps its bytes.
A crash during step 3 is safe: the sidecar is written under a temporary name and renamed
only when complete, and a complete sidecar names the offset it belongs at, so the next
repair finishes the job (cut at the offset, append the sidecar) before anything else.

Data that is not a zstd frame where a frame should start (garbage, or zeros left by a
crash) ends the walk: it is treated as the torn tail, like bytes after the last newline of
a plain file.
"""

from __future__ import annotations

import glob
import os
import re

import zstandard

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # a zstd frame starts with it (the one spelling: io.py uses it)
_CHUNK = 1 << 20
_DID_SIZES = (0, 1, 2, 4)
_FCS_SIZES = (0, 2, 4, 8)  # flag 0 means 1 byte when the frame is a single segment


class CorruptOutput(Exception):
    """Bad data that is not a torn tail: the caller reports it with the file's name."""


class _Walk:
    """Where the last data frame starts, and where the walk stopped."""

    def __init__(self) -> None:
        self.last_start: int | None = None  # the last whole data frame ...
        self.last_end: int = 0  # ... and the offset just past it
        self.torn_at: int | None = None  # a frame (or non-frame data) that runs past the end


def walk_frames(f, size: int) -> _Walk:
    """Walk the frames of zstd file F (SIZE bytes) by their headers, decompressing nothing."""
    walk = _Walk()
    pos = 0
    while pos < size:
        f.seek(pos)
        head = f.read(18)  # the longest frame header: 4 + 1 + 1 + 4 + 8
        if len(head) >= 4 and head[1:4] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50:
            if len(head) < 8:
                walk.torn_at = pos
                return walk
            end = pos + 8 + int.from_bytes(head[4:8], "little")  # a skippable frame
            if end > size:
                walk.torn_at = pos
                return walk
            pos = end
            continue
        end = _frame_end(f, pos, head, size)
        if end is None:
            walk.torn_at = pos
            return walk
        walk.last_start, walk.last_end = pos, end
        pos = end
    return walk


def _frame_end(f, pos: int, head: bytes, size: int) -> int | None:
    """The offset just past the zstd frame at POS, or None if it is torn or not a frame."""
    if len(head) < 5 or head[:4] != ZSTD_MAGIC:
        return None
    fhd = head[4]
    if fhd & 0x08:  # the reserved bit: not a frame header
        return None
    single_segment = (fhd >> 5) & 1
    fcs_flag = fhd >> 6
    fcs = _FCS_SIZES[fcs_flag] or (1 if single_segment else 0)
    p = pos + 5 + (0 if single_segment else 1) + _DID_SIZES[fhd & 3] + fcs
    while True:
        if p + 3 > size:
            return None
        f.seek(p)
        header = int.from_bytes(f.read(3), "little")
        block_type = (header >> 1) & 3
        if block_type == 3:  # reserved: corrupt
            return None
        p += 3 + (1 if block_type == 1 else header >> 3)  # an RLE block holds one byte
        if p > size:
            return None
        if header & 1:  # the last block
            break
    if fhd & 0x04:  # content checksum
        p += 4
    return p if p <= size else None


def _decompressed_chunks(f, start: int, end: int):
    """The text of the frame in bytes [START, END) of F, in chunks of at most 1 MB.

    A torn frame yields what can be decoded and stops quietly at the end of the data; a
    decoding error (bad data) raises zstandard.ZstdError. Output is read in bounded
    pieces: a compressed chunk of very repetitive text could expand a thousandfold.
    """
    f.seek(start)
    reader = zstandard.ZstdDecompressor().stream_reader(_Limited(f, end - start), read_size=_CHUNK)
    while chunk := reader.read(_CHUNK):
        yield chunk


def _ends_with_newline(f, start: int, end: int) -> bool:
    """Whether the whole frame in [START, END) holds text ending with a newline (or none)."""
    last = b""
    try:
        for out in _decompressed_chunks(f, start, end):
            last = out[-1:]
    except zstandard.ZstdError as e:
        raise CorruptOutput(f"corrupt zstd data in the frame at byte {start} ({e}); the frame "
                            "is whole, so this is not a torn tail: not ours to cut") from None
    return last in (b"", b"\n")


def _sidecars(path: str) -> list[tuple[int, str]]:
    folder, name = os.path.split(os.path.abspath(path))
    found = []
    for p in glob.glob(os.path.join(glob.escape(folder), glob.escape(f".{name}.repair-at-") + "*")):
        m = re.search(r"\.repair-at-(\d+)$", p)
        if m:
            found.append((int(m.group(1)), p))
        elif p.endswith(".tmp"):
            os.unlink(p)  # an unfinished sidecar: the output was not touched yet
    return found


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _apply_sidecar(path: str, offset: int, sidecar: str) -> None:
    """Cut PATH at OFFSET and append SIDECAR's frame; idempotent, so a crash can redo it."""
    with open(path, "r+b") as out, open(sidecar, "rb") as frame:
        out.truncate(offset)
        out.seek(offset)
        while chunk := frame.read(_CHUNK):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    os.unlink(sidecar)
    _fsync_dir(path)


def _rewrite_whole_lines(path: str, f, start: int, end: int) -> int:
    """Replace the frame in [START, END), the end of PATH, by a frame of its whole lines.

    Returns the number of whole lines kept from it.
    """
    folder, name = os.path.split(os.path.abspath(path))
    sidecar = os.path.join(folder, f".{name}.repair-at-{start}")
    tmp = sidecar + ".tmp"
    lines = 0
    pending = bytearray()  # text after the last newline seen: at most one line
    with open(tmp, "wb") as side:
        writer = zstandard.ZstdCompressor(level=3).stream_writer(side, closefd=False)
        for out in _whole_or_torn(f, start, end):
            nl = out.rfind(b"\n")
            if nl < 0:
                pending += out
                continue
            lines += out.count(b"\n", 0, nl + 1)
            if pending:
                writer.write(pending)
                pending.clear()
            writer.write(out[: nl + 1])
            pending += out[nl + 1:]
        writer.close()
        side.flush()
        os.fsync(side.fileno())
    if lines == 0:
        os.unlink(tmp)
        with open(path, "r+b") as out:
            out.truncate(start)
            os.fsync(out.fileno())
        return 0
    os.replace(tmp, sidecar)
    _fsync_dir(path)
    _apply_sidecar(path, start, sidecar)
    return lines


def _whole_or_torn(f, start: int, end: int):
    """The frame's decodable text: a torn frame may end in bad bytes, which end it here."""
    try:
        yield from _decompressed_chunks(f, start, end)
    except zstandard.ZstdError:
        return


def _count_lines_of_zst(path: str, end: int) -> int:
    """Newlines in the text of PATH's first END bytes (whole frames), read streaming."""
    with open(path, "rb") as f:
        reader = zstandard.ZstdDecompressor().stream_reader(_Limited(f, end), read_across_frames=True)
        count = 0
        try:
            while chunk := reader.read(_CHUNK):
                count += chunk.count(b"\n")
        except zstandard.ZstdError as e:
            raise CorruptOutput(f"corrupt zstd data after line {count} ({e})") from None
    return count


class _Limited:
    """The first LIMIT bytes of a file, as a readable stream."""

    def __init__(self, f, limit: int):
        self.f = f
        self.left = limit

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n)
        self.left -= len(data)
        return data


def repair_zst(path: str) -> int | None:
    """Cut a torn last line off zstd file PATH; the torn line's number, or None if untorn."""
    for offset, sidecar in _sidecars(path):
        _apply_sidecar(path, offset, sidecar)  # a repair interrupted after its sidecar was made
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        walk = walk_frames(f, size)
        if walk.torn_at is None:
            if walk.last_start is None or _ends_with_newline(f, walk.last_start, walk.last_end):
                return None  # only read, never written
            start, end = walk.last_start, walk.last_end  # whole, but ends inside a line
        else:
            start, end = walk.torn_at, size
        kept = _rewrite_whole_lines(path, f, start, end)
    return _count_lines_of_zst(path, start) + kept + 1


def repair_plain(path: str) -> int | None:
    """Cut the bytes after the last newline off plain file PATH; the torn line's number."""
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        pos = size
        block = 1 << 16
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                cut = start + nl + 1
                break
            pos = start
        else:
            cut = 0
        if cut == size:
            return None
        f.seek(0)
        complete_lines = 0
        remaining = cut
        while remaining:
            buf = f.read(min(remaining, _CHUNK))
            complete_lines += buf.count(b"\n")
            remaining -= len(buf)
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
        return complete_lines + 1


def repair_torn_tail(path: str) -> int | None:
    """Cut a torn last line (a crash mid-write) off PATH; return its line number, if any."""
    if not os.path.exists(path):
        return None
    if os.path.getsize(path) == 0:
        if _sidecars(path):  # a repair that had cut the file and not yet appended
            return repair_zst(path)
        return None
    with open(path, "rb") as f:
        is_zst = f.read(4) == ZSTD_MAGIC
    return repair_zst(path) if is_zst else repair_plain(path)
