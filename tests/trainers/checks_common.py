"""What specforge_checks.py and speculators_checks.py share. Each runs in its trainer's own
venv with this folder first on its path (a script's own folder), so both import this."""

from __future__ import annotations

import json
import re
import sys
import traceback
from pathlib import Path

_failed: list[str] = []


def check(name: str, fn) -> None:
    try:
        print(f"ok {name}: {fn()}", flush=True)
    except Exception as e:  # a check's failure is a line, and the next check still runs
        _failed.append(name)
        where = traceback.format_exc().strip().splitlines()[-3:]
        print(f"FAIL {name}: {type(e).__name__}: {e} | {' / '.join(where)}", flush=True)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def doc_configs(docs: Path, marker: str) -> list[str]:
    """The ```yaml blocks right after MARKER in DOCS."""
    return re.findall(rf"<!-- {marker} -->\s*```yaml\n(.*?)```", docs.read_text(), re.S)


def finish() -> None:
    """Exit 1 when any check failed."""
    sys.exit(1 if _failed else 0)
