"""A kp-infer worker process: attempts in on stdin, outcomes out on stdout.

The other end is `WorkerPool` (infer/process_pool.py, which describes the wire format). It
starts `python -m kimipipe.infer.worker_process ARGS`, ARGS one JSON object (`WorkerArgs`:
only kimipipe writes and reads it, so it is a record, not a command line to parse), with the
API key in OPENROUTER_API_KEY and kp-infer's `--proxy` URL, if any, in KP_INFER_PROXY (both
may be secret: never on the command line). Without it the client reads the proxy variables
(HTTPS_PROXY, NO_PROXY, ...) it inherited. Runs until its stdin closes, then cancels the
attempts it still holds and exits: the parent closes the pipe only when nothing is in
flight, or by dying, and then nobody would record those answers (a cancelled stream stops
being generated; tests/test_claims_worker.py). Ignores SIGINT: the parent decides when
work stops. With many requests in flight its event loop reads in paced turns
(`pace_reads`).
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import struct
import sys
import time

import msgspec

from ..kinds import AttemptKind, RetryCause
from ..openrouter.attempt import Attempt
from ..openrouter.client import CompletionClient

_HEADER = struct.Struct(">I")


class WorkerArgs(msgspec.Struct, frozen=True):
    """What a worker is started with, on its command line (its secrets: in its environment)."""

    base_url: str
    idle_timeout: float

    def argv(self) -> list[str]:
        """The worker's command line."""
        return [sys.executable, "-m", "kimipipe.infer.worker_process",
                msgspec.json.encode(self).decode()]
_request_decoder = msgspec.msgpack.Decoder(tuple[int, bool, bytes])
CANCEL_PROVIDER = -1  # a request id that is a command: close the streams of the provider named
_result_encoder = msgspec.msgpack.Encoder()


async def serve(base_url: str, api_key: str, idle_timeout: float, proxy: str | None = None) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 26, loop=loop)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), sys.stdin.buffer)
    write_transport, write_protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, sys.stdout.buffer)
    writer = asyncio.StreamWriter(write_transport, write_protocol, None, loop)
    tasks: set[asyncio.Task] = set()

    async with CompletionClient(base_url, api_key, idle_timeout=idle_timeout, proxy=proxy) as client:
        pace_reads(loop, lambda: client.in_flight)

        async def run_one(request_id: int, stream: bool, body: bytes) -> None:
            try:
                attempt = await client.attempt(body, stream)
            except Exception as e:  # a bug must not take the whole worker down
                attempt = Attempt(AttemptKind.RETRY, cause=RetryCause.WORKER,
                                  message=f"{type(e).__name__}: {e}"[:300])
            payload = _result_encoder.encode((request_id, attempt))
            writer.write(_HEADER.pack(len(payload)) + payload)

        while True:
            try:
                header = await reader.readexactly(_HEADER.size)
                (size,) = _HEADER.unpack(header)
                request_id, stream, body = _request_decoder.decode(await reader.readexactly(size))
            except asyncio.IncompleteReadError:
                break
            if request_id == CANCEL_PROVIDER:
                client.cancel_streams_of(body.decode())
                continue
            task = asyncio.create_task(run_one(request_id, stream, body))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        # The parent closes our stdin only when nothing is in flight, or when it died:
        # then nobody would record these answers, so stop paying for them.
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


# One turn of a busy worker's loop: ~4 chunks of a 40 token/s stream per read. 25 and 50 ms
# turns saved less than half as much CPU, and the time added to each request (a turn at
# most per step, a few steps) stays a fraction of a second (bench/README.md, "Streaming
# CPU per chunk"). Below PACE_FROM requests in flight the loop is not paced.
PACE_SECONDS = 0.1
PACE_FROM = 128


def pace_reads(loop: asyncio.AbstractEventLoop, in_flight) -> None:
    """With many streams open, let each turn of the event loop last PACE_SECONDS.

    Every chunk of a live stream arrives on its own, so a loop that waits for the next
    event wakes up (a context switch, an epoll call, a read) for nearly every chunk of
    every stream: most of a streaming worker's CPU. Sleeping out the rest of each turn
    lets the chunks of the meantime wait in the sockets' buffers, so one wake-up serves
    every connection that got data and one read takes several chunks of each (handed
    over in one call, http11.py). The price is up to one turn of delay per step of a
    request (its dispatch, a connect, the answer's end), small beside answers of many
    seconds; below PACE_FROM requests in flight the loop waits as usual (small runs).
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
    and each one walked every object the imports made: ~10-15% of a streaming worker's CPU
    (py-spy, 1000 streams). Those objects live for the whole run; freezing them leaves the
    collector only the objects the run itself creates.
    """
    gc.collect()
    gc.freeze()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    freeze_startup_objects()
    args = msgspec.json.decode(sys.argv[1], type=WorkerArgs)
    api_key = os.environ.get("OPENROUTER_API_KEY", "")
    proxy = os.environ.get("KP_INFER_PROXY") or None
    try:
        import uvloop

        uvloop.run(serve(args.base_url, api_key, args.idle_timeout, proxy))
    except ImportError:
        asyncio.run(serve(args.base_url, api_key, args.idle_timeout, proxy))


if __name__ == "__main__":
    main()
