"""kp-infer's progress line: what a user watching a paid run needs first, fitted to a width.

`ProgressSnapshot` is the run's state at one moment (`RunProgress.snapshot()` reads it from
the parts of the run it is given); `progress_line(snapshot, width)` turns it into one line
of at most WIDTH columns. `RunProgress` also decides when the line is redrawn: at most
twice a second on a terminal, and now and then by a ticker (the ETA, the oldest request's
age and a stop's grace move with time), or as a plain line every KP_PROGRESS_INTERVAL
seconds when stderr is not a terminal. Its parts, most important first; those that do not fit are left off from the end:

    kp-infer: 120/400, 64 in flight (max 64), $1.23 of $10, 429s 12, 2 failed, ETA 4m10s,
    oldest 41s, retries 3, 5 in back-off, 850 tok/s, 1.2M tok left

- `120/400`: requests finished this run (answered or failed) of those planned as it
  started (a conversation's turns each count); the total never moves. `kp-infer: ` leads
  only when the whole line fits. A run with conversations then shows `conversations 30
  done, 64 in progress` (done: every turn answered, or cut by max_tokens), and `, 2 later
  turns not sent` once a conversation ended before its last turn (a turn cut by
  max_tokens, a failed turn, a stop): those requests are planned and will not be sent, so
  a run that ends with them shows e.g. `123/125, ... 2 later turns not sent`.
- in flight, and what limits it: `(max 64)` is --concurrency; `(limit 48 after 429s)` when
  the adaptive limit shrank (a count above it is the requests sent before it shrank, still
  finishing); then what holds admission back if anything but a free slot does:
  `waiting for disk`, `waiting for --max-cost room` (reservations of the worst case),
  `waiting for --total-cost room`, `waiting for --token-budget room`, `all sent` once the
  input is exhausted; after a stop, `stopping (interrupted), 41s grace left`: the
  requests in flight get at most that long (--grace) before they are cancelled.
- `$1.23 of $10`: the spend counted against the cap that binds (the one with less room
  left), of that cap: --max-cost (this run and the earlier ones recorded in the output), or
  --total-cost, then `$4.56 of $20 total` (the build's spend, every --spent-in file
  included); without a cap the spend of this run. The slot for
  money in flight (`$0.40 in flight of $2.00`, a ceiling of dollars in flight) comes next
  when the run sets `money_in_flight`.
- `429s` (rate limits met), prompts failed this run (not those a stop left unsent), `ETA`, `oldest` (the age of the
  oldest prompt in flight, retries included: a hung request shows here), `retries` (other
  retryable failures), prompts waiting in back-off before their next attempt, completion
  tokens per second, and what is left of --token-budget.

A terminal 100 columns wide or more also gets a small bar after the count. When stderr is
not a terminal (make, a log file), terminal.progress prints the line whole (no width limit, no
bar) as a plain line every KP_PROGRESS_INTERVAL seconds (default 10) instead.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..kinds import RetryCause
from ..terminal import progress_interval, stderr_width
from .report import permanent_failures

if TYPE_CHECKING:
    from .budget import Budget
    from .inflight import MoneyInFlight
    from .limiter import AdaptiveLimiter
    from .report import Stats
    from .state import RunState

SEPARATOR = ", "


@dataclass
class ProgressSnapshot:
    """A kp-infer run at one moment, as the progress line shows it."""

    finished: int  # answered or failed this run
    total: int  # requests planned as the run started (each turn of a conversation is one)
    conversations: tuple[int, int] | None = None  # (ended this run, in progress), if any
    not_sent: int = 0  # planned turns of conversations that ended early: never sent
    failed: int = 0
    in_flight: int = 0  # requests sent and not finished (holding a concurrency slot)
    limit: int = 0  # the adaptive concurrency limit now
    concurrency: int = 0  # --concurrency: the limit's ceiling
    waiting: str | None = None  # what holds admission back now ("disk", "--max-cost room", ...)
    stopping: str | None = None  # why the run stopped admitting, once it did
    grace_left: float | None = None  # seconds the requests in flight may still take
    spent: float = 0.0  # counted against the cap (this run, and earlier runs if capped)
    cap: float | None = None  # the cap that binds: the one with less room left
    cap_is_total: bool = False  # that cap is --total-cost (the build's), not --max-cost
    # (dollars in flight, their ceiling): shown when set, e.g. by an in-flight money limit
    money_in_flight: tuple[float, float] | None = None
    rate_limited: int = 0  # 429s met
    retries: int = 0  # other retryable failures
    eta: float | None = None  # seconds
    oldest: float | None = None  # age in seconds of the oldest prompt in flight
    backing_off: int = 0  # prompts waiting before their next attempt
    tokens_per_s: float = 0.0
    tokens_left: int | None = None  # of --token-budget


class RunProgress:
    """The progress line of one run: BAR (the tqdm bar whose description is the line, or a
    disabled one) and the parts whose state it shows (it reads them, and writes nothing of
    theirs)."""

    def __init__(self, bar, grace: float, concurrency: int, todo: int, state: RunState,
                 stats: Stats, budget: Budget, limiter: AdaptiveLimiter, money: MoneyInFlight,
                 terminal: bool, conversations=None):
        self.bar = bar
        self.conversations = conversations  # a ConversationQueue when the run has any
        self.grace = grace  # (--grace: the time a stop leaves, shown)
        self.concurrency = concurrency  # the run's limit, the servers' slots included
        self.todo = todo
        self.state = state
        self.stats = stats
        self.budget = budget
        self.limiter = limiter
        self.money = money
        self.terminal = terminal  # else plain progress lines now and then
        self._last_shown = 0.0

    def snapshot(self) -> ProgressSnapshot:
        """The run now, for the progress line."""
        now = time.monotonic()
        stats, budget, state = self.stats, self.budget, self.state
        ended_unanswered = sum(stats.failed.values())
        finished = stats.done + ended_unanswered
        # failed: for themselves; a prompt a stop left unsent (STOPPED) is the stop's
        failed = permanent_failures(stats.failed)
        elapsed = max(1e-6, now - stats.started)
        conversations = self.conversations
        # requests planned (each turn counts): a stable total; the turns of conversations
        # ended early are said apart, not taken off it (the count would move under the user)
        total = self.todo
        not_sent = conversations.turns_not_sent if conversations else 0
        left = max(0, total - finished - not_sent)
        oldest = next(iter(state.in_progress.values()), None)
        rate_limited = stats.retries[RetryCause.RATE_LIMITED]
        ceiling = self.money.ceiling()
        grace_left = None
        if state.stopped_at is not None:
            grace_left = max(0.0, self.grace - (now - state.stopped_at))
        return ProgressSnapshot(
            finished=finished, total=total, failed=failed, not_sent=not_sent,
            conversations=((conversations.done + conversations.cut, len(conversations.open))
                           if conversations is not None else None),
            in_flight=self.limiter.in_flight, limit=self.limiter.current,
            concurrency=self.concurrency, waiting=state.waiting,
            stopping=state.stop_reason.slug if state.stop_reason else None,
            grace_left=grace_left,
            **binding_cap(budget),
            rate_limited=rate_limited, retries=sum(stats.retries.values()) - rate_limited,
            eta=(left * elapsed / finished if finished and left and not state.stopping.is_set()
                 else None),
            oldest=now - oldest if oldest is not None else None,
            # shown when it may bind: half used, or OpenRouter's in-flight 402s met
            money_in_flight=((self.money.amount, ceiling) if ceiling is not None
                             and (self.money.cuts or self.money.amount >= ceiling / 2) else None),
            backing_off=max(0, len(state.in_progress) - self.limiter.in_flight),
            tokens_per_s=stats.completion_tokens / elapsed,
            tokens_left=(max(0, budget.token_budget - budget.tokens)
                         if budget.token_budget else None))

    def finished_one(self) -> None:
        """A prompt answered or failed."""
        self.bar.update(1)

    def show(self, now: bool = False, draw: bool = True) -> None:
        """The line: on a terminal at most twice a second, or NOW; off a terminal a plain
        line only when NOW (the ticker, or a change of state worth a line of its own)."""
        if self.bar.disable:
            return
        clock = time.monotonic()
        if not now and draw and clock - self._last_shown < 0.5:
            return
        self._last_shown = clock
        width = stderr_width() - 1 if self.terminal else None  # -1: no wrap at the last column
        self.bar.set_description_str(progress_line(self.snapshot(), width), refresh=False)
        if draw and (now or self.terminal):
            self.bar.refresh()

    async def tick(self) -> None:
        """Redraw now and then, not only when a prompt finishes: the ETA, the age of the
        oldest request and a stop's grace move with time."""
        interval = 1.0 if self.terminal else progress_interval()
        while True:
            await asyncio.sleep(interval)
            self.show(now=True)


def binding_cap(budget) -> dict:
    """The money part of the line: the cap with less room left, and the spend counted
    against it (--max-cost: this output's; --total-cost: the build's, every --spent-in file
    and the other runs' included), or this run's spend when there is no cap."""
    caps = []
    if budget.max_cost is not None:
        caps.append((budget.max_cost - budget.spent, budget.spent, budget.max_cost, False))
    if budget.total is not None:
        left = budget.total.remaining(budget.spent_this_run)
        caps.append((left, budget.total.cap - left, budget.total.cap, True))
    if not caps:
        return {"spent": budget.spent_this_run, "cap": None}
    _left, spent, cap, is_total = min(caps, key=lambda c: c[0])
    return {"spent": spent, "cap": cap, "cap_is_total": is_total}


def progress_line(snap: ProgressSnapshot, width: int | None = None, name: str = "kp-infer") -> str:
    """The line for SNAP in at most WIDTH columns (None: no limit, and no bar). NAME leads
    it when everything fits; when not, it goes first, then the parts from the last."""
    head = f"{snap.finished:,}/{snap.total:,}"
    parts = [head, *_parts(snap)]
    if snap.conversations is not None:
        ended, going = snap.conversations
        parts.insert(1, f"conversations {ended:,} done, {going:,} in progress"
                     + (f", {snap.not_sent:,} later turns not sent" if snap.not_sent else ""))
    line = f"{name}: {SEPARATOR.join(parts)}"
    if width is None:
        return line
    if len(line) <= width and width >= 100 and snap.total:
        room = min(30, width - len(line) - 3)
        if room >= 10:
            filled = room * min(snap.finished + snap.not_sent, snap.total) // snap.total
            parts[0] = f"{head} [{'#' * filled}{'.' * (room - filled)}]"
        return f"{name}: {SEPARATOR.join(parts)}"[:width]
    if len(line) <= width:
        return line
    while len(parts) > 1 and len(SEPARATOR.join(parts)) > width:
        parts.pop()
    return SEPARATOR.join(parts)[:width]


def _parts(snap: ProgressSnapshot) -> list[str]:
    parts = [_in_flight(snap),
             f"{line_money(snap.spent)} of {line_money(snap.cap)}" + (" total" if snap.cap_is_total else "")
             if snap.cap is not None else f"{line_money(snap.spent)} spent"]
    if snap.money_in_flight is not None:
        in_flight, ceiling = snap.money_in_flight
        parts.append(f"{line_money(in_flight)} in flight of {line_money(ceiling)}")
    if snap.rate_limited:
        parts.append(f"429s {snap.rate_limited:,}")
    if snap.failed:
        parts.append(f"{snap.failed:,} failed")
    if snap.eta is not None:
        parts.append(f"ETA {duration(snap.eta)}")
    if snap.oldest is not None:
        parts.append(f"oldest {duration(snap.oldest)}")
    if snap.retries:
        parts.append(f"retries {snap.retries:,}")
    if snap.backing_off:
        parts.append(f"{snap.backing_off:,} in back-off")
    parts.append(f"{snap.tokens_per_s:,.0f} tok/s")
    if snap.tokens_left is not None:
        parts.append(f"{short_count(snap.tokens_left)} tok left")
    return parts


def _in_flight(snap: ProgressSnapshot) -> str:
    """The requests in flight and what limits them: one part, never left off."""
    text = f"{snap.in_flight:,} in flight"
    if snap.stopping is not None:
        grace = (f", {duration(snap.grace_left)} grace left"
                 if snap.grace_left is not None and snap.in_flight else "")
        return f"{text}, stopping ({snap.stopping}){grace}"
    if snap.waiting == "all sent":
        return f"{text}, all sent"
    if snap.waiting:
        return f"{text}, waiting for {snap.waiting}"
    if snap.limit < snap.concurrency:
        return f"{text} (limit {snap.limit:,} after 429s)"
    return f"{text} (max {snap.limit:,})"


def line_money(dollars: float) -> str:
    """`$0.0123` under a dollar, `$12.34` above (`$10` when whole), `$1,234` from a thousand."""
    if dollars >= 1000:
        return f"${dollars:,.0f}"
    if dollars == int(dollars):
        return f"${int(dollars)}"
    if dollars >= 1:
        return f"${dollars:,.2f}"
    return f"${dollars:.4f}"


def duration(seconds: float) -> str:
    """`41s`, `4m10s`, `2h05m`."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def short_count(n: int) -> str:
    """`950`, `12.3k`, `1.2M`."""
    if n < 1000:
        return f"{n}"
    if n < 1_000_000:
        return f"{n / 1000:.1f}k"
    return f"{n / 1_000_000:.1f}M"
