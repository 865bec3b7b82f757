"""Where kp-infer's requests go, and how its one event loop stays cheap with thousands open.

`open_transport(config, servers)` gives the run its transport (enter it with `async with`):
a `CompletionClient` (openrouter/client.py) to OpenRouter, or with `--server` the
`Sources` (infer/servers.py) over each server's client and OpenRouter's. Both answer
`attempt(body, stream)` and `in_flight`; the run cannot tell them apart.

Everything runs in this one process, on one event loop. One loop tops out at one core,
and a live stream costs client CPU per chunk: 2000 streams at ~40 chunks/s are ~80,000
chunks a second. The HTTP/1.1 client (openrouter/http11.py) hands each read's chunks to
the answer in one synchronous call, and with many requests in flight the loop reads in
paced turns (`pace_reads`), so one wake-up serves every connection that got data.
Measured (bench/README.md, "One process"): the whole of kp-infer's work at 2000 live
40-chunk/s streams takes about half of one core, less than it did spread over workers. (Until 2026-12 the HTTP work could also run
in worker processes; one process carries the user's load for less CPU, so they are gone.)
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

from ..openrouter.client import CompletionClient
from .config import RunConfig


def open_transport(config: RunConfig, servers: list | None = None):
    """The run's transport: OpenRouter's client, or (--server) the Sources over SERVERS
    (as discovered; None: as named) and OpenRouter's client when --openrouter."""
    if config.sending.servers:
        from .servers import Server, Sources, split_server
        return Sources.for_run(servers or [Server(split_server(u)[0], config.request.model)
                                           for u in config.sending.servers],
                               config.sending.server_concurrency, config.sending.idle_timeout,
                               openrouter_client(config) if config.sending.openrouter else None,
                               config.sending.concurrency, model=config.request.model)
    return openrouter_client(config)


def openrouter_client(config: RunConfig) -> CompletionClient:
    """The run's client to OpenRouter (the preflight's too: infer/preflight.py)."""
    return CompletionClient(config.sending.base_url, config.sending.api_key, idle_timeout=config.sending.idle_timeout,
                            proxy=config.sending.proxy)


# One turn of a busy loop: ~4 chunks of a 40 token/s stream per read. 25 and 50 ms turns
# saved less than half as much CPU, and the time added to each request (a turn at most per
# step, a few steps) stays a fraction of a second (bench/README.md, "Streaming CPU per
# chunk"). Below PACE_FROM requests in flight the loop is not paced.
PACE_SECONDS = 0.1
PACE_FROM = 128


def pace_reads(loop: asyncio.AbstractEventLoop, in_flight: Callable[[], int]) -> None:
    """With many streams open, let each turn of the event loop last PACE_SECONDS.

    Every chunk of a live stream arrives on its own, so a loop that waits for the next
    event wakes up (a context switch, an epoll call, a read) for nearly every chunk of
    every stream: most of a streaming client's CPU. Sleeping out the rest of each turn
    lets the chunks of the meantime wait in the sockets' buffers, so one wake-up serves
    every connection that got data and one read takes several chunks of each (handed
    over in one call, http11.py). The price is up to one turn of delay per step of a
    request (its admission, a connect, the answer's end, its record), small beside
    answers of many seconds; below PACE_FROM requests in flight (IN_FLIGHT()) the loop
    waits as usual (small runs). Signals are handled at the next turn.
    """
    last = time.monotonic()

    def turn() -> None:
        nonlocal last
        now = time.monotonic()
        if in_flight() < PACE_FROM:
            last = now
            loop.call_later(PACE_SECONDS, turn)
            return
        rest = last + PACE_SECONDS - now
        if rest > 0:
            time.sleep(rest)
            now += rest
        last = now
        loop.call_soon(turn)

    loop.call_soon(turn)


def freeze_startup_objects() -> None:
    """Move everything alive now (imported modules, mostly) out of the garbage collector's sight.

    With thousands of requests in flight, full collections are triggered again and again,
    and each one walked every object the imports made: ~10-15% of a streaming client's CPU
    (py-spy, 1000 streams). Those objects live for the whole run; freezing them leaves the
    collector only the objects the run itself creates.
    """
    gc.collect()
    gc.freeze()
