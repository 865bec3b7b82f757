"""`python -m kimipipe.report`: what `make report` runs (make's variables, as they are).

\b
    python -m kimipipe.report --work DIR --shards DIR --datasets "D..." [--total-cost USD]
        [--max-cost USD] [--token-budget D=N]... -o FILE

Reads each dataset's files that exist (WORK/<D>.responses.jsonl, .failures.jsonl,
.rejects.jsonl, .tokens.jsonl.zst, and SHARDS/<D>/ when it holds a manifest): the same
page as `kp-infer report FILE... --html FILE`, with each dataset's own TOKEN_BUDGET. An
empty value means unset. Prints the page's path on stdout.
"""

from __future__ import annotations

import os
import sys

import click

from ..errors import KPError
from ..options import CommandSettings, option, parameters, parse_quantity, settings_from
from ..shard.readback import has_manifest
from . import BuildLimits, write_report

STAGE_FILES = ("responses.jsonl", "failures.jsonl", "rejects.jsonl", "tokens.jsonl.zst")


def build_files(work: str, shards: str, datasets: list[str]) -> list[str]:
    """The files a build has made so far, dataset by dataset, stage by stage."""
    found = []
    for d in datasets:
        found += [p for p in (os.path.join(work, f"{d}.{suffix}") for suffix in STAGE_FILES)
                  if os.path.isfile(p)]
        if has_manifest(os.path.join(shards, d)):
            found.append(os.path.join(shards, d))
    return found


def _budgets(items: tuple[str, ...]) -> dict[str, int | None]:
    """`--token-budget D=N`, repeated: each dataset's own TOKEN_BUDGET (empty: none)."""
    budgets: dict[str, int | None] = {}
    for item in items:
        name, _, value = item.partition("=")
        budgets[name] = parse_quantity(value) if value.strip() else None
    return budgets


def _money(text: str) -> float | None:
    return float(text) if text else None


class ReportSettings(CommandSettings):
    work: str = option("--work", required=True)
    shards: str = option("--shards", required=True)
    datasets: str = option("--datasets", required=True)
    total_cost: float | None = option("--total-cost", default="", convert=_money)
    max_cost: float | None = option("--max-cost", default="", convert=_money)
    token_budgets: dict[str, int | None] = option("--token-budget", multiple=True,
                                                  metavar="D=N", convert=_budgets)
    output: str = option("-o", "--output", required=True)


def report(args: ReportSettings) -> int:
    datasets = args.datasets.split()
    settings = BuildLimits(total_cost=args.total_cost, max_cost=args.max_cost,
                        token_budgets=args.token_budgets)

    def say(text: str) -> None:
        print(text, file=sys.stderr)

    try:
        write_report(build_files(args.work, args.shards, datasets), settings, args.output, say, datasets)
    except KPError as e:
        print(f"make report: {e}", file=sys.stderr)
        return e.exit_code
    print(f"make report: the build report is in {args.output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    command = click.Command("python -m kimipipe.report", help=__doc__,
                            params=parameters(ReportSettings),
                            callback=lambda **values: report(settings_from(ReportSettings, values)))
    try:
        return command.main(args=argv, prog_name="python -m kimipipe.report",
                            standalone_mode=False) or 0
    except click.ClickException as e:
        e.show()
        return e.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
