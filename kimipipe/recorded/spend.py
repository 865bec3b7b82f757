"""The spend recorded in kp-infer's files, as every cap and plan counts it.

What one line cost is `records.record_cost` (a response's `usage.cost` and the answers
refused before it; a failure line's `cost`). Here it is summed over files: a responses or
failures file read as another run may be writing it (finished lines only, `recorded_spend`),
by what `--spent-in` names (`expand_spent_in`: globs, without the run's own files). The
readers: `--total-cost` (infer/total_cost.py `open_total_cost`), `make plan` and
make's money-stop message (make/build_plan.py). Spend another API answered counts for
nothing here (recorded/api.py `counts_here`).
"""

from __future__ import annotations

import glob
import os

import msgspec

from ..io import finished_records
from ..records import RecordCost
from .api import counts_here


class Spent(RecordCost):
    """What a spend reader takes of a responses or failures line: its cost, and who
    answered (a failure line names its id and generation too, for a refusal to resume)."""

    id: str = ""
    api: str | None = None
    generation_id: str | None = None


SPENT_DECODER = msgspec.json.Decoder(Spent)


def recorded_spend(path: str, api: str | None = None) -> float:
    """USD recorded in a responses or failures file (finished lines), by
    `records.record_cost`: a response's refused answers included; with API, only what that
    API answered (or records too old to say: recorded/api.py)."""
    return sum(r.paid for r in finished_records(path, SPENT_DECODER) if counts_here(r.api, api))


def expand_spent_in(patterns: list[str], own: list[str]) -> list[str]:
    """The files --spent-in names (globs expanded; a name that matches nothing counts
    nothing yet), without OWN (this run's output and failures, counted already) and
    without repeats."""
    seen = {os.path.realpath(p) for p in own if p and p != "-"}
    files = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        for path in matches:
            real = os.path.realpath(path)
            if real not in seen and os.path.isfile(path):
                seen.add(real)
                files.append(path)
    return files
