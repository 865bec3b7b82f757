"""python -m kimipipe.standin: run the OpenRouter stand-in on 127.0.0.1 (or --host ADDR).

Usage:
    python -m kimipipe.standin --port-file /tmp/port --balance 5 --fault 429=0.1 --latency 2
    OPENROUTER_BASE_URL=http://127.0.0.1:$(cat /tmp/port)/api/v1 OPENROUTER_API_KEY=sk-or-standin ...

Prints `listening on http://HOST:PORT` to stderr once bound; `--port-file` gets the
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
                                    all, content, null-bytes, specials, vllm-split, gap,
                                    bad-bytes: standin/logprobs.py)
    --impostor PROVIDER=N[:HOW]     from its N-th answer that provider serves another model
                                    under the target's name: other text, usage counted
                                    by HOW: words (default), system=TEXT (an injected
                                    system prompt), tokenizer=DIR, template=FILE
                                    (standin/impostors.py: the facts each rests on)
    --usage-offset PROVIDER=N       that provider is honest but counts each prompt N
                                    tokens more (N < 0: fewer) and bills them (the Kimi
                                    Vendor Verifier accepts 0..+3)
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
    --max-model-len N               the context (default 262144): max_tokens above it or a
                                    prompt past it is vLLM's 400, prompt + max_tokens past
                                    it is cut short (finish_reason length)
    --fault 500|502|503|cut|noreasoning=RATE
                                    a server's faults; noreasoning: the answer is its
                                    content alone (no reasoning, no </think>)
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import sys
from typing import TYPE_CHECKING

from aiohttp import web

from ..cli import kp_command
from ..errors import KPError
from ..options import fields_for
from .config import Config
from .options import SECTIONS, StandInSettings
from .server import StandinState

if TYPE_CHECKING:
    from .selfhosted import SelfHosted


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def serve(config: Config, port: int, port_file: str | None, host: str = "127.0.0.1") -> None:
    standin: StandinState | SelfHosted
    try:
        if config.mode == "openrouter":
            standin = StandinState(config)
        else:
            from .selfhosted import SelfHosted
            standin = SelfHosted(config)
    except KPError as e:  # a tokenizer it cannot load (no chat template): one line
        print(f"standin: {e.message}", file=sys.stderr)
        raise SystemExit(2) from None
    runner = web.AppRunner(standin.app(), access_log=None, handler_cancellation=True,
                           shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True,
                       shutdown_timeout=1.0)
    try:
        await site.start()
    except OSError as e:  # the port is taken (or not ours to take): one line, not a traceback
        await runner.cleanup()
        standin.close()
        why = "the port is taken (something else listens there)" if e.errno == errno.EADDRINUSE \
            else e.strerror or str(e)
        print(f"standin: cannot listen on {_url_host(host)}:{port}: {why}; pick another --port, "
              "or --port 0 (any free port) with --port-file FILE"
              + ("" if e.errno == errno.EADDRINUSE else ", or another --host"), file=sys.stderr)
        raise SystemExit(2) from None
    bound = runner.addresses[0][1]
    if port_file:
        tmp = f"{port_file}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"{bound}\n")
        os.replace(tmp, port_file)
    print(f"listening on http://{_url_host(host)}:{bound}", file=sys.stderr, flush=True)
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


@kp_command("python -m kimipipe.standin", settings=StandInSettings, sections=SECTIONS,
            exit_codes="Exit codes: 0 stopped (SIGTERM, SIGINT); 2 a bad option, or the port "
                       "cannot be had.",
            examples="""
    python -m kimipipe.standin --port-file /tmp/port --balance 5 --fault 429=0.1 --latency 2
    python -m kimipipe.standin --mode vllm --port 30000
""")
def command(s: StandInSettings) -> None:
    """A local OpenRouter stand-in for tests, benchmarks and the offline demo."""
    raise_open_file_limit()
    config = Config(**fields_for(s, Config))
    try:
        config.check()
    except ValueError as e:
        print(f"standin: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(config, s.port, s.port_file, s.host))
    else:
        uvloop.run(serve(config, s.port, s.port_file, s.host))


def main(argv: list[str] | None = None) -> None:
    command.main(args=argv, prog_name="python -m kimipipe.standin")


if __name__ == "__main__":
    main()
