"""kimipipe's import graph has no cycles (an AST walk over kimipipe/**/*.py).

Every `import` and `from ... import` counts, at any depth (a lazy import inside a function
closes a cycle as surely at run time), except under `if TYPE_CHECKING:` (never executed:
annotations only), relative imports resolved against the importing
module. `from P import name` is an edge to the module P.name when that is a module, else to
P. A package's `__init__` is the module named after the package; a submodule's implicit
import of its own parent package is not an edge (that is how packages work, not a cycle).

And kimipipe leaves Python's import system as its dependencies expect it: no finder, loader
or blocked module of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO


def module_names(root: Path, package: str) -> dict[str, Path]:
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return {name: path for name, path in names.items() if name.split(".")[0] == package}


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
                (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
                or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")):
            for child in node.body:
                skipped.update(id(n) for n in ast.walk(child))
    return skipped


def import_graph(root: Path, package: str, annotations: bool = False) -> dict[str, set[str]]:
    """Each module's imports of PACKAGE's modules (with ANNOTATIONS, the `if TYPE_CHECKING:`
    ones as well)."""
    modules = module_names(root, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        annotations_only = set() if annotations else _type_checking_only(tree)
        for node in ast.walk(tree):
            if id(node) in annotations_only:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")
                    if not is_package:
                        base = base[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                           for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # `import kimipipe.a.b.c` as far as it goes
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of GRAPH, as the list of its modules, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_kimipipe_imports_have_no_cycle():
    graph = import_graph(REPO / "kimipipe", "kimipipe")
    assert len(graph) > 40 and graph["kimipipe.commands.infer"] >= {"kimipipe.infer.run",
                                                                      "kimipipe.infer.options"}
    assert "kimipipe.infer.config" in graph["kimipipe.infer.options"]
    assert "kimipipe.openrouter" in graph["kimipipe.openrouter.account"]  # `from . import X`
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_stand_in_has_no_cycle_even_in_annotations():
    """A Job reports to the server's books through the Books protocol it declares
    (standin/jobs.py), so jobs.py never names the server, not even for a type checker."""
    graph = import_graph(REPO / "kimipipe", "kimipipe", annotations=True)
    standin = {name: {t for t in targets if t.startswith("kimipipe.standin")}
               for name, targets in graph.items() if name.startswith("kimipipe.standin")}
    assert "kimipipe.standin.jobs" in standin["kimipipe.standin.server"]
    assert find_cycle(standin) is None, " -> ".join(find_cycle(standin))


# The rooms beside kp-infer's run (make's helpers, the build report, the stand-in) and the
# shared reading of what runs recorded sit on the lower modules, never on the run package
# infer/ (nor on the commands that wire it): a change inside kp-infer's run cannot break
# make plan or the stand-in, and they cannot reach its internals.
BESIDE_THE_RUN = ("kimipipe.make", "kimipipe.report", "kimipipe.standin", "kimipipe.recorded")


def test_support_rooms_reach_nothing_of_the_run_package():
    graph = import_graph(REPO / "kimipipe", "kimipipe")
    rooms = [name for name in graph if name.startswith(BESIDE_THE_RUN)]
    assert {"kimipipe.make.build_plan", "kimipipe.report.facts", "kimipipe.standin.server",
            "kimipipe.recorded.spend"} <= set(rooms)
    reached = {name: sorted(t for t in graph[name]
                            if t.startswith(("kimipipe.infer", "kimipipe.commands")))
               for name in rooms}
    assert {name: targets for name, targets in reached.items() if targets} == {}
    # the reading of what runs recorded is the lowest of them: none of the rooms above it
    assert {name: sorted(graph[name]) for name in rooms if name.startswith("kimipipe.recorded")
            and any(t.startswith(BESIDE_THE_RUN[:3]) for t in graph[name])} == {}


def test_the_walk_finds_a_cycle_through_relative_and_lazy_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .sub import a\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from ..b import thing\n")
    (pkg / "b.py").write_text("def thing():\n    from .sub.a import x\n")
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.sub.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.sub.a"}
    assert find_cycle(graph) in (["pkg.b", "pkg.sub.a", "pkg.b"], ["pkg.sub.a", "pkg.b", "pkg.sub.a"])
    (pkg / "b.py").write_text("def thing():\n    pass\n")
    assert find_cycle(import_graph(pkg, "pkg")) is None


def test_type_checking_imports_are_not_edges(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (pkg / "b.py").write_text("from .a import thing\n")
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.a"] == set() and graph["pkg.b"] == {"pkg.a"}
    (pkg / "a.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    pass\nfrom .b import B\n")
    assert find_cycle(import_graph(pkg, "pkg")) is not None


def test_kimipipe_patches_no_dependencys_import_machinery():
    """A dependency is used through its public API. Importing every command and loading a
    tokenizer (what kp-tokenize does before its first record) leaves no finder or loader of
    kimipipe's in Python's import system and no None entry in sys.modules (which would make
    a dependency's own import of that module fail), in a fresh interpreter."""
    import json
    import subprocess
    import sys

    from conftest import TOKENIZER_KINDS

    code = (
        "import importlib, json, pkgutil, sys\n"
        "blocked = {k for k, v in sys.modules.items() if v is None}\n"
        "import kimipipe.commands\n"
        "for m in pkgutil.iter_modules(kimipipe.commands.__path__):\n"
        "    importlib.import_module('kimipipe.commands.' + m.name)\n"
        "from kimipipe.tokenize.engine import Engine, Settings\n"
        "Engine(Settings(tokenizer_dir=sys.argv[1], trust_remote_code=True))\n"
        "import httpx, transformers\n"
        "ours = lambda o: (getattr(o, '__module__', None) or '').split('.')[0] == 'kimipipe'\n"
        "print(json.dumps({\n"
        "    'blocked': sorted(k for k, v in sys.modules.items() if v is None and k not in blocked),\n"
        "    'finders': [repr(f) for f in sys.meta_path + sys.path_hooks if ours(f)],\n"
        "    'loaders': sorted(n for n, m in sys.modules.items() if not n.startswith('kimipipe')\n"
        "                      and ours(getattr(getattr(m, '__spec__', None), 'loader', None)))}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(TOKENIZER_KINDS["tiktoken"])],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"blocked": [], "finders": [], "loaders": []}
