"""Every 402 and 403 the stand-in answers a completion with, in OpenRouter's words.

OpenRouter bills a request when it finishes, so it guards money before a request runs.
Its limits docs describe three credit limits; the stand-in enforces each, in this order:

1. Budget layers, refused before routing, in the order OpenRouter's `GET /key` lists them:
   a guardrail budget (`--guardrail-budget`, scope `api_key`), a workspace budget
   (`--workspace-budget`, scope `workspace`), the key's own limit (`--key-limit`, scope
   `key_limit`). A layer whose spend has reached its limit refuses with 402, the documented
   form (403 with `--limit-status 403`: also seen), message "Budget limit exceeded", and
   `metadata: {limit_source, scope, limit_usd, spend_usd, resets_at}`; no Retry-After
   (the wait is hours). `limit_source` is `openrouter_guardrail_budget`,
   `openrouter_workspace_budget` or `openrouter_key_limit`.
2. The account balance gone (nothing left to spend): 402 "Insufficient credits. Add more
   using https://openrouter.ai/settings/credits", `metadata: {limit_source:
   openrouter_credits}`.
3. One request's worst case (prompt tokens + max_tokens, or the endpoint's maximum
   completion when absent, at the chosen endpoint's prices) larger than what it may
   reserve: the in-flight budget (R x balance left, `--inflight-ratio R`; the balance
   left when the ratio is off), capped by the key's limit_remaining. 402 "This request
   requires more credits, or fewer max_tokens. You requested up to N tokens, but can only
   afford M." with `metadata: {reason: weight_exceeds_budget, limit_source:
   openrouter_credits}`; when the key's remaining limit is what binds, the message goes on
   " To increase, visit https://openrouter.ai/settings/keys and create a key with a higher
   total limit" and the metadata is the key limit's (`limit_source:
   openrouter_key_limit`, scope, limit_usd, spend_usd, resets_at).
4. The in-flight budget full (`--inflight-ratio R` only): the worst cases of the requests
   running, and of those finished within `--settle S` seconds, summed with this one's,
   past R x the balance left: 402 "This request would exceed your available credits given
   your current in-flight requests. Retry after in-flight requests settle, or add
   credits.", `metadata: {reason: in_flight_budget_exhausted, limit_source:
   openrouter_in_flight_budget}`, header `Retry-After` (whole seconds until the oldest
   settling reservation expires, at least 1; S rounded up when every reservation is
   still running).

Moderation (`--moderation-marker WORD`, `--fault moderation=RATE`): 403 "{model} requires
moderation on {provider}. Your input was flagged for \"{reasons}\"" with `metadata:
{reasons, flagged_input, provider_name, model_slug}` and no `limit_source`; never charged,
nothing reserved.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

IN_FLIGHT_MESSAGE = ("This request would exceed your available credits given your current "
                     "in-flight requests. Retry after in-flight requests settle, or add credits.")
BALANCE_GONE_MESSAGE = "Insufficient credits. Add more using https://openrouter.ai/settings/credits"
BUDGET_MESSAGE = "Budget limit exceeded"
KEY_LIMIT_HINT = ("To increase, visit https://openrouter.ai/settings/keys and create a key "
                  "with a higher total limit")
LIMIT_RESETS = ("daily", "weekly", "monthly")
LIMIT_STATUSES = (403, 402)
MODERATION_REASONS = ["violence"]
FLAGGED_INPUT_MAX = 100   # OpenRouter truncates flagged_input to 100 characters


@dataclass(frozen=True)
class BudgetLayer:
    """One budget that applies to the key: what `GET /key` lists and what refuses."""

    limit_source: str
    scope: str                # as the `scope` of OpenRouter's KeyBudget
    limit_usd: float
    reset_interval: str | None
    budget_id: str | None = None
    guardrail_id: str | None = None


def budget_layers(guardrail: float | None, workspace: float | None, key: float | None,
                  reset: str | None) -> list[BudgetLayer]:
    """The layers set, in the order OpenRouter checks them."""
    layers = []
    if guardrail is not None:
        layers.append(BudgetLayer("openrouter_guardrail_budget", "api_key", guardrail, reset,
                                  guardrail_id="standin-guardrail"))
    if workspace is not None:
        layers.append(BudgetLayer("openrouter_workspace_budget", "workspace", workspace, reset,
                                  budget_id="standin-workspace-budget"))
    if key is not None:
        layers.append(BudgetLayer("openrouter_key_limit", "key_limit", key, reset))
    return layers


def resets_at(interval: str | None, now: datetime | None = None) -> str | None:
    """The UTC instant a budget window rolls over (weeks start Monday); None: never."""
    if interval is None:
        return None
    now = now or datetime.now(UTC)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if interval == "daily":
        at = day + timedelta(days=1)
    elif interval == "weekly":
        at = day + timedelta(days=7 - day.weekday())
    else:
        at = (day.replace(day=1) + timedelta(days=32)).replace(day=1)
    return at.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def layer_metadata(layer: BudgetLayer, spend: float) -> dict:
    return {"limit_source": layer.limit_source, "scope": layer.scope,
            "limit_usd": layer.limit_usd, "spend_usd": spend,
            "resets_at": resets_at(layer.reset_interval)}


def key_budget(layer: BudgetLayer, spend: float) -> dict:
    """The layer as an entry of `GET /key`'s `budgets` (OpenRouter's KeyBudget)."""
    return {"scope": layer.scope, "budget_id": layer.budget_id,
            "guardrail_id": layer.guardrail_id, "include_byok": False,
            "limit_usd": layer.limit_usd, "spend_usd": spend,
            "remaining_usd": layer.limit_usd - spend, "reset_interval": layer.reset_interval,
            "resets_at": resets_at(layer.reset_interval)}


def effective_budget(layers: list[BudgetLayer], spend: float) -> BudgetLayer | None:
    """The layer that blocks first: the first spent one, else the least remaining."""
    for layer in layers:
        if spend >= layer.limit_usd:
            return layer
    return min(layers, key=lambda la: la.limit_usd - spend, default=None)


def error(status: int, message: str, metadata: dict) -> dict:
    return {"error": {"code": status, "message": message, "metadata": metadata}}


def budget_exceeded(layer: BudgetLayer, spend: float, status: int) -> dict:
    return error(status, BUDGET_MESSAGE, layer_metadata(layer, spend))


def balance_gone() -> dict:
    return error(402, BALANCE_GONE_MESSAGE, {"limit_source": "openrouter_credits"})


def weight_exceeds_budget(asked: int, affordable: int, key_layer: BudgetLayer | None = None,
                          spend: float = 0.0) -> dict:
    message = (f"This request requires more credits, or fewer max_tokens. You requested up "
               f"to {asked} tokens, but can only afford {affordable}.")
    if key_layer is not None:
        return error(402, f"{message} {KEY_LIMIT_HINT}", layer_metadata(key_layer, spend))
    return error(402, message, {"reason": "weight_exceeds_budget",
                                "limit_source": "openrouter_credits"})


def in_flight_budget_exhausted() -> dict:
    return error(402, IN_FLIGHT_MESSAGE, {"reason": "in_flight_budget_exhausted",
                                          "limit_source": "openrouter_in_flight_budget"})


def flagged(text: str, marker: str | None) -> str:
    """The flagged part of the input, at most 100 characters, cut in the middle."""
    if marker and marker in text:
        at = text.index(marker)
        text = text[max(0, at - 40): at + len(marker) + 40]
    if len(text) <= FLAGGED_INPUT_MAX:
        return text
    half = (FLAGGED_INPUT_MAX - 3) // 2
    return text[:half] + "..." + text[-half:]


def moderation(model: str, provider: str, flagged_input: str) -> dict:
    reasons = ", ".join(MODERATION_REASONS)
    return error(403, f"{model} requires moderation on {provider}. Your input was flagged for "
                      f"\"{reasons}\"",
                 {"reasons": list(MODERATION_REASONS), "flagged_input": flagged_input,
                  "provider_name": provider, "model_slug": model})


class InFlight:
    """The worst cases reserved by requests running, and by those finished within the
    settle time. Running reservations are one sum; settling ones a heap by expiry."""

    def __init__(self) -> None:
        self.running = 0.0
        self.running_count = 0
        self._settling: list[tuple[float, float]] = []   # (expires at, amount)
        self.settling = 0.0
        self.peak = 0.0

    def expire(self, now: float) -> None:
        heap = self._settling
        while heap and heap[0][0] <= now:
            self.settling -= heapq.heappop(heap)[1]
        if not heap:
            self.settling = 0.0   # no drift left behind by float sums

    def reserved(self, now: float) -> float:
        self.expire(now)
        return self.running + self.settling

    def reserve(self, amount: float, now: float) -> None:
        self.running += amount
        self.running_count += 1
        self.peak = max(self.peak, self.reserved(now))

    def release(self, amount: float, now: float, settle: float) -> None:
        """The request ended: its reservation settles for `settle` seconds (0: freed)."""
        self.running_count -= 1
        self.running = self.running - amount if self.running_count else 0.0
        if settle > 0:
            heapq.heappush(self._settling, (now + settle, amount))
            self.settling += amount

    def retry_after(self, now: float, settle: float) -> int:
        """Whole seconds until the oldest settling reservation expires (at least 1)."""
        self.expire(now)
        wait = self._settling[0][0] - now if self._settling else settle
        return max(1, math.ceil(wait))

    @property
    def settling_count(self) -> int:
        return len(self._settling)
