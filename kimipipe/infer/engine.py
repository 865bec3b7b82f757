"""kp-infer's run: validate, resume, admit under budget and concurrency, retry, write.

The order of a run:
1. Validate the whole input (format, duplicate IDs, empty messages) before a single
   request is sent; stdin is spooled to a temporary file for the second pass.
2. Resume: IDs already in OUTPUT (after torn-tail repair) and in `--done` files are
   skipped; spend and completion tokens recorded there count against the budgets.
3. Stream the input again; each prompt not done is admitted when a concurrency slot is
   free and its worst-case cost fits the budget (kimipipe/infer/budget.py), then sent by
   the transport (in-process client or worker processes) until it gets an answer or a
   permanent failure.
4. Each answer is checked against the routing policy and written whole, flushed, as it
   completes. A stop (budget, 402, balance, signal) ends admission; requests in flight
   finish within the grace period; the summary is printed.

Memory holds the IDs, the requests in flight and their prompt lines; answers are written
as they arrive.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import msgspec

from ..errors import ExitCode, InputError, redact
from ..io import (
    RecordWriter,
    iter_finished,
    iter_records,
    repair_and_report,
    require_distinct,
    scan_done,
)
from ..openrouter.attempt import Attempt
from ..openrouter.request import RequestOptions
from ..openrouter.routing import Endpoint, Policy, routing_violation
from ..partition import in_partition
from ..records import CostOnly, Prompt, decode_passthrough, encode_line, merge_fields
from .budget import Budget, prompt_token_bound
from .limiter import AdaptiveLimiter

STOP_EXIT = {
    "max-cost": ExitCode.BUDGET,
    "token-budget": ExitCode.BUDGET,
    "payment": ExitCode.BUDGET,
    "min-credits": ExitCode.BUDGET,
    "interrupted": ExitCode.INTERRUPTED,
    "auth": ExitCode.USAGE,
    "no-route": ExitCode.USAGE,
    "output": ExitCode.ERROR,
}

STOP_MESSAGES = {
    "max-cost": "stopped: --max-cost reached; raise it and rerun to resume",
    "token-budget": "stopped: --token-budget reached; raise it and rerun to resume",
    "payment": "stopped: OpenRouter answered 402 (balance or key limit too low); add credits and rerun to resume",
    "min-credits": "stopped: account balance below --min-credits; add credits and rerun to resume",
    "interrupted": "interrupted; rerun the same command to resume",
    "auth": "stopped: OpenRouter rejected the API key (401); check OPENROUTER_API_KEY",
    "no-route": "stopped: no provider matches the routing flags (404); check --ignore-provider/--only-provider/--quantization (try --plan)",
    "output": "stopped: the output cannot be written (a closed pipe or a full disk); fix it and rerun with -o to resume",
}

_prompt_decoder = msgspec.json.Decoder(Prompt)
_cost_decoder = msgspec.json.Decoder(CostOnly)


class _FailureCost(msgspec.Struct):
    cost: float = 0.0


_failure_decoder = msgspec.json.Decoder(_FailureCost)


@dataclass
class RunConfig:
    input: str
    output: str
    request: RequestOptions
    policy: Policy
    done_files: list[str] = field(default_factory=list)
    failures: str | None = None
    concurrency: int = 64
    max_attempts: int = 8
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    max_cost: float | None = None
    token_budget: int | None = None
    min_credits: float | None = None
    credits_interval: float = 60.0
    grace: float = 300.0
    partition: tuple[int, int] | None = None


@dataclass
class Stats:
    todo: int = 0
    skipped: int = 0
    done: int = 0
    failed: Counter = field(default_factory=Counter)
    retries: Counter = field(default_factory=Counter)
    providers: Counter = field(default_factory=Counter)
    finish_reasons: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    abandoned: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass
class InputScan:
    path: str  # a re-readable path (stdin spooled)
    shown: str
    ids: set[str]
    records: int
    prompt_bytes: int
    prompt_token_bound: int


def spool_stdin(tmpdir: str) -> str:
    path = os.path.join(tmpdir, "stdin.jsonl")
    with open(path, "wb") as f:
        shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
    return path


def validate_input(path: str, shown: str) -> InputScan:
    """Check every line before any money is spent: format, duplicate IDs, empty messages."""
    first_line: dict[str, int] = {}
    prompt_bytes = 0
    token_bound = 0
    records = 0
    for lineno, prompt, _line in iter_records(path, _prompt_decoder):
        if prompt.id in first_line:
            raise InputError(f"duplicate id {prompt.id!r} (first at line {first_line[prompt.id]})",
                             shown, lineno)
        if not prompt.messages:
            raise InputError("empty `messages` at `$.messages`", shown, lineno)
        if not any(m.role == "user" for m in prompt.messages):
            raise InputError("no user message at `$.messages`", shown, lineno)
        first_line[prompt.id] = lineno
        records += 1
        prompt_bytes += sum(len(m.content.encode()) for m in prompt.messages)
        token_bound += prompt_token_bound(prompt.messages)
    return InputScan(path, shown, set(first_line), records, prompt_bytes, token_bound)


def previous_work(output: str, failures: str | None) -> tuple[set[str], float, int]:
    """(IDs done, USD, completion tokens) recorded by earlier runs, in one pass over OUTPUT
    (after repairing a torn last line) plus the failures file's costs."""
    repair_and_report(output)
    done: set[str] = set()
    cost = 0.0
    tokens = 0
    for rec in iter_finished(output, _cost_decoder):
        done.add(rec.id)
        cost += rec.usage.cost
        tokens += rec.usage.completion_tokens
    if failures and os.path.exists(failures):
        for rec in iter_finished(failures, _failure_decoder):
            cost += rec.cost
    return done, cost, tokens


class Run:
    """One kp-infer run over a validated input (see the module docstring)."""

    def __init__(self, config: RunConfig, scan: InputScan, done: set[str], budget: Budget,
                 endpoints: list[Endpoint] | None, transport, progress, balance_check=None):
        self.c = config
        self.scan = scan
        self.done = done
        self.budget = budget
        self.endpoints = endpoints
        self.transport = transport
        self.progress = progress
        self.balance_check = balance_check  # async () -> remaining USD, or None
        self.stats = Stats()
        self.limiter = AdaptiveLimiter(config.concurrency)
        self.stop_reason: str | None = None
        self.stopping = asyncio.Event()
        self.settled = asyncio.Event()
        self.tasks: set[asyncio.Task] = set()
        self.writer: RecordWriter | None = None
        self.failures: RecordWriter | None = None
        self._last_postfix = 0.0
        self._interrupts = 0
        self.in_progress: set[str] = set()
        self.output_error: OSError | None = None

    def _note(self, message: str) -> None:
        """A line on stderr between progress bar updates; --quiet (a disabled bar) silences it."""
        if not getattr(self.progress, "disable", False):
            self.progress.write(redact(message), file=sys.stderr)

    # -- stopping -------------------------------------------------------------------------
    def stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self._note(f"kp-infer: {STOP_MESSAGES[reason]}"
                       + (f"; waiting for {self.limiter.in_flight} requests in flight"
                          if self.limiter.in_flight else ""))
        self.stopping.set()
        self.settled.set()

    def _on_signal(self) -> None:
        self._interrupts += 1
        if self._interrupts == 1:
            self.stop("interrupted")
            self._note("kp-infer: press Ctrl-C again to cancel requests in flight now")
        else:
            for task in list(self.tasks):
                task.cancel()

    # -- the run --------------------------------------------------------------------------
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._on_signal)
            except (NotImplementedError, RuntimeError):
                pass
        self.writer = RecordWriter(self.c.output, append=True, durable=True)
        if self.c.failures:
            self.failures = RecordWriter(self.c.failures, append=True, durable=True)
        poller = None
        try:
            if self.balance_check is not None:
                await self._check_balance()
                poller = asyncio.create_task(self._poll_balance())
            if not self.stopping.is_set():
                await self._admit_all()
            await self._drain()
        finally:
            if poller:
                poller.cancel()
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.remove_signal_handler(sig)
                except (NotImplementedError, RuntimeError):
                    pass
            try:
                self.writer.close()
            except OSError:
                pass  # already reported as an output stop
            if self.failures:
                self.failures.close()
        return self.exit_code()

    def exit_code(self) -> int:
        if self.stop_reason:
            return STOP_EXIT[self.stop_reason]
        if sum(self.stats.failed.values()):
            return ExitCode.PARTIAL
        return ExitCode.OK

    async def _admit_all(self) -> None:
        for _lineno, prompt, line in iter_records(self.scan.path, _prompt_decoder):
            if prompt.id in self.done or not in_partition(prompt.id, self.c.partition):
                continue
            reservation = self.budget.worst_case(prompt_token_bound(prompt.messages))
            if not await self._wait_for_budget(reservation):
                return
            if not await self._acquire_unless_stopped():
                return
            self.budget.reserve(reservation)
            self.in_progress.add(prompt.id)
            task = asyncio.create_task(self._handle(prompt, line, reservation))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _acquire_unless_stopped(self) -> bool:
        """A concurrency slot for a new request; False (and no slot) once the run stops."""
        if self.limiter.in_flight < self.limiter.current:
            await self.limiter.acquire()
        else:
            acquire = asyncio.create_task(self.limiter.acquire())
            stopped = asyncio.create_task(self.stopping.wait())
            await asyncio.wait({acquire, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not acquire.done():
                acquire.cancel()
                await asyncio.wait({acquire})
            if acquire.cancelled():
                return False
        if self.stopping.is_set():
            await self.limiter.release()
            return False
        return True

    async def _wait_for_budget(self, reservation: float) -> bool:
        """Wait until the next request's worst case fits; False when the run must stop."""
        while not self.stopping.is_set():
            if self.budget.tokens_exhausted():
                self.stop("token-budget")
                return False
            fits_cost = self.budget.cost_fits(reservation)
            # in_progress, not tasks: a finished task leaves `tasks` only in a later callback
            if fits_cost and self.budget.tokens_fit(len(self.in_progress)):
                return True
            if not self.in_progress:  # nothing in flight will free budget
                if not fits_cost:
                    self.stop("max-cost")
                    return False
                return True
            self.settled.clear()
            await self.settled.wait()
        return False

    async def _drain(self) -> None:
        if not self.tasks:
            return
        if not self.stopping.is_set():
            await asyncio.wait(set(self.tasks))
            return
        _done, pending = await asyncio.wait(set(self.tasks), timeout=self.c.grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
            self.stats.abandoned += len(pending)

    # -- one prompt -----------------------------------------------------------------------
    async def _handle(self, prompt: Prompt, line: bytes, reservation: float) -> None:
        body = self.c.request.body(prompt, self.c.policy)
        attempts = 0
        holding_slot = True
        try:
            while True:
                attempts += 1
                result: Attempt = await self.transport.attempt(body, self.c.request.stream)
                if result.kind == "ok":
                    self._accept(prompt, line, result, attempts)
                    return
                if result.kind == "retry":
                    self.stats.retries[result.cause] += 1
                    if result.cause == "429":
                        self.limiter.rate_limited()
                    if attempts >= self.c.max_attempts:
                        self._fail(prompt, "retries_exhausted", result, attempts)
                        return
                    await self.limiter.release()
                    holding_slot = False
                    delay = self._backoff(attempts, result.retry_after)
                    try:
                        await asyncio.wait_for(self.stopping.wait(), timeout=delay)
                    except TimeoutError:
                        pass
                    if self.stopping.is_set():
                        return  # not sent again: a stop admits no new requests
                    await self.limiter.acquire()
                    holding_slot = True
                    if self.stopping.is_set():
                        return
                    continue
                if result.kind == "payment":
                    self.stats.retries["402"] += 1
                    self.stop("payment")
                    return
                if result.kind == "auth":
                    self.stop("auth")
                    return
                if result.kind == "no_route":
                    self._note(f"kp-infer: {result.message}")
                    self.stop("no-route")
                    return
                self._fail(prompt, "permanent", result, attempts)
                return
        finally:
            self.in_progress.discard(prompt.id)
            self.budget.release(reservation)
            if holding_slot:
                await self.limiter.release()
            self.settled.set()
            self._show_progress()

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = min(self.c.backoff_max, self.c.backoff_base * 2 ** (attempt - 1))
        delay *= random.uniform(0.5, 1.5)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay

    def _accept(self, prompt: Prompt, line: bytes, r: Attempt, attempts: int) -> None:
        cost = r.cost if r.cost is not None else 0.0
        self.stats.prompt_tokens += r.prompt_tokens
        violation = routing_violation(self.c.policy, r.provider, self.endpoints)
        if violation:
            self.budget.record(cost, 0)
            self._fail(prompt, "routing_violation", Attempt("permanent", message=violation,
                       status=200), attempts, provider=r.provider, cost=cost,
                       generation_id=r.generation_id)
            return
        owned = {
            "response": {"content": r.content, "reasoning": r.reasoning},
            "finish_reason": r.finish_reason,
            "model": r.model or self.c.request.model,
            "provider": r.provider,
            "generation_id": r.generation_id,
            "usage": {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                      "reasoning_tokens": r.reasoning_tokens, "cost": cost},
            "attempts": attempts,
        }
        try:
            self.writer.write_line(encode_line(merge_fields(decode_passthrough(line), owned)))
        except OSError as e:  # no point paying for answers that cannot be kept
            self.output_error = e
            self.stop("output")
            return
        self.done.add(prompt.id)
        self.budget.record(cost, r.completion_tokens)
        self.stats.done += 1
        self.stats.completion_tokens += r.completion_tokens
        self.stats.reasoning_tokens += r.reasoning_tokens
        self.stats.providers[r.provider or "unknown"] += 1
        self.stats.finish_reasons[r.finish_reason or "none"] += 1
        self.progress.update(1)
        if self.budget.tokens_exhausted() and not self.stopping.is_set():
            self.stop("token-budget")

    def _fail(self, prompt: Prompt, kind: str, r: Attempt, attempts: int, *,
              provider: str | None = None, cost: float = 0.0, generation_id: str | None = None) -> None:
        self.stats.failed[kind if kind != "permanent" else f"http_{r.status or r.cause}"] += 1
        if self.failures is not None:
            record = {"id": prompt.id, "dataset": prompt.dataset, "kind": kind, "status": r.status,
                      "code": r.code or r.cause, "message": redact(r.message), "attempts": attempts,
                      "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            if provider:
                record["provider"] = provider
            if generation_id:
                record["generation_id"] = generation_id
            if cost:
                record["cost"] = cost
            self.failures.write_line(encode_line(record))
        self.progress.update(1)

    # -- balance --------------------------------------------------------------------------
    async def _check_balance(self) -> None:
        try:
            remaining = await self.balance_check()
        except Exception as e:  # a failed poll is not a reason to stop paid work
            self._note(f"kp-infer: warning: could not read the balance: {e}")
            return
        if remaining is not None and remaining < self.c.min_credits:
            self.stop("min-credits")

    async def _poll_balance(self) -> None:
        while not self.stopping.is_set():
            await asyncio.sleep(self.c.credits_interval)
            await self._check_balance()

    # -- progress -------------------------------------------------------------------------
    def _show_progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_postfix < 0.5:
            return
        self._last_postfix = now
        elapsed = max(1e-6, now - self.stats.started)
        parts = [f"in flight {self.limiter.in_flight}/{self.limiter.current}",
                 f"{self.stats.completion_tokens / elapsed:,.0f} tok/s",
                 f"${self.budget.spent_this_run:.4f}"]
        remaining = self.budget.remaining_cost()
        if remaining is not None:
            parts.append(f"${remaining:.2f} left")
        if self.budget.token_budget:
            parts.append(f"{max(0, self.budget.token_budget - self.budget.tokens):,} tok left")
        if self.stats.retries:
            parts.append("retries " + " ".join(f"{k}:{v}" for k, v in self.stats.retries.most_common()))
        self.progress.set_postfix_str(", ".join(parts), refresh=False)

    def summary(self) -> dict:
        elapsed = time.monotonic() - self.stats.started
        s = self.stats
        total_providers = sum(s.providers.values())
        return {
            "exit_code": self.exit_code(),
            "stop_reason": self.stop_reason,
            "input_records": self.scan.records,
            "todo": s.todo,
            "skipped": s.skipped,
            "done": s.done,
            "failed": dict(s.failed),
            "retries": dict(s.retries),
            "abandoned_in_flight": s.abandoned,
            "spend_this_run": round(self.budget.spent_this_run, 10),
            "spend_total": round(self.budget.spent, 10),
            "max_cost": self.c.max_cost,
            "tokens": {"prompt": s.prompt_tokens, "completion": s.completion_tokens,
                       "reasoning": s.reasoning_tokens,
                       "completion_total": self.budget.tokens},
            "token_budget": self.c.token_budget,
            "providers": {k: round(v / total_providers, 4) for k, v in s.providers.most_common()}
            if total_providers else {},
            "finish_reasons": dict(s.finish_reasons),
            "elapsed_s": round(elapsed, 3),
            "requests_per_s": round(s.done / elapsed, 3) if elapsed else 0.0,
            "completion_tokens_per_s": round(s.completion_tokens / elapsed, 1) if elapsed else 0.0,
            "concurrency_limit_end": self.limiter.current,
        }


def format_summary(summary: dict) -> str:
    lines = [
        f"kp-infer: {summary['done']} done, {summary['skipped']} skipped (already done), "
        f"{sum(summary['failed'].values())} failed"
        + (f" ({', '.join(f'{k}: {v}' for k, v in summary['failed'].items())})" if summary['failed'] else ""),
        f"  spend: ${summary['spend_this_run']:.6f} this run, ${summary['spend_total']:.6f} in all"
        + (f" (cap ${summary['max_cost']:g})" if summary['max_cost'] is not None else ""),
        f"  tokens: {summary['tokens']['completion']:,} completion "
        f"({summary['tokens']['reasoning']:,} reasoning), {summary['tokens']['prompt']:,} prompt; "
        f"{summary['tokens']['completion_total']:,} completion in all"
        + (f" (budget {summary['token_budget']:,})" if summary['token_budget'] else ""),
        f"  throughput: {summary['requests_per_s']:.2f} req/s, "
        f"{summary['completion_tokens_per_s']:,.0f} tok/s over {summary['elapsed_s']:.1f} s",
    ]
    if summary["retries"]:
        lines.append("  retries: " + ", ".join(f"{k}: {v}" for k, v in summary["retries"].items()))
    if summary["providers"]:
        lines.append("  providers: " + ", ".join(f"{k} {v:.0%}" for k, v in summary["providers"].items()))
    if summary["abandoned_in_flight"]:
        lines.append(f"  abandoned in flight after the grace period: {summary['abandoned_in_flight']}")
    if summary["stop_reason"]:
        lines.append(f"  {STOP_MESSAGES[summary['stop_reason']]}")
    return "\n".join(lines)


def prepare(config: RunConfig, tmpdir: str) -> tuple[InputScan, set[str], float, int]:
    """Validation and resume state, before anything is sent."""
    path, shown = config.input, config.input
    if path == "-":
        path, shown = spool_stdin(tmpdir), "<stdin>"
    scan = validate_input(path, shown)
    require_distinct(config.output, config.input, *config.done_files)
    done, spent, tokens = previous_work(config.output, config.failures)
    for extra in config.done_files:
        if not os.path.exists(extra):
            raise InputError("no such file", extra)
        done |= scan_done(extra, repair=False)
    return scan, done, spent, tokens
