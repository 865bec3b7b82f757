"""`python -m kimipipe.make check|plan|pilot|stopped|clean ...`: what the Makefile runs.

The arguments are make's variables, passed as they are (an empty value means unset):

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

import argparse
import os
import sys

from ..cli import parse_quantity
from ..errors import KPError
from ..recorded.api import api_of
from .build_plan import build_plan, write_build_plan
from .check import run_checks
from .clean import clean
from .measure import measure, pilot_line, write_pilot
from .plan_report import budget_suggestion, money, report, wrap
from .stop import StopSettings, stop_message


def say(text: str) -> None:
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


def _plan(args, fresh: bool = False):
    datasets = args.datasets.split()
    budgets = {d: parse_quantity(v) if v else None for d, v in _pairs(args.token_budget, "--token-budget").items()}
    weights = {d: float(v) if v else 1.0 for d, v in _pairs(args.weight, "--weight").items()}
    bad = [d for d, w in weights.items() if w <= 0]
    if bad:
        raise SystemExit(f"make: WEIGHT_{bad[0]} must be above 0")
    return build_plan(datasets, args.work, budgets, weights, _money(args.total_cost), _money(args.max_cost),
                      [g for g in args.spent_in if g], int(args.answer_tokens) if args.answer_tokens else None,
                      fresh=fresh, api=api_of(args.base_url) if args.base_url else None)


def cmd_plan(args) -> int:
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
        say(f"make all: ALLOW_SHORT=1: going ahead; {'; '.join(problems)}: the last datasets "
            "will come up short")
        return 0
    fix = budget_suggestion(plan)
    say(f"make all: refusing to start (nothing was sent): {'; '.join(problems)}.")
    if fix and not plan.fits:
        say(f"  make all {fix}    (fits TOTAL_COST), or")
    say("  raise TOTAL_COST (or MAX_COST), or ALLOW_SHORT=1 to start anyway and let the last "
        "datasets come up short")
    return 2


def cmd_pilot(args) -> int:
    figures = measure(args.responses, args.failures)
    write_pilot(args.output, figures)
    print(pilot_line(args.output, figures), file=sys.stderr)
    return 0


def cmd_check(args) -> int:
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


def cmd_stopped(args) -> int:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kimipipe.make", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def plan_arguments(p):
        p.add_argument("--work", required=True)
        p.add_argument("--datasets", required=True)
        p.add_argument("--token-budget", action="append", default=[])
        p.add_argument("--weight", action="append", default=[])
        p.add_argument("--total-cost")
        p.add_argument("--max-cost")
        p.add_argument("--min-credits")
        p.add_argument("--spent-in", action="append", default=[])
        p.add_argument("--answer-tokens")
        p.add_argument("--base-url")  # the API whose spend counts (infer/api.py)

    p = sub.add_parser("plan")
    plan_arguments(p)
    p.add_argument("--gate", action="store_true")
    p.add_argument("--allow-short", default="")
    p.add_argument("--json")
    p.set_defaults(run=cmd_plan)
    p = sub.add_parser("stopped")
    plan_arguments(p)
    p.add_argument("--dataset", required=True)
    p.set_defaults(run=cmd_stopped)
    p = sub.add_parser("pilot")
    p.add_argument("responses")
    p.add_argument("--failures")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(run=cmd_pilot)
    p = sub.add_parser("clean")
    p.add_argument("--work", required=True)
    p.add_argument("--shards", required=True)
    p.add_argument("--datasets", required=True)
    p.add_argument("--build", action="store_true", help="the build's own files too (make clean)")
    p.add_argument("--paid", default="", help="CLEAN_PAID: also remove answers paid for")
    p.set_defaults(run=lambda args: clean(args.work, args.shards, args.datasets.split(), args.build,
                                          args.paid not in ("", "0", "no", "false")))
    p = sub.add_parser("check")
    p.add_argument("--source", action="append", default=[])
    p.add_argument("--work", required=True)
    p.add_argument("--shards", required=True)
    p.add_argument("--bin", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--tokenize-flags", default="")
    p.add_argument("--base-url", required=True)
    p.add_argument("--min-credits", default="")
    p.set_defaults(run=cmd_check)
    args = parser.parse_args(argv)
    if getattr(args, "allow_short", None) is not None:
        args.allow_short = args.allow_short not in ("", "0", "no", "false")
    try:
        return args.run(args)
    except (OSError, KPError, ValueError) as e:  # a missing plan, an unreadable file: one line
        print(f"make {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
