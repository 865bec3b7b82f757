"""README.md and docs/ stay true: every command and option they name exists, with the same
name; the README stays short and its links resolve; docs/cli.md is what `--help` prints."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BIN, REPO, read_jsonl
from helpers import KP_COMMANDS, time_left

README = (REPO / "README.md").read_text()
# The reference pages (docs/cli.md is generated from --help, so it is checked by regenerating).
DOC_PAGES = sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "cli.md")
DOCS = README + "".join(p.read_text() for p in DOC_PAGES)
# Options of other programs the README shows (zstd, the Hugging Face CLI, make, ...).
FOREIGN = {"--local-dir", "--help", "--fault", "--port-file", "--balance", "--latency",
           # the trainers' (docs/training.md; speculators' CLI, checked by make test-trainers)
           "--config", "--data", "--seq-length", "--no-skip-token-freq", "--overwrite",
           "--total-seq-len", "--render-endpoint", "--preprocessed-data", "--endpoint"}
# Commands' words with options of their own (`kp-shard export --for`): their own --help.
WORDS = {"shard": ("export",)}


def help_text(argv: list[str]) -> str:
    proc = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def options_of(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))


# Each program's --help, made on first use by the one worker that runs these tests (at
# import, every xdist worker ran the 13 programs while collecting).
@functools.cache
def helps() -> dict[str, dict[str, str]]:
    return {"kp": {name: help_text([str(BIN / f"kp-{name}")]) for name in KP_COMMANDS},
            "words": {f"{name} {word}": help_text([str(BIN / f"kp-{name}"), word])
                      for name, words in WORDS.items() for word in words},
            "other": {"standin": help_text([sys.executable, "-m", "kimipipe.standin"]),
                      "demo": help_text([sys.executable, "-m", "kimipipe.demo"]),
                      "mutants": help_text([sys.executable, str(REPO / "tools" / "mutants.py")])},
            "bench": {script.name: help_text([sys.executable, str(script)])
                      for script in sorted((REPO / "bench").glob("bench_*.py"))}}


def invocations():
    """(command, its text) for every `kp-NAME ...` in a code block, continuation lines joined."""
    for block in re.findall(r"```[^\n]*\n(.*?)```", DOCS, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            for m in re.finditer(r"\bkp-([a-z]+)((?:\s+[^\s#|]+)*)", line):
                yield m.group(1), m.group(2)


def test_every_command_named_exists():
    named = set(re.findall(r"\bkp-([a-z]+)\b", DOCS))
    assert named <= set(KP_COMMANDS), named - set(KP_COMMANDS)
    assert set(KP_COMMANDS) <= named


def test_every_example_invocation_uses_options_its_command_has():
    seen = 0
    for command, args in invocations():
        seen += 1
        word = f"{command} {args.split()[0]}" if args.split() else ""
        own = helps()["words"].get(word) or helps()["kp"][command]
        unknown = options_of(args) - options_of(own)
        assert not unknown, f"kp-{command} has no {sorted(unknown)} (README: kp-{command}{args})"
    assert seen >= 8


def test_every_option_named_anywhere_exists_somewhere():
    known = set().union(*(options_of(h) for group in helps().values() for h in group.values()),
                        FOREIGN)
    unknown = options_of(DOCS) - known
    assert not unknown, f"README or docs/ name options no command has: {sorted(unknown)}"


def test_every_benchmark_command_uses_options_its_script_has():
    seen = 0
    for script, args in re.findall(r"bench/(bench_\w+\.py)((?:[ \t]+--?[\w-]+(?:[ \t]+[^\s`|-][^\s`|]*)?)*)", DOCS):
        seen += 1
        unknown = options_of(args) - options_of(helps()["bench"][script])
        assert not unknown, f"{script} has no {sorted(unknown)}"
    assert seen >= 5


def test_make_variables_and_targets_named_exist():
    makefile = (REPO / "Makefile").read_text()
    for variable in ["MODEL", "CONCURRENCY", "MAX_COST", "TOKEN_BUDGET", "IGNORE_PROVIDERS",
                     "QUANTIZATIONS", "TOKENIZER", "BASE_URL", "MIN_CREDITS", "DATASETS",
                     "TOTAL_COST", "ALLOW_SHORT", "PILOT", "ANSWER_TOKENS"]:
        assert variable in DOCS and re.search(rf"^{variable} \?=", makefile, flags=re.M), variable
    for target in ["demo", "test", "credits", "all", "lint", "plan", "pilot", "check"]:
        assert f"make {target}" in DOCS and re.search(rf"^{target}:", makefile, flags=re.M), target


def test_the_try_your_own_file_walkthrough_runs_as_written(tmp_path):
    """The README's ten lines, as written, in a directory holding the checkout's Makefile,
    .venv and package (as a clone does) and a one-line ShareGPT `my.json`. The stand-in
    takes a free port itself (no port is written in the lines: a taken one would fail),
    the plan is made with the MAX_TOKENS the build uses, and everything lands in offline/,
    never in a real build's work/ and shards/."""
    import json
    import os
    import signal

    block = README.split("<!-- walkthrough -->\n```\n", 1)[1].split("```", 1)[0]
    assert len(block.strip().splitlines()) <= 10
    assert not re.search(r"--port \d|:\d{4,5}/", block)  # no port of its own
    script = block
    venv = Path(sys.executable).parent.parent  # the .venv the tests run in
    # make would reinstall a venv older than setup.cfg from this temporary directory (an
    # editable install pointing here, gone after the test): say so instead
    stamp = venv / ".installed"
    newest = max((REPO / n).stat().st_mtime for n in ("setup.cfg", "pyproject.toml"))
    if not stamp.exists() or stamp.stat().st_mtime < newest:
        pytest.fail(f"{venv} is older than setup.cfg/pyproject.toml: run `make venv` first")
    for name in ["Makefile", "kimipipe", "setup.cfg", "pyproject.toml"]:
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / ".venv").symlink_to(venv)
    conversations = json.loads((REPO / "kimipipe/data/demo/sharegpt.json").read_text())[:12]
    (tmp_path / "my.json").write_text(json.dumps(conversations))  # one line, as json.dump writes
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENROUTER_", "MAKE"))}
    proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=time_left())
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the stand-in, if a line failed before `kill`
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, err[-3000:]
    assert len(out.split("kp-shard stats")[0].splitlines()) >= 2  # the two prompt records
    first = json.loads(out.splitlines()[0])
    assert first["dataset"] == "mine" and first["messages"]
    manifest = json.loads((tmp_path / "offline/shards/mine/kp-shard.manifest").read_text())
    # a record per request: a conversation asks each of its user turns (docs/conversations.md)
    rows = sum(1 + len(p.get("follow_ups", []))
               for p in read_jsonl(tmp_path / "offline/work/mine.prompts.jsonl"))
    assert rows > 12 and manifest["totals"]["records"] == rows
    assert f"offline/shards/mine: OK (1 shard, {rows} rows" in out
    assert "kp-shard stats: offline/shards/mine" in out
    assert not (tmp_path / "work").exists() and not (tmp_path / "shards").exists()
    made_by_make_plan = " ".join(out.split("make all: the plan")[0].split())
    assert "half of MAX_TOKENS (1,024 tokens)" in made_by_make_plan  # the build's MAX_TOKENS=2048
    answers = [json.loads(line) for line in (tmp_path / "offline/work/mine.responses.jsonl").open()]
    assert {a["api"] for a in answers} == {"127.0.0.1"}
    assert all(a["generation_id"].startswith("gen-standin-") for a in answers)
    # a row of one's own build, decoded (`python -m kimipipe.demo --row` on its tokens file)
    row = subprocess.run([str(venv / "bin" / "python"), "-m", "kimipipe.demo", "--row", answers[3]["id"],
                          "--tokens", "offline/work/mine.tokens.jsonl.zst",
                          "--tokenizer", "kimipipe/data/tokenizers/kimi-k2.5-mini-tiktoken"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert row.returncode == 0, row.stderr
    assert f"offline/work/mine.tokens.jsonl.zst: row {answers[3]['id']} (dataset mine)" in row.stdout
    assert answers[3]["messages"][0]["content"][:40] in row.stdout  # the prompt, decoded


def test_readme_is_short_and_every_link_resolves():
    """The README is the front page (what it is, the two commands, the pipeline, a real run,
    links); the reference lives in docs/. Every relative link of the README and the docs
    pages names a file that exists."""
    assert len(README.splitlines()) <= 200
    for page, text in [(REPO / "README.md", README), *((p, p.read_text()) for p in DOC_PAGES)]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def test_the_cli_reference_is_what_help_prints():
    """docs/cli.md is generated from every command's --help; a changed option, help text or
    example must come with `make docs`, or this fails naming the fix."""
    proc = subprocess.run([sys.executable, "-m", "kimipipe.clidoc", "--check"],
                          capture_output=True, text=True, timeout=time_left())
    assert proc.returncode == 0, proc.stderr


def test_the_format_lists_are_the_registrys(tmp_path):
    """README.md's list of kp-prompts' formats and docs/kp-prompts.md's table are FORMATS'
    (make docs writes them); a format added to FORMATS makes them stale until it runs."""
    from kimipipe.clidoc import BLOCKS, stale_blocks
    from kimipipe.prompts import formats

    assert f"<!-- formats -->{formats.format_labels()}<!-- /formats -->" in (
        REPO / "README.md").read_text()
    table = (REPO / "docs" / "kp-prompts.md").read_text()
    assert f"<!-- format-table -->\n{formats.format_table()}<!-- /format-table -->" in table
    assert all(f"| `{name}` |" in table for name in formats.FORMATS)
    for file in {file for file, _ in BLOCKS}:
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).write_text((REPO / file).read_text())
    assert stale_blocks(tmp_path) == []
    new = formats.SourceFormat(("question",), formats.FORMATS["prompt"].conversation, "id",
                               "Q&A pairs", "`{\"question\"}`", "one user turn")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(formats.FORMATS, "qa", new)
        assert stale_blocks(tmp_path) == ["README.md", "docs/kp-prompts.md"]


def test_the_promise_map_names_only_tests_that_exist():
    """tests/README.md maps each promise to its tests by name (`test_x.py::test_y`, and
    `::test_z` for another test of the same file, `test_y_*` for a family). A renamed or
    removed test must not leave a promise pointing at nothing."""
    import ast
    defined = {}
    for path in (REPO / "tests").glob("test_*.py"):
        tree = ast.parse(path.read_text())
        defined[path.name] = {n.name for n in ast.walk(tree)
                              if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    text = (REPO / "tests" / "README.md").read_text()
    named, missing = 0, []
    for cell in re.findall(r"\|([^|\n]*)\|\s*$", text, flags=re.M):
        current = None
        for file, name, more in re.findall(r"(test_\w+\.py)(?:::(\w+\*?))?|::(\w+\*?)", cell):
            if file:
                current = file
                if file not in defined:
                    missing.append(file)
                    continue
            name = name or more
            if not name or current not in defined:
                continue
            named += 1
            found = (any(d.startswith(name[:-1]) for d in defined[current]) if name.endswith("*")
                     else name in defined[current])
            if not found:
                missing.append(f"{current}::{name}")
    assert named >= 50 and not missing, missing


def test_the_pages_and_sections_the_code_and_makefile_cite_exist():
    """A message or comment that sends the reader to docs/PAGE.md (and to a section of it:
    `docs/PAGE.md, 'Section'`, or a `PAGE.md#anchor` link in docs/) names a page and a
    section that exist: the Makefile once cited docs/prompts.md, and the docs a README
    section "Getting the tokenizer" that never was."""
    import glob
    texts = {"Makefile": (REPO / "Makefile").read_text()}
    for path in glob.glob(str(REPO / "kimipipe" / "**" / "*.py"), recursive=True):
        texts[path] = Path(path).read_text()
    cited = 0
    for where, text in texts.items():
        for page, section in re.findall(r"docs/([\w-]+\.md)(?:, '([^']+)')?", text):
            cited += 1
            assert (REPO / "docs" / page).exists(), f"{where}: docs/{page}"
            if section:
                assert re.search(rf"^#+ {re.escape(section)}$", (REPO / "docs" / page).read_text(),
                                 flags=re.M), f"{where}: docs/{page}, {section!r}"
    for page in (REPO / "docs").glob("*.md"):
        for target, anchor in re.findall(r"\]\(([\w-]+\.md)#([\w-]+)\)", page.read_text()):
            headings = re.findall(r"^#+ (.+)$", (REPO / "docs" / target).read_text(), flags=re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
            assert anchor in slugs, f"{page.name}: {target}#{anchor}"
    assert cited >= 10
