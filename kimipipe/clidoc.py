"""docs/cli.md: every command's `--help`, as a user sees it, in one page; and the docs'
lists that a registry holds (kp-prompts' formats, from FORMATS).

`python -m kimipipe.clidoc > docs/cli.md` writes the page; `--blocks` rewrites the marked
blocks (`<!-- NAME -->` ... `<!-- /NAME -->`) of README.md and docs/*.md in place (`make
docs` does both); `--check` exits 1 when either differs from what the code gives now
(tests/test_readme.py runs it, so a changed option or a new format cannot leave the docs
stale). Each help is taken from the installed command in a subprocess, at a fixed width,
so the page is what `--help` prints.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

# (how the page names it, the argv after the interpreter's bin directory)
COMMANDS: list[tuple[str, list[str]]] = [
    ("kp-prompts", ["kp-prompts"]),
    ("kp-infer", ["kp-infer"]),
    ("kp-infer report", ["kp-infer", "report"]),
    ("kp-tokenize", ["kp-tokenize"]),
    ("kp-shard", ["kp-shard"]),
    ("kp-shard verify", ["kp-shard", "verify"]),
    ("kp-shard stats", ["kp-shard", "stats"]),
    ("kp-shard export", ["kp-shard", "export"]),
    ("kp-credits", ["kp-credits"]),
    ("python -m kimipipe.standin", ["-m", "kimipipe.standin"]),
    ("python -m kimipipe.demo", ["-m", "kimipipe.demo"]),
]
WIDTH = "100"
REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "cli.md"
# (file, block name): the text between its markers comes from the code.
BLOCKS = [("README.md", "formats"), ("docs/kp-prompts.md", "format-table")]


def block_text(name: str) -> str:
    from .prompts.formats import format_labels, format_table
    return {"formats": format_labels, "format-table": lambda: "\n" + format_table()}[name]()


def with_blocks(file: str, text: str) -> str:
    """TEXT (of FILE, as BLOCKS names it) with each of its marked blocks as the code gives
    it now."""
    for block_file, name in BLOCKS:
        if block_file == file:
            marked = re.compile(rf"(<!-- {name} -->)(.*?)(<!-- /{name} -->)", re.S)
            if not marked.search(text):
                raise SystemExit(f"clidoc: {file} has no <!-- {name} --> block")
            text = marked.sub(lambda m, new=block_text(name): m[1] + new + m[3], text)
    return text


def stale_blocks(root: Path = REPO) -> list[str]:
    """The files under ROOT (a checkout) whose marked blocks differ from the code's."""
    files = sorted({file for file, _ in BLOCKS})
    return [f for f in files if (root / f).read_text() != with_blocks(f, (root / f).read_text())]


def help_of(argv: list[str]) -> str:
    bin_dir = Path(sys.executable).parent
    command = [sys.executable, *argv] if argv[0] == "-m" else [str(bin_dir / argv[0]), *argv[1:]]
    env = {**os.environ, "COLUMNS": WIDTH, "LINES": "50"}
    proc = subprocess.run([*command, "--help"], capture_output=True, text=True, env=env,
                          timeout=120, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"clidoc: {' '.join(argv)} --help exited {proc.returncode}: "
                         f"{proc.stderr.strip()[-500:]}")
    return proc.stdout.rstrip() + "\n"


def page() -> str:
    parts = ["# Command reference\n\n",
             "Generated from every command's `--help` by `python -m kimipipe.clidoc` "
             "(`make docs`); do not edit by hand: tests/test_readme.py fails when this page "
             "differs from what the commands print.\n"]
    for name, argv in COMMANDS:
        parts.append(f"\n## {name}\n\n```\n{help_of(argv)}```\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--blocks"]:
        for file in stale_blocks():
            (REPO / file).write_text(with_blocks(file, (REPO / file).read_text()))
        return 0
    if args == ["--check"]:
        stale = stale_blocks()
        if not PAGE.exists() or PAGE.read_text() != page():
            stale.append("docs/cli.md")
        for file in stale:
            print(f"clidoc: {file} is stale: run `make docs`", file=sys.stderr)
        return 1 if stale else 0
    if args:
        print("usage: python -m kimipipe.clidoc [--check | --blocks]", file=sys.stderr)
        return 2
    sys.stdout.write(page())
    return 0


if __name__ == "__main__":
    sys.exit(main())
