"""A kp-infer run: admission under concurrency and budget, retries, draining, signals.

`run_infer(config, say)` is the entry point commands/infer.py calls: it prepares the run
(infer/prepare.py), shows the plan (`--plan`, infer/plan.py) or runs it, writes the
summary (infer/report.py) and returns the exit code.

The run itself (`Run`) streams the validated input again. Each prompt not done is
admitted (infer/admission.py: one `Ticket` holds what it took) when a concurrency slot
is free (infer/limiter.py: the limit shrinks on 429s), its worst-case cost fits the budget (infer/budget.py) and the money in flight
(infer/inflight.py: the sum of the worst cases in flight stays under a ceiling sized to
the balance read at the start, refreshed every --credits-interval, cut by OpenRouter's
in-flight 402s and grown back while none come), and its worst-case record fits the
free space of the output's filesystem (infer/disk.py); it is then sent by the
transport (infer/transport.py) until it gets an answer or a permanent failure, with
jittered exponential backoff between attempts. Each answer is checked (routing, and the
reasoning asked for: infer/acceptance.py) and written whole as it completes
(infer/writing.py); a refused
answer is paid for and the prompt sent again at once with its provider ignored, while
`--max-attempts`, the run and `--max-cost` allow. An answer the output
cannot take (a full disk) stops the run and is kept in the rescue file, as is every answer
still arriving, for the next run to take in (infer/rescue.py). What happens to one
admitted prompt (attempts, retries, refused answers, records) is a `PromptWork` of its own
(infer/prompt_work.py), given the run's parts explicitly (`RunParts`) and its ticket, with
one handler per attempt kind.

An in-flight 402 is a wait, never a stop. A stop ends admission: the budget (`--max-cost`,
`--token-budget`), a money limit OpenRouter names (the balance, the key's limit, a
workspace or guardrail budget: 402 or 403 with `limit_source`; no prompt is failed for
it), the balance under `--min-credits` (polled), a 401 or 404, a failed write to the
output, or SIGINT/SIGTERM. Requests in
flight then finish within `--grace` seconds counted from the stop (they are paid for) and
are written, also when the stop comes after the last admission; prompts in back-off are
not sent again; a second Ctrl-C cancels at once. The handlers cover the whole event loop
(the transport's start and close too); outside it SIGINT/SIGTERM exit 130 at once
(`cli.sigterm_as_ctrl_c`). The progress line and its snapshot of the run are
infer/progress.py (`RunProgress`); what the parts share while the run runs (the stop, what
admission waits for, the prompts in progress) is one `RunState` (infer/state.py).
Memory holds the IDs, the requests in flight and their prompt lines."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from ..contracts import InferSummary
from ..errors import ExitCode, KPError
from ..io import iter_records
from ..kinds import StopReason
from ..openrouter.account import (
    GUARD_FIX,
    Account,
    AccountError,
    Balance,
    fetch_balance,
    unreadable_balance,
)
from ..partition import in_partition
from ..recorded.identity_table import state_path
from ..records import Prompt
from ..terminal import stderr_is_terminal
from .acceptance import Acceptance
from .admission import Admission
from .budget import Budget, cap_below_one_request
from .config import RunConfig
from .conversations import ConversationQueue, TurnWork, is_conversation
from .disk import DiskGuard
from .identity import UNCHECKED_WARNING, IdentityJudge, check_tokenizer, load_counts
from .inflight import MoneyInFlight
from .inputs import PROMPT_DECODER
from .limiter import AdaptiveLimiter
from .plan import plan_json, plan_text
from .prepare import Prepared, prepare
from .progress import RunProgress
from .prompt_work import PromptWork, RunParts, Transport
from .report import Stats, exit_code, format_summary, summary, write_summary_json
from .servers import Sources
from .state import RunState, signals_handled
from .systematic import SystematicFailure
from .total_cost import PUBLISH_INTERVAL
from .transport import freeze_startup_objects, open_transport, pace_reads
from .writing import Output, check_outputs, output_locks

if TYPE_CHECKING:
    from ..terminal import Stderr

PRECOUNT = 64  # prompts read ahead and counted at once (--tokenizer: infer/identity.py)


class Run:
    """One kp-infer run over a prepared input (see the module docstring). BAR is the
    progress bar whose description is the progress line."""

    def __init__(self, config: RunConfig, prepared: Prepared, budget: Budget, bar,
                 say: Callable[[str], None], account: Account, counts=None):
        self.config = config
        self.prepared = prepared
        self.budget = budget
        self.say = say
        self.account = account  # the balance: read at the start, polled (--min-credits too)
        self._guard_warned = False  # --min-credits with a key that reads no balance: said once
        self.state = RunState()
        self.output = Output(config)
        self.acceptance = Acceptance.for_run(config.policy, config.request, config.sending.servers,
                                             prepared.endpoints)
        if counts is not None:  # --tokenizer: each answer's identity (infer/identity.py)
            self.acceptance.identity = IdentityJudge(
                counts, config.policy, prepared.endpoints, config.identity.identity_strikes, say,
                state_path(config.files.output), prepared.identity,
                stop=lambda: self.stop(StopReason.IDENTITY), wait=config.identity.identity_wait)
        self.disk = DiskGuard(config.files.output, config.request.max_tokens, config.files.min_free_disk,
                              config.files.disk_wait)
        self.stats = Stats(todo=prepared.todo, skipped=prepared.skipped,
                           taken_in=prepared.taken_in)
        self.limiter = AdaptiveLimiter(config.sending.total_concurrency)
        self.money = MoneyInFlight(lambda: budget.spent_this_run)
        self.admission = Admission(self.state, budget, self.money, self.limiter, self.disk,
                                   self.stop, say, self._show_waiting)
        # conversations (infer/conversations.py): their next turns go ahead of new prompts
        self.conversations = ConversationQueue(config.history_reasoning, prepared.conversations)
        self.progress = RunProgress(bar, config.retries.grace, config.sending.total_concurrency,
                                    prepared.turns_todo, self.state, self.stats,
                                    budget, self.limiter, self.money, stderr_is_terminal(),
                                    self.conversations if prepared.conversations_todo else None)
        self.tasks: set[asyncio.Task] = set()
        self._interrupts = 0

    # -- stopping -------------------------------------------------------------------------
    def stop(self, reason: StopReason) -> None:
        if self.state.stop(reason):
            self.say(f"kp-infer: {reason.message}"
                     + (f"; waiting up to {self.config.retries.grace:g} s (--grace) for "
                        f"{self.limiter.in_flight} requests in flight"
                        if self.limiter.in_flight else ""))
        self.conversations.changed.set()  # admission waiting for a conversation's next turn
        self.money.close()

    def _on_signal(self) -> None:
        self._interrupts += 1
        if self._interrupts == 1:
            self.stop(StopReason.INTERRUPTED)
            self.say("kp-infer: press Ctrl-C again to cancel requests in flight now")
        else:
            for task in list(self.tasks):
                task.cancel()

    @contextmanager
    def signals_handled(self, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        """SIGINT and SIGTERM stop the run (a second one cancels what is in flight) for the
        whole of its event loop's work, the transport's start and close included; then the
        handlers found are put back (asyncio would leave SIGTERM to kill the process)."""
        with signals_handled(loop, self._on_signal):
            yield

    # -- the run --------------------------------------------------------------------------
    async def run(self, transport: Transport) -> int:
        """The run, sending through TRANSPORT (`attempt(body, stream)`); its exit code."""
        state = self.state
        if self.acceptance.identity is not None:  # a quarantine closes that provider's streams
            self.acceptance.identity.cancel_streams = getattr(transport, "cancel_streams_of", None)
        config = self.config
        parts = RunParts(
            request=config.request, policy=config.policy, retries=config.retries,
            cost_lookup_wait=config.money.cost_lookup_wait, transport=transport, admission=self.admission,
            budget=self.budget, acceptance=self.acceptance, output=self.output,
            stats=self.stats, done=self.prepared.done, state=state, progress=self.progress,
            stop=self.stop, say=self.say, read_cost=transport.generation_cost,
            systematic=SystematicFailure())
        self.output.open()
        poller = publisher = None
        ticker = asyncio.create_task(self.progress.tick())
        try:
            if not state.stopping.is_set() and self.config.sending.openrouter:  # (a server has none)
                await self._unless_stopped(self._check_balance())
                poller = asyncio.create_task(self._poll_balance())
            if self.budget.total is not None and self.budget.total.shared is not None:
                publisher = asyncio.create_task(self._publish_total_cost())
            if not state.stopping.is_set():
                await self._admit_all(parts)
                state.waiting = "all sent"
            await self._drain()
        finally:
            for task in (poller, publisher, ticker):
                if task:
                    task.cancel()
            self.progress.show(draw=False)  # the last frame is drawn when the bar closes
            self.output.close()
        return self.exit_code()

    def exit_code(self) -> int:
        return exit_code(self.state.stop_reason, self.stats)

    def summary(self) -> InferSummary:
        judge = self.acceptance.identity
        return summary(self.stats, self.state.stop_reason, self.prepared.scan.records,
                       self.budget, self.config, self.limiter.current, self.output,
                       self.money.state(), identity=judge.summary() if judge is not None else None,
                       conversations=self.conversations.summary())

    def _new_work(self) -> Iterator[tuple[Prompt, bytes, TurnWork | None]]:
        """The input's prompts not done, in order: (prompt, line, None) for a single
        request; for a conversation, its first turn to send (its TurnWork). With the
        identity checked, PRECOUNT of them at a time are read ahead and counted as one
        batch (infer/identity.py `precount`)."""
        judge = self.acceptance.identity
        ahead: list[tuple[Prompt, bytes, TurnWork | None]] = []
        for work in self._new_work_in_order():
            if judge is None:
                yield work
                continue
            ahead.append(work)
            if len(ahead) >= PRECOUNT:
                judge.precount([w[0] for w in ahead])
                yield from ahead
                ahead = []
        if ahead:
            judge.precount([w[0] for w in ahead])
            yield from ahead

    def _new_work_in_order(self) -> Iterator[tuple[Prompt, bytes, TurnWork | None]]:
        done = self.prepared.done
        for _lineno, prompt, line in iter_records(self.prepared.scan.path, PROMPT_DECODER):
            if (prompt.id in done or not in_partition(prompt.id, self.config.files.partition)
                    or not self.prepared.selected(prompt.id)):
                continue
            if not is_conversation(prompt):
                yield prompt, line, None
            elif (turn := self.conversations.start(prompt, line)) is not None:
                yield turn.prompt, turn.line, turn

    async def _next_work(self, new: Iterator) -> tuple[Prompt, bytes, TurnWork | None] | None:
        """What to admit next: a conversation's next turn first, else the input's next
        prompt; at the input's end, wait while conversations may still send a turn."""
        conversations = self.conversations
        while True:
            if (turn := conversations.next_ready()) is not None:
                return turn.prompt, turn.line, turn
            if (work := next(new, None)) is not None:
                return work
            if not conversations.open or self.state.stopping.is_set():
                return None
            conversations.changed.clear()
            await conversations.changed.wait()  # (a stop sets it too)

    async def _admit_all(self, parts: RunParts) -> None:
        new = self._new_work()
        # with --server: a prompt goes to the servers while they have a slot free, and then
        # reserves no money (their answers cost nothing); else to OpenRouter (infer/servers.py)
        sources = parts.transport if isinstance(parts.transport, Sources) else None
        to_servers = ((lambda: True) if sources is not None and not sources.has_openrouter
                      else sources.server_room if sources is not None else (lambda: False))
        while (work := await self._next_work(new)) is not None:
            if not await self._admit(parts, *work, sources, to_servers):
                return

    async def _admit(self, parts: RunParts, prompt, line: bytes, turn: TurnWork | None,
                     sources: Sources | None, to_servers: Callable[[], bool]) -> bool:
        """Admit one prompt (or turn) once its budget, disk room, money in flight and a slot
        are there (infer/admission.py), and start its work; False when admission must stop."""
        ticket = await self.admission.admit(
            prompt, line, to_servers,
            lambda servers: sources.route(servers) if sources is not None else None,
            self._probation)
        if ticket is None:
            return False
        task = asyncio.create_task(self._work(
            PromptWork(parts, prompt, line, ticket, session_id=turn.conversation if turn else None),
            turn))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    async def _probation(self) -> None:
        """A provider on probation (infer/identity.py): admission waits for room in it."""
        judge = self.acceptance.identity
        if judge is not None and judge.on_probation:
            await judge.probation(lambda: len(self.state.in_progress), self.state.stopping)

    async def _work(self, work: PromptWork, turn: TurnWork | None) -> None:
        """One prompt's (or turn's) work; a turn's end queues its conversation's next."""
        try:
            await work.run()
        finally:
            if turn is not None:
                self.conversations.ended(turn, work.kept, self.state.stopping.is_set())

    def _show_waiting(self, what: str) -> None:
        """Admission waits for WHAT (the disk guard's: with the time left), shown now."""
        self.state.waiting = what
        self.progress.show(now=True)

    async def _drain(self) -> None:
        """Wait for the requests in flight once admission is over: all of them while the run
        goes on; from a stop (before or during this wait) at most --grace seconds counted
        from the stop, then the rest are cancelled (a second Ctrl-C cancels them at once)."""
        tasks = set(self.tasks)
        if not tasks:
            return
        if not self.state.stopping.is_set():
            await self._unless_stopped(asyncio.wait(tasks))
        pending = {task for task in tasks if not task.done()}
        if pending:
            stopped_at = self.state.stopped_at
            left = self.config.retries.grace - (time.monotonic() - (stopped_at or time.monotonic()))
            _done, pending = await asyncio.wait(pending, timeout=max(0.0, left))
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        self.stats.cancelled(sum(task.cancelled() for task in tasks))

    async def _unless_stopped(self, awaitable) -> None:
        """Await AWAITABLE, or stop waiting for it (and cancel it) as soon as the run stops."""
        work = asyncio.ensure_future(awaitable)
        stopped = asyncio.ensure_future(self.state.stopping.wait())
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        for task in (work, stopped):
            if not task.done():
                task.cancel()
                await asyncio.wait({task})

    # -- balance --------------------------------------------------------------------------
    async def _check_balance(self) -> None:
        try:
            balance = await self.account.balance()
        except Exception as e:  # a failed poll is not a reason to stop paid work
            self.say(f"kp-infer: warning: could not read the balance: {e}")
            return
        remaining = balance.spendable
        why = unreadable_balance(balance)
        if why and self.config.money.min_credits is not None and not self._guard_warned:
            self._guard_warned = True  # (once: the polls read the same)
            self.say(f"kp-infer: warning: --min-credits {self.config.money.min_credits:g} guards "
                     f"nothing: {why}; {GUARD_FIX}")
        self.money.set_balance(remaining)
        if (remaining is not None and self.config.money.min_credits is not None
                and remaining < self.config.money.min_credits):
            self.stop(StopReason.MIN_CREDITS)

    async def _poll_balance(self) -> None:
        while not self.state.stopping.is_set():
            await asyncio.sleep(self.config.money.credits_interval)
            await self._check_balance()

    async def _publish_total_cost(self) -> None:
        """Tell the runs sharing --total-cost what this one spent and no longer needs."""
        while True:
            await asyncio.sleep(PUBLISH_INTERVAL)
            state = self.state
            self.budget.total.publish(self.budget.spent_this_run, self.budget.claimed(),
                                      stuck=bool(state.in_progress) and state.only_waiting_for_room())

async def _run(config: RunConfig, prepared: Prepared, budget: Budget, progress,
               say: Callable[[str], None], counts=None) -> Run:
    account = Account(config.sending.api_key, config.sending.base_url, proxy=config.sending.proxy)
    run = Run(config, prepared, budget, progress, say, account, counts)
    try:
        with run.signals_handled(asyncio.get_running_loop()):
            async with open_transport(config, prepared.servers) as transport:
                pace_reads(asyncio.get_running_loop(), lambda: transport.in_flight)
                await run.run(transport)
    finally:
        await account.aclose()
    return run


def _event_loop_run(coro):
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def _balance_for_plan(config: RunConfig, say: Stderr) -> Balance | None:
    """What the plan sizes the money in flight to (None, said, when it cannot be read)."""
    try:
        return fetch_balance(config.sending.api_key, config.sending.base_url, proxy=config.sending.proxy, timeout=15.0)
    except AccountError as e:
        say(f"kp-infer: the balance could not be read: {e}")
        return None


def identity_counts(config: RunConfig, prepared: Prepared, say: Stderr):
    """The target's counts for checking each answer's identity (--tokenizer), loaded
    before any completion is sent (exit 2 when they do not load); None without it, said
    once. Not for a run with nothing to send, nor one with no OpenRouter answers to check."""
    if not config.sending.openrouter or not prepared.turns_todo:
        return None
    if not config.identity.tokenizer:
        say(UNCHECKED_WARNING)
        return None
    counts = load_counts(config.identity, config.request)
    say(f"kp-infer: identity: each answer's counts checked against {config.identity.tokenizer} "
        f"({counts.describe()})")
    return counts


def run_infer(config: RunConfig, say: Stderr) -> int:
    """Prepare, then plan or run; print the summary; the exit code (see infer/report.py).

    SAY is the command's quiet-aware stderr writer (`terminal.Stderr`): every message of the run
    goes through it, the progress bar too."""
    check_outputs(config.files)  # before anything is created, locked or sent
    if config.identity.tokenizer and not config.plan:
        check_tokenizer(config.identity)  # (a missing directory: exit 2 before anything is read)
    with output_locks(config.files, config.plan, say) as start, tempfile.TemporaryDirectory(prefix="kp-infer-") as tmpdir:
        prepared = prepare(config, tmpdir, say)
        budget = Budget(config.money, config.request.max_tokens, prepared.price, spent=prepared.spent, tokens=prepared.tokens,
                        total=prepared.total)
        too_small = cap_below_one_request(budget, prepared.scan.largest_prompt_bound,
                                          prepared.turns_todo, bool(config.sending.servers))
        if too_small and not config.plan:  # (--plan warns the same)
            if budget.total is not None:
                budget.total.close(0.0)  # (its entry in --reservations: ended)
            raise KPError(too_small, ExitCode.USAGE)
        if config.plan:  # a report: stdout
            balance = _balance_for_plan(config, say) if config.sending.openrouter else None
            click.echo(plan_json(config, prepared, budget, balance) if config.plan_json
                       else plan_text(config, prepared, budget, balance))
            return ExitCode.OK
        counts = identity_counts(config, prepared, say)
        try:
            freeze_startup_objects()
            # the whole line is infer/progress.py's, redrawn by the run (mininterval: never by tqdm)
            with say.progress(total=prepared.turns_todo, desc=f"kp-infer: 0/{prepared.turns_todo:,}", unit="req",
                              bar_format="{desc}", mininterval=float("inf")) as bar:
                run = _event_loop_run(_run(config, prepared, budget, bar, say, counts))
        finally:
            if budget.total is not None:  # this run's entry in --reservations: ended
                budget.total.close(budget.spent_this_run)
        start.fatal = run.exit_code() in (ExitCode.ERROR, ExitCode.USAGE)
    result = run.summary()
    if config.files.summary_json:
        write_summary_json(config.files.summary_json, result)
    say(format_summary(result))
    code = run.exit_code()
    if say.quiet and code in (ExitCode.ERROR, ExitCode.USAGE) and result.stop_reason:
        # a fatal stop's reason survives --quiet (a money stop's exit 3 says it all)
        click.echo(f"kp-infer: {StopReason.from_slug(result.stop_reason).message}", err=True)
    return code

