"""What answers measured: the figures `make pilot` records and `make plan` reads.

`measure(responses, failures)` reads a kp-infer responses file (finished lines only:
kp-infer may be writing it) and returns its figures (`plans.PilotFigures`; `make pilot`
writes them to WORK/D.pilot.json, `write_pilot`, and make plan reads them, `read_pilot`):

    {"answers", "spend", "completion_tokens": {"total", "mean", "sd", "p50", "p90", "max"},
     "prompt_tokens_mean", "reasoning_share" (reasoning tokens / completion tokens),
     "cost_per_answer": {"mean", "sd"}, "cost_per_completion_token",
     "length_cut_share" (finish_reason "length"), "providers": {name: share},
     "failures": {kind: n}}

"spend" is what the records cost by `records.record_cost` (the one definition every spend
reader uses): each answer's `usage.cost`, the answers refused before it (`refused[].cost`),
and with FAILURES the paid failure lines' `cost`; "cost_per_answer" shares all of it out
over the answers kept (refused and failed answers recur in the same share).

Every answer in the file counts: the pilot's sample, and any answered before it (all are
answers of the same dataset under the same flags).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter

import msgspec

from ..contracts import read_contract
from ..io import finished_records
from ..plans import CompletionFigures, CostPerAnswer, PilotFigures
from ..records import RecordCost, Usage, record_cost


class _Refused(msgspec.Struct):
    cost: float = 0.0


class _Answer(msgspec.Struct):
    usage: Usage
    refused: list[_Refused] = msgspec.field(default_factory=list)
    finish_reason: str | None = None
    provider: str | None = None


class _Failed(msgspec.Struct):
    kind: str = "unknown"


_answer = msgspec.json.Decoder(_Answer)
_failed = msgspec.json.Decoder(_Failed)
_failure_cost = msgspec.json.Decoder(RecordCost)
_pilot_decoder = msgspec.json.Decoder(PilotFigures)


def _percentile(sorted_values: list[int], q: float) -> int:
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1)]


def measure(responses: str, failures: str | None = None) -> PilotFigures:
    completion: list[int] = []
    costs: list[float] = []
    reasoning = prompt_tokens = 0
    cut = 0
    providers: Counter = Counter()
    for answer in finished_records(responses, _answer):
        completion.append(answer.usage.completion_tokens)
        # what the answer cost, the answers refused before it included (records.record_cost)
        costs.append(record_cost(answer.usage.cost, (r.cost for r in answer.refused), 0.0))
        reasoning += answer.usage.reasoning_tokens
        prompt_tokens += answer.usage.prompt_tokens
        cut += answer.finish_reason == "length"
        providers[answer.provider or "unknown"] += 1
    failed = Counter(f.kind for f in finished_records(failures, _failed)) if failures else Counter()
    failed_cost = sum(f.paid for f in finished_records(failures, _failure_cost)) if failures else 0.0
    n = len(completion)
    ordered = sorted(completion)
    total_completion = sum(completion)
    return PilotFigures(
        answers=n,
        spend=round(sum(costs) + failed_cost, 10),
        completion_tokens=CompletionFigures(
            total=total_completion,
            mean=round(total_completion / n, 2) if n else None,
            sd=round(statistics.pstdev(completion), 2) if n else None,
            p50=_percentile(ordered, 0.5), p90=_percentile(ordered, 0.9),
            max=ordered[-1] if n else 0),
        prompt_tokens_mean=round(prompt_tokens / n, 2) if n else None,
        reasoning_share=round(reasoning / total_completion, 4) if total_completion else None,
        # (paid failures are part of what an answer costs: they recur in the same share)
        cost_per_answer=CostPerAnswer(mean=(sum(costs) + failed_cost) / n if n else None,
                                      sd=statistics.pstdev(costs) if n else None),
        cost_per_completion_token=((sum(costs) + failed_cost) / total_completion
                                   if total_completion else None),
        length_cut_share=round(cut / n, 4) if n else None,
        providers={k: round(v / n, 4) for k, v in providers.most_common()},
        failures=dict(failed),
    )


def write_pilot(path: str, figures: PilotFigures) -> None:
    """WORK/D.pilot.json: FIGURES as JSON (indented by one, a newline at the end)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(msgspec.to_builtins(figures), f, indent=1)
        f.write("\n")


def read_pilot(path: str) -> PilotFigures | None:
    """WORK/D.pilot.json, or None when there is none."""
    return read_contract(path, _pilot_decoder, "not a make pilot file", "remake it (make pilot)")


def pilot_line(path: str, figures: PilotFigures) -> str:
    """What `make pilot` says of FIGURES, written to PATH."""
    c = figures.completion_tokens
    if not figures.answers:
        return f"pilot: {path}: no answers yet"
    return (f"pilot: {path}: {figures.answers:,} answers, completion tokens mean {c.mean:,.0f} "
            f"(sd {c.sd:,.0f}, p90 {c.p90:,}), reasoning {figures.reasoning_share:.0%}, "
            f"${figures.cost_per_answer.mean:.6f} per answer, cut by length "
            f"{figures.length_cut_share:.1%}, providers "
            + ", ".join(f"{k} {v:.0%}" for k, v in figures.providers.items()))
