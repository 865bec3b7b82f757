"""kp-infer's event loop in paced turns (infer/transport.py `pace_reads`).

From PACE_FROM requests in flight, each turn of the loop is made to last PACE_SECONDS, so
one wake-up serves every connection that got data (what that saves is measured by
bench/bench_infer.py, never here). These tests drive a real event loop with the module's
clock replaced by one that moves only when slept on: what is asserted is whether, and how
long, the loop sleeps, never how fast anything ran.
"""

from __future__ import annotations

import asyncio
import time

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


def test_a_turn_sleeps_only_the_rest_its_work_left(monkeypatch):
    """Each turn lasts PACE_SECONDS in all: a turn whose work took 30 ms sleeps the other
    70 ms (not a whole PACE_SECONDS more), and every turn of the busy loop is paced (the
    next turn counts from the end of this one's sleep, not from before it)."""
    clock = Clock()
    monkeypatch.setattr(transport, "time", clock)
    work, turns = 0.03, 20
    during: list[float] = []

    async def main() -> None:
        pace_reads(asyncio.get_running_loop(), lambda: PACE_FROM)
        for _ in range(turns):
            clock.now += work  # what the turn's callbacks took
            await asyncio.sleep(0)
        during.extend(clock.slept)  # (the loop's shutdown turns do no work)

    asyncio.run(main())
    assert len(during) >= turns - 1, during
    assert during == pytest.approx([PACE_SECONDS - work] * len(during))


def test_kp_infer_reads_in_paced_turns(standin, tmp_path, monkeypatch):
    """kp-infer (its entry point, run in this process) paces its loop: with PACE_FROM
    lowered to 1, its turns are slept out while its requests are in flight."""
    from click.testing import CliRunner

    from kimipipe.commands.infer import main

    server = standin(latency=0.3)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(
        f'{{"id": "p{i}", "dataset": "d", "messages": [{{"role": "user", "content": "Q {i}"}}]}}\n'
        for i in range(4)))
    slept: list[float] = []

    class Recorded:
        """time for the pacer: the real clock, its sleeps counted."""

        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            slept.append(seconds)
            time.sleep(seconds)

    monkeypatch.setattr(transport, "PACE_FROM", 1)
    monkeypatch.setattr(transport, "time", Recorded)
    monkeypatch.setenv("OPENROUTER_API_KEY", server.api_key)
    code = None
    with CliRunner().isolation(input=b"") as (_stdout, stderr, _):
        try:
            main([str(prompts), "-o", str(tmp_path / "r.jsonl"), "--base-url", server.base_url,
                  "--concurrency", "4", "--max-tokens", "50", "-q"])
        except SystemExit as e:
            code = e.code
    assert code == 0, stderr.getvalue()
    assert len(slept) >= 2 and all(0 < s <= PACE_SECONDS for s in slept), slept
