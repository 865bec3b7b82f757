"""kp-infer's money and token arithmetic, in-process: quantities (10M, 64M), the worst case
reserved before a request so the spend stays under the cap, and the price bound (the whole
endpoints table's highest price, every override, never the discount)."""

from __future__ import annotations

import pytest

from kimipipe.infer.budget import Budget
from kimipipe.infer.config import Money
from kimipipe.kinds import Cap
from kimipipe.openrouter.routing import (
    Endpoint,
    Policy,
    Pricing,
    price_bound,
)
from kimipipe.options import parse_quantity

ENDPOINTS = [
    Endpoint("Moonshot AI", "moonshotai", "unknown", Pricing("0.0000006", "0.0000025")),
    Endpoint("DeepInfra", "deepinfra", "int4", Pricing("0.0000005", "0.000002")),
    Endpoint("DeepInfra", "deepinfra/turbo", "fp4", Pricing("0.0000003", "0.0000012")),
    Endpoint("Fireworks", "fireworks", "nvfp4", Pricing("0.0000004", "0.0000015")),
    Endpoint("BaseTen", "baseten", "fp4", Pricing("0.0000003", "0.0000011")),
]


@pytest.mark.parametrize("text, value", [("10M", 10_000_000), ("500k", 500_000), ("2.5m", 2_500_000),
                                         ("1_000", 1000), ("42", 42), ("1,000", 1000)])
def test_token_counts(text, value):
    assert parse_quantity(text) == value


def test_sizes_are_binary():
    assert parse_quantity("1G", 1024) == 1 << 30 and parse_quantity("512MiB", 1024) == 512 << 20


def test_token_count_rejects_garbage():
    with pytest.raises(ValueError):
        parse_quantity("ten")


def test_worst_case_reservation_keeps_spend_under_cap():
    budget = Budget(Money(max_cost=1.0), 1000, price=price_bound(Policy(), ENDPOINTS))
    assert (budget.max_cost, budget.token_budget, budget.max_tokens) == (1.0, None, 1000)
    worst = budget.worst_case(prompt_tokens=100)
    assert worst == pytest.approx(100 * 6e-7 + 1000 * 2.5e-6)
    admitted = 0
    while budget.cost_fits(worst):
        budget.reserve(worst)
        admitted += 1
    assert budget.spent + budget.reserved <= 1.0
    assert admitted == int(1.0 // worst)


def test_a_prompt_adding_to_its_reservation_leaves_admissions_claim_alone():
    """Admission claims the worst case of the request it found room for (what a run sharing
    --total-cost publishes) until it reserves it; a prompt in progress that adds to its own
    reservation meanwhile (a --server prompt moving to OpenRouter) checks without claiming
    and reserves without dropping that claim."""
    budget = Budget(Money(max_cost=1.0), 1000, price=price_bound(Policy(), ENDPOINTS))
    assert budget.cost_blocker(0.25) is None and budget.claimed() == 0.25
    assert budget.cap_left_no_room(0.5) is None and budget.claimed() == 0.25
    budget.reserve_more(0.5)
    assert (budget.reserved, budget.claimed()) == (0.5, 0.75)
    assert budget.cap_left_no_room(0.75) is Cap.MAX_COST
    budget.reserve(0.25)
    assert (budget.reserved, budget.pending, budget.claimed()) == (0.75, 0.0, 0.75)


def test_price_bound_is_the_whole_tables_highest_price_capped_by_max_price():
    # an excluded endpoint that serves anyway bills its own price: it counts too
    bound = price_bound(Policy(ignore=["moonshotai"]), ENDPOINTS)
    assert bound.prompt == pytest.approx(6e-7) and bound.completion == pytest.approx(2.5e-6)
    bound = price_bound(Policy(only=["baseten"]), ENDPOINTS)
    assert bound.prompt == pytest.approx(6e-7) and bound.completion == pytest.approx(2.5e-6)
    # max_price is enforced by OpenRouter: it caps its own side of the bound
    capped = price_bound(Policy(max_price_completion=2.2), ENDPOINTS)
    assert capped.prompt == pytest.approx(6e-7) and capped.completion == pytest.approx(2.2e-6)
    loose = price_bound(Policy(max_price_prompt=9, max_price_completion=9), ENDPOINTS)
    assert loose.prompt == pytest.approx(6e-7) and loose.completion == pytest.approx(2.5e-6)
    flags = price_bound(Policy(max_price_prompt=1, max_price_completion=4), None)
    assert flags.prompt == pytest.approx(1e-6) and flags.completion == pytest.approx(4e-6)
    assert price_bound(Policy(), None) is None
    assert price_bound(Policy(max_price_prompt=1), None) is None


def test_price_bound_takes_every_override_and_never_the_discount():
    """The bound is the highest price that can bill (docs/money.md), overrides included,
    across the whole table; a discount never lowers it; the override that sets it is named."""
    base = {"prompt": "0.0000005", "completion": "0.000002"}
    table = [
        Endpoint(provider_name="A", tag="a", pricing=Pricing(**base, discount=0.5, overrides=[
            {"min_prompt_tokens": 100000, "prompt": "0.0000009", "completion": "0.000003"},
            {"utc_start": 1800, "utc_end": 2200, "completion": "0.000008"}])),
        Endpoint(provider_name="B", tag="b", pricing=Pricing(prompt="0.0000006", completion="0.0000025")),
    ]
    bound = price_bound(Policy(only=["b"]), table)
    assert bound.prompt == pytest.approx(9e-7) and bound.completion == pytest.approx(8e-6)
    assert "a pricing.overrides[1] (utc_start 1800, utc_end 2200)" in bound.override
    assert "a pricing.overrides[0] (min_prompt_tokens 100000)" in bound.override
    # an override a --max-price flag may not filter still counts; the base prices are capped
    capped = price_bound(Policy(max_price_prompt=0.55, max_price_completion=2.2), table)
    assert capped.prompt == pytest.approx(9e-7) and capped.completion == pytest.approx(8e-6)
    plain = price_bound(Policy(), [table[1]])
    assert plain.override is None and plain.completion == pytest.approx(2.5e-6)
    # odd override shapes are read as far as they go
    odd = Endpoint(provider_name="C", pricing=Pricing(**base, overrides=[{"prompt": None}, {"completion": "x"}]))
    assert price_bound(Policy(), [odd]).completion == pytest.approx(2e-6)
    assert table[0].discount == 0.5 and table[1].discount == 0.0

