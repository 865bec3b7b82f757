"""kp-infer's `--total-cost` (one cap over several outputs, `--spent-in`) and its sharing
between runs at the same time (`--reservations`), against the stand-in's bill."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import pytest
from conftest import BIN, read_jsonl
from helpers import billed, time_left
from test_infer import infer, make_prompts

from kimipipe.infer.total_cost import _proc_start
from kimipipe.kinds import Cap
from kimipipe.standin.answers import user_text_sha256

# Answers cut at 60 tokens cost close to their worst case, so a cap that is not shared is
# overshot by runs at the same time, and one that is shared is not.
TIGHT = ("--max-tokens", "60", "--concurrency", "8")



def read_reservations(path) -> dict:
    """The reservations file as its writers see it: read under the same flock(2) they hold
    while they rewrite it in place (pwrite then ftruncate), so a read never sees half a
    rewrite."""
    import fcntl
    import os
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        data = b""
        while chunk := os.pread(fd, 1 << 16, len(data)):
            data += chunk
    finally:
        os.close(fd)  # (closing releases the lock)
    return json.loads(data.split(b"\n", 1)[0])


def test_spend_recorded_in_other_files_counts_against_total_cost(standin, tmp_path):
    server = standin(ledger=True, price_scale=1000.0)
    work = tmp_path / "work"
    work.mkdir()
    a = make_prompts(work / "A.prompts.jsonl", 20, dataset="A")
    b = make_prompts(work / "B.prompts.jsonl", 60, dataset="B", start=100)
    r = infer(server, a, "-o", work / "A.responses.jsonl", *TIGHT)
    assert r.code == 0, r.stderr
    spent_a = sum(x["usage"]["cost"] for x in read_jsonl(work / "A.responses.jsonl"))
    assert billed(server) == pytest.approx(spent_a)
    # a failures file's paid cost counts too; a glob may match this run's own files (counted once)
    (work / "A.failures.jsonl").write_text(json.dumps(
        {"id": "x", "dataset": "A", "kind": "routing_violation", "status": 200, "code": "",
         "message": "", "attempts": 1, "time": "2026-01-01T00:00:00Z", "cost": 0.5}) + "\n")
    cap = spent_a + 0.5 + 1.0
    out, summary = work / "B.responses.jsonl", tmp_path / "s.json"
    flags = ("--total-cost", f"{cap}", "--spent-in", str(work / "*.responses.jsonl"),
             "--spent-in", str(work / "*.failures.jsonl"), "--failures", work / "B.failures.jsonl")
    plan = json.loads(infer(server, b, "--plan", "--json", "-o", out, *flags, *TIGHT).stdout)
    assert plan["total_cost"]["recorded"] == pytest.approx(spent_a + 0.5)
    assert sorted(plan["total_cost"]["spent_in"]) == sorted(
        [str(work / "A.responses.jsonl"), str(work / "A.failures.jsonl")])
    r = infer(server, b, "-o", out, "--summary-json", summary, *flags, *TIGHT)
    assert r.code == 3, r.stderr
    assert "--total-cost reached" in r.stderr
    s = json.loads(summary.read_text())
    assert s["stop_reason"] == "total-cost" and s["total_cost"] == pytest.approx(cap)
    spent_b = billed(server) - spent_a
    assert 0 < spent_b <= 1.0  # what was left under the cap, never more
    assert 0 < len(read_jsonl(out)) < 60
    # a rerun reads its own output again (through the glob too): still nothing more
    r = infer(server, b, "-o", out, *flags, *TIGHT)
    assert r.code == 3 and billed(server) - spent_a == pytest.approx(spent_b)


def test_spent_in_and_reservations_need_total_cost(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    r = infer(server, prompts, "--spent-in", tmp_path / "x.jsonl")
    assert r.code == 2 and "--spent-in needs --total-cost" in r.stderr
    r = infer(server, prompts, "--reservations", tmp_path / "res.json")
    assert r.code == 2 and "--reservations needs --total-cost" in r.stderr
    assert server.stats()["completions_started"] == 0


def start_infer(server, *args) -> subprocess.Popen:
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    return subprocess.Popen([str(BIN / "kp-infer"), "--base-url", server.base_url, "--backoff-base", "0.01",
                             "--quiet", *map(str, args)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def run_together(server, tmp_path, cap, shared: bool) -> tuple[list[int], dict[str, str]]:
    """Three runs at the same time on three datasets under one --total-cost; two requests in
    flight each at most, so that none can take the whole cap for itself."""
    work = tmp_path / ("shared" if shared else "alone")
    work.mkdir()
    owner = {}
    procs = []
    for k, name in enumerate("XYZ"):
        prompts = make_prompts(work / f"{name}.prompts.jsonl", 40, dataset=name, start=1000 * (k + 1))
        owner.update({user_text_sha256(p["messages"]): name for p in read_jsonl(prompts)})
        args = [prompts, "-o", work / f"{name}.responses.jsonl", "--total-cost", f"{cap}",
                "--spent-in", work / "*.responses.jsonl", "--max-tokens", "60", "--concurrency", "2"]
        if shared:
            args += ["--reservations", work / "total-cost.json"]
        procs.append(start_infer(server, *args))
    # the stand-in holds every completion until all three runs have sent theirs (two in
    # flight each): they then run at the same time however the machine schedules them
    deadline = time.monotonic() + 120
    while server.stats()["held"] < 6:
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
        time.sleep(0.02)
    server.configure(hold_after=None)
    codes = [p.wait(timeout=time_left()) for p in procs]
    return codes, owner


def test_runs_at_the_same_time_share_the_total_cost_and_never_exceed_it(standin, tmp_path):
    """Three kp-infer runs start together under --total-cost 4: sharing --reservations, the
    stand-in's bill stays under 4, the runs overlap (their answers interleave in the bill),
    and each stops with exit 3. Without the shared file the same three overshoot: each
    only knows its own reservations."""
    server = standin(ledger=True, price_scale=1000.0, latency=1.0)
    server.configure(hold_after=0)
    codes, owner = run_together(server, tmp_path, 4.0, shared=True)
    assert codes == [3, 3, 3]
    ledger = server.ledger()
    assert billed(server) <= 4.0
    # the cap was used, not left idle: less than a worst case (~0.25) is left, plus what a
    # run counted twice at its start (spend written by another run before it was published)
    assert billed(server) > 3.0
    order = [owner[x["request_user_text_sha256"]] for x in ledger]
    assert len(set(order)) == 3
    assert sum(1 for a, b in zip(order, order[1:], strict=False) if a != b) >= 3  # they ran at the same time
    entries = json.loads((tmp_path / "shared" / "total-cost.json").read_text())["entries"]
    assert len(entries) == 3 and all(e["ended"] and e["claim"] == 0 for e in entries)
    assert sum(e["spent"] for e in entries) == pytest.approx(billed(server))

    server2 = standin(ledger=True, price_scale=1000.0, latency=1.0)
    server2.configure(hold_after=0)
    codes, _ = run_together(server2, tmp_path, 4.0, shared=False)
    assert billed(server2) > 4.0  # what the shared file prevents


def test_a_live_runs_claim_is_honoured_and_a_dead_runs_claim_is_dropped(standin, tmp_path):
    """Entries written by hand: a live run (a sleeping process of this host) holding a claim
    leaves this run only the rest of the cap, and it waits for that claim rather than stop;
    a dead run's claim counts nothing. When the sleeper dies, its claim goes and the run
    finishes."""
    server = standin(ledger=True, price_scale=1000.0)
    prompts = make_prompts(tmp_path / "p.jsonl", 30)
    shared = tmp_path / "total-cost.json"
    sleeper = subprocess.Popen(["sleep", "600"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    entries = [
        {"token": "live", "pid": sleeper.pid, "host": host, "proc_start": _proc_start(sleeper.pid),
         "label": "other", "spent": 0.0, "claim": 99.0, "ended": False},
        {"token": "dead", "pid": dead.pid, "host": host, "proc_start": "1", "label": "gone",
         "spent": 0.0, "claim": 1000.0, "ended": False},
    ]
    shared.write_text(json.dumps({"version": 1, "entries": entries}))
    out = tmp_path / "r.jsonl"
    proc = start_infer(server, prompts, "-o", out, "--total-cost", "100", "--reservations", shared, *TIGHT)
    try:
        deadline = time.monotonic() + 120
        while True:  # until this run has spent its room and gave back its claim: it is waiting
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the run never waited"
            own = [e for e in read_reservations(shared)["entries"] if e["label"] == str(out)]
            if own and own[0]["spent"] > 0 and own[0]["claim"] == 0 and billed(server) > 0.5:
                break
            time.sleep(0.05)
        assert billed(server) <= 1.0  # 100 - the live claim of 99: the dead claim counted nothing
        assert len(read_jsonl(out)) < 30
        gone = [e for e in read_reservations(shared)["entries"] if e["token"] == "dead"][0]
        assert gone["ended"] and gone["died"] and gone["claim"] == 0
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    assert len(read_jsonl(out)) == 30
    assert billed(server) <= 100


def test_a_request_found_to_fit_keeps_its_room_until_it_is_reserved(tmp_path):
    """Between finding that a request fits and reserving it, a run may wait for a
    concurrency slot; the claim it publishes meanwhile (every PUBLISH_INTERVAL) must still
    cover that request, or another run could take the same room. Two runs' budgets on one
    reservations file, in this process."""
    from kimipipe.infer.budget import Budget
    from kimipipe.infer.config import Money
    from kimipipe.infer.total_cost import ReservationFile, TotalCost
    from kimipipe.openrouter.routing import PriceBound

    path = str(tmp_path / "total-cost.json")
    runs = []
    for label in ("a", "b"):
        shared = ReservationFile(path, label)
        snapshot = shared.register()
        runs.append(Budget(Money(total_cost=1.5), 16384, PriceBound(1e-6, 1e-6, "test"),
                           total=TotalCost(1.5, -snapshot, shared)))
    a, b = runs
    assert a.cost_fits(1.0)  # a's next request fits; a waits for a slot before reserving it
    a.total.publish(a.spent_this_run, a.claimed(), force=True)  # a's publisher runs meanwhile
    assert not b.cost_fits(1.0)  # b cannot take that room
    a.reserve(1.0)
    a.record(0.25, 10)
    a.release(1.0)
    a.total.publish(a.spent_this_run, a.claimed(), force=True)  # settled: 0.25 spent, no claim
    assert b.cost_fits(1.0)
    entries = json.loads(open(path).read())["entries"]
    assert {e["label"]: (e["spent"], e["claim"]) for e in entries} == {"a": (0.25, 0.0), "b": (0.0, 1.0)}
    assert not b.cost_fits(1.3)  # 0.25 + 1.3 > 1.5


def _two_budgets(tmp_path, cap: float):
    from kimipipe.infer.budget import Budget
    from kimipipe.infer.config import Money
    from kimipipe.infer.total_cost import ReservationFile, TotalCost
    from kimipipe.openrouter.routing import PriceBound

    path = str(tmp_path / "total-cost.json")
    runs = []
    for label in ("a", "b"):
        shared = ReservationFile(path, label)
        snapshot = shared.register()
        runs.append(Budget(Money(total_cost=cap), 16384, PriceBound(1e-6, 1e-6, "test"),
                           total=TotalCost(cap, -snapshot, shared)))
    return runs


def test_a_refused_answers_cost_published_is_no_room_for_its_retry(tmp_path):
    """A refused answer is paid while its prompt keeps its worst case for the retry: the
    run's spend + claim grows past what the cap gave. Published as it is (the run's
    publisher writes its state every PUBLISH_INTERVAL), that growth must not become room:
    the retry fits only where the cap has it. (It once did: $0.23-0.66 under $0.08.)"""
    a, _b = _two_budgets(tmp_path, 1.0)
    assert a.cost_fits(0.9)
    a.reserve(0.9)
    a.record(0.3, 0)  # refused, paid; its 0.9 stays reserved for the retry: 1.2 committed
    a.total.publish(a.spent_this_run, a.claimed(), force=True)
    assert a.cap_left_no_room(0.0) is Cap.TOTAL_COST  # the retry: 0.3 + 0.9 > 1.0
    a.release(0.9)  # the prompt gives up its retry's reservation: 0.3 committed
    a.total.publish(a.spent_this_run, a.claimed(), force=True)
    assert a.cost_fits(0.7) and not a.cost_fits(0.71)


def test_a_look_that_finds_no_room_gives_none_to_the_next_look(tmp_path):
    """A refused answer paid (its retry's worst case still reserved) puts the run past what
    the cap gave it: its look for room finds none, and neither does the next one (each
    checked under the lock), however often the retry waiting for room looks; what is in
    flight stays claimed. (A look that took spend + claim for room let the second look
    through unchecked.)"""
    a, _b = _two_budgets(tmp_path, 1.0)
    assert a.cost_fits(0.9)
    a.reserve(0.9)
    a.record(0.3, 0)  # refused, paid; its 0.9 stays reserved for the retry: 1.2 committed
    for _look in range(3):
        assert a.cap_left_no_room(0.0) is Cap.TOTAL_COST
    entries = read_reservations(tmp_path / "total-cost.json")["entries"]
    assert [(e["spent"], e["claim"]) for e in entries] == [(pytest.approx(0.3), pytest.approx(0.9)),
                                                          (0.0, 0.0)]


def test_a_run_whose_prompts_all_wait_for_room_is_not_waited_for(tmp_path):
    """Two runs whose every prompt in progress waits for room (their claims free nothing
    while they wait) would wait for each other forever: a run publishes itself `stuck`,
    and the other sees no claim that may free room."""
    a, b = _two_budgets(tmp_path, 1.0)
    assert b.cost_fits(0.4)
    b.reserve(0.4)
    b.total.publish(b.spent_this_run, b.claimed(), force=True)
    a.total.publish(0.0, 0.0, force=True)  # a looks at the file
    assert a.total.others_may_free_room()
    b.total.publish(b.spent_this_run, b.claimed(), force=True, stuck=True)
    a.total.publish(0.0, 0.0, force=True)
    assert not a.total.others_may_free_room()
    entries = read_reservations(tmp_path / "total-cost.json")["entries"]
    assert [e.get("stuck") for e in entries] == [None, True]


def test_two_runs_at_the_cap_give_back_stale_claims_and_do_not_wait_for_each_other(tmp_path):
    """Two runs near the cap whose requests settled after their last publication (each
    polls the file every PUBLISH_INTERVAL, which keeps its publisher quiet): a look that
    finds no room still brings the run's claim down to what it has in flight, so the other
    sees no claim that may free room and stops, instead of both waiting forever on the
    other's stale claim (the two-runs test once hung 279 s so)."""
    a, b = _two_budgets(tmp_path, 1.2)
    for run in (a, b):  # each: 0.3 spent, a request of worst case 0.4 in flight, published
        assert run.cost_fits(0.4)
        run.reserve(0.4)
        run.record(0.3, 10)
        run.total.publish(run.spent_this_run, run.claimed(), force=True)
    for run in (a, b):  # the request settles at 0.25; nothing published yet
        run.record(0.25, 10)
        run.release(0.4)
    # a looks for room: none, even for nothing (0.55 + b's 0.3 spent + b's 0.4 claim > 1.2)
    assert a.cost_blocker(0.4) is Cap.TOTAL_COST
    # b looks: a's claim came down to what a has in flight (nothing): no room for a request,
    # and no claim elsewhere that may free any
    assert b.cost_blocker(0.4) is Cap.TOTAL_COST and not b.total.others_may_free_room()
    assert a.cost_blocker(0.4) is Cap.TOTAL_COST and not a.total.others_may_free_room()
    entries = read_reservations(tmp_path / "total-cost.json")["entries"]
    assert [e["claim"] for e in entries] == [0.0, 0.0]
    assert sum(e["spent"] for e in entries) == pytest.approx(1.1)  # under the cap


def test_a_run_that_becomes_stuck_says_so_though_it_just_looked_for_room(tmp_path):
    """A look for room (`cost_blocker`, every PUBLISH_INTERVAL while a prompt waits) counts
    as a publish; two runs whose prompts all wait for room each look every interval, so
    the publisher's quiet interval never came and neither run ever said it was stuck: both
    waited forever (seen at load, 1 run of the two-runs test in 4). A change of `stuck`
    goes out at once."""
    a, b = _two_budgets(tmp_path, 1.0)
    assert b.cost_fits(0.8)
    b.reserve(0.8)
    b.record(0.3, 0)  # refused and paid; its 0.8 stays reserved for the retry: 1.1
    b.total.publish(b.spent_this_run, b.claimed(), force=True)
    assert b.cost_blocker(0.0) is Cap.TOTAL_COST  # b's admission looks: no room (just now)
    b.total.publish(b.spent_this_run, b.claimed(), stuck=True)  # its publisher, not forced
    a.total.publish(0.0, 0.0, force=True)
    assert not a.total.others_may_free_room()
    assert [e.get("stuck") for e in read_reservations(tmp_path / "total-cost.json")["entries"]] == [None, True]
