"""kp-infer's pure parts: budget arithmetic, routing policy, reasoning extraction, limiter."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from kimipipe.cli import parse_quantity
from kimipipe.infer.budget import Budget
from kimipipe.infer.config import RunConfig
from kimipipe.infer.limiter import AdaptiveLimiter
from kimipipe.openrouter.client import (
    _Message,
    _reasoning_text,
    _ReasoningDetail,
    split_inline_think,
)
from kimipipe.openrouter.request import RequestOptions
from kimipipe.openrouter.routing import (
    Endpoint,
    Policy,
    Pricing,
    allowed_endpoints,
    price_bound,
    routing_violation,
)


@pytest.mark.parametrize("text, value", [("10M", 10_000_000), ("500k", 500_000), ("2.5m", 2_500_000),
                                         ("1_000", 1000), ("42", 42), ("1,000", 1000)])
def test_token_counts(text, value):
    assert parse_quantity(text) == value


def test_sizes_are_binary():
    assert parse_quantity("1G", 1024) == 1 << 30 and parse_quantity("512MiB", 1024) == 512 << 20


def test_token_count_rejects_garbage():
    with pytest.raises(ValueError):
        parse_quantity("ten")


ENDPOINTS = [
    Endpoint("Moonshot AI", "moonshotai", "unknown", Pricing("0.0000006", "0.0000025")),
    Endpoint("DeepInfra", "deepinfra", "int4", Pricing("0.0000005", "0.000002")),
    Endpoint("DeepInfra", "deepinfra/turbo", "fp4", Pricing("0.0000003", "0.0000012")),
    Endpoint("Fireworks", "fireworks", "nvfp4", Pricing("0.0000004", "0.0000015")),
    Endpoint("BaseTen", "baseten", "fp4", Pricing("0.0000003", "0.0000011")),
]


def test_ignore_matches_variants_and_quantization_filter():
    policy = Policy(ignore=["fireworks", "baseten"])
    assert [e.tag for e in allowed_endpoints(policy, ENDPOINTS)] == ["moonshotai", "deepinfra", "deepinfra/turbo"]
    policy = Policy(ignore=["deepinfra"])
    assert [e.tag for e in allowed_endpoints(policy, ENDPOINTS)] == ["moonshotai", "fireworks", "baseten"]
    policy = Policy(quantizations=["int4", "unknown"])
    assert [e.tag for e in allowed_endpoints(policy, ENDPOINTS)] == ["moonshotai", "deepinfra"]


def test_price_bound_is_the_highest_allowed_price_or_flags():
    bound = price_bound(Policy(ignore=["moonshotai"]), ENDPOINTS)
    assert bound.prompt == pytest.approx(5e-7) and bound.completion == pytest.approx(2e-6)
    flags = price_bound(Policy(max_price_prompt=1, max_price_completion=4), None)
    assert flags.prompt == pytest.approx(1e-6) and flags.completion == pytest.approx(4e-6)
    assert price_bound(Policy(), None) is None


def test_routing_violation_checks_name_and_quantization():
    policy = Policy(ignore=["fireworks", "baseten"])
    assert routing_violation(policy, "Fireworks", ENDPOINTS) == "served by Fireworks: ignored"
    assert routing_violation(policy, "Moonshot AI", ENDPOINTS) is None
    assert routing_violation(policy, "BaseTen", None) == "served by BaseTen: ignored"
    only_int4 = Policy(quantizations=["int4"])
    assert "quantization unknown" in routing_violation(only_int4, "Moonshot AI", ENDPOINTS)
    # DeepInfra serves both int4 and fp4 endpoints under one name: allowed if any matches
    assert routing_violation(only_int4, "DeepInfra", ENDPOINTS) is None


def test_worst_case_reservation_keeps_spend_under_cap():
    config = RunConfig(max_cost=1.0, request=RequestOptions(max_tokens=1000))
    budget = Budget(config, price=price_bound(Policy(), ENDPOINTS))
    assert (budget.max_cost, budget.token_budget, budget.max_tokens) == (1.0, None, 1000)
    worst = budget.worst_case(prompt_tokens=100)
    assert worst == pytest.approx(100 * 6e-7 + 1000 * 2.5e-6)
    admitted = 0
    while budget.cost_fits(worst):
        budget.reserve(worst)
        admitted += 1
    assert budget.spent + budget.reserved <= 1.0
    assert admitted == int(1.0 // worst)


def test_reasoning_extraction_order():
    def details(rows):  # as the client decodes them from the wire
        return msgspec.json.decode(msgspec.json.encode(rows), type=list[_ReasoningDetail])

    assert _reasoning_text("direct", details([{"type": "reasoning.text", "text": "x"}])) == "direct"
    assert _reasoning_text(None, details([{"type": "reasoning.text", "text": "a"},
                                          {"type": "reasoning.summary", "summary": "s"},
                                          {"type": "reasoning.text", "text": "b"}])) == "ab"
    assert _reasoning_text("", None) is None
    assert split_inline_think("<think>plan</think>answer", None) == ("answer", "plan")
    assert split_inline_think("<think>plan</think>answer", "real") == ("<think>plan</think>answer", "real")
    assert split_inline_think("no think", None) == ("no think", None)
    assert _Message().content is None


def test_limiter_shrinks_on_429_and_grows_back():
    async def scenario():
        limiter = AdaptiveLimiter(100, cooldown=0.05)
        limiter.rate_limited()
        assert limiter.current == 75
        limiter.rate_limited()  # the same burst: counted once
        assert limiter.current == 75
        await asyncio.sleep(0.06)
        limiter.rate_limited()
        assert limiter.current == 56
        await asyncio.sleep(0.12)
        await limiter.acquire()
        assert limiter.current > 56
        await limiter.release()
        for _ in range(40):
            await asyncio.sleep(0.06)
            await limiter.acquire()
            await limiter.release()
        assert limiter.current == 100

    asyncio.run(scenario())
