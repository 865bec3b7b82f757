"""`python -m kimipipe.make check|plan|pilot|stopped|clean ...`: what the Makefile runs.

The arguments are make's variables, passed as they are (an empty value means unset):

\b
    check    --source D=PATH... --work DIR --shards DIR --bin DIR --tokenizer T
             --tokenize-flags FLAGS --base-url URL [--min-credits USD]
    plan     --work DIR --datasets "D..." [--token-budget D=N]... [--weight D=W]...
             [--total-cost USD] [--max-cost USD] [--spent-in GLOB]... [--answer-tokens N]
             [--base-url URL] [--gate [--allow-short]] [--json FILE]
    pilot    RESPONSES [--failures FILE] -o WORK/D.pilot.json
    stopped  --dataset D and plan's arguments
    clean    --work DIR --shards DIR --datasets "D..." [--build] [--paid 1] (make/clean.py)

Exit codes: 0 done; 2 a check failed, or (--gate) the plan does not fit TOTAL_COST and
ALLOW_SHORT is not set (nothing was started), or clean found answers paid for (nothing
removed).
"""

from __future__ import annotations

import functools
import os
import sys

import click

from ..errors import KPError
from ..options import CommandSettings, argument, option, parameters, parse_quantity, settings_from
from ..recorded.api import api_of
from ..terminal import money
from .build_plan import build_plan, write_build_plan
from .check import run_checks
from .clean import clean
from .measure import measure, pilot_line, write_pilot
from .plan_report import budget_suggestion, report, wrap
from .stop import StopSettings, stop_message


def say_wrapped(text: str) -> None:
    """A message on stderr, in lines of 80 columns."""
    print("\n".join(wrap(text)), file=sys.stderr)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"make: {what} {item!r} is not D=VALUE")
        out[name] = value.strip()
    return out


def _money(text: str | None) -> float | None:
    return float(text) if text not in (None, "") else None


def _plan(args: PlanArguments, fresh: bool = False):
    datasets = args.datasets.split()
    budgets = {d: parse_quantity(v) if v else None for d, v in _pairs(args.token_budget, "--token-budget").items()}
    weights = {d: float(v) if v else 1.0 for d, v in _pairs(args.weight, "--weight").items()}
    bad = [d for d, w in weights.items() if w <= 0]
    if bad:
        raise SystemExit(f"make: WEIGHT_{bad[0]} must be above 0")
    return build_plan(datasets, args.work, budgets, weights, _money(args.total_cost), _money(args.max_cost),
                      [g for g in args.spent_in if g], int(args.answer_tokens) if args.answer_tokens else None,
                      fresh=fresh, api=api_of(args.base_url) if args.base_url else None)


def cmd_plan(args: PlanSettings) -> int:
    plan = _plan(args)
    print(report(plan, "make all: the plan" if args.gate else "make plan"), flush=True)
    if args.json:
        write_build_plan(args.json, plan)
    if not args.gate:
        return 0
    problems = []
    if not plan.fits:
        asked = ("every dataset's TOKEN_BUDGET" if all(d.token_budget for d in plan.datasets)
                 else "every dataset (all prompts where there is no TOKEN_BUDGET)")
        problems.append(f"TOTAL_COST {money(plan.total_cost)} cannot pay for {asked} at the planned "
                        f"prices (expected {money(plan.expected_total)} + {money(plan.room_for_last_request)} "
                        "room for the last request)")
    for d in plan.over_max_cost():
        problems.append(f"MAX_COST {money(plan.max_cost)} stops {d.name} before its TOKEN_BUDGET "
                        f"(expected {money(d.expected_total)})")
    if not problems:
        return 0
    if args.allow_short:
        say_wrapped(f"make all: ALLOW_SHORT=1: going ahead; {'; '.join(problems)}: the last datasets "
            "will come up short")
        return 0
    fix = budget_suggestion(plan)
    say_wrapped(f"make all: refusing to start (nothing was sent): {'; '.join(problems)}.")
    if fix and not plan.fits:
        say_wrapped(f"  make all {fix}    (fits TOTAL_COST), or")
    say_wrapped("  raise TOTAL_COST (or MAX_COST), or ALLOW_SHORT=1 to start anyway and let the last "
        "datasets come up short")
    return 2


def cmd_pilot(args: PilotSettings) -> int:
    figures = measure(args.responses, args.failures)
    write_pilot(args.output, figures)
    print(pilot_line(args.output, figures), file=sys.stderr)
    return 0


def cmd_check(args: CheckSettings) -> int:
    sources = {d: (path, os.path.join(args.work, f"{d}.prompts.jsonl"))
               for d, path in _pairs(args.source, "--source").items()}
    results = run_checks(sources, args.bin, args.tokenizer, args.tokenize_flags, args.base_url,
                         [args.work, args.shards], args.work, args.min_credits)
    for ok, line in results:
        print(f"check: {'ok' if ok else 'FAILED'}: {line}", flush=True)
    failed = sum(1 for ok, _ in results if not ok)
    if failed:
        print(f"make check: {failed} problem(s) above; nothing was started", file=sys.stderr)
        return 2
    return 0


def cmd_stopped(args: StoppedSettings) -> int:
    work = args.work
    complete = {d for d in args.datasets.split() if os.path.exists(os.path.join(work, f"{d}.responses.done"))}
    try:
        plan = _plan(args, fresh=True)
    except FileNotFoundError:
        plan = None
    settings = StopSettings(total_cost=_money(args.total_cost), max_cost=_money(args.max_cost),
                            min_credits=args.min_credits)
    print(stop_message(args.dataset, work, plan, complete, settings), file=sys.stderr)
    return 0


# make's variables, as make passes them: an empty value is unset
def _yes(value: str) -> bool:
    return value not in ("", "0", "no", "false")


WORK = functools.partial(option, "--work", required=True)
DATASETS = functools.partial(option, "--datasets", required=True)


class PlanArguments(CommandSettings):
    """What `plan` and `stopped` plan from."""

    work: str = WORK()
    datasets: str = DATASETS()
    token_budget: list[str] = option("--token-budget", multiple=True)
    weight: list[str] = option("--weight", multiple=True)
    total_cost: str | None = option("--total-cost")
    max_cost: str | None = option("--max-cost")
    min_credits: str | None = option("--min-credits")
    spent_in: list[str] = option("--spent-in", multiple=True)
    answer_tokens: str | None = option("--answer-tokens")
    base_url: str | None = option("--base-url")  # the API whose spend counts (infer/api.py)


class PlanSettings(PlanArguments):
    gate: bool = option("--gate", is_flag=True)
    allow_short: bool = option("--allow-short", default="", convert=_yes)
    json: str | None = option("--json")


class StoppedSettings(PlanArguments):
    dataset: str = option("--dataset", required=True)


class PilotSettings(CommandSettings):
    responses: str = argument()
    failures: str | None = option("--failures")
    output: str = option("-o", "--output", required=True)


class CleanSettings(CommandSettings):
    work: str = WORK()
    shards: str = option("--shards", required=True)
    datasets: str = DATASETS()
    build: bool = option("--build", is_flag=True, help="the build's own files too (make clean)")
    paid: bool = option("--paid", default="", convert=_yes,
                        help="CLEAN_PAID: also remove answers paid for")


class CheckSettings(CommandSettings):
    source: list[str] = option("--source", multiple=True)
    work: str = WORK()
    shards: str = option("--shards", required=True)
    bin: str = option("--bin", required=True)
    tokenizer: str = option("--tokenizer", required=True)
    tokenize_flags: str = option("--tokenize-flags", default="")
    base_url: str = option("--base-url", required=True)
    min_credits: str = option("--min-credits", default="")


def cmd_clean(args: CleanSettings) -> int:
    return clean(args.work, args.shards, args.datasets.split(), args.build, args.paid)


class _Helpers(click.Group):
    """An expected failure (a missing plan, an unreadable file) is one line and exit 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (OSError, KPError, ValueError) as e:
            print(f"make {ctx.invoked_subcommand}: {e}", file=sys.stderr)
            return 2


def _helper(name: str, run, settings: type) -> click.Command:
    return click.Command(name, params=parameters(settings),
                         callback=lambda **values: run(settings_from(settings, values)))


HELPERS = _Helpers("python -m kimipipe.make", help=__doc__, commands=[
    _helper("plan", cmd_plan, PlanSettings), _helper("stopped", cmd_stopped, StoppedSettings),
    _helper("pilot", cmd_pilot, PilotSettings), _helper("clean", cmd_clean, CleanSettings),
    _helper("check", cmd_check, CheckSettings)])


def main(argv: list[str] | None = None) -> int:
    try:
        return HELPERS.main(args=argv, prog_name="python -m kimipipe.make",
                            standalone_mode=False) or 0
    except click.ClickException as e:
        e.show()
        return e.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
