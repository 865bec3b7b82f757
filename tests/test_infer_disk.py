"""kp-infer and a full disk: no torn line, no paid answer lost, admission waits for room
(docs/robustness.md), through the CLI against the stand-in.

A full disk is made two ways: without privileges, RLIMIT_FSIZE in the kp-infer process
(SIGXFSZ ignored, so a write past the limit fails with EFBIG); as root, a small tmpfs
(ENOSPC), filled by another writer while the run goes on, the way a shared disk fills.
Either way: exit 3, the output ends with whole records, the answers paid for that it
could not take are in the rescue file (at the path the rule gives, under $TMPDIR), the
summary counts them (= the stand-in's ledger minus what was written), and the next run
takes them in before sending anything: every prompt answered once, paid once.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import threading
import time
import uuid
from collections import Counter

import pytest
import zstandard
from conftest import BIN, read_jsonl
from helpers import paid_once_each, time_left
from test_infer import assert_correct, make_prompts
from test_write_failures import limited, whole_records

from kimipipe.standin.answers import user_text_sha256


def rescue_file(tmpdir, out) -> str:
    """The rescue file's path by the documented rule, computed here independently."""
    digest = hashlib.sha256(os.path.abspath(out).encode()).hexdigest()[:16]
    return os.path.join(tmpdir, f"kimipipe-rescue-{os.getuid()}",
                        f"{os.path.basename(out)}.{digest}.jsonl")


def run_infer(server, *args, tmpdir, preexec=None, timeout=None, env=None):
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key, "TMPDIR": str(tmpdir), **(env or {})}
    proc = subprocess.run([str(BIN / "kp-infer"), *map(str, args), "--base-url", server.base_url,
                           "--backoff-base", "0.01"],
                          capture_output=True, env=env, preexec_fn=preexec,
                          timeout=time_left() if timeout is None else timeout)
    return proc.returncode, proc.stderr.decode()


def records_left(out, limit: int | None, full_disk: bool = False) -> list[dict]:
    """The output's records: whole lines only, and a .zst file's every frame ended, except
    where even the 3 bytes that end a frame did not fit (RecordWriter leaves the frame open
    after whole lines then; the next run closes it, check_resumed_run): past a size LIMIT,
    or on a FULL_DISK where they needed a block none was left for. (On a tmpfs filled
    mid-run the cut-back output ends within 3 bytes of a page's end in a fair share of
    runs: a test that counted it a failure failed now and then on a loaded machine.)"""
    try:
        return whole_records(out)
    except AssertionError as e:
        if "frame does not end" not in str(e) or (limit is None and not full_disk):
            raise
        size = out.stat().st_size
        if limit is not None:
            assert size + 3 > limit
        else:
            st = os.statvfs(out.parent)
            assert st.f_bavail == 0 and (size % st.f_bsize == 0 or size % st.f_bsize > st.f_bsize - 3), \
                (size, st.f_bavail, st.f_bsize)
    text = zstandard.ZstdDecompressor().decompressobj().decompress(out.read_bytes())
    assert text.endswith(b"\n"), f"torn last line: {text[-80:]!r}"
    return [json.loads(line) for line in text.splitlines()]


def check_stopped_run(code, err, out, summary, server, tmpdir, *, why, limit=None):
    """What a run stopped by a full disk must leave; returns (written IDs, rescued IDs)."""
    assert code == 3, err
    assert "Traceback" not in err
    assert f"kp-infer: cannot write {out}: {why} (it ends with its last whole record)" in err
    assert err.rstrip().endswith("stopped: no room for the output (a full disk, a quota or a "
                                 "file size limit); free some space and rerun the same command "
                                 "to resume")
    written = records_left(out, limit, full_disk=why == "No space left on device")  # whole lines only
    ledger = server.ledger()
    s = json.loads(summary.read_text())
    lost = s["paid_not_written"]
    assert s["stop_reason"] == "disk" and s["exit_code"] == 3
    assert lost["answers"] == len(ledger) - len(written) > 0
    assert lost["rescued"] == lost["answers"] and lost["error"] == f"{out}: {why}"
    assert lost["cost"] == pytest.approx(sum(x["cost"] for x in ledger)
                                         - sum(x["usage"]["cost"] for x in written), rel=1e-6)
    path = rescue_file(tmpdir, out)
    assert lost["rescue_file"] == path and f"kept in {path}" in err
    assert f"paid for but not written ({out}: {why}): " in err
    rescued = read_jsonl(path)
    written_ids = [r["id"] for r in written]
    rescued_ids = [r["id"] for r in rescued]
    assert len(rescued_ids) == lost["answers"] and not set(rescued_ids) & set(written_ids)
    assert len(set(written_ids)) == len(written_ids)
    paid = {x["request_user_text_sha256"] for x in ledger}
    assert len(paid) == len(ledger)  # nothing paid twice so far
    assert not [n for n in os.listdir(out.parent) if n.endswith(".lock")]
    return written_ids, rescued_ids


def check_resumed_run(code, err, out, summary, server, tmpdir, prompts, n, rescued_ids, **answer):
    assert code == 0, err
    whole_records(out)  # every frame of a .zst output ended
    path = rescue_file(tmpdir, out)
    assert f"kp-infer: took in {len(rescued_ids)} answer{'s' if len(rescued_ids) != 1 else ''} (" in err
    assert not os.path.exists(path)
    s = json.loads(summary.read_text())
    assert s["taken_in_from_rescue"] == len(rescued_ids)
    records = read_jsonl(out)
    ids = [r["id"] for r in records]
    assert sorted(ids) == [f"p{i:05d}" for i in range(n)]  # each once: no duplicate
    assert_correct(records, prompts, **answer)
    paid_once_each(server, prompts)  # the rescued answers were not paid for again
    assert sum(r["usage"]["cost"] for r in records) == pytest.approx(
        sum(x["cost"] for x in server.ledger()), rel=1e-9)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name, limit", [("r.jsonl", 150_000), ("r.jsonl.zst", 40_000)])
def test_a_full_disk_without_privileges_loses_no_paid_answer(standin, tmp_path, name, limit):
    server = standin(ledger=True, latency=0.05)
    prompts = make_prompts(tmp_path / "p.jsonl", 300)
    out, summary, tmpdir = tmp_path / name, tmp_path / "s.json", tmp_path / "tmp"
    tmpdir.mkdir()
    args = (prompts, "-o", out, "--concurrency", "8", "--summary-json", summary)
    code, err = run_infer(server, *args, tmpdir=tmpdir, preexec=limited(limit))
    _written, rescued = check_stopped_run(code, err, out, summary, server, tmpdir,
                                          why="File too large", limit=limit)
    code, err = run_infer(server, *args, tmpdir=tmpdir)  # room again
    check_resumed_run(code, err, out, summary, server, tmpdir, prompts, 300, rescued)


def failure_line(i: int, size: int) -> bytes:
    line = json.dumps({"id": f"old{i:05d}", "dataset": "B3", "kind": "permanent", "status": 400,
                       "code": "400", "message": "", "attempts": 1,
                       "time": "2025-01-01T00:00:00Z"})
    pad = size - len(line) - 1
    return (line.replace('"message": ""', f'"message": "{"x" * (pad - 0)}"') + "\n").encode()


@pytest.mark.timeout(600)
def test_a_paid_failure_the_failures_file_cannot_take_is_kept_and_counted(standin, tmp_path):
    """A routing violation is paid for: its failure record carries the cost that counts
    against --max-cost. When --failures cannot take it (here: at the size limit already),
    it goes to the failures file's own rescue file and the next run takes it in."""
    server = standin(ledger=True, latency=0.05, faults={"misroute": 0.3}, seed=5)
    prompts = make_prompts(tmp_path / "p.jsonl", 200)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    summary, tmpdir = tmp_path / "s.json", tmp_path / "tmp"
    tmpdir.mkdir()
    limit = 150_000
    failures.write_bytes(b"".join(failure_line(i, 1000) for i in range(limit // 1000 - 1))
                         + failure_line(999, 900))  # 100 bytes short of the limit
    # --max-attempts 1: a refused answer is a failure at once (else it is sent again)
    args = (prompts, "-o", out, "--failures", failures, "--concurrency", "4", "--max-attempts", "1",
            "--ignore-provider", "fireworks", "--ignore-provider", "baseten",
            "--summary-json", summary)
    code, err = run_infer(server, *args, tmpdir=tmpdir, preexec=limited(limit))
    assert code == 3, err
    assert f"kp-infer: cannot write {failures}: File too large" in err
    s = json.loads(summary.read_text())
    kept = s["failures_not_written"]
    path = rescue_file(tmpdir, failures)
    assert kept["records"] == kept["rescued"] >= 1 and kept["rescue_file"] == path
    assert f"failure records --failures could not take: {kept['records']}" in err
    rescued = read_jsonl(path)
    assert len(rescued) == kept["records"]
    assert all(f["kind"] == "routing_violation" and f["cost"] > 0 for f in rescued)
    assert failures.stat().st_size == limit - 100  # nothing torn, nothing added
    written = read_jsonl(out)
    assert s["paid_not_written"]["answers"] == len(server.ledger()) - len(written) - len(rescued)

    code, err = run_infer(server, *args, tmpdir=tmpdir)
    assert code == 4, err  # (the routing violations are permanent failures)
    assert f"took in {len(rescued)} failure record" in err and not os.path.exists(path)
    kept_now = [f for f in read_jsonl(failures) if f["kind"] == "routing_violation"]
    assert [f["id"] for f in kept_now[:len(rescued)]] == [f["id"] for f in rescued]
    s = json.loads(summary.read_text())
    ledger = server.ledger()
    # everything paid for is recorded somewhere, so the budget counts it on a rerun
    assert s["spend_total"] == pytest.approx(sum(x["cost"] for x in ledger), rel=1e-6)
    # paid twice: only prompts whose first answer broke the routing policy (a failure is
    # retried by the next run, as always); nothing written or rescued was sent again
    paid = Counter(x["request_user_text_sha256"] for x in ledger)
    messages = {p["id"]: p["messages"] for p in read_jsonl(prompts)}
    violated = {user_text_sha256(messages[f["id"]]) for f in rescued}
    assert {h for h, n in paid.items() if n > 1} <= violated and max(paid.values()) <= 2


@pytest.fixture
def tmpfs(tmp_path):
    """`tmpfs("2m")`: a real filesystem of that size (root only: mount)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mounted = []

    def mount(size: str):
        mnt = tmp_path / f"tmpfs-{uuid.uuid4().hex[:8]}"
        mnt.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", str(mnt)], check=True)


def fill(path, leave: int = 0) -> None:
    """Write PATH until its filesystem has LEAVE bytes free (0: until the disk refuses)."""
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        while True:
            st = os.statvfs(os.path.dirname(path))
            free = st.f_bavail * st.f_frsize
            if leave and free - leave < 4096:
                return
            try:
                f.write(chunk if not leave else chunk[:min(len(chunk), free - leave)])
            except OSError:
                return


class Stderr:
    """A running process's stderr, collected by a thread (tqdm writes frames, not lines)."""

    def __init__(self, proc: subprocess.Popen):
        self.text = ""
        self._thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for chunk in iter(lambda: stream.read1(4096), b""):
            self.text += chunk.decode("utf-8", "replace")

    def wait_for(self, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.text:
            assert proc.poll() is None, f"ended without {text!r}: {self.text[-2000:]}"
            assert time.monotonic() < deadline, f"no {text!r}: {self.text[-2000:]}"
            time.sleep(0.05)

    def join(self) -> str:
        self._thread.join(timeout=60)
        return self.text


def start_infer(server, *args, tmpdir) -> tuple[subprocess.Popen, Stderr]:
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key, "TMPDIR": str(tmpdir)}
    proc = subprocess.Popen([str(BIN / "kp-infer"), *map(str, args), "--base-url", server.base_url],
                            env=env, stderr=subprocess.PIPE)
    return proc, Stderr(proc)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["r.jsonl", "r.jsonl.zst"])
def test_a_tmpfs_filled_during_the_run_loses_no_paid_answer(standin, tmp_path, tmpfs, name):
    mnt = tmpfs("2m")
    server = standin(ledger=True, latency=0.2)
    prompts = make_prompts(tmp_path / "p.jsonl", 400)
    out, summary, tmpdir = mnt / name, tmp_path / "s.json", tmp_path / "tmp"
    tmpdir.mkdir()
    # 32 in flight: their answers must not all fit in the slack of the output's last page
    # when the filler lands (with 8, a few compressed .zst records sometimes did, and then
    # the run rightly waited for disk instead of meeting the failed write this test is about)
    args = (prompts, "-o", out, "--concurrency", "32", "--max-tokens", "1000", "--min-free-disk", "0",
            "--summary-json", summary)
    # the stand-in answers 100 and holds the rest until the disk is full: the filler lands
    # mid-run on any machine, with requests in flight whose answers then find no room
    server.configure(hold_after=100)
    proc, stderr = start_infer(server, *args, tmpdir=tmpdir)
    try:
        deadline = time.monotonic() + 120
        while (not out.exists() or out.stat().st_size < 20_000 // (4 if name.endswith(".zst") else 1)
               or server.stats()["held"] == 0):
            assert proc.poll() is None and time.monotonic() < deadline, stderr.text[-2000:]
            time.sleep(0.05)
        fill(mnt / "filler")  # another program takes the rest of the disk
        server.configure(hold_after=None)
        proc.wait(timeout=time_left())
    finally:
        if proc.poll() is None:
            proc.kill()
    err = stderr.join()
    _written, rescued = check_stopped_run(proc.returncode, err, out, summary, server, tmpdir,
                                          why="No space left on device")
    os.unlink(mnt / "filler")
    code, err = run_infer(server, *args, tmpdir=tmpdir)
    check_resumed_run(code, err, out, summary, server, tmpdir, prompts, 400, rescued, max_tokens=1000)


@pytest.mark.timeout(600)
def test_admission_waits_for_disk_and_goes_on_when_space_is_freed(standin, tmp_path, tmpfs):
    """The guard: a request is admitted only while the filesystem has room for the worst
    case of everything in flight plus --min-free-disk. On a nearly full tmpfs the run
    pauses (nothing in flight, nothing admitted, "waiting for disk" said and on the progress
    line), and finishes once space is freed, with no write ever refused."""
    mnt = tmpfs("4m")
    server = standin(ledger=True, latency=0.05)
    prompts = make_prompts(tmp_path / "p.jsonl", 200)
    out, summary = mnt / "r.jsonl", tmp_path / "s.json"
    # worst case per request: ~150 B of prompt line + 500 x 16 + 2048 = ~10 KiB; the margin
    # 1 MiB; ~100 KiB above it lets some tens of answers in before the guard stops admission
    fill(mnt / "filler", leave=1024 * 1024 + 100 * 1024)
    proc, stderr = start_infer(server, prompts, "-o", out, "--concurrency", "4", "--max-tokens",
                               "500", "--min-free-disk", "1M", "--summary-json", summary,
                               tmpdir=tmp_path)
    try:
        stderr.wait_for("kp-infer: waiting for disk: ", proc)
        # Near the limit admission pauses and resumes as answers are written; it stops for
        # good when, nothing in flight, the free space is below the margin plus one request.
        need = min(map(len, prompts.read_bytes().splitlines())) + 500 * 16 + 2048
        deadline = time.monotonic() + 120
        while True:
            stats, paused = server.stats(), len(whole_lines_of(out))
            st = os.statvfs(mnt)
            if (stats["in_flight"] == 0 and stats["completions_started"] == paused
                    and st.f_bavail * st.f_frsize < 1024 * 1024 + need):
                break
            assert time.monotonic() < deadline and proc.poll() is None, (stats, paused)
            time.sleep(0.05)
        assert 0 < paused < 200
        stderr.wait_for("waiting for disk, ", proc)  # the progress line says it too
        assert proc.poll() is None and server.stats()["completions_started"] == paused
        os.unlink(mnt / "filler")  # space freed: the run goes on by itself
        proc.wait(timeout=time_left())
    finally:
        if proc.poll() is None:
            proc.kill()
    err = stderr.join()
    assert proc.returncode == 0, err
    assert "kp-infer: disk space is back (" in err
    assert sorted(r["id"] for r in read_jsonl(out)) == [f"p{i:05d}" for i in range(200)]
    s = json.loads(summary.read_text())
    assert s["paid_not_written"]["answers"] == 0 and s["done"] == 200
    paid_once_each(server, prompts)


def whole_lines_of(path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1] if path.exists() else []


# -- a disk that cannot take the run (docs/robustness.md) ------------------------------------

def test_a_filesystem_without_room_for_one_request_is_exit_3_at_the_start(standin, tmp_path, tmpfs):
    """A 300 KB tmpfs under the default --min-free-disk (64 MiB) waited for ever with
    nothing sent; now one line names the filesystem, its free space and the need, exit 3."""
    mnt = tmpfs("300k")
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 20)
    code, err = run_infer(server, prompts, "-o", mnt / "r.jsonl", tmpdir=tmp_path)
    assert code == 3, err
    [line] = [x for x in err.splitlines() if x.startswith("kp-infer: no room")]
    assert f"free on the filesystem at {mnt}" in line and "--min-free-disk 64.0 MiB" in line
    assert "nothing was sent" in line
    assert server.stats()["requests"] == 0
    # --plan sends nothing and writes nothing: it still runs
    code, err = run_infer(server, prompts, "-o", mnt / "r.jsonl", "--plan", tmpdir=tmp_path)
    assert code == 0, err


@pytest.mark.timeout(600)
def test_waiting_for_disk_with_nothing_in_flight_stops_after_disk_wait(standin, tmp_path, tmpfs):
    """Admission waits for room; once nothing is in flight only freed space ends that wait,
    so after --disk-wait seconds the run stops (exit 3, resumable), the progress line having
    shown the time left; freed, the same command finishes, nothing paid twice."""
    mnt = tmpfs("4m")
    server = standin(ledger=True, latency=0.05)
    prompts = make_prompts(tmp_path / "p.jsonl", 200)
    out, summary = mnt / "r.jsonl", tmp_path / "s.json"
    fill(mnt / "filler", leave=1024 * 1024 + 100 * 1024)  # as the test above: some tens fit
    args = (prompts, "-o", out, "--concurrency", "4", "--max-tokens", "500",
            "--min-free-disk", "1M", "--summary-json", summary)
    code, err = run_infer(server, *args, "--disk-wait", "2", tmpdir=tmp_path,
                          env={"KP_PROGRESS_INTERVAL": "0.2"})
    assert code == 3, err
    assert "waiting for disk, nothing in flight, stops in " in err
    assert "(--disk-wait) with nothing in flight" in err
    written = len(read_jsonl(out))
    assert 0 < written < 200 and written == len(server.ledger())
    s = json.loads(summary.read_text())
    assert s["stop_reason"] == "disk" and s["paid_not_written"]["answers"] == 0
    os.unlink(mnt / "filler")
    code, err = run_infer(server, *args, tmpdir=tmp_path)
    assert code == 0, err
    assert sorted(r["id"] for r in read_jsonl(out)) == [f"p{i:05d}" for i in range(200)]
    paid_once_each(server, prompts)


def test_free_space_is_what_an_unprivileged_writer_may_use(tmp_path, monkeypatch):
    """statvfs's f_bavail, not f_bfree: the blocks a filesystem keeps for root (ext4's 5%)
    are not the output's, and kp-infer need not run as root. No filesystem these tests can
    mount tells the two apart (tmpfs reserves none), so statvfs is answered here with
    1 MiB available of 1 GiB free: one request at the default --max-tokens does not fit."""
    from kimipipe.errors import KPError
    from kimipipe.infer.disk import DiskGuard
    real = os.statvfs(tmp_path)
    fake = os.statvfs_result((real.f_bsize, 4096, real.f_blocks, (1 << 30) // 4096, 256,
                              real.f_files, real.f_ffree, real.f_favail, real.f_flag,
                              real.f_namemax))
    monkeypatch.setattr(os, "statvfs", lambda path: fake)
    guard = DiskGuard(str(tmp_path / "r.jsonl"), max_tokens=16384)
    assert guard.free() == 1 << 20
    assert not guard.fits(guard.worst_case(b"{}"))
    with pytest.raises(KPError, match=r"no room for the output .*: 1(\.0)? MiB free"):
        guard.check_room_at_start()


def test_a_zstd_frame_a_full_disk_left_open_is_closed_by_the_resume(tmp_path, tmpfs):
    """On a full tmpfs the 3 bytes that end a frame need a page of their own whenever the
    cut-back output ends within 3 bytes of a page's end: RecordWriter leaves the frame open
    after whole lines (writers.py), as documented. What must hold is the resume: its tail
    repair closes that frame, keeping every whole line, and the run appends after it."""
    from kimipipe.io import OutputWriteError, repair_and_report
    from kimipipe.writers import RecordWriter

    mnt = tmpfs("256k")
    out = mnt / "r.jsonl.zst"
    rng = random.Random(1)
    for _attempt in range(200):  # (the seed finds one in its first few)
        for name in os.listdir(mnt):
            os.unlink(mnt / name)
        fill(mnt / "filler", leave=rng.randrange(8192, 60000))
        writer = RecordWriter(str(out), append=True, durable=True)
        lines = []
        try:
            while True:
                line = json.dumps({"id": f"r{len(lines)}", "pad": "x" * rng.randrange(10, 3000)}).encode() + b"\n"
                writer.write_line(line)
                lines.append(line)
        except OutputWriteError:
            pass
        frame = zstandard.ZstdDecompressor().decompressobj()
        text = frame.decompress(out.read_bytes())
        if not frame.eof:
            break
    else:
        pytest.fail("no run left its frame open")
    assert text == b"".join(lines)  # open, after whole lines
    os.unlink(mnt / "filler")
    repair_and_report(str(out), report=lambda _said: None)  # what a resume does first
    with RecordWriter(str(out), append=True) as writer:
        writer.write_line(b'{"id": "after"}\n')
    assert [r["id"] for r in whole_records(out)] == [f"r{i}" for i in range(len(lines))] + ["after"]
