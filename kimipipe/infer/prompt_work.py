"""What happens to one admitted prompt of a kp-infer run: its attempts and what each ends in.

`PromptWork` is the half of `infer.run.Run` that owns one prompt from admission to its record:
it sends the request through the transport until an answer or a permanent failure, with
jittered exponential backoff between retryable attempts (a 429 also shrinks the concurrency
limit); an in-flight 402 (kind "wait") is no failed attempt: the request gives back its
slot and its money in flight (whose ceiling the 402 cuts: infer/inflight.py), waits
`Retry-After` and is admitted again; a money limit (kind "payment": the balance, the key's
limit, a workspace or guardrail budget) stops the run and fails no prompt; checks each answer (routing, the reasoning asked for: `Output.refusal`), sends a
refused one again at once with its provider ignored while `--max-attempts`, the run and
`--max-cost` allow (the prompt's reservation still covers the next attempt's worst case);
writes the answer or the failure record whole (infer/output.py), and keeps in the rescue
file what a failing output cannot take. Admission, stops and draining stay in `Run`.
"""

from __future__ import annotations

import asyncio
import random
import time

from ..openrouter.attempt import Attempt
from ..openrouter.routing import Policy
from ..records import Prompt, Refusal
from .output import RESCUED, WRITTEN, failure_record
from .report import StopReason


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


class PromptWork:
    """Mixed into `Run`, whose state it uses (config, transport, limiter, money, budget,
    disk, output, stats, refused, in_progress, stopping, settled, progress, stop, say)."""

    # -- one prompt -----------------------------------------------------------------------
    async def _handle(self, prompt: Prompt, line: bytes, reservation: float,
                      record_bound: int = 0, session_id: str | None = None) -> Attempt | None:
        """The answer kept for PROMPT (written, or at least paid for), else None.
        SESSION_ID: a conversation's, sent with each of its requests (sticky routing)."""
        policy = self.config.policy
        body = self.config.request.body(prompt, policy, session_id)
        attempts = 0
        holding_slot = holding_money = True
        try:
            while True:
                attempts += 1
                started = time.monotonic()
                result: Attempt = await self.transport.attempt(body, self.config.request.stream)
                if result.kind == "ok":
                    refused = self.output.refusal(result)
                    if refused is None:
                        self._accept(prompt, line, result, attempts, time.monotonic() - started)
                        return result
                    policy = self._refuse(prompt, result, *refused, attempts, policy)
                    if policy is None:
                        return None
                    body = self.config.request.body(prompt, policy, session_id)  # its own provider.ignore
                    continue
                if result.kind == "retry":
                    self.stats.retries[result.cause] += 1
                    if result.cause == "429":
                        self.limiter.rate_limited()
                    if attempts >= self.config.max_attempts:
                        self._fail(prompt, "retries_exhausted", result, attempts)
                        return
                    await self.limiter.release()
                    holding_slot = False
                    if not await self._sleep_unless_stopped(self._backoff(attempts, result.retry_after)):
                        return  # not sent again: a stop admits no new requests
                    # a slot again, unless the run stops while waiting for one (a Ctrl-C
                    # must not wait for a slot that only a long answer would free)
                    if not await self._acquire_unless_stopped():
                        return
                    holding_slot = True
                    continue
                if result.kind == "wait":  # the in-flight budget is full: not this prompt's fault
                    attempts -= 1
                    self.stats.retries[result.cause] += 1
                    self.stats.limit_refusals[result.limit_key()] += 1
                    self.money.refused(result.retry_after)
                    self.money.release(reservation, finished=False)
                    holding_money = False
                    await self.limiter.release()
                    holding_slot = False
                    delay = result.retry_after if result.retry_after is not None else self._backoff(1, None)
                    if not await self._sleep_unless_stopped(delay) or not await self.money.acquire(reservation):
                        return
                    holding_money = True
                    if not await self._acquire_unless_stopped():
                        return
                    holding_slot = True
                    continue
                if result.kind == "payment":
                    self.stats.limit_refusals[result.limit_key()] += 1
                    if self.stats.limit is None:
                        self.stats.limit = {**result.limit(), "balance_left": _rounded(self.money.spendable()),
                                            "worst_case_request": round(reservation, 6)}
                    self.stop(StopReason.for_limit(result.limit_source))
                    return
                if result.kind == "auth":
                    self.stop(StopReason.AUTH)
                    return
                if result.kind == "no_route" and policy is not self.config.policy:
                    # the providers this prompt ignores left no route: its failure, not the run's
                    last = self.refused[prompt.id][-1]
                    self._fail(prompt, last.kind, Attempt("permanent", message=(
                        f"{last.message}; no provider left after ignoring {', '.join(policy.ignore)}"),
                        status=404), attempts, provider=last.provider, generation_id=last.generation_id)
                    return
                if result.kind == "no_route":
                    self.say(f"kp-infer: {result.message}")
                    self.stop(StopReason.NO_ROUTE)
                    return
                self._fail(prompt, "permanent", result, attempts)
                return
        finally:
            if prompt.id in self.refused:  # refused, paid for, and not sent again: a stop
                last = self.refused[prompt.id][-1]
                self._fail(prompt, last.kind, Attempt("permanent", status=200, message=(
                    f"{last.message}; not sent again: the run stopped")), attempts,
                    provider=last.provider, generation_id=last.generation_id)
            self.in_progress.pop(prompt.id, None)
            self.budget.release(reservation)
            self.disk.release(record_bound)
            if holding_money:
                self.money.release(reservation)
            if holding_slot:
                await self.limiter.release()
            self.settled.set()
            self._show_progress()

    async def _sleep_unless_stopped(self, delay: float) -> bool:
        """Wait DELAY seconds before sending again; False when the run stops meanwhile."""
        try:
            await asyncio.wait_for(self.stopping.wait(), timeout=delay)
        except TimeoutError:
            pass
        return not self.stopping.is_set()

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = min(self.config.backoff_max, self.config.backoff_base * 2 ** (attempt - 1))
        delay *= random.uniform(0.5, 1.5)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay

    def _refuse(self, prompt: Prompt, answer: Attempt, kind: str, why: str, attempts: int,
                policy: Policy) -> Policy | None:
        """Count a refused ANSWER (paid for); the policy for the prompt's next attempt, or
        None when it is not sent again (then it is a failure of KIND)."""
        cost = answer.cost if answer.cost is not None else 0.0
        self.stats.prompt_tokens += answer.prompt_tokens
        self.budget.record(cost, 0)
        self.refused.setdefault(prompt.id, []).append(Refusal(
            kind=kind, provider=answer.provider, cost=cost, generation_id=answer.generation_id,
            message=why))
        self.stats.refusal(answer.provider, kind, cost)
        if (attempts >= self.config.max_attempts or self.stopping.is_set()
                or not self.budget.cost_fits(0)):  # the next attempt's worst case must still fit
            self._fail(prompt, kind, Attempt("permanent", message=why, status=200), attempts,
                       provider=answer.provider, generation_id=answer.generation_id)
            return None
        self.stats.retries[kind] += 1
        return self.output.next_policy(policy, answer.provider)

    def _accept(self, prompt: Prompt, line: bytes, answer: Attempt, attempts: int,
                latency: float | None = None) -> None:
        cost = answer.cost if answer.cost is not None else 0.0
        self.stats.prompt_tokens += answer.prompt_tokens
        refused = self.refused.pop(prompt.id, [])
        kept = self.output.write_response(line, answer, attempts, refused=refused, latency=latency)
        if kept != WRITTEN:  # paid all the same: in the rescue file, or lost (stdout closed)
            self.budget.record(cost, 0)  # (the refused answers' cost is recorded already)
            self.stats.not_written(cost + sum(r.cost for r in refused), rescued=kept == RESCUED)
            self._output_failed()  # no point paying for answers that cannot be kept
            return
        self.done.add(prompt.id)
        self.budget.record(cost, answer.completion_tokens)
        self.stats.answered(answer, latency)
        self.progress.update(1)
        if self.budget.tokens_exhausted() and not self.stopping.is_set():
            self.stop(StopReason.TOKEN_BUDGET)

    def _fail(self, prompt: Prompt, kind: str, attempt: Attempt, attempts: int, *,
              provider: str | None = None, generation_id: str | None = None) -> None:
        refused = self.refused.pop(prompt.id, [])  # paid for: their cost is the failure's
        self.stats.failure(kind, attempt)
        kept = self.output.write_failure(failure_record(
            prompt, kind, attempt, attempts, provider=provider, generation_id=generation_id,
            cost=sum(r.cost for r in refused), refused=refused))
        self.progress.update(1)
        if kept != WRITTEN:
            self.stats.failure_not_written(rescued=kept == RESCUED)
            self._output_failed()

    def _output_failed(self) -> None:
        """A file refused a write: say so once (and where what arrives now is kept), stop."""
        output = self.output
        if output.error_file == "-":
            self.stop(StopReason.CLOSED_PIPE)
            return
        if self.stats.write_error is None:
            error = output.error
            self.stats.write_error = f"{output.error_file}: {error.strerror or error}"
            rescue = output.rescues.get("failures" if output.error_file == self.config.failures
                                        else "output")
            self.say(f"kp-infer: cannot write {self.stats.write_error} (it ends with its last "
                     "whole record); answers paid for that it cannot take are kept in "
                     f"{rescue.path} for the next run")
        self.stats.rescue_files = {name: r.path for name, r in output.rescues.items() if r.saved}
        self.stats.rescue_errors = [r.error for r in output.rescues.values() if r.error]
        self.stop(StopReason.DISK if output.disk_full else StopReason.OUTPUT)
