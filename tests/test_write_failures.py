"""No torn line, ever, from a failed write (RecordWriter, and kp-tokenize through it).

A full disk is simulated two ways: without privileges, a child process with RLIMIT_FSIZE
and SIGXFSZ ignored (a write past the limit fails with EFBIG, after a short write that
fills the file up to it); as root, a real 300 KB tmpfs (ENOSPC). Either way the output
must end with its last whole record (a .zst one must decompress, frame by frame, to whole
lines), the command must say so and exit 3, and a rerun with room must finish the job.
A closed output pipe: kp-infer says what it paid for and could not write.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import uuid

import pytest
import zstandard
from conftest import BIN, TOKENIZER_KINDS, response_record, write_jsonl
from helpers import time_left
from test_infer import make_prompts

FAST = TOKENIZER_KINDS["fast"]
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
         "rho sigma tau upsilon phi chi psi omega token drafter eagle shard").split()


def responses(path, n):
    rng = random.Random(7)
    rows = [response_record(f"r{i:05d}", f"Question {i}: " + " ".join(rng.choices(WORDS, k=20)),
                            content=" ".join(rng.choices(WORDS, k=150)),
                            reasoning=" ".join(rng.choices(WORDS, k=60))) for i in range(n)]
    return write_jsonl(path, rows)


def text_of(path) -> bytes:
    """The file's text; for zstd every frame must end (no reader has to forgive anything)."""
    data = open(path, "rb").read()
    if data[:4] != b"\x28\xb5\x2f\xfd":
        return data
    out = bytearray()
    while data:
        frame = zstandard.ZstdDecompressor().decompressobj()
        out += frame.decompress(data)
        assert frame.eof, "a zstd frame does not end"
        data = frame.unused_data
    return bytes(out)


def whole_records(path) -> list[dict]:
    text = text_of(path)
    assert text.endswith(b"\n"), f"torn last line: {text[-80:]!r}"
    return [json.loads(line) for line in text.splitlines()]


def limited(max_bytes: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return preexec


WRITER = r"""
import hashlib, json, sys
from kimipipe.io import RecordWriter, OutputWriteError
path, n = sys.argv[1], int(sys.argv[2])
written = 0
try:
    with RecordWriter(path, append=True) as w:
        for i in range(n):
            pad = hashlib.sha256(b"%d" % i).hexdigest().encode() * (i % 11)  # compresses little
            w.write_line(b'{"id": "w%06d", "pad": "%s"}\n' % (i, pad))
            written += 1
except OutputWriteError as e:
    print(json.dumps({"written": written, "error": str(e), "exit": e.exit_code}))
else:
    print(json.dumps({"written": written}))
"""


@pytest.mark.parametrize("name", ["w.jsonl", "w.jsonl.zst"])
def test_record_writer_cuts_back_to_its_last_whole_record(tmp_path, name):
    path = tmp_path / name
    first = subprocess.run([sys.executable, "-c", WRITER, str(path), "50"], capture_output=True,
                           text=True, check=True)
    assert json.loads(first.stdout) == {"written": 50}
    limit = path.stat().st_size + 100_000
    proc = subprocess.run([sys.executable, "-c", WRITER, str(path), "5000"], capture_output=True,
                          text=True, preexec_fn=limited(limit))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert 0 < report["written"] < 5000 and report["exit"] == 3
    assert report["error"] == (f"cannot write {path}: File too large; it ends with its last whole "
                               "record; free some space and rerun the same command to resume")
    # Every record whose write_line returned is there, the failed one is not: whole lines only.
    ids = [r["id"] for r in whole_records(path)]
    assert ids == [f"w{i:06d}" for i in range(50)] + [f"w{i:06d}" for i in range(report["written"])]


@pytest.fixture(scope="module")
def source_and_fresh(tmp_path_factory):
    """The input, and the records a run with room writes from it."""
    folder = tmp_path_factory.mktemp("fresh")
    src = responses(folder / "r.jsonl", 1000)  # (.zst: ~430 KB, over both limits)
    assert run_tokenize(src, folder / "fresh.jsonl")[0] == 0
    return src, whole_records(folder / "fresh.jsonl")


def run_tokenize(src, out, *, preexec=None, extra=()):
    proc = subprocess.run([str(BIN / "kp-tokenize"), str(src), "--tokenizer", str(FAST),
                           "--workers", "1", "--drop-text", "-o", str(out), *extra],
                          capture_output=True, preexec_fn=preexec,
                          timeout=time_left())
    return proc.returncode, proc.stderr.decode()


def check_failed_run(code, err, out, folder):
    assert code == 3, err
    assert err.strip().splitlines()[-1].startswith(f"kp-tokenize: cannot write {out}: ")
    assert err.strip().endswith("it ends with its last whole record; free some space and rerun "
                                "the same command to resume")
    assert "Traceback" not in err
    kept = whole_records(out)
    assert 0 < len(kept) < 1000
    assert [r["id"] for r in kept] == [f"r{i:05d}" for i in range(len(kept))]
    assert not [n for n in os.listdir(folder) if n.endswith(".lock")]
    return kept


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.zst"])
def test_kp_tokenize_on_a_full_disk_without_privileges(tmp_path, name, source_and_fresh):
    src, fresh = source_and_fresh
    out = tmp_path / name
    code, err = run_tokenize(src, out, preexec=limited(200_000))
    kept = check_failed_run(code, err, out, tmp_path)
    code, err = run_tokenize(src, out)  # room again: the rerun finishes the job
    assert code == 0, err
    assert f"skipped {len(kept):,} already in the output" in err
    assert whole_records(out) == fresh


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 300 KB filesystem (root only: mount)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mnt = tmp_path / f"tmpfs-{uuid.uuid4().hex[:8]}"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.zst"])
def test_kp_tokenize_on_a_full_tmpfs(tmp_path, small_tmpfs, name, source_and_fresh):
    src, fresh = source_and_fresh
    out = small_tmpfs / name
    code, err = run_tokenize(src, out)
    assert "No space left on device" in err
    kept = check_failed_run(code, err, out, small_tmpfs)
    # Make room (as a user would, elsewhere): move the output to a roomier disk, finish there.
    moved = tmp_path / name
    moved.write_bytes(out.read_bytes())
    code, err = run_tokenize(src, moved)
    assert code == 0, err
    assert f"skipped {len(kept):,} already in the output" in err
    assert whole_records(moved) == fresh


def test_a_closed_output_pipe_reports_what_it_paid_for_and_could_not_write(standin, tmp_path):
    """Without -q the summary counts the answers paid for that stdout could not take, and
    their cost (the -q case, silent with exit 0, is test_infer's)."""
    server = standin(latency=0.05, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 400)
    summary = tmp_path / "s.json"
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    proc = subprocess.run(
        f"'{BIN}/kp-infer' '{prompts}' --base-url {server.base_url} --concurrency 4 "
        f"--summary-json '{summary}' | head -1", shell=True, capture_output=True, env=env, timeout=120)
    assert len(proc.stdout.splitlines()) == 1
    err = proc.stderr.decode()
    s = json.loads(summary.read_text())
    lost = s["paid_not_written"]
    assert s["exit_code"] == 0 and s["stop_reason"] == "closed-pipe"
    assert lost["answers"] >= 1 and lost["rescued"] == 0 and lost["rescue_file"] is None
    ledger = server.ledger()
    assert s["done"] + lost["answers"] == len(ledger)  # every answer paid for is counted
    assert s["spend_this_run"] == pytest.approx(sum(x["cost"] for x in ledger), rel=1e-6)
    assert (f"  paid for but not written (stdout was closed): {lost['answers']:,} "
            f"answer{'s' if lost['answers'] != 1 else ''}, ${lost['cost']:.6f}") in err
    assert "Traceback" not in err

