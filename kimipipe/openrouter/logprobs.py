"""Token logprobs: asking for the tokens the model sampled, and what routing makes of it.

OpenRouter returns each answer's sampled tokens when asked `logprobs: true` (kimipipe
asks `top_logprobs: 0`: the tokens, no alternatives); each choice then carries
`logprobs.content[]` with every token's `bytes` (openrouter/answer.py keeps them, and
kp-tokenize turns them into IDs). An endpoint that supports them lists `logprobs` in its
`supported_parameters`; one that does not ignores the parameter, unless the request sends
`provider.require_parameters: true`, which routes only to endpoints that list every
parameter the body sends. kimipipe sends that whenever it sends sampling parameters (the
model presets' served sampling): then asking for logprobs IS a routing requirement.

So three settings:
- `--require-logprobs`: asked, and required (require_parameters sent whatever else is):
  only endpoints that list `logprobs` serve.
- `--logprobs`: asked; kimipipe adds no requirement of its own, but under the
  require_parameters the sampling sends, OpenRouter requires it anyway (`--plan` and the
  preflight say which endpoints that leaves out).
- neither: the model preset's default (`ModelPreset.logprobs`). For Kimi K2.5, K2 Thinking
  and K2.6: asked where it costs no endpoint, i.e. where the body sends no
  require_parameters, or every endpoint the routing allows lists `logprobs` (an endpoint
  whose `supported_parameters` is null counts as listing it, as the routing check reads
  it); else not asked, and said so. A model without a preset: not asked. Decided once the
  endpoints table is read (`resolve`, infer/endpoints.py); without a table: not asked.

`share` estimates what share of the answers would carry them: all of them where logprobs
are required (only listing endpoints serve); with `--sort price` the cheapest allowed
endpoint's (1 or 0); otherwise OpenRouter's load balancing, which weights each endpoint by
the inverse square of its price (sum of the weights of those listing `logprobs` over all).
Under another `--sort` it cannot be told.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .models import preset_for
from .routing import Endpoint, Policy, allowed_endpoints

PARAMETER = "logprobs"


def lists_logprobs(endpoint: Endpoint) -> bool | None:
    """Whether ENDPOINT lists `logprobs` (None: its supported_parameters are null)."""
    if endpoint.supported_parameters is None:
        return None
    return PARAMETER in endpoint.supported_parameters


def requires_parameters(request, policy: Policy) -> bool:
    """Whether the body sends provider.require_parameters: true (with logprobs asked)."""
    probe = replace(request, logprobs=True)
    provider = probe.fields(policy).get("provider")
    return isinstance(provider, dict) and provider.get("require_parameters") is True


def resolve(request, policy: Policy, endpoints: list[Endpoint] | None) -> str | None:
    """Decide the preset's default (`request.logprobs` None) against the endpoints table,
    setting `request.logprobs` and `policy.required_parameters`; returns a note for the
    user saying what was decided and why (None when the flags decided)."""
    if request.logprobs is not None or request.require_logprobs:
        note = None
    else:
        preset = preset_for(request.model)
        if preset is None or not preset.logprobs:
            request.logprobs = False
            return None
        if endpoints is None:
            request.logprobs = False
            return ("token logprobs not asked: the endpoints table could not be read, so "
                    "whether asking would narrow the routing is unknown (--logprobs asks)")
        missing = [e for e in allowed_endpoints(policy, endpoints) if lists_logprobs(e) is False]
        if missing and requires_parameters(request, policy):
            request.logprobs = False
            return ("token logprobs not asked: under provider.require_parameters (sent with the "
                    "sampling) they would be a routing requirement, and allowed endpoints do "
                    "not list them ("
                    + ", ".join(sorted({e.tag or e.provider_name for e in missing}))
                    + "); --logprobs asks anyway (routing only to those that do)")
        request.logprobs = True
        note = None
    policy.required_parameters = request.enforced_parameters(policy)
    return note


@dataclass
class LogprobsPlan:
    """What the routing makes of logprobs, for `--plan` and the preflight."""

    asked: bool
    required: bool  # only endpoints listing them serve (require_parameters with them)
    listing: list[str]  # the allowed endpoints that list logprobs (tags, else names)
    not_listing: list[str]
    unknown: list[str]  # supported_parameters null
    share: float | None  # of the answers, expected to carry them (None: cannot be told)


def _weight(e: Endpoint) -> float:
    price = e.prompt_price + e.completion_price
    return 1.0 / price ** 2 if price > 0 else 0.0


def share(policy: Policy, allowed: list[Endpoint], required: bool) -> float | None:
    """The share of answers served by endpoints that list logprobs (see the module text)."""
    if not allowed:
        return None
    if required:
        return 1.0 if any(lists_logprobs(e) is not False for e in allowed) else 0.0
    if policy.sort == "price":
        cheapest = min(allowed, key=lambda e: (e.prompt_price + e.completion_price,
                                               e.tag or e.provider_name))
        listed = lists_logprobs(cheapest)
        return None if listed is None else float(listed)
    if policy.sort:
        return None
    weights = [_weight(e) for e in allowed]
    if any(lists_logprobs(e) is None for e in allowed) or not sum(weights):
        return None
    return sum(w for w, e in zip(weights, allowed, strict=True) if lists_logprobs(e)) / sum(weights)


def plan(request, policy: Policy, endpoints: list[Endpoint] | None) -> LogprobsPlan | None:
    """The logprobs part of the plan (None without an endpoints table)."""
    if endpoints is None:
        return None
    allowed = allowed_endpoints(policy, endpoints)
    asked = bool(request.logprobs or request.require_logprobs)
    required = asked and PARAMETER in policy.required_parameters

    def names(want):
        return [e.tag or e.provider_name for e in allowed if lists_logprobs(e) is want]

    # (an endpoint the requirement excluded is not among the allowed: count it as not listing)
    not_listing = names(False)
    if required:
        unrequired = replace(policy, required_parameters=tuple(
            p for p in policy.required_parameters if p not in (PARAMETER, "top_logprobs")))
        not_listing = [e.tag or e.provider_name for e in allowed_endpoints(unrequired, endpoints)
                       if lists_logprobs(e) is False]
    return LogprobsPlan(asked=asked, required=required, listing=names(True),
                        not_listing=not_listing, unknown=names(None),
                        share=share(policy, allowed, required) if asked else None)


def plan_lines(p: LogprobsPlan | None, request) -> list[str]:
    """What `--plan` (and the preflight's check) says about logprobs."""
    if p is None:
        return ["token logprobs: the endpoints table could not be read: which endpoints "
                "return them is unknown"]
    listing = ", ".join(p.listing) or "none"
    lines = []
    if not p.asked:
        lines.append(f"token logprobs: not asked; allowed endpoints listing them: {listing}"
                     + (f"; not listing: {', '.join(p.not_listing)}" if p.not_listing else ""))
        return lines
    how = ("required (provider.require_parameters: only endpoints listing them serve)"
           if p.required else "asked, not required (an endpoint without them answers without)")
    lines.append(f"token logprobs: {how}; allowed endpoints listing them: {listing}"
                 + (f"; unknown (supported_parameters null): {', '.join(p.unknown)}"
                    if p.unknown else ""))
    if p.required and p.not_listing:
        lines.append(f"  left out by the requirement: {', '.join(p.not_listing)} "
                     + ("(require_parameters is sent with the sampling: --no-require-parameters "
                        "keeps them, at the price of letting providers drop the sampling)"
                        if not request.require_logprobs else "(--require-logprobs)"))
    elif p.not_listing:
        lines.append(f"  not listing them (their answers come without): {', '.join(p.not_listing)}")
    if p.share is not None:
        lines.append(f"  answers expected to carry them: {p.share:.0%}"
                     + ("" if p.required or p.share in (0.0, 1.0) else
                        " (OpenRouter's load balancing: weights by the inverse square of the price)"))
    else:
        lines.append("  answers expected to carry them: cannot be told (--sort, or null "
                     "supported_parameters)")
    return lines
