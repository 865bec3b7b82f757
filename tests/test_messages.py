"""Reports on stdout, chatter on stderr; messages that know the pipeline; one way of counting.

- `kp-shard verify` checks every directory it is given, and a parent of several sets;
  `kp-shard stats` and `verify` print their report on stdout.
- Records of the wrong stage name the stage to run first; plain text given to kp-prompts
  without `--format text` says to pass it.
- Counts read `1 record`, `2 records`, `12,345 records` everywhere.
- Exit 4 names the failures file and says a rerun retries; tracebacks only with --debug
  or KP_DEBUG=1.
"""

from __future__ import annotations

import json

import pytest
from conftest import kp, response_record, write_jsonl
from test_infer import ids_of, infer, make_prompts

from kimipipe.terminal import counted


def tokens(n, start=0):
    return [{"id": f"t{i}", "dataset": "B3", "input_ids": [1, 2, 3], "output_ids": [4, 5 + i % 3]}
            for i in range(start, start + n)]


@pytest.fixture
def sets(tmp_path):
    """shards/B3 and shards/B4, two finished sets under one parent."""
    parent = tmp_path / "shards"
    for k, name in enumerate(("B3", "B4")):
        src = write_jsonl(tmp_path / f"{name}.jsonl", tokens(4 + k, start=10 * k))
        assert kp("shard", src, "--out", parent / name, "-q").code == 0
    return parent


def test_verify_checks_every_directory_given(sets):
    b3, b4 = sets / "B3", sets / "B4"
    r = kp("shard", "verify", b3, b4)
    assert r.code == 0 and r.stderr == ""
    assert r.stdout.decode() == (f"{b3}: OK (1 shard, 4 rows, 20 tokens)\n"
                                 f"{b4}: OK (1 shard, 5 rows, 25 tokens)\n")
    assert kp("shard", "--verify", b3, "--verify", b4).stdout == r.stdout
    assert kp("shard", "verify", b3, b4, "-q").stdout == b""
    # A problem in the second set is found (only the first was checked before).
    (b4 / "kp-shard.manifest").write_text(json.dumps({**json.loads((b4 / "kp-shard.manifest").read_text()),
                                                  "totals": {}}))
    r = kp("shard", "verify", b3, b4)
    assert r.code == 2
    assert f"{b4}/kp-shard.manifest: totals.records is None" in r.stdout.decode()
    assert r.stderr == f"kp-shard: verify: 1 of 2 sets with problems: {b4}\n"


def test_verify_and_stats_accept_a_parent_of_several_sets(sets):
    r = kp("shard", "verify", sets)
    assert r.code == 0
    assert r.stdout.decode().splitlines() == [f"{sets / 'B3'}: OK (1 shard, 4 rows, 20 tokens)",
                                              f"{sets / 'B4'}: OK (1 shard, 5 rows, 25 tokens)"]
    s = kp("shard", "stats", sets)
    assert s.code == 0 and s.stderr == ""
    text = s.stdout.decode()
    assert text.index(f"kp-shard stats: {sets / 'B3'} (eagle, 1 shard; rows: train 4)") < \
        text.index(f"kp-shard stats: {sets / 'B4'} (eagle, 1 shard; rows: train 5)")
    empty = sets.parent / "empty"
    empty.mkdir()
    r = kp("shard", "verify", empty)
    assert r.code == 2 and b"no kp-shard.manifest" in r.stdout


def test_stats_report_is_on_stdout_and_survives_head(sets):
    import subprocess

    from conftest import BIN
    proc = subprocess.run(f"'{BIN}/kp-shard' stats '{sets}' | head -1; exit ${{PIPESTATUS[0]}}",
                          shell=True, executable="/bin/bash", capture_output=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == b""
    assert proc.stdout.decode().startswith(f"kp-shard stats: {sets / 'B3'}")


def test_records_of_an_earlier_stage_given_to_kp_shard_name_what_to_run(tmp_path):
    responses = write_jsonl(tmp_path / "r.jsonl", [response_record("a", "Hi", content="ok")])
    r = kp("shard", responses, "--out", tmp_path / "s")
    assert r.code == 2
    assert r.stderr.strip().splitlines()[-1] == (f"kp-shard: {responses}:1: a response record (it has no "
                                "`input_ids`): kp-shard reads token records; run kp-tokenize on "
                                "this file first")
    prompts = write_jsonl(tmp_path / "p.jsonl", [
        {"id": "p", "dataset": "B3", "messages": [{"role": "user", "content": "Hi"}]}])
    r = kp("shard", prompts, "--out", tmp_path / "s")
    assert r.code == 2 and r.stderr.strip().endswith(
        "run kp-infer, then kp-tokenize on this file first")
    assert not (tmp_path / "s").exists()


def test_kp_tokenize_names_a_prompts_file_before_it_loads_the_tokenizer(tmp_path):
    """The stage hint comes first: here the tokenizer does not even exist, and the one line
    is still the stage's (Kimi K2.5's takes ~20 s to load before a user learned it)."""
    prompts = write_jsonl(tmp_path / "p.jsonl", [
        {"id": "p", "dataset": "B3", "messages": [{"role": "user", "content": "Hi"}]}])
    r = kp("tokenize", prompts, "--tokenizer", tmp_path / "no-such-tokenizer", "-o", tmp_path / "t.jsonl")
    assert r.code == 2
    assert r.stderr.strip() == (f"kp-tokenize: {prompts}:1: a prompt record (it has no `response`): "
                                "kp-tokenize reads response records; run kp-infer on this file first")
    assert not (tmp_path / "t.jsonl").exists()


def test_plain_text_given_to_kp_prompts_hints_format_text(tmp_path):
    src = tmp_path / "questions.txt"
    src.write_text("Why is the sky blue?\nName three primes.\n")
    r = kp("prompts", src)
    assert r.code == 2
    assert r.stderr.startswith(f"kp-prompts: {src}:1: not JSON: for plain text, one prompt per "
                               "line, pass --format text (")
    assert kp("prompts", src, "--format", "text").code == 0
    # A JSONL file with one bad line is not mistaken for text.
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a"}\nnot json\n')
    r = kp("prompts", jsonl)
    assert r.code == 2 and f"{jsonl}:2: " in r.stderr and "--format text" not in r.stderr


def test_counts_read_one_way():
    assert [counted(n, "record") for n in (0, 1, 2, 12345)] == [
        "0 records", "1 record", "2 records", "12,345 records"]
    assert counted(1, "entry", "entries") == "1 entry" and counted(3, "entry", "entries") == "3 entries"


def test_summary_lines_count_with_thousands_and_singulars(tmp_path):
    src = write_jsonl(tmp_path / "t.jsonl", tokens(1))
    r = kp("shard", src, "--out", tmp_path / "one")
    assert "kp-shard: read 1 record; wrote train 1 row, 5 tokens in 1 shard to" in r.stderr
    many = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"question {i}"} for i in range(1200)])
    r = kp("prompts", many, "-o", tmp_path / "p.out.jsonl")
    assert f"kp-prompts: wrote 1,200 prompts to {tmp_path / 'p.out.jsonl'}" in r.stderr


INJECTED_BUG = """\
import click.core


def invoke(self, ctx):  # every kp-* command's body, as click runs it
    raise RuntimeError("a bug, injected by the test")


click.core.Command.invoke = invoke
"""


def test_kp_debug_shows_the_traceback_of_an_unexpected_error(tmp_path):
    """A bug (injected: a sitecustomize on PYTHONPATH makes click's command body raise) is
    reported in one line, and with its traceback under KP_DEBUG=1 (not under KP_DEBUG=0)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(INJECTED_BUG)
    src = tmp_path / "q.txt"
    src.write_text("a question\n")
    runs = {}
    for debug in ("", "0", "1"):
        env = {"PYTHONPATH": str(tmp_path / "site"), "KP_DEBUG": debug}
        runs[debug] = r = kp("prompts", src, "--format", "text", env=env)
        assert r.code == 1 and r.stdout == b""
    for quiet in ("", "0"):
        assert runs[quiet].stderr.strip().splitlines() == [
            "kp-prompts: unexpected error: RuntimeError: a bug, injected by the test "
            "(rerun with --debug or KP_DEBUG=1 for the traceback)"]
    shown = runs["1"].stderr
    assert shown.startswith("Traceback (most recent call last):")
    assert 'in invoke\n    raise RuntimeError("a bug, injected by the test")' in shown
    assert shown.rstrip().endswith("RuntimeError: a bug, injected by the test")


def test_exit_4_names_the_failures_file_and_says_a_rerun_retries(standin, tmp_path):
    server = standin(faults={"503": 1.0})
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--max-attempts", "1", "--failures", failures)
    assert r.code == 4, r.stderr
    assert r.stderr.rstrip().splitlines()[-1] == (
        f"  finished with 3 permanent failures: see {failures}; rerun the same command to retry "
        "the prompts that failed")
    r = infer(server, prompts, "-o", out, "--max-attempts", "1")
    assert r.code == 4 and r.stderr.rstrip().splitlines()[-1] == (
        "  finished with 3 permanent failures; rerun the same command to retry the prompts that "
        "failed (add --failures FILE to keep why each failed)")
    server.configure(faults={})
    r = infer(server, prompts, "-o", out, "--failures", failures)  # as it says: a rerun retries
    assert r.code == 0 and sorted(ids_of(out)) == ["p00000", "p00001", "p00002"]

