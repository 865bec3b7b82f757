"""Provider policy: what the run asks OpenRouter for, and checking what it actually got.

The user's policy for Kimi K2.5 is "no further quantization": ignore Fireworks (NVFP4)
and BaseTen (FP4), or allow only int4 (+ `unknown` for first-party endpoints). This
module builds OpenRouter's `provider` object from the flags, reads the model's endpoints
table (`GET /models/{author}/{slug}/endpoints`: providers, quantizations, prices), decides
which endpoints the policy allows (for `--plan`), the worst-case price a budget reservation
needs (the whole table's, since an excluded endpoint that serves anyway bills its own
price, and every price that can bill: base prices and `pricing.overrides[]` alike), and verifies each answer's serving provider against the policy:
routing is verified, not trusted.

The policy also carries `enforce_distillable_text` (sent by default by kp-infer) and the
parameters the request makes OpenRouter require of an endpoint (`require_parameters`,
sent by request.py): an endpoint whose `supported_parameters` lack one is excluded, in
`--plan` and in the routing check. `ignoring(slugs)` widens one prompt's `ignore` after an
answer of a provider was refused, `slugs_of(provider)` the slugs that name it, and
`unknown_slug` says why a flag's slug names no provider of the table (with the closest).

Variants: one provider name can cover several endpoints, told apart by `tag` only
(`deepinfra` int4 and its FP4 `deepinfra/turbo`, both "DeepInfra"), and an answer names the
provider, never the endpoint. So where a name covers allowed and excluded endpoints
(`mixed_names`), the excluded ones must be kept out by the request: `variant_ignores` gives
their tags for `provider.ignore` (OpenRouter takes tags there, a base slug matching its
variants, so a base tag is never added when a variant of it is allowed), and an answer from
such a name cannot be verified after the fact (`routing_unverifiable`): it is marked so,
not passed as verified.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace

import msgspec


@dataclass
class Policy:
    ignore: list[str] = field(default_factory=list)
    only: list[str] = field(default_factory=list)
    quantizations: list[str] = field(default_factory=list)
    sort: str | None = None
    allow_fallbacks: bool = True
    data_collection: str | None = None
    max_price_prompt: float | None = None  # USD per million tokens
    max_price_completion: float | None = None
    # provider.enforce_distillable_text: route only where the model's authors allow
    # distillation (kp-infer turns it on unless --allow-non-distillable)
    enforce_distillable_text: bool = False
    # The parameters the request makes OpenRouter require of an endpoint (sent by
    # request.py as provider.require_parameters): an endpoint that lists its supported
    # parameters and lacks one is excluded
    required_parameters: tuple[str, ...] = ()

    # Tags of excluded variants sent in `provider.ignore` beside `ignore` (`variant_ignores`):
    # the request keeps them out, since an answer cannot be traced to them. Not consulted by
    # `why_excluded` (they are excluded already, for their own reason).
    variant_ignore: list[str] = field(default_factory=list)
    # Provider names whose answers cannot be verified (`mixed_names`), set with it
    unverifiable_names: list[str] = field(default_factory=list)
    # Tags of providers quarantined for identity (kp-infer --tokenizer: infer/identity.py,
    # which owns the list and adds to it in place, so that every policy made from this one
    # with `ignoring` sees a quarantine as it happens): sent in `provider.ignore`, and
    # excluded like `ignore` (a resume reads them from the output's identity file)
    quarantine: list[str] = field(default_factory=list)

    def ignoring(self, slugs: list[str]) -> Policy:
        """This policy with SLUGS added to `ignore` (for one prompt's next attempt)."""
        return replace(self, ignore=[*self.ignore, *(s for s in slugs if s not in self.ignore)])

    def provider_object(self) -> dict:
        """OpenRouter's `provider` request field (only the keys the user set)."""
        obj: dict = {}
        ignore = [*self.ignore, *(t for t in self.variant_ignore if t not in self.ignore)]
        ignore += [t for t in self.quarantine if t not in ignore]
        if ignore:
            obj["ignore"] = ignore
        if self.only:
            obj["only"] = list(self.only)
        if self.quantizations:
            obj["quantizations"] = list(self.quantizations)
        if self.sort:
            obj["sort"] = self.sort
        if not self.allow_fallbacks:
            obj["allow_fallbacks"] = False
        if self.data_collection:
            obj["data_collection"] = self.data_collection
        # Strings, as the SDK's MaxPrice model types them (numbers fail its validation).
        max_price = {}
        if self.max_price_prompt is not None:
            max_price["prompt"] = f"{self.max_price_prompt:g}"
        if self.max_price_completion is not None:
            max_price["completion"] = f"{self.max_price_completion:g}"
        if max_price:
            obj["max_price"] = max_price
        if self.enforce_distillable_text:
            obj["enforce_distillable_text"] = True
        return obj


def _price(value) -> float | None:
    """A price as the table writes it (a string, a number or null); None: not given."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class Pricing(msgspec.Struct):
    """An endpoint's `pricing`: the top-level prices are those "under default conditions";
    `overrides[]` (OpenRouter's PricingOverride: `min_prompt_tokens`, `utc_start`,
    `utc_end`, `prompt`, `completion`, ...) bill other prices above a prompt length or in
    a time window; `discount` bills price x (1 - discount). Overrides are kept as given
    (objects whose other keys and shapes may change): only their prices are read."""

    prompt: str | float | None = None
    completion: str | float | None = None
    discount: str | float | None = None
    overrides: list[dict] | None = None


class Endpoint(msgspec.Struct):
    provider_name: str
    tag: str | None = None
    quantization: str | None = None
    pricing: Pricing = msgspec.field(default_factory=Pricing)
    max_completion_tokens: int | None = None
    context_length: int | None = None
    status: int | None = None
    supported_parameters: list[str] | None = None

    @property
    def prompt_price(self) -> float:
        """USD per token."""
        return float(self.pricing.prompt or 0)

    @property
    def completion_price(self) -> float:
        return float(self.pricing.completion or 0)

    @property
    def discount(self) -> float:
        """The share taken off every price (0 when none); only expected costs use it."""
        d = _price(self.pricing.discount) or 0.0
        return d if 0.0 < d < 1.0 else 0.0

    def highest(self, side: str) -> tuple[float, int | None]:
        """The highest price that can bill SIDE ("prompt" or "completion") at this endpoint:
        its base price or an override's, whichever is higher; and the index of the override
        that sets it (None: the base price). No discount: a bound never counts on one."""
        top, which = _price(getattr(self.pricing, side)) or 0.0, None
        for i, override in enumerate(self.pricing.overrides or ()):
            price = _price(override.get(side)) if isinstance(override, dict) else None
            if price is not None and price > top:
                top, which = price, i
        return top, which


class _EndpointsData(msgspec.Struct):
    endpoints: list[Endpoint] = msgspec.field(default_factory=list)


class _EndpointsBody(msgspec.Struct):
    data: _EndpointsData


def parse_endpoints(raw: bytes) -> list[Endpoint]:
    return msgspec.json.decode(raw, type=_EndpointsBody).data.endpoints


def _slug_matches(wanted: str, endpoint: Endpoint) -> bool:
    """A base slug matches its variants (`deepinfra` matches `deepinfra/turbo`)."""
    w = wanted.lower()
    names = {endpoint.provider_name.lower()}
    if endpoint.tag:
        names.add(endpoint.tag.lower())
    for name in names:
        if name == w or name.startswith(w + "/") or name.replace(" ", "") == w.replace(" ", ""):
            return True
    return False


def why_excluded(policy: Policy, endpoint: Endpoint) -> str | None:
    """Why POLICY rules ENDPOINT out, or None when it is allowed."""
    if any(_slug_matches(s, endpoint) for s in policy.ignore):
        return "ignored"
    if any(_slug_matches(s, endpoint) for s in policy.quarantine):
        return "quarantined: served another model (identity)"
    if policy.only and not any(_slug_matches(s, endpoint) for s in policy.only):
        return "not in --only-provider"
    if policy.quantizations and (endpoint.quantization or "unknown") not in policy.quantizations:
        return f"quantization {endpoint.quantization or 'unknown'} not allowed"
    if policy.max_price_prompt is not None and endpoint.prompt_price * 1e6 > policy.max_price_prompt:
        return "prompt price above --max-price-prompt"
    if policy.max_price_completion is not None and endpoint.completion_price * 1e6 > policy.max_price_completion:
        return "completion price above --max-price-completion"
    if policy.required_parameters and endpoint.supported_parameters is not None:
        missing = [p for p in policy.required_parameters if p not in endpoint.supported_parameters]
        if missing:
            return f"does not support {', '.join(missing)} (require_parameters)"
    return None


def allowed_endpoints(policy: Policy, endpoints: list[Endpoint]) -> list[Endpoint]:
    return [e for e in endpoints if why_excluded(policy, e) is None]


def serving_endpoints(served: str, endpoints: list[Endpoint] | None) -> list[Endpoint]:
    """The endpoints of the table an answer naming provider SERVED may have come from."""
    s = served.lower()
    return [e for e in endpoints or () if e.provider_name.lower() == s or (e.tag or "").lower() == s]


def slugs_of(served: str, endpoints: list[Endpoint] | None) -> list[str]:
    """The `provider.ignore` slugs that rule out the provider named SERVED: the tags of its
    endpoints in the table (a provider name can cover several, e.g. two quantizations),
    else its name in lower case without spaces ("Moonshot AI" -> "moonshotai")."""
    tags = [e.tag for e in serving_endpoints(served, endpoints) if e.tag]
    return sorted(set(tags)) or [served.lower().replace(" ", "")]


def known_slugs(endpoints: list[Endpoint]) -> list[str]:
    """Every slug `--ignore-provider`/`--only-provider` can name for this table: the tags,
    their base slugs (`deepinfra` for `deepinfra/turbo`) and the provider names."""
    names: set[str] = set()
    for e in endpoints:
        if e.tag:
            names.add(e.tag.lower())
            names.add(e.tag.lower().split("/")[0])
        names.add(e.provider_name.lower())
    return sorted(names)


def unknown_slug(slug: str, endpoints: list[Endpoint]) -> str | None:
    """Why SLUG names no provider of the table (with the closest known one), or None."""
    if any(_slug_matches(slug, e) for e in endpoints):
        return None
    known = known_slugs(endpoints)
    close = difflib.get_close_matches(slug.lower(), known, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    return "known: " + ", ".join(sorted({k for k in known if " " not in k}))


def mixed_names(policy: Policy, endpoints: list[Endpoint] | None) -> dict[str, tuple[list[str], list[str]]]:
    """Provider names that cover both allowed and excluded endpoints: name -> (the allowed
    tags, the excluded tags). An answer from one of them cannot be traced to its endpoint."""
    by_name: dict[str, tuple[list[str], list[str]]] = {}
    for e in endpoints or ():
        allowed, excluded = by_name.setdefault(e.provider_name, ([], []))
        (excluded if why_excluded(policy, e) else allowed).append(e.tag or e.provider_name)
    return {name: (a, x) for name, (a, x) in by_name.items() if a and x}


def variant_ignores(policy: Policy, endpoints: list[Endpoint] | None) -> list[str]:
    """The excluded variants' tags to send in `provider.ignore`, so that the request itself
    keeps them out (the answer cannot tell): those under a name that also has an allowed
    endpoint, except a base tag whose variant is allowed (it would ignore that one too)."""
    tags = []
    for allowed, excluded in mixed_names(policy, endpoints).values():
        for tag in excluded:
            base_of_allowed = any(a.lower() == tag.lower() or a.lower().startswith(tag.lower() + "/")
                                  for a in allowed)
            if not base_of_allowed and tag not in policy.ignore and tag not in tags:
                tags.append(tag)
    return tags


def routing_unverifiable(policy: Policy, served: str | None, endpoints: list[Endpoint] | None) -> bool:
    """Whether an answer from provider SERVED may have come from an excluded endpoint that
    shares its name with an allowed one (see `mixed_names`)."""
    if not served or not endpoints:
        return False
    s = served.lower()
    return any(name.lower() == s for name in mixed_names(policy, endpoints))


def routing_violation(policy: Policy, served: str | None, endpoints: list[Endpoint] | None) -> str | None:
    """Why an answer served by provider SERVED breaks the policy, or None when it is fine.

    Without an endpoints table only the provider's name can be checked (ignore/only); with
    one, its quantization and prices are checked too. An answer with no provider named at
    all passes (OpenRouter always names it; the stand-in too).
    """
    if not served:
        return None
    if endpoints:
        matches = [e for e in endpoints if e.provider_name.lower() == served.lower()
                   or (e.tag or "").lower() == served.lower()]
        if matches:
            reasons = [why_excluded(policy, e) for e in matches]
            if all(reasons):
                return f"served by {served}: {reasons[0]}"
            return None
    probe = Endpoint(provider_name=served)
    if any(_slug_matches(s, probe) for s in policy.ignore):
        return f"served by {served}: ignored"
    if any(_slug_matches(s, probe) for s in policy.quarantine):
        return f"served by {served}: quarantined: served another model (identity)"
    if policy.only and not any(_slug_matches(s, probe) for s in policy.only):
        return f"served by {served}: not in --only-provider"
    return None


@dataclass
class PriceBound:
    """The highest per-token prices the run may be charged (USD per token)."""

    prompt: float
    completion: float
    source: str
    # when a pricing override (not a base price) sets either side: which, said for --plan
    override: str | None = None


def _override_text(endpoint: Endpoint, index: int) -> str:
    entry = (endpoint.pricing.overrides or [])[index]
    conditions = [f"{k} {entry[k]}" for k in ("min_prompt_tokens", "utc_start", "utc_end")
                  if entry.get(k) is not None]
    return (f"{endpoint.tag or endpoint.provider_name} pricing.overrides[{index}]"
            + (f" ({', '.join(conditions)})" if conditions else ""))


def price_bound(policy: Policy, endpoints: list[Endpoint] | None) -> PriceBound | None:
    """Worst-case prices: the highest price that can bill, across the WHOLE endpoints table,
    base prices and every `pricing.overrides[]` entry alike, capped by --max-price-*.

    Not the highest among the endpoints the policy allows: an answer served anyway by an
    endpoint the flags exclude (a routing violation, detected and recorded, but paid for)
    is billed at that endpoint's price, so every endpoint that could bill the request
    counts. Not the base prices alone: the top-level prices are those "under default
    conditions", and an override (a longer prompt, an hour of the day) bills more. A
    `discount` never lowers the bound (it may end at any time). `max_price` caps its side
    of the base prices: OpenRouter filters endpoints by it (a hard filter, not a
    preference); an override above it still counts, since whether that filter looks at an
    override's price is not documented. Without a table, both flags are needed for a bound.
    """
    flag_prompt = policy.max_price_prompt / 1e6 if policy.max_price_prompt is not None else None
    flag_completion = (policy.max_price_completion / 1e6
                       if policy.max_price_completion is not None else None)
    if endpoints:
        sides = {}
        setters = []
        for side, flag in (("prompt", flag_prompt), ("completion", flag_completion)):
            base = max(_price(getattr(e.pricing, side)) or 0.0 for e in endpoints)
            if flag is not None:
                base = min(base, flag)
            top, setter = base, None
            for e in endpoints:
                price, which = e.highest(side)
                if which is not None and price > top:
                    top, setter = price, (e, which)
            sides[side] = top
            if setter is not None:
                setters.append(f"{side} ${top * 1e6:g}/M by {_override_text(*setter)}")
        return PriceBound(sides["prompt"], sides["completion"], "endpoints table",
                          "; ".join(setters) or None)
    if flag_prompt is not None and flag_completion is not None:
        return PriceBound(flag_prompt, flag_completion, "--max-price flags")
    return None
