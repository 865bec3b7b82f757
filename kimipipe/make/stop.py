"""What make says when kp-infer stops a dataset for money (exit 3): the limit, in make's words.

kp-infer's summary (WORK/D.infer-summary.json, removed before each run so that an old one
is never read) names the stop in `stop_reason`; the message gives the figures and the make
variable to change (MAX_COST=, TOTAL_COST=, MIN_CREDITS=), never a kp-infer flag; for
OpenRouter's own limits (the balance, the key's limit, a workspace or guardrail budget) it
names the limit and the figures OpenRouter gave (`limit` in the summary). For
TOTAL_COST it also says which datasets are complete (their responses stage is stamped
done) and what TOTAL_COST would finish the others: the spend recorded now, plus each
unfinished dataset's expected cost to go (at the cost per answer its answers measured, see
build_plan.py) with a 10% margin, plus room for one request's worst case, rounded up to a cent.
A stop reason this module does not know is named with kp-infer's own message.
"""

from __future__ import annotations

import math
import os

import msgspec

from ..contracts import SummaryStop, read_summary
from ..kinds import StopReason
from ..terminal import money
from .build_plan import BuildPlan
from .plan_report import wrap

MARGIN = 1.10
LIMITS = {"key-limit": "the API key's spending limit (openrouter_key_limit)",
          "workspace-budget": "the workspace's budget (openrouter_workspace_budget)",
          "guardrail-budget": "a guardrail's budget (openrouter_guardrail_budget)"}


def finishing_total_cost(plan: BuildPlan, complete: set[str]) -> float:
    to_go = sum(d.expected_to_go for d in plan.datasets if d.name not in complete)
    return math.ceil((plan.recorded + MARGIN * to_go + plan.room_for_last_request) * 100) / 100


def _status(plan: BuildPlan, complete: set[str]) -> str:
    done = [d.name for d in plan.datasets if d.name in complete]
    rest = [f"{d.name} ({d.answered:,} of {d.prompts:,} prompts answered)" for d in plan.datasets
            if d.name not in complete]
    return (f"complete: {' '.join(done) or 'none'}; not complete: {', '.join(rest) or 'none'}")


class StopSettings(msgspec.Struct):
    """The make variables a money stop names: what the build was asked to stay within."""

    total_cost: float | None = None  # TOTAL_COST
    max_cost: float | None = None  # MAX_COST
    min_credits: str | None = None  # MIN_CREDITS, as make gave it


def stop_message(dataset: str, work: str, plan: BuildPlan | None, complete: set[str],
                 settings: StopSettings) -> str:
    """The lines make prints after kp-infer's exit 3 on DATASET (SETTINGS: the caps)."""
    summary = read_summary(os.path.join(work, f"{dataset}.infer-summary.json"), SummaryStop)
    slug = summary.stop_reason if summary else None
    head = f"make: {dataset} stopped (kp-infer exit 3: money or a full disk)"
    if summary is None:
        return "\n".join(wrap(f"{head}: see kp-infer's message above; rerun make to resume "
                              "(nothing paid for is lost)"))
    spent = f"{money(summary.spend_this_run)} this run, {money(summary.spend_total)} recorded for {dataset}"
    lines = []
    if slug == StopReason.TOTAL_COST.slug:
        cap = settings.total_cost
        lines.append(f"make: {dataset} stopped by TOTAL_COST={cap:g} (the cap on the whole build, kp-infer exit 3)")
        if plan is not None:
            lines.append(f"  {money(plan.recorded)} recorded across the build")
            lines.append(f"  {_status(plan, complete)}")
            target = finishing_total_cost(plan, complete)
            lines.append(f"  raising TOTAL_COST to {target:g} would finish them (expected "
                         f"{money(plan.expected_total - plan.recorded)} more, +10%, + one request's worst case):")
            lines.append(f"  make all TOTAL_COST={target:g}")
        else:
            lines.append(f"  {spent}; raise TOTAL_COST and rerun make to resume")
    elif slug == StopReason.MAX_COST.slug:
        cap = settings.max_cost
        lines.append(f"make: {dataset} stopped by MAX_COST={cap:g} (the cap per dataset, kp-infer exit 3): {spent}")
        suggestion = ""
        if plan is not None:
            d = next((d for d in plan.datasets if d.name == dataset), None)
            if d is not None:
                target = math.ceil((d.recorded_spend + MARGIN * d.expected_to_go + d.worst_case_request) * 100) / 100
                suggestion = f" (about MAX_COST={target:g} would finish {dataset})"
        lines.append(f"  raise MAX_COST{suggestion} and rerun make to resume")
    elif slug == "min-credits":
        lines.append(f"make: {dataset} stopped: the account's balance is below MIN_CREDITS="
                     f"{settings.min_credits} (kp-infer exit 3): {spent}")
        lines.append("  add credits (make credits shows the balance), or lower MIN_CREDITS=, "
                     "and rerun make to resume")
    elif slug == "payment":
        lines.append(f"make: {dataset} stopped: OpenRouter answered 402, the balance or the key's "
                     f"limit is used up (kp-infer exit 3): {spent}")
        if summary.limit:
            lines.append(f"  {summary.limit.text()}")
        lines.append("  add credits or raise the key's limit (make credits shows both), or a smaller "
                     "MAX_TOKENS= (what is left must cover one request's worst case), and rerun make to resume")
    elif slug in LIMITS:
        lines.append(f"make: {dataset} stopped: {LIMITS[slug]} is reached (kp-infer exit 3): {spent}")
        if summary.limit:
            lines.append(f"  {summary.limit.text()}")
        lines.append("  raise it on openrouter.ai (or wait until it resets; make credits shows the "
                     "key's limit), and rerun make to resume")
    else:
        try:
            said = StopReason.from_slug(slug).message
        except StopIteration:
            said = f"stop reason {slug!r}"
        lines.append(f"{head}: {said}; {spent}")
        lines.append("  rerun make to resume once the limit allows (nothing paid for is lost)")
    lines.append(f"  {dataset} is not marked done: its responses stage resumes where it stopped")
    return "\n".join(wrapped for line in lines for wrapped in wrap(line))
