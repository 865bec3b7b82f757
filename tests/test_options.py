"""Options declared once (kimipipe/cli.py: OptionTable; kp-infer's table in
kimipipe/infer/options.py, kp-tokenize's and kp-shard's in their command modules): a declaration without a
section or a field it fills is refused when the table is made, every option of the command
is in its table, and what the user passes reaches the run as passed (kp-infer through its
plan and its requests to the stand-in)."""

from __future__ import annotations

import json

import pytest
from conftest import read_jsonl, write_jsonl
from test_infer import infer, make_prompts

from kimipipe.cli import Declared, Derived, OptionTable
from kimipipe.commands import infer as infer_command
from kimipipe.commands import shard as shard_command
from kimipipe.commands import tokenize as tokenize_command
from kimipipe.infer.config import RunConfig
from kimipipe.infer.options import OPTIONS as INFER_OPTIONS
from kimipipe.openrouter.request import RequestOptions


@pytest.mark.parametrize("command, table", [
    (infer_command.cli, INFER_OPTIONS),
    (tokenize_command.cli, tokenize_command.OPTIONS),
    (shard_command.cli, shard_command.OPTIONS),
], ids=["infer", "tokenize", "shard"])
def test_every_option_of_the_command_is_in_its_table_with_a_section_and_a_field(command, table):
    """The command's parameters are its table's (no option declared beside it), each one
    under a section of the table and filling a field of a record or a named derivation."""
    own = {"version", "help"}  # KPCommand's and click's, in every command
    assert [p.name for p in command.params if p.name not in own] == [e.name for e in table.entries]
    for entry in table.entries:
        assert entry.argument or entry.section in table.sections, entry
        if isinstance(entry.fills, Derived):
            assert entry.fills.name, entry
        else:
            record, field = entry.fills.split(".")
            assert field in table.records[record].__dataclass_fields__, entry


def _table(*entries: Declared) -> OptionTable:
    return OptionTable("kp-x", entries, sections=["Money"],
                       records={"config": RunConfig, "request": RequestOptions})


@pytest.mark.parametrize("entry, problem", [
    (Declared("--max-cost", type=float, fills="config.max_cost"), "--max-cost: no --help section"),
    (Declared("--max-cost", type=float, fills="config.max_cost", section="Moneyy"),
     "--max-cost: no --help section"),
    (Declared("--max-cost", type=float, section="Money"), "--max-cost: fills nothing"),
    (Declared("--max-cost", type=float, fills="max_cost", section="Money"), "--max-cost: fills nothing"),
    (Declared("--max-cost", type=float, fills="config.max_costs", section="Money"),
     "--max-cost: fills config.max_costs, which ['config', 'request'] lack"),
    (Declared("--sort", fills="policy.sort", section="Money"),
     "--sort: fills policy.sort, which ['config', 'request'] lack"),
    (Declared("--sort", fills=Derived("the sort", "policy", lambda o: {}), section="Money"),
     "--sort: derivation 'the sort' needs a record"),
    (Declared("--sort", fills=Derived("the sort", "config"), section="Money"),
     "--sort: derivation 'the sort' needs a record"),
])
def test_a_declaration_without_a_section_or_a_field_is_refused(entry, problem):
    with pytest.raises(TypeError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        _table(Declared("--plan", is_flag=True, fills="config.plan", section="Money"), entry)


def test_two_options_filling_one_field_are_refused():
    with pytest.raises(TypeError, match="--budget: fills config.max_cost, as kp-x --max-cost does"):
        _table(Declared("--max-cost", type=float, fills="config.max_cost", section="Money"),
               Declared("--budget", type=float, fills="config.max_cost", section="Money"))
    with pytest.raises(TypeError, match="kp-x --done: declared twice"):
        _table(Declared("--done", "done_files", multiple=True, fills="config.done_files", section="Money"),
               Declared("--done", "done_files", multiple=True, fills="config.spent_in", section="Money"))
    # the table as it is: accepted, and its option listed under its section
    table = _table(Declared("--max-cost", type=float, fills="config.max_cost", section="Money"))
    assert table.section_of("max_cost") == "Money"


def test_the_options_reach_the_plan_and_the_requests_as_given(standin, tmp_path):
    """A representative set of kp-infer's options, through the real command: the plan's
    figures (RunConfig) and the request bodies the stand-in received (RequestOptions and
    Policy) say what was passed, repeatable options as lists and negated flags negated."""
    server = standin(request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 6)
    earlier = write_jsonl(tmp_path / "earlier.jsonl", [])
    plan_flags = ["--max-tokens", "1000", "--max-cost", "3", "--token-budget", "5k",
                  "--total-cost", "9", "--spent-in", str(earlier), "--sample", "4",
                  "--concurrency", "7", "--history-reasoning", "keep",
                  "--ignore-provider", "together", "--quantization", "int4"]
    r = infer(server, prompts, "--plan", "--json", *plan_flags)
    assert r.code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert (plan["model"], plan["max_tokens"], plan["max_cost"], plan["token_budget"]) == (
        "moonshotai/kimi-k2.5", 1000, 3, 5000)
    assert plan["total_cost"]["cap"] == 9 and plan["total_cost"]["spent_in"] == [str(earlier)]
    assert plan["prompts"]["sample"] == 4 and plan["in_flight"]["concurrency"] == 7
    assert plan["requests"]["history_reasoning"] == "keep"
    allowed = {route["tag"] for route in plan["routes"] if route["allowed"]}
    assert allowed and "together" not in allowed
    assert all(route["quantization"] == "int4" for route in plan["routes"] if route["allowed"])

    out, summary = tmp_path / "r.jsonl", tmp_path / "summary.json"
    run_flags = ["--max-tokens", "1000", "--temperature", "0.3", "--top-p", "0.8", "--seed", "4",
                 "--reasoning-effort", "high", "--extra-body", '{"top_k": 40}', "--sort", "price",
                 "--data-collection", "deny", "--max-price-prompt", "100",
                 "--max-price-completion", "200", "--no-fallbacks", "--allow-non-distillable",
                 "--ignore-provider", "together", "--ignore-provider", "parasail",
                 "--quantization", "int4", "--quantization", "unknown", "--no-stream",
                 "--max-cost", "3", "--summary-json", str(summary)]
    r = infer(server, prompts, "-o", out, *run_flags)
    assert r.code == 0, r.stderr
    bodies = server.requests()
    assert len(bodies) == 6
    for body in bodies:
        assert body["model"] == "moonshotai/kimi-k2.5" and body["stream"] is False
        assert {k: body[k] for k in ("max_tokens", "temperature", "top_p", "seed", "top_k")} == {
            "max_tokens": 1000, "temperature": 0.3, "top_p": 0.8, "seed": 4, "top_k": 40}
        assert body["reasoning"] == {"effort": "high"}
        provider = body["provider"]
        assert provider["ignore"][:2] == ["together", "parasail"]
        assert provider["quantizations"] == ["int4", "unknown"]
        assert (provider["sort"], provider["data_collection"], provider["allow_fallbacks"]) == (
            "price", "deny", False)
        assert provider["max_price"] == {"prompt": "100", "completion": "200"}
        assert "enforce_distillable_text" not in provider and provider["require_parameters"] is True
    assert json.loads(summary.read_text())["max_cost"] == 3
    assert {rec["sampling"]["temperature"] for rec in read_jsonl(out)} == {0.3}

