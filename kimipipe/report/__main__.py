"""`python -m kimipipe.report`: what `make report` runs (make's variables, as they are).

    python -m kimipipe.report --work DIR --shards DIR --datasets "D..." [--total-cost USD]
        [--max-cost USD] [--token-budget D=N]... -o FILE

Reads each dataset's files that exist (WORK/<D>.responses.jsonl, .failures.jsonl,
.rejects.jsonl, .tokens.jsonl.zst, and SHARDS/<D>/ when it holds a manifest): the same
page as `kp-infer report FILE... --html FILE`, with each dataset's own TOKEN_BUDGET. An
empty value means unset. Prints the page's path on stdout.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..cli import parse_quantity
from ..errors import KPError
from ..shard.writer import MANIFEST
from . import Settings, write_report

STAGE_FILES = ("responses.jsonl", "failures.jsonl", "rejects.jsonl", "tokens.jsonl.zst")


def build_files(work: str, shards: str, datasets: list[str]) -> list[str]:
    """The files a build has made so far, dataset by dataset, stage by stage."""
    found = []
    for d in datasets:
        found += [p for p in (os.path.join(work, f"{d}.{suffix}") for suffix in STAGE_FILES)
                  if os.path.isfile(p)]
        if os.path.isfile(os.path.join(shards, d, MANIFEST)):
            found.append(os.path.join(shards, d))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kimipipe.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True)
    parser.add_argument("--shards", required=True)
    parser.add_argument("--datasets", required=True)
    parser.add_argument("--total-cost", default="")
    parser.add_argument("--max-cost", default="")
    parser.add_argument("--token-budget", action="append", default=[], metavar="D=N")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args(argv)
    datasets = args.datasets.split()
    budgets = {}
    for item in args.token_budget:
        name, _, value = item.partition("=")
        budgets[name] = parse_quantity(value) if value.strip() else None
    settings = Settings(total_cost=float(args.total_cost) if args.total_cost else None,
                        max_cost=float(args.max_cost) if args.max_cost else None,
                        token_budgets=budgets)

    def say(text: str) -> None:
        print(text, file=sys.stderr)

    try:
        write_report(build_files(args.work, args.shards, datasets), settings, args.output, say, datasets)
    except KPError as e:
        print(f"make report: {e}", file=sys.stderr)
        return e.exit_code
    print(f"make report: the build report is in {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
