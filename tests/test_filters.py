"""One conformance suite for every kp-* command (csvkit's mixin tests, as a table).

Each command is one entry of COMMANDS: how to make a valid input, the extra arguments it
needs, and how to read its output. Every test here runs over every entry it applies to, so
a new command gets them all by being added to the list:

- empty input: exit 2, `PATH: empty input`, nothing written (no output file, no directory);
- `-` (stdin) and a path give the same output;
- `.zst` in (by content) and out (a real zstd file, the same records);
- `-q` leaves stderr empty;
- a bad line: `kp-NAME: PATH:LINE: ...` as the one line on stderr, exit 2;
- `| head -1`: the command exits 0, quietly, when its reader goes away;
- `--help` complete (every option has help text, an Examples block, the exit codes), `-h`
  the same, `--version` the version.
kp-credits is not a filter: it takes part in the help, version and quiet tests only.
"""

from __future__ import annotations

import configparser
import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest
import zstandard
from conftest import (
    BIN,
    REPO,
    TOKENIZER_KINDS,
    Result,
    kp,
    read_jsonl,
    response_record,
    write_jsonl,
)
from helpers import KP_COMMANDS, time_left

from kimipipe import __version__
from kimipipe.io import ZSTD_MAGIC
from kimipipe.standin.testing import StandIn


@dataclass
class Command:
    name: str
    filter: bool = True  # reads records, writes records (or shards)
    records: Callable[[int], list[dict]] | None = None  # a valid input of N records
    args: Callable[[dict], list] = lambda ctx: []  # what else it needs (ctx: fixtures' values)
    env: Callable[[dict], dict] = lambda ctx: {}
    out_dir: bool = False  # writes a directory (--out) instead of stdout / -o FILE
    comparable: Callable[[dict], object] = lambda r: r  # a record, minus what varies per run
    ordered: bool = True  # output in input order
    pending: set[str] = field(default_factory=set)  # tests awaiting wiring (xfail, strict)


def prompt_sources(n):
    return [{"id": f"s{i}", "messages": [{"role": "user", "content": f"Question {i}: why? " * 20}]}
            for i in range(n)]


def prompts(n):
    return [{"id": f"p{i:04d}", "dataset": "B3",
             "messages": [{"role": "user", "content": f"Question {i}: why is {i} interesting?"}]}
            for i in range(n)]


def responses(n):
    return [response_record(f"r{i:04d}", f"Question {i}?", content=f"Answer {i}. " * 30,
                            reasoning=f"Think about {i}.") for i in range(n)]


def tokens(n):
    return [{"id": f"t{i:04d}", "dataset": "B3", "input_ids": list(range(1, 12 + i % 5)),
             "output_ids": list(range(100, 140 + i % 7))} for i in range(n)]


COMMANDS = [
    Command("prompts", records=prompt_sources),
    Command("infer", records=prompts,
            args=lambda ctx: ["--base-url", ctx["server"].base_url, "--concurrency", "8",
                              "--backoff-base", "0.01"],
            env=lambda ctx: {"OPENROUTER_API_KEY": ctx["server"].api_key},
            comparable=lambda r: (r["id"], r["messages"], r["response"], r["finish_reason"]),
            ordered=False,
            ),
    Command("tokenize", records=responses,
            args=lambda ctx: ["--tokenizer", TOKENIZER_KINDS["fast"], "--workers", "1"]),
    Command("shard", records=tokens, out_dir=True),
    Command("credits", filter=False,
            args=lambda ctx: ["--base-url", ctx["server"].base_url, "--json"],
            env=lambda ctx: {"OPENROUTER_API_KEY": ctx["server"].api_key}),
]
FILTERS = [c for c in COMMANDS if c.filter]


def test_the_table_holds_every_command_installed():
    """COMMANDS here, helpers.KP_COMMANDS (what the other tests loop over) and setup.cfg's
    console_scripts name the same commands, in the same order: a new command joins them."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    scripts = [line.split("=")[0].strip() for line in
               config["options.entry_points"]["console_scripts"].strip().splitlines()]
    assert [c.name for c in COMMANDS] == list(KP_COMMANDS)
    assert scripts == [f"kp-{name}" for name in KP_COMMANDS]


def each(commands, test: str):
    return pytest.mark.parametrize("command", [
        pytest.param(c, id=c.name, marks=[pytest.mark.xfail(
            strict=True, reason=f"kp-{c.name}: awaiting its wiring ({test})")]
            if test in c.pending else []) for c in commands])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with StandIn(workdir=tmp_path_factory.mktemp("standin"), balance=1000,
                 credits_mode="forbidden") as s:  # (kp-credits then warns on stderr)
        yield s


@pytest.fixture
def ctx(server):
    return {"server": server}


def outputs(command: Command, result: Result, out_dir: Path | None = None) -> list:
    """What a run wrote, comparable across runs."""
    if command.out_dir:
        rows = []
        for shard in sorted(out_dir.glob("*.jsonl.zst")):
            rows += read_jsonl(shard)
        return rows
    recs = [command.comparable(r) for r in result.records()]
    return recs if command.ordered else sorted(recs, key=json.dumps)


def write_input(command: Command, path: Path, n: int, compress: bool = False) -> Path:
    write_jsonl(path, command.records(n))
    if compress:
        path.write_bytes(zstandard.ZstdCompressor().compress(path.read_bytes()))
    return path


def destination(command: Command, tmp_path: Path, name: str) -> tuple[list, Path | None]:
    if command.out_dir:
        return ["--out", tmp_path / name], tmp_path / name
    return [], None


@pytest.mark.parametrize("command, how", [
    pytest.param(c, how, id=f"{how}-{c.name}", marks=[pytest.mark.xfail(
        strict=True, reason=f"kp-{c.name}: awaiting its wiring (empty {how})")]
        if f"empty {how}" in c.pending else [])
    for how in ("stdin", "path") for c in FILTERS])
def test_empty_input_is_exit_2_and_writes_nothing(command, ctx, tmp_path, how):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n")
    out = tmp_path / ("shards" if command.out_dir else "out.jsonl")
    where = ["--out", out] if command.out_dir else ["-o", out]
    if how == "stdin":
        r = kp(command.name, *where, *command.args(ctx), input=b"", env=command.env(ctx))
        shown = "<stdin>"
    else:
        r = kp(command.name, empty, *where, *command.args(ctx), env=command.env(ctx))
        shown = str(empty)
    assert r.code == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == f"kp-{command.name}: {shown}: empty input: no records"
    assert r.stdout == b""
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["empty.jsonl"]


@each(FILTERS, "stdin")
def test_stdin_and_a_path_give_the_same_output(command, ctx, tmp_path):
    src = write_input(command, tmp_path / "in.jsonl", 12)
    where, out_a = destination(command, tmp_path, "a")
    a = kp(command.name, src, *where, "-q", *command.args(ctx), env=command.env(ctx))
    where, out_b = destination(command, tmp_path, "b")
    b = kp(command.name, "-", *where, "-q", *command.args(ctx), input=src.read_bytes(),
           env=command.env(ctx))
    assert a.code == 0 and b.code == 0, a.stderr + b.stderr
    got = outputs(command, a, out_a)
    assert len(got) == 12 and outputs(command, b, out_b) == got


@each(FILTERS, "zst")
def test_zst_in_by_content_and_zst_out(command, ctx, tmp_path):
    plain = write_input(command, tmp_path / "in.jsonl", 12)
    packed = write_input(command, tmp_path / "in.data", 12, compress=True)  # no .zst suffix
    where, out_plain = destination(command, tmp_path, "plain")
    want = kp(command.name, plain, *where, "-q", *command.args(ctx), env=command.env(ctx))
    assert want.code == 0, want.stderr
    if command.out_dir:  # shards are zstd files always
        where, out = destination(command, tmp_path, "packed")
        r = kp(command.name, packed, *where, "-q", *command.args(ctx), env=command.env(ctx))
        assert r.code == 0, r.stderr
        shards = sorted(out.glob("*.jsonl.zst"))
        assert shards and all(s.read_bytes()[:4] == ZSTD_MAGIC for s in shards)
        assert outputs(command, r, out) == outputs(command, want, out_plain)
        return
    out = tmp_path / "out.jsonl.zst"
    r = kp(command.name, packed, "-o", out, "-q", *command.args(ctx), env=command.env(ctx))
    assert r.code == 0 and r.stdout == b"", r.stderr
    assert out.read_bytes()[:4] == ZSTD_MAGIC  # compressed, not just named so
    got = [command.comparable(x) for x in read_jsonl(out)]
    if not command.ordered:
        got.sort(key=json.dumps)
    assert got == outputs(command, want)


@each(COMMANDS, "quiet")
def test_quiet_leaves_stderr_empty(command, ctx, tmp_path):
    args = []
    if command.filter:
        args = [write_input(command, tmp_path / "in.jsonl", 5), *destination(command, tmp_path, "o")[0]]
    else:  # kp-credits: the stand-in refuses /credits, which it reports unless -q
        noisy = kp(command.name, *command.args(ctx), env=command.env(ctx))
        assert noisy.code == 0 and noisy.stderr != ""
    r = kp(command.name, *args, "-q", *command.args(ctx), env=command.env(ctx))
    assert r.code == 0 and r.stderr == ""


@each(FILTERS, "bad line")
def test_a_bad_line_is_path_line_and_exit_2(command, ctx, tmp_path):
    src = write_input(command, tmp_path / "in.jsonl", 3)
    lines = src.read_bytes().splitlines(keepends=True)
    src.write_bytes(lines[0] + b'{"id": "broken", "dataset": 5\n' + b"".join(lines[1:]))
    where, out = destination(command, tmp_path, "o")
    sent = ctx["server"].stats()["completions_started"]
    r = kp(command.name, src, *where, *command.args(ctx), env=command.env(ctx))
    assert r.code == 2
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"kp-{command.name}: {src}:2: "), r.stderr
    assert ctx["server"].stats()["completions_started"] == sent  # nothing paid for
    if out is not None:  # (the rows before it were read; nothing that looks finished)
        assert not (out / "kp-shard.manifest").exists() and not list(out.glob("*.jsonl.zst"))


@each(FILTERS, "head")
def test_a_closed_output_pipe_ends_the_command_quietly(command, ctx, tmp_path):
    """`kp-NAME ... | head -1`: exit 0, nothing on stderr (-q), one line read."""
    if command.out_dir:  # its report goes to stdout: `kp-shard stats DIR | head -1`
        src = write_input(command, tmp_path / "in.jsonl", 50)
        assert kp(command.name, src, "--out", tmp_path / "set", "-q").code == 0
        argv = [command.name, "stats", tmp_path / "set", "-q"]
    else:
        src = write_input(command, tmp_path / "in.jsonl", 400)  # well over a pipe's buffer
        argv = [command.name, src, "-q", *command.args(ctx)]
    proc = subprocess.Popen([str(BIN / f"kp-{argv[0]}"), *map(str, argv[1:])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **command.env(ctx)})
    first = proc.stdout.readline()
    proc.stdout.close()  # what `head -1` does
    err = proc.stderr.read().decode()
    proc.wait(timeout=time_left())
    assert first.strip()
    assert proc.returncode == 0 and err == ""


def click_command(name: str) -> click.Command:
    """kp-NAME's click command: with words, the default one (the build, the run)."""
    import importlib

    from kimipipe.cli import KPGroup

    cli = importlib.import_module(f"kimipipe.commands.{name}").cli
    return cli.default if isinstance(cli, KPGroup) else cli


@each(COMMANDS, "help")
def test_help_is_complete(command):
    r = kp(command.name, "--help")
    assert r.code == 0 and r.stderr == ""
    text = r.stdout.decode()
    assert text.startswith(f"Usage: kp-{command.name} ")
    assert "\nExamples:\n" in text and f"\n  kp-{command.name}" in text.split("\nExamples:\n")[1]
    assert "Exit codes: 0 " in text
    for param in click_command(command.name).params:
        if isinstance(param, click.Option):
            assert param.help, f"kp-{command.name} {param.opts}: no help text"
            assert param.opts[-1] in text


@each(COMMANDS, "-h")
def test_dash_h_is_help(command):
    short, long = kp(command.name, "-h"), kp(command.name, "--help")
    assert short.code == 0 and short.stdout == long.stdout


@pytest.mark.parametrize("command, word, argument", [("shard", "stats", "DIR..."), ("shard", "verify", "DIR..."),
                                                    ("infer", "report", "FILE...")])
def test_a_words_help_is_its_own(command, word, argument):
    """`kp-shard stats -h` is the help of stats, not of kp-shard, with its own exit codes."""
    from kimipipe.cli import EXIT_CODES

    for flag in ("-h", "--help"):
        r = kp(command, word, flag)
        assert r.code == 0 and r.stderr == ""
        text = r.stdout.decode()
        assert text.startswith(f"Usage: kp-{command} {word} [OPTIONS] {argument}\n")
        assert f"\n  kp-{command} {word} " in text.split("\nExamples:\n")[1]
        assert " ".join(text.split("\n\n")[-1].split()) == EXIT_CODES[f"kp-{command} {word}"]
        assert kp(command, "-h").stdout.decode() not in text


def test_each_commands_exit_codes_are_its_own():
    """The exit-code footer of each command's help names its own codes: no money stop
    and no --token-budget outside kp-infer, exit 4 only where the command has it."""
    footers = {}
    for name in KP_COMMANDS:
        text = kp(name, "--help").stdout.decode()
        footers[name] = " ".join(text.split("\nExit codes: ")[1].split())
    assert len(set(footers.values())) == len(footers)
    for name in ("prompts", "tokenize", "shard"):
        assert "kp-infer" not in footers[name] and "money" not in footers[name]
    assert "4 finished" in footers["tokenize"] and " 4 " not in footers["prompts"] + footers["shard"]
    assert "--token-budget" in footers["infer"] and "3 stopped by money" in footers["infer"]


@each(COMMANDS, "version")
def test_version(command):
    r = kp(command.name, "--version")
    assert r.code == 0 and r.stdout.decode() == f"kp-{command.name} {__version__}\n"


def test_infer_help_reads_as_a_paying_user_reads_it():
    """kp-infer's options come in sections, money first, every option in one; `-m` is
    --model; the default --concurrency is set beside the README's 2000."""
    from kimipipe.infer.options import SECTIONS, InferOptions
    from kimipipe.options import sections_of

    text = kp("infer", "--help").stdout.decode()
    headings = [line[:-1] for line in text.splitlines() if line.endswith(":") and
                not line.startswith(" ") and line[:-1] in SECTIONS]
    assert headings == SECTIONS and headings[-1] == "Other options"
    other = text.split("\nOther options:\n")[1].split("\n\n")[0]
    assert [line.split()[0] for line in other.splitlines()] == ["-q,", "--debug", "--version",
                                                                "-h,"]
    assert text.index("--max-cost USD") < text.index("--quantization") < text.index(
        "--max-tokens") < text.index("--concurrency")
    assert "-m, --model TEXT" in text
    concurrency = " ".join(text.split("--concurrency INTEGER RANGE")[1].split("\n\n")[0].split())
    assert "[default: 64" in concurrency and "use 2000" in concurrency
    # every option is listed where its declaration puts it: under its section's heading
    sections = dict.fromkeys(SECTIONS, "")
    for title, following in zip(headings, [*headings[1:], None], strict=True):
        sections[title] = text.split(f"\n{title}:\n")[1].split(f"\n{following}:\n")[0]
    command = click_command("infer")
    section_of = sections_of(InferOptions)
    for param in command.params:
        if isinstance(param, click.Option) and param.name in section_of:
            flags = param.get_help_record(click.Context(command))[0]  # "-m, --model TEXT"
            assert f"\n  {flags}" in "\n" + sections[section_of[param.name]], param.name
