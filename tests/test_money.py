"""Every dollar billed is a dollar counted (docs/money.md): one definition of what a record
cost, read the same by every spend reader; answers without `usage.cost`; pricing
overrides; refused answers across the datasets of a build; the balance a normal key cannot
read. Through the command line, against the stand-in on loopback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import kp, read_jsonl, write_jsonl
from helpers import CAPS, billed, cap_reached
from test_infer import infer, make_prompts


# -- (e) every spend reader agrees ----------------------------------------------------------
def _answer(rid: str, dataset: str, cost: float, refused: list[float]) -> dict:
    return {"id": rid, "dataset": dataset, "messages": [{"role": "user", "content": f"q {rid}"}],
            "response": {"content": "a", "reasoning": "r"}, "finish_reason": "stop",
            "model": "moonshotai/kimi-k2.5", "provider": "Together", "generation_id": f"gen-{rid}",
            "usage": {"prompt_tokens": 10, "completion_tokens": 20, "reasoning_tokens": 5, "cost": cost},
            "attempts": 1 + len(refused),
            "refused": [{"kind": "no_reasoning", "provider": "DeepInfra", "cost": c,
                         "generation_id": f"gen-{rid}-{i}", "message": "none came back"}
                        for i, c in enumerate(refused)]}


def _failure(rid: str, dataset: str, refused: list[float]) -> dict:
    return {"id": rid, "dataset": dataset, "kind": "no_reasoning", "status": 200, "code": "200",
            "message": "reasoning was asked for and none came back", "attempts": len(refused),
            "time": "2026-12-01T00:00:00Z", "provider": "DeepInfra", "generation_id": f"gen-{rid}",
            "cost": sum(refused),
            "refused": [{"kind": "no_reasoning", "provider": "DeepInfra", "cost": c} for c in refused]}


def _dataset(work, name: str, answers: list[tuple[float, list[float]]],
             failures: list[list[float]]) -> float:
    """WORK/NAME.{prompts,responses,failures}.jsonl; what its records cost by hand."""
    prompts, responses, failed = [], [], []
    for i, (cost, refused) in enumerate(answers):
        responses.append(_answer(f"{name}-a{i}", name, cost, refused))
    for i, refused in enumerate(failures):
        failed.append(_failure(f"{name}-f{i}", name, refused))
    for rec in responses + failed:
        prompts.append({"id": rec["id"], "dataset": name, "messages": [{"role": "user", "content": f"q {rec['id']}"}]})
    prompts.append({"id": f"{name}-todo", "dataset": name, "messages": [{"role": "user", "content": "still to do"}]})
    write_jsonl(work / f"{name}.prompts.jsonl", prompts)
    write_jsonl(work / f"{name}.responses.jsonl", responses)
    write_jsonl(work / f"{name}.failures.jsonl", failed)
    return sum(c + sum(r) for c, r in answers) + sum(sum(r) for r in failures)


def test_every_spend_reader_counts_the_same_files_the_same(standin, tmp_path):
    """Resume, --spent-in, --total-cost, make plan, the pilot's figures and kp-infer report,
    given the same files, give the same figure: usage.cost + refused[].cost for a response,
    cost for a failure (a reader that left out the refused answers' cost would let the
    caps pass what was billed)."""
    server = standin()
    work = tmp_path / "work"
    work.mkdir()
    b3 = _dataset(work, "B3", [(0.01, [0.002, 0.003]), (0.02, []), (0.005, [0.0015])], [[0.004, 0.001]])
    b4 = _dataset(work, "B4", [(0.03, [0.006]), (0.001, [])], [[0.0025]])
    b5 = _dataset(work, "B5", [(0.007, [0.0005, 0.0007])], [[0.0009]])  # not in the build's DATASETS
    spent_in = ("--spent-in", str(work / "*.responses.jsonl"), "--spent-in", str(work / "*.failures.jsonl"))

    def plan(name, *flags):
        r = infer(server, work / f"{name}.prompts.jsonl", "-o", work / f"{name}.responses.jsonl",
                  "--failures", work / f"{name}.failures.jsonl", "--plan", "--json", *flags)
        assert r.code == 0, r.stderr
        (work / f"{name}.plan.json").write_bytes(r.stdout)
        return json.loads(r.stdout)

    figures = {}
    # resume: what this dataset's own files hold (kp-infer's previous work)
    figures["resume B3"] = plan("B3")["recorded"]["spend"]
    # --total-cost with --spent-in: the own files and the other dataset's
    figures["--total-cost B3 + --spent-in B4 B5"] = plan("B3", "--total-cost", "10", *spent_in)["total_cost"]["recorded"]
    figures["--spent-in alone"] = plan("B4", "--total-cost", "10", *spent_in)["total_cost"]["recorded"]
    plan("B4")
    # make plan: the build's recorded spend, from each dataset's plan and the --spent-in files
    build = tmp_path / "build.json"
    r = subprocess.run([sys.executable, "-m", "kimipipe.make", "plan", "--work", str(work),
                        "--datasets", "B3 B4", "--total-cost", "10", "--max-cost", "10",
                        "--spent-in", str(work / "*.responses.jsonl"),
                        "--spent-in", str(work / "*.failures.jsonl"), "--json", str(build)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    figures["make plan"] = json.loads(build.read_text())["recorded"]
    # the pilot's figures (make plan's measured cost per answer)
    pilot = tmp_path / "B3.pilot.json"
    r = subprocess.run([sys.executable, "-m", "kimipipe.make", "pilot", str(work / "B3.responses.jsonl"),
                        "--failures", str(work / "B3.failures.jsonl"), "-o", str(pilot)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    figures["pilot B3"] = json.loads(pilot.read_text())["spend"]
    # kp-infer report
    r = kp("infer", "report", work / "B3.responses.jsonl", work / "B3.failures.jsonl", "--json")
    assert r.code == 0, r.stderr
    figures["report B3"] = json.loads(r.stdout)["spend"]
    r = kp("infer", "report", *sorted(work.glob("*.responses.jsonl")),
           *sorted(work.glob("*.failures.jsonl")), "--json")
    assert r.code == 0, r.stderr
    figures["report all"] = json.loads(r.stdout)["spend"]

    every = b3 + b4 + b5
    expected = {"resume B3": b3, "--total-cost B3 + --spent-in B4 B5": every,
                "--spent-in alone": every, "make plan": every, "pilot B3": b3,
                "report B3": b3, "report all": every}
    assert figures == pytest.approx(expected, abs=1e-9)


# -- the stand-in bills like the service (item 5) ---------------------------------------
def _complete(server, i: int, stream: bool, only: str = "together") -> tuple[dict | None, str, str | None]:
    """(the answer's usage or None, its generation id, its finish_reason)."""
    import httpx

    body = {"model": "moonshotai/kimi-k2.5", "messages": [{"role": "user", "content": f"question {i}"}],
            "max_tokens": 400, "stream": stream, "provider": {"only": [only]}}
    r = httpx.post(server.base_url + "/chat/completions", json=body,
                   headers={"Authorization": f"Bearer {server.api_key}"}, timeout=30)
    assert r.status_code == 200
    if not stream:
        data = r.json()
        return data.get("usage"), r.headers["X-Generation-Id"], data["choices"][0]["finish_reason"]
    usage = finish = None
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                finish = choice.get("finish_reason") or finish
    return usage, r.headers["X-Generation-Id"], finish


def test_the_stand_in_bills_overrides_discounts_and_hides_costs_as_told(standin):
    import httpx
    import openrouter.operations as orop
    from test_conformance import conforms

    server = standin(ledger=True, price_overrides={"together": (4, 5)}, discounts={"parasail": 0.25},
                     no_cost=0.4, no_usage=0.2, generation_delay=30)
    doc = httpx.get(server.base_url + "/models/moonshotai/kimi-k2.5/endpoints").json()
    conforms(orop.ListEndpointsResponse, doc)  # the SDK's PricingOverride and discount
    pricing = {e["tag"]: e["pricing"] for e in doc["data"]["endpoints"]}
    assert pricing["together"]["overrides"] == [{"prompt": "2e-06", "completion": "1.12e-05",
                                                 "min_prompt_tokens": 5}]
    assert pricing["together"]["prompt"] == "5e-07" and pricing["parasail"]["discount"] == 0.25
    shown = []
    for i in range(20):
        usage, gen_id, _ = _complete(server, i, stream=bool(i % 2))
        shown.append("none" if usage is None else "cost" if "cost" in usage else "no_cost")
        billed_line = next(x for x in server.ledger() if x["generation_id"] == gen_id)
        # the prompt (over 5 tokens) is billed at the override: 4x the base prices
        assert billed_line["cost"] == pytest.approx(billed_line["prompt_tokens"] * 2e-6
                                                    + billed_line["completion_tokens"] * 1.12e-5)
        if usage is not None and "cost" in usage:
            assert usage["cost"] == pytest.approx(billed_line["cost"])
        # /generation has it only after --generation-delay
        r = httpx.get(server.base_url + "/generation", params={"id": gen_id},
                      headers={"Authorization": f"Bearer {server.api_key}"})
        assert r.status_code == 404
    assert {"cost", "no_cost", "none"} <= set(shown)
    usage, gen_id, _ = _complete(server, 99, stream=False, only="parasail")
    line = server.ledger()[-1]
    assert line["cost"] == pytest.approx(0.75 * (line["prompt_tokens"] * 5.5e-7 + line["completion_tokens"] * 2.7e-6))
    server.configure(generation_delay=0)
    r = httpx.get(server.base_url + "/generation", params={"id": gen_id},
                  headers={"Authorization": f"Bearer {server.api_key}"})
    assert r.status_code == 200 and r.json()["data"]["total_cost"] == pytest.approx(line["cost"])


def test_zero_completion_answers_are_not_billed(standin):
    server = standin(ledger=True, faults={"zero": 1.0})
    for i, stream in enumerate((False, True)):
        usage, gen_id, finish = _complete(server, i, stream)
        assert usage["completion_tokens"] == 0 and usage["cost"] == 0 and finish is None
    assert server.ledger() == [] and server.stats()["charged"] == 0 and server.stats()["total_usage"] == 0


# -- (a) --max-cost holds with half the answers showing no cost -----------------------------
def _recorded(*paths) -> float:
    """What the files record, by the one definition (records.record_cost)."""
    from kimipipe.records import record_cost

    total = 0.0
    for path in paths:
        if path.exists():
            for rec in read_jsonl(path):
                usage = rec.get("usage")
                total += record_cost(None if usage is None else usage["cost"],
                                     (r["cost"] for r in rec.get("refused", ())), rec.get("cost", 0.0))
    return total


@pytest.mark.parametrize("cap", list(CAPS))
def test_each_cap_holds_when_half_the_answers_show_no_cost_in_a_run_and_a_rerun(standin, tmp_path, cap):
    """Half the answers' usage has no `cost` (it is in /generation only, after a delay):
    each is booked at its estimate at once, its real figure read and written into its
    record. Booked as $0 instead, they let --max-cost 0.03 bill 0.0583."""
    server = standin(ledger=True, price_scale=5, no_cost=0.5, generation_delay=0.3)
    prompts = make_prompts(tmp_path / "p.jsonl", 40)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    flags = ("-o", out, *CAPS[cap](tmp_path, 0.03), "--max-tokens", "200", "--concurrency", "4",
             "--summary-json", summary)
    r = infer(server, prompts, *flags)
    assert r.code == 3 and cap_reached(cap) in r.stderr, r.stderr
    assert billed(server) <= 0.03
    records = read_jsonl(out)
    by_id = {x["generation_id"]: x["cost"] for x in server.ledger()}
    # every dollar billed is a dollar counted: each record holds its generation's bill
    assert sorted(by_id) == sorted(x["generation_id"] for x in records)
    for rec in records:
        assert rec["usage"]["cost"] == pytest.approx(by_id[rec["generation_id"]])
    sources = {rec["cost_source"] for rec in records}
    assert sources == {"usage", "generation"}
    s = json.loads(summary.read_text())
    assert s["costs"]["generation"] == sum(rec["cost_source"] == "generation" for rec in records) > 0
    assert s["costs"]["usage"] + s["costs"]["generation"] == len(records) and s["costs"]["estimate"] == 0
    assert s["spend_total"] == pytest.approx(billed(server))
    assert "looked up (GET /generation" in r.stderr
    # read over the completions' own client and connections (openrouter/client.py)
    assert set(server.stats()["user_agents"]["generation"]) == {"kimipipe"}
    # the rerun of the same command reads those figures back: the cap still holds
    r = infer(server, prompts, *flags)
    assert r.code == 3, r.stderr
    assert billed(server) <= 0.03 and _recorded(out) == pytest.approx(billed(server))


def test_an_answer_whose_cost_never_shows_is_booked_at_its_highest_price(standin, tmp_path):
    """No figure in time (/generation 404s past --cost-lookup-wait), or no usage at all:
    the record keeps the estimate (usage tokens at the price bound; no usage: the worst
    case), never less than the bill; the cap holds on those estimates."""
    server = standin(ledger=True, price_scale=5, no_cost=0.3, no_usage=0.3, generation_delay=3600)
    summary = tmp_path / "s.json"
    estimates, records = [], []
    for half, stream in ((0, "--stream"), (1, "--no-stream")):  # each its own output and cap
        part, out = make_prompts(tmp_path / f"p{half}.jsonl", 15, start=15 * half), tmp_path / f"r{half}.jsonl"
        before = billed(server)
        r = infer(server, part, "-o", out, "--max-cost", "0.03", "--max-tokens", "400",
                  "--cost-lookup-wait", "0.3", "--summary-json", summary, stream)
        # 15 answers book ~$0.04-0.05 here (their estimates are overcounts): the cap binds
        assert r.code == 3 and "--max-cost reached" in r.stderr, r.stderr
        assert billed(server) - before <= 0.03
        estimates.append(json.loads(summary.read_text())["costs"]["estimate"])
        records += read_jsonl(out)
    by_id = {x["generation_id"]: x for x in server.ledger()}
    assert sorted(by_id) == sorted(x["generation_id"] for x in records)
    estimated = [rec for rec in records if rec["cost_source"] == "estimate"]
    assert estimated and {rec["cost_source"] for rec in records} == {"usage", "estimate"}
    for rec in records:
        bill = by_id[rec["generation_id"]]["cost"]
        if rec["cost_source"] == "usage":
            assert rec["usage"]["cost"] == pytest.approx(bill)
        else:
            assert rec["usage"]["cost"] >= bill  # an overcount, never an undercount
    # a stream with no usage at all: booked at its worst case (prompt bound and --max-tokens)
    assert any(rec["usage"]["completion_tokens"] == 0 and rec["usage"]["cost"] >= 400 * 3e-6 * 5
               for rec in estimated)
    assert estimates[0] > 0 and estimates[1] > 0  # streamed and not


# -- (b) --max-cost holds when an override bills 4x the base price --------------------------
def test_max_cost_holds_when_a_pricing_override_bills_four_times_the_base(standin, tmp_path):
    """One of the two allowed providers bills an override at 4x its base prices. A bound at
    the base prices instead lets --max-cost 0.02 bill 0.0258."""
    server = standin(ledger=True, price_overrides={"together": 4}, latency=0.2)
    prompts = make_prompts(tmp_path / "p.jsonl", 60)
    out = tmp_path / "r.jsonl"
    # answers cut at --max-tokens bill near their worst case: the bound must be the override's
    flags = ("--only-provider", "together", "--only-provider", "parasail", "--max-cost", "0.02",
             "--max-tokens", "150", "--concurrency", "16")
    r = infer(server, prompts, "-o", out, *flags)
    assert r.code == 3 and "--max-cost reached" in r.stderr, r.stderr
    assert {x["provider"] for x in server.ledger()} == {"Together", "Parasail"}
    assert billed(server) <= 0.02
    assert _recorded(out) == pytest.approx(billed(server))
    # --plan says which override sets the bound
    plan = infer(server, prompts, "--plan", *flags)
    assert plan.code == 0, plan.stderr
    assert "set by a pricing override: prompt $2/M by together pricing.overrides[0]" in plan.stdout.decode()
    assert "completion $11.2/M by together pricing.overrides[0]" in plan.stdout.decode()


@pytest.mark.parametrize("cap", ["max-cost", "total-cost", "total-cost-shared"])
def test_a_cost_cap_that_leaves_no_room_for_a_refused_answers_retry_fails_no_prompt(standin, tmp_path, cap):
    """Parasail, the cheaper of the two allowed (so --sort price asks it first), drops every
    answer's reasoning: each answer refused (paid for) and the prompt sent to Together. With
    --max-cost 1.5 request worst cases and answers cut at --max-tokens (billed near their
    worst case), the first prompt's second attempt cannot fit: that is the cap's stop (exit
    3, resumable), the paid refusal kept on a `stopped` line, no prompt failed; a rerun
    with room sends it again."""
    server = standin(ledger=True, drop_reasoning={"parasail": 1.0})
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    out, failures, summary = tmp_path / "r.jsonl", tmp_path / "f.jsonl", tmp_path / "s.json"
    flags = ("--only-provider", "together", "--only-provider", "parasail", "--sort", "price",
             "--max-tokens", "40", "--concurrency", "1", "--failures", failures)
    plan = infer(server, prompts, "--plan", "--json", *flags)
    assert plan.code == 0, plan.stderr
    usd = 1.5 * json.loads(plan.stdout)["cost"]["worst_case_request"]
    option = "--" + cap.removesuffix("-shared")
    limit = (option, f"{usd:.8f}", *(("--reservations", tmp_path / "total-cost.json")
                                      if cap.endswith("-shared") else ()))
    r = infer(server, prompts, "-o", out, *limit, "--summary-json", summary, *flags)
    assert r.code == 3 and f"{option} reached" in r.stderr, r.stderr
    [line] = read_jsonl(failures)
    assert line["kind"] == "stopped" and line["message"].startswith("no_reasoning: "), line
    assert [x["provider"] for x in line["refused"]] == ["Parasail"]
    s = json.loads(summary.read_text())
    assert s["failed"] == {"stopped": 1} and s["stop_reason"] == option[2:]
    assert "permanent failure" not in r.stderr and "1 not sent again" in r.stderr
    assert billed(server) <= usd
    assert _recorded(out, failures) == pytest.approx(billed(server))
    # a rerun with room sends it again (the failures file is no "done"), and fails none
    r = infer(server, prompts, "-o", out, "--max-cost", "1", *flags)
    assert r.code == 0, r.stderr
    assert sorted(x["id"] for x in read_jsonl(out)) == sorted(x["id"] for x in read_jsonl(prompts))


# -- (c) TOTAL_COST across three datasets while a provider drops reasoning ------------------
def test_total_cost_holds_across_three_datasets_with_answers_refused_for_no_reasoning(standin, tmp_path):
    """Three datasets built one after the other, as the Makefile runs kp-infer (--total-cost
    with the --spent-in globs and --reservations); Together drops the reasoning from most
    answers, each refused and paid for. A --spent-in that left those costs out lets
    TOTAL_COST=0.065 bill 0.0653. Each run's code is the one right one: B3 (~$0.036) fits
    with the 4 worst cases it may have in flight (~$0.023) and finishes (0); B4's 20 first
    attempts alone cost more than the room left, so the cap stops it (3); B5 has none (3)."""
    server = standin(ledger=True, price_scale=4, drop_reasoning={"together": 0.9})
    work = tmp_path / "work"
    work.mkdir()
    spent_in = ("--spent-in", str(work / "*.responses.jsonl"), "--spent-in", str(work / "*.failures.jsonl"))
    codes = []
    for i, name in enumerate(("B3", "B4", "B5")):
        prompts = make_prompts(work / f"{name}.prompts.jsonl", 20, dataset=name, start=100 * i)
        r = infer(server, prompts, "-o", work / f"{name}.responses.jsonl",
                  "--failures", work / f"{name}.failures.jsonl", "--total-cost", "0.065", *spent_in,
                  "--reservations", work / "total-cost.json", "--max-tokens", "500", "--concurrency", "4",
                  "--only-provider", "together", "--only-provider", "parasail")
        codes.append(r.code)
        assert billed(server) <= 0.065, f"{name}: billed {billed(server):.4f}"
    assert codes == [0, 3, 3], r.stderr  # the cap stopped the build in B4
    files = sorted(work.glob("*.responses.jsonl")) + sorted(work.glob("*.failures.jsonl"))
    refused = sum(len(rec.get("refused", ())) for path in files for rec in read_jsonl(path))
    assert refused >= 5  # most of Together's answers were refused, each paid for
    assert _recorded(*files) == pytest.approx(billed(server))


# -- (d) a guard that cannot read the balance says so ---------------------------------------
def test_min_credits_with_a_normal_key_warns_once_what_the_key_cannot_read(standin, tmp_path):
    """A normal key (what most users have): /credits 403, /key without a limit. A guard that
    cannot read the balance guards nothing, and --min-credits 5 must say so."""
    server = standin(credits_mode="forbidden")
    prompts = make_prompts(tmp_path / "p.jsonl", 6)
    r = infer(server, prompts, "-o", tmp_path / "r.jsonl", "--min-credits", "5",
              "--credits-interval", "0.1", "--concurrency", "2")
    assert r.code == 0, r.stderr
    warnings = [x for x in r.stderr.splitlines() if "guards nothing" in x]
    assert warnings == ["kp-infer: warning: --min-credits 5 guards nothing: this key can read "
                        "neither the account's balance (/credits refused it: it needs a management "
                        "key) nor a credit limit (/key: the key has none); it can read its own usage "
                        "($0.0000, /key); a key with a credit limit (set on the key at "
                        "openrouter.ai/settings/keys; then /key gives limit_remaining), or a "
                        "management key, makes it work"]
    # without --min-credits there is no guard to warn about
    r = infer(server, prompts, "-o", tmp_path / "r2.jsonl")
    assert r.code == 0 and "guards nothing" not in r.stderr
    # a key with a limit makes the guard work: no warning
    server.configure(key_limit=50)
    r = infer(server, prompts, "-o", tmp_path / "r3.jsonl", "--min-credits", "5")
    assert r.code == 0 and "guards nothing" not in r.stderr
    server.configure(key_limit=None)
    # kp-credits says why it shows no balance, in the text form and beside the JSON record
    env = {"OPENROUTER_BASE_URL": server.base_url, "OPENROUTER_API_KEY": server.api_key}
    text = kp("credits", "--text", env=env)
    assert text.code == 0 and "remaining      unknown: this key can read neither" in text.stdout.decode()
    assert "a key with a credit limit" in text.stdout.decode()
    js = kp("credits", "--json", env=env)
    assert js.code == 0 and js.records()[0]["remaining"] is None
    assert "kp-credits: no balance to show: this key can read neither" in js.stderr


def test_make_check_warns_once_that_min_credits_guards_nothing_with_a_normal_key(standin, tmp_path):
    from test_make_build import run_make, write_sources

    server = standin(credits_mode="forbidden")
    variables = write_sources(tmp_path, {"A": 5})
    r = run_make(server, tmp_path, "check", MIN_CREDITS=5, **variables)
    assert r.returncode == 0, r.stdout + r.stderr
    said = (r.stdout + r.stderr).splitlines()
    assert [x for x in said if "guards nothing" in x] == [
        "check: ok: key and base URL: " + server.base_url + " answers (the balance is unknown); "
        "warning: MIN_CREDITS=5 guards nothing: this key can read neither the account's balance "
        "(/credits refused it: it needs a management key) nor a credit limit (/key: the key has "
        "none); it can read its own usage ($0.0000, /key); a key with a credit limit (set on the "
        "key at openrouter.ai/settings/keys; then /key gives limit_remaining), or a management "
        "key, makes it work"]
    r = run_make(server, tmp_path, "check", MIN_CREDITS="", **variables)
    assert r.returncode == 0 and "guards nothing" not in r.stdout + r.stderr


def test_preflight_settles_a_missing_cost_as_the_run_does(standin, tmp_path):
    server = standin(ledger=True, no_cost=1.0, generation_delay=0.2)
    prompts = make_prompts(tmp_path / "p.jsonl", 4)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out, "--preflight", "2", "--json")
    assert r.code == 0, r.stderr  # a cost read late is a warning, not a failed check
    report = json.loads(r.stdout)
    assert report["passed"] is True
    cost_checks = [c for c in report["checks"] if c["check"].endswith("cost")]
    assert len(cost_checks) == 2 and all(c["verdict"] == "warn" and "read from GET /generation" in c["detail"]
                                         for c in cost_checks)
    by_id = {x["generation_id"]: x["cost"] for x in server.ledger()}
    records = read_jsonl(out)
    assert len(records) == 2 and all(rec["cost_source"] == "generation" for rec in records)
    assert all(rec["usage"]["cost"] == pytest.approx(by_id[rec["generation_id"]]) for rec in records)
    assert report["spend"] == pytest.approx(sum(by_id.values()))
    # the preflight's requests and lookups are the run's client's (infer/transport.py)
    agents = server.stats()["user_agents"]
    assert agents["completions"] == {"kimipipe": 2} and set(agents["generation"]) == {"kimipipe"}
