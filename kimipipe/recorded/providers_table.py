"""Providers compared: one row per provider of what its answers were like.

A drafter learns the target as it is served, and the same weights behind several providers
is a claim, not a fact: do the INT4 providers really give the same model? The table puts
side by side, per provider, what a run kept and refused. It is made the same way from a
run (infer/report.py: the summary, stderr and `--summary-json`'s `by_provider`) and from
files already on disk (`kp-infer report`, infer/report_files.py), and stays JSON-stable:

    {"provider": str,
     "answers": int,                    kept answers
     "share": float,                    of all kept answers (0..1)
     "completion_tokens": {"mean": float, "p50": int, "p95": int, "max": int},
     "reasoning_share": float | null,   reasoning tokens / completion tokens, as billed
                                        (0 for a provider that bills no reasoning tokens,
                                        e.g. one that puts the reasoning inline)
     "finish_reasons": {reason: n},
     "refused": {"routing_violation": n, "no_reasoning": n, "think_marker": n, "identity": n},
     "refused_share": float | null,     refused / (answers + refused)
     "refused_cost": float,             USD paid for its refused answers
     "tokens_per_s": float | null,      completion tokens / seconds, over answers with a
                                        latency (the whole answer: sent to last byte)
     "latency_s": {"p50": float | null, "p95": float | null},
     "cost": float,                     USD of its kept answers
     "usd_per_m_output": float | null}  cost x 1e6 / completion tokens (kept answers; the
                                        prompt's cost included: what a million generated
                                        tokens cost from this provider)

Percentiles are nearest-rank. Rows are sorted by answers, then refusals, then name.
`histogram()` draws the completion lengths per provider on shared power-of-two bins.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from ..kinds import RefusalKind

REFUSAL_KINDS = tuple(RefusalKind)  # routing_violation, no_reasoning, think_marker, identity
_SHORT = {RefusalKind.ROUTING_VIOLATION: "r", RefusalKind.NO_REASONING: "n",
          RefusalKind.THINK_MARKER: "t", RefusalKind.IDENTITY: "i"}


def percentile(sorted_values: list, q: float):
    """Nearest-rank percentile of an ascending list (None when empty)."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


@dataclass
class _Provider:
    completion: list[int] = field(default_factory=list)
    reasoning_tokens: int = 0
    finish: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)
    refused_cost: float = 0.0
    cost: float = 0.0
    latencies: list[float] = field(default_factory=list)
    timed_tokens: int = 0  # completion tokens of the answers with a latency


class ProviderTable:
    """Answers and refusals per provider; `rows()` for JSON, `text()` for a terminal."""

    def __init__(self) -> None:
        self._by: dict[str, _Provider] = {}

    def _of(self, provider: str | None) -> _Provider:
        return self._by.setdefault(provider or "unknown", _Provider())

    def answer(self, provider: str | None, completion_tokens: int, reasoning_tokens: int,
               finish_reason: str | None, cost: float, latency: float | None = None) -> None:
        row = self._of(provider)
        row.completion.append(completion_tokens)
        row.reasoning_tokens += reasoning_tokens
        row.finish[finish_reason or "none"] += 1
        row.cost += cost
        if latency is not None and latency > 0:
            row.latencies.append(latency)
            row.timed_tokens += completion_tokens

    def refusal(self, provider: str | None, kind: str, cost: float = 0.0) -> None:
        row = self._of(provider)
        row.refused[kind] += 1
        row.refused_cost += cost

    def __bool__(self) -> bool:
        return bool(self._by)

    def rows(self) -> list[dict]:
        total = sum(len(p.completion) for p in self._by.values())
        out = []
        for name, p in self._by.items():
            n = len(p.completion)
            tokens = sorted(p.completion)
            completion = sum(tokens)
            latencies = sorted(p.latencies)
            refused = sum(p.refused.values())
            out.append({
                "provider": name,
                "answers": n,
                "share": round(n / total, 4) if total else 0.0,
                "completion_tokens": {"mean": round(completion / n, 1) if n else None,
                                      "p50": percentile(tokens, 0.5),
                                      "p95": percentile(tokens, 0.95),
                                      "max": tokens[-1] if tokens else None},
                "reasoning_share": round(p.reasoning_tokens / completion, 4) if completion else None,
                "finish_reasons": dict(p.finish.most_common()),
                "refused": {kind: p.refused.get(kind, 0) for kind in REFUSAL_KINDS},
                "refused_share": round(refused / (n + refused), 4) if n + refused else None,
                "refused_cost": round(p.refused_cost, 10),
                "tokens_per_s": (round(p.timed_tokens / sum(latencies), 1)
                                 if latencies and sum(latencies) > 0 else None),
                "latency_s": {"p50": _rounded(percentile(latencies, 0.5)),
                              "p95": _rounded(percentile(latencies, 0.95))},
                "cost": round(p.cost, 10),
                "usd_per_m_output": round(p.cost * 1e6 / completion, 4) if completion else None,
            })
        out.sort(key=lambda r: (-r["answers"], -sum(r["refused"].values()), r["provider"]))
        return out

    def text(self, indent: str = "") -> str:
        return table_text(self.rows(), indent)

    def histogram_bins(self) -> tuple[list[int], dict[str, list[int]]]:
        """(upper edges, answers per bin for each provider): shared power-of-two bins."""
        every = [t for p in self._by.values() for t in p.completion]
        if not every:
            return [], {}
        low = 2 ** max(0, math.ceil(math.log2(max(1, min(every)))))
        high = max(every)
        edges = [low]
        while edges[-1] < high:
            edges.append(edges[-1] * 2)
        counts = {}
        for r in self.rows():
            tokens = self._by[r["provider"]].completion
            if not tokens:
                continue
            bins = [0] * len(edges)
            for t in tokens:
                bins[next(i for i, e in enumerate(edges) if t <= e)] += 1
            counts[r["provider"]] = bins
        return edges, counts

    def histogram(self, width: int = 40) -> str:
        """Completion tokens per answer, per provider, on shared bins (bars scaled per
        provider, so shapes compare)."""
        edges, counts = self.histogram_bins()
        if not counts:
            return "completion tokens per answer: no answers"
        lines = ["completion tokens per answer, by provider (bars scaled per provider)"]
        for name, bins in counts.items():
            lines.append(f"{name} ({sum(bins):,} answers)")
            widest = max(bins)
            for edge, n in zip(edges, bins, strict=True):
                bar = "#" * round(width * n / widest) if n else ""
                lines.append(f"  <= {edge:>7,} {n:>7,}  {bar}".rstrip())
        return "\n".join(lines)


def table_text(rows: list[dict], indent: str = "") -> str:
    """ROWS (`ProviderTable.rows()`) as a table; refused: routing/no reasoning/think
    marker/identity."""
    head = (f"{'provider':<18}{'answers':>8}{'share':>7}{'mean tok':>9}{'p95 tok':>8}"
            f"{'reason':>7}{'tok/s':>7}{'lat p50':>8}{'lat p95':>8}{'$/M out':>8}"
            f"{'refused r/n/t/i':>16}  finish")
    lines = [indent + head]
    for r in rows:
        ct, lat = r["completion_tokens"], r["latency_s"]
        refused = "/".join(str(r["refused"][k]) for k in REFUSAL_KINDS)
        finish = " ".join(f"{k} {v}" for k, v in r["finish_reasons"].items())
        lines.append(indent + (
            f"{r['provider'][:17]:<18}{r['answers']:>8,}{_pct(r['share']):>7}"
            f"{_num(ct['mean'], '.0f'):>9}{_num(ct['p95'], ',d'):>8}"
            f"{_pct(r['reasoning_share']):>7}{_num(r['tokens_per_s'], '.0f'):>7}"
            f"{_secs(lat['p50']):>8}{_secs(lat['p95']):>8}{_num(r['usd_per_m_output'], '.2f'):>8}"
            f"{refused:>16}  {finish}").rstrip())
    return "\n".join(lines)

def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"
