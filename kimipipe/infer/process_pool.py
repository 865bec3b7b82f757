"""Where kp-infer's HTTP work runs: in this process, or spread over worker processes.

`open_transport(config, todo)` gives the run its transport: a `CompletionClient`
(openrouter/client.py) in this process for `--workers 0` (the default while at most 256
requests can be in flight), else a `WorkerPool` of N worker processes
(infer/worker_process.py; default one per core, never more than the prompts to do). Both have the same interface (`async with`, `attempt(body, stream)`).

One event loop tops out at one core, and a live stream costs client CPU per chunk
(docs/performance.md): 2000 streams at ~40 chunks/s need more than one core. So the
parent keeps everything that must be in one place (admission, budget reservations,
routing checks, retries, the output file) and hands each *attempt* to a worker process
that owns an HTTP client (openrouter/client.py), its connections and the SSE parsing.
A worker sends back one small message per attempt, never per chunk, so the parent's cost
per request does not grow with the length of the answer. Measured (bench/README.md):
~15-19 µs of CPU per streamed event, all processes, so one worker on one core carries
~1300-1700 live 40-event/s streams.

Wire format between parent and worker, over the worker's stdin/stdout pipes: frames of a
4-byte big-endian length and a msgpack body.
    parent -> worker: [request_id, stream, body_bytes]
    worker -> parent: [request_id, Attempt]
The API key, and the `--proxy` URL (it may hold a password), reach workers through
their environment (OPENROUTER_API_KEY, KP_INFER_PROXY), never their command line.

The run (infer/run.py) cannot tell the two transports apart, so every rule of kp-infer
holds with any number of workers.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import struct
import sys

import msgspec

from ..kinds import AttemptKind, RetryCause
from ..openrouter.attempt import Attempt
from ..openrouter.client import CompletionClient
from .config import RunConfig

_HEADER = struct.Struct(">I")
_request_encoder = msgspec.msgpack.Encoder()
_result_decoder = msgspec.msgpack.Decoder(tuple[int, Attempt])


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.pending: dict[int, asyncio.Future] = {}
        self.reader_task: asyncio.Task | None = None


class WorkerPool:
    """N worker processes, each with its own event loop and HTTP client."""

    def __init__(self, workers: int, base_url: str, api_key: str, *, idle_timeout: float,
                 proxy: str | None = None):
        self.n = workers
        self.base_url = base_url
        self.api_key = api_key
        self.idle_timeout = idle_timeout
        self.proxy = proxy
        self._workers: list[_Worker] = []
        self._ids = itertools.count()
        self._closing = False

    async def __aenter__(self) -> WorkerPool:
        for _ in range(self.n):
            self._workers.append(await self._spawn())
        return self

    async def _spawn(self) -> _Worker:
        env = {**os.environ, "OPENROUTER_API_KEY": self.api_key}
        env.pop("KP_INFER_PROXY", None)
        if self.proxy:
            env["KP_INFER_PROXY"] = self.proxy
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kimipipe.infer.worker_process", "--base-url", self.base_url,
            "--idle-timeout", repr(self.idle_timeout),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
            limit=1 << 26,
        )
        worker = _Worker(proc)
        worker.reader_task = asyncio.create_task(self._read_results(worker))
        return worker

    async def _read_results(self, worker: _Worker) -> None:
        reader = worker.proc.stdout
        try:
            while True:
                header = await reader.readexactly(_HEADER.size)
                (size,) = _HEADER.unpack(header)
                request_id, attempt = _result_decoder.decode(await reader.readexactly(size))
                future = worker.pending.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_result(attempt)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            # A worker that died takes its attempts with it: they are retried elsewhere.
            for future in worker.pending.values():
                if not future.done():
                    future.set_result(Attempt(AttemptKind.RETRY, cause=RetryCause.WORKER,
                                              message="worker process ended"))
            worker.pending.clear()

    async def attempt(self, body: bytes, stream: bool) -> Attempt:
        worker = min(self._workers, key=lambda w: len(w.pending))
        if worker.proc.returncode is not None and not self._closing:
            index = self._workers.index(worker)
            worker = self._workers[index] = await self._spawn()
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        worker.pending[request_id] = future
        payload = _request_encoder.encode((request_id, stream, body))
        try:
            worker.proc.stdin.write(_HEADER.pack(len(payload)) + payload)
        except (ConnectionError, RuntimeError):
            worker.pending.pop(request_id, None)
            return Attempt(AttemptKind.RETRY, cause=RetryCause.WORKER,
                           message="worker process ended")
        try:
            return await future
        except asyncio.CancelledError:
            worker.pending.pop(request_id, None)
            raise

    async def __aexit__(self, *exc) -> None:
        self._closing = True
        for worker in self._workers:
            if worker.proc.stdin:
                worker.proc.stdin.close()
        # All at once, 5 s at most in all: a worker cancels what it still holds on EOF.
        await asyncio.gather(*(self._close(worker) for worker in self._workers))

    @staticmethod
    async def _close(worker: _Worker) -> None:
        try:
            await asyncio.wait_for(worker.proc.wait(), timeout=5)
        except TimeoutError:
            worker.proc.kill()
            await worker.proc.wait()
        if worker.reader_task:
            await worker.reader_task


IN_PROCESS_UP_TO = 256


def default_workers(concurrency: int, todo: int) -> int:
    """Worker processes when --workers is not given (see `open_transport`)."""
    return 0 if min(concurrency, todo) <= IN_PROCESS_UP_TO else (os.cpu_count() or 1)


def open_transport(config: RunConfig, todo: int) -> WorkerPool | CompletionClient:
    """The HTTP transport for a run with TODO prompts to send (enter it with `async with`).

    --workers by default: in this process when at most IN_PROCESS_UP_TO requests can be in
    flight at once (the smaller of --concurrency and TODO), else one worker per core. One
    process carries well over a thousand live streams (docs/performance.md), so a small run
    gains nothing from workers and would pay their start (~0.3 s of CPU each) and an IPC
    hop per request."""
    if config.servers:  # self-hosted servers, with OpenRouter beside them or not
        from .servers import Sources
        return Sources.for_run(config.servers, config.server_concurrency, config.idle_timeout,
                               openrouter_transport(config, todo) if config.openrouter else None,
                               config.concurrency)
    return openrouter_transport(config, todo)


def openrouter_transport(config: RunConfig, todo: int) -> WorkerPool | CompletionClient:
    """OpenRouter's transport: in this process, or a WorkerPool (see `open_transport`)."""
    workers = default_workers(config.concurrency, todo) if config.workers is None else config.workers
    workers = min(workers, max(1, todo)) if workers else 0
    if workers:
        return WorkerPool(workers, config.base_url, config.api_key, idle_timeout=config.idle_timeout,
                          proxy=config.proxy)
    return CompletionClient(config.base_url, config.api_key, idle_timeout=config.idle_timeout,
                            proxy=config.proxy)
