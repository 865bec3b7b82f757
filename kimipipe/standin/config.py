"""What a run of the stand-in is told (`python -m kimipipe.standin` options, the `StandIn`
test helper's keyword arguments), checked once, and changed live by `POST /_standin/config`.

Every setting added for the credit limits and the provider quirks is off by default, so a
stand-in started without them answers as it always did.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from .availability import AVAILABILITY
from .providers import known_provider
from .refusals import LIMIT_RESETS, LIMIT_STATUSES

FAULT_KINDS = ("429", "500", "502", "503", "524", "529", "error200", "empty", "midstream",
               "cut", "usagecut", "hang", "heartbeat", "misroute", "moderation", "zero",
               "noreasoning")
CREDITS_MODES = ("normal", "forbidden", "zeros")
MODES = ("openrouter", "vllm", "sglang")  # whose API it answers (selfhosted.py: the servers)
# the faults a self-hosted mode injects (noreasoning: its own; OpenRouter's providers drop
# their reasoning by drop_reasoning)
SERVER_FAULTS = ("500", "502", "503", "cut", "noreasoning")
DEFAULT_NONCANONICAL = 0.25
# The tokenizer whose real tokens the stand-in samples (server modes, --logprobs) unless
# --tokenizer names another: the bundled small Kimi-style one.
DEFAULT_TOKENIZER = Path(__file__).resolve().parent.parent / "data" / "tokenizers" / "kimi-k2.5-mini-fast"
# What a provider's token logprobs cover (logprobs.py, `--logprobs PROVIDER=VARIANT`).
LOGPROBS_VARIANTS = ("all", "content", "null-bytes", "specials", "vllm-split", "gap", "bad-bytes")
# Where a stream's usage comes (both are OpenRouter's): a last chunk of its own with
# `choices: []`, or on a last finish chunk (one choice, empty delta, finish_reason repeated).
STREAM_USAGES = ("own-chunk", "finish-chunk")
# The `code` of a mid-stream error chunk (fault midstream): a status, or a string code.
MIDSTREAM_CODES = ("502", "429", "408", "provider_overloaded", "server_error")


@dataclass
class Config:
    api_key: str = "sk-or-standin"
    balance: float = 100.0
    key_limit: float | None = None
    credits_mode: str = "normal"
    latency: float = 0.0
    tokens_per_second: float = 0.0
    keepalive_interval: float = 1.0
    faults: dict[str, float] = field(default_factory=dict)
    retry_after: float = 1.0
    hang_seconds: float = 3600.0
    seed: int = 0
    ledger: str | None = None
    request_log: str | None = None   # every completion request body as received, one per line
    price_scale: float = 1.0
    bill_cancelled: bool = False     # charge a generation whose client went away mid-way
    # -- credit limits (refusals.py) --
    inflight_ratio: float | None = None   # in-flight budget = ratio x balance left; None: off
    settle: float = 1.0                   # seconds a finished request's reservation still counts
    limit_status: int = 402               # status of key-limit/workspace/guardrail refusals
    limit_reset: str | None = None        # daily|weekly|monthly window of those budgets
    workspace_budget: float | None = None
    guardrail_budget: float | None = None
    moderation_marker: str | None = None  # prompts holding it are refused by moderation
    # -- provider quirks (slugs as provider.only/ignore take them) --
    drop_reasoning: dict[str, float] = field(default_factory=dict)   # slug -> rate
    inline_reasoning: list[str] = field(default_factory=list)
    unopened_reasoning: list[str] = field(default_factory=list)  # reasoning</think>content
    ignore_sampling: list[str] = field(default_factory=list)
    not_distillable: bool = False
    tokenizer: str | None = None  # count usage with this tokenizer directory (token_counts.py)
    chat_template: str | None = None  # a template file instead of the tokenizer directory's
    # token logprobs (logprobs.py): provider slug -> variant (what its logprobs cover)
    logprobs: dict[str, str] = field(default_factory=dict)
    # providers that serve another model from their N-th answer (impostors.py): slug ->
    # (N, how its usage is counted: words | system=TEXT | tokenizer=DIR | template=FILE)
    impostors: dict[str, tuple] = field(default_factory=dict)
    # providers whose honest stack counts each prompt N tokens more (fewer: N < 0) than the
    # tokenizer does: slug -> N (the overcount the Kimi Vendor Verifier tolerates: 0..+3)
    usage_offsets: dict[str, int] = field(default_factory=dict)
    # -- the wire's documented variants (streaming, errors, endpoints table) --
    stream_usage: str = "own-chunk"   # STREAM_USAGES
    midstream_code: str = "502"       # MIDSTREAM_CODES
    unavailable: str | None = None    # every completion refused with this availability code
    endpoint_nulls: bool = False      # the endpoints table with the nulls the service sends
    # -- billing (billing.py) --
    price_overrides: dict[str, tuple] = field(default_factory=dict)  # slug -> (factor, min prompt tokens)
    discounts: dict[str, float] = field(default_factory=dict)        # slug -> discount
    no_cost_rate: float = 0.0      # share of billed answers whose usage has no `cost`
    no_usage_rate: float = 0.0     # share of billed answers with no usage at all
    generation_delay: float = 0.0  # seconds /generation answers 404 after a generation ends
    # -- for tests: a gate, so a test can act while work is provably unfinished --
    hold_after: int | None = None    # completions past this many wait until it is raised/None
    # -- a self-hosted server's API instead of OpenRouter's (selfhosted.py) --
    mode: str = "openrouter"
    noncanonical_rate: float | None = None  # share of answers with a word split in two; None: 0.25
    system_prompt: str | None = None  # the server's template puts it first (no system message)
    served_model_name: str | None = None  # vLLM's --served-model-name: kimi-k2.5 under this name
    # the context, as vLLM's --max-model-len (GET /v1/models reports it; a request past it
    # is refused or cut as vLLM does, selfhosted.py); default Kimi K2.5's own
    max_model_len: int = 262144

    def check(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        if self.mode != "openrouter":
            bad = sorted(set(self.faults) - set(SERVER_FAULTS))
            if bad:
                raise ValueError(f"mode {self.mode} injects only {', '.join(SERVER_FAULTS)} "
                                 f"faults, not {', '.join(bad)}")
        elif "noreasoning" in self.faults:
            raise ValueError("the noreasoning fault is a self-hosted mode's (OpenRouter's "
                             "providers drop their reasoning by drop_reasoning)")
        if self.noncanonical_rate is not None and not 0 <= self.noncanonical_rate <= 1:
            raise ValueError("noncanonical_rate must be in [0, 1]")
        for kind, rate in self.faults.items():
            if kind not in FAULT_KINDS:
                raise ValueError(f"unknown fault kind {kind!r} (kinds: {', '.join(FAULT_KINDS)})")
            if not 0.0 <= float(rate) <= 1.0:
                raise ValueError(f"fault rate for {kind} must be in [0, 1], got {rate}")
        if sum(float(r) for r in self.faults.values()) > 1.0 + 1e-9:
            raise ValueError("fault rates must sum to at most 1 (one draw per request picks "
                             "at most one fault)")
        if self.credits_mode not in CREDITS_MODES:
            raise ValueError(f"credits_mode must be one of {', '.join(CREDITS_MODES)}")
        for name in ("latency", "tokens_per_second", "hang_seconds", "retry_after", "settle"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.keepalive_interval <= 0:
            raise ValueError("keepalive_interval must be > 0")
        if self.inflight_ratio is not None and self.inflight_ratio <= 0:
            raise ValueError("inflight_ratio must be > 0")
        for name in ("key_limit", "workspace_budget", "guardrail_budget"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.limit_status not in LIMIT_STATUSES:
            raise ValueError(f"limit_status must be 403 or 402, got {self.limit_status}")
        if self.limit_reset is not None and self.limit_reset not in LIMIT_RESETS:
            raise ValueError(f"limit_reset must be one of {', '.join(LIMIT_RESETS)}")
        if self.hold_after is not None and self.hold_after < 0:
            raise ValueError("hold_after must be >= 0")
        if self.moderation_marker is not None and not self.moderation_marker:
            raise ValueError("moderation_marker must not be empty")
        for slug, rate in self.drop_reasoning.items():
            if not 0.0 <= float(rate) <= 1.0:
                raise ValueError(f"drop_reasoning rate for {slug} must be in [0, 1], got {rate}")
        if self.stream_usage not in STREAM_USAGES:
            raise ValueError(f"stream_usage must be one of {', '.join(STREAM_USAGES)}")
        if self.midstream_code not in MIDSTREAM_CODES:
            raise ValueError(f"midstream_code must be one of {', '.join(MIDSTREAM_CODES)}")
        if self.unavailable is not None and self.unavailable not in AVAILABILITY:
            raise ValueError(f"unavailable must be one of {', '.join(AVAILABILITY)}")
        for name in ("no_cost_rate", "no_usage_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1]")
        if self.no_cost_rate + self.no_usage_rate > 1.0 + 1e-9:
            raise ValueError("no_cost_rate + no_usage_rate must be at most 1 (one draw per answer)")
        if self.generation_delay < 0:
            raise ValueError("generation_delay must be >= 0")
        for slug, (factor, _min_prompt) in self.price_overrides.items():
            if float(factor) <= 0:
                raise ValueError(f"price override factor for {slug} must be > 0")
        for slug, d in self.discounts.items():
            if not 0.0 <= float(d) < 1.0:
                raise ValueError(f"discount for {slug} must be in [0, 1)")
        for slug, variant in self.logprobs.items():
            if variant not in LOGPROBS_VARIANTS:
                raise ValueError(f"logprobs variant for {slug} must be one of "
                                 f"{', '.join(LOGPROBS_VARIANTS)}")
        from .impostors import check_impostor
        for after, how in self.impostors.values():
            check_impostor(int(after), str(how))
        for slug in [*self.drop_reasoning, *self.inline_reasoning, *self.unopened_reasoning,
                     *self.ignore_sampling, *self.logprobs, *self.impostors, *self.usage_offsets,
                     *self.price_overrides, *self.discounts]:
            if not known_provider(slug):
                raise ValueError(f"unknown provider {slug!r} (a tag or provider name of the "
                                 "endpoints table)")

    def public(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "api_key"}


def _nullable(kind):
    return lambda v: None if v is None else kind(v)


def _slugs(value) -> list[str]:
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise TypeError("expected a list of provider slugs")
    return list(value)


# Settable at run time through POST /_standin/config, with their conversions.
LIVE_SETTINGS = {
    "balance": float, "key_limit": _nullable(float), "credits_mode": str, "latency": float,
    "tokens_per_second": float, "keepalive_interval": float,
    "faults": lambda v: {str(k): float(r) for k, r in dict(v).items()},
    "retry_after": float, "hang_seconds": float, "price_scale": float, "bill_cancelled": bool,
    "inflight_ratio": _nullable(float), "settle": float, "limit_status": int,
    "limit_reset": _nullable(str), "workspace_budget": _nullable(float),
    "guardrail_budget": _nullable(float), "moderation_marker": _nullable(str),
    "drop_reasoning": lambda v: {str(k): float(r) for k, r in dict(v).items()},
    "inline_reasoning": _slugs, "unopened_reasoning": _slugs, "ignore_sampling": _slugs, "not_distillable": bool,
    "stream_usage": str, "midstream_code": str, "unavailable": _nullable(str),
    "endpoint_nulls": bool,
    "price_overrides": lambda v: {str(k): (float(f), None if m is None else int(m))
                                  for k, (f, m) in dict(v).items()},
    "discounts": lambda v: {str(k): float(d) for k, d in dict(v).items()},
    "no_cost_rate": float, "no_usage_rate": float, "generation_delay": float,
    "hold_after": _nullable(int),
    "noncanonical_rate": _nullable(float), "system_prompt": _nullable(str), "max_model_len": int,
    "logprobs": lambda v: {str(k): str(r) for k, r in dict(v).items()},
    "impostors": lambda v: {str(k): (int(n), str(how)) for k, (n, how) in dict(v).items()},
    "usage_offsets": lambda v: {str(k): int(n) for k, n in dict(v).items()},
}


def changed(config: Config, changes: dict) -> Config:
    """A checked copy of `config` with `changes` (a JSON object) applied; ValueError or
    TypeError when a name is not settable or a value is wrong."""
    if not isinstance(changes, dict):
        raise ValueError("expected a JSON object")
    unknown = sorted(set(changes) - set(LIVE_SETTINGS))
    if unknown:
        raise ValueError(f"cannot change {', '.join(unknown)} "
                         f"(settable: {', '.join(LIVE_SETTINGS)})")
    new = Config(**asdict(config))
    for name, value in changes.items():
        setattr(new, name, LIVE_SETTINGS[name](value))
    new.check()
    return new
