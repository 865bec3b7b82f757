"""Admission's ticket and its wait for the caps (kimipipe/infer/admission.py), in-process on
the run's real ledgers: the budget, money in flight, the concurrency limiter, the disk guard
(on stdout: no filesystem to watch) and the run's state. The end-to-end money behaviour is
tests/test_money*.py's and tests/test_claims_money.py's; these pin what a ticket gives back
and when the one wait stops the run."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from kimipipe.infer.admission import Admission
from kimipipe.infer.budget import Budget, prompt_token_bound
from kimipipe.infer.config import Money
from kimipipe.infer.disk import DiskGuard
from kimipipe.infer.inflight import MoneyInFlight
from kimipipe.infer.limiter import AdaptiveLimiter
from kimipipe.infer.servers import Route
from kimipipe.infer.state import RunState
from kimipipe.kinds import Cap, StopReason
from kimipipe.openrouter.routing import PriceBound
from kimipipe.records import Message, Prompt

# a wait that should end but hangs fails after this long instead (never a timing asserted)
ENDS = 10.0
PRICE = PriceBound(prompt=1e-6, completion=1e-5, source="test")  # a worst case of ~$0.01 at 1000 max_tokens


def prompt(n: int) -> Prompt:
    return Prompt(id=f"p{n}", dataset="d", messages=[Message(role="user", content="hi")])


class Gate:
    """An Admission over fresh ledgers, with the stops it asked for recorded."""

    def __init__(self, max_cost: float | None = None, concurrency: int = 4,
                 token_budget: int | None = None):
        self.state = RunState()
        self.budget = Budget(Money(max_cost=max_cost, token_budget=token_budget), 1000, PRICE)
        self.money = MoneyInFlight(lambda: self.budget.spent_this_run)
        self.limiter = AdaptiveLimiter(concurrency)
        self.disk = DiskGuard("-", 1000)
        self.stops: list[StopReason] = []
        self.admission = Admission(self.state, self.budget, self.money, self.limiter,
                                   self.disk, self.stop, lambda _line: None, lambda _what: None)

    def stop(self, reason: StopReason) -> None:
        self.stops.append(reason)
        self.state.stop(reason)
        self.money.close()

    async def admit(self, n: int):
        async def no_probation():
            return None
        return await self.admission.admit(prompt(n), b'{"id": "p%d"}' % n, lambda: False,
                                          lambda _servers: None, no_probation)

    def ledgers(self) -> tuple:
        return (self.limiter.in_flight, round(self.money.amount, 9),
                round(self.budget.reserved, 9), self.disk.reserved, len(self.state.in_progress))


def test_a_ticket_holds_the_four_ledgers_and_gives_them_back_once():
    async def scenario():
        gate = Gate(max_cost=1.0)
        ticket = await gate.admit(1)
        worst = gate.budget.worst_case(prompt_token_bound(prompt(1).messages))
        assert ticket is not None and worst > 0 and ticket.reservation == pytest.approx(worst)
        assert ticket.record_bound == gate.disk.worst_case(b'{"id": "p1"}')
        assert gate.ledgers() == (1, round(worst, 9), round(worst, 9), ticket.record_bound, 1)
        # a back-off gives the slot back and takes it again; giving back twice is once
        await ticket.give_back_slot()
        await ticket.give_back_slot()
        assert gate.limiter.in_flight == 0
        assert await ticket.take_slot() and await ticket.take_slot()
        assert gate.limiter.in_flight == 1
        # an in-flight 402: the money is given back until taken again
        ticket.refused_in_flight(0.0)
        assert gate.money.amount == 0 and gate.money.cuts == 1
        assert await ticket.take_money() and await ticket.take_money()
        assert gate.money.amount == pytest.approx(ticket.reservation)
        gate.state.settled.clear()
        await ticket.close()
        await ticket.close()
        assert gate.ledgers() == (0, 0, 0, 0, 0) and gate.state.settled.is_set()

    asyncio.run(scenario())


def test_a_ticket_closed_twice_gives_back_its_own_share_once_and_its_server_slot():
    """Two prompts in progress: the first one's ticket closed twice gives back the first
    one's share once, never any of what the second holds; a --server prompt's ticket
    (its route to the servers) frees its server slot as it closes."""

    async def scenario():
        gate = Gate(max_cost=1.0)
        first, second = await gate.admit(1), await gate.admit(2)
        assert first is not None and second is not None
        await first.close()
        await first.close()
        assert gate.ledgers() == (1, round(second.reservation, 9), round(second.reservation, 9),
                                  second.record_bound, 1)
        await second.close()
        assert gate.ledgers() == (0, 0, 0, 0, 0)

        sources = SimpleNamespace(bound=0)  # what a Route counts its server slots on

        async def no_probation():
            return None
        ticket = await gate.admission.admit(prompt(3), b'{"id": "p3"}', lambda: True,
                                            lambda servers: Route(sources, servers), no_probation)
        assert ticket is not None and ticket.reservation == 0 and sources.bound == 1
        await ticket.close()
        assert sources.bound == 0 and gate.ledgers() == (0, 0, 0, 0, 0)

    asyncio.run(scenario())


def test_a_prompt_that_gets_no_slot_gives_back_what_it_took():
    """One slot, held: the next prompt takes its money in flight, waits for a slot, and the
    run stops meanwhile: it is not admitted, and its money in flight is given back."""

    async def scenario():
        gate = Gate(concurrency=1)
        first = await gate.admit(1)
        second = asyncio.create_task(gate.admit(2))
        await asyncio.sleep(0.05)
        assert not second.done() and gate.money.amount == pytest.approx(2 * first.reservation)
        gate.stop(StopReason.INTERRUPTED)
        assert await asyncio.wait_for(second, ENDS) is None
        assert gate.ledgers() == (1, round(first.reservation, 9), round(first.reservation, 9),
                                  first.record_bound, 1)
        await first.close()
        assert gate.ledgers() == (0, 0, 0, 0, 0)

    asyncio.run(scenario())


def test_admission_waits_for_room_while_a_prompt_may_free_it_then_the_cap_stops_the_run():
    """--max-cost with room for one request: the second waits while the first is in
    progress (the progress line names the cap); the first's answer, at its worst case,
    leaves no room and nothing in flight: the cap stops the run."""

    async def scenario():
        gate = Gate(max_cost=0.015)
        first = await gate.admit(1)
        second = asyncio.create_task(gate.admit(2))
        await asyncio.sleep(0.05)
        assert not second.done() and gate.state.waiting == Cap.MAX_COST.waiting == "--max-cost room"
        gate.budget.record(first.reservation, 10)
        await first.close()
        assert await asyncio.wait_for(second, ENDS) is None
        assert gate.stops == [StopReason.MAX_COST] and gate.ledgers() == (0, 0, 0, 0, 0)

    asyncio.run(scenario())


def test_a_next_attempt_waits_for_room_only_while_a_prompt_not_waiting_may_free_it():
    """Two prompts in progress, the caps full after a refused answer: the one waiting for
    room for its next attempt waits while the other is still at work; when that one ends
    leaving no room, only waiters are left, and the cap stops the run."""

    async def scenario():
        gate = Gate(max_cost=0.025)
        first, second = await gate.admit(1), await gate.admit(2)
        gate.budget.record(0.01, 0)  # first's refused answer: its retry has no room now
        retry = asyncio.create_task(first.room_for_next_attempt())
        await asyncio.sleep(0.05)
        assert not retry.done() and gate.state.room_waiters == 1 and not gate.stops
        gate.budget.record(second.reservation, 10)
        await second.close()
        assert await asyncio.wait_for(retry, ENDS) is False
        assert gate.stops == [StopReason.MAX_COST] and gate.state.room_waiters == 0
        await first.close()

    asyncio.run(scenario())


def test_a_next_attempt_goes_on_once_a_prompt_ending_frees_room():
    async def scenario():
        gate = Gate(max_cost=0.025)
        first, second = await gate.admit(1), await gate.admit(2)
        gate.budget.record(0.005, 0)
        retry = asyncio.create_task(first.room_for_next_attempt())
        await asyncio.sleep(0.05)
        assert not retry.done()
        gate.budget.record(0.001, 10)  # second's answer costs far less than its worst case
        await second.close()
        assert await asyncio.wait_for(retry, ENDS) is True and not gate.stops
        await first.close()

    asyncio.run(scenario())


def test_a_token_budget_reached_stops_admission_with_requests_still_in_flight():
    """The answers recorded reach --token-budget while a request is in flight: the next
    prompt is not admitted and the run stops at once (exit 0), not after a wait."""

    async def scenario():
        gate = Gate(token_budget=1000)
        first = await gate.admit(1)
        gate.budget.record(0.0, 1000)
        assert await asyncio.wait_for(gate.admit(2), ENDS) is None
        assert gate.stops == [StopReason.TOKEN_BUDGET] and gate.ledgers()[-1] == 1
        await first.close()

    asyncio.run(scenario())
