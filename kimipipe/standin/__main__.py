"""python -m kimipipe.standin: run the OpenRouter stand-in on 127.0.0.1.

Usage:
    python -m kimipipe.standin --port-file /tmp/port --balance 5 --fault 429=0.1 --latency 2
    OPENROUTER_BASE_URL=http://127.0.0.1:$(cat /tmp/port)/api/v1 OPENROUTER_API_KEY=sk-or-standin ...

Prints `listening on http://127.0.0.1:PORT` to stderr once bound; `--port-file` gets the
port number (written to a temporary name, then renamed). SIGTERM/SIGINT stop it cleanly.
Test-only control endpoints: GET /_standin/stats, POST /_standin/config (JSON).

Credit limits, as OpenRouter's limits docs describe them (bodies in refusals.py; all off
by default):
    --inflight-ratio R --settle S   in-flight spending budget: the worst cases of requests
                                    running or finished within S seconds, capped at R x the
                                    balance left; past it 402 in_flight_budget_exhausted
                                    with Retry-After; one request larger than the whole
                                    budget 402 weight_exceeds_budget
    --key-limit USD                 the key's limit: spent, 402 "Budget limit exceeded"
                                    (openrouter_key_limit); `/key` limit, limit_remaining
    --workspace-budget USD, --guardrail-budget USD
                                    the same refusal, openrouter_workspace_budget /
                                    openrouter_guardrail_budget
    --limit-status 403              those three refuse with 403 instead of 402 (both seen)
    --limit-reset daily|weekly|monthly
                                    their window (resets_at in bodies and /key)
    --moderation-marker WORD        prompts holding WORD get moderation's 403 (metadata
                                    reasons, flagged_input; no limit_source); also
                                    --fault moderation=RATE
Provider quirks (PROVIDER: a tag or provider name, as provider.only takes it):
    --drop-reasoning PROVIDER=RATE  that provider loses the reasoning at RATE (content
                                    only, reasoning_tokens 0)
    --inline-reasoning PROVIDER     that provider puts it in content as <think>...</think>
    --unopened-reasoning PROVIDER   no reasoning parser: content is reasoning</think>content
    --ignore-sampling PROVIDER      that provider does not support temperature/top_p: it
                                    samples at its own values, drops what is sent, and
                                    provider.require_parameters routes around it
    --logprobs PROVIDER[=VARIANT]   that provider lists and returns token logprobs (real
                                    tokens, a share --noncanonical cut otherwise; VARIANT:
                                    all, content, null-bytes, specials, gap, bad-bytes:
                                    standin/logprobs.py)
    --impostor PROVIDER=N[:HOW]     from its N-th answer that provider serves another model
                                    under the target's name: other text, usage counted
                                    by HOW: words (default), system=TEXT (an injected
                                    system prompt), tokenizer=DIR, template=FILE
                                    (standin/impostors.py: the facts each rests on)
    --not-distillable               the models' authors do not allow distillation
                                    (is_trainable_text false; enforce_distillable_text
                                    requests get the no-route 404)
Billing (billing.py):
    --price-override PROVIDER=FACTOR[:MIN_PROMPT_TOKENS]
                                    a pricing.overrides[] entry at FACTOR x the base prices
                                    (above that prompt length), billed when it applies
    --discount PROVIDER=D           pricing.discount D: billed at price x (1 - D)
    --no-cost RATE, --no-usage RATE that share of billed answers shows usage without
                                    `cost`, or no usage at all: the cost is in /generation
                                    only, after --generation-delay S seconds (404 before)
    --fault zero=RATE               zero-completion answers, not billed
A normal key (what most users have): --credits-mode forbidden (/credits 403, "only
management keys") and no --key-limit (/key limit null): the balance is unreadable.
Usage counts:
    --tokenizer DIR                 count prompt and completion tokens with this tokenizer
                                    directory and its chat template, as a server does
                                    (standin/token_counts.py); default: words
A self-hosted server instead (standin/selfhosted.py):
    --mode vllm|sglang              vLLM's or SGLang's OpenAI-compatible API under /v1 (no
                                    OpenRouter endpoints, no billing); vLLM returns token
                                    IDs for return_token_ids; --tokenizer defaults to the
                                    bundled kimi-k2.5-mini-fast
    --noncanonical RATE             share of answers with one word sampled as two pieces
    --system-prompt TEXT            the server's template adds this system message
    --served-model-name NAME        serve moonshotai/kimi-k2.5 under NAME only (vLLM's
                                    --served-model-name; GET /v1/models lists NAME)
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import signal
import sys

from aiohttp import web

from .availability import AVAILABILITY
from .config import (
    CREDITS_MODES,
    DEFAULT_NONCANONICAL,
    FAULT_KINDS,
    LOGPROBS_VARIANTS,
    MIDSTREAM_CODES,
    MODES,
    STREAM_USAGES,
    Config,
)
from .providers import known_provider
from .refusals import LIMIT_RESETS
from .server import StandIn


def parse_provider(text: str) -> str:
    if not known_provider(text):
        raise argparse.ArgumentTypeError(
            f"unknown provider {text!r} (a tag or provider name of the endpoints table)")
    return text


def parse_provider_rate(text: str) -> tuple[str, float]:
    slug, sep, rate = text.rpartition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected PROVIDER=RATE, got {text!r}")
    try:
        value = float(rate)
    except ValueError:
        raise argparse.ArgumentTypeError(f"rate must be a number, got {rate!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"rate must be in [0, 1], got {value}")
    return parse_provider(slug), value


def parse_logprobs(text: str) -> tuple[str, str]:
    slug, _, variant = text.partition("=")
    variant = variant or "all"
    if variant not in LOGPROBS_VARIANTS:
        raise argparse.ArgumentTypeError(
            f"unknown logprobs variant {variant!r} (variants: {', '.join(LOGPROBS_VARIANTS)})")
    return parse_provider(slug), variant


def parse_fault(text: str) -> tuple[str, float]:
    kind, sep, rate = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KIND=RATE, got {text!r}")
    if kind not in FAULT_KINDS:
        raise argparse.ArgumentTypeError(
            f"unknown fault kind {kind!r} (kinds: {', '.join(FAULT_KINDS)})")
    try:
        value = float(rate)
    except ValueError:
        raise argparse.ArgumentTypeError(f"fault rate must be a number, got {rate!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"fault rate must be in [0, 1], got {value}")
    return kind, value


def parse_impostor(text: str) -> tuple[str, tuple[int, str]]:
    from .impostors import check_impostor
    slug, sep, rest = text.partition("=")
    after, _, how = rest.partition(":")
    try:
        value = (int(after), how or "words")
        check_impostor(*value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected PROVIDER=N[:HOW], got {text!r}: {e}") from None
    if not sep:
        raise argparse.ArgumentTypeError(f"expected PROVIDER=N[:HOW], got {text!r}")
    return parse_provider(slug), value


def parse_price_override(text: str) -> tuple[str, tuple[float, int | None]]:
    slug, sep, rest = text.rpartition("=")
    factor, _, min_prompt = rest.partition(":")
    try:
        value = (float(factor), int(min_prompt) if min_prompt else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected PROVIDER=FACTOR[:MIN_PROMPT_TOKENS], got {text!r}") from None
    if not sep or value[0] <= 0:
        raise argparse.ArgumentTypeError(f"expected PROVIDER=FACTOR[:MIN_PROMPT_TOKENS], got {text!r}")
    return parse_provider(slug), value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kimipipe.standin",
        description="A local OpenRouter stand-in for tests, benchmarks and the offline demo.")
    p.add_argument("--port", type=int, default=0, help="TCP port (default 0: any free port)")
    p.add_argument("--port-file", help="write the bound port number to this file")
    p.add_argument("--api-key", default="sk-or-standin", help="the one accepted bearer token")
    p.add_argument("--balance", type=float, default=100.0, help="account total_credits in USD")
    p.add_argument("--key-limit", type=float, default=None,
                   help="the key's limit in USD: its remaining part caps one request's worst "
                        "case (402), and once spent every request gets 402 \"Budget limit "
                        "exceeded\" (limit_source openrouter_key_limit)")
    p.add_argument("--credits-mode", choices=CREDITS_MODES, default="normal",
                   help="/credits answers normally, 403, or 200 with zeros")
    p.add_argument("--latency", type=float, default=0.0,
                   help="seconds before the first content (keep-alive comments meanwhile)")
    p.add_argument("--tokens-per-second", type=float, default=0.0,
                   help="streamed token rate, each token its own write up to 100 a "
                        "second (0: all at once)")
    p.add_argument("--keepalive-interval", type=float, default=1.0,
                   help="seconds between `: OPENROUTER PROCESSING` comments")
    p.add_argument("--fault", action="append", type=parse_fault, default=[],
                   metavar="KIND=RATE", help=f"inject a fault; kinds: {', '.join(FAULT_KINDS)}")
    p.add_argument("--retry-after", type=float, default=1.0, help="Retry-After of 429 faults")
    p.add_argument("--hang-seconds", type=float, default=3600.0, help="how long a hang lasts")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault draws")
    p.add_argument("--ledger", help="append one JSON line per charged generation")
    p.add_argument("--request-log",
                   help="append every completion request body (after auth), one per line")
    p.add_argument("--price-scale", type=float, default=1.0, help="multiply every price")
    p.add_argument("--bill-cancelled", action="store_true",
                   help="charge a fault-free generation whose client disconnected mid-way "
                        "(as some providers do)")
    limits = p.add_argument_group("credit limits (OpenRouter's limits docs; all off by default)")
    limits.add_argument("--inflight-ratio", type=float, default=None, metavar="R",
                        help="in-flight spending budget: the worst cases (prompt + max_tokens "
                             "at the endpoint's prices) of requests running or settling may "
                             "sum to R x the balance left; past it 402 "
                             "in_flight_budget_exhausted with Retry-After")
    limits.add_argument("--settle", type=float, default=1.0, metavar="S",
                        help="seconds a finished request's worst case still counts against "
                             "the in-flight budget (default 1)")
    limits.add_argument("--workspace-budget", type=float, default=None, metavar="USD",
                        help="a workspace budget: once spent, 402 \"Budget limit exceeded\" "
                             "(limit_source openrouter_workspace_budget)")
    limits.add_argument("--guardrail-budget", type=float, default=None, metavar="USD",
                        help="a guardrail budget: once spent, 402 \"Budget limit exceeded\" "
                             "(limit_source openrouter_guardrail_budget)")
    limits.add_argument("--limit-status", type=int, choices=(403, 402), default=402,
                        help="status of the key-limit, workspace and guardrail refusals "
                             "(OpenRouter documents 402 and has been seen to send both; default 402)")
    limits.add_argument("--limit-reset", choices=LIMIT_RESETS, default=None,
                        help="the window of those budgets: resets_at in their refusals and in "
                             "/key (default: lifetime, resets_at null)")
    limits.add_argument("--moderation-marker", default=None, metavar="WORD",
                        help="a prompt whose last user message holds WORD is refused by "
                             "moderation: 403 with metadata reasons and flagged_input, no "
                             "limit_source (random ones: --fault moderation=RATE)")
    quirks = p.add_argument_group(
        "provider quirks (PROVIDER: a tag or provider name, as provider.only takes it; a base "
        "slug takes its variants)")
    quirks.add_argument("--drop-reasoning", action="append", type=parse_provider_rate,
                        default=[], metavar="PROVIDER=RATE",
                        help="that provider returns no reasoning for a share RATE of its "
                             "answers (content only, reasoning_tokens 0)")
    quirks.add_argument("--inline-reasoning", action="append", type=parse_provider, default=[],
                        metavar="PROVIDER",
                        help="that provider puts the reasoning in content as "
                             "<think>...</think> (stream: in content deltas)")
    quirks.add_argument("--unopened-reasoning", action="append", type=parse_provider,
                        default=[], metavar="PROVIDER",
                        help="that provider runs the model with no reasoning parser: the "
                             "content is the raw generation, reasoning</think>content (the "
                             "<think> was the prompt's)")
    quirks.add_argument("--ignore-sampling", action="append", type=parse_provider, default=[],
                        metavar="PROVIDER",
                        help="that provider does not support temperature/top_p (absent from "
                             "its supported_parameters): it samples at its own values and "
                             "drops what is sent, unless provider.require_parameters is true, "
                             "which routes around it")
    quirks.add_argument("--impostor", action="append", type=parse_impostor, default=[],
                        metavar="PROVIDER=N[:HOW]",
                        help="from its N-th answer on, that provider serves another model "
                             "under the target's name: other text, its usage counted by HOW: "
                             "words (default: another tokenizer), system=TEXT (an injected "
                             "system prompt), tokenizer=DIR, template=FILE (the --tokenizer "
                             "under another chat template); see standin/impostors.py")
    quirks.add_argument("--not-distillable", action="store_true",
                        help="the models' authors do not allow distillation: "
                             "is_trainable_text false in /models, and a request with "
                             "provider.enforce_distillable_text gets the no-route 404")
    quirks.add_argument("--logprobs", action="append", type=parse_logprobs, default=[],
                        metavar="PROVIDER[=VARIANT]",
                        help="that provider lists logprobs in supported_parameters and, asked "
                             "logprobs: true, returns the tokens it sampled (real tokens of "
                             "--tokenizer, default the bundled kimi-k2.5-mini-fast; a share "
                             "--noncanonical cut otherwise); VARIANT: "
                             + ", ".join(LOGPROBS_VARIANTS) + " (standin/logprobs.py)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="count usage with this tokenizer directory (its chat template; loaded "
                        "with trust_remote_code), as a server does; default: words")
    wire = p.add_argument_group("the wire's documented variants (OpenRouter sends each)")
    wire.add_argument("--stream-usage", choices=STREAM_USAGES, default="own-chunk",
                      help="where a stream's usage comes: a last chunk of its own with "
                           "choices [] (default), or on a last finish chunk")
    wire.add_argument("--midstream-code", choices=MIDSTREAM_CODES, default="502",
                      help="the error code of a mid-stream error chunk (--fault midstream)")
    wire.add_argument("--unavailable", choices=tuple(AVAILABILITY), default=None, metavar="CODE",
                      help="refuse every completion with this error.availability code "
                           f"({', '.join(AVAILABILITY)})")
    wire.add_argument("--endpoint-nulls", action="store_true",
                      help="the endpoints table with the nulls and missing keys the service "
                           "sends (quantization, max_completion_tokens, pricing keys, "
                           "supported_parameters)")
    server = p.add_argument_group(
        "a self-hosted server instead of OpenRouter (standin/selfhosted.py)")
    server.add_argument("--mode", choices=MODES, default="openrouter",
                        help="whose API to answer: OpenRouter's (/api/v1), or vLLM's or "
                             "SGLang's OpenAI-compatible server (/v1: token IDs with vLLM's "
                             "return_token_ids, none of OpenRouter's endpoints)")
    server.add_argument("--noncanonical", type=float, default=None, metavar="RATE",
                        help="vllm/sglang: share of answers in which one word is sampled as "
                             f"two pieces (default {DEFAULT_NONCANONICAL})")
    server.add_argument("--system-prompt", default=None, metavar="TEXT",
                        help="vllm/sglang: the server's template puts this system message "
                             "first when the conversation has none")
    server.add_argument("--served-model-name", default=None, metavar="NAME",
                        help="vllm/sglang: serve moonshotai/kimi-k2.5 under NAME only, as "
                             "vLLM's --served-model-name does")
    billing = p.add_argument_group("billing (billing.py)")
    billing.add_argument("--price-override", action="append", type=parse_price_override,
                         default=[], metavar="PROVIDER=FACTOR[:MIN_PROMPT_TOKENS]",
                         help="that provider's pricing gets an overrides[] entry at FACTOR x "
                              "its base prices (above MIN_PROMPT_TOKENS prompt tokens when "
                              "given), and bills it")
    billing.add_argument("--discount", action="append", type=parse_provider_rate, default=[],
                         metavar="PROVIDER=D", help="that provider's pricing.discount: it "
                                                     "bills price x (1 - D)")
    billing.add_argument("--no-cost", type=float, default=0.0, metavar="RATE",
                         help="share of billed answers whose usage has no `cost`")
    billing.add_argument("--no-usage", type=float, default=0.0, metavar="RATE",
                         help="share of billed answers with no usage at all")
    billing.add_argument("--generation-delay", type=float, default=0.0, metavar="S",
                         help="seconds GET /generation answers 404 after a generation ends")
    return p


async def serve(config: Config, port: int, port_file: str | None) -> None:
    if config.mode == "openrouter":
        standin = StandIn(config)
    else:
        from .selfhosted import SelfHosted
        standin = SelfHosted(config)
    runner = web.AppRunner(standin.app(), access_log=None, handler_cancellation=True,
                           shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096, reuse_address=True,
                       shutdown_timeout=1.0)
    try:
        await site.start()
    except OSError as e:  # the port is taken (or not ours to take): one line, not a traceback
        await runner.cleanup()
        standin.close()
        why = "the port is taken (something else listens there)" if e.errno == errno.EADDRINUSE \
            else e.strerror or str(e)
        print(f"standin: cannot listen on 127.0.0.1:{port}: {why}; pick another --port, "
              "or --port 0 (any free port) with --port-file FILE", file=sys.stderr)
        raise SystemExit(2) from None
    bound = runner.addresses[0][1]
    if port_file:
        tmp = f"{port_file}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"{bound}\n")
        os.replace(tmp, port_file)
    print(f"listening on http://127.0.0.1:{bound}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        standin.close()


def raise_open_file_limit() -> None:
    """Thousands of connections need thousands of descriptors: lift the soft limit."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY
                                                        else max(soft, 65536), hard))
    except (ImportError, ValueError, OSError):
        pass


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    raise_open_file_limit()
    config = Config(
        api_key=args.api_key, balance=args.balance, key_limit=args.key_limit,
        credits_mode=args.credits_mode, latency=args.latency,
        tokens_per_second=args.tokens_per_second, keepalive_interval=args.keepalive_interval,
        faults=dict(args.fault), retry_after=args.retry_after, hang_seconds=args.hang_seconds,
        seed=args.seed, ledger=args.ledger, request_log=args.request_log,
        price_scale=args.price_scale, bill_cancelled=args.bill_cancelled,
        inflight_ratio=args.inflight_ratio, settle=args.settle, limit_status=args.limit_status,
        limit_reset=args.limit_reset, workspace_budget=args.workspace_budget,
        guardrail_budget=args.guardrail_budget, moderation_marker=args.moderation_marker,
        drop_reasoning=dict(args.drop_reasoning), inline_reasoning=args.inline_reasoning,
        unopened_reasoning=args.unopened_reasoning,
        ignore_sampling=args.ignore_sampling, not_distillable=args.not_distillable,
        logprobs=dict(args.logprobs),
        stream_usage=args.stream_usage, midstream_code=args.midstream_code,
        unavailable=args.unavailable, endpoint_nulls=args.endpoint_nulls,
        price_overrides=dict(args.price_override), discounts=dict(args.discount),
        no_cost_rate=args.no_cost, no_usage_rate=args.no_usage,
        generation_delay=args.generation_delay, tokenizer=args.tokenizer, mode=args.mode,
        impostors=dict(args.impostor),
        noncanonical_rate=args.noncanonical, system_prompt=args.system_prompt,
        served_model_name=args.served_model_name)
    try:
        config.check()
    except ValueError as e:
        print(f"standin: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        import uvloop
    except ImportError:
        uvloop = None
    if uvloop is not None:
        uvloop.run(serve(config, args.port, args.port_file))
    else:
        asyncio.run(serve(config, args.port, args.port_file))


if __name__ == "__main__":
    main()
