"""Every output is checked writable before any work: exit 2, one line, nothing left behind.

kp-prompts (-o), kp-infer (-o, --failures), kp-tokenize (-o, --rejects) and kp-shard (--out,
--tmp-dir): an output in
a missing directory, one that is a directory, one under a file, and one on a read-only
filesystem (root: a read-only tmpfs; others: a directory without write permission).
"""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest
from conftest import TOKENIZER_KINDS, kp, response_record, write_jsonl
from test_infer import infer, make_prompts

TOKENS = [{"id": f"t{i}", "dataset": "B3", "input_ids": [1, 2, 3], "output_ids": [4, 5]}
          for i in range(3)]


@pytest.fixture
def readonly(tmp_path):
    """A directory no one may write into: a read-only mount for root, else chmod 555."""
    folder = tmp_path / f"ro-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    if os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], check=True)
        yield folder
        subprocess.run(["umount", str(folder)], check=True)
    else:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)


def cases(tmp_path, readonly):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    return {
        "missing directory": (tmp_path / "nowhere" / "out.jsonl", "no such directory: "),
        "a directory": (tmp_path / "a-dir", "is a directory"),
        "under a file": (tmp_path / "a-file" / "out.jsonl", "Not a directory"),
        "read-only": (readonly / "out.jsonl", ""),
    }


COMMANDS = {
    "prompts -o": lambda src, bad: ("prompts", src["prompts"], "-o", bad),
    "tokenize -o": lambda src, bad: ("tokenize", src["responses"], "--tokenizer",
                                     TOKENIZER_KINDS["fast"], "-o", bad),
    "tokenize --rejects": lambda src, bad: ("tokenize", src["responses"], "--tokenizer",
                                            TOKENIZER_KINDS["fast"], "-o", src["dir"] / "t.jsonl",
                                            "--rejects", bad),
    "shard --out": lambda src, bad: ("shard", src["tokens"], "--out", bad),
    "shard --tmp-dir": lambda src, bad: ("shard", src["tokens"], "--out", src["dir"] / "shards",
                                         "--shuffle", "--tmp-dir", bad),
}


def listing(folder) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


CASES = ["missing directory", "a directory", "under a file", "read-only"]
# A directory option (kp-shard --out, --tmp-dir) creates a missing directory: that case is
# its parent's (read-only), so it is not a case of its own.
PAIRS = [(which, case) for which in COMMANDS for case in CASES
         if not (which.endswith(("--out", "--tmp-dir")) and case == "missing directory")]


@pytest.mark.parametrize("which, case", PAIRS)
def test_an_unwritable_output_stops_before_any_work(tmp_path, readonly, which, case):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    src = {"prompts": write_jsonl(inputs / "p.jsonl", [{"id": "1", "prompt": "Hi"}]),
           "responses": write_jsonl(inputs / "r.jsonl", [response_record("a", "Hi", content="ok")]),
           "tokens": write_jsonl(inputs / "t.jsonl", TOKENS), "dir": tmp_path}
    bad, reason = cases(tmp_path, readonly)[case]
    if which.endswith(("--out", "--tmp-dir")):  # a directory option
        if case == "a directory":
            bad, reason = tmp_path / "a-file", "is a file"
        if case == "read-only":
            bad, reason = readonly / "shards", "cannot create it: the directory"
    before = listing(tmp_path)
    argv = COMMANDS[which](src, bad)
    r = kp(*argv)
    option = which.split()[1]
    assert r.code == 2, r.stderr
    assert r.stdout == b"" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"kp-{argv[0]}: cannot write {option} {bad}: {reason}"), r.stderr
    assert listing(tmp_path) == before  # no output, no 0-byte file, no lock file


@pytest.mark.parametrize("option", ["--summary-json", "-o", "--failures", "--rescue"])
def test_an_output_that_cannot_be_written_is_refused_before_anything(standin, tmp_path, option):
    """Checked first: exit 2, one line, no request (not even the endpoints table), no file
    created, no lock file. Before, an unwritable --summary-json paid for every answer and
    then exited 1."""
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 5)
    outputs = {"-o": tmp_path / "r.jsonl", "--failures": tmp_path / "f.jsonl",
               "--summary-json": tmp_path / "s.json", "--rescue": tmp_path / "rescue"}
    if option == "--rescue":
        bad = tmp_path / "a-file"
        bad.write_text("")
        problem = "is a file"
    else:
        bad = tmp_path / "a-dir"
        bad.mkdir()
        problem = "is a directory"
    outputs[option] = bad
    before = sorted(os.listdir(tmp_path))
    r = infer(server, prompts, *[x for pair in outputs.items() for x in pair])
    assert r.code == 2, r.stderr
    assert r.stderr == f"kp-infer: cannot write {option} {bad}: {problem}\n"
    assert server.stats()["requests"] == 0
    assert sorted(os.listdir(tmp_path)) == before
    missing = tmp_path / "no-such-dir" / "s.json"
    r = infer(server, prompts, "-o", tmp_path / "r.jsonl", "--summary-json", missing)
    assert r.code == 2 and r.stderr == (f"kp-infer: cannot write --summary-json {missing}: no such "
                                        f"directory: {missing.parent}\n")
    assert sorted(os.listdir(tmp_path)) == before and server.stats()["requests"] == 0

