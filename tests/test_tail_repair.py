"""Torn-tail repair of zstd outputs: exact bytes, and memory bounded by one line, not the file.

kimipipe appends one zstd frame per run and flushes a block per record or batch, so a crash
leaves a last frame cut somewhere: inside a block, at a block boundary, or between frames.
The repair must keep every earlier frame byte for byte, keep every whole line of the torn
frame, read an untorn file without writing it, and never hold the file's text in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import zstandard
from helpers import time_left

from kimipipe.errors import InputError
from kimipipe.io import RecordWriter, scan_done
from kimipipe.tail_repair import repair_torn_tail, walk_frames

PAD = (b"lorem ipsum dolor sit amet, " * 40)[:1000]


def line(i: int) -> bytes:
    return b'{"id":"r%09d","text":"%s"}\n' % (i, PAD)


def lines(a: int, b: int) -> bytes:
    return b"".join(line(i) for i in range(a, b))


def decompressed(path) -> bytes:
    with open(path, "rb") as f:
        return zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read()


def strict_frames(path) -> list[bytes]:
    """Each frame's text; fails on a frame that does not end, or bytes that are no frame."""
    data = open(path, "rb").read()
    out = []
    while data:
        obj = zstandard.ZstdDecompressor().decompressobj()
        out.append(obj.decompress(data))
        assert obj.eof, "a frame does not end"
        data = obj.unused_data
    return out


class Writer:
    """A zstd file written like kimipipe's outputs: frames of blocks flushed at line ends.

    Records, for each block flushed, the file offset where it ends and the lines before it.
    """

    def __init__(self, path):
        self.f = open(path, "wb")
        self.boundaries: list[tuple[int, int]] = []  # (offset after a whole block, lines)
        self.frame_ends: list[tuple[int, int]] = []
        self.n = 0

    def frame(self, batches: int, per_batch: int, close: bool = True) -> None:
        w = zstandard.ZstdCompressor(level=1).stream_writer(self.f, closefd=False)
        for _ in range(batches):
            w.write(lines(self.n, self.n + per_batch))
            self.n += per_batch
            w.flush(zstandard.FLUSH_BLOCK)
            self.boundaries.append((self.f.tell(), self.n))
        if close:
            w.close()
            self.frame_ends.append((self.f.tell(), self.n))
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def test_torn_in_the_middle_of_a_block_keeps_earlier_frames_and_every_whole_line(tmp_path):
    path = tmp_path / "out.jsonl.zst"
    w = Writer(path)
    w.frame(3, 20)
    w.frame(5, 7, close=False)  # a run killed while writing its frame
    w.close()
    frame1_end, _ = w.frame_ends[0]
    (a, lines_a), (b, _) = w.boundaries[-2], w.boundaries[-1]
    original = path.read_bytes()
    with open(path, "r+b") as f:
        f.truncate((a + b) // 2)  # the last block cut in its middle
    assert repair_torn_tail(str(path)) == lines_a + 1
    repaired = path.read_bytes()
    assert repaired[:frame1_end] == original[:frame1_end]  # the whole frame kept byte for byte
    assert strict_frames(path) == [lines(0, 60), lines(60, lines_a)]
    assert repair_torn_tail(str(path)) is None
    assert not [p for p in os.listdir(tmp_path) if p != "out.jsonl.zst"]  # no sidecar left
    with RecordWriter(str(path), append=True) as rw:  # a resume appends a frame of its own
        rw.write_line(line(999))
    assert decompressed(path) == lines(0, lines_a) + line(999)


@pytest.mark.parametrize("cut", ["inside the next header", "after its header", "after a block"])
def test_torn_at_a_frame_or_block_boundary(tmp_path, cut):
    path = tmp_path / "out.jsonl.zst"
    w = Writer(path)
    w.frame(2, 10)
    w.frame(3, 4, close=False)
    w.close()
    frame1_end, n1 = w.frame_ends[0]
    block_end, n_block = w.boundaries[2]  # the first block of the second frame
    original = path.read_bytes()
    header = 6  # magic, descriptor, window: a stream writer's frame header
    size = {"inside the next header": frame1_end + 2, "after its header": frame1_end + header,
            "after a block": block_end}[cut]
    path.write_bytes(original[:size])
    expected_lines = n_block if cut == "after a block" else n1
    assert repair_torn_tail(str(path)) == expected_lines + 1
    assert path.read_bytes()[:frame1_end] == original[:frame1_end]
    frames = strict_frames(path)
    assert b"".join(frames) == lines(0, expected_lines)
    if cut != "after a block":
        assert path.read_bytes() == original[:frame1_end]  # nothing of the torn frame survives


def test_an_untorn_file_is_only_read(tmp_path):
    path = tmp_path / "out.jsonl.zst"
    w = Writer(path)
    w.frame(2, 10)
    w.frame(3, 5)
    w.close()
    with open(path, "ab") as f:  # a skippable frame at the end (metadata some tools write)
        f.write(b"\x50\x2a\x4d\x18" + (4).to_bytes(4, "little") + b"meta")
    before = path.read_bytes()
    os.utime(path, ns=(1, 1))
    assert repair_torn_tail(str(path)) is None
    assert path.read_bytes() == before and path.stat().st_mtime_ns == 1
    assert scan_done(str(path)) == {f"r{i:09d}" for i in range(35)}
    assert path.stat().st_mtime_ns == 1


def test_a_whole_frame_ending_inside_a_line_is_cut_to_its_last_newline(tmp_path):
    path = tmp_path / "out.jsonl.zst"
    c = zstandard.ZstdCompressor()
    first = c.compress(lines(0, 3))
    path.write_bytes(first + c.compress(lines(3, 5) + b'{"id":"r-torn"'))
    assert repair_torn_tail(str(path)) == 6
    assert path.read_bytes()[:len(first)] == first
    assert b"".join(strict_frames(path)) == lines(0, 5)


def test_bytes_that_are_no_frame_after_the_last_frame_are_the_torn_tail(tmp_path):
    path = tmp_path / "out.jsonl.zst"
    first = zstandard.ZstdCompressor().compress(lines(0, 4))
    path.write_bytes(first + b"\x00" * 4096)  # zeros left by a crash
    assert repair_torn_tail(str(path)) == 5
    assert path.read_bytes() == first


def test_a_corrupt_whole_frame_is_an_error_not_cut(tmp_path):
    path = tmp_path / "out.jsonl.zst"
    data = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(lines(0, 50)))
    data[-2] ^= 0xFF  # the checksum no longer matches: the frame is whole, its bytes are bad
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match="corrupt zstd data in the frame at byte 0"):
        scan_done(str(path))
    assert path.read_bytes() == bytes(data)


def test_a_repair_interrupted_after_cutting_is_finished_by_the_next(tmp_path, monkeypatch):
    """The torn frame's whole lines live in a sidecar until they are appended back."""
    import kimipipe.tail_repair as tr

    path = tmp_path / "out.jsonl.zst"
    w = Writer(path)
    w.frame(2, 10)
    w.frame(4, 3, close=False)
    w.close()
    a, lines_a = w.boundaries[-2]
    with open(path, "r+b") as f:
        f.truncate(a + 5)
    real = tr._apply_sidecar

    def crash_after_cutting(out_path, offset, sidecar):
        with open(out_path, "r+b") as f:
            f.truncate(offset)
        raise KeyboardInterrupt  # (the power went out)

    monkeypatch.setattr(tr, "_apply_sidecar", crash_after_cutting)
    with pytest.raises(KeyboardInterrupt):
        repair_torn_tail(str(path))
    assert decompressed(path) == lines(0, 20)  # the torn frame's lines are in the sidecar
    assert [p for p in os.listdir(tmp_path) if ".repair-at-" in p]
    monkeypatch.setattr(tr, "_apply_sidecar", real)
    assert repair_torn_tail(str(path)) is None  # finished the job, and the file is whole
    assert b"".join(strict_frames(path)) == lines(0, lines_a)
    assert os.listdir(tmp_path) == ["out.jsonl.zst"]


def test_the_frame_walk_reads_headers_only(tmp_path):
    path = tmp_path / "out.jsonl.zst"
    w = Writer(path)
    w.frame(3, 5)
    w.frame(2, 5)
    w.close()
    with open(path, "rb") as f:
        walk = walk_frames(f, path.stat().st_size)
    assert (walk.last_start, walk.last_end, walk.torn_at) == (
        w.frame_ends[0][0], w.frame_ends[1][0], None)


# --- A large file, repaired in a child process whose address space is capped ---------------

FRAMES = 4
LINES_PER_FRAME = 65_536  # x ~1 KB: 64 MB of text per frame, 256 MB in all
BATCH = 50  # lines per flushed block (~50 KB, under zstd's 128 KB block size)

CHILD = r"""
import json, resource, sys
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    probe = bytearray(int(sys.argv[3]))  # the file's text would not fit
    print(json.dumps({"error": "the limit allows the whole text"}))
    sys.exit(0)
except MemoryError:
    pass
from kimipipe.tail_repair import repair_torn_tail
result = repair_torn_tail(sys.argv[1])
peak = [l for l in open("/proc/self/status") if l.startswith("VmPeak")]
print(json.dumps({"result": result, "peak": peak[0].split(":")[1].strip() if peak else None}))
"""


def vm_size_of_a_child() -> int:
    """Bytes of address space a bare child Python with kimipipe's zstd code takes."""
    out = subprocess.run([sys.executable, "-c", "import kimipipe.tail_repair, zstandard\n"
                          "print([l for l in open('/proc/self/status') if l.startswith('VmSize')][0])"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[1]) * 1024


def repair_in_capped_child(path, text_size: int) -> tuple[dict, int]:
    limit = vm_size_of_a_child() + 96 * 2**20  # well below the 256 MB of text
    assert limit < text_size
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), str(limit), str(text_size)],
                          capture_output=True, text=True, timeout=time_left())
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert "error" not in report, report
    return report, limit


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 4-frame file of 256 MB of text (a few MB compressed); the last frame's blocks known."""
    if not sys.platform.startswith("linux"):
        pytest.skip("RLIMIT_AS and /proc are Linux's")
    path = tmp_path_factory.mktemp("big") / "big.jsonl.zst"
    w = Writer(path)
    for _ in range(FRAMES):
        w.frame(LINES_PER_FRAME // BATCH, BATCH)
    w.close()
    return path, w


def text_digest(n_lines: int) -> str:
    h = hashlib.sha256()
    for start in range(0, n_lines, 4096):
        h.update(lines(start, min(n_lines, start + 4096)))
    return h.hexdigest()


@pytest.mark.timeout(900)
def test_a_large_untorn_file_is_checked_in_bounded_memory_and_left_alone(big, tmp_path):
    path, w = big
    copy = tmp_path / "untorn.jsonl.zst"
    shutil.copyfile(path, copy)
    before = hashlib.sha256(copy.read_bytes()).hexdigest()
    report, _limit = repair_in_capped_child(copy, FRAMES * LINES_PER_FRAME * len(line(0)))
    assert report["result"] is None
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == before


@pytest.mark.timeout(900)
def test_a_large_file_torn_in_its_last_frame_is_repaired_in_bounded_memory(big, tmp_path):
    path, w = big
    torn = tmp_path / "torn.jsonl.zst"
    # Cut the last (64 MB) frame in the middle of a block two thirds of the way in.
    k = len(w.boundaries) - LINES_PER_FRAME // BATCH // 3
    (a, kept), (b, _) = w.boundaries[k - 1], w.boundaries[k]
    with open(path, "rb") as src, open(torn, "wb") as dst:
        dst.write(src.read((a + b) // 2))
    frames_before = w.frame_ends[FRAMES - 2][0]
    head = hashlib.sha256(torn.read_bytes()[:frames_before]).hexdigest()
    report, _limit = repair_in_capped_child(torn, FRAMES * LINES_PER_FRAME * len(line(0)))
    assert report["result"] == kept + 1
    assert hashlib.sha256(torn.read_bytes()[:frames_before]).hexdigest() == head
    digest, size, frames = strict_digest(torn)
    assert size == kept * len(line(0)) and digest == text_digest(kept)
    assert frames == FRAMES  # three frames kept, the torn one replaced by one that ends


def strict_digest(path) -> tuple[str, int, int]:
    """SHA-256 and size of the text, and the number of frames, every frame required to end."""
    data = open(path, "rb").read()  # (a few MB compressed)
    h = hashlib.sha256()
    size = frames = 0
    while data:
        obj = zstandard.ZstdDecompressor().decompressobj()
        text = obj.decompress(data)
        assert obj.eof, "a frame does not end"
        h.update(text)
        size += len(text)
        frames += 1
        data = obj.unused_data
    return h.hexdigest(), size, frames
