"""The Makefile as users drive it: full builds, resume after stops, one stage rerun, the demo."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import browser
import forked as fork_servers
import pytest
from conftest import BIN, EXEC_ALWAYS, REPO, read_jsonl, restore_environment
from helpers import KP_COMMANDS, time_left, whole_lines

from kimipipe.standin.answers import user_text_sha256

VENV = Path(sys.executable).parent.parent
SOURCE = REPO / "kimipipe" / "data" / "demo" / "sharegpt.json"
TOKENIZER = REPO / "kimipipe" / "data" / "tokenizers" / "kimi-k2.5-mini-fast"


_TOKENIZER_CHECKS: dict[tuple[str, str], bytes] = {}


def seed_tokenizer_check(work: Path, tokenizer, flags: str) -> None:
    """A new WORK gets the memo `make check` writes once TOKENIZER has loaded with FLAGS
    (WORK/.tokenizer-check.json: kimipipe/make/check.py), made by the product's own
    check_tokenizer_runs once per test process: what a user's second `make all` finds. Each
    make-driven test otherwise reloaded the same unchanged tokenizer in its first
    `make check` (a kp-tokenize start, ~1-2 CPU-s). The memo is the product's to trust: it
    holds the tokenizer's path, files, sizes and mtimes, the flags and the versions, and a
    test whose TOKENIZER or TOKENIZE_FLAGS differ is checked for real. The check itself,
    loading and not reloading, is test_make_build.py's test_make_check_...'s (unseeded)."""
    from kimipipe.make.check import check_tokenizer_runs

    key = (str(tokenizer), flags)
    if key not in _TOKENIZER_CHECKS:
        with tempfile.TemporaryDirectory() as d:
            memo = Path(d) / ".tokenizer-check.json"
            ok, line = check_tokenizer_runs(str(VENV / "bin"), str(tokenizer), flags, memo=str(memo))
            assert ok, line
            _TOKENIZER_CHECKS[key] = memo.read_bytes()
    work.mkdir(parents=True)
    (work / ".tokenizer-check.json").write_bytes(_TOKENIZER_CHECKS[key])


def make_command(server, tmp_path, *args, seed_check: bool = True, forked: bool = True,
                 **variables) -> tuple[list[str], dict]:
    """make ARGS against SERVER, building in TMP_PATH. FORKED: the kp-* commands make runs are
    forked by this test process's servers, through shims in BIN (tests/forked.py
    `Servers.shim_bin`: each its own process with make's argv, environment, descriptors
    and signals, its exit code make's); off, make runs the venv's scripts, for the tests
    that kill make's process group."""
    bin_dir = fork_servers.SERVER.shim_bin(VENV / "bin") if forked and not EXEC_ALWAYS else VENV / "bin"
    settings = {"BIN": bin_dir, "DATASETS": "D1", "SOURCE_D1": SOURCE, "WORK": tmp_path / "work",
                "SHARDS": tmp_path / "shards", "VENV": VENV, "BASE_URL": server.base_url,
                "TOKENIZER": TOKENIZER, "CONCURRENCY": 16, "MAX_COST": 1, "TOKEN_BUDGET": "",
                "MAX_TOKENS": 1024, "MIN_CREDITS": 1, "INFER_FLAGS": "--backoff-base 0.05 --quiet",
                "TOKENIZE_FLAGS": "--quiet", **variables}
    work = Path(settings["WORK"])
    if seed_check and not work.exists():  # a fresh build directory only
        seed_tokenizer_check(work, settings["TOKENIZER"], str(settings["TOKENIZE_FLAGS"]))
    cmd = ["make", "-C", str(REPO), *args, *(f"{k}={v}" for k, v in settings.items())]
    restore_environment()  # (kp-tokenize's shims then fork from the warm server: conftest.py)
    return cmd, {**os.environ, "OPENROUTER_API_KEY": server.api_key}


def make(server, tmp_path, *args, **variables):
    cmd, env = make_command(server, tmp_path, *args, **variables)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=time_left())


def requests_of(prompts_file) -> int:
    """The requests a prompts file makes: a conversation (TURNS=all) asks each of its user
    turns (docs/conversations.md), so the demo sample's 260 conversations make 297."""
    return sum(1 + len(p.get("follow_ups", [])) for p in read_jsonl(prompts_file))


def stage_files(tmp_path) -> dict[str, tuple[int, int]]:
    """(inode, mtime in ns) of every file the stages write: prompts, responses, the infer
    summary kp-infer rewrites on every run, tokens, stamps, shards and the manifest
    (kp-shard swaps in a new file, so a rerun changes its inode)."""
    files = sorted(p for d in ("work", "shards") for p in (tmp_path / d).rglob("*")
                   if p.is_file() and not p.name.startswith("."))
    assert {"D1.prompts.jsonl", "D1.responses.jsonl", "D1.infer-summary.json",
            "D1.responses.done", "D1.tokens.jsonl.zst", "D1.tokens.done",
            "kp-shard.manifest"} <= {p.name for p in files}
    return {str(p.relative_to(tmp_path)): (p.stat().st_ino, p.stat().st_mtime_ns) for p in files}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One `make all` of D1 from nothing (the 260-conversation sample, 429s and 502s
    retried), for the tests that start from a finished build: each copies it into its own
    tmp_path (copy_build) and runs its make commands there, against a stand-in of its own
    whose ledger therefore holds only what those commands paid. Built once per module and
    worker instead of once per test: the build itself is checked here, once."""
    from kimipipe.standin.testing import StandIn

    root = tmp_path_factory.mktemp("built")
    with StandIn(faults={"429": 0.05, "502": 0.05}, retry_after=0.05, ledger=True,
                 tokenizer=TOKENIZER, workdir=root / "standin") as server:
        r = make(server, root, "all")
        assert r.returncode == 0, r.stderr + r.stdout
        requests = requests_of(root / "work" / "D1.prompts.jsonl")  # a record each
        manifest = json.loads((root / "shards" / "D1" / "kp-shard.manifest").read_text())
        assert manifest["totals"]["records"] == requests
        assert len(server.ledger()) == requests
        assert server.stats()["faults"]  # retried faults were part of the build
        for stage in ("responses", "tokens"):
            assert (root / "work" / f"D1.{stage}.done").exists()
    return root


def copy_build(built: Path, tmp_path: Path) -> int:
    """BUILT's work and shards into TMP_PATH, as they are (copytree keeps the mtimes,
    which make's stamps are compared by; the stamps hold no path of WORK, and the answers'
    `api` is the host without the port, so a stand-in on another port is the same API);
    returns the build's request count."""
    for name in ("work", "shards"):
        shutil.copytree(built / name, tmp_path / name, symlinks=True)
    return requests_of(tmp_path / "work" / "D1.prompts.jsonl")


def test_full_build_then_nothing_to_redo(standin, built, tmp_path):
    copy_build(built, tmp_path)  # `make all` from nothing: the `built` fixture
    server = standin(ledger=True, tokenizer=TOKENIZER)
    before = stage_files(tmp_path)
    again = make(server, tmp_path, "all")
    assert again.returncode == 0, again.stderr + again.stdout
    # a finished stage is not redone: no stage rewrote its output or its stamp ...
    assert stage_files(tmp_path) == before
    # ... kp-infer did not even start (it reads the endpoints table first thing) ...
    stats = server.stats()
    assert stats["endpoint_requests"].get("endpoints", 0) == 0
    assert stats["requests"] == stats["completions_started"] == 0
    assert server.ledger() == []  # ... and nothing was paid twice
    # every answer says who answered; the stand-in's say they are its own
    answers = read_jsonl(tmp_path / "work" / "D1.responses.jsonl")
    assert {a["api"] for a in answers} == {"127.0.0.1"}
    assert all(a["generation_id"].startswith("gen-standin-") for a in answers)
    # another API (the same stand-in under another host name) is not "nothing to do": the
    # responses stage runs again, and kp-infer refuses to take these answers for its own
    other = server.base_url.replace("127.0.0.1", "127.1")
    r = make(server, tmp_path, "all", BASE_URL=other)
    assert r.returncode == 2, r.stderr
    said = " ".join(r.stderr.split())
    assert "D1.responses.jsonl: holds answers of 127.0.0.1 (the kimipipe stand-in's offline filler" in said
    assert "this run asks 127.1" in said
    assert server.stats()["completions_started"] == 0
    # D1's spend counts against another dataset's TOTAL_COST under its own API only
    def recorded_elsewhere(base_url):
        r = make(server, tmp_path, "plan", DATASETS="D2", SOURCE_D2=SOURCE, BASE_URL=base_url)
        assert r.returncode == 0, r.stderr
        return json.loads((tmp_path / "work" / "build.plan.json").read_text())["recorded_elsewhere"]

    spent = sum(a["usage"]["cost"] for a in answers)
    assert recorded_elsewhere(server.base_url) == pytest.approx(spent) and spent > 0
    assert recorded_elsewhere(other) == 0.0
    # make D1.clean says what it removes, then removes it; paid answers only when told
    real = answers[0] | {"generation_id": "gen-1764583200-abc"}  # not the stand-in's mark
    with open(tmp_path / "work" / "D1.responses.jsonl", "a") as f:
        f.write(json.dumps(real | {"id": "real-1"}) + "\n")
    r = make(server, tmp_path, "D1.clean")
    assert r.returncode == 2 and "nothing removed" in r.stderr  # make: a recipe failed
    assert "D1.responses.jsonl: 1 paid record, $" in r.stderr and "CLEAN_PAID=1" in r.stderr
    assert (tmp_path / "work" / "D1.responses.jsonl").exists()
    files = sorted(p for p in (tmp_path / "work").glob("D1.*"))
    r = make(server, tmp_path, "D1.clean", CLEAN_PAID=1)
    assert r.returncode == 0, r.stderr
    listed = r.stdout.split("removing D1:")[1]
    assert all(str(p) in listed for p in files) and f"{tmp_path / 'shards' / 'D1'}/" in listed
    assert not list((tmp_path / "work").glob("*D1.*")) and not (tmp_path / "shards" / "D1").exists()
    assert (tmp_path / "work" / "build.flags").exists()  # the build's own: `make clean`
    r = make(server, tmp_path, "clean", DATASETS="D1 D2")  # (D2: the plan above)
    assert r.returncode == 0 and "build.flags" in r.stdout and "D2.prompts.jsonl" in r.stdout
    assert not (tmp_path / "work").exists() and not (tmp_path / "shards").exists()
    # then the other API builds from nothing
    r = make(server, tmp_path, "plan", BASE_URL=other)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "work" / "D1.plan.json").read_text())["prompts"]["todo"] == 260


def test_make_all_writes_each_datasets_card_from_its_run(built):
    """SHARDS/D/README.md: the card load_dataset reads, told by make the answers' run (the
    infer summary), the plan (quantizations), the source and the stages' commands."""
    from test_shard import card_of

    shards = built / "shards" / "D1"
    meta, body = card_of(shards)
    manifest = json.loads((shards / "kp-shard.manifest").read_text())
    summary = json.loads((built / "work" / "D1.infer-summary.json").read_text())
    assert {s["name"]: s["num_examples"] for s in meta["dataset_info"]["splits"]} == \
        {k: v["records"] for k, v in manifest["splits"].items()}
    assert f"answers written {summary['done']:,} " in body
    assert f"spend recorded in the output ${summary['spend_total']:.4f};" in body
    assert "Asked for: `moonshotai/kimi-k2.5` (the plan)." in body and "| int4 |" in body
    assert f"Source files: `{SOURCE}`." in body
    for stage in ("kp-prompts ", "kp-infer ", "kp-tokenize ", "kp-shard "):
        assert f"\n{stage}" in body, stage


def request_ids(prompts_file) -> set[str]:
    """The IDs of the records a prompts file's answers get: a conversation's turns are
    `<id>#<turn>` (docs/conversations.md), a single prompt keeps its id."""
    return {f"{p['id']}#{t}" if p.get("follow_ups") else p["id"]
            for p in read_jsonl(prompts_file) for t in range(1, 2 + len(p.get("follow_ups", [])))}


def test_a_changed_source_never_mixes_into_the_shards(standin, tmp_path):
    """README's walkthrough twice on one dataset name with two files (the second shares two
    conversations with the first): the shards, their manifest and their card hold the second
    file's rows only; the first's answers stay in the responses file (paid for, counted in
    the spend recorded there) and the two it shares are not paid twice."""
    from test_shard import card_of

    conversations = json.loads(SOURCE.read_text())
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(conversations[:6]))
    second.write_text(json.dumps(conversations[4:10]))
    server = standin(ledger=True, tokenizer=TOKENIZER)
    work, shards = tmp_path / "work", tmp_path / "shards" / "D1"
    r = make(server, tmp_path, "all", SOURCE_D1=first)
    assert r.returncode == 0, r.stderr + r.stdout
    first_ids = request_ids(work / "D1.prompts.jsonl")
    r = make(server, tmp_path, "all", SOURCE_D1=second)
    assert r.returncode == 0, r.stderr + r.stdout
    second_ids = request_ids(work / "D1.prompts.jsonl")
    assert first_ids - second_ids and first_ids & second_ids  # (the files as meant)
    rows = [row for f in sorted(shards.glob("D1-*.jsonl.zst")) for row in read_jsonl(f)]
    assert sorted(row["id"] for row in rows) == sorted(second_ids)
    assert {t["id"] for t in read_jsonl(work / "D1.tokens.jsonl.zst")} == second_ids
    manifest = json.loads((shards / "kp-shard.manifest").read_text())
    assert manifest["totals"]["records"] == len(second_ids)
    meta, body = card_of(shards)
    assert sum(s["num_examples"] for s in meta["dataset_info"]["splits"]) == len(second_ids)
    assert f"Source files: `{second}`." in body and str(first) not in body
    assert f"Rows by dataset: D1 {len(second_ids)}" in body
    # paid answers are never deleted: the first file's stay, and count in the spend
    answers = read_jsonl(work / "D1.responses.jsonl")
    assert {a["id"] for a in answers} == first_ids | second_ids
    assert len(server.ledger()) == len(first_ids | second_ids)  # none paid twice
    summary = json.loads((work / "D1.infer-summary.json").read_text())
    assert summary["spend_total"] == pytest.approx(sum(a["usage"]["cost"] for a in answers))


def test_kill_9_mid_stage_then_make_all_resumes_and_pays_nothing_twice(standin, tmp_path):
    """README: rerun `make all` after a crash. make and kp-infer are
    killed with SIGKILL mid-stage; the rerun finishes the build, and no answer that was
    written before the crash is paid for again (the stand-in's ledger, by prompt). The
    stand-in answers 40 completions and holds the rest, so the kill lands mid-stage
    however fast or slow the machine is."""
    server = standin(latency=0.2, ledger=True, tokenizer=TOKENIZER)
    server.configure(hold_after=40)
    # TURNS=last: the ledger keys a request by its last user text, which conversations
    # sharing their first user turn would share under TURNS=all
    cmd, env = make_command(server, tmp_path, "all", TURNS="last", forked=False)
    responses = tmp_path / "work" / "D1.responses.jsonl"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own process group: make and below
    try:
        deadline = time.monotonic() + 120
        while len(whole_lines(responses)) < 40 or not server.stats()["held"]:
            assert proc.poll() is None, "make ended before the crash"
            assert time.monotonic() < deadline, "kp-infer never reached the stand-in's gate"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    server.configure(hold_after=None)
    written = whole_lines(responses)
    assert len(written) == 40  # what the stand-in answered before its gate
    assert not (tmp_path / "work" / "D1.responses.done").exists()  # never taken as finished
    assert not (tmp_path / "shards" / "D1").exists()
    r = make(server, tmp_path, "all", TURNS="last")
    assert r.returncode == 0, r.stderr + r.stdout
    ids = [x["id"] for x in read_jsonl(responses)]
    assert len(ids) == len(set(ids)) == 260
    assert json.loads((tmp_path / "shards" / "D1" / "kp-shard.manifest").read_text())["totals"]["records"] == 260
    paid = Counter(x["request_user_text_sha256"] for x in server.ledger())
    assert all(paid[user_text_sha256(x["messages"])] == 1 for x in written)  # none paid twice
    assert sum(paid.values()) <= 260 + 16  # at most the requests in flight at the crash


def test_exit_4_of_kp_infer_and_of_kp_tokenize_finishes_their_stage(standin, tmp_path):
    """README (make): kp-infer's exit 4 (done, some prompts failed for good: here refused by
    moderation) and kp-tokenize's exit 4 (done, some records rejected: here an answer cut by
    a content filter) each finish their stage: it is stamped, the build goes on to the
    shards, and what failed is in the failures and rejects files, not in the shards."""
    conversations = json.loads(SOURCE.read_text())[:30]
    source = tmp_path / "small.json"
    source.write_text(json.dumps(conversations))
    server = standin(moderation_marker="misconceptions", tokenizer=TOKENIZER)
    work = tmp_path / "work"
    # TURNS=last: one request per prompt, its marker in the prompt's last user turn
    r = make(server, tmp_path, str(work / "D1.responses.done"), SOURCE_D1=source,
             INFER_FLAGS="--backoff-base 0.05", TURNS="last")
    assert r.returncode == 0, r.stderr[-2000:]
    prompts = read_jsonl(work / "D1.prompts.jsonl")
    moderated = {p["id"] for p in prompts if "misconceptions" in p["messages"][-1]["content"]}
    assert moderated and len(moderated) < len(prompts)
    assert "kp-infer: " in r.stderr and "failed" in r.stderr  # kp-infer said so (exit 4)
    assert {x["id"] for x in read_jsonl(work / "D1.failures.jsonl")} == moderated
    assert (work / "D1.responses.done").exists()
    # an answer kp-tokenize rejects: a provider's content filter cut it (finish_reason)
    lines = (work / "D1.responses.jsonl").read_text().splitlines()
    cut = json.loads(lines[0])
    cut["finish_reason"] = "content_filter"
    (work / "D1.responses.jsonl").write_text("\n".join([json.dumps(cut), *lines[1:]]) + "\n")
    r = make(server, tmp_path, "all", SOURCE_D1=source, INFER_FLAGS="--backoff-base 0.05",
             TURNS="last")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (work / "D1.tokens.done").exists()
    assert [x["id"] for x in read_jsonl(work / "D1.rejects.jsonl")] == [cut["id"]]
    manifest = json.loads((tmp_path / "shards" / "D1" / "kp-shard.manifest").read_text())
    assert manifest["totals"]["records"] == len(prompts) - len(moderated) - 1


def test_ctrl_c_mid_stage_then_make_all_resumes_and_pays_nothing_twice(standin, tmp_path):
    """README: rerun `make all` after a Ctrl-C. SIGINT goes to make's whole process group,
    as a terminal's Ctrl-C does, while kp-infer has answers written and requests held at
    the stand-in's gate; the gate then opens, so kp-infer's grace lets what it has in
    flight finish and be written. make ends by the SIGINT, the stage is not stamped
    done, and the rerun finishes the build with no answer paid twice."""
    server = standin(latency=0.1, ledger=True, tokenizer=TOKENIZER)
    server.configure(hold_after=40)
    cmd, env = make_command(server, tmp_path, "all", TURNS="last",  # the ledger's key: see kill -9
                            forked=False)
    responses = tmp_path / "work" / "D1.responses.jsonl"
    # SIGINT as a terminal leaves it (default): a suite started from a script's background
    # job inherits SIGINT ignored, and make then ignores the Ctrl-C it is sent
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while len(whole_lines(responses)) < 40 or not server.stats()["held"]:
            assert proc.poll() is None, "make ended before the Ctrl-C"
            assert time.monotonic() < deadline, "kp-infer never reached the stand-in's gate"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)
        server.configure(hold_after=None)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # make ends by the signal itself (a shell shows 130), its last line the rerun hint, not
    # make's own "*** [...] Interrupt" (the recipe's trap: Makefile, run_infer)
    assert proc.returncode == -signal.SIGINT, err[-2000:]
    assert err.splitlines()[-1] == "make: interrupted; rerun make to resume", err[-2000:]
    assert "Interrupt" not in err and "Error" not in err, err[-2000:]
    assert not (tmp_path / "work" / "D1.responses.done").exists()  # never taken as finished
    written = read_jsonl(responses)  # whole lines only: kp-infer stopped cleanly
    assert 40 <= len(written) < 260
    r = make(server, tmp_path, "all", TURNS="last")
    assert r.returncode == 0, r.stderr + r.stdout
    ids = [x["id"] for x in read_jsonl(responses)]
    assert len(ids) == len(set(ids)) == 260
    paid = Counter(x["request_user_text_sha256"] for x in server.ledger())
    assert sum(paid.values()) == 260 and set(paid.values()) == {1}  # nothing paid twice


def test_kp_infer_interrupted_alone_fails_the_stage(standin, tmp_path):
    """A SIGINT to kp-infer alone (not a Ctrl-C to make's group): the recipe fails (make's
    `Error 130`), the stage is not stamped and no later stage runs; the rerun hint is said."""
    from helpers import children

    server = standin(latency=0.1, tokenizer=TOKENIZER)
    server.configure(hold_after=10)
    cmd, env = make_command(server, tmp_path, "all", TURNS="last", forked=False)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not server.stats()["held"]:
            assert proc.poll() is None and time.monotonic() < deadline, "no request held"
            time.sleep(0.02)
        infer = [pid for shell in children(proc.pid) for pid in children(shell, b"kp-infer")]
        assert len(infer) == 1, infer
        os.kill(infer[0], signal.SIGINT)
        server.configure(hold_after=None)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 2, err[-2000:]
    assert "make: interrupted; rerun make to resume" in err
    assert err.splitlines()[-1].endswith("D1.responses.done] Error 130"), err[-2000:]
    assert not (tmp_path / "work" / "D1.responses.done").exists()
    assert not (tmp_path / "work" / "D1.tokens.jsonl.zst").exists()  # nothing ran after it


def test_money_stop_halts_the_build_and_raising_the_cap_resumes(standin, tmp_path):
    """A money stop (kp-infer exit 3) is never stamped done, and make names the limit and
    the make variable to change, with the figures: MAX_COST, the balance (402), the key's
    limit (402, the stand-in's documented default form)."""
    server = standin(price_scale=200.0, ledger=True, tokenizer=TOKENIZER)
    flags = "--backoff-base 0.05 --quiet"
    r = make(server, tmp_path, "all", MAX_COST=1, INFER_FLAGS=flags)
    assert r.returncode == 2  # (make: a recipe failed) the plan saw it coming: nothing was sent
    assert "MAX_COST $1.00 stops D1 before its TOKEN_BUDGET" in " ".join(r.stderr.split())
    assert server.stats()["completions_started"] == 0
    r = make(server, tmp_path, "all", MAX_COST=1, ALLOW_SHORT=1, INFER_FLAGS=flags)
    assert r.returncode == 2  # make: a recipe failed (its message below)
    said = " ".join(r.stderr.split())
    assert "make: D1 stopped by MAX_COST=1 (the cap per dataset, kp-infer exit 3)" in said
    assert "raise MAX_COST (about MAX_COST=" in said and "--max-cost" not in said.split("make: D1")[1]
    assert sum(x["cost"] for x in server.ledger()) <= 1
    assert not (tmp_path / "work" / "D1.responses.done").exists()  # never mistaken for finished
    assert not (tmp_path / "shards" / "D1").exists()
    first = len(read_jsonl(tmp_path / "work" / "D1.responses.jsonl"))
    requests = requests_of(tmp_path / "work" / "D1.prompts.jsonl")
    assert 0 < first < requests
    # the balance runs out (402): the same, naming the balance and `make credits`
    server.configure(balance=sum(x["cost"] for x in server.ledger()) + 0.5)
    r = make(server, tmp_path, "all", MAX_COST=100, MIN_CREDITS="", INFER_FLAGS=flags)
    assert r.returncode == 2  # make: a recipe failed (its message below)
    said = " ".join(r.stderr.split())
    assert "make: D1 stopped: OpenRouter answered 402, the balance or the key's limit is used up" in said
    assert "make credits" in said and not (tmp_path / "work" / "D1.responses.done").exists()
    # the key's limit (limit_source openrouter_key_limit): the same, naming it
    before = len(read_jsonl(tmp_path / "work" / "D1.responses.jsonl"))
    spent = sum(x["cost"] for x in server.ledger())
    server.configure(balance=1000, key_limit=spent + 15)  # one worst case is ~$9.8 here
    r = make(server, tmp_path, "all", MAX_COST=100, MIN_CREDITS="", INFER_FLAGS=flags)
    assert r.returncode == 2  # make: a recipe failed (its message below)
    said = " ".join(r.stderr.split())
    assert "make: D1 stopped: the API key's spending limit (openrouter_key_limit) is reached" in said
    assert "limit $" in said.split("make: D1 stopped")[1]
    assert not (tmp_path / "work" / "D1.responses.done").exists()
    assert not (tmp_path / "work" / "D1.failures.jsonl").exists() or \
        read_jsonl(tmp_path / "work" / "D1.failures.jsonl") == []  # no prompt failed for money
    assert before < len(read_jsonl(tmp_path / "work" / "D1.responses.jsonl")) < requests
    server.configure(balance=1000, key_limit=None)
    r = make(server, tmp_path, "all", MAX_COST=100, INFER_FLAGS=flags)
    assert r.returncode == 0, r.stderr
    ids = [x["id"] for x in read_jsonl(tmp_path / "work" / "D1.responses.jsonl")]
    assert len(ids) == len(set(ids)) == requests
    assert len(server.ledger()) == requests


def test_token_budget_finishes_a_dataset_and_raising_it_continues(standin, tmp_path):
    server = standin(tokenizer=TOKENIZER)
    r = make(server, tmp_path, "all", TOKEN_BUDGET="3k")
    assert r.returncode == 0, r.stderr
    first = len(read_jsonl(tmp_path / "work" / "D1.responses.jsonl"))
    assert 0 < first < 260
    manifest = json.loads((tmp_path / "shards" / "D1" / "kp-shard.manifest").read_text())
    assert manifest["totals"]["records"] == first
    # a new budget: that stage resumes (the stand-in counts with the mini tokenizer, several
    # tokens a word, and 16 answers in flight overshoot the first budget by as many answers)
    r = make(server, tmp_path, "all", TOKEN_BUDGET="20k")
    assert r.returncode == 0, r.stderr
    second = len(read_jsonl(tmp_path / "work" / "D1.responses.jsonl"))
    assert second > first
    manifest = json.loads((tmp_path / "shards" / "D1" / "kp-shard.manifest").read_text())
    assert manifest["totals"]["records"] == second


def test_one_stage_reruns_from_saved_files(standin, built, tmp_path):
    requests = copy_build(built, tmp_path)  # a finished `make all` (the `built` fixture)
    server = standin(ledger=True, tokenizer=TOKENIZER)
    before = stage_files(tmp_path)
    fetches = 0  # this stand-in's: kp-infer must never start here
    r = make(server, tmp_path, "D1.tokens", TOKENIZE_FLAGS="")
    assert r.returncode == 0, r.stderr
    after = stage_files(tmp_path)
    assert f"kp-tokenize: wrote {requests} records" in r.stderr
    changed = {name for name in before if after[name] != before[name]}
    # the tokens stage and what follows from it, nothing before it
    assert changed == {"work/D1.tokens.jsonl.zst", "work/D1.tokens.done", "work/D1.rejects.jsonl"}
    assert server.stats()["endpoint_requests"].get("endpoints", 0) == fetches  # kp-infer never started
    assert server.ledger() == []  # nothing paid again

    def remade(**variables) -> set[str]:
        """What `make all` with VARIABLES rewrote; kp-infer must not have started."""
        before = stage_files(tmp_path)
        r = make(server, tmp_path, "all", **variables)
        assert r.returncode == 0, r.stderr
        after = stage_files(tmp_path)
        assert server.stats()["endpoint_requests"].get("endpoints", 0) == fetches
        return {name for name in after if after[name] != before.get(name)} | (before.keys() - after.keys())

    def only(changed: set[str], *prefixes: str) -> bool:
        return bool(changed) and all(name.startswith(prefixes) for name in changed)

    remade()  # the shards of the new tokens (`make D1.tokens` stops at the tokens)
    assert remade() == set()  # and then nothing: every stamp is as it was
    # SHARD_FLAGS remakes the shards only (and then training.md's export lines work)
    changed = remade(SHARD_FLAGS="--eval-fraction 0.2")
    assert only(changed, "shards/D1/", "work/D1.shard-flags") and "shards/D1/kp-shard.manifest" in changed
    snippet = (REPO / "docs" / "training.md").read_text().split("<!-- eval-split -->\n```\n", 1)[1].split("```", 1)[0].splitlines()[:2]
    script = "\n".join(line.replace("shards/B3", "shards/D1").replace("kp-shard ", f"{BIN}/kp-shard ")
                       for line in snippet)
    subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, check=True, capture_output=True)
    splits = json.loads((tmp_path / "shards/D1/kp-shard.manifest").read_text())["splits"]
    for split in ("train", "eval"):
        for out in ("train/B3", "train/all"):  # one set, and every set under shards/
            rows = (tmp_path / out / f"{split}.jsonl").read_text().splitlines()
            assert len(rows) == splits[split]["records"] > 0, (out, split)
    assert remade(SHARD_FLAGS="--eval-fraction 0.2 --quiet") == set()  # --quiet changes no byte
    # another tokenizer, the same one changed, other TOKENIZE_FLAGS: tokens and shards again
    copy = tmp_path / "tokenizer"
    shutil.copytree(TOKENIZER, copy)
    tokens_and_shards = ("work/D1.tokens", "work/D1.rejects", "work/D1.tokenize-flags", "shards/D1/")
    for variables in ({"TOKENIZER": copy}, {"TOKENIZER": copy, "touch": "tokenizer.json"},
                      {"TOKENIZER": copy, "TOKENIZE_FLAGS": "--quiet --trust-remote-code"}):
        if "touch" in variables:
            name = variables.pop("touch")
            os.utime(copy / name, ns=(os.stat(copy / name).st_atime_ns, os.stat(copy / name).st_mtime_ns + 10**9))
        changed = remade(SHARD_FLAGS="--eval-fraction 0.2", **variables)
        assert only(changed, *tokens_and_shards) and "work/D1.tokens.jsonl.zst" in changed, variables
        assert "shards/D1/kp-shard.manifest" in changed
    assert server.ledger() == []


def test_credits_guard_refuses_to_start_spending(standin, tmp_path):
    server = standin(balance=0.5, tokenizer=TOKENIZER)
    r = make(server, tmp_path, "all", MIN_CREDITS=2)
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "(kp-infer exit 3)" in said
    assert "the account's balance is below MIN_CREDITS=2" in said and "lower MIN_CREDITS=" in said
    assert server.stats()["completions_started"] == 0
    credits = make(server, tmp_path, "credits")
    assert credits.returncode == 0 and "0.5" in credits.stdout


def test_make_demo_runs_the_whole_pipeline_offline(tmp_path):
    out = tmp_path / "demo"
    r = subprocess.run(["make", "-C", str(REPO), "demo", f"VENV={VENV}", f"DEMO_OUT={out}"],
                       capture_output=True, text=True, timeout=time_left())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "demo: done, offline" in r.stderr
    requests = requests_of(out / "work" / "demo.prompts.jsonl")  # each turn of a conversation
    conversations = len(read_jsonl(out / "work" / "demo.prompts.jsonl"))
    assert f"prompts        {conversations} conversations, {requests} requests (one per user turn)" in r.stderr
    assert f"answers        {requests} of the requests (failed: 0)" in r.stderr
    assert "(verified)" in r.stderr
    # the retries are real: every fault the stand-in was started with was met and survived
    # (a misroute as a routing violation, paid and refused), the 429s shrank the adaptive
    # limit below the make's CONCURRENCY=64, and what it says is what kp-infer counted
    from kimipipe.demo import FAULTS
    summary = json.loads((out / "work" / "demo.infer-summary.json").read_text())
    retries = summary["retries"]
    met = {"routing_violation" if kind == "misroute" else kind for kind in FAULTS}
    assert met <= {k for k, n in retries.items() if n > 0}, retries
    assert summary["concurrency_limit_end"] < 64
    assert "  retries        " + ", ".join(f"{k}: {v}" for k, v in retries.items()) in r.stderr
    billed = [json.loads(line) for line in (out / "standin" / "ledger.jsonl").read_text().splitlines()]
    assert len(billed) == requests + retries["routing_violation"]  # the refused ones paid too
    assert "next: look at a row:  .venv/bin/python -m kimipipe.demo --row" in r.stderr
    assert "counts usage with the bundled mini tokenizer" in r.stderr  # and kp-infer checked it
    manifest = json.loads((out / "shards" / "demo" / "kp-shard.manifest").read_text())
    assert manifest["totals"]["records"] == requests
    # the first "next" step, as the README gives it: one row, its IDs decoded
    row = subprocess.run([sys.executable, "-m", "kimipipe.demo", "--row", "demo-0021", "--out",
                          str(out)], capture_output=True, text=True, timeout=120)
    assert row.returncode == 0, row.stderr
    assert "row demo-0021#1 (dataset demo)" in row.stdout  # a conversation: its first turn
    assert "<|im_assistant|>assistant<|im_middle|>" in row.stdout  # the template's end
    assert "\n  Thinking about [" in row.stdout  # the output: reasoning first
    # the build report, written by `make report` at the end, opened in a real browser
    report = out / "work" / "report.html"
    assert f"build report   {report}" in r.stderr
    check_in_browser(report)
    # the stand-in is gone: its port no longer answers
    port = int((out / "standin" / "port").read_text())
    import socket
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


SCREENSHOT = REPO / "docs" / "report.png"


def check_in_browser(report: Path) -> None:
    """REPORT in headless Chromium (tests/browser.py): no request leaves the file, no console
    message, every panel of every plot has drawn data; then a full-page screenshot, whose
    size (not pixels: the demo's timings differ run to run) matches docs/report.png's.
    KP_UPDATE_SCREENSHOT=1 writes it to docs/report.png instead."""
    if browser.CHROMIUM is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")
    shot = report.with_suffix(".png")
    seen = browser.open_page(report, shot)
    assert seen.requests == [report.resolve().as_uri()], "the page asked for more than itself"
    assert seen.console == []
    assert seen.title == "kimipipe build report"
    assert len(seen.figures) >= 12, seen.figures  # the demo has data for most plots
    for figure in seen.figures:
        assert figure["shown"] > 300, figure  # laid out at a readable width
        assert figure["panels"], figure
        for panel in figure["panels"]:
            assert panel["drawn"] > 0, (figure["id"], panel)
    width, height = browser.png_size(shot)
    if os.environ.get("KP_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, SCREENSHOT)
    kept_width, kept_height = browser.png_size(SCREENSHOT)
    assert width == kept_width == browser.WIDTH
    assert abs(height - kept_height) <= 0.1 * kept_height, (height, kept_height)
    assert 0.5 < shot.stat().st_size / SCREENSHOT.stat().st_size < 2


def test_make_test_creates_the_venv_when_it_is_missing(tmp_path):
    """README: `make test` (like `make demo`) creates `.venv` when it is missing. A copy of
    the checkout with no .venv; make's own recipe runs (python -m venv, pip install -e
    '.[test,report]', compileall, the stamp), then the tests of the copy with that new venv.
    Offline: pip takes every package from the suite's own environment (on PYTHONPATH,
    no index, no build isolation), so nothing is downloaded."""
    import site

    copy = tmp_path / "checkout"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, copy / name)
    assert not (copy / ".venv").exists()
    packages = tmp_path / "packages"  # the suite's packages, less its own kimipipe install
    packages.mkdir()
    for entry in Path(site.getsitepackages()[0]).iterdir():
        if "kimipipe" not in entry.name and not entry.name.endswith(".pth"):
            (packages / entry.name).symlink_to(entry)
    env = {**os.environ, "PYTHONPATH": str(packages), "PIP_NO_INDEX": "1",
           "PIP_NO_BUILD_ISOLATION": "0"}
    env.pop("VENV", None)
    r = subprocess.run(["make", "-C", str(copy), "test", "PYTEST_JOBS=0",  # no nested workers
                        "PYTEST_ARGS=tests/test_io.py -p no:cacheprovider"],
                       capture_output=True, text=True, env=env, timeout=time_left())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "python3 -m venv .venv" in r.stdout and "pip install --quiet --no-compile -e '.[test,report]'" in r.stdout
    assert (copy / ".venv" / ".installed").exists()
    assert re.search(r"\d+ passed", r.stdout)
    for command in KP_COMMANDS:
        assert (copy / ".venv" / "bin" / f"kp-{command}").exists()
    where = subprocess.run([str(copy / ".venv" / "bin" / "python"), "-c",
                            "import kimipipe; print(kimipipe.__file__)"],
                           capture_output=True, text=True, env=env, check=True, cwd=tmp_path).stdout
    assert where.strip() == str(copy / "kimipipe" / "__init__.py")  # the copy, editable
    again = subprocess.run(["make", "-C", str(copy), "venv"], capture_output=True, text=True,
                           env=env, timeout=120)
    assert again.returncode == 0 and "pip install" not in again.stdout  # made once


def make_all_from(server, tmp_path, rows, turns):
    """`make all` of D1 with ROWS (ShareGPT records) as its source (tmp_path/s.json,
    rewritten: a source fixed under the same IDs), TURNS as given; it must succeed."""
    source = tmp_path / "s.json"
    source.write_text(json.dumps(rows))
    r = make(server, tmp_path, "all", SOURCE_D1=source, TURNS=turns)
    assert r.returncode == 0, r.stderr + r.stdout


def test_a_prompt_fixed_under_its_id_is_asked_again_and_only_its_new_answer_trained_on(
        standin, tmp_path):
    """A source fixed under the same IDs (one user turn corrected): make all asks that prompt
    again, once; its old answer stays in the responses file (paid for, in the spend) and
    its new answer's row replaces the old one's in the tokens file and the shards."""
    conversations = json.loads(SOURCE.read_text())[:8]
    server = standin(ledger=True, tokenizer=TOKENIZER)
    work, shards = tmp_path / "work", tmp_path / "shards" / "D1"
    make_all_from(server, tmp_path, conversations, "last")
    fixed = conversations[3]["id"]
    conversations[3]["conversations"][0]["value"] += " (fixed: in two sentences)"
    make_all_from(server, tmp_path, conversations, "last")
    assert len(server.ledger()) == 9  # the fixed prompt paid again, no other
    answers = read_jsonl(work / "D1.responses.jsonl")
    twice = [a for a in answers if a["id"] == fixed]
    assert len(answers) == 9 and len(twice) == 2
    assert twice[1]["messages"][-1]["content"].endswith("(fixed: in two sentences)")
    summary = json.loads((work / "D1.infer-summary.json").read_text())
    assert summary["spend_total"] == pytest.approx(sum(a["usage"]["cost"] for a in answers))
    tokens = read_jsonl(work / "D1.tokens.jsonl.zst")
    assert sorted(t["id"] for t in tokens) == sorted(c["id"] for c in conversations)
    new = next(t for t in tokens if t["id"] == fixed)
    assert new["generation_id"] == twice[1]["generation_id"]
    rows = {row["id"]: row for f in sorted(shards.glob("D1-*.jsonl.zst")) for row in read_jsonl(f)}
    assert sorted(rows) == sorted(c["id"] for c in conversations)
    assert rows[fixed]["input_ids"] == new["input_ids"] + new["output_ids"]


def test_a_conversation_fixed_under_its_id_is_asked_again_from_the_turn_that_changed(
        standin, tmp_path):
    """A source of three-turn conversations fixed under the same IDs: one conversation's
    opening message, another's second follow-up. make all asks the first again from turn 1
    and the second from turn 3 (on its turns 1 and 2, which still match), each turn once;
    the old turns stay in the responses file (paid for, in the spend), and the tokens file
    and the shards hold the current turns alone; another make all pays nothing."""
    conversations = [{"id": f"conv-{i}", "conversations": [
        {"from": "human", "value": f"Conversation {i}: what is {i} squared?"},
        {"from": "gpt", "value": "An answer."},
        {"from": "human", "value": f"And {i} cubed? ({i})"},
        {"from": "gpt", "value": "Another."},
        {"from": "human", "value": f"Now say it in words. ({i})"},
        {"from": "gpt", "value": "A third."}]} for i in range(4)]
    server = standin(ledger=True, tokenizer=TOKENIZER)
    work, shards = tmp_path / "work", tmp_path / "shards" / "D1"
    make_all_from(server, tmp_path, conversations, "all")
    assert len(server.ledger()) == 12
    before = (work / "D1.responses.jsonl").read_bytes()
    conversations[1]["conversations"][0]["value"] += " (fixed)"  # its opening: from turn 1
    conversations[2]["conversations"][4]["value"] += " (fixed)"  # its 2nd follow-up: turn 3
    make_all_from(server, tmp_path, conversations, "all")
    assert len(server.ledger()) == 12 + 4  # the re-asked turns paid, no other
    raw = (work / "D1.responses.jsonl").read_bytes()
    answers = read_jsonl(work / "D1.responses.jsonl")
    assert raw.startswith(before) and len(answers) == 16  # the old turns stay
    new = answers[12:]
    assert sorted(a["id"] for a in new) == ["conv-1#1", "conv-1#2", "conv-1#3", "conv-2#3"]
    assert new[0]["messages"][-1]["content"].endswith("(fixed)")
    summary = json.loads((work / "D1.infer-summary.json").read_text())
    assert summary["spend_total"] == pytest.approx(sum(a["usage"]["cost"] for a in answers))
    # the current turns: the old ones of conv-0 and conv-3, conv-1's new ones, conv-2's old
    # turns 1 and 2 with its new turn 3
    current = {a["id"]: a for a in answers[:12] if a["conversation"] in ("conv-0", "conv-3")
               or a["id"] in ("conv-2#1", "conv-2#2")}
    current.update({a["id"]: a for a in new})
    tokens = read_jsonl(work / "D1.tokens.jsonl.zst")
    assert sorted((t["id"], t["generation_id"]) for t in tokens) == sorted(
        (a["id"], a["generation_id"]) for a in current.values())
    rows = {}
    for f in sorted(shards.glob("D1-*.jsonl.zst")):
        for row in read_jsonl(f):
            assert row["id"] not in rows
            rows[row["id"]] = row
    assert sorted(rows) == sorted(current)
    for t in tokens:
        assert rows[t["id"]]["input_ids"] == t["input_ids"] + t["output_ids"]
    make_all_from(server, tmp_path, conversations, "all")  # the same source: nothing to pay
    assert len(server.ledger()) == 16 and len(read_jsonl(work / "D1.responses.jsonl")) == 16


def test_the_suites_make_runs_never_reinstall_the_venv_from_another_checkout(tmp_path):
    """The suite's make runs pass VENV= the running venv. From a checkout whose setup.cfg is
    newer than that venv's stamp (a git worktree; make mutants' scratch copy under /tmp),
    make used to reinstall the venv from that checkout, and every kp-* command afterwards
    imported a tree that was gone. With VENV_DEPS empty (conftest.py) the stamp is enough;
    without it (a user's make), a newer setup.cfg still remakes the venv."""
    copy = tmp_path / "checkout"
    copy.mkdir()
    for name in ("Makefile", "setup.cfg", "pyproject.toml"):
        shutil.copy2(REPO / name, copy / name)
        os.utime(copy / name)  # newer than any stamp
    dry = ["make", "-n", "-C", str(copy), "venv", f"VENV={VENV}"]
    assert os.environ.get("VENV_DEPS") == ""
    r = subprocess.run(dry, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "pip install" not in r.stdout, r.stdout + r.stderr
    user = {k: v for k, v in os.environ.items() if k != "VENV_DEPS"}
    r = subprocess.run(dry, capture_output=True, text=True, timeout=60, env=user)
    assert r.returncode == 0 and "pip install" in r.stdout, r.stdout + r.stderr
