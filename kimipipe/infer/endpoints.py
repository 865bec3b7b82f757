"""The model's endpoints table and its entry, read before anything is sent: what the
routing flags allow, what it costs at worst, and what a long run should know.

- The endpoints table (openrouter/account.py): the providers the routing flags allow, the
  highest prices they charge (a budget's worst case: `price_bound`), and a warning for
  each allowed endpoint that serves re-quantized weights (openrouter/models.py). A run
  whose flags allow no endpoint, or that has `--max-cost` but no price bound, is refused
  (exit 2); without the table a run checks routing by provider name only. A
  `--ignore-provider` or `--only-provider` slug that names no provider of the table is
  refused (exit 2), with the closest known one. The model preset's token-logprobs default
  is decided here, against the table (openrouter/logprobs.py: asked where that leaves no
  allowed endpoint out).
- Distillation (openrouter/account.py `model_info`): a model whose authors forbid it
  (`is_trainable_text: false`) is refused before any request while
  `provider.enforce_distillable_text` is sent (the default: OpenRouter would route none of
  them); with `--allow-non-distillable` it is a warning. Unreadable: said by `--plan` only
  (OpenRouter still enforces the flag).

`--plan` and `--preflight` show the same warnings (`requantization_warnings`,
`endpoint_warnings`) in their own reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..contracts import IdentityState
from ..errors import ExitCode, KPError
from ..openrouter import logprobs
from ..openrouter.account import AccountError, ModelInfo, fetch_endpoints, fetch_model_info
from ..openrouter.models import preset_for, requantized_allowed, requantized_in_flags
from ..openrouter.proxy import scrub
from ..openrouter.routing import (
    Endpoint,
    Policy,
    PriceBound,
    allowed_endpoints,
    mixed_names,
    price_bound,
    unknown_slug,
    variant_ignores,
)
from ..recorded.identity_table import state_path
from .config import RunConfig


@dataclass
class Routing:
    """What the endpoints table and the model's entry say (see the module docstring)."""

    endpoints: list[Endpoint] | None  # None: the table could not be read
    price: PriceBound | None  # the highest prices the allowed endpoints charge
    model_info: ModelInfo | str  # the model's entry, or why it is unknown
    logprobs_note: str | None  # the token-logprobs default decided, if it says something


def read_routing(config: RunConfig, identity: IdentityState, say: Callable[[str], None]) -> Routing:
    """The table and the entry read, the policy completed from the table (the variants it
    must ignore, the names it cannot verify) and, for a run, every check above (IDENTITY:
    the providers quarantined, named when they leave none)."""
    endpoints = read_endpoints(config, say)
    # the preset's token-logprobs default, decided against the table (openrouter/logprobs.py)
    logprobs_note = logprobs.resolve(config.request, config.policy, endpoints)
    if logprobs_note and not config.plan:
        say(f"kp-infer: {logprobs_note}")
    if endpoints is not None:
        check_provider_slugs(config, endpoints)
        # excluded variants under an allowed provider's name: kept out by the request itself
        config.policy.variant_ignore = variant_ignores(config.policy, endpoints)
        config.policy.unverifiable_names = sorted(mixed_names(config.policy, endpoints))
    bound = price_bound(config.policy, endpoints)
    info = read_model_info(config)
    if not config.plan:  # (the plan shows the warnings in its table)
        for warning in requantization_warnings(config.request.model, config.policy, endpoints):
            say(f"kp-infer: warning: {warning}")
        if endpoints is not None and not allowed_endpoints(config.policy, endpoints):
            quarantined = (f"; {state_path(config.files.output)} quarantines "
                           + ", ".join(q.provider for q in identity.quarantined)
                           + " for identity (remove it to lift that)") if identity.quarantined else ""
            raise KPError("no provider in the endpoints table matches the routing flags "
                          f"(see kp-infer --plan){quarantined}", ExitCode.USAGE)
        capped = "--max-cost" if config.money.max_cost is not None else "--total-cost"
        if (config.money.max_cost is not None or config.money.total_cost is not None) and bound is None:
            raise KPError(f"{capped} needs a price bound: the endpoints table could not be read; "
                          "pass --max-price-prompt and --max-price-completion", ExitCode.USAGE)
        check_distillation(config, info, say)
    return Routing(endpoints, bound, info, logprobs_note)


def requantization_warnings(model: str, policy: Policy, endpoints: list[Endpoint] | None) -> list[str]:
    """Endpoints the routing flags let through although they re-quantize the model's weights."""
    preset = preset_for(model)
    if preset is None:
        return []
    if endpoints is not None:
        names = [e.provider_name for e in endpoints]
        # a name covering several endpoints (variants) is told apart by the tag
        found = requantized_allowed(model, [
            (e.provider_name if names.count(e.provider_name) == 1 else f"{e.provider_name} ({e.tag})",
             e.quantization) for e in allowed_endpoints(policy, endpoints)])
    else:
        named = requantized_in_flags(model, policy.quantizations) if policy.quantizations else \
            sorted(preset.requantized)
        found = [f"the routing flags allow {', '.join(named)} endpoints, re-quantized from "
                 f"{model}'s native {preset.native_quantization} weights"] if named else []
    if found:
        found.append(f"to keep to the native weights, pass --quantization "
                     f"{' --quantization '.join(preset.allowed_quantizations)} (the default)")
    return found


def endpoint_warnings(policy: Policy, endpoints: list[Endpoint] | None) -> list[str]:
    """What the endpoints table says a long run should know (for --plan and --preflight):
    fewer than two endpoints allowed (one host retiring the model, or at capacity, stops
    the run), and provider names covering an excluded variant besides an allowed endpoint
    (their answers cannot be traced: kept, marked unverifiable)."""
    if endpoints is None:
        return []
    found = []
    allowed = allowed_endpoints(policy, endpoints)
    if len(allowed) == 1:
        e = allowed[0]
        found.append(f"only one endpoint is allowed ({e.provider_name}, {e.tag}): if it retires "
                     "the model or runs out of capacity, the run stops")
    for name, (ok, excluded) in sorted(mixed_names(policy, endpoints).items()):
        sent = [t for t in excluded if t in policy.variant_ignore]
        found.append(f"{name} names an allowed endpoint ({', '.join(ok)}) and an excluded variant "
                     f"({', '.join(excluded)}); answers name the provider, never the endpoint, so "
                     f"{name}'s are kept marked \"routing\": \"unverifiable\""
                     + (f" (sent in provider.ignore: {', '.join(sent)})" if sent else ""))
    return found


def read_endpoints(config: RunConfig, say: Callable[[str], None]) -> list[Endpoint] | None:
    """The model's endpoints table, or None (with a warning) when it cannot be read;
    `--plan` needs it, so there it is an error."""
    try:
        return fetch_endpoints(config.request.model, config.sending.api_key, config.sending.base_url,
                               proxy=config.sending.proxy)
    except AccountError as e:
        why = scrub(str(e), config.sending.proxy)
        if config.plan:
            raise KPError(f"cannot read the endpoints table: {why}") from None
        say(f"kp-infer: warning: cannot read the endpoints table ({why}); "
            "routing is checked by provider name only")
        return None


def check_provider_slugs(config: RunConfig, endpoints: list[Endpoint]) -> None:
    """Refuse (exit 2) a --ignore-provider/--only-provider slug that names no provider of
    the endpoints table: it would ignore nothing, or allow nothing, silently."""
    for option, slugs in (("--ignore-provider", config.policy.ignore),
                          ("--only-provider", config.policy.only)):
        for slug in slugs:
            why = unknown_slug(slug, endpoints)
            if why:
                raise KPError(f"{option} {slug!r}: no provider of {config.request.model} is "
                              f"called that; {why}", ExitCode.USAGE)


def read_model_info(config: RunConfig) -> ModelInfo | str:
    """The model's entry (for its distillation permission), or why it could not be read."""
    try:
        return fetch_model_info(config.request.model, config.sending.api_key, config.sending.base_url,
                                proxy=config.sending.proxy)
    except AccountError as e:
        return scrub(str(e), config.sending.proxy)


def check_distillation(config: RunConfig, info: ModelInfo | str, say: Callable[[str], None]) -> None:
    """Refuse (exit 2) a model whose authors forbid distillation while it is enforced."""
    if not isinstance(info, ModelInfo) or info.is_trainable_text is not False:
        return
    if config.policy.enforce_distillable_text:
        raise KPError(f"the authors of {config.request.model} do not allow distillation "
                      "(is_trainable_text: false): with provider.enforce_distillable_text "
                      "(the default) OpenRouter routes no request; --allow-non-distillable "
                      "sends anyway, but the answers must not train a drafter", ExitCode.USAGE)
    say(f"kp-infer: warning: the authors of {config.request.model} do not allow distillation; "
        "sent anyway (--allow-non-distillable): the answers must not train a drafter")
