"""The stand-in's options (`python -m kimipipe.standin`), each declared once, on the field
of `StandInSettings` it fills: where it listens, and with `fills=Config` the Config field of
that name (standin/config.py, which checks the values once). The values spelled
`PROVIDER=RATE`, `KIND=RATE`, ... are read by the `parse_*` functions here; their ValueError
is the usage error (exit 2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..options import CommandSettings, option
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


def parse_provider(text: str) -> str:
    if not known_provider(text):
        raise ValueError(f"unknown provider {text!r} (a tag or provider name of the endpoints table)")
    return text


def parse_provider_rate(text: str) -> tuple[str, float]:
    slug, sep, rate = text.rpartition("=")
    if not sep:
        raise ValueError(f"expected PROVIDER=RATE, got {text!r}")
    try:
        value = float(rate)
    except ValueError:
        raise ValueError(f"rate must be a number, got {rate!r}") from None
    if not 0 <= value <= 1:
        raise ValueError(f"rate must be in [0, 1], got {value}")
    return parse_provider(slug), value


def parse_logprobs(text: str) -> tuple[str, str]:
    slug, _, variant = text.partition("=")
    variant = variant or "all"
    if variant not in LOGPROBS_VARIANTS:
        raise ValueError(
            f"unknown logprobs variant {variant!r} (variants: {', '.join(LOGPROBS_VARIANTS)})")
    return parse_provider(slug), variant


def parse_fault(text: str) -> tuple[str, float]:
    kind, sep, rate = text.partition("=")
    if not sep:
        raise ValueError(f"expected KIND=RATE, got {text!r}")
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r} (kinds: {', '.join(FAULT_KINDS)})")
    try:
        value = float(rate)
    except ValueError:
        raise ValueError(f"fault rate must be a number, got {rate!r}") from None
    if not 0 <= value <= 1:
        raise ValueError(f"fault rate must be in [0, 1], got {value}")
    return kind, value


def parse_impostor(text: str) -> tuple[str, tuple[int, str]]:
    from .impostors import check_impostor
    slug, sep, rest = text.partition("=")
    after, _, how = rest.partition(":")
    try:
        value = (int(after), how or "words")
        check_impostor(*value)
    except ValueError as e:
        raise ValueError(f"expected PROVIDER=N[:HOW], got {text!r}: {e}") from None
    if not sep:
        raise ValueError(f"expected PROVIDER=N[:HOW], got {text!r}")
    return parse_provider(slug), value


def parse_usage_offset(text: str) -> tuple[str, int]:
    slug, sep, tokens = text.rpartition("=")
    try:
        value = int(tokens)
    except ValueError:
        value = None
    if not sep or value is None:
        raise ValueError(f"expected PROVIDER=N (N an integer), got {text!r}")
    return parse_provider(slug), value


def parse_price_override(text: str) -> tuple[str, tuple[float, int | None]]:
    slug, sep, rest = text.rpartition("=")
    factor, _, min_prompt = rest.partition(":")
    try:
        value = (float(factor), int(min_prompt) if min_prompt else None)
    except ValueError:
        raise ValueError(f"expected PROVIDER=FACTOR[:MIN_PROMPT_TOKENS], got {text!r}") from None
    if not sep or value[0] <= 0:
        raise ValueError(f"expected PROVIDER=FACTOR[:MIN_PROMPT_TOKENS], got {text!r}")
    return parse_provider(slug), value


class Spelled(click.ParamType):
    """A value spelled as METAVAR says (`KIND=RATE`), read by PARSE; its ValueError is the
    message of the usage error (exit 2)."""

    def __init__(self, parse: Callable[[str], Any]):
        self.parse, self.name = parse, parse.__name__.removeprefix("parse_")

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


SERVER = "The server and the account"
LIMITS = "Credit limits (OpenRouter's limits docs; all off by default)"
QUIRKS = ("Provider quirks (PROVIDER: a tag or provider name, as provider.only takes it; a "
          "base slug takes its variants)")
WIRE = "The wire's documented variants (OpenRouter sends each)"
SELF_HOSTED = "A self-hosted server instead of OpenRouter (standin/selfhosted.py)"
BILLING = "Billing (billing.py)"
OTHER = "Other options"
SECTIONS = [SERVER, LIMITS, QUIRKS, WIRE, SELF_HOSTED, BILLING, OTHER]


class StandInSettings(CommandSettings):
    """The stand-in's command line: where it listens, and its Config (`fills=Config`)."""

    host: str = option("--host", default="127.0.0.1", metavar="ADDR", section=SERVER,
                       help="address to listen on (default 127.0.0.1, this machine only; "
                            "0.0.0.0 or :: for every interface, e.g. a rehearsal from another "
                            "machine: the stand-in has no real authentication)")
    port: int = option("--port", type=int, default=0, metavar="PORT", section=SERVER,
                       help="TCP port (default 0: any free port)")
    port_file: str | None = option("--port-file", metavar="FILE", section=SERVER,
                                   help="write the bound port number to this file")
    api_key: str = option("--api-key", default="sk-or-standin", metavar="KEY", section=SERVER,
                          fills=Config,
                          help="the one accepted bearer token")
    balance: float = option("--balance", type=float, default=100.0, section=SERVER, fills=Config,
                            help="account total_credits in USD")
    key_limit: float | None = option(
        "--key-limit", type=float, default=None, section=SERVER, fills=Config,
        help="the key's limit in USD: its remaining part caps one request's worst case "
             "(402), and once spent every request gets 402 \"Budget limit exceeded\" "
             "(limit_source openrouter_key_limit)")
    credits_mode: str = option(
        "--credits-mode", type=click.Choice(CREDITS_MODES), default="normal", section=SERVER,
        fills=Config, help="/credits answers normally, 403, or 200 with zeros")
    latency: float = option(
        "--latency", type=float, default=0.0, section=SERVER, fills=Config,
        help="seconds before the first content (keep-alive comments meanwhile)")
    tokens_per_second: float = option(
        "--tokens-per-second", type=float, default=0.0, section=SERVER, fills=Config,
        help="streamed token rate, each token its own write up to 100 a second (0: all at once)")
    keepalive_interval: float = option(
        "--keepalive-interval", type=float, default=1.0, section=SERVER, fills=Config,
        help="seconds between `: OPENROUTER PROCESSING` comments")
    faults: dict[str, float] = option(
        "--fault", multiple=True, type=Spelled(parse_fault), convert=dict, metavar="KIND=RATE",
        section=SERVER, fills=Config, help=f"inject a fault; kinds: {', '.join(FAULT_KINDS)}")
    retry_after: float = option("--retry-after", type=float, default=1.0, section=SERVER,
                                fills=Config, help="Retry-After of 429 faults")
    hang_seconds: float = option("--hang-seconds", type=float, default=3600.0, section=SERVER,
                                 fills=Config, help="how long a hang lasts")
    seed: int = option("--seed", type=int, default=0, section=SERVER, fills=Config,
                       help="seed of the fault draws")
    ledger: str | None = option("--ledger", metavar="FILE", section=SERVER, fills=Config,
                                help="append one JSON line per charged generation")
    request_log: str | None = option(
        "--request-log", metavar="FILE", section=SERVER, fills=Config,
        help="append every completion request body (after auth), one per line")
    price_scale: float = option("--price-scale", type=float, default=1.0, section=SERVER,
                                fills=Config, help="multiply every price")
    bill_cancelled: bool = option(
        "--bill-cancelled", is_flag=True, section=SERVER, fills=Config,
        help="charge a fault-free generation whose client disconnected mid-way (as some "
             "providers do)")
    tokenizer: str | None = option(
        "--tokenizer", default=None, metavar="DIR", section=SERVER, fills=Config,
        help="count usage with this tokenizer directory (its chat template; loaded with "
             "trust_remote_code), as a server does; default: words")
    chat_template: str | None = option(
        "--chat-template", default=None, metavar="FILE", section=SERVER, fills=Config,
        type=click.Path(exists=True, dir_okay=False),
        help="a Jinja chat template file to render prompts with instead of the tokenizer "
             "directory's (as kp-tokenize --chat-template)")
    # -- credit limits
    inflight_ratio: float | None = option(
        "--inflight-ratio", type=float, default=None, metavar="R", section=LIMITS, fills=Config,
        help="in-flight spending budget: the worst cases (prompt + max_tokens at the "
             "endpoint's prices) of requests running or settling may sum to R x the balance "
             "left; past it 402 in_flight_budget_exhausted with Retry-After")
    settle: float = option(
        "--settle", type=float, default=1.0, metavar="S", section=LIMITS, fills=Config,
        help="seconds a finished request's worst case still counts against the in-flight "
             "budget (default 1)")
    workspace_budget: float | None = option(
        "--workspace-budget", type=float, default=None, metavar="USD", section=LIMITS,
        fills=Config,
        help="a workspace budget: once spent, 402 \"Budget limit exceeded\" (limit_source "
             "openrouter_workspace_budget)")
    guardrail_budget: float | None = option(
        "--guardrail-budget", type=float, default=None, metavar="USD", section=LIMITS,
        fills=Config,
        help="a guardrail budget: once spent, 402 \"Budget limit exceeded\" (limit_source "
             "openrouter_guardrail_budget)")
    limit_status: int = option(
        "--limit-status", type=click.Choice(["403", "402"]), default="402", convert=int,
        section=LIMITS, fills=Config,
        help="status of the key-limit, workspace and guardrail refusals (OpenRouter "
             "documents 402 and has been seen to send both; default 402)")
    limit_reset: str | None = option(
        "--limit-reset", type=click.Choice(LIMIT_RESETS), default=None, section=LIMITS,
        fills=Config,
        help="the window of those budgets: resets_at in their refusals and in /key "
             "(default: lifetime, resets_at null)")
    moderation_marker: str | None = option(
        "--moderation-marker", default=None, metavar="WORD", section=LIMITS, fills=Config,
        help="a prompt whose last user message holds WORD is refused by moderation: 403 "
             "with metadata reasons and flagged_input, no limit_source (random ones: "
             "--fault moderation=RATE)")
    # -- provider quirks
    drop_reasoning: dict[str, float] = option(
        "--drop-reasoning", multiple=True, type=Spelled(parse_provider_rate), convert=dict,
        metavar="PROVIDER=RATE", section=QUIRKS, fills=Config,
        help="that provider returns no reasoning for a share RATE of its answers (content "
             "only, reasoning_tokens 0)")
    inline_reasoning: list[str] = option(
        "--inline-reasoning", multiple=True, type=Spelled(parse_provider), metavar="PROVIDER",
        section=QUIRKS, fills=Config,
        help="that provider puts the reasoning in content as <think>...</think> (stream: in "
             "content deltas)")
    unopened_reasoning: list[str] = option(
        "--unopened-reasoning", multiple=True, type=Spelled(parse_provider),
        metavar="PROVIDER", section=QUIRKS, fills=Config,
        help="that provider runs the model with no reasoning parser: the content is the raw "
             "generation, reasoning</think>content (the <think> was the prompt's)")
    ignore_sampling: list[str] = option(
        "--ignore-sampling", multiple=True, type=Spelled(parse_provider), metavar="PROVIDER",
        section=QUIRKS, fills=Config,
        help="that provider does not support temperature/top_p (absent from its "
             "supported_parameters): it samples at its own values and drops what is sent, "
             "unless provider.require_parameters is true, which routes around it")
    impostors: dict[str, tuple] = option(
        "--impostor", multiple=True, type=Spelled(parse_impostor), convert=dict,
        metavar="PROVIDER=N[:HOW]", section=QUIRKS, fills=Config,
        help="from its N-th answer on, that provider serves another model under the "
             "target's name: other text, its usage counted by HOW: words (default: another "
             "tokenizer), system=TEXT (an injected system prompt), tokenizer=DIR, "
             "template=FILE (the --tokenizer under another chat template); see "
             "standin/impostors.py")
    usage_offsets: dict[str, int] = option(
        "--usage-offset", multiple=True, type=Spelled(parse_usage_offset), convert=dict,
        metavar="PROVIDER=N", section=QUIRKS, fills=Config,
        help="that provider serves the model honestly, but its stack counts every prompt N "
             "tokens more (N < 0: fewer) in usage.prompt_tokens, and bills them: Moonshot's "
             "Kimi Vendor Verifier accepts 0..+3 of a vendor")
    not_distillable: bool = option(
        "--not-distillable", is_flag=True, section=QUIRKS, fills=Config,
        help="the models' authors do not allow distillation: is_trainable_text false in "
             "/models, and a request with provider.enforce_distillable_text gets the "
             "no-route 404")
    logprobs: dict[str, str] = option(
        "--logprobs", multiple=True, type=Spelled(parse_logprobs), convert=dict,
        metavar="PROVIDER[=VARIANT]", section=QUIRKS, fills=Config,
        help="that provider lists logprobs in supported_parameters and, asked logprobs: "
             "true, returns the tokens it sampled (real tokens of --tokenizer, default the "
             "bundled kimi-k2.5-mini-fast; a share --noncanonical cut otherwise); VARIANT: "
             + ", ".join(LOGPROBS_VARIANTS) + " (standin/logprobs.py)")
    # -- the wire's documented variants
    stream_usage: str = option(
        "--stream-usage", type=click.Choice(STREAM_USAGES), default="own-chunk", section=WIRE,
        fills=Config,
        help="where a stream's usage comes: a last chunk of its own with choices [] "
             "(default), or on a last finish chunk")
    midstream_code: str = option(
        "--midstream-code", type=click.Choice(MIDSTREAM_CODES), default="502", section=WIRE,
        fills=Config, help="the error code of a mid-stream error chunk (--fault midstream)")
    unavailable: str | None = option(
        "--unavailable", type=click.Choice(tuple(AVAILABILITY)), default=None, metavar="CODE",
        section=WIRE, fills=Config,
        help="refuse every completion with this error.availability code "
             f"({', '.join(AVAILABILITY)})")
    endpoint_nulls: bool = option(
        "--endpoint-nulls", is_flag=True, section=WIRE, fills=Config,
        help="the endpoints table with the nulls and missing keys the service sends "
             "(quantization, max_completion_tokens, pricing keys, supported_parameters)")
    # -- a self-hosted server instead
    mode: str = option(
        "--mode", type=click.Choice(MODES), default="openrouter", section=SELF_HOSTED,
        fills=Config,
        help="whose API to answer: OpenRouter's (/api/v1), or vLLM's or SGLang's "
             "OpenAI-compatible server (/v1: token IDs with vLLM's return_token_ids, none of "
             "OpenRouter's endpoints)")
    noncanonical_rate: float | None = option(
        "--noncanonical", type=float, default=None, metavar="RATE", section=SELF_HOSTED,
        fills=Config,
        help="vllm/sglang: share of answers in which one word is sampled as two pieces "
             f"(default {DEFAULT_NONCANONICAL})")
    system_prompt: str | None = option(
        "--system-prompt", default=None, metavar="TEXT", section=SELF_HOSTED, fills=Config,
        help="vllm/sglang: the server's template puts this system message first when the "
             "conversation has none")
    served_model_name: str | None = option(
        "--served-model-name", default=None, metavar="NAME", section=SELF_HOSTED,
        fills=Config,
        help="vllm/sglang: serve moonshotai/kimi-k2.5 under NAME only, as vLLM's "
             "--served-model-name does")
    max_model_len: int = option(
        "--max-model-len", type=int, default=262144, metavar="N", section=SELF_HOSTED,
        fills=Config,
        help="vllm/sglang: the context in tokens, as vLLM's flag: GET /v1/models reports it, "
             "max_tokens above it or a prompt past it is a 400, prompt + max_tokens past it "
             "is cut short (finish_reason length)")
    # -- billing
    price_overrides: dict[str, tuple] = option(
        "--price-override", multiple=True, type=Spelled(parse_price_override), convert=dict,
        metavar="PROVIDER=FACTOR[:MIN_PROMPT_TOKENS]", section=BILLING, fills=Config,
        help="that provider's pricing gets an overrides[] entry at FACTOR x its base prices "
             "(above MIN_PROMPT_TOKENS prompt tokens when given), and bills it")
    discounts: dict[str, float] = option(
        "--discount", multiple=True, type=Spelled(parse_provider_rate), convert=dict,
        metavar="PROVIDER=D", section=BILLING, fills=Config,
        help="that provider's pricing.discount: it bills price x (1 - D)")
    no_cost_rate: float = option(
        "--no-cost", type=float, default=0.0, metavar="RATE", section=BILLING, fills=Config,
        help="share of billed answers whose usage has no `cost`")
    no_usage_rate: float = option(
        "--no-usage", type=float, default=0.0, metavar="RATE", section=BILLING, fills=Config,
        help="share of billed answers with no usage at all")
    generation_delay: float = option(
        "--generation-delay", type=float, default=0.0, metavar="S", section=BILLING,
        fills=Config, help="seconds GET /generation answers 404 after a generation ends")
