"""The whole build's money under make, against the stand-in: `make plan` (figures by hand
from the stand-in's prices), `make pilot` then `make all` (no answer paid twice), one
TOTAL_COST over every dataset (also under -j3), `make all`'s refusal and ALLOW_SHORT,
`make check`, and make for humans (help, OPENROUTER_BASE_URL, sources, .gitignore)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import threading
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO, read_jsonl
from helpers import billed, smallest_hashes, time_left, wait_for
from test_make import SOURCE, TOKENIZER, VENV, make_command

from kimipipe.standin.answers import user_text_sha256

CONVERSATIONS = json.loads(SOURCE.read_text())
# the stand-in's Kimi K2.5 table, USD per token: the routes make allows by default
# (int4 and unknown, less fireworks and baseten) and the highest price of the whole table
ALLOWED = {"DeepInfra": (0.45e-6, 2.5e-6), "Parasail": (0.55e-6, 2.7e-6), "Together": (0.5e-6, 2.8e-6),
           "Moonshot AI": (0.6e-6, 3.0e-6)}
TOP = (0.6e-6, 3.0e-6)


def write_sources(tmp_path, sizes: dict[str, int]) -> dict[str, str]:
    """Disjoint slices of the bundled sample, one source file per dataset."""
    variables, start = {}, 0
    for name, n in sizes.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(CONVERSATIONS[start:start + n]))
        variables[f"SOURCE_{name}"] = path
        start += n
    return {"DATASETS": " ".join(sizes), **variables}


def single_turn(variables: dict) -> dict:
    """TURNS=last, for a test that tells prompts apart by the stand-in ledger's key, a
    request's last user text: under TURNS=all, conversations of the sample that share
    their first user turn would share it."""
    return {**variables, "TURNS": "last"}


def run_make(server, tmp_path, *args, env: dict | None = None, read_only: Path | None = None,
             seed_check: bool = True, **variables):
    """make against SERVER; MAX_COST (1 in test_make's settings) out of the way of TOTAL_COST.
    READ_ONLY: a directory make sees unwritable. Mode 0500 is enough for a normal user; root
    (CI) writes anywhere, so as root make runs in a mount namespace of its own where the
    directory is a read-only bind mount (EROFS for root too)."""
    variables = {"MAX_COST": 95, **variables}
    cmd, full_env = make_command(server, tmp_path, "--no-print-directory", *args,
                                 seed_check=seed_check, **variables)
    if read_only is not None and os.geteuid() == 0:
        cmd = ["unshare", "-m", "sh", "-c", 'mount --bind "$1" "$1" && mount -o remount,bind,ro '
               '"$1" && shift && exec "$@"', "sh", str(read_only), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, env={**full_env, **(env or {})},
                          timeout=time_left())


def prompts_of(tmp_path, name) -> list[dict]:
    return read_jsonl(tmp_path / "work" / f"{name}.prompts.jsonl")


def by_hand(rows: list[dict], scale: float, max_tokens: int) -> tuple[float, float, float]:
    """(prompt tokens per prompt as estimated, expected $ per answer at the prior, one
    request's worst case), from the prompts and the stand-in's prices."""
    n = len(rows)
    per_prompt = sum(len(m["content"].encode()) for p in rows for m in p["messages"]) / 4 / n + 16
    mean_in = sum(p for p, _ in ALLOWED.values()) / len(ALLOWED) * scale
    mean_out = sum(c for _, c in ALLOWED.values()) / len(ALLOWED) * scale
    cost = per_prompt * mean_in + max_tokens / 2 * mean_out
    bound = sum(64 + sum(len(m["content"].encode()) + 16 for m in p["messages"]) for p in rows) / n
    worst = bound * TOP[0] * scale + max_tokens * TOP[1] * scale
    return per_prompt, cost, worst


def largest_fitting(cost, total: float) -> int:
    """The largest whole t with cost(t) <= TOTAL, counted up one token at a time."""
    t = 0
    while cost(t + 1) <= total:
        t += 1
    return t


def three_digits(n: int) -> int:
    step = 10 ** max(0, len(str(n)) - 3)
    return n // step * step


def test_make_plan_for_three_datasets_by_hand(standin, tmp_path):
    """`make plan`: every figure recomputed here from the stand-in's price table; it sends
    no completion; it says what is assumed; the TOKEN_BUDGET that fits TOTAL_COST, evenly
    and by WEIGHT_<D>."""
    server = standin(price_scale=100.0, tokenizer=TOKENIZER)
    variables = write_sources(tmp_path, {"A": 30, "B": 40, "C": 50})
    # TURNS=last: one request per prompt, as by_hand counts them (conversations' growing
    # prompts: tests/test_infer_conversations.py)
    r = run_make(server, tmp_path, "plan", TOKEN_BUDGET="5k", TOTAL_COST=3, TURNS="last", **variables)
    assert r.returncode == 0, r.stderr
    assert server.stats()["completions_started"] == 0
    plan = json.loads((tmp_path / "work" / "build.plan.json").read_text())
    figures = {d["name"]: d for d in plan["datasets"]}
    assert {r["provider"] for r in plan["routes"]} == set(ALLOWED)
    assert plan["prices"]["allowed_mean"] == pytest.approx({"prompt": 0.525 * 100, "completion": 2.75 * 100})
    expected_to_go, worst = {}, {}
    for name, n in (("A", 30), ("B", 40), ("C", 50)):
        rows = prompts_of(tmp_path, name)
        assert len(rows) == n
        per_prompt, cost, worst[name] = by_hand(rows, 100.0, 1024)
        d = figures[name]
        assert (d["prompts"], d["todo"], d["answered"]) == (n, n, 0)
        assert d["prompt_tokens"] == pytest.approx(per_prompt, abs=0.0501)
        assert d["answer_tokens"] == 512 and d["measured"] is None  # the prior: half of MAX_TOKENS
        assert d["cost_per_answer"] == pytest.approx(cost, rel=1e-3)
        assert d["answers_to_go"] == math.ceil(5000 / 512) == 10  # prompts needed for TOKEN_BUDGET
        assert d["expected_to_go"] == pytest.approx(10 * cost, rel=1e-3)
        assert d["worst_case_request"] == pytest.approx(worst[name], rel=1e-4)
        expected_to_go[name] = 10 * cost
        row = next(line for line in r.stdout.splitlines() if line.split()[:2] == [name, "5k"])
        assert f"${10 * cost:,.2f}" in row
    room = max(worst.values())
    total = sum(expected_to_go.values())
    assert plan["expected_total"] == pytest.approx(total, rel=1e-3)
    assert plan["room_for_last_request"] == pytest.approx(room, rel=1e-4)
    assert total + room > 3 and not plan["fits"]
    # even split: the largest t tokens per dataset (ceil(t / 512) answers each) that fits
    cost = {d: figures[d]["cost_per_answer"] for d in "ABC"}
    t = largest_fitting(lambda t: sum(math.ceil(t / 512) * cost[d] for d in "ABC") + room, 3)
    assert t == 512 * math.floor((3 - room) / sum(cost.values()))
    assert plan["fitting_budgets"] == {d: three_digits(t) for d in "ABC"}
    assert "does NOT fit" in r.stdout
    assert f"TOKEN_BUDGET={three_digits(t) / 1000:g}k" in r.stdout
    assert "assumed (prior) for A B C: answers of half of MAX_TOKENS (512 tokens)" in " ".join(r.stdout.split())
    # a note every dataset shares (the routing's, the model's) is said once, naming them all
    said = " ".join(r.stdout.split())
    for note in ("token logprobs not asked", "names an allowed endpoint"):
        assert said.count(note) == 1 and re.search(rf"A, B, C: [^:]*{note}", said), note
    # weights: B gets twice the tokens of A and C
    r = run_make(server, tmp_path, "plan", TOKEN_BUDGET="5k", TOTAL_COST=3, WEIGHT_B=2, TURNS="last", **variables)
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "work" / "build.plan.json").read_text())
    t = largest_fitting(lambda t: sum(math.ceil(w * t / 512) * cost[d] for d, w in zip("ABC", (1, 2, 1),
                                                                                         strict=True)) + room, 3)
    assert plan["fitting_budgets"] == {"A": three_digits(t), "B": three_digits(2 * t), "C": three_digits(t)}
    assert f"TOKEN_BUDGET_B={three_digits(2 * t) / 1000:g}k" in r.stdout
    # too few prompts for TOKEN_BUDGET is shown, not a reason to refuse
    r = run_make(server, tmp_path, "plan", TOKEN_BUDGET="1M", TOTAL_COST=95, TURNS="last", **variables)
    plan = json.loads((tmp_path / "work" / "build.plan.json").read_text())
    assert plan["fits"] and all(d["short"] for d in plan["datasets"])
    assert "too few prompts, A: 30 prompts to do reach ~15.36k tokens of 1M" in " ".join(r.stdout.split())
    assert server.stats()["completions_started"] == 0


def test_make_plan_counts_requests_and_answers_in_one_unit(standin, tmp_path):
    """Conversations (TURNS=all): after a pilot, make plan's `requests` are every turn, and
    its `answered` the answers recorded, not the conversations done (54 against 62 once)."""
    server = standin(tokenizer=TOKENIZER)
    source = tmp_path / "A.json"  # 20 conversations of two user turns each
    source.write_text(json.dumps([{"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"Question {i}?"}, {"from": "gpt", "value": "(dropped)"},
        {"from": "human", "value": f"And then {i}?"}]} for i in range(20)]))
    variables = {"DATASETS": "A", "SOURCE_A": source}
    assert run_make(server, tmp_path, "pilot", PILOT=8, **variables).returncode == 0
    recorded = len(read_jsonl(tmp_path / "work" / "A.responses.jsonl"))
    requests = sum(1 + len(p.get("follow_ups", [])) for p in prompts_of(tmp_path, "A"))
    assert (requests, recorded) == (40, 16)  # every turn a request, one answer each
    r = run_make(server, tmp_path, "plan", **variables)
    assert r.returncode == 0, r.stderr
    [d] = json.loads((tmp_path / "work" / "build.plan.json").read_text())["datasets"]
    assert (d["prompts"], d["answered"]) == (requests, recorded)
    header = next(line for line in r.stdout.splitlines() if line.split()[:2] == ["dataset", "requests"])
    row = r.stdout.splitlines()[r.stdout.splitlines().index(header) + 1].split()
    assert row[:3] == ["A", str(requests), str(recorded)]


def test_make_pilot_then_make_all_pays_for_no_pilot_answer_twice(standin, tmp_path):
    server = standin(ledger=True, tokenizer=TOKENIZER)
    # TURNS=last: the ledger keys a request by its last user text (see single_turn)
    variables = single_turn(write_sources(tmp_path, {"A": 40, "B": 50}))
    r = run_make(server, tmp_path, "pilot", PILOT=12, **variables)
    assert r.returncode == 0, r.stderr
    assert "check: ok: tokenizer" in r.stdout  # the checks come first
    assert len(server.ledger()) == 24
    for name in "AB":
        answers = read_jsonl(tmp_path / "work" / f"{name}.responses.jsonl")
        ids = [p["id"] for p in prompts_of(tmp_path, name)]
        assert {x["id"] for x in answers} == smallest_hashes(ids, 12)
        pilot = json.loads((tmp_path / "work" / f"{name}.pilot.json").read_text())
        tokens = [x["usage"]["completion_tokens"] for x in answers]
        assert pilot["answers"] == 12
        assert pilot["completion_tokens"]["mean"] == pytest.approx(sum(tokens) / 12, abs=0.01)
        assert pilot["cost_per_answer"]["mean"] == pytest.approx(sum(x["usage"]["cost"] for x in answers) / 12)
        assert pilot["reasoning_share"] == pytest.approx(
            sum(x["usage"]["reasoning_tokens"] for x in answers) / sum(tokens), abs=1e-4)
        assert pilot["length_cut_share"] == sum(x["finish_reason"] == "length" for x in answers) / 12
        assert sum(pilot["providers"].values()) == pytest.approx(1, abs=0.01)
        assert not (tmp_path / "work" / f"{name}.responses.done").exists()
    r = run_make(server, tmp_path, "plan", **variables)
    assert r.returncode == 0 and "A (pilot: 12 answers (A.pilot.json))" in " ".join(r.stdout.split())
    # a preflight: PREFLIGHT requests per dataset with the run's flags, and one to each of
    # the four allowed providers (make passes TOKENIZER: identity checked), all kept
    r = run_make(server, tmp_path, "preflight", PREFLIGHT=2, **variables)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("preflight: passed") == 2 and "--preflight 2" in r.stdout
    assert r.stdout.count("same model and template") == 2 * 4 * 2  # (a check, a table row)
    assert [len(read_jsonl(tmp_path / "work" / f"{n}.responses.jsonl")) for n in "AB"] == [18, 18]
    r = run_make(server, tmp_path, "all", **variables)
    assert r.returncode == 0, r.stderr
    paid = Counter(x["request_user_text_sha256"] for x in server.ledger())
    every = [user_text_sha256(p["messages"]) for name in "AB" for p in prompts_of(tmp_path, name)]
    assert set(paid) == set(every) and set(paid.values()) == {1}  # each answer paid for once
    assert [len(read_jsonl(tmp_path / "work" / f"{n}.responses.jsonl")) for n in "AB"] == [40, 50]


def message_target(stderr: str) -> str:
    m = re.search(r"make all TOTAL_COST=([\d.]+)", stderr)
    assert m, stderr
    return m.group(1)


@pytest.mark.parametrize("jobs", ["-j1", "-j3"])
def test_total_cost_caps_the_whole_build_and_raising_it_finishes(standin, tmp_path, jobs):
    """TOTAL_COST below what three datasets cost: the stand-in's bill never exceeds it (with
    -j3 the datasets run at the same time and share one reservation file), the build stops
    with a money stop saying which datasets are complete and what TOTAL_COST would finish
    them; raising it to that and rerunning finishes every dataset."""
    server = standin(ledger=True, price_scale=200.0, latency=0.3 if jobs == "-j3" else None,
                     tokenizer=TOKENIZER)
    variables = single_turn(write_sources(tmp_path, {"A": 30, "B": 30, "C": 30}))
    first = ("all",)
    kwargs = dict(TOTAL_COST=4, ALLOW_SHORT=1, TOKEN_BUDGET="", CONCURRENCY=4, **variables)
    if jobs == "-j1":
        r = run_make(server, tmp_path, jobs, *first, **kwargs)
    else:
        # every answer held until more requests are in flight than one dataset's CONCURRENCY
        # allows: the datasets provably run at the same time, however slowly each starts
        server.configure(hold_after=0)
        done = []
        make = threading.Thread(target=lambda: done.append(run_make(server, tmp_path, jobs, *first, **kwargs)))
        make.start()
        try:
            wait_for(lambda: server.stats()["held"] > 4, "two datasets' requests in flight at once",
                     timeout=time_left())
        finally:
            server.configure(hold_after=None)
            make.join()
        r = done[0]
    assert r.returncode == 2  # make: a recipe failed (its message below)
    assert billed(server) <= 4
    assert "make: " in r.stderr and "stopped by TOTAL_COST=4 (the cap on the whole build" in r.stderr
    assert "complete: " in r.stderr and "not complete: " in r.stderr
    assert "--min-credits" not in r.stderr.split("stopped by TOTAL_COST")[1]
    stopped = [n for n in "ABC" if not (tmp_path / "work" / f"{n}.responses.done").exists()]
    assert stopped  # a money stop is never stamped done
    if jobs == "-j3":
        owner = {user_text_sha256(p["messages"]): n for n in "ABC" for p in prompts_of(tmp_path, n)}
        order = [owner[x["request_user_text_sha256"]] for x in server.ledger()]
        assert len(set(order)) >= 2  # the datasets ran at the same time
    target = message_target(r.stderr)
    r = run_make(server, tmp_path, jobs, "all", TOTAL_COST=target, TOKEN_BUDGET="", CONCURRENCY=4, **variables)
    assert r.returncode == 0, r.stderr[-3000:]
    assert billed(server) <= float(target)
    for n in "ABC":
        assert json.loads((tmp_path / "shards" / n / "kp-shard.manifest").read_text())["totals"]["records"] == 30
    paid = Counter(x["request_user_text_sha256"] for x in server.ledger())
    assert len(paid) == 90 and set(paid.values()) == {1}
    # all bought: a TOTAL_COST below what was spent refuses nothing, and buys nothing
    r = run_make(server, tmp_path, "all", TOTAL_COST=1, TOKEN_BUDGET="", CONCURRENCY=4, **variables)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "fits" in r.stdout and len(server.ledger()) == 90


def test_make_all_refuses_what_total_cost_cannot_pay_unless_allow_short(standin, tmp_path):
    server = standin(ledger=True, price_scale=100.0, tokenizer=TOKENIZER)
    variables = write_sources(tmp_path, {"A": 30, "B": 30})
    r = run_make(server, tmp_path, "all", TOKEN_BUDGET="10k", TOTAL_COST=2, **variables)
    assert r.returncode == 2  # make: a recipe failed (its message below)
    said = " ".join(r.stderr.split())
    assert "make all: refusing to start (nothing was sent): TOTAL_COST $2.00 cannot pay" in said
    assert "does NOT fit" in r.stdout and "make all: the plan" in r.stdout  # the plan is printed
    fix = re.search(r"make all TOKEN_BUDGET=(\S+)", r.stderr).group(1)
    assert server.stats()["completions_started"] == 0  # nothing was started
    assert not list((tmp_path / "work").glob("*.responses.jsonl"))
    # the TOKEN_BUDGET it names fits
    r = run_make(server, tmp_path, "plan", TOKEN_BUDGET=fix, TOTAL_COST=2, **{k: v for k, v in variables.items()})
    assert "against TOTAL_COST $2.00: fits" in r.stdout
    # ALLOW_SHORT=1 starts anyway, and TOTAL_COST still holds
    r = run_make(server, tmp_path, "all", TOKEN_BUDGET="10k", TOTAL_COST=2, ALLOW_SHORT=1, **variables)
    assert "ALLOW_SHORT=1: going ahead" in r.stderr
    assert server.stats()["completions_started"] > 0 and billed(server) <= 2


def test_make_check_finds_what_would_fail_later_before_any_money(standin, tmp_path):
    server = standin(ledger=True, tokenizer=TOKENIZER)
    variables = write_sources(tmp_path, {"A": 10})
    r = run_make(server, tmp_path, "check", seed_check=False, **variables)  # a first load
    assert r.returncode == 0, r.stdout + r.stderr
    assert [x.split(":")[2].strip() for x in r.stdout.splitlines() if x.startswith("check: ok")] == [
        "A", "tokenizer", "key and base URL", "outputs", "outputs"]

    def tokenizer_line(r):
        return next(x for x in r.stdout.splitlines() if x.startswith("check: ") and "tokenizer" in x)

    assert "not reloaded" not in tokenizer_line(r)
    # a tokenizer that loaded, unchanged since, is not loaded again; a changed one is
    copy = tmp_path / "tok"
    shutil.copytree(TOKENIZER, copy)
    first = run_make(server, tmp_path, "check", TOKENIZER=copy, **variables)
    again = run_make(server, tmp_path, "check", TOKENIZER=copy, **variables)
    assert "not reloaded" not in tokenizer_line(first) and first.returncode == 0
    assert tokenizer_line(again).startswith("check: ok: tokenizer: ") and "not reloaded" in tokenizer_line(again)
    (copy / "tokenizer_config.json").write_text("{")  # broken: the next check must see it
    r = run_make(server, tmp_path, "check", TOKENIZER=copy, **variables)
    assert r.returncode == 2 and tokenizer_line(r).startswith("check: FAILED: tokenizer")
    r = run_make(server, tmp_path, "check", TOKENIZER=copy, TOKENIZE_FLAGS="", **variables)
    assert r.returncode == 2 and "not reloaded" not in tokenizer_line(r)  # never remembered
    # a missing tokenizer and a missing source, a read-only output, a wrong key: all named
    # at once, and `make all` starts no completion (the tokenizer was found after all
    # inference had been paid, before)
    shards = tmp_path / "ro"
    shards.mkdir()
    shards.chmod(0o500)
    bad = {**variables, "TOKENIZER": tmp_path / "no-tokenizer", "DATASETS": "A Z", "SHARDS": shards}
    r = run_make(server, tmp_path, "check", env={"OPENROUTER_API_KEY": "sk-or-wrong"},
                 read_only=shards, **bad)
    assert r.returncode == 2, r.stderr  # make's own code for a failed recipe
    failed = [x for x in r.stdout.splitlines() if x.startswith("check: FAILED")]
    assert any("Z: no source file" in x and "SOURCE_Z" in x for x in failed)
    assert any("tokenizer:" in x and "no-tokenizer" in x for x in failed)
    assert any("key and base URL" in x and "401" in x for x in failed)
    assert any(f"{shards}/ cannot be written" in x for x in failed)
    assert "nothing was started" in r.stderr and "sk-or-wrong" not in r.stdout + r.stderr
    r = run_make(server, tmp_path, "all", TOKENIZER=tmp_path / "no-tokenizer", **variables)
    assert r.returncode == 2 and "no-tokenizer" in r.stdout
    assert server.stats()["completions_started"] == 0
    # the key: one refusal, no completion sent
    r = run_make(server, tmp_path, "all", env={"OPENROUTER_API_KEY": "sk-or-wrong"}, **variables)
    assert r.returncode == 2 and "refused the API key" in r.stdout
    assert server.stats()["completions_started"] == 0
    # a base URL nobody answers is named
    r = run_make(server, tmp_path, "check", BASE_URL="http://127.0.0.1:9/api/v1", **variables)
    assert r.returncode == 2 and "cannot reach OpenRouter at http://127.0.0.1:9/api/v1" in r.stdout


def test_make_honours_an_exported_openrouter_base_url(standin, tmp_path):
    server = standin(balance=0.5, tokenizer=TOKENIZER)
    cmd = ["make", "--no-print-directory", "-C", str(REPO), "credits", f"VENV={VENV}"]
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key, "OPENROUTER_BASE_URL": server.base_url}
    env.pop("BASE_URL", None)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"--base-url {server.base_url}" in r.stdout
    # a person reads it, even from a pipe (here): the text form, never raw JSON
    assert "  remaining      $0.5000\n" in r.stdout and "{" not in r.stdout


def test_bare_make_prints_help_and_starts_nothing(tmp_path):
    r = subprocess.run(["make", "--no-print-directory", "-C", str(REPO), f"WORK={tmp_path / 'work'}",
                        f"VENV={tmp_path / 'no-venv'}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for word in ("make plan", "make pilot", "make check", "make all", "TOTAL_COST=95", "ALLOW_SHORT",
                 "TOKEN_BUDGET=10M"):
        assert word in r.stdout
    assert not (tmp_path / "work").exists() and not (tmp_path / "no-venv").exists()
    again = subprocess.run(["make", "--no-print-directory", "-C", str(REPO), "help"], capture_output=True,
                           text=True, timeout=60)
    assert again.stdout == r.stdout.replace(f"WORK={tmp_path / 'work'}", "WORK=work")
    lines = again.stdout.splitlines()  # an 80x24 terminal shows it whole
    assert len(lines) <= 24 and max(len(line) for line in lines) <= 80


def test_prompts_are_remade_when_their_source_changes_and_the_stage_command_is_shown(standin, tmp_path):
    server = standin(tokenizer=TOKENIZER)
    variables = write_sources(tmp_path, {"A": 10})
    target = str(tmp_path / "work" / "A.prompts.jsonl")
    r = run_make(server, tmp_path, target, **variables)
    assert r.returncode == 0 and len(prompts_of(tmp_path, "A")) == 10
    stamp = os.stat(target).st_mtime_ns
    assert run_make(server, tmp_path, target, **variables).returncode == 0
    assert os.stat(target).st_mtime_ns == stamp  # not remade while its source is unchanged
    source = tmp_path / "A.json"
    source.write_text(json.dumps(CONVERSATIONS[:7]))
    os.utime(source, ns=(stamp + 10**9, stamp + 10**9))
    r = run_make(server, tmp_path, target, **variables)
    assert r.returncode == 0 and len(prompts_of(tmp_path, "A")) == 7
    r = run_make(server, tmp_path, "all", **variables)
    assert r.returncode == 0, r.stderr
    shown = [line for line in r.stdout.splitlines()  # (BIN: the venv's, or the suite's shims)
             if line.split(" ", 1)[0].endswith("/kp-infer")]
    assert len(shown) == 1 and "--total-cost 95" in shown[0] and "-o " in shown[0]


def test_build_outputs_are_ignored_by_git():
    names = ["work/B3.responses.jsonl", "shards/B3/kp-shard.manifest", "demo-out/work/x", "offline/work/x",
             "standin.port"]
    r = subprocess.run(["git", "check-ignore", *names], cwd=REPO, capture_output=True, text=True)
    assert r.stdout.split() == names


def test_a_stop_make_does_not_know_is_named_with_kp_infers_words(tmp_path):
    """The money-stop message reads kp-infer's summary: a stop reason it has no make
    variable for (a credit limit added later, a full disk) is named as kp-infer names it,
    and no summary at all (removed before each run) points at kp-infer's own message."""
    import sys

    work = tmp_path / "work"
    work.mkdir()
    summary = {"stop_reason": "max-cost", "spend_this_run": 0.5, "spend_total": 0.75}
    args = [sys.executable, "-m", "kimipipe.make", "stopped", "--dataset", "D", "--work", str(work),
            "--datasets", "D", "--max-cost", "0.75"]
    (work / "D.infer-summary.json").write_text(json.dumps(summary))
    said = " ".join(subprocess.run(args, capture_output=True, text=True).stderr.split())
    assert "make: D stopped by MAX_COST=0.75 (the cap per dataset, kp-infer exit 3): $0.5000 this run" in said
    (work / "D.infer-summary.json").write_text(json.dumps({**summary, "stop_reason": "some-new-limit"}))
    said = " ".join(subprocess.run(args, capture_output=True, text=True).stderr.split())
    assert "make: D stopped (kp-infer exit 3: money or a full disk): stop reason 'some-new-limit'" in said
    assert "D is not marked done" in said
    (work / "D.infer-summary.json").unlink()
    said = " ".join(subprocess.run(args, capture_output=True, text=True).stderr.split())
    assert "see kp-infer's message above; rerun make to resume" in said
