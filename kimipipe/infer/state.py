"""What the parts of one kp-infer run share while it runs, in one object passed to each.

`RunState` owns these and is told what happens: the run stops it (`stop`), admits a
prompt (`admitted`) and says what admission waits for (`waiting`); each prompt's work
(infer/prompt_work.py) ends (its ticket, infer/admission.py: `ended`, then `settled`:
admission looks again) or waits for the caps' room after a refused answer
(`waiting_for_room`); the progress line
(infer/progress.py) only reads it.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..errors import ExitCode
from ..kinds import StopReason


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
    # attempt (admission.py): they free no room, so when they are all that is in flight
    # the cap stops the run
    room_waiters: int = 0

    def stop(self, reason: StopReason) -> bool:
        """Admission stops; True when REASON becomes the run's (the first one does, and a
        failed write outranks a stop that would exit 0, such as a token budget reached:
        answers waiting in the rescue file must not look like a finished job)."""
        taken = self.stop_reason is None or (reason in (StopReason.DISK, StopReason.OUTPUT)
                                             and self.stop_reason.exit_code == ExitCode.OK)
        if taken:
            self.stop_reason = reason
            self.stopped_at = self.stopped_at or time.monotonic()
        self.stopping.set()
        self.settled.set()
        return taken

    def admitted(self, prompt_id: str) -> None:
        self.in_progress[prompt_id] = time.monotonic()

    def ended(self, prompt_id: str) -> None:
        """A prompt's work ended (it sets `settled` once its reservations are released)."""
        self.in_progress.pop(prompt_id, None)

    @contextmanager
    def waiting_for_room(self) -> Iterator[None]:
        """A prompt in progress waits for the caps' room for its next attempt."""
        self.room_waiters += 1
        try:
            yield
        finally:
            self.room_waiters -= 1

    def only_waiting_for_room(self) -> bool:
        """Every prompt in progress waits for room: none of them will free any."""
        return len(self.in_progress) <= self.room_waiters


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


def run_interruptible(coro):
    """Run CORO; a SIGINT or SIGTERM meanwhile cancels it and is then a KeyboardInterrupt
    (exit 130, one line). Taken by the loop's own handlers: a KeyboardInterrupt raised by
    the signal inside whichever task was running left that task's exception unretrieved,
    and asyncio printed its traceback (seen once in a full suite run)."""
    interrupted = False

    async def main():
        nonlocal interrupted
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()

        def stop() -> None:
            nonlocal interrupted
            interrupted = True
            task.cancel()

        with signals_handled(loop, stop):
            try:
                return await coro
            except asyncio.CancelledError:
                if interrupted:
                    return None
                raise

    result = asyncio.run(main())
    if interrupted:
        raise KeyboardInterrupt
    return result
