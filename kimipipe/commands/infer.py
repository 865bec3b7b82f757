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

Resume: rerun the same command. IDs already in OUTPUT (and in `--done` files) are
skipped; a torn last line left by a crash is repaired and its prompt redone; spend and
tokens recorded in OUTPUT count against `--max-cost` and `--token-budget`.
The whole input is validated before the first request (so it is read twice; stdin is
spooled to a temporary file).

Exit codes: 0 all done; 2 bad input, flags, key (401) or routing (404); 3 stopped by
--max-cost, --token-budget, --min-credits or a 402 (raise the budget or add credits,
rerun); 4 done but some prompts failed permanently (see --failures; a rerun retries them);
130 interrupted (rerun to resume).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile

import aiohttp
import click
import msgspec

from ..cli import (
    COUNT,
    EXIT_CODES_HELP,
    common_options,
    input_argument,
    output_option,
    partition_option,
    progress,
    read_api_key,
    run_command,
    say,
)
from ..errors import ExitCode, KPError, redact
from ..infer.budget import Budget
from ..infer.engine import (
    RequestOptions,
    Run,
    RunConfig,
    format_summary,
    prepare,
)
from ..infer.worker import freeze_startup_objects
from ..infer.workers import WorkerPool
from ..openrouter import DEFAULT_BASE_URL
from ..openrouter.client import CompletionClient
from ..openrouter.models import (
    QUANTIZATIONS,
    default_quantizations,
    preset_for,
    requantized_allowed,
    requantized_in_flags,
)
from ..openrouter.money import fetch_balance_async
from ..openrouter.proxy import scrub
from ..openrouter.routing import (
    Endpoint,
    Policy,
    allowed_endpoints,
    parse_endpoints,
    price_bound,
    why_excluded,
)
from ..partition import in_partition


async def fetch_endpoints(base_url: str, api_key: str, model: str, proxy: str | None = None) -> list[Endpoint]:
    url = f"{base_url.rstrip('/')}/models/{model}/endpoints"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=60)
    # trust_env: HTTPS_PROXY/NO_PROXY as the data plane reads them; --proxy overrides
    async with aiohttp.ClientSession(timeout=timeout, headers=headers, trust_env=True,
                                     proxy=proxy) as session:
        async with session.get(url) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise KPError(f"GET /models/{model}/endpoints answered HTTP {resp.status}")
    try:
        return parse_endpoints(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise KPError(f"unexpected endpoints table: {e}") from None


async def fetch_spendable_balance(base_url: str, api_key: str, proxy: str | None = None) -> float | None:
    """What the account (or the key's limit) still allows, as kp-credits reads it."""
    async with aiohttp.ClientSession(trust_env=True, proxy=proxy) as session:
        balance = await fetch_balance_async(session, api_key, base_url)
    return balance.spendable


def _uvloop_run(coro):
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def requantization_warnings(model: str, policy: Policy, endpoints: list[Endpoint] | None) -> list[str]:
    """Endpoints the routing flags let through although they re-quantize the model's weights."""
    preset = preset_for(model)
    if preset is None:
        return []
    if endpoints is not None:
        found = requantized_allowed(model, [(e.provider_name, e.quantization)
                                            for e in allowed_endpoints(policy, endpoints)])
    else:
        named = requantized_in_flags(model, policy.quantizations) if policy.quantizations else \
            sorted(preset.requantized)
        found = [f"the routing flags allow {', '.join(named)} endpoints, re-quantized from "
                 f"{model}'s native {preset.native_quantization} weights"] if named else []
    if found:
        found.append(f"to keep to the native weights, pass --quantization "
                     f"{' --quantization '.join(preset.allowed_quantizations)} (the default)")
    return found


def show_plan(policy: Policy, endpoints: list[Endpoint] | None, scan, todo: int, budget: Budget,
              request: RequestOptions) -> None:
    out = []
    if endpoints is None:
        out.append("endpoints table unavailable: routing cannot be shown")
    else:
        out.append(f"providers for {request.model} under the routing flags:")
        out.append(f"  {'provider':<24} {'tag':<20} {'quant':<8} {'$/M in':>8} {'$/M out':>8}  verdict")
        for e in sorted(endpoints, key=lambda e: (e.completion_price, e.provider_name)):
            verdict = why_excluded(policy, e) or "allowed"
            out.append(f"  {e.provider_name:<24} {e.tag or '':<20} {e.quantization or '?':<8} "
                       f"{e.prompt_price * 1e6:>8.3f} {e.completion_price * 1e6:>8.3f}  {verdict}")
        if not allowed_endpoints(policy, endpoints):
            out.append("  no provider is allowed: requests would fail with 404 constraint_filtered")
    for warning in requantization_warnings(request.model, policy, endpoints):
        out.append(f"warning: {warning}")
    out.append(f"prompts: {scan.records} in the input, {todo} to do")
    if budget.price is not None and todo:
        allowed = allowed_endpoints(policy, endpoints or [])
        mean_in = sum(e.prompt_price for e in allowed) / len(allowed) if allowed else budget.price.prompt
        mean_out = sum(e.completion_price for e in allowed) / len(allowed) if allowed else budget.price.completion
        per_prompt_bound = scan.prompt_token_bound / max(1, scan.records)
        expected_prompt_tokens = scan.prompt_bytes / 4 / max(1, scan.records) + 16
        expected_completion = request.max_tokens / 2
        if budget.token_budget is not None:
            expected_completion = min(expected_completion, max(0, budget.token_budget - budget.tokens) / todo)
        expected = todo * (expected_prompt_tokens * mean_in + expected_completion * mean_out)
        worst = todo * (per_prompt_bound * budget.price.prompt + request.max_tokens * budget.price.completion)
        out.append(f"cost estimate for {todo} prompts: expected ~${expected:,.2f} (prompts at ~4 bytes/token, "
                   f"answers at half of --max-tokens {request.max_tokens}"
                   + (", within --token-budget" if budget.token_budget else "") + f"); worst case ${worst:,.2f}")
        if budget.max_cost is not None:
            out.append(f"--max-cost ${budget.max_cost:g}: ${budget.spent:.4f} already recorded; "
                       f"the run stops before exceeding it")
    elif todo:
        out.append("no price bound: cost cannot be estimated")
    click.echo("\n".join(out), err=True)


@click.command(name="kp-infer", epilog=EXIT_CODES_HELP)
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
@click.option("--stream/--no-stream", default=True, show_default=True, help="Stream answers (SSE).")
@click.option("--proxy", default=None, metavar="URL",
              help="Send every request through this HTTP proxy (http://[USER:PASSWORD@]HOST:PORT), "
                   "instead of HTTPS_PROXY/HTTP_PROXY/NO_PROXY. The password is never printed.")
@click.option("--backoff-base", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="First retry delay in seconds (doubles per attempt, jittered, max 60 s).")
@click.option("--grace", type=click.FloatRange(min=0), default=300.0, show_default=True,
              help="Seconds a stop waits for requests in flight (they are paid for) before cancelling.")
@click.option("--max-cost", type=click.FloatRange(min=0), default=None, metavar="USD",
              help="Cap on the cost recorded in OUTPUT across all runs; never exceeded.")
@click.option("--token-budget", type=COUNT, default=None,
              help="Cap on completion tokens recorded in OUTPUT across runs (accepts 10M, 500k).")
@click.option("--min-credits", type=click.FloatRange(min=0), default=None, metavar="USD",
              help="Stop admitting work when the account balance falls below USD (polled).")
@click.option("--credits-interval", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
              help="Seconds between balance polls for --min-credits.")
@click.option("--done", "done_files", multiple=True, type=click.Path(),
              help="Another responses file whose IDs count as done (repeatable).")
@click.option("--failures", type=click.Path(), default=None,
              help="Append permanent failures here (JSONL: id, kind, status, code, message, attempts).")
@click.option("--summary-json", type=click.Path(), default=None, help="Write the final summary here as JSON.")
@partition_option
@click.option("--base-url", envvar="OPENROUTER_BASE_URL", default=DEFAULT_BASE_URL, show_default=True,
              help="API base URL (or OPENROUTER_BASE_URL).")
@click.option("--api-key-file", type=click.Path(), default=None,
              help="Read the API key from this file (default: OPENROUTER_API_KEY).")
@click.option("--plan", is_flag=True, help="Send nothing: show allowed providers and the cost estimate.")
@common_options
def cli(input, output, model, max_tokens, temperature, top_p, seed, reasoning, reasoning_effort,
        extra_body, ignore_provider, only_provider, quantization, any_quantization, sort, no_fallbacks, data_collection,
        max_price_prompt, max_price_completion, concurrency, max_attempts, idle_timeout, workers, stream, proxy,
        backoff_base, grace, max_cost, token_budget, min_credits, credits_interval, done_files,
        failures, summary_json, partition, base_url, api_key_file, plan, quiet, debug):
    """Send prompt records (default: stdin) to OpenRouter; write response records."""
    extra = {}
    if extra_body:
        try:
            extra = json.loads(extra_body)
        except json.JSONDecodeError as e:
            raise KPError(f"--extra-body is not valid JSON: {e}", ExitCode.USAGE) from None
        if not isinstance(extra, dict):
            raise KPError("--extra-body must be a JSON object", ExitCode.USAGE)
    api_key = read_api_key(api_key_file, required=not plan)
    try:  # what the workers will build, checked here: a bad URL, key or CA file is exit 2
        CompletionClient(base_url, api_key or "-", idle_timeout=idle_timeout, proxy=proxy)
    except ValueError as e:
        raise KPError(redact(scrub(str(e), proxy)), ExitCode.USAGE) from None
    quantizations = default_quantizations(model, quantization, any_quantization)
    policy = Policy(ignore=list(ignore_provider), only=list(only_provider), quantizations=quantizations,
                    sort=sort, allow_fallbacks=not no_fallbacks, data_collection=data_collection,
                    max_price_prompt=max_price_prompt, max_price_completion=max_price_completion)
    request = RequestOptions(model=model, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                             seed=seed, reasoning=reasoning, reasoning_effort=reasoning_effort,
                             stream=stream, extra_body=extra)
    config = RunConfig(input=input, output=output, request=request, policy=policy,
                       done_files=list(done_files), failures=failures, concurrency=concurrency,
                       max_attempts=max_attempts, backoff_base=backoff_base, max_cost=max_cost,
                       token_budget=token_budget, min_credits=min_credits,
                       credits_interval=credits_interval, grace=grace, partition=partition)
    with tempfile.TemporaryDirectory(prefix="kp-infer-") as tmpdir:
        scan, done, spent, tokens = prepare(config, tmpdir)
        in_part = [i for i in scan.ids if in_partition(i, partition)]
        skipped = sum(1 for i in in_part if i in done)
        todo = len(in_part) - skipped

        try:
            endpoints = _uvloop_run(fetch_endpoints(base_url, api_key, model, proxy))
        except (TimeoutError, KPError, aiohttp.ClientError, OSError) as e:
            if plan:
                raise KPError(f"cannot read the endpoints table: {redact(scrub(str(e), proxy))}") from None
            say(f"kp-infer: warning: cannot read the endpoints table ({redact(scrub(str(e), proxy))}); "
                "routing is checked by provider name only", quiet)
            endpoints = None
        for warning in requantization_warnings(model, policy, endpoints):
            say(f"kp-infer: warning: {warning}", quiet)
        bound = price_bound(policy, endpoints)
        if endpoints is not None and not allowed_endpoints(policy, endpoints) and not plan:
            raise KPError("no provider in the endpoints table matches the routing flags "
                          "(see kp-infer --plan)", ExitCode.USAGE)
        if max_cost is not None and bound is None and not plan:
            raise KPError("--max-cost needs a price bound: the endpoints table could not be read; "
                          "pass --max-price-prompt and --max-price-completion", ExitCode.USAGE)
        budget = Budget(max_cost=max_cost, token_budget=token_budget, price=bound, max_tokens=max_tokens,
                        spent=spent, tokens=tokens)
        if plan:
            show_plan(policy, endpoints, scan, todo, budget, request)
            return
        balance_check = None
        if min_credits is not None:
            async def balance_check():
                try:
                    return await fetch_spendable_balance(base_url, api_key, proxy)
                except Exception as e:  # the engine prints it: no proxy password in it
                    raise KPError(redact(scrub(str(e), proxy))) from None

        bar = progress(total=todo, desc="kp-infer", unit="req", quiet=quiet)
        n_workers = (os.cpu_count() or 1) if workers is None else workers
        n_workers = min(n_workers, max(1, todo)) if n_workers else 0

        freeze_startup_objects()

        async def go():
            if n_workers:
                transport = WorkerPool(n_workers, base_url, api_key, idle_timeout=idle_timeout,
                                       proxy=proxy)
            else:
                transport = CompletionClient(base_url, api_key, idle_timeout=idle_timeout, proxy=proxy)
            async with transport:
                run = Run(config, scan, done, budget, endpoints, transport, bar, balance_check)
                run.stats.todo, run.stats.skipped = todo, skipped
                code = await run.run()
                return run, code

        try:
            run, code = _uvloop_run(go())
        finally:
            bar.close()
    summary = run.summary()
    if summary_json:
        with open(summary_json, "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
    say(format_summary(summary), quiet)
    if code != ExitCode.OK:
        sys.exit(code)


main = run_command(cli)
