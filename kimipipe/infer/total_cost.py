"""`--total-cost`: one cap on what several kp-infer runs spend together (a whole build).

What counts against it: the spend recorded in this run's OUTPUT and `--failures` (as for
`--max-cost`), the spend recorded in every `--spent-in` file (other datasets' responses
and failures files: what each line cost by `records.record_cost`, a response's refused
answers included), read once at start (`open_total_cost`: finished lines only, another
run may be writing one; recorded/spend.py), and this run's spend since. Before a request is sent its worst case is reserved against the cap, as for
`--max-cost`, so the cap is never exceeded as long as providers bill at most their listed
prices.

Runs at the same time (`make -j`) share the cap through `--reservations FILE`: a small
JSON file (`contracts.Reservations`), locked with flock(2) while it is read and rewritten in place (one line, read up
to its newline, so that a longer old content left behind is never read: a rename per
update costs milliseconds on ext4, an in-place write microseconds). Each run keeps one
entry in it:

    {"token", "pid", "host", "proc_start", "label", "spent": USD this run,
     "claim": USD it may have in flight (>= its reservations), "ended": bool, "started",
     "died": true once another run found it dead (absent until then),
     "stuck": true while all it holds waits for room (absent until then)}

At start (`register`), under the lock, a run takes the snapshot S0 = the sum of every
entry's `spent` and adds its own entry; only THEN does it read the files (F0). Whatever an
entry had published by S0 was already written to that run's file (a run writes a record
before it publishes its spend), so F0 - S0 counts the files' spend once and the entries'
growth since S0 is added live. A request is admitted when, under the lock,

    F0 - S0 + sum(entries' spent now) + sum(live entries' claims) + own need <= cap

where own need = this run's spend + its reservations + the new request's worst case. A
run raises its published claim only under that check; it publishes its spend and gives
back the claim its settled requests no longer need at most every `PUBLISH_INTERVAL`
seconds (a stale entry overstates, never understates, what the run may spend: a settled
request's cost is at most the worst case still claimed for it). A run that cannot fit
waits while another live run holds a claim (it may give room back), and stops (exit 3)
when none does. A run whose prompts in progress all wait for room after a refused answer
(their worst cases still reserved for the next attempt) publishes itself `stuck`: its
claim frees nothing while it waits, so the others do not wait for it (two such runs
waiting for each other would wait forever).

What a run may commit without looking at the file again is what the cap last gave it
under the lock (`TotalCost.room`: its spend + the claim then taken). Publishing never
raises it: a refused answer's cost is spent while its prompt keeps its worst case for the
retry, so spend + claim grows past what was checked, and that growth is no room.

Entries of runs that ended keep their spend (other runs' snapshots count on it) and hold
no claim. A run found dead (its pid gone from this host, or reused: the process start
time differs) keeps its spend and loses its claim. The entries are dropped when a run
registers and finds no live one (nobody holds a snapshot any more; the files hold their
spend). The known loss: the answers a run killed with SIGKILL had in flight were billed
but never recorded, and a spend it wrote but had not yet published is missed by the runs
that took their snapshot before it was written; both are at most that run's claim when it
died, and the next start reads the files again. Entries on another host are taken as
alive: share a reservations file between the runs of one machine only.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
import time
from dataclasses import dataclass

import msgspec

from ..contracts import ReservationEntry, Reservations
from ..errors import ExitCode, KPError
from ..recorded.spend import expand_spent_in, recorded_spend
from .config import Files, Money

PUBLISH_INTERVAL = 0.5  # seconds between publications of a run's spend and claim


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces: the fields after it follow the last ')'
    fields = stat[stat.rfind(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 else None


_seen_alive: dict[tuple[int, str | None], float] = {}  # (pid, start) -> when last seen alive
SEEN_ALIVE_FOR = 1.0  # seconds a process seen alive is taken as alive without looking again


def _alive(entry: ReservationEntry, host: str) -> bool:
    if entry.ended:
        return False
    if entry.host != host:
        return True  # cannot be checked from here
    pid = entry.pid
    key = (pid, entry.proc_start)
    if time.monotonic() - _seen_alive.get(key, -SEEN_ALIVE_FOR) < SEEN_ALIVE_FOR:
        return True
    if _process_alive(pid, entry.proc_start):
        _seen_alive[key] = time.monotonic()
        return True
    return False


def _process_alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return started is None or _proc_start(pid) in (None, started)


_reservations_decoder = msgspec.json.Decoder(Reservations)


class ReservationFile:
    """The shared file, one entry per run (see the module docstring)."""

    def __init__(self, path: str, label: str = ""):
        self.path = path
        self.label = label
        self.host = socket.gethostname()
        self.token = secrets.token_hex(8)
        self.pid = os.getpid()
        self._fd: int | None = None

    # -- the locked read-modify-write -------------------------------------------------------
    def _locked(self):
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return _Lock(self._fd)

    def _load(self) -> list[ReservationEntry]:
        data = b""
        while chunk := os.pread(self._fd, 1 << 16, len(data)):
            data += chunk
        line = data.split(b"\n", 1)[0]
        if not line.strip():
            return []
        try:
            return _reservations_decoder.decode(line).entries
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise OSError(f"{self.path}: unreadable reservations file ({e}); remove it when "
                          "no kp-infer run is using it") from None

    def _save(self, entries: list[ReservationEntry]) -> None:
        # (json.dumps of the builtins: the file's bytes as they always were)
        data = json.dumps(msgspec.to_builtins(Reservations(entries=entries))).encode() + b"\n"
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))

    def _own(self, entries: list[ReservationEntry]) -> ReservationEntry:
        for e in entries:
            if e.token == self.token:
                return e
        entry = ReservationEntry(token=self.token, pid=self.pid, host=self.host,
                                 proc_start=_proc_start(self.pid), label=self.label,
                                 spent=0.0, claim=0.0, ended=False, started=time.time())
        entries.append(entry)
        return entry

    def _others(self, entries: list[ReservationEntry]) -> tuple[float, float]:
        """(what the other entries count now: spent + live claims, the live claims that
        may give room back: those of runs not stuck)."""
        used = frees = 0.0
        for e in entries:
            if e.token == self.token:
                continue
            used += e.spent
            if _alive(e, self.host):
                used += e.claim
                if e.stuck is not True:
                    frees += e.claim
            elif not e.ended:
                e.ended, e.died, e.claim = True, True, 0.0  # found dead: its claim goes
        return used, frees

    # -- what a run does ----------------------------------------------------------------------
    def register(self) -> float:
        """Add this run's entry; the snapshot S0 (every entry's spend), taken before the
        caller reads the files."""
        with self._locked():
            entries = self._load()
            if not any(_alive(e, self.host) for e in entries):
                entries = []  # nobody holds a snapshot of them any more
            snapshot = sum(e.spent for e in entries)
            self._own(entries)
            self._save(entries)
        return snapshot

    def claim(self, base: float, cap: float, spent: float,
              targets: list[float]) -> tuple[float | None, float, float]:
        """Publish SPENT and the first claim of TARGETS (largest first) that fits the cap;
        (the claim taken or None, the others' spent + live claims, their claims that may
        free room)."""
        with self._locked():
            entries = self._load()
            own = self._own(entries)
            used, claims = self._others(entries)
            taken = None
            for target in targets:
                if base + used + spent + target <= cap:
                    taken = target
                    break
            own.spent = spent
            # nothing fits: the claim still comes down to what is in flight (the last
            # target). Left as it was, a stale claim of two runs at the cap, each polling
            # here (which keeps its publisher quiet), held each other waiting forever.
            own.claim = taken if taken is not None else min(own.claim, targets[-1])
            self._save(entries)
        return taken, used, claims

    def publish(self, spent: float, claim: float, ended: bool = False,
                stuck: bool = False) -> tuple[float, float]:
        """Publish this run's spend and claim (STUCK: all it holds waits for room); (the
        others' spent + live claims, their claims that may give room back)."""
        with self._locked():
            entries = self._load()
            own = self._own(entries)
            own.spent, own.claim, own.ended = spent, claim, ended
            own.stuck = True if stuck else msgspec.UNSET
            others = self._others(entries)
            self._save(entries)
        return others

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _Lock:
    def __init__(self, fd: int):
        self.fd = fd

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)


@dataclass
class TotalCost:
    """The `--total-cost` cap as one run sees it.

    BASE is the spend counted at start: this run's OUTPUT and --failures, the --spent-in
    files, less the snapshot S0 when the cap is shared. Alone, a request fits when
    BASE + this run's spend + its reservations + the request's worst case <= CAP."""

    cap: float
    base: float
    shared: ReservationFile | None = None
    claim_held: float = 0.0  # published claim
    spent_published: float = 0.0
    # what this run may have spent and in flight together, as last checked against the cap
    # under the lock (its spend + the claim then taken): what `fits` lets through unchecked.
    # Publishing never raises it: a refused answer's cost is spent while the prompt keeps its
    # worst case reserved for the retry, so the published spend + claim grows past what was
    # checked, and that growth is room the cap never gave.
    room: float = 0.0
    others_used: float = 0.0  # other entries' spent + live claims, when last seen
    others_claims: float = 0.0  # other live entries' claims that may free room, when last seen
    stuck: bool = False  # as last published
    _last_publish: float = 0.0

    def fits(self, spent_this_run: float, reserved: float, amount: float) -> bool:
        need = spent_this_run + reserved + amount
        if self.shared is None:
            return self.base + need <= self.cap
        if self.room >= need:
            return True  # covered by what the cap last gave this run
        # the claim covers exactly what is in flight (no claim ahead: what one run holds,
        # the others cannot use), or, when the request does not fit, gives back the rest
        taken, self.others_used, self.others_claims = self.shared.claim(
            self.base, self.cap, spent_this_run, [reserved + amount, reserved])
        self.spent_published = spent_this_run
        if taken is not None:
            self.claim_held = taken
            self.room = spent_this_run + taken
        else:  # (the file's claim came down to what is in flight: ReservationFile.claim)
            self.claim_held = min(self.claim_held, reserved)
            self.room = min(self.room, spent_this_run + reserved)
        self._last_publish = time.monotonic()
        return taken is not None and taken >= reserved + amount

    def publish(self, spent_this_run: float, reserved: float, force: bool = False,
                stuck: bool = False) -> None:
        """Give back the claim settled requests no longer need and publish the spend (at
        most every PUBLISH_INTERVAL seconds unless FORCE); STUCK: every prompt in progress
        waits for room (see the module docstring)."""
        if self.shared is None:
            return
        now = time.monotonic()
        # (a change of STUCK goes out at once: a look for room (`claim`) also counts as a
        # publish, and two runs whose prompts all wait for room each look every interval,
        # so an interval's quiet would never come and neither would say it is stuck)
        if not force and stuck == self.stuck and now - self._last_publish < PUBLISH_INTERVAL:
            return
        if not force and (spent_this_run, reserved, stuck) == (
                self.spent_published, self.claim_held, self.stuck):
            return
        self.others_used, self.others_claims = self.shared.publish(spent_this_run, reserved,
                                                                   stuck=stuck)
        self.spent_published, self.claim_held, self.stuck = spent_this_run, reserved, stuck
        # a claim given back is room given back; a spend grown past the room is not room
        self.room = min(self.room, spent_this_run + reserved)
        self._last_publish = now

    def others_may_free_room(self) -> bool:
        """Whether another live run holds a claim (a run that cannot fit waits for it)."""
        return self.shared is not None and self.others_claims > 0

    def remaining(self, spent_this_run: float) -> float:
        return max(0.0, self.cap - self.base - self.others_used - spent_this_run)

    def close(self, spent_this_run: float) -> None:
        if self.shared is None:
            return
        try:
            self.shared.publish(spent_this_run, 0.0, ended=True)
        finally:
            self.shared.close()


def open_total_cost(money: Money, files: Files, api: str, plan: bool, spent: float
                    ) -> tuple[TotalCost, list[str], float]:
    """--total-cost (MONEY's) for a run whose OUTPUT and --failures (FILES') record SPENT
    at API (the host whose answers count): register with --reservations (not for --plan,
    PLAN), THEN read the --spent-in files (in this order: see the module docstring). The
    cap, the files read and the spend they record."""
    shared = None
    snapshot = 0.0
    if money.reservations and not plan:
        shared = ReservationFile(money.reservations, label=files.output)
        try:
            snapshot = shared.register()
        except OSError as e:
            shared.close()
            raise KPError(f"--reservations: {e}", ExitCode.USAGE) from None
    try:
        spent_in = expand_spent_in(money.spent_in, [files.output, files.failures or ""])
        elsewhere = sum(recorded_spend(path, api) for path in spent_in)
    except BaseException:
        if shared is not None:
            TotalCost(money.total_cost, 0.0, shared).close(0.0)
        raise
    return TotalCost(money.total_cost, spent + elsewhere - snapshot, shared), spent_in, elsewhere
