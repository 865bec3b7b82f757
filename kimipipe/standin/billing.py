"""How the stand-in bills, as OpenRouter does: the price that applies, and what an answer
shows of its cost.

Prices. An endpoint's table entry lists its base prices ("under default conditions"),
`discount` (every price x (1 - discount)) and `overrides[]`, OpenRouter's PricingOverride
`{min_prompt_tokens, utc_start, utc_end, prompt, completion}` (the SDK's model: an entry
applies when every condition it has holds: prompt tokens strictly above
`min_prompt_tokens`, the UTC time in `[utc_start, utc_end)`, HHMM clock numbers, a window
that may wrap past midnight; later entries win per key; absent keys inherit the base).
The stand-in is told them per provider (`--price-override
PROVIDER=FACTOR[:MIN_PROMPT_TOKENS]`: an override at FACTOR x the base prices, at any hour,
above that prompt length when given; `--discount PROVIDER=D`) and bills a generation at the
price that applies to it, less the discount, times `--price-scale`. The endpoints table
lists the same (`pricing_document`).

Costs shown. OpenRouter's usage accounting comes from each provider, and `usage.cost` is
not always there; `GET /generation?id=` has `total_cost` a few seconds after the answer
(404 before). `--no-cost RATE`: that share of billed answers carry usage without `cost`
(and without `cost_details`); `--no-usage RATE`: that share carry no usage at all (a stream
without its usage chunk); `--generation-delay S`: /generation answers 404 for S seconds
after a generation ends. The draws have their own seeded RNG (the fault draws are unmoved).

Zero-completion insurance: an answer with 0 completion tokens and a blank finish reason, or
`finish_reason: error`, is not billed (the `zero` fault serves one; `midstream` and the
error bodies are never billed either).
"""

from __future__ import annotations

import time

from .providers import StandinEndpoint


def overrides_for(endpoint: StandinEndpoint, config) -> list[dict]:
    """The endpoint's `pricing.overrides[]` (USD per token, as strings), before the scale."""
    entries = []
    for slug, (factor, min_prompt_tokens) in config.price_overrides.items():
        if endpoint.matches(slug):
            entry: dict = {"prompt": f"{endpoint.prompt * factor:.12g}",
                           "completion": f"{endpoint.completion * factor:.12g}"}
            if min_prompt_tokens is not None:
                entry["min_prompt_tokens"] = int(min_prompt_tokens)
            entries.append(entry)
    return entries


def discount_for(endpoint: StandinEndpoint, config) -> float:
    return next((float(d) for slug, d in config.discounts.items() if endpoint.matches(slug)), 0.0)


def _applies(override: dict, prompt_tokens: int, now: float) -> bool:
    """Whether every condition of OVERRIDE holds for a request of PROMPT_TOKENS at NOW."""
    threshold = override.get("min_prompt_tokens")
    if threshold is not None and not prompt_tokens > threshold:
        return False
    start, end = override.get("utc_start"), override.get("utc_end")
    if start is None or end is None:
        return True
    t = time.gmtime(now)
    clock = t.tm_hour * 100 + t.tm_min
    return start <= clock < end if start <= end else (clock >= start or clock < end)


def billed_prices(endpoint: StandinEndpoint, config, prompt_tokens: int,
                  now: float | None = None) -> tuple[float, float]:
    """(prompt, completion) USD per token a generation of PROMPT_TOKENS is billed at now."""
    prices = {"prompt": endpoint.prompt, "completion": endpoint.completion}
    for override in overrides_for(endpoint, config):  # later entries win, per key
        if _applies(override, prompt_tokens, time.time() if now is None else now):
            prices.update({k: float(override[k]) for k in prices if k in override})
    prompt, completion = prices["prompt"], prices["completion"]
    scale = config.price_scale * (1.0 - discount_for(endpoint, config))
    return prompt * scale, completion * scale


def pricing_document(endpoint: StandinEndpoint, config) -> dict:
    """The `pricing` object of the endpoints table: what is billed, as OpenRouter lists it."""
    scale = config.price_scale

    def listed(price: float) -> str:
        return f"{price * scale:.12g}"

    pricing = {"prompt": listed(endpoint.prompt), "completion": listed(endpoint.completion),
               "request": "0", "image": "0", "web_search": "0", "internal_reasoning": "0",
               "discount": discount_for(endpoint, config)}
    overrides = [{**o, "prompt": listed(float(o["prompt"])), "completion": listed(float(o["completion"]))}
                 for o in overrides_for(endpoint, config)]
    if overrides:
        pricing["overrides"] = overrides
    return pricing
