"""docs/cli.md: every command's `--help`, as a user sees it, in one page.

`python -m kimipipe.clidoc > docs/cli.md` (or `make docs`) writes it; `--check` exits 1
when docs/cli.md differs from what the commands print now (tests/test_readme.py runs it,
so a changed option cannot leave the reference stale). Each help is taken from the
installed command in a subprocess, at a fixed width, so the page is what `--help` prints.
"""

from __future__ import annotations

import os
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
PAGE = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


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
    text = page()
    if args == ["--check"]:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"clidoc: {PAGE} is stale: run `make docs` (python -m kimipipe.clidoc > "
                  "docs/cli.md)", file=sys.stderr)
            return 1
        return 0
    if args:
        print("usage: python -m kimipipe.clidoc [--check]", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
