"""kp-infer: prompt records in, response records out, through OpenRouter, within budget.

Usage:
    export OPENROUTER_API_KEY=sk-or-...
    kp-infer B3.prompts.jsonl --plan --quantization int4 --quantization unknown
    kp-infer B3.prompts.jsonl -o B3.responses.jsonl --preflight      # 3 real requests, checked
    kp-infer B3.prompts.jsonl -o B3.responses.jsonl --concurrency 2000 \\
        --quantization int4 --quantization unknown --max-cost 95 --token-budget 10M
    kp-infer report B3.responses.jsonl B3.failures.jsonl               # providers compared
    kp-infer report work/*.jsonl work/*.zst shards/ --html report.html # the build, plotted

For Kimi K2.5, no --quantization flag means int4 and unknown (its native weights).

Schema (one JSON object per line): the prompt record's fields plus
    {"response": {"content": str, "reasoning": str|null}, "finish_reason": str,
     "model": str, "provider": str, "generation_id": str,
     "usage": {"prompt_tokens", "completion_tokens", "reasoning_tokens", "cost"},
     "attempts": int, "sampling": {"max_tokens", "temperature"?, "top_p"?, "seed"?, ...,
     "reasoning"?, "require_parameters"?}, "refused": [{"kind", "provider", "cost",
     "generation_id", "message"}], "latency_s": float, "finished_at": str, "api": str}
("api": the base URL's host that answered; the stand-in's generation ids begin gen-standin-.)

For Kimi K2.5, what you do not set is sampled as served (thinking: temperature 1.0,
top_p 0.95; --no-reasoning: 0.6, 0.95), with provider.require_parameters.

A whole build's cap: --total-cost USD counts the spend recorded in OUTPUT, --failures and
every --spent-in file (globs allowed); runs at the same time share it through
--reservations FILE. --sample N answers only the N prompts whose SHA-256 of id is
smallest (a pilot: its answers stay in OUTPUT, and the full run resumes from them).
--plan prints its report on stdout (--json: one JSON object).

Resume: rerun the same command. IDs already in OUTPUT (and in `--done` files) are
skipped; a torn last line left by a crash is repaired and its prompt redone; spend and
tokens recorded in OUTPUT count against `--max-cost` and `--token-budget`. OUTPUT or
--failures holding answers of another API (their "api") is refused, exit 2: answers of
two APIs never mix. --spent-in counts only the spend of this run's API.
The whole input is validated before the first request (so it is read twice; stdin is
spooled to a temporary file).

One writer per output: OUTPUT and the --failures file are locked for the run (a lock file
beside each); a second kp-infer on either exits 2 at once, naming who holds it.
A full disk: a request is admitted only while OUTPUT's filesystem has room for its
worst-case record (max_tokens at 16 bytes a token, the prompt line, 2 KiB) plus everything
in flight plus --min-free-disk; below that admission waits ("waiting for disk") and goes
on when space is freed, or, with nothing in flight, stops after --disk-wait seconds
(exit 3); a filesystem without room for one request is exit 3 at the start. A write that still fails cuts OUTPUT back to its last whole record
and stops the run (exit 3); the answers paid for that it could not take are kept in a
rescue file under --rescue DIR (printed; see kimipipe/infer/rescue.py for the path rule),
and the next run over the same OUTPUT, given the same --rescue (or none), takes them in
before it sends anything.

Exit codes: 0 done as asked: every prompt answered, or --token-budget reached (the summary
says `"stop_reason": "token-budget"`; raise it and rerun to continue); 2 bad input, flags,
an output that cannot be written or is locked by another run, key (401) or routing (404);
3 stopped by money (--max-cost, --total-cost, --min-credits, OpenRouter's balance, the
key's limit or a workspace/guardrail budget: raise the budget or add credits; no prompt is
failed for it) or by a full disk (free some space): rerun to resume; an in-flight 402 is
a wait, not a stop; 4 done but some prompts
failed permanently (see --failures; a rerun retries them); 1 the output could not be
written (an I/O error); 130 interrupted (rerun to resume). --preflight: 0 every check
passed (warnings allowed), 4 one failed.
"""

from __future__ import annotations

import json

import click

from ..cli import (
    COUNT,
    KPCommand,
    Quantity,
    Stderr,
    common_options,
    help_only,
    input_argument,
    kp_command,
    output_option,
    partition_option,
    read_api_key,
    run_command,
    sigterm_as_ctrl_c,
    word_help,
)
from ..errors import ExitCode, KPError
from ..infer.config import RunConfig
from ..infer.conversations import HISTORY_POLICIES
from ..infer.preflight import DEFAULT_REQUESTS, run_preflight
from ..infer.report_files import format_report, read_report, report_json
from ..infer.run import run_infer
from ..openrouter import DEFAULT_BASE_URL
from ..openrouter.models import (
    QUANTIZATIONS,
    default_quantizations,
    history_reasoning_default,
    served_sampling,
)
from ..openrouter.request import RequestOptions
from ..openrouter.routing import Policy


def parse_extra_body(text: str | None) -> dict:
    if not text:
        return {}
    try:
        extra = json.loads(text)
    except json.JSONDecodeError as e:
        raise KPError(f"--extra-body is not valid JSON: {e}", ExitCode.USAGE) from None
    if not isinstance(extra, dict):
        raise KPError("--extra-body must be a JSON object", ExitCode.USAGE)
    return extra


EXAMPLES = """
    kp-infer B3.prompts.jsonl --plan --max-cost 95
    kp-infer B3.prompts.jsonl --plan --json | jq .cost.expected
    kp-infer B3.prompts.jsonl -o B3.responses.jsonl --sample 200
    kp-infer B4.prompts.jsonl -o B4.responses.jsonl --total-cost 95 \\
        --spent-in 'work/*.responses.jsonl' --spent-in 'work/*.failures.jsonl'
    kp-infer B3.prompts.jsonl -o B3.responses.jsonl --concurrency 2000 \\
        --quantization int4 --quantization unknown --max-cost 95 --token-budget 10M \\
        --failures B3.failures.jsonl --summary-json B3.summary.json
    kp-prompts questions.txt --format text | kp-infer --max-cost 1 > answers.jsonl
    kp-infer B3.prompts.jsonl -o B3.responses.jsonl --preflight
    kp-infer report B3.responses.jsonl B3.failures.jsonl
    kp-infer report work/B3.* shards/B3 --html B3.html --max-cost 95 --token-budget 10M
"""


# --help lists the options as a paying user reads them: what a run will cost and what stops
# it, where it may go, what it asks for, where its files go, then tuning. An option missing
# here is listed under "Other options" (and tests/test_cli_conventions.py fails).
OPTION_SECTIONS = {
    "Plan and money": ["plan", "preflight", "max_cost", "token_budget", "total_cost",
                       "spent_in", "reservations", "min_credits", "credits_interval", "cost_lookup_wait",
                       "sample"],
    "Routing (which providers may answer)": [
        "model", "quantization", "any_quantization", "ignore_provider", "only_provider",
        "max_price_prompt", "max_price_completion", "sort", "no_fallbacks", "data_collection",
        "allow_non_distillable"],
    "Request (what is asked)": [
        "max_tokens", "temperature", "top_p", "seed", "reasoning", "reasoning_effort",
        "no_require_parameters", "extra_body", "history_reasoning"],
    "Files and resume": ["output", "failures", "summary_json", "done_files", "rescue_dir",
                         "min_free_disk", "disk_wait", "partition", "allow_mixed", "report_files",
                         "as_json", "html"],
    "Tuning and connection": ["concurrency", "servers", "server_concurrency", "use_openrouter",
                              "max_attempts", "backoff_base", "grace",
                              "idle_timeout", "workers", "stream", "proxy", "base_url",
                              "api_key_file"],
}


# The options `kp-infer report FILE...` takes with a value (not a file to read).
_REPORT_VALUE_OPTIONS = {"--html", "--total-cost", "--max-cost", "--token-budget"}


def _report_word() -> KPCommand:
    """`kp-infer report -h`: the word's own help, with the options it takes (kp-infer's)."""
    takes = {"html", "as_json", "total_cost", "max_cost", "token_budget", "quiet"}
    return help_only(
        "kp-infer report",
        "The providers compared, from responses and failures files on disk (= --report FILE "
        "...): per provider its answers, failures, cost, tokens and latency, and a histogram; "
        "on stdout. With --html OUT, the build plotted in one HTML page from any of its files "
        "(docs/report.md). Sends nothing, needs no key.",
        arguments="FILE...", params=[p for p in cli.params if p.name in takes],
        examples="kp-infer report B3.responses.jsonl B3.failures.jsonl\n"
                 "kp-infer report work/*.responses.jsonl --json\n"
                 "kp-infer report work/B3.* shards/B3 --html B3.html --max-cost 95 --token-budget 10M")


WORDS = {"report": _report_word}


class _InferCommand(KPCommand):
    """`kp-infer report FILE...` is spelled as a word too (= --report FILE ...); --help
    shows the options in OPTION_SECTIONS' order and headings."""

    def format_options(self, ctx, formatter):
        records = {param.name: param.get_help_record(ctx) for param in self.get_params(ctx)
                   if isinstance(param, click.Option)}
        listed = set()
        for title, names in OPTION_SECTIONS.items():
            rows = [records[name] for name in names if records.get(name)]
            listed.update(names)
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
        rest = [record for name, record in records.items() if record and name not in listed]
        if rest:
            with formatter.section("Other options"):
                formatter.write_dl(rest)

    def parse_args(self, ctx, args):
        args = list(args)
        word_help(ctx, args, WORDS)
        if len(args) >= 2 and args[0] == "report" and not args[1].startswith("-"):
            words, args = args[1:], []
            for i, arg in enumerate(words):  # a file, unless it is an option or its value
                option = arg.startswith("-") and arg != "-"
                value = i > 0 and words[i - 1] in _REPORT_VALUE_OPTIONS
                args += [arg] if option or value else ["--report", arg]
        # `--preflight` takes an optional N: followed by anything but a number, it is 3
        args = [f"--preflight={DEFAULT_REQUESTS}" if arg == "--preflight"
                and not (i + 1 < len(args) and args[i + 1].isdigit()) else arg
                for i, arg in enumerate(args)]
        return super().parse_args(ctx, args)


@kp_command("kp-infer", examples=EXAMPLES, cls=_InferCommand, epilog=(
    "Also: `kp-infer report FILE...` (= --report FILE ...): the providers compared, from "
    "responses and failures files on disk; the report on stdout (--json for JSON); with "
    "--html OUT, the build plotted in one HTML page from any of its files (docs/report.md)."))
@input_argument()
@output_option("Output file, appended to and resumed from (`-` = stdout, no resume).")
@click.option("-m", "--model", default="moonshotai/kimi-k2.5", show_default=True, help="OpenRouter model slug.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=16384, show_default=True,
              help="Completion cap per request (reasoning included); bounds the worst-case cost.")
@click.option("--temperature", type=float, default=None,
              help="Sampling temperature. Default for Kimi K2.5: as served, 1.0 thinking, 0.6 with "
                   "--no-reasoning; other models: not sent (each provider's own default).")
@click.option("--top-p", type=float, default=None,
              help="Nucleus sampling. Default for Kimi K2.5: as served, 0.95.")
@click.option("--seed", type=int, default=None, help="Sampling seed.")
@click.option("--reasoning/--no-reasoning", default=None, help="Ask for reasoning (default: the model's).")
@click.option("--reasoning-effort", type=click.Choice(["max", "xhigh", "high", "medium", "low", "minimal", "none"]),
              default=None, help="OpenRouter's reasoning.effort.")
@click.option("--extra-body", default=None, metavar="JSON",
              help="JSON object merged into every request body (anything else OpenRouter accepts).")
@click.option("--no-require-parameters", is_flag=True,
              help="Do not send provider.require_parameters with the sampling parameters (by "
                   "default sent, so no provider drops temperature/top_p silently).")
@click.option("--history-reasoning", type=click.Choice(HISTORY_POLICIES), default=None,
              help="A conversation's earlier turns in its history: with their reasoning "
                   "(keep) or their content only (drop). Default: as the model's template "
                   "renders history (Kimi K2.5: drop; K2.6's preserve_thinking: keep).")
@click.option("--allow-mixed", is_flag=True,
              help="Resume into an output whose records were asked with another model, "
                   "sampling or history policy (refused by default, exit 2).")
@click.option("--ignore-provider", multiple=True, metavar="SLUG",
              help="Never route to this provider (repeatable; `deepinfra` also ignores `deepinfra/turbo`).")
@click.option("--only-provider", multiple=True, metavar="SLUG", help="Route only to these providers (repeatable).")
@click.option("--quantization", multiple=True, type=click.Choice(QUANTIZATIONS),
              help="Allowed quantizations (repeatable). Default for Kimi K2.5: int4 and unknown "
                   "(its native weights; first-party endpoints report unknown).")
@click.option("--any-quantization", is_flag=True,
              help="Drop the model's native-quantization default (re-quantized endpoints allowed).")
@click.option("--sort", type=click.Choice(["price", "throughput", "latency"]), default=None,
              help="OpenRouter's provider sort (turns off load balancing).")
@click.option("--no-fallbacks", is_flag=True, help="provider.allow_fallbacks = false.")
@click.option("--data-collection", type=click.Choice(["allow", "deny"]), default=None,
              help="provider.data_collection.")
@click.option("--allow-non-distillable", is_flag=True,
              help="Do not send provider.enforce_distillable_text (sent by default: the answers "
                   "train a drafter, and a model whose authors forbid distillation must not "
                   "be used for that).")
@click.option("--max-price-prompt", type=float, default=None, metavar="USD_PER_M",
              help="provider.max_price.prompt (USD per million tokens): a hard filter and a price bound.")
@click.option("--max-price-completion", type=float, default=None, metavar="USD_PER_M",
              help="provider.max_price.completion (USD per million tokens).")
@click.option("--concurrency", type=click.IntRange(min=1), default=64, show_default=True,
              help="Requests in flight at most (the limit adapts down on 429s and back up). "
                   "64 suits a first try; the user's runs in the README use 2000 (one client "
                   "holds 2000 in flight: see docs/performance.md).")
@click.option("--server", "servers", multiple=True, metavar="URL[#NAME]",
              help="A self-hosted OpenAI-compatible server (vLLM, SGLang) to send prompts to, "
                   "e.g. http://gpu1:30000/v1 (repeatable); #NAME: the name it serves --model "
                   "under (else GET /v1/models tells). No provider object, balance or "
                   "endpoints table; thinking by chat_template_kwargs; the sampled token IDs "
                   "kept (sampled_ids). Without --openrouter, OpenRouter gets nothing. "
                   "See docs/servers.md.")
@click.option("--server-concurrency", type=click.IntRange(min=1), default=64, show_default=True,
              help="Requests in flight at most per --server.")
@click.option("--openrouter", "use_openrouter", is_flag=True,
              help="With --server: send to OpenRouter too (up to --concurrency in flight there); "
                   "each prompt goes to whichever has room. Implied without --server.")
@click.option("--max-attempts", type=click.IntRange(min=1), default=8, show_default=True,
              help="Attempts per prompt before it is recorded as failed (this run); an answer "
                   "refused (routing, no reasoning, a think tag) counts as one.")
@click.option("--idle-timeout", type=click.FloatRange(min=0.01), default=180.0, show_default=True,
              help="Seconds without data (keep-alive comments don't count) before an attempt is retried.")
@click.option("--workers", type=click.IntRange(min=0), default=None,
              help="Worker processes for the HTTP work (default: in this process when at most 256 "
                   "requests can be in flight, else the number of cores; 0 = in this process).")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Stream answers (SSE).")
@click.option("--proxy", default=None, metavar="URL",
              help="Send every request through this HTTP proxy (http://[USER:PASSWORD@]HOST:PORT), "
                   "instead of HTTPS_PROXY/HTTP_PROXY/NO_PROXY. The password is never printed.")
@click.option("--backoff-base", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="First retry delay in seconds (doubles per attempt, jittered, max 60 s).")
@click.option("--grace", type=click.FloatRange(min=0), default=300.0, show_default=True,
              help="Seconds a stop waits for requests in flight (they are paid for) before cancelling.")
@click.option("--max-cost", type=click.FloatRange(min=0), default=None, metavar="USD",
              help="Cap on the cost recorded in OUTPUT across all runs; never exceeded "
                   "(reaching it stops the run with exit 3).")
@click.option("--token-budget", type=COUNT, default=None,
              help="Cap on completion tokens recorded in OUTPUT across runs (accepts 10M, 500k); "
                   "reaching it is done as asked (exit 0).")
@click.option("--total-cost", type=click.FloatRange(min=0), default=None, metavar="USD",
              help="Cap on the cost recorded in OUTPUT, --failures and every --spent-in file "
                   "together (a whole build); never exceeded (reaching it stops the run with exit 3).")
@click.option("--spent-in", multiple=True, metavar="FILE",
              help="A responses or failures file (or a glob) whose recorded spend counts against "
                   "--total-cost (repeatable; read at start).")
@click.option("--reservations", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Share --total-cost with the kp-infer runs of this machine that name the same "
                   "FILE (a JSON file, locked): their requests in flight are reserved against it too.")
@click.option("--min-credits", type=click.FloatRange(min=0), default=None, metavar="USD",
              help="Stop admitting work when the account balance falls below USD (polled; exit 3).")
@click.option("--credits-interval", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
              help="Seconds between balance polls (the money in flight follows the balance; --min-credits).")
@click.option("--cost-lookup-wait", type=click.FloatRange(min=0), default=30.0, show_default=True,
              metavar="SECONDS",
              help="An answer whose usage shows no cost is booked at its worst price, then its "
                   "cost is read from GET /generation for up to SECONDS before its record is "
                   "written (else the estimate stays; docs/money.md).")
@click.option("--done", "done_files", multiple=True, type=click.Path(),
              help="Another responses file whose IDs count as done (repeatable).")
@click.option("--failures", type=click.Path(), default=None,
              help="Append permanent failures here (JSONL: id, kind, status, code, message, attempts, "
                   "and for answers paid for and refused, provider, cost and refused).")
@click.option("--summary-json", type=click.Path(), default=None, help="Write the final summary here as JSON.")
@click.option("--min-free-disk", type=Quantity("size", 1024, minimum=0), default="64M",
              show_default=True, metavar="BYTES",
              help="Free space kept on the output's filesystem beyond the worst case of the "
                   "requests in flight (accepts 500M, 2G); below it admission waits for disk.")
@click.option("--disk-wait", type=click.FloatRange(min=0), default=600.0, show_default=True,
              metavar="S",
              help="Seconds to wait for disk room with nothing in flight before stopping "
                   "(exit 3, resumable).")
@click.option("--rescue", "rescue_dir", type=click.Path(), default=None, metavar="DIR",
              help="Where answers paid for that the output cannot take (a full disk) are kept "
                   "for the next run, which takes them in first; give the same DIR to that run "
                   "(default: kimipipe-rescue-UID in the temp dir). Best on another filesystem.")
@partition_option
@click.option("--sample", type=click.IntRange(min=0), default=None, metavar="N",
              help="Only the N prompts whose SHA-256 of id is smallest: the same N in every run "
                   "(a pilot whose answers stay part of the data).")
@click.option("--base-url", envvar="OPENROUTER_BASE_URL", default=DEFAULT_BASE_URL, show_default=True,
              help="API base URL (or OPENROUTER_BASE_URL).")
@click.option("--api-key-file", type=click.Path(), default=None,
              help="Read the API key from this file (default: OPENROUTER_API_KEY).")
@click.option("--plan", is_flag=True, help="Send nothing: show allowed providers and the cost estimate "
              "(on stdout).")
@click.option("--report", "report_files", multiple=True, type=click.Path(allow_dash=True), metavar="FILE",
              help="Send nothing: compare the providers in these responses/failures files (repeatable; "
                   "also `kp-infer report FILE...`): a table and a histogram on stdout; token "
                   "records add the provider counts against kimipipe's.")
@click.option("--preflight", type=click.IntRange(min=1), default=None, metavar="[N]",
              help=f"Before the long run: send N real requests (default {DEFAULT_REQUESTS}) and check "
                   "what the run assumes (provider and quantization, reasoning, cost against the "
                   "prices, the stream's shape, the balance and how many requests it covers at "
                   "once); a pass/fail table on stdout, exit 4 on a failed check. The answers are "
                   "kept in -o FILE (needed) like a run's.")
@click.option("--html", type=click.Path(dir_okay=False, allow_dash=True), default=None, metavar="OUT",
              help="With --report: write the build report, one self-contained HTML page of plots, to "
                   "OUT instead (responses, failures, token records, rejects files, shard "
                   "directories; --total-cost, --max-cost and --token-budget drawn as its caps). "
                   "Needs the `report` extra (matplotlib).")
@click.option("--json", "as_json", is_flag=True,
              help="With --plan, --report or --preflight: the report as JSON on stdout.")
@common_options
def cli(input, output, model, max_tokens, temperature, top_p, seed, reasoning, reasoning_effort,
        extra_body, no_require_parameters, history_reasoning, allow_mixed, ignore_provider, only_provider, quantization, any_quantization,
        sort, no_fallbacks, data_collection, allow_non_distillable, max_price_prompt, max_price_completion,
        concurrency, servers, server_concurrency, use_openrouter, max_attempts, idle_timeout, workers, stream, proxy,
        backoff_base, grace, max_cost, token_budget, total_cost, spent_in, reservations, min_credits,
        credits_interval, cost_lookup_wait, done_files, failures, summary_json, min_free_disk, disk_wait,
        rescue_dir, partition, sample, base_url, api_key_file, plan, report_files, preflight, html, as_json,
        quiet, debug):
    """Send prompt records (default: stdin) to OpenRouter; write response records."""
    if html and not report_files:
        raise KPError("--html goes with --report (kp-infer report FILE... --html OUT)", ExitCode.USAGE)
    if report_files and html:
        from ..report import Settings, write_report  # (the shard readers: only here)
        settings = Settings(total_cost=total_cost, max_cost=max_cost, token_budget=token_budget)
        write_report(list(report_files), settings, html, Stderr(quiet))
        if html != "-":
            Stderr(quiet)(f"kp-infer: the build report is in {html}")
        return ExitCode.OK
    if report_files:
        report = read_report(list(report_files), Stderr(quiet))
        click.echo(report_json(report) if as_json else format_report(report))
        return ExitCode.OK
    if as_json and not (plan or preflight is not None):
        raise KPError("--json goes with --plan, --report or --preflight", ExitCode.USAGE)
    if use_openrouter and not servers:
        raise KPError("--openrouter goes with --server (without --server, OpenRouter is the "
                      "only source)", ExitCode.USAGE)
    openrouter = use_openrouter or not servers
    if (spent_in or reservations) and total_cost is None:
        raise KPError(f"{'--spent-in' if spent_in else '--reservations'} needs --total-cost", ExitCode.USAGE)
    served = served_sampling(model, reasoning, reasoning_effort)  # user flags win
    if served is not None and reasoning is None and reasoning_effort is None:
        reasoning = True  # the preset's mode, said in the body and so in each record
    served = served or {}
    request = RequestOptions(model=model, max_tokens=max_tokens,
                             temperature=temperature if temperature is not None else served.get("temperature"),
                             top_p=top_p if top_p is not None else served.get("top_p"),
                             seed=seed, reasoning=reasoning, reasoning_effort=reasoning_effort,
                             stream=stream, require_parameters=not no_require_parameters,
                             extra_body=parse_extra_body(extra_body))
    policy = Policy(ignore=list(ignore_provider), only=list(only_provider),
                    quantizations=default_quantizations(model, quantization, any_quantization),
                    sort=sort, allow_fallbacks=not no_fallbacks, data_collection=data_collection,
                    max_price_prompt=max_price_prompt, max_price_completion=max_price_completion,
                    enforce_distillable_text=not allow_non_distillable)
    policy.required_parameters = request.enforced_parameters(policy)
    try:
        request.sampling(policy)
    except ValueError as e:
        raise KPError(str(e), ExitCode.USAGE) from None
    config = RunConfig(
        input=input, output=output, done_files=list(done_files), failures=failures,
        summary_json=summary_json, rescue_dir=rescue_dir, min_free_disk=min_free_disk, disk_wait=disk_wait,
        partition=partition, plan=plan, plan_json=as_json and plan, sample=sample,
        request=request, policy=policy,
        history_reasoning=history_reasoning or history_reasoning_default(model),
        allow_mixed=allow_mixed, base_url=base_url,
        api_key=read_api_key(api_key_file, required=not plan) if openrouter else "",
        concurrency=concurrency, max_attempts=max_attempts, backoff_base=backoff_base,
        idle_timeout=idle_timeout, grace=grace, workers=workers, proxy=proxy,
        max_cost=max_cost, token_budget=token_budget, total_cost=total_cost, spent_in=list(spent_in),
        reservations=reservations, min_credits=min_credits,
        credits_interval=credits_interval, cost_lookup_wait=cost_lookup_wait,
        servers=list(servers), server_concurrency=server_concurrency, openrouter=openrouter)
    with sigterm_as_ctrl_c():  # a `kill` or a stopped container: exit 130 with the summary
        if preflight is not None:
            return run_preflight(config, preflight, as_json, Stderr(quiet), click.echo)
        return run_infer(config, Stderr(quiet))


main = run_command(cli)
