"""kp-infer: prompt records in, response records out, through OpenRouter, within budget.

Usage:
    export OPENROUTER_API_KEY=sk-or-...
    kp-infer B3.prompts.jsonl --plan --quantization int4 --quantization unknown
    kp-infer B3.prompts.jsonl -o B3.responses.jsonl --concurrency 2000 \\
        --quantization int4 --quantization unknown --max-cost 95 --token-budget 10M

For Kimi K2.5, no --quantization flag means int4 and unknown (its native weights).

Schema (one JSON object per line): the prompt record's fields plus
    {"response": {"content": str, "reasoning": str|null}, "finish_reason": str,
     "model": str, "provider": str, "generation_id": str,
     "usage": {"prompt_tokens", "completion_tokens", "reasoning_tokens", "cost"},
     "attempts": int}

A whole build's cap: --total-cost USD counts the spend recorded in OUTPUT, --failures and
every --spent-in file (globs allowed); runs at the same time share it through
--reservations FILE. --sample N answers only the N prompts whose SHA-256 of id is
smallest (a pilot: its answers stay in OUTPUT, and the full run resumes from them).
--plan prints its report on stdout (--json: one JSON object).

Resume: rerun the same command. IDs already in OUTPUT (and in `--done` files) are
skipped; a torn last line left by a crash is repaired and its prompt redone; spend and
tokens recorded in OUTPUT count against `--max-cost` and `--token-budget`.
The whole input is validated before the first request (so it is read twice; stdin is
spooled to a temporary file).

Exit codes: 0 done as asked: every prompt answered, or --token-budget reached (the summary
says `"stop_reason": "token-budget"`; raise it and rerun to continue); 2 bad input, flags,
key (401) or routing (404); 3 stopped by money: --max-cost, --total-cost, a 402 or
--min-credits (raise the budget or add credits, rerun to resume); 4 done but some prompts failed permanently
(see --failures; a rerun retries them); 1 the output could not be written; 130 interrupted
(rerun to resume).
"""

from __future__ import annotations

import json

import click

from ..cli import (
    COUNT,
    Stderr,
    common_options,
    input_argument,
    kp_command,
    output_option,
    partition_option,
    read_api_key,
    run_command,
)
from ..errors import ExitCode, KPError
from ..infer.config import RunConfig
from ..infer.run import run_infer
from ..openrouter import DEFAULT_BASE_URL
from ..openrouter.models import QUANTIZATIONS, default_quantizations
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
"""


@kp_command("kp-infer", examples=EXAMPLES)
@input_argument()
@output_option("Output file, appended to and resumed from (`-` = stdout, no resume).")
@click.option("--model", default="moonshotai/kimi-k2.5", show_default=True, help="OpenRouter model slug.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=16384, show_default=True,
              help="Completion cap per request (reasoning included); bounds the worst-case cost.")
@click.option("--temperature", type=float, default=None, help="Sampling temperature.")
@click.option("--top-p", type=float, default=None, help="Nucleus sampling.")
@click.option("--seed", type=int, default=None, help="Sampling seed.")
@click.option("--reasoning/--no-reasoning", default=None, help="Ask for reasoning (default: the model's).")
@click.option("--reasoning-effort", type=click.Choice(["max", "xhigh", "high", "medium", "low", "minimal", "none"]),
              default=None, help="OpenRouter's reasoning.effort.")
@click.option("--extra-body", default=None, metavar="JSON",
              help="JSON object merged into every request body (anything else OpenRouter accepts).")
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
@click.option("--max-price-prompt", type=float, default=None, metavar="USD_PER_M",
              help="provider.max_price.prompt (USD per million tokens): a hard filter and a price bound.")
@click.option("--max-price-completion", type=float, default=None, metavar="USD_PER_M",
              help="provider.max_price.completion (USD per million tokens).")
@click.option("--concurrency", type=click.IntRange(min=1), default=64, show_default=True,
              help="Requests in flight at most (the limit adapts down on 429s and back up).")
@click.option("--max-attempts", type=click.IntRange(min=1), default=8, show_default=True,
              help="Attempts per prompt before it is recorded as failed (this run).")
@click.option("--idle-timeout", type=click.FloatRange(min=0.01), default=180.0, show_default=True,
              help="Seconds without data (keep-alive comments don't count) before an attempt is retried.")
@click.option("--workers", type=click.IntRange(min=0), default=None,
              help="Worker processes for the HTTP work (default: the number of cores; 0 = in this process).")
@click.option("--http-client", type=click.Choice(["native", "aiohttp"]), default="native", show_default=True,
              help="HTTP layer: kimipipe's own (least CPU per streamed chunk) or aiohttp (the escape hatch).")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Stream answers (SSE).")
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
              help="Seconds between balance polls for --min-credits.")
@click.option("--done", "done_files", multiple=True, type=click.Path(),
              help="Another responses file whose IDs count as done (repeatable).")
@click.option("--failures", type=click.Path(), default=None,
              help="Append permanent failures here (JSONL: id, kind, status, code, message, attempts).")
@click.option("--summary-json", type=click.Path(), default=None, help="Write the final summary here as JSON.")
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
@click.option("--json", "as_json", is_flag=True, help="With --plan: the plan as one JSON object.")
@common_options
def cli(input, output, model, max_tokens, temperature, top_p, seed, reasoning, reasoning_effort,
        extra_body, ignore_provider, only_provider, quantization, any_quantization, sort, no_fallbacks, data_collection,
        max_price_prompt, max_price_completion, concurrency, max_attempts, idle_timeout, workers, http_client, stream,
        backoff_base, grace, max_cost, token_budget, total_cost, spent_in, reservations, min_credits,
        credits_interval, done_files, failures, summary_json, partition, sample, base_url, api_key_file,
        plan, as_json, quiet, debug):
    """Send prompt records (default: stdin) to OpenRouter; write response records."""
    if as_json and not plan:
        raise KPError("--json goes with --plan", ExitCode.USAGE)
    if (spent_in or reservations) and total_cost is None:
        raise KPError(f"{'--spent-in' if spent_in else '--reservations'} needs --total-cost", ExitCode.USAGE)
    request = RequestOptions(model=model, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                             seed=seed, reasoning=reasoning, reasoning_effort=reasoning_effort,
                             stream=stream, extra_body=parse_extra_body(extra_body))
    policy = Policy(ignore=list(ignore_provider), only=list(only_provider),
                    quantizations=default_quantizations(model, quantization, any_quantization),
                    sort=sort, allow_fallbacks=not no_fallbacks, data_collection=data_collection,
                    max_price_prompt=max_price_prompt, max_price_completion=max_price_completion)
    config = RunConfig(
        input=input, output=output, done_files=list(done_files), failures=failures,
        summary_json=summary_json, partition=partition, plan=plan, plan_json=as_json, sample=sample,
        request=request, policy=policy,
        base_url=base_url, api_key=read_api_key(api_key_file, required=not plan),
        concurrency=concurrency, max_attempts=max_attempts, backoff_base=backoff_base,
        idle_timeout=idle_timeout, grace=grace, workers=workers, http_client=http_client,
        max_cost=max_cost, token_budget=token_budget, total_cost=total_cost, spent_in=list(spent_in),
        reservations=reservations, min_credits=min_credits,
        credits_interval=credits_interval)
    return run_infer(config, Stderr(quiet))


main = run_command(cli)
