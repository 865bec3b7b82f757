"""Mutation sampling: does a test fail when a claim of the code is broken?

A mutation list, written by the author of a change, names plausible one-line bugs of the
new code (an off-by-one, a dropped condition, a wrong default, a lost wiring), each with
the claim it breaks. This applies them one at a time, on a scratch copy of the tree (never
the working tree: others use theirs), runs the tests, and prints each as CAUGHT (with the
first test that failed) or SURVIVED (a missing test: write it, then run this again).
mutmut cannot do this here: most tests run the kp-* commands as subprocesses (and from a
fork server), where mutmut's in-process trampolines do not reach.

Usage:

    python tools/mutants.py                               # every list in tests/mutations/
    python tools/mutants.py tests/mutations/identity.toml --only identity-strikes-off-by-one
    python tools/mutants.py --range main..HEAD            # the mutants of the files a range changed
    python tools/mutants.py --files kimipipe/infer/identity.py --full
    python tools/mutants.py --list                        # check the anchors, run nothing
    make mutants MUTANTS="tests/mutations/identity.toml" MUTANTS_ARGS="--full"

A list is TOML, one table per mutant (tests/mutations/*.toml):

    [[mutant]]
    id = "identity-strikes-off-by-one"        # unique across the lists run together
    file = "kimipipe/infer/identity.py"       # relative to the repository
    anchor = "if evidence.strikes >= self.strikes:"   # occurs exactly once in FILE
    replace = "if evidence.strikes > self.strikes:"
    claim = "a provider is quarantined after exactly --identity-strikes refused answers"
    tests = ["tests/test_claims_identity.py"] # optional: run first

Each mutant's tests run in stages, each a pytest run stopped at its first failure (-x),
the next stage only for a mutant the last one missed: 1. its `tests`; 2. every
tests/test_*.py that names FILE (its dotted module, `kimipipe.infer.identity`, or its path)
not run yet; 3. with `--full`, the whole suite (what CI runs; on a busy two-core machine,
leave it to an idle one). Before a test file judges its first mutant it runs once on the
unmutated copy (the baseline; `--no-baseline` skips it): a test that fails there would
count every mutant as caught, so the run stops instead, unless it passes when run again
alone (flaky: said, and left out of every later run, as it can judge no mutant).

How the copy stays the one that runs: the scratch tree is `git ls-files` (tracked and
untracked, not ignored) copied under a temporary directory, with `.venv` a link to the
checkout's and `../shared` a link beside it (the tests look for the tokenizer and the
public sources there); every process the tests start gets PYTHONPATH=SCRATCH, so the
package is imported from the copy (checked before the first run: the run stops if not).
The mutated file's bytecode is removed on each edit and each restore (a mutant of the same
size written in the same second would otherwise pass for the original).

Exit status: 0 every mutant caught; 1 a survivor (or a mutant whose tests could not be
chosen); 2 a list that does not apply (an anchor missing or not unique: the code moved,
update the list) or a baseline that fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # the default --root
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+?)(?: - .*)?$", re.M)


@dataclass
class Mutant:
    id: str
    file: str
    anchor: str
    replace: str
    claim: str
    tests: list[str] = field(default_factory=list)
    source: str = ""  # the list it came from
    line: int = 0  # where the anchor starts (1-based), once checked


@dataclass
class Outcome:
    id: str
    where: str
    claim: str
    verdict: str  # caught, survived, untested, unjudged (its pytest killed by a signal)
    by: str = ""  # the first failing test (or "timeout")
    ran: list[str] = field(default_factory=list)
    seconds: float = 0.0


def read_lists(paths: list[Path]) -> list[Mutant]:
    mutants, seen = [], set()
    for path in paths:
        with open(path, "rb") as f:
            data = tomllib.load(f)
        for k, entry in enumerate(data.get("mutant", []), start=1):
            missing = {"file", "anchor", "replace", "claim"} - entry.keys()
            if missing:
                raise SystemExit(f"{path}: mutant #{k}: missing {', '.join(sorted(missing))}")
            m = Mutant(id=entry.get("id") or f"{Path(path).stem}-{k}", file=entry["file"],
                       anchor=entry["anchor"], replace=entry["replace"], claim=entry["claim"],
                       tests=list(entry.get("tests", [])), source=str(path))
            if m.id in seen:
                raise SystemExit(f"{path}: mutant id {m.id!r} used twice")
            seen.add(m.id)
            mutants.append(m)
    return mutants


def check_anchors(mutants: list[Mutant], root: Path) -> list[str]:
    """Where each anchor is (Mutant.line); the problems of those that do not apply."""
    problems = []
    for m in mutants:
        path = root / m.file
        if not path.is_file():
            problems.append(f"{m.source}: {m.id}: no such file {m.file}")
            continue
        text = path.read_text(encoding="utf-8")
        n = text.count(m.anchor)
        if n != 1:
            problems.append(f"{m.source}: {m.id}: anchor found {n} times in {m.file} "
                            f"(must be once): {m.anchor[:60]!r}")
            continue
        if m.anchor == m.replace:
            problems.append(f"{m.source}: {m.id}: the replacement is the anchor")
            continue
        for t in m.tests:
            if not (root / t.split("::")[0]).is_file():
                problems.append(f"{m.source}: {m.id}: no such test file {t}")
        m.line = text[:text.index(m.anchor)].count("\n") + 1
    return problems


def module_of(file: str) -> str:
    return file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def tests_naming(file: str, root: Path) -> list[str]:
    """The test files that name FILE: its dotted module or its path (below the package)."""
    module = module_of(file)
    rel = file.split("/", 1)[1] if "/" in file else file
    needles = (module, rel)
    found = []
    for path in sorted((root / "tests").glob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        if any(re.search(re.escape(n) + r"(?![\w])", text) for n in needles):
            found.append(f"tests/{path.name}")
    return found


def changed_files(spec: str, root: Path) -> set[str]:
    out = subprocess.run(["git", "diff", "--name-only", spec], cwd=root, capture_output=True,
                         text=True, check=True).stdout
    return set(out.split())


def make_scratch(base: Path, root: Path) -> Path:
    """ROOT's tree (git ls-files: tracked and untracked, not ignored) copied under BASE."""
    tree = base / root.name
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=root, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        src = root / name
        if not src.is_file() or src.is_symlink() and not src.exists():
            continue  # (deleted in the work tree, not yet in the index)
        dst = tree / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    if (root / ".venv").exists():
        (tree / ".venv").symlink_to(root / ".venv")
    if (root.parent / "shared").exists():
        (base / "shared").symlink_to(root.parent / "shared")
    return tree


def environment(tree: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    return env


def python() -> str:
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def check_imported_from(tree: Path, env: dict, module: str) -> None:
    """Stop unless a fresh interpreter (as a command starts) imports MODULE from the copy."""
    code = f"import {module} as m; print(m.__file__)"
    out = subprocess.run([python(), "-c", code], cwd="/", env=env, capture_output=True,
                         text=True).stdout.strip()
    if not out.startswith(str(tree) + os.sep):
        raise SystemExit(f"mutants: {module} is imported from {out or '(nowhere)'}, not from the "
                         f"scratch copy {tree}: the mutants would not be the code that runs")


def drop_bytecode(path: Path) -> None:
    cache = path.parent / "__pycache__"
    for pyc in cache.glob(f"{path.stem}.*.pyc"):
        pyc.unlink(missing_ok=True)


def junit_failures(path: Path) -> list[str]:
    """The failed tests a pytest --junitxml report names, as node IDs."""
    import xml.etree.ElementTree as ET

    try:
        cases = ET.parse(path).getroot().iter("testcase")
    except (ET.ParseError, OSError):
        return []
    found = []
    for case in cases:
        if case.find("failure") is None and case.find("error") is None:
            continue
        parts = case.get("classname", "").split(".")
        # tests.test_x.TestY -> tests/test_x.py::TestY
        at = next((k for k, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        node = "/".join(parts[:at + 1]) + ".py::" + "::".join([*parts[at + 1:], case.get("name", "")])
        found.append(node)
    return found


def run_pytest(tree: Path, env: dict, tests: list[str], jobs: int, timeout: float,
               stop_first: bool = True, deselect: frozenset[str] = frozenset()
               ) -> tuple[bool, str, str]:
    """(passed, the first failing test or "timeout", pytest's output tail); DESELECT: tests
    not run (those found flaky)."""
    # (the junit report names the failed test where xdist's -x cuts the summary short)
    junit = Path(tempfile.mkstemp(prefix="kp-mutants-", suffix=".xml")[1])
    cmd = [python(), "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *tests,
           *(f"--deselect={t}" for t in sorted(deselect)), f"--junitxml={junit}"]
    if stop_first:
        cmd.append("-x")
    if jobs > 1 and not (len(tests) == 1 and "::" in tests[0]):  # (one test: no workers to start)
        cmd += ["-n", str(jobs)]
    # (a session of its own: a run past TIMEOUT is ended with its workers and stand-ins)
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return False, "timeout", output[-2000:]
    except BaseException:  # (Ctrl-C, SIGTERM: the run ends with this one)
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        failed_in_junit = junit_failures(junit)
        junit.unlink(missing_ok=True)
    if proc.returncode == 0:
        return True, "", output[-2000:]
    failed = _FAILED.findall(output) or failed_in_junit
    if failed:
        return False, failed[0], output[-4000:]
    if proc.returncode < 0:  # killed by a signal, not by TIMEOUT (above): no verdict
        raise NotJudged(f"pytest killed by signal {-proc.returncode}: look")
    last = next((x for x in reversed(output.splitlines()) if x.strip(" =!")), "")
    return False, f"pytest exit {proc.returncode}: {last.strip(' =!')[:200]}", output[-4000:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lists", nargs="*", type=Path,
                    help="mutation lists (TOML; default: every tests/mutations/*.toml)")
    ap.add_argument("--only", action="append", default=[], metavar="ID", help="these mutants")
    ap.add_argument("--files", nargs="+", default=[], metavar="FILE",
                    help="the mutants of these files")
    ap.add_argument("--range", metavar="A..B", help="the mutants of the files a git range changed")
    ap.add_argument("--full", action="store_true",
                    help="run a survivor of its tests against the whole suite")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip running the tests on the unmutated copy first")
    ap.add_argument("--jobs", "-n", type=int, default=2, help="pytest-xdist workers (default 2)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per pytest run")
    ap.add_argument("--list", action="store_true", help="check the anchors and list, run nothing")
    ap.add_argument("--json", type=Path, metavar="OUT", help="the outcomes as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the scratch copy (its path is said)")
    ap.add_argument("--root", type=Path, default=REPO,
                    help="the repository the lists' paths are relative to (default: this one)")
    args = ap.parse_args(argv)
    # a SIGTERM unwinds as an exit does: the mutated file restored, the scratch copy removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    root = args.root.resolve()
    lists = args.lists or sorted((root / "tests" / "mutations").glob("*.toml"))
    mutants = read_lists(lists)
    if args.only:
        unknown = set(args.only) - {m.id for m in mutants}
        if unknown:
            raise SystemExit(f"mutants: no such mutant: {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.id in args.only]
    wanted = set(args.files)
    if args.range:
        wanted |= changed_files(args.range, root)
    if args.files or args.range:
        mutants = [m for m in mutants if m.file in wanted]
    problems = check_anchors(mutants, root)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        print(f"mutants: {len(problems)} of the list do not apply to this tree: update the list",
              file=sys.stderr)
        return 2
    plans = {m.id: stages(m, root) for m in mutants}
    if args.list:
        for m in mutants:
            first, naming = plans[m.id]
            print(f"{m.id}  {m.file}:{m.line}  {m.claim}\n    tests: {' '.join(first) or '-'}"
                  f"\n    then: {' '.join(naming) or '-'}")
        return 0
    if not mutants:
        print("mutants: no mutant selected", file=sys.stderr)
        return 1

    base = Path(tempfile.mkdtemp(prefix="kp-mutants-"))
    outcomes: list[Outcome] = []
    try:
        tree = make_scratch(base, root)
        env = environment(tree)
        for package in sorted({m.file.split("/")[0] for m in mutants if "/" in m.file}):
            if (tree / package / "__init__.py").exists():
                check_imported_from(tree, env, package)
        print(f"mutants: {len(mutants)} from {', '.join(str(p) for p in lists)}; scratch copy "
              f"{tree}", file=sys.stderr, flush=True)
        baseline = Baseline(tree, env, args)
        for m in mutants:
            try:
                outcomes.append(run_one(m, plans[m.id], tree, env, args, baseline))
            except BaselineFails as e:
                print(e.tail, file=sys.stderr)
                print(f"mutants: {e} fails on the unmutated copy: fix it first", file=sys.stderr)
                return 2
            o = outcomes[-1]
            print(f"{o.verdict.upper():<9}{o.id}  {o.where}"
                  + (f"  -> {o.by}" if o.by else f"  claim: {o.claim}")
                  + f"  ({o.seconds:.0f} s)", flush=True)
    finally:
        if args.keep:
            print(f"mutants: scratch copy kept: {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1) + "\n")
    caught = sum(o.verdict == "caught" for o in outcomes)
    print(f"mutants: {caught} of {len(outcomes)} caught"
          + "".join(f", {n} {v}" for v in ("survived", "untested", "unjudged")
                    if (n := sum(o.verdict == v for o in outcomes))), flush=True)
    return 0 if caught == len(outcomes) else 1


def stages(m: Mutant, root: Path) -> tuple[list[str], list[str]]:
    """(its own tests, then the other test files that name its file)."""
    first = list(dict.fromkeys(m.tests))
    files = {t.split("::")[0] for t in first}
    return first, [t for t in tests_naming(m.file, root) if t not in files]


class NotJudged(Exception):
    """pytest ended without judging the mutant, killed by a signal (from outside the run, a
    pkill or the OOM killer; or by the mutated code itself): neither caught nor survived,
    and the run exits 1 as for a survivor, so a person looks."""


class BaselineFails(Exception):
    def __init__(self, what: str, tail: str):
        super().__init__(what)
        self.tail = tail


class Baseline:
    """The test files that passed on the unmutated copy (each run once, when first needed),
    and the tests found flaky there: failed, then passed alone. A flaky test cannot tell a
    mutant from chance, so it judges none (`flaky`: deselected from every run after)."""

    def __init__(self, tree: Path, env: dict, args):
        self.tree, self.env, self.args = tree, env, args
        self.passed: set[str] = set()
        self.flaky: set[str] = set()

    def check(self, tests: list[str]) -> None:
        if self.args.no_baseline:
            return
        todo = [t for t in tests if t not in self.passed]
        while todo:
            ok, first, tail = run_pytest(self.tree, self.env, todo, self.args.jobs,
                                         self.args.timeout, deselect=frozenset(self.flaky))
            if ok:
                break
            if "::" not in first or first in self.flaky:
                raise BaselineFails(first, tail)
            again, _, _ = run_pytest(self.tree, self.env, [first], 1, self.args.timeout)
            if not again:
                raise BaselineFails(first, tail)
            self.flaky.add(first)
            print(f"mutants: {first} failed on the unmutated copy, then passed: flaky, it "
                  "judges no mutant", file=sys.stderr, flush=True)
        self.passed.update(todo)


def run_one(m: Mutant, plan: tuple[list[str], list[str]], tree: Path, env: dict, args,
            baseline: Baseline) -> Outcome:
    path = tree / m.file
    original = path.read_text(encoding="utf-8")
    out = Outcome(m.id, f"{m.file}:{m.line}", m.claim, "untested")
    t0 = time.monotonic()
    runs = [tests for tests in plan if tests] + ([[]] if args.full else [])
    try:
        for tests in runs:
            if tests:
                baseline.check(tests)
            path.write_text(original.replace(m.anchor, m.replace, 1), encoding="utf-8")
            drop_bytecode(path)
            try:
                out.ran += tests or ["(the whole suite)"]
                ok, first, _ = run_pytest(tree, env, tests, args.jobs, args.timeout,
                                          deselect=frozenset(baseline.flaky))
            except NotJudged as e:
                out.verdict, out.by = "unjudged", str(e)
                break
            finally:
                path.write_text(original, encoding="utf-8")
                drop_bytecode(path)
            out.verdict, out.by = ("survived", "") if ok else ("caught", first)
            if not ok:
                break
    finally:
        path.write_text(original, encoding="utf-8")
        drop_bytecode(path)
    out.seconds = time.monotonic() - t0
    return out


if __name__ == "__main__":
    sys.exit(main())
