"""What a kp-infer run tells the user: counts, why it stopped, the summary (the progress
line is infer/progress.py).

`kinds.StopReason` is every reason a run ends before its input is exhausted, each with the
one exit code and the one message it gives (make's messages read them too). A run that did what was asked exits 0: everything
answered, or `--token-budget` reached (the output holds the tokens asked for; the summary
says `stop_reason: "token-budget"`). Exit 3 is for money (`--max-cost`, `--total-cost`,
`--min-credits`, and OpenRouter's money limits: the balance ("payment": gone, or below one
request's worst case), the key's limit, a workspace or guardrail budget) and for a full
disk: all resumable, and no prompt is a failure because of them. An in-flight 402 is a
wait, not a stop (infer/inflight.py). Permanent failures make an otherwise successful run
exit 4.

The summary (stderr, and `--summary-json`: `contracts.InferSummary`):
    {"exit_code", "stop_reason": null|"max-cost"|"token-budget"|..., "input_records", "todo",
     "skipped", "done", "failed": {kind: n}, "failures_file", "retries": {cause: n},
     "abandoned_in_flight", "taken_in_from_rescue",
     "paid_not_written": {"answers", "cost", "rescued", "rescue_file", "error"},
     "failures_not_written": {"records", "rescued", "rescue_file"},
     "spend_this_run", "spend_total", "max_cost", "total_cost", "tokens": {"prompt", "completion",
     "reasoning", "completion_total", "cached", "cached_share"}, "token_budget",
     "conversations": null | {"turns_by_number", "done", "cut", "turns_not_sent"},
     "providers": {name: share},
     "finish_reasons": {reason: n}, "routing_unverifiable": {provider: n},
     "refused": {kind: {provider: n}} (OpenRouter's providers' answers: paid for, the prompt
              sent again with that provider ignored),
     "server_refused": {kind: {server: n}} (a --server's answers: sent again to a server),
     "by_provider": [row, ...] (recorded/providers_table.py: answers, tokens, reasoning share,
     finish reasons, refusals, tokens/s, latency, $ per million output tokens), "elapsed_s", "requests_per_s", "completion_tokens_per_s",
     "concurrency_limit_end",
     "limit": null | {"status", "limit_source", "reason", "scope", "limit_usd", "spend_usd",
              "resets_at", "message", "balance_left", "worst_case_request"} (the money limit
              that stopped the run, the fields OpenRouter gave),
     "limit_refusals": {"402 in_flight_budget_exhausted"|"403 openrouter_key_limit"|...: n},
     "money_in_flight": {"ceiling_end", "ratio_end", "peak", "cuts", "balance_read"},
     "costs": {"usage", "generation", "estimate"} (answers paid for, kept or refused, by where
              their cost came from: infer/costs.py),
     "logprobs": null | {provider: {"answers", "with_tokens"}} (token logprobs asked: the
              answers kept, and those that carried the sampled tokens),
     "identity": null (no --tokenizer: unchecked) | {"checked": true, "providers": [row, ...]
              (recorded/identity_table.py: checked, refused, offset, completion ratio,
              quarantined), "shared_offsets": [{"prompts", "offset", "providers", "example",
              "rendered"}], "quarantined": [contracts.Quarantined, ...]} (infer/identity.py)}
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from ..contracts import (
    FailuresNotWritten,
    InferSummary,
    MoneyInFlightEnd,
    MoneyLimit,
    PaidNotWritten,
    SourceShare,
    SummaryConversations,
    SummaryCosts,
    SummaryIdentity,
    SummaryLogprobs,
    SummaryTokens,
)
from ..errors import ExitCode
from ..kinds import FailureKind, StopReason
from ..openrouter.attempt import Attempt
from ..recorded.identity_table import band_text, identity_text
from ..recorded.providers_table import ProviderTable, table_text
from ..terminal import counted
from .budget import Budget
from .config import RunConfig

if TYPE_CHECKING:
    from .writing import Output


@dataclass
class Stats:
    """The counts of one run, for its summary and its progress line. Each part of the run
    reports what happened through a method here (an answer written, a retry, a refusal, a
    money limit met ...); nothing else writes these fields, and the views only read them.
    What the output refused (infer/writing.py `Output`), the conversations' turns
    (infer/conversations.py `ConversationQueue`) and the stop (infer/state.py `RunState`)
    are counted by their own parts."""

    todo: int = 0
    skipped: int = 0
    taken_in: int = 0  # answers an earlier run kept in the rescue file, taken in first
    done: int = 0
    failed: Counter = field(default_factory=Counter)
    retries: Counter = field(default_factory=Counter)
    providers: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)  # answers refused, by (provider, kind)
    server_refused: Counter = field(default_factory=Counter)  # a --server's, by (server, kind)
    table: ProviderTable = field(default_factory=ProviderTable)
    finish_reasons: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0  # of every answer paid for (kept, refused, or not written)
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the provider's prompt cache
    abandoned: int = 0  # requests cancelled in flight after the grace period
    unwritten: int = 0  # answers paid for that the output could not take
    unwritten_cost: float = 0.0
    rescued: int = 0  # of those, kept in the rescue file for the next run
    failures_unwritten: int = 0  # failure records --failures could not take
    failures_rescued: int = 0
    limit_refusals: Counter = field(default_factory=Counter)  # "402 in_flight_budget_exhausted": n
    limit: MoneyLimit | None = None  # the first money limit met (it stopped the run)
    # answers paid for (kept or refused) by where their cost came from (infer/costs.py):
    # "usage" (usage.cost), "generation" (GET /generation), "estimate" (neither in time)
    cost_sources: Counter = field(default_factory=Counter)
    # answers and completion tokens by source: each --server by name, else "openrouter"
    sources: Counter = field(default_factory=Counter)
    source_tokens: Counter = field(default_factory=Counter)
    # answers that carried the tokens the model sampled (token logprobs), by provider
    with_tokens: Counter = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)

    def answered(self, answer: Attempt, latency: float | None = None) -> None:
        """An answer written to the output (LATENCY: seconds from sent to complete)."""
        self.done += 1
        self.prompt_tokens += answer.prompt_tokens
        self.cached_tokens += answer.cached_tokens
        self.completion_tokens += answer.completion_tokens
        self.reasoning_tokens += answer.reasoning_tokens
        self.providers[answer.provider or "unknown"] += 1
        if answer.token_lengths is not None:
            self.with_tokens[answer.provider or "unknown"] += 1
        self.finish_reasons[answer.finish_reason or "none"] += 1
        source = answer.provider if answer.api else "openrouter"  # (a server's sets api)
        self.sources[source] += 1
        self.source_tokens[source] += answer.completion_tokens
        self.table.answer(answer.provider, answer.completion_tokens, answer.reasoning_tokens,
                          answer.finish_reason, answer.cost or 0.0, latency)

    def refusal(self, answer: Attempt, kind: str) -> None:
        """An ANSWER paid for and not kept (routing_violation, no_reasoning, think_marker,
        identity), its cost settled."""
        self.prompt_tokens += answer.prompt_tokens
        # a server's answer is not paid for and no provider is ignored after it: the prompt
        # goes to a server again (infer/servers.py), so it is counted apart
        refused = self.server_refused if answer.api else self.refused
        refused[(answer.provider or "unknown", kind)] += 1
        self.table.refusal(answer.provider, kind, answer.cost)

    def not_written(self, answer: Attempt, cost: float, rescued: bool) -> None:
        """An ANSWER paid for that the output did not take (kept in the rescue file, or
        lost); COST: its own and that of the answers refused before it."""
        self.prompt_tokens += answer.prompt_tokens
        self.unwritten += 1
        self.unwritten_cost += cost
        self.rescued += rescued

    def failure_not_written(self, rescued: bool) -> None:
        self.failures_unwritten += 1
        self.failures_rescued += rescued

    def failure(self, kind: str, attempt: Attempt) -> None:
        """A prompt given up on this run, counted by kind (a permanent error by its status)."""
        self.failed[kind if kind != FailureKind.PERMANENT
                    else f"http_{attempt.status or attempt.cause}"] += 1

    def retried(self, cause: str) -> None:
        """A prompt sent again: after a retryable failure (kinds.RetryCause), an in-flight
        402's wait, or a refused answer (its refusal kind)."""
        self.retries[cause] += 1

    def limit_met(self, key: str, limit: MoneyLimit | None = None) -> None:
        """A money limit answered (KEY: `402 in_flight_budget_exhausted`, ...); LIMIT: the
        one that stops the run (the first is kept)."""
        self.limit_refusals[key] += 1
        if self.limit is None:
            self.limit = limit

    def cost_settled(self, source: str) -> None:
        """An answer's cost known, and where it came from (infer/costs.py)."""
        self.cost_sources[source] += 1

    def cancelled(self, requests: int) -> None:
        """REQUESTS still in flight when the grace period ended, cancelled."""
        self.abandoned += requests


def exit_code(stop: StopReason | None, stats: Stats) -> int:
    if stop is not None and stop.exit_code != ExitCode.OK:
        return stop.exit_code
    if permanent_failures(stats.failed):
        return ExitCode.PARTIAL
    return ExitCode.OK


def permanent_failures(failed: dict[str, int]) -> int:
    """The prompts that failed for themselves: all but those a stop left unsent (STOPPED)."""
    return sum(n for kind, n in failed.items() if kind != FailureKind.STOPPED)


def refused_by_kind(refused: Counter) -> dict[str, dict[str, int]]:
    """{kind: {provider: answers refused}} from Stats.refused."""
    out: dict[str, dict[str, int]] = {}
    for (provider, kind), n in sorted(refused.items(), key=lambda item: (item[0][1], -item[1])):
        out.setdefault(kind, {})[provider] = n
    return out


def summary(stats: Stats, stop: StopReason | None, input_records: int, budget: Budget,
            config: RunConfig, concurrency_end: int, output: Output,
            money_in_flight: MoneyInFlightEnd | None = None,
            identity: dict | None = None,
            conversations: SummaryConversations | None = None) -> InferSummary:
    """The summary of a run from what its parts counted: STATS, the BUDGET's money, the
    OUTPUT's refused writes, the CONVERSATIONS' turns and the IDENTITY judge's rows."""
    rescue_files = output.rescue_files()
    elapsed = time.monotonic() - stats.started
    total_providers = sum(stats.providers.values())
    return InferSummary(
        exit_code=exit_code(stop, stats),
        stop_reason=stop.slug if stop else None,
        input_records=input_records,
        todo=stats.todo,
        skipped=stats.skipped,
        done=stats.done,
        failed=dict(stats.failed),
        failures_file=config.files.failures,
        retries=dict(stats.retries),
        abandoned_in_flight=stats.abandoned,
        taken_in_from_rescue=stats.taken_in,
        paid_not_written=PaidNotWritten(
            answers=stats.unwritten, cost=round(stats.unwritten_cost, 10), rescued=stats.rescued,
            rescue_file=rescue_files.get("output"),
            error=output.write_error if stats.unwritten else None),
        failures_not_written=FailuresNotWritten(
            records=stats.failures_unwritten, rescued=stats.failures_rescued,
            rescue_file=rescue_files.get("failures")),
        spend_this_run=round(budget.spent_this_run, 10),
        spend_total=round(budget.spent, 10),
        max_cost=config.money.max_cost,
        total_cost=config.money.total_cost,
        tokens=SummaryTokens(prompt=stats.prompt_tokens, completion=stats.completion_tokens,
                             reasoning=stats.reasoning_tokens, completion_total=budget.tokens,
                             cached=stats.cached_tokens,
                             cached_share=(round(stats.cached_tokens / stats.prompt_tokens, 4)
                                           if stats.prompt_tokens else 0.0)),
        token_budget=config.money.token_budget,
        providers=({k: round(v / total_providers, 4) for k, v in stats.providers.most_common()}
                   if total_providers else {}),
        finish_reasons=dict(stats.finish_reasons),
        refused=refused_by_kind(stats.refused),
        server_refused=refused_by_kind(stats.server_refused),
        routing_unverifiable={name: stats.providers[name] for name in config.policy.unverifiable_names
                              if stats.providers[name]},
        by_provider=stats.table.rows(),
        elapsed_s=round(elapsed, 3),
        requests_per_s=round(stats.done / elapsed, 3) if elapsed else 0.0,
        completion_tokens_per_s=round(stats.completion_tokens / elapsed, 1) if elapsed else 0.0,
        concurrency_limit_end=concurrency_end,
        limit=stats.limit,
        limit_refusals=dict(stats.limit_refusals),
        money_in_flight=money_in_flight,
        costs=SummaryCosts(**{source: stats.cost_sources.get(source, 0)
                              for source in ("usage", "generation", "estimate", "server")}),
        # with --server: each source's share of the answers and its completion tokens/s
        sources={name: SourceShare(answers=n, share=round(n / stats.done, 4),
                                   completion_tokens=stats.source_tokens[name],
                                   tokens_per_s=round(stats.source_tokens[name] / elapsed, 1)
                                   if elapsed else 0.0)
                 for name, n in stats.sources.most_common()} if config.sending.servers else {},
        logprobs=({name: SummaryLogprobs(answers=n, with_tokens=stats.with_tokens[name])
                   for name, n in stats.providers.most_common()}
                  if config.request.logprobs or config.request.require_logprobs else None),
        conversations=conversations,
        identity=None if identity is None else msgspec.convert(identity, SummaryIdentity),
    )


def format_summary(summary: InferSummary) -> str:
    failed = {k: n for k, n in summary.failed.items() if k != FailureKind.STOPPED}
    stopped = summary.failed.get(FailureKind.STOPPED, 0)
    tokens = summary.tokens
    lines = [
        f"kp-infer: {summary.done} done, {summary.skipped} skipped (already done), "
        f"{sum(failed.values())} failed"
        + (f" ({', '.join(f'{k}: {v}' for k, v in failed.items())})" if failed else "")
        + (f", {stopped} not sent again after a refused answer (the run stopped; a rerun "
           "sends them)" if stopped else ""),
        f"  spend: ${summary.spend_this_run:.6f} this run, ${summary.spend_total:.6f} in all"
        + (f" (cap ${summary.max_cost:g})" if summary.max_cost is not None else ""),
        f"  tokens: {tokens.completion:,} completion "
        f"({tokens.reasoning:,} reasoning), {tokens.prompt:,} prompt; "
        f"{tokens.completion_total:,} completion in all"
        + (f" (budget {summary.token_budget:,})" if summary.token_budget else "")
        + (f"; {tokens.cached:,} prompt tokens cached ({tokens.cached_share:.0%})"
           if tokens.cached else ""),
        f"  throughput: {summary.requests_per_s:.2f} req/s, "
        f"{summary.completion_tokens_per_s:,.0f} tok/s over {summary.elapsed_s:.1f} s",
    ]
    costs = summary.costs
    if costs.generation or costs.estimate:
        lines.append(f"  costs: {costs.usage:,} from usage.cost, {costs.generation:,} looked up "
                     f"(GET /generation: the answer showed none), {costs.estimate:,} booked by "
                     "estimate (no figure in time: usage tokens at the price bound, or the worst case)")
    if summary.conversations is not None:
        conv = summary.conversations
        lines.append(f"  conversations: {conv.done:,} finished, {conv.cut:,} cut by max_tokens "
                     "(later turns not sent); turns answered by number: "
                     + ", ".join(f"#{k} {n:,}" for k, n in conv.turns_by_number.items()))
    if summary.retries:
        lines.append("  retries: " + ", ".join(f"{k}: {v}" for k, v in summary.retries.items()))
    if summary.sources:
        lines.append("  sources: " + ", ".join(
            f"{name} {s.share:.0%} ({s.tokens_per_s:,.0f} tok/s)"
            for name, s in summary.sources.items()))
    if summary.providers:
        lines.append("  providers: " + ", ".join(f"{k} {v:.0%}" for k, v in summary.providers.items()))
    if summary.logprobs:
        carried = sum(c.with_tokens for c in summary.logprobs.values())
        lines.append(f"  token logprobs: {carried:,} of {summary.done:,} answers carried the "
                     "sampled tokens (" + ", ".join(f"{k} {c.with_tokens:,}/{c.answers:,}"
                                                    for k, c in summary.logprobs.items()) + ")")
    if summary.by_provider:
        lines.append("  by provider (refused r/n/t/i: routing violation, no reasoning, think marker, "
                     "identity):")
        lines.append(table_text(summary.by_provider, indent="    "))
    lines.extend(_identity_lines(summary.identity))
    if summary.routing_unverifiable:
        lines.append("  routing unverifiable (a provider name covering an excluded variant too; kept, "
                     "marked \"routing\": \"unverifiable\"): "
                     + ", ".join(f"{p} {n}" for p, n in summary.routing_unverifiable.items()))
    if summary.refused:
        lines.append("  refused (paid for, not kept; sent again with the provider ignored): " + "; ".join(
            f"{kind} " + ", ".join(f"{p} {n}" for p, n in by.items())
            for kind, by in summary.refused.items()))
    if summary.server_refused:
        lines.append("  refused from the servers (not kept; sent again to a server): " + "; ".join(
            f"{kind} " + ", ".join(f"{server} {n}" for server, n in by.items())
            for kind, by in summary.server_refused.items()))
    if summary.abandoned_in_flight:
        lines.append(f"  abandoned in flight after the grace period: {summary.abandoned_in_flight}")
    if summary.taken_in_from_rescue:
        lines.append(f"  taken in from the rescue file first (paid for by an earlier run): "
                     f"{counted(summary.taken_in_from_rescue, 'answer')}")
    lines.extend(_unwritten_lines(summary))
    if summary.limit_refusals:
        lines.append("  money limits: " + ", ".join(f"{k}: {v}" for k, v in summary.limit_refusals.items()))
    if summary.limit:
        lines.append(f"  {summary.limit.text()}")
    if summary.stop_reason:
        lines.append(f"  {StopReason.from_slug(summary.stop_reason).message}")
    elif failed:
        lines.append(_failures_note(sum(failed.values()), summary.failures_file))
    return "\n".join(lines)


def _identity_lines(identity: SummaryIdentity | None) -> list[str]:
    """Per provider, its answers' counts against the target's (infer/identity.py)."""
    if identity is None or not (identity.providers or identity.quarantined):
        return []
    lines = ["  identity (usage.prompt_tokens minus kimipipe's count of the prompt as the "
             "target's template renders it; the target's when inside the vendor verifier's "
             f"tolerance, {band_text()}; completion ratio: usage.completion_tokens over "
             "the answer re-encoded):", identity_text(identity.providers, indent="    ")]
    for shared in identity.shared_offsets:
        lines.append(f"  shared offset {shared.offset:+d} on prompts {shared.prompts}"
                     f" at {', '.join(shared.providers)}: accepted, not quarantined; the chat "
                     "template kimipipe renders with differs from theirs (a default system "
                     f"prompt it omits?): compare its rendering of {shared.example}, "
                     f"{shared.rendered!r}, with the model's own (--chat-template)")
    for q in identity.quarantined:
        offset = "unknown" if q.offset is None else f"{q.offset:+d}"
        lines.append(f"  quarantined {q.provider} ({', '.join(q.slugs)}) at {q.at}: {q.refused} "
                     f"answers refused, typical offset {offset}, e.g. {q.example}")
    return lines


def _unwritten_lines(summary: InferSummary) -> list[str]:
    """What was paid for and not written, where it is kept and what the next run does."""
    lines = []
    lost = summary.paid_not_written
    if lost.answers:
        why = f" ({lost.error})" if lost.error else " (stdout was closed)"
        line = (f"  paid for but not written{why}: {counted(lost.answers, 'answer')}, "
                f"${lost.cost:.6f}")
        if lost.rescued:
            line += (f"; {'all ' if lost.rescued == lost.answers else ''}"
                     f"{lost.rescued:,} kept in {lost.rescue_file}: the next run over the "
                     "same output takes them in first, they are not paid for again")
        if lost.error and lost.rescued < lost.answers:
            line += f"; {lost.answers - lost.rescued:,} lost (the rescue file failed too)"
        lines.append(line)
    failures = summary.failures_not_written
    if failures.records:
        line = f"  failure records --failures could not take: {failures.records:,}"
        if failures.rescued:
            line += f", {failures.rescued:,} kept in {failures.rescue_file} for the next run"
        lines.append(line)
    return lines


def _failures_note(failed: int, failures_file: str | None) -> str:
    """The last line of a run that ends with permanent failures (exit 4): what to do next."""
    which = f"the prompt{'s' if failed != 1 else ''} that failed"
    if failures_file:
        return (f"  finished with {counted(failed, 'permanent failure')}: see {failures_file}; "
                f"rerun the same command to retry {which}")
    return (f"  finished with {counted(failed, 'permanent failure')}; rerun the same command "
            f"to retry {which} (add --failures FILE to keep why each failed)")


def write_summary_json(path: str, result: InferSummary) -> None:
    """Write the summary whole under a temporary name, then rename it into place (checked
    writable before the run: see writing.check_outputs); `-` is stdout (-o is a file then)."""
    if path == "-":
        json.dump(msgspec.to_builtins(result), sys.stdout, indent=2)
        sys.stdout.write("\n")
        sys.stdout.flush()
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:  # (json.dump of the builtins: the bytes it always had)
            json.dump(msgspec.to_builtins(result), f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
