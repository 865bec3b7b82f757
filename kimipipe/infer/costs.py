"""What an answer cost when its usage does not say: never $0.

OpenRouter's usage accounting comes from each provider, and an answer's `usage.cost` can
be missing; a stream can even end with no usage at all. Such an answer was billed all the
same, so it is never booked as free:

1. At once it counts at an estimate that cannot fall short of the bill (`estimate`): its
   usage tokens at the price bound (the highest price that can bill it, pricing overrides
   included: openrouter/routing.py `price_bound`); with no usage at all, its worst case
   (the reservation it was admitted with: the prompt's token bound and `max_tokens` at
   the bound). Its reservation, which is at least that, stays held until the figure is
   known, so every cap (`--max-cost`, `--total-cost`, the money in flight) counts it.
2. Its real figure is then read from `GET /generation?id=` (`total_cost`), asked again
   with a growing pause while OpenRouter answers 404 (it has the generation a few seconds
   after the answer), for at most `--cost-lookup-wait` seconds (`look_up`).
3. Its record is written once, with the figure and where it came from (`cost_source`:
   "usage", "generation" or "estimate" when no figure came in time: the estimate stays,
   an overcount, never an undercount; "server" for a --server's answer, which costs
   nothing). The summary counts the answers of each source.

Why the record waits for the lookup instead of being written with the estimate and
patched: the output is append-only JSONL, flushed line by line and read while it is
written (`--spent-in` of other runs, `kp-infer report`, a resume after `kill -9`); a
patch would rewrite lines others read, and a second line per answer would break "one
record per ID". The answer is held in memory for the seconds the lookup takes, like an
answer still streaming; when the run must end first (the grace period is over, a second
Ctrl-C), the record is written at once with the estimate, so it is never lost for want
of a figure. A refused answer's cost (`Refusal.cost`) is settled the same way before the
prompt is sent again.

Zero-completion insurance: OpenRouter bills no answer with zero completion tokens and a
blank finish reason, nor one with `finish_reason: error`. kp-infer never books those
either: they are not answers (openrouter/client.py: retried, and nothing is booked for a
retried attempt), so no estimate needs reconciling for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..openrouter.attempt import Attempt
from ..openrouter.routing import PriceBound

USAGE, GENERATION, ESTIMATE = "usage", "generation", "estimate"
SERVER = "server"  # a self-hosted server's answer (infer/servers.py): it costs nothing
FIRST_PAUSE = 0.25  # seconds before the first lookup; each pause then doubles, up to MAX_PAUSE
MAX_PAUSE = 4.0


def estimate(answer: Attempt, price: PriceBound | None, worst_case: float) -> float:
    """What ANSWER cost at most: its usage tokens at the price bound; WORST_CASE (its
    reservation) when it came without usage, or without a bound to price it at."""
    if not answer.usage_seen or price is None:
        return worst_case
    return answer.prompt_tokens * price.prompt + answer.completion_tokens * price.completion


async def look_up(generation_id: str | None, read: Callable[[str], Awaitable[float | None]],
                  wait: float) -> float | None:
    """GET /generation's `total_cost` for GENERATION_ID (READ: the run's client's
    `generation_cost`, openrouter/client.py), asked again while it is not there yet (None),
    for at most WAIT seconds; None when no figure came (no id, a failed read, or not in
    time)."""
    if not generation_id or wait <= 0:
        return None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    pause = FIRST_PAUSE
    while True:
        await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
        try:
            cost = await read(generation_id)
        except Exception:  # a lookup that fails leaves the estimate: never a reason to stop
            cost = None
        if cost is not None:
            return cost
        if loop.time() >= deadline:
            return None
        pause = min(MAX_PAUSE, pause * 2)


async def settle(answer: Attempt, price: PriceBound | None, worst_case: float,
                 read: Callable[[str], Awaitable[float | None]], wait: float) -> tuple[float, str]:
    """(what ANSWER cost, where the figure came from): `usage.cost` when it has one, else
    GET /generation's figure, else the estimate (see the module docstring)."""
    if answer.cost is not None:
        return answer.cost, USAGE
    found = await look_up(answer.generation_id, read, wait)
    return (found, GENERATION) if found is not None else (estimate(answer, price, worst_case), ESTIMATE)
