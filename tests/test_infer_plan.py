"""kp-infer's plan as a report (stdout, `--json`) and `--sample N`, through the command line
against the stand-in on loopback."""

from __future__ import annotations

import json
import re

import pytest
from conftest import read_jsonl
from helpers import endpoints_table, smallest_hashes
from test_infer import infer, make_prompts

from kimipipe.standin.answers import user_text_sha256


def plan_json(server, prompts, *flags) -> dict:
    r = infer(server, prompts, "--plan", "--json", *flags)
    assert r.code == 0, r.stderr
    assert "kp-infer" not in r.stdout.decode()  # nothing but the object on stdout
    return json.loads(r.stdout)


def test_plan_json_is_the_text_plans_figures_recomputed_by_hand(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 12)
    rows = read_jsonl(prompts)
    flags = ("--ignore-provider", "together", "--max-tokens", "1000", "--max-cost", "3")
    data = plan_json(server, prompts, *flags)
    table = endpoints_table(server)
    allowed = [e for e in table if e["quantization"] in ("int4", "unknown") and e["tag"] != "together"]
    mean_in = sum(float(e["pricing"]["prompt"]) for e in allowed) / len(allowed)
    mean_out = sum(float(e["pricing"]["completion"]) for e in allowed) / len(allowed)
    top_in = max(float(e["pricing"]["prompt"]) for e in table)
    top_out = max(float(e["pricing"]["completion"]) for e in table)
    n = len(rows)
    content_bytes = sum(len(m["content"].encode()) for p in rows for m in p["messages"])
    per_prompt = content_bytes / 4 / n + 16
    bound = sum(64 + sum(len(m["content"].encode()) + 16 for m in p["messages"]) for p in rows)

    assert data["model"] == "moonshotai/kimi-k2.5"
    assert data["prompts"] == {"input": n, "todo": n, "done": 0, "sample": None}
    assert data["prompt_tokens"]["estimated"] == round(per_prompt * n)
    assert data["prompt_tokens"]["bound"] == bound
    assert {r["provider"] for r in data["routes"] if r["allowed"]} == {e["provider_name"] for e in allowed}
    for route in data["routes"]:
        e = next(e for e in table if e["tag"] == route["tag"])
        assert route["prompt_price"] == pytest.approx(float(e["pricing"]["prompt"]) * 1e6)
        assert route["completion_price"] == pytest.approx(float(e["pricing"]["completion"]) * 1e6)
    assert data["prices"]["allowed_mean"] == pytest.approx({"prompt": mean_in * 1e6, "completion": mean_out * 1e6})
    assert data["prices"]["bound"] == {"prompt": pytest.approx(top_in * 1e6),
                                       "completion": pytest.approx(top_out * 1e6), "override": None}
    assert data["answer_tokens"] == {"expected": 500.0, "assumed": "half of --max-tokens 1000"}
    expected = n * (per_prompt * mean_in + 500 * mean_out)
    worst_request = bound / n * top_in + 1000 * top_out
    assert data["cost"]["expected"] == pytest.approx(expected, abs=1e-6)
    assert data["cost"]["worst_case"] == pytest.approx(n * worst_request, abs=1e-6)
    assert data["cost"]["worst_case_request"] == pytest.approx(worst_request, abs=1e-6)
    assert data["max_cost"] == 3 and data["total_cost"] is None
    # DeepInfra's FP4 variant shares its name with the allowed int4 endpoint, and an answer
    # names the provider, never the endpoint
    assert data["warnings"] == [
        "DeepInfra names an allowed endpoint (deepinfra) and an excluded variant (deepinfra/turbo); "
        "answers name the provider, never the endpoint, so DeepInfra's are kept marked "
        '"routing": "unverifiable" (sent in provider.ignore: deepinfra/turbo)']
    # the text plan says the same
    text = infer(server, prompts, "--plan", *flags)
    assert text.code == 0 and f"expected ~${expected:,.2f}" in text.stdout.decode()
    assert f"worst case ${n * worst_request:,.2f}" in text.stdout.decode()
    assert "cost estimate" not in text.stderr  # the report is on stdout, nothing of it on stderr
    assert server.stats()["completions_started"] == 0


def test_plan_json_needs_plan_and_shows_warnings_and_recorded_spend(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 10)
    r = infer(server, prompts, "--json")
    assert r.code == 2 and "--json goes with --plan" in r.stderr
    data = plan_json(server, prompts, "--quantization", "fp4")
    assert any("re-quantized" in w for w in data["warnings"])
    out = tmp_path / "r.jsonl"
    assert infer(server, prompts, "-o", out, "--partition", "1/2").code == 0
    answered = read_jsonl(out)
    # a torn last line (a run being written, or killed): the plan reads around it, never repairs
    with open(out, "ab") as f:
        f.write(b'{"id": "p9')
    before = out.read_bytes()
    data = plan_json(server, prompts, "-o", out)
    assert out.read_bytes() == before
    assert data["prompts"]["done"] == len(answered) and data["prompts"]["todo"] == 10 - len(answered)
    assert data["recorded"]["spend"] == pytest.approx(sum(x["usage"]["cost"] for x in answered))
    assert data["recorded"]["completion_tokens"] == sum(x["usage"]["completion_tokens"] for x in answered)


def test_sample_answers_the_prompts_of_smallest_id_hash_and_none_is_paid_twice(standin, tmp_path):
    """--sample N: the N prompts whose SHA-256 of id is smallest; a larger sample and then
    the full run resume from it: every prompt paid for once (the stand-in's ledger)."""
    server = standin(ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 40)
    rows = read_jsonl(prompts)
    ids = [p["id"] for p in rows]
    out = tmp_path / "r.jsonl"
    plan = plan_json(server, prompts, "--sample", "7")
    assert plan["prompts"]["todo"] == 7 and plan["prompts"]["sample"] == 7
    r = infer(server, prompts, "-o", out, "--sample", "7")
    assert r.code == 0, r.stderr
    assert {x["id"] for x in read_jsonl(out)} == smallest_hashes(ids, 7)
    r = infer(server, prompts, "-o", out, "--sample", "12")
    assert r.code == 0 and "5 done, 7 skipped" in r.stderr
    assert {x["id"] for x in read_jsonl(out)} == smallest_hashes(ids, 12)
    r = infer(server, prompts, "-o", out)
    assert r.code == 0 and "28 done, 12 skipped" in r.stderr
    paid = [x["request_user_text_sha256"] for x in server.ledger()]
    assert len(paid) == len(set(paid)) == 40
    assert set(paid) == {user_text_sha256(p["messages"]) for p in rows}
    # a sample larger than the input is the whole input; 0 is nothing
    assert plan_json(server, prompts, "--sample", "1000")["prompts"]["input"] == 40
    assert plan_json(server, prompts, "--sample", "0")["prompts"]["todo"] == 0




def test_plan_figures_are_the_documented_estimate_and_worst_case(standin, tmp_path):
    """--plan's expected and worst-case cost, recomputed by hand from the stand-in's price
    table: expected = prompts x (bytes/4 + 16 tokens at the allowed endpoints' mean prompt
    price + max_tokens/2 at their mean completion price); worst case = prompts x (the
    prompt token bound at the table's highest prompt price + max_tokens at its highest
    completion price). With --max-price-* the worst case takes the flags' prices."""
    server = standin(price_scale=1000.0)
    prompts = make_prompts(tmp_path / "p.jsonl", 10)
    rows = read_jsonl(prompts)
    table = endpoints_table(server)
    allowed = [e for e in table if e["quantization"] in ("int4", "unknown") and e["tag"] != "together"]
    n = len(rows)
    content_bytes = sum(len(m["content"].encode()) for p in rows for m in p["messages"])
    token_bound = sum(64 + sum(len(m["content"].encode()) + 16 for m in p["messages"]) for p in rows)
    mean_in = sum(float(e["pricing"]["prompt"]) for e in allowed) / len(allowed)
    mean_out = sum(float(e["pricing"]["completion"]) for e in allowed) / len(allowed)
    expected = n * ((content_bytes / 4 / n + 16) * mean_in + 1000 / 2 * mean_out)
    top_in = max(float(e["pricing"]["prompt"]) for e in table)
    top_out = max(float(e["pricing"]["completion"]) for e in table)
    worst = n * (token_bound / n * top_in + 1000 * top_out)

    def figures(*flags):
        r = infer(server, prompts, "--plan", "--ignore-provider", "together", "--max-tokens", "1000",
                  "--max-cost", "95", *flags)
        assert r.code == 0, r.stderr
        report = r.stdout.decode()  # the plan is a report: stdout
        m = re.search(r"cost estimate for (\d+) prompts: expected ~\$([\d,.]+) .*; worst case \$([\d,.]+)",
                      report)
        assert m, report
        verdicts = {line.split()[0]: line for line in report.splitlines() if line.startswith("  ")}
        return int(m.group(1)), float(m.group(2).replace(",", "")), float(m.group(3).replace(",", "")), verdicts

    todo, shown_expected, shown_worst, verdicts = figures()
    assert todo == n
    assert shown_expected == pytest.approx(expected, abs=0.006)
    assert shown_worst == pytest.approx(worst, abs=0.006)
    assert verdicts["Together"].rstrip().endswith("ignored")
    assert verdicts["Moonshot"].rstrip().endswith("allowed")  # the priciest, allowed here
    # --max-price-* (USD per million tokens) below the table's top prices bound the worst case
    cap_in, cap_out = top_in * 1e6 * 0.9, top_out * 1e6 * 0.95
    _, _, shown_worst, _ = figures("--max-price-prompt", f"{cap_in:g}", "--max-price-completion", f"{cap_out:g}")
    capped = n * (token_bound / n * float(f"{cap_in:g}") / 1e6 + 1000 * float(f"{cap_out:g}") / 1e6)
    assert shown_worst == pytest.approx(capped, abs=0.006)
    assert server.stats()["completions_started"] == 0



@pytest.mark.parametrize("cap", ["--max-cost", "--total-cost"])
def test_a_cap_below_one_requests_worst_case_is_refused_before_anything_is_sent(standin, tmp_path, cap):
    """A cap below the largest prompt's worst case could never send it: refused at the start
    (exit 2, one line naming the worst case, the cap that fits and the --max-tokens that
    fits), not run into a "cap reached" stop; --plan warns the same. Each way out it names
    then passes the check."""
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    out = tmp_path / "r.jsonl"
    r = infer(server, prompts, "-o", out, cap, "0.0001", "--quiet")
    assert r.code == 2
    [line] = r.stderr.splitlines()
    m = re.fullmatch(
        rf"kp-infer: {cap} \$0\.0001 is less than one request's worst case, \$([\d.]+) \(the "
        r"input's largest prompt, at most (\d+) tokens, at \$[\d.]+/M, and --max-tokens 16,384 "
        r"at \$[\d.]+/M\): that request could never be sent; raise "
        rf"{cap} to \$([\d.]+) or more, or lower --max-tokens to (\d+) or less", line)
    assert m, line
    worst, need, fits = float(m[1]), float(m[3]), int(m[4])
    assert worst > 0.0001 and need >= worst and 1 <= fits < 16384
    assert server.stats()["completions_started"] == 0 and not out.exists()
    plan = infer(server, prompts, "-o", out, cap, "0.0001", "--plan")
    text = plan.stdout.decode()
    assert plan.code == 0 and f"warning: {line.removeprefix('kp-infer: ')}" in text
    assert "not one request fits under it" in text
    # what it names fits: the cap it asks for, or the --max-tokens it names under this cap
    for way_out in ([cap, str(need), "--max-tokens", "16384"], [cap, "0.0001", "--max-tokens", str(fits)]):
        plan = infer(server, prompts, "-o", out, *way_out, "--plan")
        assert plan.code == 0 and b"not one request fits" not in plan.stdout, way_out
        assert b"could never be sent" not in plan.stdout
    r = infer(server, prompts, "-o", out, cap, "0.0001", "--max-tokens", str(fits), "--quiet")
    assert r.code in (0, 3) and server.stats()["completions_started"] >= 1
