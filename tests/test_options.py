"""Options declared once, on the typed fields they fill (kimipipe/options.py; kp-infer's in
kimipipe/infer/options.py, the other commands' in their command modules): a declaration
without a section, a field that is no option, or a `fills=` naming a field its record lacks
or types otherwise is refused when the command is made; every parameter of every command
(its words too) is a field of its settings, in order; what the user passes reaches the
command typed (lists, converted) and the run as passed (kp-infer through its plan and its
requests to the stand-in)."""

from __future__ import annotations

import json

import click
import msgspec
import pytest
from click.testing import CliRunner
from conftest import read_jsonl, write_jsonl
from test_infer import infer, make_prompts

from kimipipe.cli import KPGroup, kp_command
from kimipipe.commands import credits as credits_command
from kimipipe.commands import infer as infer_command
from kimipipe.commands import prompts as prompts_command
from kimipipe.commands import shard as shard_command
from kimipipe.commands import tokenize as tokenize_command
from kimipipe.infer.config import Files, Money, RunConfig
from kimipipe.infer.options import InferOptions, ReportOptions
from kimipipe.openrouter.request import RequestOptions
from kimipipe.options import (
    CommandSettings,
    argument,
    check_settings,
    fields_for,
    option,
    sections_of,
)

COMMANDS = {
    "kp-prompts": (prompts_command.cli, prompts_command.PromptsSettings),
    "kp-infer": (infer_command.run, InferOptions),
    "kp-infer report": (infer_command.report, ReportOptions),
    "kp-tokenize": (tokenize_command.cli, tokenize_command.TokenizeSettings),
    "kp-shard": (shard_command.build, shard_command.ShardSettings),
    "kp-shard verify": (shard_command.verify_word, shard_command.VerifySettings),
    "kp-shard stats": (shard_command.stats_word, shard_command.StatsSettings),
    "kp-shard card": (shard_command.card_word, shard_command.CardSettings),
    "kp-shard export": (shard_command.export_word, shard_command.ExportSettings),
    "kp-credits": (credits_command.cli, credits_command.CreditsSettings),
}


@pytest.mark.parametrize("name", COMMANDS)
def test_every_parameter_of_a_command_is_a_field_of_its_settings(name):
    """The command's parameters are its settings' fields, in order (no option declared
    beside them), each under one of the command's sections, if it has them; and every
    entry point's command is one of these (the words of kp-infer and kp-shard included)."""
    command, settings = COMMANDS[name]
    own = {"version", "help"}  # KPCommand's and click's, in every command
    assert [p.name for p in command.params if p.name not in own] == list(
        settings.__struct_fields__)
    assert command.name == name
    if command.sections is not None:
        placed = sections_of(settings)
        for p in command.params:
            if isinstance(p, click.Option) and p.name not in own:
                assert placed[p.name] in command.sections, p.name
    for group in (infer_command.cli, shard_command.cli):
        assert isinstance(group, KPGroup)
    made = {c.name for g in (infer_command.cli, shard_command.cli)
            for c in (g.default, *g.commands.values())}
    assert made | {"kp-prompts", "kp-tokenize", "kp-credits"} == set(COMMANDS)


def _settings(*fields: tuple) -> type:
    """A settings type of FIELDS, (name, annotation as written, its declaration), with --plan."""
    plan = ("plan", "bool", option("--plan", is_flag=True, section="Money", fills=RunConfig))
    return msgspec.defstruct("_Settings", [plan, *fields], bases=(CommandSettings,))


@pytest.mark.parametrize("field, sections, problem", [
    (("max_cost", "float | None", option("--max-cost", type=float, fills=Money)),
     ["Money"], "kp-x --max-cost: no --help section (one of: Money)"),
    (("max_cost", "float | None", option("--max-cost", type=float, section="Moneyy")),
     ["Money"], "kp-x --max-cost: no --help section (one of: Money)"),
    (("max_cost", "float | None", option("--max-cost", type=float)),
     None, "kp-x --plan: section 'Money', but kp-x lists its options in one list"),
    (("max_cost", "float | None", None), ["Money"],
     "kp-x: _Settings.max_cost is no option (declare it with option(...) or argument(...))"),
    (("max_costs", "float | None", option("--max-cost", section="Money", fills=Money)),
     ["Money"], "kp-x --max-cost: fills Money.max_costs, which Money lacks"),
    (("max_cost", "float", option("--max-cost", section="Money", fills=Money)),
     ["Money"], "kp-x --max-cost: float here, float | None in Money.max_cost"),
    (("sort", "str | None", option("--sort", section="Money", fills=RequestOptions)),
     ["Money"], "kp-x --sort: fills RequestOptions.sort, which RequestOptions lacks"),
    (("again", "bool", option("--plan", is_flag=True, section="Money")),
     ["Money"], "kp-x --plan: --plan declared twice (also plan)"),
])
def test_a_declaration_without_a_section_or_a_field_is_refused(field, sections, problem):
    """The checks a command's settings get when the command is made (so at import)."""
    with pytest.raises(TypeError) as refused:
        check_settings("kp-x", _settings(field), sections)
    assert str(refused.value) == problem
    with pytest.raises(TypeError, match=r"kp-x --plan: no --help section \(one of: Elsewhere\)"):
        kp_command("kp-x", settings=_settings(field), sections=["Elsewhere"], examples="")
    check_settings("kp-x", _settings(), ["Money"])  # as it should be: accepted


def test_the_command_gets_its_settings_typed():
    """What click parsed reaches the function as the settings type: a repeatable option
    and an argument of several as lists, `convert=` applied, `fills=` by field name."""
    class Settings(CommandSettings):
        inputs: list[str] = argument(nargs=-1)
        done_files: list[str] = option("--done", multiple=True, fills=Files, help="Done.")
        max_cost: float | None = option("--max-cost", type=float, default=None, fills=Money,
                                        help="Cap.")
        allow_mixed: bool = option("--strict-mix", is_flag=True, convert=lambda v: not v,
                                   fills=Files, help="Negated.")
        quiet: bool = option("-q", is_flag=True, help="Quiet.")

    got = []
    command = kp_command("kp-x", settings=Settings, examples="kp-x a b")(got.append)
    r = CliRunner().invoke(command, ["a", "b", "--done", "d1", "--done", "d2", "--max-cost", "3"])
    assert r.exit_code == 0, r.output
    (settings,) = got
    assert settings == Settings(inputs=["a", "b"], done_files=["d1", "d2"], max_cost=3.0,
                                allow_mixed=True, quiet=False)
    assert fields_for(settings, Files) == {"done_files": ["d1", "d2"], "allow_mixed": True}
    assert fields_for(settings, Money) == {"max_cost": 3.0}
    config = RunConfig(files=Files(**fields_for(settings, Files)),
                       money=Money(**fields_for(settings, Money)))
    assert (config.files.done_files, config.money.max_cost, config.files.allow_mixed) == (
        ["d1", "d2"], 3.0, True)


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



def test_a_word_is_a_command_of_its_own_and_the_rest_is_the_default_commands(tmp_path):
    """`kp-shard verify DIR ...` runs the word, whose usage errors name it; any other
    command line is the default command's, read as the group (`Try 'kp-shard --help'`),
    and a word followed by an option is an input named like the word."""
    runner = CliRunner()
    r = runner.invoke(shard_command.cli, ["verify", str(tmp_path), "--bogus"])
    assert r.exit_code == 2
    assert r.output.startswith("Usage: kp-shard verify [OPTIONS] DIR...\n"
                               "Try 'kp-shard verify --help' for help.\n"), r.output
    assert "No such option '--bogus'" in r.output
    r = runner.invoke(infer_command.cli, ["report", str(tmp_path / "r.jsonl"), "--plan"])
    assert r.exit_code == 2 and r.output.startswith("Usage: kp-infer report [OPTIONS] FILE...\n")
    r = runner.invoke(shard_command.cli, ["--bogus"])
    assert r.exit_code == 2
    assert r.output.startswith("Usage: kp-shard [OPTIONS] [INPUTS]...\n"
                               "Try 'kp-shard --help' for help.\n"), r.output
    r = runner.invoke(infer_command.cli, ["report", "--json"])  # INPUT `report`, then --json
    assert str(r.exception) == "--json goes with --plan, --report or --preflight"
