"""Money and tokens, exactly: what a run may still spend, with worst-case reservations.

Spend is the sum of `usage.cost` as billed (never `upstream_inference_cost` on top),
counted across runs from the output file (and the failures file: a routing violation
was paid for too). Before a request is sent, its worst case is reserved:

    prompt_token_bound x highest prompt price + max_tokens x highest completion price

where the highest prices are those of the whole endpoints table, excluded endpoints
included (one that serves anyway bills its own price; see routing.price_bound), capped
by --max-price-* (OpenRouter enforces max_price), and the token bound of a prompt is
its UTF-8 byte count plus template overhead (a BPE token is at least one byte), so
`spent + reserved <= max_cost` holds at every moment and the cap is never exceeded as
long as the provider bills at most its listed price.
A request is admitted only when its reservation fits; when it does not fit but requests
are in flight, admission waits for them to settle; when nothing is in flight, the run
stops (exit 3). `--total-cost` (infer/total_cost.py) is a second cap checked the same way,
on the spend of several outputs together, shared with other runs through a locked file.
A cap below the largest prompt's worst case could never send that prompt, spent or not:
the run is refused before anything is sent (exit 2), and --plan warns, naming the worst
case and what would fit (`cap_below_one_request`).

The token budget caps recorded completion tokens. It is enforced on expectations, not
worst cases (a worst-case reservation of max_tokens each would leave most of a 10M budget
unused): a request is admitted while `recorded + in_flight x mean completion` stays
under the budget. The overshoot is bounded by the work in flight: at most
(in flight) x (max_tokens - mean), and in practice a few answers' worth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..kinds import Cap
from ..openrouter.routing import PriceBound
from .config import Money
from .total_cost import TotalCost

MESSAGE_OVERHEAD_TOKENS = 16
PROMPT_OVERHEAD_TOKENS = 64


def request_worst_case(prompt_tokens: float, max_tokens: int, price: PriceBound) -> float:
    """The most one request can cost (the one definition: the budget's reservations, the
    plan's figures and the preflight's all come from here): PROMPT_TOKENS at the highest
    prompt price and all of MAX_TOKENS at the highest completion price."""
    return prompt_tokens * price.prompt + max_tokens * price.completion


def prompt_token_bound(messages) -> int:
    """An upper bound on a prompt's tokens: one per UTF-8 byte, plus template overhead (an
    earlier turn's reasoning sent back in a conversation's history counts too)."""
    return PROMPT_OVERHEAD_TOKENS + sum(
        len(m.content.encode("utf-8")) + len((m.reasoning or "").encode("utf-8"))
        + MESSAGE_OVERHEAD_TOKENS for m in messages)


@dataclass
class Budget:
    """What a run may still spend. The limits are read from MONEY (the one place they
    live); MAX_TOKENS is a request's completion at most; `spent` and `tokens` start at
    what earlier runs recorded."""

    money: Money
    max_tokens: int
    price: PriceBound | None  # the highest per-token prices allowed endpoints charge
    spent: float = 0.0  # recorded, all runs
    spent_this_run: float = 0.0
    tokens: int = 0  # completion tokens recorded, all runs
    reserved: float = 0.0
    settled_answers: int = 0
    settled_tokens: int = 0
    total: TotalCost | None = None  # --total-cost
    # admission's claim: the worst case of the request found to fit, not yet reserved
    # (cost_blocker sets it, reserve turns it into a reservation; nothing else touches it)
    pending: float = 0.0

    @property
    def max_cost(self) -> float | None:
        return self.money.max_cost

    @property
    def token_budget(self) -> int | None:
        return self.money.token_budget

    def worst_case(self, prompt_tokens: int) -> float:
        if self.price is None:
            return 0.0
        return request_worst_case(prompt_tokens, self.max_tokens, self.price)

    def cost_blocker(self, amount: float) -> Cap | None:
        """Admission's check: which money cap a new request of worst case AMOUNT does not
        fit now, or None when it fits both; then AMOUNT is claimed until `reserve`."""
        self.pending = 0.0
        blocker = self.cap_left_no_room(amount)
        if blocker is None:
            # until reserve(): a run sharing --total-cost keeps claiming it (it may still
            # wait for a concurrency slot, and another run must not take that room meanwhile)
            self.pending = amount
        return blocker

    def cap_left_no_room(self, amount: float) -> Cap | None:
        """cost_blocker's answer, claiming nothing (for a prompt that holds its reservation
        already: its next attempt, or its move to OpenRouter)."""
        if self.max_cost is not None and self.spent + self.reserved + amount > self.max_cost:
            return Cap.MAX_COST
        if self.total is not None and not self.total.fits(self.spent_this_run, self.reserved, amount):
            return Cap.TOTAL_COST
        return None

    def cost_fits(self, amount: float) -> bool:
        return self.cost_blocker(amount) is None

    def reserve(self, amount: float) -> None:
        """Admission's: the request claimed (`cost_blocker`) is reserved."""
        self.reserved += amount
        self.pending = 0.0

    def reserve_more(self, amount: float) -> None:
        """A prompt in progress adds AMOUNT to its reservation (admission's claim stays)."""
        self.reserved += amount

    def claimed(self) -> float:
        """What this run may have in flight: its reservations and the request about to go."""
        return self.reserved + self.pending

    def release(self, amount: float) -> None:
        self.reserved = max(0.0, self.reserved - amount)

    def record(self, cost: float, completion_tokens: int) -> None:
        self.spent += cost
        self.spent_this_run += cost
        self.tokens += completion_tokens
        self.settled_answers += 1
        self.settled_tokens += completion_tokens

    def mean_completion(self) -> float:
        if self.settled_answers:
            return self.settled_tokens / self.settled_answers
        return self.max_tokens / 4

    def tokens_exhausted(self) -> bool:
        return self.token_budget is not None and self.tokens >= self.token_budget

    def tokens_fit(self, in_flight: int) -> bool:
        if self.token_budget is None:
            return True
        if in_flight == 0:
            return self.tokens < self.token_budget
        return self.tokens + (in_flight + 1) * self.mean_completion() <= self.token_budget



def cap_below_one_request(budget: Budget, largest_prompt_tokens: int, todo: int,
                          servers: bool) -> str | None:
    """Why a money cap can never pay for one request, or None: --max-cost (or --total-cost)
    is below the worst case of the input's largest prompt, so that request could never be
    sent, even with nothing spent (the run would stop, once or at once, "reached" with the
    money unspent). The message names that worst case and what would fit: the cap it needs,
    and the largest --max-tokens the cap pays for (none when the prompt alone does not).
    A cap that pays for one request but not for what is still to do stops the run, exit 3.
    SERVERS: the run has --server (they answer what OpenRouter's share cannot)."""
    price = budget.price
    if price is None or not todo or not largest_prompt_tokens or servers:
        return None  # (with --server, the servers answer what OpenRouter's share cannot)
    worst = budget.worst_case(largest_prompt_tokens)
    caps = [(flag, cap) for flag, cap in ((Cap.MAX_COST.flag, budget.max_cost),
                                          (Cap.TOTAL_COST.flag, budget.total and budget.total.cap))
            if cap is not None and worst > cap]
    if not caps:
        return None
    flag, cap = caps[0]
    prompt_part = largest_prompt_tokens * price.prompt
    fits = math.floor((cap - prompt_part) / price.completion) if price.completion > 0 else 0
    lower = (f"lower --max-tokens to {fits:,} or less" if fits >= 1 else
             "no --max-tokens fits (the prompt alone costs more)")
    need = math.ceil(worst * 10_000) / 10_000
    return (f"{flag} ${cap:g} is less than one request's worst case, ${worst:.4f} (the input's "
            f"largest prompt, at most {largest_prompt_tokens:,} tokens, at ${price.prompt * 1e6:g}/M, "
            f"and --max-tokens {budget.max_tokens:,} at ${price.completion * 1e6:g}/M): that "
            f"request could never be sent; raise {flag} to ${need:g} or more, or {lower}")
