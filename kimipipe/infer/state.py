"""What the parts of one kp-infer run share while it runs, in one object passed to each.

The run (infer/run.py) sets the stop and what admission waits for; each prompt's work
(infer/prompt_work.py) leaves `in_progress` and sets `settled` when it ends; the progress
line (infer/progress.py) reads all of it. No part reaches into another for these.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    # of them, those waiting after a refused answer for the caps' room for their next
    # attempt (prompt_work.py): they free no room, so when they are all that is in flight
    # the cap stops the run
    waiting_for_room: int = 0


@contextmanager
def signals_handled(loop: asyncio.AbstractEventLoop, handler: Callable[[], None]) -> Iterator[None]:
    """SIGINT and SIGTERM call HANDLER in LOOP (not a KeyboardInterrupt raised inside
    whichever task is running, whose exception nobody retrieves); then the handlers found are
    put back (asyncio would leave SIGTERM to kill the process)."""
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        try:
            loop.add_signal_handler(sig, handler)
        except (NotImplementedError, RuntimeError, ValueError):
            continue
        installed.append((sig, previous))
    try:
        yield
    finally:
        for sig, previous in installed:
            try:
                loop.remove_signal_handler(sig)
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
