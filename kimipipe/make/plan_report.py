"""`make plan`'s report: the build plan (build_plan.py) as a user reads it, in 80 columns.

Two tables (per dataset: prompts, answered, estimated prompt tokens, answer length and $
per answer, each marked measured `meas`, like the measured datasets `like`, estimated
`est` or assumed `prior`; then TOKEN_BUDGET, answers and cost to go, recorded, expected),
the build against TOTAL_COST, the TOKEN_BUDGET that fits, and which figures are measured.
"""

from __future__ import annotations

import textwrap

from ..terminal import money
from .build_plan import BuildPlan


def budget_text(n: int | float | None) -> str:
    """7030000 -> 7.03M, 12345 -> 12.35k: a token count as TOKEN_BUDGET= takes it (four
    significant digits; report/canvas.py `count_text` shows three on a plot)."""
    if n is None:
        return "none"
    n = int(n)
    for size, suffix in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if n >= size:
            return f"{n / size:.4g}{suffix}"
    return str(n)


def wrap(text: str, width: int = 80) -> list[str]:
    """TEXT in lines of WIDTH, continuation lines indented two spaces more than the first."""
    indent = text[:len(text) - len(text.lstrip())]
    return textwrap.wrap(text.strip(), width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False, break_long_words=False)


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.rjust(w) if i in right else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in rows]


def budget_suggestion(plan: BuildPlan) -> str | None:
    """`TOKEN_BUDGET=5.81M` (every weight equal) or `TOKEN_BUDGET_B3=... ...`."""
    budgets = plan.fitting_budgets()
    if budgets is None:
        return None
    if len({d.weight for d in plan.datasets}) == 1:
        return f"TOKEN_BUDGET={budget_text(next(iter(budgets.values())))}"
    return " ".join(f"TOKEN_BUDGET_{d}={budget_text(b)}" for d, b in budgets.items())


def report(plan: BuildPlan, title: str = "make plan") -> str:
    out = [f"{title}: {len(plan.datasets)} dataset(s)"
           + (f", TOTAL_COST {money(plan.total_cost)} for the whole build" if plan.total_cost is not None else "")
           + "; nothing is sent"]
    if plan.routes:
        out.append("routes allowed, as kp-infer --plan reads them (USD per million tokens, in / out):")
        cells = [f"{r.provider} ({r.quantization or '?'}) {r.prompt_price:.2f} / {r.completion_price:.2f}"
                 for r in plan.routes]
        for i in range(0, len(cells), 2):
            out.append("  " + "    ".join(cells[i:i + 2]))
        mean = plan.prices.allowed_mean if plan.prices is not None else None
        bound = plan.prices.bound if plan.prices is not None else None
        if mean and bound:
            out.append(f"  expected at their mean {mean.prompt:.3f} / {mean.completion:.3f}; "
                       f"reserved at the highest {bound.prompt:.2f} / {bound.completion:.2f}"
                       + (f" (a pricing override: {bound.override})" if bound.override else ""))
    else:
        out.append("no route allowed: see kp-infer --plan")
    out.append("")
    # requests: a conversation's turns each count (one answer each), as kp-infer counts them
    rows = [["dataset", "requests", "answered", "prompt tok", "answer tok", "$/answer"]]
    for d in plan.datasets:
        how = "meas" if d.measured else "like" if d.like else "prior"
        rows.append([d.name, f"{d.prompts:,}", f"{d.answered:,}", f"{d.prompt_tokens:,.0f} est",
                     f"{d.answer_tokens:,.0f} {how}",
                     f"{d.cost_per_answer:.6f} {'est' if how == 'prior' else how}"])
    out += _table(rows, {1, 2, 3, 4, 5})
    out.append("")
    rows = [["dataset", "TOKEN_BUDGET", "answers to go", "expected to go", "recorded", "expected"]]
    shorts = []
    for d in plan.datasets:
        needed = d.answers_needed
        if d.short:
            to_go = f"{d.todo:,} (short)"
            shorts.append(f"{d.name}: {d.todo:,} prompts to do reach ~{budget_text(d.reachable_tokens)} "
                          f"tokens of {budget_text(d.token_budget)} (needs {needed:,} answers)")
        else:
            to_go = f"{d.answers_to_go:,}"
        if d.complete:
            to_go = "0 (done)"
        rows.append([d.name, budget_text(d.token_budget), to_go, money(d.expected_to_go),
                     money(d.recorded_spend), money(d.expected_total)])
    out += _table(rows, {1, 2, 3, 4, 5})
    for line in shorts:
        out += wrap(f"  too few prompts, {line}")
    # a note the datasets share (the routing's, the model's) said once, naming them all
    noted: dict[str, list[str]] = {}
    for d in plan.datasets:
        for note in d.notes:
            noted.setdefault(note, []).append(d.name)
    for note, names in noted.items():
        out += wrap(f"  {', '.join(names)}: {note}")
    out.append("")
    out += wrap(f"build: {money(plan.recorded)} recorded"
                + (f" ({money(plan.recorded_elsewhere)} outside these datasets)" if plan.recorded_elsewhere else "")
                + f" + {money(plan.expected_total - plan.recorded)} expected to go = "
                f"{money(plan.expected_total)} expected in all, + {money(plan.room_for_last_request)} "
                "room for the last request's worst case")
    if plan.total_cost is not None:
        out.append(f"  against TOTAL_COST {money(plan.total_cost)}: {'fits' if plan.fits else 'does NOT fit'}")
        budgets = plan.fitting_budgets()
        weights = "even split" if len({d.weight for d in plan.datasets}) == 1 else "by WEIGHT_<D>"
        if budgets is None:
            out.append("  TOTAL_COST pays for every prompt of every dataset at these figures")
        elif not any(budgets.values()):
            out.append("  TOTAL_COST is spent: nothing more fits; raise TOTAL_COST")
        else:
            out += wrap(f"  the TOKEN_BUDGET that fits TOTAL_COST ({weights}): {budget_suggestion(plan)}")
    for d in plan.over_max_cost():
        out += wrap(f"  {d.name}: expected {money(d.expected_total)} > MAX_COST {money(plan.max_cost)} "
                    "(the cap per dataset): it would stop there")
    measured = [f"{d.name} ({d.measured})" for d in plan.datasets if d.measured]
    like = [d.name for d in plan.datasets if d.like]
    assumed = [d.name for d in plan.datasets if not d.measured and not d.like]
    out.append("")
    out.append("figures: prompt tokens estimated at ~4 bytes a token (est);")
    if measured:
        out += wrap("  measured (meas): answer length and $/answer of " + ", ".join(measured))
    if like:
        out += wrap(f"  {' '.join(like)}: no answers yet, taken like the measured datasets (like)")
    if assumed:
        out += wrap(f"  assumed (prior) for {' '.join(assumed)}: answers of {plan.prior_note}, "
                    "at the allowed routes' mean prices; `make pilot` measures them")
    return "\n".join(out)
