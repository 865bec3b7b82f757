"""Every dollar billed is a dollar counted (issue 25): one definition of what a record
cost, read the same by every spend reader; answers without `usage.cost`; pricing
overrides; refused answers across the datasets of a build; the balance a normal key cannot
read. Through the command line, against the stand-in on loopback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import kp, write_jsonl
from test_infer import infer


def billed(server) -> float:
    return sum(x["cost"] for x in server.ledger())


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
    cost for a failure (before issue 25, --spent-in, make plan and the pilot left out every
    refused answer's cost)."""
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
    r = subprocess.run([sys.executable, "-m", "kimipipe.fullbuild", "plan", "--work", str(work),
                        "--datasets", "B3 B4", "--total-cost", "10", "--max-cost", "10",
                        "--spent-in", str(work / "*.responses.jsonl"),
                        "--spent-in", str(work / "*.failures.jsonl"), "--json", str(build)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    figures["make plan"] = json.loads(build.read_text())["recorded"]
    # the pilot's figures (make plan's measured cost per answer)
    pilot = tmp_path / "B3.pilot.json"
    r = subprocess.run([sys.executable, "-m", "kimipipe.fullbuild", "pilot", str(work / "B3.responses.jsonl"),
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
