"""README.md stays true: every command and option it names exists, with the same name."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import BIN, REPO

README = (REPO / "README.md").read_text()
COMMANDS = ["prompts", "infer", "tokenize", "shard", "credits"]
# Options of other programs the README shows (zstd, the Hugging Face CLI, make, ...).
FOREIGN = {"--local-dir", "--help", "--fault", "--port-file", "--balance", "--latency"}


def help_text(argv: list[str]) -> str:
    proc = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def options_of(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))


HELP = {name: help_text([str(BIN / f"kp-{name}")]) for name in COMMANDS}
STANDIN_HELP = help_text([sys.executable, "-m", "kimipipe.standin"])
BENCH_HELP = {script.name: help_text([sys.executable, str(script)])
              for script in sorted((REPO / "bench").glob("bench_*.py"))}


def invocations():
    """(command, its text) for every `kp-NAME ...` in a code block, continuation lines joined."""
    for block in re.findall(r"```[^\n]*\n(.*?)```", README, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            for m in re.finditer(r"\bkp-([a-z]+)((?:\s+[^\s#|]+)*)", line):
                yield m.group(1), m.group(2)


def test_every_command_named_exists():
    named = set(re.findall(r"\bkp-([a-z]+)\b", README))
    assert named <= set(COMMANDS), named - set(COMMANDS)
    assert set(COMMANDS) <= named


def test_every_example_invocation_uses_options_its_command_has():
    seen = 0
    for command, args in invocations():
        seen += 1
        unknown = options_of(args) - options_of(HELP[command])
        assert not unknown, f"kp-{command} has no {sorted(unknown)} (README: kp-{command}{args})"
    assert seen >= 8


def test_every_option_named_anywhere_exists_somewhere():
    known = set().union(*(options_of(h) for h in [*HELP.values(), *BENCH_HELP.values()]),
                        options_of(STANDIN_HELP), FOREIGN)
    unknown = options_of(README) - known
    assert not unknown, f"README names options no command has: {sorted(unknown)}"


def test_every_benchmark_command_uses_options_its_script_has():
    seen = 0
    for script, args in re.findall(r"bench/(bench_\w+\.py)((?:[ \t]+--?[\w-]+(?:[ \t]+[^\s`|-][^\s`|]*)?)*)", README):
        seen += 1
        unknown = options_of(args) - options_of(BENCH_HELP[script])
        assert not unknown, f"{script} has no {sorted(unknown)}"
    assert seen >= 5


def test_make_variables_and_targets_named_exist():
    makefile = (REPO / "Makefile").read_text()
    for variable in ["MODEL", "CONCURRENCY", "MAX_COST", "TOKEN_BUDGET", "IGNORE_PROVIDERS",
                     "QUANTIZATIONS", "TOKENIZER", "BASE_URL", "MIN_CREDITS", "DATASETS",
                     "TOTAL_COST", "ALLOW_SHORT", "PILOT", "ANSWER_TOKENS"]:
        assert variable in README and re.search(rf"^{variable} \?=", makefile, flags=re.M), variable
    for target in ["demo", "test", "credits", "all", "lint", "plan", "pilot", "check"]:
        assert f"make {target}" in README and re.search(rf"^{target}:", makefile, flags=re.M), target
