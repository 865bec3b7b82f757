"""The stand-in's model catalogue and OpenRouter's provider routing rules.

Each model has a table of endpoints (provider, tag, quantization, per-token prices as
OpenRouter writes them: USD per token, as strings). Kimi K2.5 ships natively as INT4; the
endpoints that re-quantize it (Fireworks NVFP4, BaseTen FP4, DeepInfra Turbo FP4) are the
cheapest, so `sort: price` without an `ignore` list lands on one of them: exactly the
mistake a training-data run must avoid.

`route(model, provider_prefs, request_key, ...)` applies `enforce_distillable_text`
(every model here is distillable unless `--not-distillable`: then such a request is
OpenRouter's no-route 404), `only`, `ignore` (a base slug takes its variants),
`quantizations`, `max_price`, `require_parameters` (only endpoints whose
`supported_parameters` hold every parameter the request sends; an endpoint that ignores
temperature/top_p, `--ignore-sampling PROVIDER`, does not list them, and only the
providers given `--logprobs` list `logprobs`/`top_logprobs`), then `order`, then
`sort`, else a deterministic price-weighted pick (the hash of the request), and returns the
chosen endpoint plus the endpoints the filters removed (the `misroute` fault serves from
one of those). Filters that leave nothing: 404 with `availability.code`
`constraint_filtered`.

`endpoints_document` is `GET /models/{author}/{slug}/endpoints` (with `nulls`, the nulls
and missing keys the service sends: `quantization`, `max_completion_tokens`, optional
pricing keys, `supported_parameters`); `model_document` is one entry of `GET /models`
(OpenRouter has no `GET /model/{slug}`), which carries
`is_trainable_text`: the property OpenRouter's distillation guide names for "the author
allows text distillation" (the `?distillable=true|false` filter of `GET /models` uses it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class StandinEndpoint:
    provider_name: str
    tag: str
    quantization: str
    prompt_price: str          # USD per token, as OpenRouter writes it
    completion_price: str
    throughput: float          # tokens/s, for sort=throughput (and the endpoints table)
    latency: float             # seconds to first token, for sort=latency
    context_length: int = 262144
    max_completion_tokens: int = 262144

    @property
    def prompt(self) -> float:
        return float(self.prompt_price)

    @property
    def completion(self) -> float:
        return float(self.completion_price)

    def matches(self, slug: str) -> bool:
        """A provider slug as `only`/`ignore`/`order` give it: the tag (a base slug matches
        its variants: `deepinfra` matches `deepinfra/turbo`) or the provider name,
        case-insensitively."""
        s = slug.strip().lower()
        tag = self.tag.lower()
        return s == tag or tag.startswith(s + "/") or s == self.provider_name.lower()


KIMI_K25 = (
    StandinEndpoint("Moonshot AI", "moonshotai", "unknown", "0.0000006", "0.000003", 45.0, 1.6),
    StandinEndpoint("Together", "together", "int4", "0.0000005", "0.0000028", 60.0, 0.9),
    StandinEndpoint("DeepInfra", "deepinfra", "int4", "0.00000045", "0.0000025", 35.0, 1.2),
    # a variant under its provider's own name, told apart by its tag only (as listed)
    StandinEndpoint("DeepInfra", "deepinfra/turbo", "fp4", "0.0000003", "0.0000012", 110.0, 0.5),
    StandinEndpoint("Fireworks", "fireworks", "nvfp4", "0.00000035", "0.0000014", 140.0, 0.4),
    StandinEndpoint("BaseTen", "baseten", "fp4", "0.0000004", "0.0000016", 120.0, 0.6),
    StandinEndpoint("Parasail", "parasail", "int4", "0.00000055", "0.0000027", 50.0, 1.0),
)

KIMI_K2_0905 = (
    StandinEndpoint("Moonshot AI", "moonshotai", "fp8", "0.0000006", "0.0000025", 40.0, 0.8),
    StandinEndpoint("Groq", "groq", "unknown", "0.000001", "0.000003", 300.0, 0.3),
)

MODELS: dict[str, tuple[StandinEndpoint, ...]] = {
    "moonshotai/kimi-k2.5": KIMI_K25,
    "moonshotai/kimi-k2-thinking": KIMI_K25,
    "moonshotai/kimi-k2.6": KIMI_K25,
    "moonshotai/kimi-k2-0905": KIMI_K2_0905,
}

# Every key of OpenRouter's ProviderPreferences; anything else is a 400.
PROVIDER_KEYS = frozenset({
    "allow_fallbacks", "data_collection", "enforce_distillable_text", "ignore", "max_price",
    "only", "options", "order", "preferred_max_latency", "preferred_min_throughput",
    "quantizations", "require_parameters", "sort", "zdr",
})
QUANTIZATIONS = frozenset({"int4", "int8", "fp4", "mxfp4", "nvfp4", "fp6", "fp8", "mxfp8",
                           "fp16", "bf16", "fp32", "unknown"})
SORTS = frozenset({"price", "throughput", "latency"})
# OpenRouter's request parameters (the SDK's `Parameter`): what `require_parameters` checks.
PARAMETERS = frozenset({
    "temperature", "top_p", "top_k", "min_p", "top_a", "frequency_penalty",
    "presence_penalty", "repetition_penalty", "max_tokens", "max_completion_tokens",
    "logit_bias", "logprobs", "top_logprobs", "prediction", "seed", "response_format",
    "structured_outputs", "stop", "tools", "tool_choice", "parallel_tool_calls",
    "include_reasoning", "reasoning", "reasoning_effort", "web_search_options", "verbosity",
})
# What every endpoint of the table supports (as Kimi K2.5's endpoints list them) ...
SUPPORTED_PARAMETERS = (
    "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "seed", "stop",
    "logit_bias", "logprobs", "top_logprobs", "reasoning", "include_reasoning",
    "reasoning_effort", "tools", "tool_choice", "parallel_tool_calls", "response_format",
    "structured_outputs",
)
# ... except an endpoint set to ignore sampling (`--ignore-sampling`), which lacks these,
# and token logprobs, listed only by the providers that return them (`--logprobs`).
SAMPLING_PARAMETERS = ("temperature", "top_p")
LOGPROBS_PARAMETERS = ("logprobs", "top_logprobs")
# Whether each model's author allows text distillation (`--not-distillable` turns it off).
DISTILLABLE = {model: True for model in MODELS}


def matches_any(endpoint: StandinEndpoint, slugs) -> bool:
    return any(endpoint.matches(s) for s in slugs)


def supported_parameters(endpoint: StandinEndpoint, no_sampling=(), logprobs=()) -> list[str]:
    lacking = (*(SAMPLING_PARAMETERS if matches_any(endpoint, no_sampling) else ()),
               *(() if matches_any(endpoint, logprobs) else LOGPROBS_PARAMETERS))
    return [p for p in SUPPORTED_PARAMETERS if p not in lacking]


def request_parameters(body: dict) -> frozenset[str]:
    """The parameters a request body sends (non-null), as `require_parameters` sees them."""
    return frozenset(k for k, v in body.items() if k in PARAMETERS and v is not None)


def known_provider(slug: str) -> bool:
    return any(e.matches(slug) for endpoints in MODELS.values() for e in endpoints)


class RoutingError(Exception):
    """A request the router refuses: `status` 400 (malformed preferences) or 404."""

    def __init__(self, status: int, message: str, metadata: dict | None = None,
                 availability: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.metadata = metadata or {}
        self.availability = availability


@dataclass(frozen=True)
class ChosenRoute:
    endpoint: StandinEndpoint
    excluded: tuple[StandinEndpoint, ...]   # endpoints the request's preferences removed


def _slug_list(prefs: dict, key: str) -> list[str] | None:
    value = prefs.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RoutingError(400, f"provider.{key} must be a list of provider slugs")
    return value


def _price_limit(value, key: str) -> float | None:
    if value is None:
        return None
    try:
        return float(Decimal(str(value))) / 1e6   # USD per million tokens -> per token
    except Exception:
        raise RoutingError(400, f"provider.max_price.{key} must be a number") from None


def route(model: str, prefs: dict | None, request_key: bytes, *,
          params: frozenset[str] = frozenset(), no_sampling=(),
          distillable: bool = True, logprobs=()) -> ChosenRoute:
    """Choose the endpoint that serves a request, by OpenRouter's provider preferences.

    `params`: the parameters the request sends (for `require_parameters`); `no_sampling`:
    provider slugs whose endpoints do not support temperature/top_p; `logprobs`: those
    whose endpoints return token logprobs (the only ones listing them); `distillable`: whether
    the model's author allows distillation (for `enforce_distillable_text`)."""
    endpoints = MODELS[model]
    prefs = prefs or {}
    if not isinstance(prefs, dict):
        raise RoutingError(400, "provider must be an object")
    unknown = sorted(set(prefs) - PROVIDER_KEYS)
    if unknown:
        raise RoutingError(400, f"Unrecognized key(s) in provider: {', '.join(unknown)}")
    for flag in ("require_parameters", "enforce_distillable_text", "allow_fallbacks", "zdr"):
        if prefs.get(flag) is not None and not isinstance(prefs[flag], bool):
            raise RoutingError(400, f"provider.{flag} must be a boolean")
    if prefs.get("enforce_distillable_text") and not distillable:
        raise no_route(model, prefs, "The model's author does not allow text distillation "
                                     "(provider.enforce_distillable_text)")
    require = bool(prefs.get("require_parameters"))
    only = _slug_list(prefs, "only")
    ignore = _slug_list(prefs, "ignore")
    order = _slug_list(prefs, "order")
    quants = prefs.get("quantizations")
    if quants is not None:
        if not isinstance(quants, list) or not all(q in QUANTIZATIONS for q in quants):
            raise RoutingError(400, "provider.quantizations must be a list of: "
                               + ", ".join(sorted(QUANTIZATIONS)))
    sort = prefs.get("sort")
    if isinstance(sort, dict):  # the object form {"by": ..., "partition": ...}
        sort = sort.get("by")
    if sort is not None and sort not in SORTS:
        raise RoutingError(400, f"provider.sort must be one of {', '.join(sorted(SORTS))}")
    max_price = prefs.get("max_price") or {}
    if not isinstance(max_price, dict):
        raise RoutingError(400, "provider.max_price must be an object")
    max_prompt = _price_limit(max_price.get("prompt"), "prompt")
    max_completion = _price_limit(max_price.get("completion"), "completion")

    left = []
    for e in endpoints:
        if only is not None and not any(e.matches(s) for s in only):
            continue
        if ignore and any(e.matches(s) for s in ignore):
            continue
        if quants is not None and e.quantization not in quants:
            continue
        if max_prompt is not None and e.prompt > max_prompt * (1 + 1e-9):
            continue
        if max_completion is not None and e.completion > max_completion * (1 + 1e-9):
            continue
        if require and not params <= set(supported_parameters(e, no_sampling, logprobs)):
            continue
        left.append(e)
    if order:
        def rank(e: StandinEndpoint) -> int:
            return next((i for i, s in enumerate(order) if e.matches(s)), len(order))
        ranked = sorted(left, key=rank)
        if prefs.get("allow_fallbacks") is False:
            ranked = [e for e in ranked if rank(e) < len(order)]
        left = ranked
    excluded = tuple(e for e in endpoints if e not in left)
    if not left:
        raise no_route(model, prefs, "All endpoints were filtered out by the request's "
                                     "provider preferences")
    if order:
        chosen = left[0]
    elif sort == "price":
        chosen = min(left, key=lambda e: (e.prompt + e.completion, e.tag))
    elif sort == "throughput":
        chosen = max(left, key=lambda e: (e.throughput, e.tag))
    elif sort == "latency":
        chosen = min(left, key=lambda e: (e.latency, e.tag))
    else:
        chosen = load_balanced(left, request_key)
    return ChosenRoute(chosen, excluded)


def load_balanced(endpoints: list[StandinEndpoint], request_key: bytes) -> StandinEndpoint:
    """OpenRouter's default: weight by inverse square price; here a deterministic draw."""
    weights = [1.0 / (e.prompt + e.completion) ** 2 for e in endpoints]
    h = int.from_bytes(hashlib.blake2b(request_key, digest_size=8).digest(), "big")
    point = (h / 2**64) * sum(weights)
    for e, w in zip(endpoints, weights, strict=True):
        point -= w
        if point < 0:
            return e
    return endpoints[-1]


def no_route(model: str, prefs: dict, why: str) -> RoutingError:
    """OpenRouter's no-route 404: a configuration error, never retried."""
    from .availability import availability
    return RoutingError(404, no_endpoints_message(),
                        {"model": model, "provider_preferences": prefs},
                        availability("constraint_filtered", model,
                                     [e.provider_name for e in MODELS[model]],
                                     excluded_by=sorted(prefs) or None, constraint=why))


def no_endpoints_message() -> str:
    return ("No endpoints found matching your data policy (Free model publication) and "
            "provider preferences. Configure: https://openrouter.ai/settings/privacy")


def model_name(model: str) -> str:
    slug = model.partition("/")[2]
    return {"moonshotai/kimi-k2.5": "MoonshotAI: Kimi K2.5",
            "moonshotai/kimi-k2.6": "MoonshotAI: Kimi K2.6"}.get(model, f"MoonshotAI: {slug}")


ARCHITECTURE = {"input_modalities": ["text"], "output_modalities": ["text"],
                "modality": "text->text", "tokenizer": "Other", "instruct_type": None}


def model_document(model: str, now: int, *, distillable: bool, price_scale: float = 1.0,
                   default_sampling: dict | None = None) -> dict:
    """One model as `GET /models` lists it (OpenRouter's `Model`, plus `is_trainable_text`)."""
    first = MODELS[model][0]
    return {
        "id": model,
        "canonical_slug": model,
        "hugging_face_id": None,
        "name": model_name(model),
        "created": now,
        "description": f"{model_name(model)}, served by the kimipipe stand-in.",
        "context_length": first.context_length,
        "architecture": dict(ARCHITECTURE),
        "pricing": {"prompt": f"{first.prompt * price_scale:.12g}",
                    "completion": f"{first.completion * price_scale:.12g}",
                    "request": "0", "image": "0", "web_search": "0", "internal_reasoning": "0"},
        "top_provider": {"context_length": first.context_length,
                         "max_completion_tokens": first.max_completion_tokens,
                         "is_moderated": False},
        "per_request_limits": None,
        "supported_parameters": list(SUPPORTED_PARAMETERS),
        "default_parameters": {"temperature": None, "top_p": None, "frequency_penalty": None,
                               **(default_sampling or {})},
        "supported_voices": None,
        "links": {"details": f"/api/v1/models/{model}/endpoints"},
        "is_trainable_text": distillable,
    }


def endpoints_document(model: str, now: int, no_sampling=(), nulls: bool = False,
                       logprobs=()) -> dict:
    """`GET /models/{author}/{slug}/endpoints` for one model, in OpenRouter's shape; NULLS:
    with the nulls and missing keys the live table has (see `with_nulls`)."""
    name = model_name(model)
    document = _endpoints_document(model, name, now, no_sampling, logprobs)
    if nulls:
        for endpoint in document["data"]["endpoints"]:
            with_nulls(endpoint)
    return document


def with_nulls(endpoint: dict) -> None:
    """What the live table leaves null or out: a first-party endpoint's quantization is
    null (it reports none: "unknown"), no endpoint states its max_completion_tokens, the
    pricing lists only the keys that bill, and an endpoint's supported_parameters can be
    null (then nothing is known of them)."""
    if endpoint["quantization"] == "unknown":
        endpoint["quantization"] = None
    endpoint["max_completion_tokens"] = None
    pricing = endpoint["pricing"]
    for key in ("request", "image", "web_search", "internal_reasoning"):
        pricing.pop(key, None)
    if not pricing.get("discount"):  # (a discount that bills stays listed)
        pricing["discount"] = None
    endpoint["latency_last_30m"] = None
    if endpoint["tag"] == "parasail":
        endpoint["supported_parameters"] = None


def _endpoints_document(model: str, name: str, now: int, no_sampling, logprobs=()) -> dict:
    return {"data": {
        "id": model,
        "name": name,
        "created": now,
        "description": f"{name}, served by the kimipipe stand-in.",
        "architecture": dict(ARCHITECTURE),
        "endpoints": [{
            "name": f"{e.provider_name} | {model}",
            "model_id": model,
            "model_name": name,
            "provider_name": e.provider_name,
            "tag": e.tag,
            "quantization": e.quantization,
            "context_length": e.context_length,
            "max_completion_tokens": e.max_completion_tokens,
            "max_prompt_tokens": None,
            "pricing": {"prompt": e.prompt_price, "completion": e.completion_price,
                        "request": "0", "image": "0", "web_search": "0",
                        "internal_reasoning": "0", "discount": 0},
            "status": 0,
            "service_tier": None,
            "uptime_last_30m": 99.5,
            "uptime_last_5m": 100.0,
            "uptime_last_1d": 99.2,
            "latency_last_30m": {"p50": e.latency * 1000, "p75": e.latency * 1300,
                                 "p90": e.latency * 1800, "p99": e.latency * 3000},
            "throughput_last_30m": {"p50": e.throughput, "p75": e.throughput * 0.9,
                                    "p90": e.throughput * 0.7, "p99": e.throughput * 0.4},
            "supported_parameters": supported_parameters(e, no_sampling, logprobs),
            "supports_implicit_caching": False,
            "supports_diarization": False,
            "supports_tool_choice": {"auto": True, "none": True, "required": True,
                                     "function": True},
            "native_tools": {},
        } for e in MODELS[model]],
    }}
