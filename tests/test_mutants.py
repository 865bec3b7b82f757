"""tools/mutants.py, the mutation sampler (docs/development.md "Mutation sampling"), run as a
developer runs it on a small repository made here: a package, its test, a mutation list.

One mutant the test catches (named with the test that failed), one it cannot (an
equivalent edit: survived, exit 1), the working tree left as it was and the scratch copy
gone, a test that failed once on the unmutated copy left out as flaky; a list whose anchor
the code no longer holds stops the run before anything runs, as a test failing twice on
the unmutated copy does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

TOOL = REPO / "tools" / "mutants.py"
CALC = '''def add(a, b):
    return a + b


def label():
    return "sum"
'''
LIST = '''
[[mutant]]
id = "add-sign"
file = "pkg/calc.py"
anchor = "return a + b"
replace = "return a - b"
claim = "add adds"
tests = ["tests/test_calc.py", "tests/test_flaky.py"]

[[mutant]]
id = "label-case"
file = "pkg/calc.py"
anchor = 'return "sum"'
replace = 'return "SUM"'
claim = "nothing reads the label"
tests = ["tests/test_calc.py", "tests/test_flaky.py"]
'''

# fails every other time it runs (the first time too)
FLAKY = '''import os
import pathlib


def test_flaky():
    mark = pathlib.Path(os.environ["KP_TEST_FLAKY_MARK"])
    runs = int(mark.read_text()) + 1 if mark.exists() else 1
    mark.write_text(str(runs))
    assert runs % 2 == 0, "flaky"
'''


def small_repository(root):
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "calc.py").write_text(CALC)
    (root / "tests" / "mutations").mkdir(parents=True)
    (root / "tests" / "test_calc.py").write_text(
        "from pkg.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    (root / "tests" / "test_flaky.py").write_text(FLAKY)
    (root / "tests" / "mutations" / "calc.toml").write_text(LIST)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def mutants(root, *args):
    env = {**os.environ, "KP_TEST_FLAKY_MARK": str(root.parent / f"{root.name}.flaky-mark")}
    return subprocess.run([sys.executable, str(TOOL), "--root", str(root), "--jobs", "1", *args],
                          capture_output=True, text=True, timeout=300, env=env)


def test_a_caught_mutant_names_its_test_and_a_survivor_fails_the_run(tmp_path):
    root = small_repository(tmp_path / "repo")
    r = mutants(root, "--json", str(tmp_path / "out.json"))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any(x.startswith("CAUGHT   add-sign  pkg/calc.py:2  -> tests/test_calc.py::test_add")
               for x in lines), r.stdout
    assert any(x.startswith("SURVIVED label-case  pkg/calc.py:6  claim: nothing reads the label")
               for x in lines), r.stdout
    assert lines[-1] == "mutants: 1 of 2 caught, 1 survived"
    assert ("tests/test_flaky.py::test_flaky failed on the unmutated copy, then passed: flaky, "
            "it judges no mutant") in r.stderr
    outcomes = {o["id"]: o for o in json.loads((tmp_path / "out.json").read_text())}
    assert outcomes["add-sign"]["by"] == "tests/test_calc.py::test_add"
    assert outcomes["label-case"]["verdict"] == "survived"
    assert (root / "pkg" / "calc.py").read_text() == CALC  # the working tree untouched
    scratch = next(x for x in r.stderr.splitlines() if "scratch copy" in x).rsplit(" ", 1)[1]
    assert scratch.endswith("/repo") and not Path(scratch).exists()  # (removed)
    only = mutants(root, "--only", "add-sign")
    assert only.returncode == 0 and only.stdout.splitlines()[-1] == "mutants: 1 of 1 caught"


def test_a_list_the_code_no_longer_matches_stops_before_anything_runs(tmp_path):
    """An anchor gone, or found twice (which one is meant?): exit 2, nothing run; a test
    that fails on the unmutated copy stops the run too (it would catch every mutant)."""
    root = small_repository(tmp_path / "repo")
    (root / "pkg" / "calc.py").write_text(CALC.replace("a + b", "b + a"))
    with open(root / "tests" / "mutations" / "calc.toml", "a") as f:
        f.write('[[mutant]]\nid = "twice"\nfile = "pkg/calc.py"\nanchor = "return"\n'
                'replace = "yield"\nclaim = "-"\n')
    r = mutants(root, "--list")
    assert r.returncode == 2
    assert "add-sign: anchor found 0 times in pkg/calc.py (must be once)" in r.stderr
    assert "twice: anchor found 2 times in pkg/calc.py (must be once)" in r.stderr
    assert "label-case" not in r.stderr and "3 of the list do not apply" not in r.stderr
    assert "2 of the list do not apply to this tree: update the list" in r.stderr
    broken = small_repository(tmp_path / "broken")
    (broken / "tests" / "test_calc.py").write_text("def test_add():\n    assert False\n")
    r = mutants(broken)
    assert r.returncode == 2 and "CAUGHT" not in r.stdout
    assert "tests/test_calc.py::test_add fails on the unmutated copy: fix it first" in r.stderr


def test_the_projects_own_lists_apply_to_this_tree():
    """Every mutant in tests/mutations/ finds its anchor once in the file it names: a change
    that moves the code (a module split) updates the list in the same change, or this fails
    (it did: eight anchors were left behind when openrouter/client.py and identity.py split)."""
    r = subprocess.run([sys.executable, str(TOOL), "--list"], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    listed = [x for x in r.stdout.splitlines() if x and not x.startswith(" ")]
    assert len(listed) >= 60, r.stdout  # the lists hold 62 (a list that vanished is a loss)


def test_a_pytest_killed_by_a_signal_judges_no_mutant(tmp_path):
    """A run whose pytest dies of a signal (a pkill from another shell, the OOM killer, or
    the mutated code itself) says nothing of the mutant: UNJUDGED, exit 1, never CAUGHT (it
    was: 'CAUGHT ... -> pytest exit -15' after a pkill of another job's pytest)."""
    root = small_repository(tmp_path / "repo")
    with open(root / "tests" / "mutations" / "calc.toml", "a") as f:
        f.write('[[mutant]]\nid = "killed"\nfile = "pkg/calc.py"\nanchor = "return a + b"\n'
                'replace = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"\n'
                'claim = "-"\ntests = ["tests/test_calc.py"]\n')
    r = mutants(root, "--only", "killed")
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(x for x in r.stdout.splitlines() if "killed" in x and "pkg/calc.py" in x)
    assert line.startswith("UNJUDGED") and "pytest killed by signal 15" in line, line
    assert r.stdout.splitlines()[-1] == "mutants: 0 of 1 caught, 1 unjudged"
