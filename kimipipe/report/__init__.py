"""The build report: one self-contained HTML page of plots over a build's files.

    kp-infer report WORK/*.responses.jsonl WORK/*.failures.jsonl SHARDS/ --html report.html
    make report                                # WORK/report.html, with make's caps

- `facts`: every file read into per-dataset facts (stdlib and msgspec only);
- `canvas`, `plots_build`, `plots_providers`: the plots, matplotlib to SVG (the `report`
  extra); `canvas` holds the shared style and what every plot function returns,
  `plots_build` the plots with one series or bar per dataset, `plots_providers` the
  providers side by side;
- `page`: the HTML, plots inlined, no request to anywhere (a Content-Security-Policy says
  so). It imports the plots, and only `write_report` imports it, so that no other command
  pays for matplotlib or needs it.

docs/report.md shows a screenshot and says what each plot answers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from ..errors import ExitCode, KPError
from .facts import BuildFacts, BuildLimits, read_facts

__all__ = ["BuildFacts", "BuildLimits", "read_facts", "write_report"]


def write_report(paths: list[str], settings: BuildLimits, out: str, say: Callable[[str], None],
                 datasets: list[str] = ()) -> BuildFacts:
    """Read PATHS, write the page to OUT (whole or not at all; `-` is stdout)."""
    facts = read_facts(paths, say, datasets)
    try:
        from .page import render
    except ImportError as e:  # matplotlib is an extra
        raise KPError(f"--html needs matplotlib ({e}): pip install 'kimipipe[report]'",
                      ExitCode.USAGE) from None
    text = render(facts, settings).encode()
    if out == "-":
        sys.stdout.buffer.write(text)
        sys.stdout.buffer.flush()
        return facts
    tmp = f"{out}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(text)
        os.replace(tmp, out)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise KPError(f"{out}: cannot write the report: {e.strerror}", ExitCode.ERROR) from None
    return facts
