"""The run's side of kp-infer's progress line: its snapshot, and when the line is redrawn.

`RunProgress` is mixed into `infer.run.Run`: `snapshot()` reads the run's state into a
`ProgressSnapshot`, which infer/progress.py turns into one line fitted to the terminal;
`_show_progress` redraws it at most twice a second on a terminal, and a ticker redraws it
now and then (the ETA, the oldest request's age and a stop's grace move with time), or
prints a plain line every KP_PROGRESS_INTERVAL seconds when stderr is not a terminal.
"""

from __future__ import annotations

import asyncio
import time

from ..cli import progress_interval, stderr_width
from .progress import ProgressSnapshot, progress_line


class RunProgress:
    """Mixed into `Run`, whose state it reads (stats, budget, limiter, money, prepared,
    in_progress, waiting, stop_reason, stopped_at, stopping, progress, terminal)."""

    def snapshot(self) -> ProgressSnapshot:
        """The run now, for the progress line (infer/progress.py)."""
        now = time.monotonic()
        stats, budget = self.stats, self.budget
        failed = sum(stats.failed.values())
        finished = stats.done + failed
        elapsed = max(1e-6, now - stats.started)
        left = max(0, self.prepared.todo - finished)
        oldest = next(iter(self.in_progress.values()), None)
        rate_limited = stats.retries["429"]
        ceiling = self.money.ceiling()
        grace_left = None
        if self.stopped_at is not None:
            grace_left = max(0.0, self.config.grace - (now - self.stopped_at))
        return ProgressSnapshot(
            finished=finished, total=self.prepared.todo, failed=failed,
            in_flight=self.limiter.in_flight, limit=self.limiter.current,
            concurrency=self.config.concurrency, waiting=self.waiting,
            stopping=self.stop_reason.slug if self.stop_reason else None, grace_left=grace_left,
            spent=budget.spent if budget.max_cost is not None else budget.spent_this_run,
            cap=budget.max_cost,
            rate_limited=rate_limited, retries=sum(stats.retries.values()) - rate_limited,
            eta=left * elapsed / finished if finished and left and not self.stopping.is_set() else None,
            oldest=now - oldest if oldest is not None else None,
            # shown when it may bind: half used, or OpenRouter's in-flight 402s met
            money_in_flight=((self.money.amount, ceiling) if ceiling is not None
                             and (self.money.cuts or self.money.amount >= ceiling / 2) else None),
            backing_off=max(0, len(self.in_progress) - self.limiter.in_flight),
            tokens_per_s=stats.completion_tokens / elapsed,
            tokens_left=(max(0, budget.token_budget - budget.tokens)
                         if budget.token_budget else None))

    def _show_progress(self, now: bool = False, draw: bool = True) -> None:
        """The line: on a terminal at most twice a second, or NOW; off a terminal a plain
        line only when NOW (the ticker, or a change of state worth a line of its own)."""
        if self.progress.disable:
            return
        clock = time.monotonic()
        if not now and draw and clock - self._last_shown < 0.5:
            return
        self._last_shown = clock
        width = stderr_width() - 1 if self.terminal else None  # -1: no wrap at the last column
        self.progress.set_description_str(progress_line(self.snapshot(), width), refresh=False)
        if draw and (now or self.terminal):
            self.progress.refresh()

    def _show_waiting(self) -> None:
        self.waiting = self.disk.waiting_for()  # with the time left when nothing is in flight
        self._show_progress(now=True)

    async def _tick_progress(self) -> None:
        """Redraw now and then, not only when a prompt finishes: the ETA, the age of the
        oldest request and a stop's grace move with time."""
        interval = 1.0 if self.terminal else progress_interval()
        while True:
            await asyncio.sleep(interval)
            self._show_progress(now=True)
