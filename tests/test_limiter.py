"""The adaptive concurrency limiter, in-process: a 429 shrinks it by a quarter, it grows back,
and a caller waiting for a slot sees it grow."""

from __future__ import annotations

import asyncio

from kimipipe.infer.limiter import AdaptiveLimiter


class Clock:
    """A clock the test moves by hand: the limiter's rules are about time, the test's
    assertions must not be (a loaded machine stretches every sleep)."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_limiter_shrinks_on_429_and_grows_back():
    async def scenario():
        clock = Clock()
        limiter = AdaptiveLimiter(100, cooldown=2.0, clock=clock)
        limiter.rate_limited()
        assert limiter.current == 75
        clock.now += 1.5
        limiter.rate_limited()  # the same burst (within the cooldown): counted once
        assert limiter.current == 75
        clock.now += 0.5
        limiter.rate_limited()
        assert limiter.current == 56
        clock.now += 1.5  # not yet a whole cooldown without a 429: no growth
        await limiter.acquire()
        await limiter.release()
        assert limiter.current == 56
        clock.now += 0.5
        await limiter.acquire()  # a cooldown without a 429: + 5% of the ceiling
        assert limiter.current == 61
        await limiter.release()
        await limiter.acquire()  # growth is once per cooldown, not once per acquire
        await limiter.release()
        assert limiter.current == 61
        for _ in range(10):
            clock.now += 2.0
            await limiter.acquire()
            await limiter.release()
        assert limiter.current == 100  # back to the ceiling, never above
        assert limiter.in_flight == 0

    asyncio.run(scenario())


def test_limiter_grows_while_a_caller_waits_for_a_slot():
    """A full limiter wakes its waiters every cooldown: the limit grows with time, not
    only when a request is released."""
    async def scenario():
        clock = Clock()
        limiter = AdaptiveLimiter(4, cooldown=0.25, clock=clock)
        limiter.rate_limited()
        assert limiter.current == 3
        for _ in range(3):
            await limiter.acquire()
        waiter = asyncio.create_task(limiter.acquire())
        await asyncio.sleep(0.6)  # wake-ups (every 0.25 s): the fake clock has not moved
        assert not waiter.done()
        clock.now += 0.25
        await asyncio.wait_for(waiter, 60)  # the next wake-up sees the cooldown passed
        assert limiter.current == 4 and limiter.in_flight == 4

    asyncio.run(scenario())

