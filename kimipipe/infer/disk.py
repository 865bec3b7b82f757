"""The disk guard: no request is admitted unless the output's filesystem can take its answer.

Like the money guard (infer/budget.py), it reserves each request's worst case when the
request is admitted and releases it when the answer is written (or given up on). A request
is admitted only while

    free space on the output's filesystem >= reserved (everything in flight)
                                             + the new request's worst case + the margin

where free space is what `statvfs` gives an unprivileged writer (f_bavail x f_frsize) and
the margin is `--min-free-disk` (default 64 MiB: room for the failures file, the summary and
whatever else writes to that disk meanwhile). Below it admission waits: the progress line
and a message say "waiting for disk", the requests in flight finish and are written, and
admission goes on as soon as space is freed (free space is read again every second).

Waiting with requests in flight is right: their answers free their reservations. Waiting
with nothing in flight only ends when someone frees space, so it is bounded: after
`--disk-wait` seconds (default 600) with nothing in flight the run stops, exit 3,
resumable, as a full disk stops it; the progress line shows the time left
(`waiting for disk, nothing in flight, stops in 9m58s`). A filesystem that cannot take one
request's worst case plus the margin at the start is exit 3 before anything is sent
(`check_room_at_start`): one line naming the filesystem, its free space and the need.

A request's worst case is the size of its response record:

    len(prompt line) + max_tokens x BYTES_PER_TOKEN + RECORD_OVERHEAD

- The prompt line is passed through whole (every field of the prompt record).
- `max_tokens` bounds the completion, reasoning included. BYTES_PER_TOKEN = 16: a token of
  a BPE vocabulary like Kimi's covers about 3-5 bytes of UTF-8 in prose, code and CJK
  text, and JSON escaping (msgspec writes non-ASCII as UTF-8 and escapes `"`, `\\` and
  control characters; `\\n` and `\\"` are the ones text has) at most doubles text made of
  them; 16 is twice that. It is not an absolute bound: the absolute one is the vocabulary's
  longest token, escaped, per token (a run of 64 spaces or dashes is one token: 64 bytes,
  and a control character costs 6), which for a 16k cap would reserve ~1-6 MB per request
  and stall any large run on an ordinary disk. An answer made mostly of such tokens can
  exceed the reservation; the second layer covers that case and a disk filled by another
  program: a write that still fails puts the answer in the rescue file (infer/rescue.py).
- RECORD_OVERHEAD = 2 KiB: kp-infer's own fields (model, provider, generation ID, usage,
  finish reason, attempts, key names): a few hundred bytes.

A zstd output takes less than this; the bound is the uncompressed size (zstd's worst-case
expansion of incompressible data is a fraction of a percent).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

from ..errors import ExitCode, KPError

BYTES_PER_TOKEN = 16
RECORD_OVERHEAD = 2048
DEFAULT_MARGIN = 64 * 1024 * 1024
DEFAULT_DISK_WAIT = 600.0
POLL_SECONDS = 1.0
SHOW_SECONDS = 10.0  # the waiting line redrawn (off a terminal: a plain line) this often


def human_bytes(n: float) -> str:
    """`512 B`, `1.5 KiB`, `64.0 MiB`, `2.3 GiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # (not reached)


def mount_point(path: str) -> str:
    """The mount point of the filesystem holding PATH (an existing directory)."""
    path = os.path.realpath(path)
    while not os.path.ismount(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def short_duration(seconds: float) -> str:
    """`45s`, `9m58s`, `1h02m`."""
    s = max(0, int(seconds + 0.999))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class DiskGuard:
    """Free space on the filesystem of output PATH against the worst case in flight.

    PATH `-` (stdout) has no filesystem to watch: every request fits. GIVE_UP_AFTER
    (--disk-wait): seconds of waiting for room with nothing in flight before the run stops
    (`gave_up` is then set, and `wait_for_room` returns False).
    """

    def __init__(self, path: str, max_tokens: int, margin: int = DEFAULT_MARGIN,
                 give_up_after: float = DEFAULT_DISK_WAIT):
        self.path = path
        self.directory = None if path == "-" else os.path.dirname(os.path.abspath(path))
        self.max_tokens = max_tokens
        self.margin = margin
        self.give_up_after = give_up_after
        self.reserved = 0
        self.waiting = False  # admission is waiting for disk (shown on the progress line)
        self.gave_up = False  # waited --disk-wait seconds with nothing in flight: stop
        self._said_at: float | None = None  # when "waiting for disk" was last said
        self._idle_since: float | None = None  # waiting, and nothing in flight, since

    def waiting_for(self) -> str:
        """What the progress line says admission waits for: `disk`, and with nothing in
        flight the time left before the run stops."""
        if self._idle_since is None:
            return "disk"
        left = self.give_up_after - (time.monotonic() - self._idle_since)
        return f"disk, nothing in flight, stops in {short_duration(left)}"

    def check_room_at_start(self) -> None:
        """Exit 3 before anything is sent when the filesystem cannot take even one request's
        worst case plus the margin: the run would wait for room with nothing in flight."""
        if self.directory is None or not os.path.isdir(self.directory):
            return
        free = self.free()
        if self.directory is None:
            return
        need = self.worst_case(b"") + self.margin
        if free < need:
            raise KPError(
                f"no room for the output {self.path}: {human_bytes(free)} free on the "
                f"filesystem at {mount_point(self.directory)}, and one request needs up to "
                f"{human_bytes(self.worst_case(b''))} (--max-tokens {self.max_tokens:,}) plus "
                f"--min-free-disk {human_bytes(self.margin)}: {human_bytes(need)}; free some "
                "space (or lower --max-tokens or --min-free-disk) and rerun; nothing was sent",
                ExitCode.BUDGET)

    def worst_case(self, prompt_line: bytes) -> int:
        """The largest response record a request for PROMPT_LINE can produce (bytes)."""
        return len(prompt_line) + self.max_tokens * BYTES_PER_TOKEN + RECORD_OVERHEAD

    def free(self) -> int:
        try:
            st = os.statvfs(self.directory)
        except OSError:  # a filesystem that cannot say: not guarded (the rescue file remains)
            self.directory = None
            return 0
        return st.f_bavail * st.f_frsize

    def needed(self, amount: int) -> int:
        return self.reserved + amount + self.margin

    def fits(self, amount: int) -> bool:
        if self.directory is None:
            return True
        free = self.free()
        return self.directory is None or free >= self.needed(amount)

    def reserve(self, amount: int) -> None:
        self.reserved += amount

    def release(self, amount: int) -> None:
        self.reserved = max(0, self.reserved - amount)

    async def wait_for_room(self, amount: int, stopping: asyncio.Event, settled: asyncio.Event,
                            say: Callable[[str], None], show: Callable[[str], None]) -> bool:
        """Wait until AMOUNT more fits; False when the run stops first.

        Wakes when a request in flight settles (its reservation is released) and every
        POLL_SECONDS (space freed by someone else sends no event). Near the limit admission
        pauses and resumes with every answer written, so SAY gets the "waiting for disk"
        line at most once a minute, and "disk space is back" only when free space grew (it
        was freed, not just released by the run); SHOW(what) redraws the progress line with
        what admission waits for (`waiting_for()`).
        """
        if self.fits(amount):
            return True
        self.waiting = True
        free_before = self.free()
        now = time.monotonic()
        if self._said_at is None or now - self._said_at >= 60:
            self._said_at = now
            short = self.needed(amount) - free_before
            say(f"kp-infer: waiting for disk: {human_bytes(free_before)} free on the filesystem "
                f"of {self.path}, {human_bytes(short)} short of what admission needs (the worst "
                f"case of the requests in flight and the next one, "
                f"{human_bytes(self.reserved + amount)}, plus --min-free-disk "
                f"{human_bytes(self.margin)}); free some space and the run goes on")
        if self.reserved == 0:
            self._idle_since = now
        show(self.waiting_for())
        shown_at = now
        try:
            while not stopping.is_set():
                # nothing in flight (no reservation left): only freed space ends the wait,
                # so it is bounded by --disk-wait
                if self.reserved == 0:
                    if self._idle_since is None:  # the last answer is in: the clock starts
                        self._idle_since = time.monotonic()
                        show(self.waiting_for())
                    if time.monotonic() - self._idle_since >= self.give_up_after:
                        self.gave_up = True
                        say(f"kp-infer: no room for {self.path} after waiting "
                            f"{short_duration(self.give_up_after)} (--disk-wait) with nothing in "
                            f"flight: {human_bytes(self.free())} free, "
                            f"{human_bytes(self.needed(amount) - self.free())} short of the next "
                            f"request's worst case plus --min-free-disk")
                        return False
                else:
                    self._idle_since = None
                settled.clear()
                try:
                    await asyncio.wait_for(settled.wait(), timeout=POLL_SECONDS)
                except TimeoutError:
                    pass
                if stopping.is_set():
                    return False
                if self.fits(amount):
                    free = self.free()
                    if free > free_before + amount:
                        say(f"kp-infer: disk space is back ({human_bytes(free)} free): going on")
                        self._said_at = None
                    return True
                if time.monotonic() - shown_at >= SHOW_SECONDS:  # the time left moves
                    shown_at = time.monotonic()
                    show(self.waiting_for())
            return False
        finally:
            self.waiting = False
            self._idle_since = None
            show("disk")
