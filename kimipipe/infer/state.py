"""What the parts of one kp-infer run share while it runs, in one object passed to each.

The run (infer/run.py) sets the stop and what admission waits for; each prompt's work
(infer/prompt_work.py) leaves `in_progress` and sets `settled` when it ends; the progress
line (infer/progress.py) reads all of it. No part reaches into another for these.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .report import StopReason


@dataclass
class RunState:
    # set once admission stops: everything waiting gives up, requests in flight finish
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # set whenever a prompt's work ends (its reservations released): admission looks again
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    stop_reason: StopReason | None = None
    stopped_at: float | None = None  # when admission stopped: --grace counts from it
    waiting: str | None = None  # what holds admission back, for the progress line
    # prompt ID -> when admitted, oldest first (retries and back-off included)
    in_progress: dict[str, float] = field(default_factory=dict)
