"""The whole build's money arithmetic (`make plan`, and `make all`'s refusal to start).

Per dataset D, from what `kp-infer --plan --json` reads (WORK/D.plan.json: the prompts,
their estimated prompt tokens, the allowed routes and their prices, what D's responses
and failures files already record) and what answers measured (WORK/D.pilot.json from
`make pilot`; else the answers already in WORK/D.responses.jsonl; else a stated prior):

    L  expected completion tokens per answer: measured mean; for a dataset with no answers
       yet, the mean of the other datasets' measured answers ("like"); else the prior
       (ANSWER_TOKENS, else half of MAX_TOKENS, as kp-infer --plan assumes)
    c  expected cost per answer: measured mean (or like L), else
       prompt tokens x mean allowed prompt price + L x mean allowed completion price
    answers to go   = min(prompts to do, ceil((TOKEN_BUDGET - completion tokens recorded) / L))
                      (all prompts to do without a TOKEN_BUDGET); a dataset whose prompts
                      cannot reach its TOKEN_BUDGET is short: the plan says so, it is no
                      reason to refuse
    expected to go  = answers to go x c
    expected in all = recorded + expected to go

The build: the spend recorded in every file TOTAL_COST counts (the --spent-in globs, other
datasets' files included; records another API than BASE_URL's answered, such as the
stand-in's, count for nothing: kimipipe/recorded/api.py) + every dataset's expected to go, with room for one request's
worst case (kp-infer reserves it before sending the last request), against TOTAL_COST.
The TOKEN_BUDGET that fits is the largest whole t with each dataset at WEIGHT_D x t (even
split: every weight 1) whose expected total fits TOTAL_COST, each rounded down to 3
significant digits; found by bisection, since each dataset's cost grows (in steps of one
answer) with its budget until its prompts run out.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import msgspec

from ..contracts import read_contract
from ..plans import (
    BuildPlanFile,
    DatasetFigures,
    DatasetPlanFile,
    InferPlan,
    PilotFigures,
    PlanPrices,
    PlanRoute,
    Recorded,
)
from ..recorded.spend import expand_spent_in, recorded_spend
from .measure import measure, read_pilot


class DatasetPlan(DatasetFigures):
    """One dataset's figures (plans.DatasetFigures) and what they give: the answers still
    to buy and their expected cost."""

    def answers_for(self, budget: float | None) -> int:
        """Answers still needed to reach BUDGET, at most the prompts to do."""
        if self.complete:
            return 0
        if budget is None:
            return self.todo
        return min(self.todo, max(0, math.ceil((budget - self.recorded_tokens) / max(self.answer_tokens, 1e-9))))

    @property
    def answers_needed(self) -> int | None:
        """Answers still needed to reach TOKEN_BUDGET (may exceed the prompts to do)."""
        if self.token_budget is None:
            return None
        return max(0, math.ceil((self.token_budget - self.recorded_tokens) / max(self.answer_tokens, 1e-9)))

    @property
    def answers_to_go(self) -> int:
        if self.complete:
            return 0
        needed = self.answers_needed
        return self.todo if needed is None else min(self.todo, needed)

    @property
    def short(self) -> bool:
        """Too few prompts to reach TOKEN_BUDGET."""
        needed = self.answers_needed
        return not self.complete and needed is not None and needed > self.todo

    @property
    def reachable_tokens(self) -> int:
        return round(self.recorded_tokens + self.todo * self.answer_tokens)

    @property
    def expected_to_go(self) -> float:
        return self.answers_to_go * self.cost_per_answer

    @property
    def expected_total(self) -> float:
        return self.recorded_spend + self.expected_to_go


@dataclass
class BuildPlan:
    datasets: list[DatasetPlan]
    routes: list[PlanRoute]  # the allowed routes, as kp-infer --plan read them
    prices: PlanPrices | None  # USD per M tokens (None: no dataset)
    total_cost: float | None
    max_cost: float | None
    recorded_elsewhere: float  # spend TOTAL_COST counts outside these datasets' files
    prior_note: str

    @property
    def recorded(self) -> float:
        return self.recorded_elsewhere + sum(d.recorded_spend for d in self.datasets)

    @property
    def room_for_last_request(self) -> float:
        return max((d.worst_case_request for d in self.datasets if d.answers_to_go), default=0.0)

    @property
    def expected_total(self) -> float:
        return self.recorded + sum(d.expected_to_go for d in self.datasets)

    @property
    def fits(self) -> bool:
        """Whether TOTAL_COST pays for what is left (nothing left to buy always fits)."""
        if self.total_cost is None or not any(d.answers_to_go for d in self.datasets):
            return True
        return self.expected_total + self.room_for_last_request <= self.total_cost

    def over_max_cost(self) -> list[DatasetPlan]:
        if self.max_cost is None:
            return []
        return [d for d in self.datasets if d.answers_to_go and d.expected_total > self.max_cost]

    def cost_at(self, t: float) -> float:
        """The build's expected total with each dataset at WEIGHT x t tokens (+ the room)."""
        go = [d.answers_for(d.weight * t) for d in self.datasets]
        room = max((d.worst_case_request for d, n in zip(self.datasets, go, strict=True) if n > 0),
                   default=0.0)
        return self.recorded + sum(n * d.cost_per_answer for d, n in zip(self.datasets, go, strict=True)) + room

    def fitting_budget(self) -> float | None:
        """The largest t (tokens per unit of weight) that fits TOTAL_COST; None when every
        prompt of every dataset fits (no TOKEN_BUDGET needed), 0 when nothing more does."""
        if self.total_cost is None:
            return None
        top = max(((d.recorded_tokens + d.todo * d.answer_tokens) / d.weight for d in self.datasets), default=0.0)
        if self.cost_at(top) <= self.total_cost:
            return None
        low, high = 0.0, top
        if self.cost_at(low) > self.total_cost:
            return 0.0
        for _ in range(200):  # the cost is a step function of t, growing: its last fitting t
            mid = (low + high) / 2
            if self.cost_at(mid) <= self.total_cost:
                low = mid
            else:
                high = mid
        t = math.floor(low)
        return t + 1 if self.cost_at(t + 1) <= self.total_cost else t

    def fitting_budgets(self) -> dict[str, int] | None:
        t = self.fitting_budget()
        if t is None:
            return None
        return {d.name: round_down(d.weight * t) for d in self.datasets}

    def to_file(self) -> BuildPlanFile:
        """WORK/build.plan.json's contents (`write_build_plan`)."""
        return BuildPlanFile(
            datasets=[DatasetPlanFile(**msgspec.structs.asdict(d), answers_to_go=d.answers_to_go, short=d.short,
                                      expected_to_go=d.expected_to_go,
                                      expected_total=d.expected_total)
                      for d in self.datasets],
            routes=self.routes, prices=self.prices, total_cost=self.total_cost,
            max_cost=self.max_cost, recorded=self.recorded,
            recorded_elsewhere=self.recorded_elsewhere, expected_total=self.expected_total,
            room_for_last_request=self.room_for_last_request, fits=self.fits,
            fitting_budgets=self.fitting_budgets())


def write_build_plan(path: str, plan: BuildPlan) -> None:
    """WORK/build.plan.json (`plans.BuildPlanFile`, indented by one)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(msgspec.to_builtins(plan.to_file()), f, indent=1)


def round_down(tokens: float) -> int:
    """To 3 significant digits, down (what a TOKEN_BUDGET that must fit is rounded to)."""
    n = int(tokens)
    if n < 1000:
        return n
    step = 10 ** (len(str(n)) - 3)
    return n // step * step


# -- reading the inputs --------------------------------------------------------------------

_plan_decoder = msgspec.json.Decoder(InferPlan)


def read_plan(path: str) -> InferPlan | None:
    """WORK/D.plan.json (`kp-infer --plan --json`), or None when there is none."""
    return read_contract(path, _plan_decoder, "not a kp-infer plan", "remake it (make plan)")


def stage_complete(work: str, name: str) -> bool:
    """D's responses stage is stamped done and make will not run it again (the stamp is
    newer than its prompts and its flags)."""
    def mtime(suffix: str) -> float | None:
        try:
            return os.path.getmtime(os.path.join(work, name + suffix))
        except OSError:
            return None

    stamp = mtime(".responses.done")
    inputs = [mtime(".prompts.jsonl"), mtime(".infer-flags")]
    return stamp is not None and all(t is None or t <= stamp for t in inputs)


def dataset_plan(name: str, work: str, plan: InferPlan, token_budget: int | None, weight: float,
                 answer_tokens_prior: int | None) -> DatasetPlan:
    """D's figures from WORK/D.plan.json (PLAN) and what answers measured."""
    measured = None
    figures: PilotFigures | None = None
    pilot = read_pilot(os.path.join(work, f"{name}.pilot.json"))
    if pilot is not None and pilot.answers:
        figures, measured = pilot, f"pilot: {pilot.answers:,} answers ({name}.pilot.json)"
    elif plan.prompts.done:
        responses = os.path.join(work, f"{name}.responses.jsonl")
        got = measure(responses)
        if got.answers:
            figures, measured = got, f"{got.answers:,} answers in {name}.responses.jsonl"
    per_prompt = plan.prompt_tokens.per_prompt
    mean = plan.prices.allowed_mean or plan.prices.bound
    mean_prompt, mean_completion = (mean.prompt, mean.completion) if mean else (0.0, 0.0)
    if figures is not None:
        answer_tokens = figures.completion_tokens.mean
        cost = figures.cost_per_answer.mean
    else:
        answer_tokens = answer_tokens_prior if answer_tokens_prior else plan.max_tokens / 2
        cost = (per_prompt * mean_prompt + answer_tokens * mean_completion) / 1e6
    worst = plan.cost.worst_case_request if plan.cost is not None else 0.0
    return DatasetPlan(
        # an answer is one request's: a conversation's turns each count (older plans: prompts)
        complete=stage_complete(work, name), name=name,
        prompts=(plan.requests or plan.prompts).input, todo=(plan.requests or plan.prompts).todo,
        # in the same unit: the requests answered (a conversation answered in part counts
        # its answered turns), not the prompts done
        answered=(plan.requests.input - plan.requests.todo if plan.requests else plan.prompts.done),
        prompt_tokens=per_prompt,
        recorded_spend=plan.recorded.spend, recorded_tokens=plan.recorded.completion_tokens,
        answer_tokens=float(answer_tokens), cost_per_answer=float(cost), measured=measured,
        measured_answers=figures.answers if figures is not None else 0,
        token_budget=token_budget, weight=weight, worst_case_request=worst,
        max_tokens=plan.max_tokens, notes=list(plan.warnings) + list(plan.notes))


def refreshed(plan: InferPlan, work: str, name: str, api: str | None = None) -> InferPlan:
    """PLAN with what D's files record now (a plan made before a run, read after it)."""
    got = measure(os.path.join(work, f"{name}.responses.jsonl"))
    spend = got.spend + recorded_spend(os.path.join(work, f"{name}.failures.jsonl"), api)
    prompts = msgspec.structs.replace(plan.prompts, done=got.answers,
                                      todo=max(0, plan.prompts.input - got.answers))
    requests = plan.requests and msgspec.structs.replace(
        plan.requests, todo=max(0, plan.requests.input - got.answers))
    return msgspec.structs.replace(plan, prompts=prompts, requests=requests, recorded=Recorded(
        spend=spend, completion_tokens=got.completion_tokens.total))


def build_plan(datasets: list[str], work: str, token_budgets: dict[str, int | None],
               weights: dict[str, float], total_cost: float | None, max_cost: float | None,
               spent_in: list[str], answer_tokens_prior: int | None, fresh: bool = False,
               api: str | None = None) -> BuildPlan:
    """The build's plan from WORK/D.plan.json of every dataset; FRESH: with the spend and
    answers D's files record now (the money-stop message, after the plan was made). The
    spend of records API did not answer counts for nothing (recorded/api.py)."""
    plans = {}
    for name in datasets:
        path = os.path.join(work, f"{name}.plan.json")
        plan = read_plan(path)
        if plan is None:
            raise FileNotFoundError(f"{path}: no plan (kp-infer --plan --json writes it)")
        plans[name] = refreshed(plan, work, name, api) if fresh else plan
    items = [dataset_plan(d, work, plans[d], token_budgets.get(d), weights.get(d, 1.0), answer_tokens_prior)
             for d in datasets]
    pool = [d for d in items if d.measured_answers]
    answers = sum(d.measured_answers for d in pool)
    for d in items:
        if pool and not d.measured_answers:  # like the datasets measured so far, not the prior
            d.answer_tokens = sum(x.answer_tokens * x.measured_answers for x in pool) / answers
            d.cost_per_answer = sum(x.cost_per_answer * x.measured_answers for x in pool) / answers
            d.like = " ".join(x.name for x in pool)
    own = [os.path.join(work, f"{d}.{kind}.jsonl") for d in datasets for kind in ("responses", "failures")]
    elsewhere = sum(recorded_spend(p, api) for p in expand_spent_in(spent_in, own))
    first = plans[datasets[0]] if datasets else None
    routes = [r for r in (first.routes or []) if r.allowed] if first is not None else []
    max_tokens = first.max_tokens if first is not None else 0
    prior = (f"{answer_tokens_prior:,} tokens (ANSWER_TOKENS)" if answer_tokens_prior
             else f"half of MAX_TOKENS ({max_tokens // 2:,} tokens), as kp-infer --plan assumes")
    return BuildPlan(items, routes, first.prices if first is not None else None, total_cost,
                     max_cost, elsewhere, prior)
