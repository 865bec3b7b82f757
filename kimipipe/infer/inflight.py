"""Money in flight: the sum of the worst cases a run has running, under a ceiling it learns.

OpenRouter reserves each running request's worst case (prompt + max_tokens at the
endpoint's prices) against the balance, and refuses a request past its in-flight budget
(402 `in_flight_budget_exhausted`, with `Retry-After`). The budget is a share of the
balance that OpenRouter does not publish, so kp-infer learns it:

    ceiling        = ratio x spendable now
    spendable now  = the balance last read (the smaller of /credits' credits - usage and
                     /key's limit_remaining) - what this run spent since that read
    ratio          starts at START_RATIO (the balance itself, from the first request);
                   an in-flight 402 cuts it to CUT (90%) of what was in flight then, as a
                   share of spendable. "In flight" counts the requests finished within
                   RECENT s too: OpenRouter still counts them, so a 402 that comes as ours
                   end does not mean that what runs now is too much. The requests refused
                   with it are let go one by one, so a burst of 402s cuts down to what
                   OpenRouter took, but by no more than half in one burst (GROW_EVERY
                   seconds). Every GROW_EVERY seconds without one it grows by GROW_FACTOR,
                   up to MAX_RATIO

so the ceiling follows the balance down as it is spent, and `--max-tokens` decides how
many requests it holds (a request's worst case is mostly max_tokens x completion price).
When the balance cannot be read the ceiling is unknown (none) until the first in-flight
402, then CUT of what was in flight, grown the same way. After an in-flight 402 admission
waits its `Retry-After`. One request always goes when nothing is in flight: one larger
than the whole budget gets 402 `weight_exceeds_budget` from OpenRouter, a money stop.

Requests wait first come, first served (a request sent back after a 402 waits with new
ones), and only as many are woken as the room allows: thousands may wait at once.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable

from ..contracts import MoneyInFlightEnd

START_RATIO = 1.0
MAX_RATIO = 1.2  # our worst case is at the table's highest price, OpenRouter's at the serving one's
CUT = 0.9
DEEPEST_CUT = 0.5
GROW_EVERY = 1.0
GROW_FACTOR = 1.02
RECENT = 1.0


class MoneyInFlight:
    def __init__(self, spent: Callable[[], float], clock=time.monotonic):
        self.spent = spent  # this run's spend so far (USD)
        self.clock = clock
        self.amount = 0.0  # worst cases of the requests in flight (USD)
        self.peak = 0.0
        self.ratio = START_RATIO
        self.fixed: float | None = None  # the ceiling learned when the balance is unknown
        self.balance: float | None = None  # spendable at the last read
        self._spent_at_read = 0.0
        self.not_before = 0.0  # Retry-After of the last in-flight 402
        self.cuts = 0
        self.closed = False
        self._last_cut = -math.inf
        self._burst_floor: tuple[float, float | None] = (0.0, None)
        self._last_grow = clock()
        self._waiters: deque[tuple[float, asyncio.Future]] = deque()
        self._finished: deque[tuple[float, float]] = deque()  # (when, worst case), RECENT s
        self._finished_sum = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # -- the balance ----------------------------------------------------------------------
    def set_balance(self, spendable: float | None) -> None:
        """What can be spent, as just read (None: unknown, the last reading stays)."""
        if spendable is None:
            return
        self.balance = spendable
        self._spent_at_read = self.spent()
        self._wake()

    def spendable(self) -> float | None:
        if self.balance is None:
            return None
        return max(0.0, self.balance - (self.spent() - self._spent_at_read))

    def ceiling(self) -> float | None:
        self._maybe_grow()
        left = self.spendable()
        return self.ratio * left if left is not None else self.fixed

    # -- admission ------------------------------------------------------------------------
    def fits(self, amount: float) -> bool:
        if self.clock() < self.not_before:
            return False
        ceiling = self.ceiling()
        return ceiling is None or self.amount == 0 or self.amount + amount <= ceiling

    async def acquire(self, amount: float) -> bool:
        """Room for a request of worst case AMOUNT; False (and no room) once closed."""
        if self.closed:
            return False
        if not self._waiters and self.fits(amount):
            self._take(amount)
            return True
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((amount, future))
        self._arm()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.result():
                self.release(amount)
            raise

    def release(self, amount: float, finished: bool = True) -> None:
        """A request ended (FINISHED: it ran, so OpenRouter may count it a while longer;
        False: it was refused, nothing was reserved for it there)."""
        if finished:
            now = self.clock()
            self._finished.append((now, amount))
            self._finished_sum += amount
        self.amount -= amount
        if self.amount < 1e-12:  # no drift left behind by float sums
            self.amount = 0.0
        self._wake()

    def close(self) -> None:
        """A stop: every waiter gets False, and so does any later acquire."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._waiters:
            _, future = self._waiters.popleft()
            if not future.done():
                future.set_result(False)

    # -- learning -------------------------------------------------------------------------
    def refused(self, retry_after: float | None) -> None:
        """An in-flight 402, while the refused request's worst case is still counted."""
        now = self.clock()
        self.not_before = max(self.not_before, now + (retry_after or 0.0))
        if now - self._last_cut >= GROW_EVERY:  # a new burst: its cuts go at most this deep
            self._burst_floor = (DEEPEST_CUT * self.ratio,
                                 None if self.fixed is None else DEEPEST_CUT * self.fixed)
            self._last_cut = now
            self.cuts += 1
        self._last_grow = now
        left = self.spendable()
        counted = self.amount + self._recently_finished(now)
        if left:
            self.ratio = max(self._burst_floor[0], min(self.ratio, CUT * counted / left))
        else:
            cut = CUT * counted
            floor = self._burst_floor[1]
            self.fixed = cut if self.fixed is None else max(floor or 0.0, min(self.fixed, cut))

    def _recently_finished(self, now: float) -> float:
        """The worst cases of requests finished within RECENT seconds: OpenRouter counts
        them a while after they end, so a 402 that comes when they have just ended does
        not mean that what is running now is too much."""
        while self._finished and self._finished[0][0] < now - RECENT:
            self._finished_sum -= self._finished.popleft()[1]
        if not self._finished:
            self._finished_sum = 0.0
        return self._finished_sum

    def _maybe_grow(self) -> None:
        now = self.clock()
        if now - self._last_grow >= GROW_EVERY and now - self._last_cut >= GROW_EVERY:
            steps = int((now - self._last_grow) / GROW_EVERY)
            self.ratio = min(MAX_RATIO, self.ratio * GROW_FACTOR ** steps)
            if self.fixed is not None:
                self.fixed *= GROW_FACTOR ** steps
            self._last_grow = now

    # -- waking waiters -------------------------------------------------------------------
    def _take(self, amount: float) -> None:
        self.amount += amount
        self.peak = max(self.peak, self.amount)

    def _wake(self) -> None:
        while self._waiters and not self.closed:
            amount, future = self._waiters[0]
            if future.done():
                self._waiters.popleft()
                continue
            if not self.fits(amount):
                break
            self._waiters.popleft()
            self._take(amount)
            future.set_result(True)
        self._arm()

    def _arm(self) -> None:
        """Wake the waiters later too: Retry-After passes and the ratio grows with time."""
        if self._timer is not None or not self._waiters or self.closed:
            return
        delay = max(GROW_EVERY, self.not_before - self.clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._wake()

    def state(self) -> MoneyInFlightEnd:
        """For the summary."""
        ceiling = self.ceiling()
        return MoneyInFlightEnd(
            ceiling_end=round(ceiling, 6) if ceiling is not None else None,
            ratio_end=round(self.ratio, 4) if self.balance is not None else None,
            peak=round(self.peak, 6), cuts=self.cuts, balance_read=self.balance)
