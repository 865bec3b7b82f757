"""Adaptive concurrency: how many requests may be in flight right now.

Additive increase, multiplicative decrease on rate limits: a 429 shrinks the limit by a
quarter (at most once per `cooldown` seconds, so a burst of 429s from one moment counts
once); every `cooldown` seconds without a 429 the limit grows back by 5% of the ceiling
(at least 1), up to `--concurrency`. A rate-limited provider is thus not hammered, and
full speed returns when the 429s stop.
"""

from __future__ import annotations

import asyncio
import time


class AdaptiveLimiter:
    def __init__(self, ceiling: int, floor: int = 1, cooldown: float = 2.0,
                 clock=time.monotonic):
        self.clock = clock  # a test moves a clock of its own instead of sleeping
        self.ceiling = ceiling
        self.floor = max(1, min(floor, ceiling))
        self.limit = float(ceiling)
        self.cooldown = cooldown
        self.in_flight = 0
        self._last_decrease = 0.0
        self._last_change = clock()
        self._cond = asyncio.Condition()

    @property
    def current(self) -> int:
        return max(self.floor, int(self.limit))

    async def acquire(self) -> None:
        async with self._cond:
            while self.in_flight >= self._maybe_grow():
                try:  # wake up now and then: the limit grows with time, not only on release
                    await asyncio.wait_for(self._cond.wait(), timeout=self.cooldown)
                except TimeoutError:
                    pass
            self.in_flight += 1

    async def release(self) -> None:
        async with self._cond:
            self.in_flight -= 1
            self._cond.notify(1)

    def _maybe_grow(self) -> int:
        now = self.clock()
        if self.limit < self.ceiling and now - self._last_change >= self.cooldown \
                and now - self._last_decrease >= self.cooldown:
            self.limit = min(self.ceiling, self.limit + max(1.0, 0.05 * self.ceiling))
            self._last_change = now
        return self.current

    def rate_limited(self) -> None:
        now = self.clock()
        if now - self._last_decrease >= self.cooldown:
            self.limit = max(self.floor, self.limit * 0.75)
            self._last_decrease = now
            self._last_change = now
