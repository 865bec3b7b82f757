"""What happens to one admitted prompt of a kp-infer run: its attempts and what each ends in.

The run (infer/run.py) admits a prompt, then hands it to a `PromptWork` of its own, given
the run's parts explicitly (`RunParts`) and the prompt's `Ticket` (infer/admission.py:
its slot, reservations and route, which the work gives back and takes again through it);
the work owns the prompt's attempts and answers from admission to its record. It sends
the request through the transport until an answer or a permanent failure; what each
attempt ends in (`kinds.AttemptKind`) has one handler here (`PromptWork.HANDLERS`):

    ok         the answer is checked (routing, the reasoning asked for: infer/acceptance.py;
               with --tokenizer its identity, counted once per prompt: infer/identity.py,
               whose verdict may wait, holding no slot, for the other providers' answers, and
               which routes each attempt while a provider is not trusted yet: `_attempt`),
               its cost settled when its usage showed none (infer/costs.py: GET /generation,
               else an estimate that cannot fall short), and written; a refused one is paid
               for and sent again at once with its provider ignored while `--max-attempts`,
               the run and `--max-cost` allow (the prompt's reservation still covers the
               next attempt's worst case)
    retry      jittered exponential backoff, then again, up to `--max-attempts` (a 429 also
               shrinks the concurrency limit); the cause is counted (`kinds.RetryCause`)
    wait       an in-flight 402 is no failed attempt: the request gives back its slot and
               its money in flight (whose ceiling the 402 cuts: infer/inflight.py), waits
               `Retry-After` and is admitted again
    payment    a money limit (the balance, the key's limit, a workspace or guardrail
               budget): the run stops, no prompt is failed for it
    auth       401: the run stops
    no_route   404: the run stops, unless the providers this prompt ignores (after refused
               answers) left no route: then it is the prompt's failure
    permanent  the prompt fails; 50 identical ones in a row with no answer between them
               stop the run (infer/systematic.py: a configuration error)
    cancelled  a stream closed because its provider was quarantined (infer/identity.py):
               maybe billed, so refused like an answer (RefusalKind.IDENTITY), its cost
               settled as a missing one, and the prompt sent again elsewhere

The record or failure is written whole (infer/writing.py), and what a failing output cannot
take is kept in the rescue file. Admission and the caps' wait are infer/admission.py's;
stops and draining stay in the run.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from ..contracts import MoneyLimit
from ..kinds import AttemptKind, FailureKind, RefusalKind, RetryCause, StopReason
from ..openrouter.attempt import Attempt
from ..openrouter.request import RequestOptions
from ..openrouter.routing import Policy
from ..records import Prompt, Refusal
from . import costs, identity
from .acceptance import Acceptance
from .admission import Admission, Ticket
from .budget import Budget, prompt_token_bound
from .config import Retries
from .progress import RunProgress
from .report import Stats
from .state import RunState
from .systematic import SystematicFailure
from .writing import RESCUED, WRITTEN, Output, failure_record


class Transport(Protocol):
    """Where a prompt's attempts go: a CompletionClient (infer/transport.py), or with
    --server the Sources or one prompt's Route (infer/servers.py)."""

    async def attempt(self, body: bytes, stream: bool) -> Attempt: ...


@dataclass(frozen=True, slots=True)
class RunParts:
    """What one prompt's work is given by its run: nothing else of the run is reached."""

    request: RequestOptions  # what is asked (each attempt's body)
    policy: Policy  # the run's routing (a prompt's refused providers are ignored on its copy)
    retries: Retries  # --max-attempts and the backoff
    cost_lookup_wait: float  # --cost-lookup-wait (infer/costs.py)
    transport: Transport
    admission: Admission  # the slots, the caps, money in flight, the disk (tickets' issuer)
    budget: Budget  # what is spent: --max-cost, --total-cost, --token-budget
    acceptance: Acceptance
    output: Output
    stats: Stats
    done: set[str]  # the IDs answered (in the output)
    state: RunState
    progress: RunProgress
    stop: Callable[[StopReason], None]  # the run's stop (admission ends)
    say: Callable[[str], None]
    # GET /generation's total_cost of a generation id, None while not there (infer/costs.py)
    read_cost: Callable[[str], Awaitable[float | None]]
    systematic: SystematicFailure  # identical permanent failures in a row: a stop


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


class PromptWork:
    """One admitted PROMPT (its LINE as read), its attempts and answers: `await run()`.
    What it holds to be sent (a slot, its reservations, its route) is its TICKET
    (infer/admission.py), given back when the work ends."""

    def __init__(self, parts: RunParts, prompt: Prompt, line: bytes, ticket: Ticket,
                 session_id: str | None = None):
        self.parts = parts
        self.ticket = ticket
        # where its attempts go: the run's transport, or (with --server) the route chosen at
        # its admission, to the servers or to OpenRouter (infer/servers.py)
        self.route = ticket.route
        self.transport: Transport = self.route if self.route is not None else parts.transport
        self.prompt = prompt
        self.line = line
        self.session_id = session_id  # a conversation's id, on each of its requests (sticky routing)
        self.policy = parts.policy  # this prompt's: refused providers get ignored
        self.body = parts.request.body(prompt, self.policy, session_id)
        self.kept: Attempt | None = None  # the answer written (a conversation's next turn is built on it)
        self.attempts = 0
        self.retried: dict[str, int] = {}  # attempts sent again, by cause (on its record)
        self.started = 0.0  # when the attempt now in flight was sent
        self.refused: list[Refusal] = []  # answers refused (paid for), not yet on a record
        self.prompt_count: int | None = None  # kimipipe's count of the prompt (--tokenizer)
        self._counted = False
        self._quarantined = len(self.policy.quarantine)  # as this body was built

    async def run(self) -> None:
        parts = self.parts
        stream = parts.request.stream
        try:
            while True:
                if len(self.policy.quarantine) != self._quarantined:  # a provider quarantined
                    self._quarantined = len(self.policy.quarantine)   # since the body was built
                    self.body = parts.request.body(self.prompt, self.policy, self.session_id)
                self.attempts += 1
                self.started = time.monotonic()
                result = await self._attempt(stream)
                if not await self.HANDLERS[result.kind](self, result):
                    return
        finally:
            if self.refused:  # refused, paid for, and not sent again: a stop
                last = self.refused[-1]
                self._fail(FailureKind.STOPPED, Attempt(AttemptKind.PERMANENT, status=200, message=(
                    f"{last.kind}: {last.message}; not sent again: the run stopped")),
                    provider=last.provider, generation_id=last.generation_id)
            await self.ticket.close()  # (admission looks again)
            parts.progress.show()

    async def _attempt(self, stream: bool) -> Attempt:
        """One attempt of the body; with the identity checked, routed as the judge routes
        it while a provider is not trusted yet (infer/identity.py `route`: a small share)."""
        judge = self.parts.acceptance.identity
        if judge is None or self.route is not None:  # (a --server's route: no OpenRouter)
            return await self.transport.attempt(self.body, stream)

        def send(policy):
            body = self.body if policy is self.policy else self.parts.request.body(
                self.prompt, policy, self.session_id)
            return self.transport.attempt(body, stream)

        return await judge.routed(self.policy, send)

    # -- one handler per attempt kind: True sends the prompt again -----------------------
    async def _on_ok(self, answer: Attempt) -> bool:
        latency = time.monotonic() - self.started
        parts = self.parts
        refused = parts.acceptance.refusal(answer)
        judge = parts.acceptance.identity
        check = None
        if refused is None and judge is not None and answer.api is None:  # (not a --server's)
            if not self._counted:
                self.prompt_count = judge.count(self.prompt.messages, self.prompt.id)
                self._counted = True
            check = judge.check(self.prompt.id, self.prompt.messages, self.prompt_count, answer)
            if check.verdict == identity.OFF:
                refused = (RefusalKind.IDENTITY, judge.refusal(check))
        pending = check is not None and check.verdict == identity.PENDING
        source = await self._settle_cost(answer, (RefusalKind.IDENTITY, (
            "its identity was not settled when the run was cancelled")) if pending else refused,
            latency)
        if pending:
            await self._settle_identity(judge, check, answer, source)
            if check.verdict == identity.OFF:
                refused = (RefusalKind.IDENTITY, judge.refusal(check))
        if refused is None:
            self._accept(answer, latency, source, check.mark() if check is not None else None)
            return False
        if not await self._refuse(answer, *refused, source,
                            offset=check.offset if refused[0] == RefusalKind.IDENTITY else None):
            return False
        self.body = parts.request.body(self.prompt, self.policy,
                                              self.session_id)  # its own ignore
        self._quarantined = len(self.policy.quarantine)
        # a slot again (given back while its identity was settled), unless the run stops
        # (its refusal becomes its failure line: not sent again)
        return await self.ticket.take_slot()

    async def _on_cancelled(self, answer: Attempt) -> bool:
        """A stream closed because its provider was quarantined (infer/identity.py): it may
        be billed all the same, so it is an answer refused for identity, its cost settled
        as a missing one (GET /generation, else the reservation: never $0), and the prompt
        is sent again elsewhere as after any refusal."""
        parts = self.parts
        why = answer.message
        source = await self._settle_cost(answer, (RefusalKind.IDENTITY, why),
                                         time.monotonic() - self.started)
        if not await self._refuse(answer, RefusalKind.IDENTITY, why, source):
            return False
        self.body = parts.request.body(self.prompt, self.policy, self.session_id)
        self._quarantined = len(self.policy.quarantine)
        return True

    async def _on_retry(self, result: Attempt) -> bool:
        parts = self.parts
        parts.stats.retried(result.cause)
        self.retried[result.cause] = self.retried.get(result.cause, 0) + 1
        if result.cause == RetryCause.RATE_LIMITED:
            parts.admission.rate_limited()
        if self.attempts >= parts.retries.max_attempts:
            self._fail(FailureKind.RETRIES_EXHAUSTED, result)
            return False
        await self._move_to_openrouter(result)
        await self.ticket.give_back_slot()
        if not await self._sleep_unless_stopped(self._backoff(self.attempts, result.retry_after)):
            return False  # not sent again: a stop admits no new requests
        return await self.ticket.take_slot()  # (False: the run stopped meanwhile)

    async def _on_wait(self, result: Attempt) -> bool:
        """The in-flight budget is full: not this prompt's fault, and no attempt of its."""
        parts = self.parts
        self.attempts -= 1
        parts.stats.retried(result.cause)
        parts.stats.limit_met(result.limit_key())
        self.ticket.refused_in_flight(result.retry_after)
        await self.ticket.give_back_slot()
        delay = result.retry_after if result.retry_after is not None else self._backoff(1, None)
        return (await self._sleep_unless_stopped(delay) and await self.ticket.take_money()
                and await self.ticket.take_slot())

    async def _on_payment(self, result: Attempt) -> bool:
        self.parts.stats.limit_met(result.limit_key(), MoneyLimit(
            **result.limit(), balance_left=_rounded(self.parts.admission.spendable()),
            worst_case_request=round(self.ticket.reservation, 6)))
        self.parts.stop(StopReason.for_limit(result.limit_source))
        return False

    async def _on_auth(self, result: Attempt) -> bool:
        self.parts.stop(StopReason.AUTH)
        return False

    async def _on_no_route(self, result: Attempt) -> bool:
        if self.policy is not self.parts.policy:
            # the providers this prompt ignores left no route: its failure, not the run's
            last = self.refused[-1]
            self._fail(last.kind, Attempt(AttemptKind.PERMANENT, message=(
                f"{last.message}; no provider left after ignoring {', '.join(self.policy.ignore)}"),
                status=404), provider=last.provider, generation_id=last.generation_id)
            return False
        self.parts.say(f"kp-infer: {result.message}")
        self.parts.stop(StopReason.NO_ROUTE)
        return False

    async def _on_permanent(self, result: Attempt) -> bool:
        self._fail(FailureKind.PERMANENT, result)
        return False

    HANDLERS: dict[AttemptKind, Callable[[PromptWork, Attempt], Awaitable[bool]]] = {
        AttemptKind.OK: _on_ok,
        AttemptKind.RETRY: _on_retry,
        AttemptKind.WAIT: _on_wait,
        AttemptKind.PAYMENT: _on_payment,
        AttemptKind.AUTH: _on_auth,
        AttemptKind.NO_ROUTE: _on_no_route,
        AttemptKind.PERMANENT: _on_permanent,
        AttemptKind.CANCELLED: _on_cancelled,
    }
    assert set(HANDLERS) == set(AttemptKind), "every attempt kind has its handler"

    # -- the steps the handlers share -----------------------------------------------------
    async def _settle_cost(self, answer: Attempt, refused: tuple[RefusalKind, str] | None,
                           latency: float) -> str:
        """Set ANSWER's cost when its usage showed none (infer/costs.py): GET /generation's
        figure, else the estimate; where it came from. Meanwhile the prompt's reservation
        (its worst case, at least the estimate) stays held: every cap counts it. Cancelled
        (the grace period ended, a second Ctrl-C), the answer is kept at its estimate now:
        its record written, or its refusal on the failure line, then the cancel goes on."""
        parts = self.parts
        if answer.api is not None:  # a self-hosted server's: it costs nothing (infer/servers.py)
            source = costs.SERVER
        elif answer.cost is not None:
            source = costs.USAGE
        else:
            try:
                answer.cost, source = await costs.settle(
                    answer, parts.budget.price, self.ticket.reservation, parts.read_cost,
                    parts.cost_lookup_wait)
            except asyncio.CancelledError:
                answer.cost = costs.estimate(answer, parts.budget.price, self.ticket.reservation)
                parts.stats.cost_settled(costs.ESTIMATE)
                if refused is None:
                    self._accept(answer, latency, costs.ESTIMATE)
                else:  # (the failure line is written as the work ends: not sent again)
                    self._book_refusal(answer, *refused, costs.ESTIMATE)
                raise
        parts.stats.cost_settled(source)
        return source

    async def _settle_identity(self, judge, check, answer: Attempt, source: str) -> None:
        """Wait for a PENDING identity verdict (infer/identity.py) without holding a
        concurrency slot, so that the next requests reach the other providers whose answers
        settle it. Cancelled meanwhile, the answer is booked as refused (paid, not kept)."""
        parts = self.parts
        await self.ticket.give_back_slot()
        try:
            await judge.settle(check, parts.state.stopping)
        except asyncio.CancelledError:
            self._book_refusal(answer, RefusalKind.IDENTITY,
                               "its identity was not settled when the run was cancelled", source)
            raise

    async def _move_to_openrouter(self, result: Attempt) -> None:
        """A prompt of the servers (infer/servers.py `Route`) whose servers are all down goes
        to OpenRouter, when the run has it and the prompt's worst case fits the money caps
        now (else it stays, and is sent to the servers again)."""
        if self.route is None or not self.route.may_move(result.cause):
            return
        worst = self.parts.budget.worst_case(prompt_token_bound(self.prompt.messages))
        if await self.ticket.add(worst):
            self.route.move_to_openrouter()

    async def _sleep_unless_stopped(self, delay: float) -> bool:
        """Wait DELAY seconds before sending again; False when the run stops meanwhile."""
        stopping = self.parts.state.stopping
        try:
            await asyncio.wait_for(stopping.wait(), timeout=delay)
        except TimeoutError:
            pass
        return not stopping.is_set()

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        retries = self.parts.retries
        delay = min(retries.backoff_max, retries.backoff_base * 2 ** (attempt - 1))
        delay *= random.uniform(0.5, 1.5)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay

    def _book_refusal(self, answer: Attempt, kind: RefusalKind, why: str, source: str,
                      offset: int | None = None) -> None:
        """A refused ANSWER (paid for, its cost settled): booked, and kept for the record
        (OFFSET: its prompt count against kimipipe's, refused for identity)."""
        parts = self.parts
        parts.budget.record(answer.cost, 0)
        self.refused.append(Refusal(kind=kind, provider=answer.provider, cost=answer.cost,
                                    generation_id=answer.generation_id, message=why,
                                    cost_source=source, offset=offset))
        parts.stats.refusal(answer, kind)

    async def _refuse(self, answer: Attempt, kind: RefusalKind, why: str, source: str,
                      offset: int | None = None) -> bool:
        """Count a refused ANSWER (paid for, its cost settled); True when the prompt is sent
        again (with the policy for its next attempt), False when not: a failure of KIND
        after --max-attempts, else a stop came first (run()'s end writes it as STOPPED)."""
        parts = self.parts
        self._book_refusal(answer, kind, why, source, offset)
        if self.attempts >= parts.retries.max_attempts:
            self._fail(kind, Attempt(AttemptKind.PERMANENT, message=why, status=200),
                       provider=answer.provider, generation_id=answer.generation_id)
            return False
        if not await self.ticket.room_for_next_attempt():
            return False  # not sent again: run()'s end keeps the paid answers (STOPPED)
        parts.stats.retried(kind)
        self.policy = parts.acceptance.next_policy(self.policy, answer.provider)
        return True

    def _accept(self, answer: Attempt, latency: float | None, source: str,
                identity_mark=None) -> None:
        """Write ANSWER's record (its cost settled: SOURCE; IDENTITY_MARK: the counts it was
        checked against) and book it."""
        parts = self.parts
        cost = answer.cost
        refused, self.refused = self.refused, []
        kept = parts.output.write_response(self.line, answer, self.attempts, refused=refused,
                                           latency=latency, cost=cost, cost_source=source,
                                           identity=identity_mark, retried=self.retried)
        if kept != WRITTEN:  # paid all the same: in the rescue file, or lost (stdout closed)
            parts.budget.record(cost, 0)  # (the refused answers' cost is recorded already)
            parts.stats.not_written(answer, cost + sum(r.cost for r in refused),
                                    rescued=kept == RESCUED)
            self._output_failed()  # no point paying for answers that cannot be kept
            return
        parts.done.add(self.prompt.id)
        self.kept = answer
        parts.budget.record(cost, answer.completion_tokens)
        parts.stats.answered(answer, latency)
        parts.progress.finished_one()
        if parts.budget.tokens_exhausted() and not parts.state.stopping.is_set():
            parts.stop(StopReason.TOKEN_BUDGET)

    def _fail(self, kind: str, attempt: Attempt, *, provider: str | None = None,
              generation_id: str | None = None) -> None:
        parts = self.parts
        refused, self.refused = self.refused, []  # paid for: their cost is the failure's
        parts.stats.failure(kind, attempt)
        kept = parts.output.write_failure(failure_record(
            self.prompt, kind, attempt, self.attempts, provider=provider,
            generation_id=generation_id, cost=sum(r.cost for r in refused), refused=refused,
            retried=self.retried))
        parts.progress.finished_one()
        if kept != WRITTEN:
            parts.stats.failure_not_written(rescued=kept == RESCUED)
            self._output_failed()
        if kind == FailureKind.PERMANENT and (
                why := parts.systematic.permanent_failure(attempt, parts.stats.done)):
            parts.say(f"kp-infer: {why}")
            parts.stop(StopReason.SYSTEMATIC)

    def _output_failed(self) -> None:
        """A file refused a write: said once (and where what arrives now is kept), a stop."""
        stop, note = self.parts.output.refusal()
        if note is not None:
            self.parts.say(note)
        self.parts.stop(stop)
