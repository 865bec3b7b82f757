"""Where kp-infer's HTTP work runs: in this process, or spread over worker processes.

`open_transport(config, todo)` gives the run its transport: a `CompletionClient`
(openrouter/client.py) in this process for `--workers 0` (the default while at most 256
requests can be in flight), else a `WorkerPool` of N worker processes
(infer/worker_process.py; default one per core, never more than the prompts to do). Both have the same interface (`async with`, `attempt(body, stream)`).

One event loop tops out at one core, and a live stream costs client CPU per chunk
(docs/performance.md): 2000 streams at ~40 chunks/s are ~80,000 chunks a second. So the
parent keeps everything that must be in one place (admission, budget reservations,
routing checks, retries, the output file) and hands each *attempt* to a worker process
that owns an HTTP client (openrouter/client.py), its connections and the SSE parsing.
A worker sends back one small message per attempt, never per chunk (the answer's text
crosses once, joined), so the parent's cost per request does not grow with the length of
the answer; a busy worker reads its sockets in paced turns (worker_process.pace_reads).
Measured (bench/README.md, "Streaming CPU per chunk"): ~4-5 µs of CPU per streamed chunk for
streaming, ~8-9 µs with all per-answer work, all processes: 2000 live 40-chunk/s streams
take ~0.4 of a core for streaming, ~0.6 in all.

Wire format between parent and worker, over the worker's stdin/stdout pipes: frames of a
4-byte big-endian length and a msgpack body.
    parent -> worker: [request_id, stream, body_bytes]
                      [CANCEL_PROVIDER, false, provider_name]: close that provider's
                      streams (`cancel_streams_of`); no answer of its own
    worker -> parent: [request_id, Attempt]
A worker's streams are its own (their first chunk, which names the provider, is read
there), so a quarantine is told to every worker and each closes its own; the closed
streams come back as their requests' Attempts (`AttemptKind.CANCELLED`), as any other.
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

import msgspec

from ..kinds import AttemptKind, RetryCause
from ..openrouter.attempt import Attempt
from ..openrouter.client import CompletionClient
from .config import RunConfig
from .worker_process import CANCEL_PROVIDER, WorkerArgs

_HEADER = struct.Struct(">I")
_request_encoder = msgspec.msgpack.Encoder()
_result_decoder = msgspec.msgpack.Decoder(tuple[int, Attempt])


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.pending: dict[int, asyncio.Future] = {}
        self.reader_task: asyncio.Task | None = None
        # False from the moment its stdout closes (it exited, or was killed): from then on
        # nothing is sent to it, and what it held has been handed back as retries.
        self.alive = True


class WorkerPool:
    """N worker processes, each with its own event loop and HTTP client.

    A worker that dies (an OOM kill, a crash in a C extension) is seen at once: its stdout
    closes. Its attempts come back as retries (cause "worker") and a new worker is started
    in its place; until it is up, attempts go to the live ones (or wait for it, when none
    is left). Nothing is ever written to a dead worker: that was a run that hung for good
    on requests "retried" into a pipe nobody read."""

    def __init__(self, workers: int, base_url: str, api_key: str, *, idle_timeout: float,
                 proxy: str | None = None):
        self.n = workers
        self.base_url = base_url
        self.api_key = api_key
        self.idle_timeout = idle_timeout
        self.proxy = proxy
        self._workers: list[_Worker] = []
        self._dead: list[_Worker] = []  # reaped at close
        self._replacing: set[asyncio.Task] = set()
        self._ids = itertools.count()
        self._closing = False
        self._stopped: list[str] = []  # providers whose streams are cancelled (a new worker too)

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
            *WorkerArgs(self.base_url, self.idle_timeout).argv(),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
            limit=1 << 26,
        )
        worker = _Worker(proc)
        worker.reader_task = asyncio.create_task(self._read_results(worker))
        for provider in self._stopped:  # (a worker started in a dead one's place)
            self._tell_cancel(worker, provider)
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
            self._worker_ended(worker)

    def _worker_ended(self, worker: _Worker) -> None:
        """WORKER's stdout closed: it died (or is closing). Its attempts are retried
        elsewhere, and unless the pool is closing a new worker takes its place."""
        worker.alive = False
        for future in worker.pending.values():
            if not future.done():
                future.set_result(Attempt(AttemptKind.RETRY, cause=RetryCause.WORKER,
                                          message="worker process ended"))
        worker.pending.clear()
        if self._closing or worker not in self._workers:
            return
        self._workers.remove(worker)
        self._dead.append(worker)
        if worker.proc.returncode is None:  # its stdout is gone: of no use even if it runs
            try:
                worker.proc.kill()
            except ProcessLookupError:
                pass
        task = asyncio.create_task(self._replace())
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replace(self) -> None:
        try:
            worker = await self._spawn()
        except OSError:  # no process to be had (out of memory, say): the live ones go on,
            return       # and with none left attempts come back as retries (_live_worker)
        if self._closing:
            worker.proc.stdin.close()
            self._dead.append(worker)
        else:
            self._workers.append(worker)

    async def _live_worker(self) -> _Worker | None:
        """The live worker holding the fewest attempts; with none alive, the next one
        started in a dead one's place (None when the pool is closing or cannot start one)."""
        while True:
            live = [w for w in self._workers if w.alive]
            if live:
                return min(live, key=lambda w: len(w.pending))
            if self._closing or not self._replacing:
                return None
            await asyncio.wait(set(self._replacing), return_when=asyncio.FIRST_COMPLETED)

    async def attempt(self, body: bytes, stream: bool) -> Attempt:
        worker = await self._live_worker()
        if worker is None:
            return Attempt(AttemptKind.RETRY, cause=RetryCause.WORKER,
                           message="no worker process could be started")
        # No await from the liveness check to `pending`: a worker found alive here hands
        # this attempt back as a retry if it dies before answering.
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

    def cancel_streams_of(self, provider: str) -> None:
        """Every live worker closes PROVIDER's streams (CompletionClient.cancel_streams_of)."""
        self._stopped.append(provider)
        for worker in self._workers:
            if worker.alive:
                self._tell_cancel(worker, provider)

    @staticmethod
    def _tell_cancel(worker: _Worker, provider: str) -> None:
        payload = _request_encoder.encode((CANCEL_PROVIDER, False, provider.encode()))
        try:
            worker.proc.stdin.write(_HEADER.pack(len(payload)) + payload)
        except (ConnectionError, RuntimeError):
            pass  # (a dead worker's attempts come back as retries: _worker_ended)

    async def __aexit__(self, *exc) -> None:
        self._closing = True
        if self._replacing:  # a worker being started now is closed with the others
            await asyncio.wait(set(self._replacing))
        for worker in self._workers:
            if worker.proc.stdin:
                worker.proc.stdin.close()
        # All at once, 5 s at most in all: a worker cancels what it still holds on EOF.
        await asyncio.gather(*(self._close(worker) for worker in [*self._workers, *self._dead]))

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


def open_transport(config: RunConfig, todo: int, servers: list | None = None
                   ) -> WorkerPool | CompletionClient:
    """The HTTP transport for a run with TODO prompts to send (enter it with `async with`).

    --workers by default: in this process when at most IN_PROCESS_UP_TO requests can be in
    flight at once (the smaller of --concurrency and TODO), else one worker per core. One
    process carries well over a thousand live streams (docs/performance.md), so a small run
    gains nothing from workers and would pay their start (~0.3 s of CPU each) and an IPC
    hop per request."""
    if config.sending.servers:  # self-hosted servers (SERVERS: as discovered), OpenRouter beside or not
        from .servers import Server, Sources, split_server
        return Sources.for_run(servers or [Server(split_server(u)[0], config.request.model)
                                           for u in config.sending.servers],
                               config.sending.server_concurrency, config.sending.idle_timeout,
                               openrouter_transport(config, todo) if config.sending.openrouter else None,
                               config.sending.concurrency, model=config.request.model)
    return openrouter_transport(config, todo)


def openrouter_transport(config: RunConfig, todo: int) -> WorkerPool | CompletionClient:
    """OpenRouter's transport: in this process, or a WorkerPool (see `open_transport`)."""
    workers = default_workers(config.sending.concurrency, todo) if config.sending.workers is None else config.sending.workers
    workers = min(workers, max(1, todo)) if workers else 0
    if workers:
        return WorkerPool(workers, config.sending.base_url, config.sending.api_key, idle_timeout=config.sending.idle_timeout,
                          proxy=config.sending.proxy)
    return CompletionClient(config.sending.base_url, config.sending.api_key, idle_timeout=config.sending.idle_timeout,
                            proxy=config.sending.proxy)
