"""Admission: what a request must hold before it is sent, taken and given back in one place.

A prompt of a kp-infer run is sent only while it holds a share of four ledgers, each
owned by its own part and read by the progress line:

    the caps' room      its worst case reserved against --max-cost and --total-cost
                        (infer/budget.py, infer/total_cost.py), the token budget expected
    money in flight     its worst case under the ceiling sized to the balance
                        (infer/inflight.py)
    disk room           its worst-case record under the output's free space (infer/disk.py)
    a concurrency slot  (infer/limiter.py), and with --server a server's slot (its `Route`,
                        infer/servers.py)

`Admission.admit` waits for each in turn and hands back a `Ticket`, the one object that
holds them while the prompt's work (infer/prompt_work.py) runs: the work gives its slot
back while it backs off or waits for its identity verdict, its money in flight after an
in-flight 402, and takes them again through the ticket; `Ticket.close` (idempotent) gives
back whatever the ticket still holds, once, when the work ends or admission gives up.

Waiting for the caps' room is one loop (`Admission._wait_for_room`), for a new request
(admission) and for a refused answer's next attempt (whose reservation is held already):
it wakes when a prompt's work ends (`RunState.settled`), and every PUBLISH_INTERVAL while
another run sharing --total-cost may give room back; when nothing that could free room is
left, the cap (`kinds.Cap`) stops the run (exit 3, resumable).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..kinds import Cap, StopReason
from ..records import Prompt
from .budget import Budget, prompt_token_bound
from .disk import DiskGuard
from .inflight import MoneyInFlight
from .limiter import AdaptiveLimiter
from .servers import Route
from .state import RunState
from .total_cost import PUBLISH_INTERVAL


class Admission:
    """The run's gate over its ledgers: BUDGET, MONEY (in flight), LIMITER (the slots) and
    DISK; STATE is the run's (the stop, `settled`, the prompts in progress). STOP stops the
    run; SAY writes a message; SHOW(what) redraws the progress line with what admission
    waits for."""

    def __init__(self, state: RunState, budget: Budget, money: MoneyInFlight,
                 limiter: AdaptiveLimiter, disk: DiskGuard, stop: Callable[[StopReason], None],
                 say: Callable[[str], None], show: Callable[[str], None]):
        self.state = state
        self.budget = budget
        self.money = money
        self.limiter = limiter
        self.disk = disk
        self.stop = stop
        self.say = say
        self.show = show

    async def admit(self, prompt: Prompt, line: bytes, to_servers: Callable[[], bool],
                    route: Callable[[bool], Route | None],
                    before_slot: Callable[[], Awaitable[None]]) -> Ticket | None:
        """PROMPT (its LINE as read) admitted: its ticket, or None when admission must stop.
        TO_SERVERS() says whether the servers have room (it then reserves no money);
        ROUTE(servers) is its server route, if any; BEFORE_SLOT is awaited just before its
        concurrency slot is taken (the identity judge's probation)."""
        state = self.state
        worst = self.budget.worst_case(prompt_token_bound(prompt.messages))
        if (servers := await self.room_for_new_request(worst, to_servers)) is None:
            return None
        ticket = Ticket(self, prompt.id, 0.0 if servers else worst, self.disk.worst_case(line),
                        route(servers))
        try:
            if not await self.disk.wait_for_room(ticket.record_bound, state.stopping,
                                                 state.settled, self.say, self.show):
                if self.disk.gave_up:  # --disk-wait with nothing in flight: a full disk's stop
                    self.stop(StopReason.DISK)
                return None
            if not self.money.fits(ticket.reservation):
                state.waiting = "room for money in flight"  # (the progress line says so)
            if not await ticket.take_money():
                return None
            state.waiting = None
            await before_slot()
            if not await ticket.take_slot():
                return None
            ticket.admitted()
            return ticket
        finally:
            if not ticket.in_progress:  # given up on: what it took is given back
                await ticket.close()

    async def room_for_new_request(self, worst: float, to_servers: Callable[[], bool]
                                   ) -> bool | None:
        """Wait until the next request fits: True when it goes to the servers (TO_SERVERS:
        one has room; it reserves nothing), False when to OpenRouter (its worst case, WORST,
        fits the money caps, and is claimed until the ticket reserves it: `Budget.reserve`);
        None when the run must stop."""
        state, budget = self.state, self.budget
        servers = False

        def blocker() -> Cap | None:
            nonlocal servers
            servers = to_servers()
            cap = budget.cost_blocker(0.0 if servers else worst)
            # in_progress, not tasks: a finished task leaves the run's tasks only later
            if cap is None and not budget.tokens_fit(len(state.in_progress)):
                return Cap.TOKEN_BUDGET
            return cap

        # any prompt in progress may free room: its reservation is released when it ends
        if not await self._wait_for_room(blocker, lambda: not state.in_progress, show=True):
            return None
        return servers

    async def room_for_next_attempt(self) -> bool:
        """After a refused answer (its cost booked, its worst case still reserved): wait, as
        admission waits, until the caps have room for the next attempt. False when the run
        stops first, or when nothing else in flight can free room: then it is the cap's
        stop (exit 3, resumable), not this prompt's failure."""
        state = self.state
        with state.waiting_for_room():
            # (cap_left_no_room: admission's claim on the budget is admission's, left alone)
            # the prompts waiting like this one free no room (the stop wakes them)
            return await self._wait_for_room(lambda: self.budget.cap_left_no_room(0.0),
                                             state.only_waiting_for_room, show=False)

    async def _wait_for_room(self, blocker: Callable[[], Cap | None],
                             nothing_frees_room: Callable[[], bool], show: bool) -> bool:
        """The one wait for the caps: True once BLOCKER() names no cap; False when the run
        stops first, or when NOTHING_FREES_ROOM() (and no run sharing --total-cost may give
        room back): then the run stops for the cap. SHOW: admission's wait, which the
        progress line names."""
        state, budget = self.state, self.budget
        while not state.stopping.is_set():
            if budget.tokens_exhausted():
                self.stop(StopReason.TOKEN_BUDGET)
                return False
            cap = blocker()
            if cap is None:
                return True
            total = budget.total
            # another run sharing --total-cost may give room back: look again now and then
            poll = cap is Cap.TOTAL_COST and total is not None and total.others_may_free_room()
            if show:
                state.waiting = cap.waiting
            if nothing_frees_room() and not poll:
                self.stop(cap.stop_reason)
                return False
            state.settled.clear()
            try:
                await asyncio.wait_for(state.settled.wait(),
                                       timeout=PUBLISH_INTERVAL if poll else None)
            except TimeoutError:
                pass
        return False

    async def slot_unless_stopped(self) -> bool:
        """A concurrency slot for a new request; False (and no slot) once the run stops."""
        limiter, stopping = self.limiter, self.state.stopping
        if limiter.in_flight < limiter.current:
            await limiter.acquire()
        else:
            acquire = asyncio.create_task(limiter.acquire())
            stopped = asyncio.create_task(stopping.wait())
            await asyncio.wait({acquire, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not acquire.done():
                acquire.cancel()
                await asyncio.wait({acquire})
            if acquire.cancelled():
                return False
        if stopping.is_set():
            await limiter.release()
            return False
        return True

    def rate_limited(self) -> None:
        """A 429: the concurrency limit shrinks (infer/limiter.py)."""
        self.limiter.rate_limited()

    def spendable(self) -> float | None:
        """The balance left as money in flight counts it (None: not read)."""
        return self.money.spendable()


class Ticket:
    """What one admitted prompt (PROMPT_ID) holds: RESERVATION dollars of the caps and of
    money in flight, RECORD_BOUND bytes of disk, a concurrency slot, and its server ROUTE
    (None: the run's transport). Taken by `Admission.admit`; `close()` gives it all back."""

    def __init__(self, admission: Admission, prompt_id: str, reservation: float,
                 record_bound: int, route: Route | None):
        self._admission = admission
        self.prompt_id = prompt_id
        self.reservation = reservation
        self.record_bound = record_bound
        self.route = route
        self.in_progress = False  # the caps and the disk reserved, the prompt in progress
        self._slot = False
        self._money = False
        self._closed = False

    def admitted(self) -> None:
        """Everything taken: the caps' claim (`Budget.cost_blocker`) becomes a reservation."""
        a = self._admission
        a.budget.reserve(self.reservation)
        a.disk.reserve(self.record_bound)
        a.state.admitted(self.prompt_id)
        self.in_progress = True

    async def take_slot(self) -> bool:
        """A concurrency slot, unless one is held; False once the run stops (a Ctrl-C must
        not wait for a slot that only a long answer would free)."""
        if not self._slot:
            if not await self._admission.slot_unless_stopped():
                return False
            self._slot = True
        return True

    async def give_back_slot(self) -> None:
        """The slot, for another request while this one waits (back-off, a verdict)."""
        if self._slot:
            await self._admission.limiter.release()
            self._slot = False

    async def take_money(self) -> bool:
        """Its worst case in flight, unless held; False once the run stops."""
        if not self._money:
            if not await self._admission.money.acquire(self.reservation):
                return False
            self._money = True
        return True

    def refused_in_flight(self, retry_after: float | None) -> None:
        """An in-flight 402: the ceiling is cut while its worst case still counts, then that
        money is given back (OpenRouter reserved nothing for it) until `take_money`."""
        money = self._admission.money
        money.refused(retry_after)
        if self._money:
            money.release(self.reservation, finished=False)
            self._money = False

    async def add(self, worst: float) -> bool:
        """WORST more dollars reserved (a --server prompt moving to OpenRouter), when they
        fit the caps and money in flight now; False (nothing taken) when not."""
        a = self._admission
        # (cap_left_no_room: admission's claim on the budget is admission's, left alone)
        if a.budget.cap_left_no_room(worst) is not None or not a.money.fits(worst):
            return False
        # (at once: it fits, unless others wait first)
        if self._money and not await a.money.acquire(worst):
            return False
        a.budget.reserve_more(worst)
        self.reservation += worst  # released with the rest when the ticket closes
        return True

    async def room_for_next_attempt(self) -> bool:
        """After a refused answer: `Admission.room_for_next_attempt` (this ticket's
        reservation, held, covers the attempt's worst case)."""
        return await self._admission.room_for_next_attempt()

    async def close(self) -> None:
        """Give back what the ticket holds, once; a prompt in progress ends (`settled`:
        admission looks again)."""
        if self._closed:
            return
        self._closed = True
        a = self._admission
        if self.in_progress:
            a.state.ended(self.prompt_id)
            a.budget.release(self.reservation)
            a.disk.release(self.record_bound)
        if self._money:
            a.money.release(self.reservation)
            self._money = False
        if self._slot:
            await a.limiter.release()
            self._slot = False
        if self.route is not None:  # its server slot is free for the next prompt
            self.route.close()
        if self.in_progress:
            a.state.settled.set()
