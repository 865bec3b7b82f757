"""kp-infer's event loop in paced turns (infer/transport.py `pace_reads`).

From PACE_FROM requests in flight, each turn of the loop is made to last PACE_SECONDS, so
one wake-up serves every connection that got data (what that saves is measured by
bench/bench_infer.py, never here). These tests drive a real event loop with the module's
clock replaced by one that moves only when slept on: what is asserted is whether, and how
long, the loop sleeps, never how fast anything ran.
"""

from __future__ import annotations

import asyncio

import pytest

from kimipipe.infer import transport
from kimipipe.infer.transport import PACE_FROM, PACE_SECONDS, pace_reads


class Clock:
    """time.monotonic and time.sleep for the pacer: the time moves only when slept."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def turns_slept(monkeypatch, in_flight: int, turns: int = 20) -> list[float]:
    clock = Clock()
    monkeypatch.setattr(transport, "time", clock)

    async def main() -> None:
        pace_reads(asyncio.get_running_loop(), lambda: in_flight)
        for _ in range(turns):
            await asyncio.sleep(0)

    asyncio.run(main())
    return clock.slept


def test_a_busy_loop_sleeps_out_the_rest_of_each_turn(monkeypatch):
    slept = turns_slept(monkeypatch, PACE_FROM)
    # (no time passes between turns here: each one is slept out whole)
    assert len(slept) >= 10 and slept == pytest.approx([PACE_SECONDS] * len(slept))


def test_a_loop_with_fewer_requests_in_flight_is_not_paced(monkeypatch):
    assert turns_slept(monkeypatch, PACE_FROM - 1) == []
