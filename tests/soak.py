"""The flake hunt: the whole suite N times in a row on a loaded machine, failures per test.

    make test-soak                   # 10 runs, one core kept busy
    make test-soak SOAK_RUNS=3 SOAK_LOAD=0

One core is kept busy for the whole hunt (`stress-ng --cpu 1` when it is installed, else a
busy loop in a child process), as a second job on a CI machine or a laptop would; then
`pytest` runs the suite RUNS times with the Makefile's test processes, each run writing a
JUnit XML report. At the end a table lists every test that failed in any run and in how
many, and the exit code is 1 when any did. A test that fails here and passes alone is a
race to fix (wait on an event: a stand-in counter, a line, a process state), not a test to
retry.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _spin() -> None:
    while True:
        pass


def start_load(cores: int):
    if cores <= 0:
        return None
    if shutil.which("stress-ng"):
        return subprocess.Popen(["stress-ng", "--cpu", str(cores), "--quiet"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(cores)]
    for p in procs:
        p.start()
    return procs


def stop_load(load) -> None:
    if load is None:
        return
    if isinstance(load, subprocess.Popen):
        load.terminate()
        load.wait(timeout=30)
        return
    for p in load:
        p.terminate()
        p.join(timeout=30)


def messages_of(report: Path) -> list[tuple[str, str]]:
    """Each failed test of REPORT with the first line of its failure message."""
    if not report.exists():
        return []
    out = []
    for case in ET.parse(report).getroot().iter("testcase"):
        for kind in ("failure", "error"):
            if (node := case.find(kind)) is not None:
                why = (node.get("message") or kind).strip().splitlines() or [kind]
                out.append((f"{case.get('classname')}::{case.get('name')}", why[0][:300]))
    return out


def failures_of(report: Path) -> list[str]:
    if not report.exists():
        return ["(no report: the run itself failed)"]
    failed = []
    for case in ET.parse(report).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    return failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--load", type=int, default=1, help="cores kept busy (default 1)")
    ap.add_argument("--jobs", default=str((os.cpu_count() or 1) + 2), help="pytest-xdist processes")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = ap.parse_args()
    counts: Counter[str] = Counter()
    walls = []
    load = start_load(args.load)
    try:
        with tempfile.TemporaryDirectory(prefix="kp-soak-") as tmp:
            for run in range(1, args.runs + 1):
                report = Path(tmp) / f"run{run}.xml"
                started = time.monotonic()
                proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", args.jobs,
                                       "--dist", "worksteal", "-p", "no:cacheprovider",
                                       f"--junitxml={report}", *args.pytest_args], cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                walls.append(time.monotonic() - started)
                failed = failures_of(report)
                counts.update(failed)
                tail = proc.stdout.strip().splitlines()[-1:] or ["(no output)"]
                print(f"soak: run {run}/{args.runs}: {tail[0]} ({walls[-1]:.0f} s)", flush=True)
                for name, why in messages_of(report):  # (the report goes with the temp dir)
                    print(f"  failed: {name}: {why}", flush=True)
    finally:
        stop_load(load)
    print(f"soak: {args.runs} runs with {args.load} core(s) busy, "
          f"{sum(counts.values())} failures in {len(counts)} tests; "
          f"wall {min(walls):.0f}-{max(walls):.0f} s a run")
    for name, n in counts.most_common():
        print(f"  {n:>2}/{args.runs}  {name}")
    return 1 if counts else 0


if __name__ == "__main__":
    sys.exit(main())
