"""kp-infer's progress line: what a user watching a paid run needs first, fitted to a width.

`ProgressSnapshot` is the run's state at one moment (`Run.snapshot()`, infer/run_progress.py
fills it); `progress_line(snapshot, width)` turns it into one line of at most WIDTH
columns. Its parts, most important first; those that do not fit are left off from the end:

    kp-infer: 120/400, 64 in flight (max 64), $1.23 of $10, 429s 12, 2 failed, ETA 4m10s,
    oldest 41s, retries 3, 5 in back-off, 850 tok/s, 1.2M tok left

- `120/400`: requests finished this run (answered or failed) of those to do (a
  conversation's turns each count; turns of a conversation ended early leave the total);
  `kp-infer: ` leads only when the whole line fits. A run with conversations then shows
  `conversations 30 done, 64 in progress` (done: every turn answered, or cut by
  max_tokens).
- in flight, and what limits it: `(max 64)` is --concurrency; `(limit 48 after 429s)` when
  the adaptive limit shrank (a count above it is the requests sent before it shrank, still
  finishing); then what holds admission back if anything but a free slot does:
  `waiting for disk`, `waiting for --max-cost room` (reservations of the worst case),
  `waiting for --total-cost room`, `waiting for --token-budget room`, `all sent` once the
  input is exhausted; after a stop, `stopping (interrupted), 41s grace left`: the
  requests in flight get at most that long (--grace) before they are cancelled.
- `$1.23 of $10`: the spend counted against --max-cost (this run and the earlier ones
  recorded in the output), of the cap; without a cap the spend of this run. The slot for
  money in flight (`$0.40 in flight of $2.00`, a ceiling of dollars in flight) comes next
  when the run sets `money_in_flight`.
- `429s` (rate limits met), prompts failed this run, `ETA`, `oldest` (the age of the
  oldest prompt in flight, retries included: a hung request shows here), `retries` (other
  retryable failures), prompts waiting in back-off before their next attempt, completion
  tokens per second, and what is left of --token-budget.

A terminal 100 columns wide or more also gets a small bar after the count. When stderr is
not a terminal (make, a log file), cli.progress prints the line whole (no width limit, no
bar) as a plain line every KP_PROGRESS_INTERVAL seconds (default 10) instead.
"""

from __future__ import annotations

from dataclasses import dataclass

SEPARATOR = ", "


@dataclass
class ProgressSnapshot:
    """A kp-infer run at one moment, as the progress line shows it."""

    finished: int  # answered or failed this run
    total: int  # requests to send this run (each turn of a conversation is one)
    conversations: tuple[int, int] | None = None  # (ended this run, in progress), if any
    failed: int = 0
    in_flight: int = 0  # requests sent and not finished (holding a concurrency slot)
    limit: int = 0  # the adaptive concurrency limit now
    concurrency: int = 0  # --concurrency: the limit's ceiling
    waiting: str | None = None  # what holds admission back now ("disk", "--max-cost room", ...)
    stopping: str | None = None  # why the run stopped admitting, once it did
    grace_left: float | None = None  # seconds the requests in flight may still take
    spent: float = 0.0  # counted against the cap (this run, and earlier runs if capped)
    cap: float | None = None  # --max-cost
    # (dollars in flight, their ceiling): shown when set, e.g. by an in-flight money limit
    money_in_flight: tuple[float, float] | None = None
    rate_limited: int = 0  # 429s met
    retries: int = 0  # other retryable failures
    eta: float | None = None  # seconds
    oldest: float | None = None  # age in seconds of the oldest prompt in flight
    backing_off: int = 0  # prompts waiting before their next attempt
    tokens_per_s: float = 0.0
    tokens_left: int | None = None  # of --token-budget


def progress_line(snap: ProgressSnapshot, width: int | None = None, name: str = "kp-infer") -> str:
    """The line for SNAP in at most WIDTH columns (None: no limit, and no bar). NAME leads
    it when everything fits; when not, it goes first, then the parts from the last."""
    head = f"{snap.finished:,}/{snap.total:,}"
    parts = [head, *_parts(snap)]
    if snap.conversations is not None:
        ended, going = snap.conversations
        parts.insert(1, f"conversations {ended:,} done, {going:,} in progress")
    line = f"{name}: {SEPARATOR.join(parts)}"
    if width is None:
        return line
    if len(line) <= width and width >= 100 and snap.total:
        room = min(30, width - len(line) - 3)
        if room >= 10:
            filled = room * min(snap.finished, snap.total) // snap.total
            parts[0] = f"{head} [{'#' * filled}{'.' * (room - filled)}]"
        return f"{name}: {SEPARATOR.join(parts)}"[:width]
    if len(line) <= width:
        return line
    while len(parts) > 1 and len(SEPARATOR.join(parts)) > width:
        parts.pop()
    return SEPARATOR.join(parts)[:width]


def _parts(snap: ProgressSnapshot) -> list[str]:
    parts = [_in_flight(snap),
             f"{money(snap.spent)} of {money(snap.cap)}" if snap.cap is not None
             else f"{money(snap.spent)} spent"]
    if snap.money_in_flight is not None:
        in_flight, ceiling = snap.money_in_flight
        parts.append(f"{money(in_flight)} in flight of {money(ceiling)}")
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


def money(dollars: float) -> str:
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
