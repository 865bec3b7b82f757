"""What a kp-infer run tells the user: counts, why it stopped, the progress line, the summary.

`StopReason` is every reason a run ends before its input is exhausted, each with the one
exit code and the one message it gives. A run that did what was asked exits 0: everything
answered, or `--token-budget` reached (the output holds the tokens asked for; the summary
says `stop_reason: "token-budget"`). Exit 3 is only for money: `--max-cost`, `--total-cost`, a
402 from OpenRouter, `--min-credits`. Permanent failures make an otherwise successful run exit 4.

The summary (stderr, and `--summary-json`):
    {"exit_code", "stop_reason": null|"max-cost"|"token-budget"|..., "input_records", "todo",
     "skipped", "done", "failed": {kind: n}, "retries": {cause: n}, "abandoned_in_flight",
     "spend_this_run", "spend_total", "max_cost", "total_cost", "tokens": {"prompt", "completion",
     "reasoning", "completion_total"}, "token_budget", "providers": {name: share},
     "finish_reasons": {reason: n}, "elapsed_s", "requests_per_s", "completion_tokens_per_s",
     "concurrency_limit_end"}
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum

from ..errors import ExitCode
from ..openrouter.attempt import Attempt
from .budget import Budget
from .config import RunConfig


class StopReason(Enum):
    """Why a run stopped admitting work: its name in the summary, exit code and message."""

    MAX_COST = ("max-cost", ExitCode.BUDGET,
                "stopped: --max-cost reached; raise it and rerun to resume")
    TOTAL_COST = ("total-cost", ExitCode.BUDGET,
                  "stopped: --total-cost reached (the spend recorded here and in the --spent-in "
                  "files, with what the runs sharing --reservations have in flight); raise it "
                  "and rerun to resume")
    PAYMENT = ("payment", ExitCode.BUDGET,
               "stopped: OpenRouter answered 402 (balance or key limit too low); "
               "add credits and rerun to resume")
    MIN_CREDITS = ("min-credits", ExitCode.BUDGET,
                   "stopped: account balance below --min-credits; add credits and rerun to resume")
    TOKEN_BUDGET = ("token-budget", ExitCode.OK,
                    "done: --token-budget reached (the output holds the tokens asked for); "
                    "raise it and rerun to continue")
    INTERRUPTED = ("interrupted", ExitCode.INTERRUPTED,
                   "interrupted; rerun the same command to resume")
    AUTH = ("auth", ExitCode.USAGE,
            "stopped: OpenRouter rejected the API key (401); check OPENROUTER_API_KEY")
    NO_ROUTE = ("no-route", ExitCode.USAGE,
                "stopped: no provider matches the routing flags (404); check "
                "--ignore-provider/--only-provider/--quantization (try --plan)")
    OUTPUT = ("output", ExitCode.ERROR,
              "stopped: the output cannot be written; fix it and rerun with -o to resume")
    CLOSED_PIPE = ("closed-pipe", ExitCode.OK,
                   "stopped: the reader of stdout went away (`| head`); nothing more is sent")

    def __init__(self, slug: str, exit_code: int, message: str):
        self.slug = slug
        self.exit_code = exit_code
        self.message = message

    @classmethod
    def from_slug(cls, slug: str) -> StopReason:
        return next(reason for reason in cls if reason.slug == slug)


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
    unwritten: int = 0  # answers paid for that the output could not take
    unwritten_cost: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def answered(self, answer: Attempt) -> None:
        """An answer written to the output."""
        self.done += 1
        self.completion_tokens += answer.completion_tokens
        self.reasoning_tokens += answer.reasoning_tokens
        self.providers[answer.provider or "unknown"] += 1
        self.finish_reasons[answer.finish_reason or "none"] += 1

    def failure(self, kind: str, attempt: Attempt) -> None:
        """A prompt given up on this run, counted by kind (a permanent error by its status)."""
        self.failed[kind if kind != "permanent" else f"http_{attempt.status or attempt.cause}"] += 1


def exit_code(stop: StopReason | None, stats: Stats) -> int:
    if stop is not None and stop.exit_code != ExitCode.OK:
        return stop.exit_code
    if sum(stats.failed.values()):
        return ExitCode.PARTIAL
    return ExitCode.OK


def progress_postfix(stats: Stats, budget: Budget, in_flight: int, limit: int) -> str:
    """The live part of the progress line: in flight, speed, spend, what is left, retries."""
    elapsed = max(1e-6, time.monotonic() - stats.started)
    parts = [f"in flight {in_flight}/{limit}",
             f"{stats.completion_tokens / elapsed:,.0f} tok/s",
             f"${budget.spent_this_run:.4f}"]
    remaining = budget.remaining_cost()
    if remaining is not None:
        parts.append(f"${remaining:.2f} left")
    if budget.token_budget:
        parts.append(f"{max(0, budget.token_budget - budget.tokens):,} tok left")
    if stats.retries:
        parts.append("retries " + " ".join(f"{k}:{v}" for k, v in stats.retries.most_common()))
    return ", ".join(parts)


def summary(stats: Stats, stop: StopReason | None, input_records: int, budget: Budget,
            config: RunConfig, concurrency_end: int) -> dict:
    elapsed = time.monotonic() - stats.started
    total_providers = sum(stats.providers.values())
    return {
        "exit_code": exit_code(stop, stats),
        "stop_reason": stop.slug if stop else None,
        "input_records": input_records,
        "todo": stats.todo,
        "skipped": stats.skipped,
        "done": stats.done,
        "failed": dict(stats.failed),
        "retries": dict(stats.retries),
        "abandoned_in_flight": stats.abandoned,
        "paid_not_written": {"answers": stats.unwritten, "cost": round(stats.unwritten_cost, 10)},
        "spend_this_run": round(budget.spent_this_run, 10),
        "spend_total": round(budget.spent, 10),
        "max_cost": config.max_cost,
        "total_cost": config.total_cost,
        "tokens": {"prompt": stats.prompt_tokens, "completion": stats.completion_tokens,
                   "reasoning": stats.reasoning_tokens, "completion_total": budget.tokens},
        "token_budget": config.token_budget,
        "providers": {k: round(v / total_providers, 4) for k, v in stats.providers.most_common()}
        if total_providers else {},
        "finish_reasons": dict(stats.finish_reasons),
        "elapsed_s": round(elapsed, 3),
        "requests_per_s": round(stats.done / elapsed, 3) if elapsed else 0.0,
        "completion_tokens_per_s": round(stats.completion_tokens / elapsed, 1) if elapsed else 0.0,
        "concurrency_limit_end": concurrency_end,
    }


def format_summary(summary: dict) -> str:
    failed = summary["failed"]
    lines = [
        f"kp-infer: {summary['done']} done, {summary['skipped']} skipped (already done), "
        f"{sum(failed.values())} failed"
        + (f" ({', '.join(f'{k}: {v}' for k, v in failed.items())})" if failed else ""),
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
    lost = summary["paid_not_written"]
    if lost["answers"]:
        lines.append(f"  paid for but not written (the output failed): {lost['answers']:,} "
                     f"answer{'s' if lost['answers'] != 1 else ''}, ${lost['cost']:.6f}")
    if summary["stop_reason"]:
        lines.append(f"  {StopReason.from_slug(summary['stop_reason']).message}")
    return "\n".join(lines)
