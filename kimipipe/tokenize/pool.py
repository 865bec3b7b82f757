"""kp-tokenize's worker processes: batches out, outcomes back in input order.

Batch k goes to worker k mod N and its outcomes are read back from that worker in the same
order, so the input order is kept with no reordering buffer; at most `depth` batches per
worker are in flight (memory stays bounded however long the input).

Why not `concurrent.futures.ProcessPoolExecutor`: measured with it, on Kimi K2.5's
real vocabulary its workers waited ~10% of their time between batches (a median 4 ms
after each 39 ms batch of 64 records, 2 cores). Each batch (~160 KB) and each batch's
outcomes (~200 KB) crossed a 64 KB pipe, so a worker could neither hand over its result
nor take its next batch without several wake-ups of the parent's manager and feeder
threads, on cores that the workers themselves keep busy. Here each worker has its own two
pipes, enlarged to 1 MB (`F_SETPIPE_SZ`, Linux; elsewhere they keep their size and only
the hand-offs cost more): a worker writes its outcomes in one go and finds its next batch
already waiting. The batches are written by one sender thread per worker, so the parent
never blocks on a full pipe (a parent blocked writing to a worker that is blocked writing
its outcomes back would be a deadlock).

Workers are forked with the tokenizer loaded where the platform allows (else spawned,
loading it from `Settings`). They ignore SIGINT and SIGTERM: Ctrl-C is the parent's to
handle, and it stops them (`close(abort=True)`); a worker whose parent is gone meets the
end of its input and exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import itertools
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import traceback
from collections import deque
from typing import Any

from ..errors import KPError

PIPE_BYTES = 1 << 20  # Linux's default pipe-max-size: above it an unprivileged F_SETPIPE_SZ fails
_STOP = b""  # an empty message: no more batches


class WorkerDied(KPError):
    pass


def _enlarge(fd: int) -> None:
    """Give the pipe FD room for a whole batch or outcome list (best effort)."""
    setpipe = getattr(fcntl, "F_SETPIPE_SZ", 1031 if os.uname().sysname == "Linux" else None)
    if setpipe is None:
        return
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, setpipe, PIPE_BYTES)


def _serve(inbox, outbox, close_first: list, setup) -> None:
    """A worker's loop: a pickled batch in, ("ok", outcomes) or ("error", exception, text) out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for conn in close_first:  # the parent's ends of the pipes, inherited by the fork
        conn.close()
    process = setup()
    while True:
        try:
            message = inbox.recv_bytes()
        except EOFError:  # the parent is gone
            return
        if message == _STOP:
            return
        try:
            reply = ("ok", process(pickle.loads(message)))
        except Exception as e:  # a bug: the parent raises it, with this traceback
            reply = ("error", e, traceback.format_exc())
        try:
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            data = pickle.dumps(("error", None, traceback.format_exc()))
        try:
            outbox.send_bytes(data)
        except OSError:  # the parent stopped reading (it is stopping us)
            return


class _Sender(threading.Thread):
    """Writes one worker's batches to its pipe, so that the parent never blocks on it."""

    def __init__(self, conn):
        super().__init__(daemon=True, name="kp-tokenize-sender")
        self.conn = conn
        self.queue: queue.SimpleQueue = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            data = self.queue.get()
            try:
                self.conn.send_bytes(data)
            except OSError:  # the worker is gone: the parent finds out reading its outcomes
                return
            if data == _STOP:
                return


class WorkerPool:
    """N worker processes, each running `process(batch)`; `map` yields results in order.

    FORK_SETUP builds a worker's `process` in a forked child (which inherits whatever the
    parent has loaded); SPAWN_SETUP, a picklable callable, does it in a spawned one.
    """

    def __init__(self, workers: int, fork_setup, spawn_setup, depth: int = 3):
        self.depth = depth
        self.procs: list = []
        self.inboxes: list = []   # the parent's ends
        self.outboxes: list = []
        fork = "fork" in multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if fork else "spawn")
        if fork:
            # What the parent built (Kimi's tokenizer: two Python dicts over 163,840 IDs) is
            # left out of the garbage collector's scans, so no forked worker walks, and so
            # copies, it.
            gc.freeze()
        try:
            for _ in range(workers):
                inbox_r, inbox_w = ctx.Pipe(duplex=False)
                outbox_r, outbox_w = ctx.Pipe(duplex=False)
                _enlarge(inbox_w.fileno())
                _enlarge(outbox_w.fileno())
                inherited = [*self.inboxes, *self.outboxes, inbox_w, outbox_r] if fork else []
                proc = ctx.Process(target=_serve, daemon=True, name="kp-tokenize-worker",
                                   args=(inbox_r, outbox_w, inherited,
                                         fork_setup if fork else spawn_setup))
                proc.start()
                inbox_r.close()  # the worker's ends: held by it alone, so its death is an EOF
                outbox_w.close()
                self.procs.append(proc)
                self.inboxes.append(inbox_w)
                self.outboxes.append(outbox_r)
        except BaseException:
            self.close(abort=True)
            raise
        self.senders = [_Sender(conn) for conn in self.inboxes]
        for s in self.senders:
            s.start()

    def map(self, batches):
        """Each batch's result, in order. An exception from BATCHES (a bad input line) is
        raised once the batches before it are through."""
        n = len(self.procs)
        in_flight: deque[int] = deque()  # the worker of each batch sent, oldest first
        bad_input = None
        batches = iter(batches)
        for k in itertools.count():
            try:  # (only the input's errors: a worker's are raised at once)
                batch = next(batches)
            except StopIteration:
                break
            except KPError as e:
                bad_input = e
                break
            worker = k % n
            if len(in_flight) >= n * self.depth:  # the oldest is on WORKER: free its slot
                yield self._result(in_flight.popleft())
            self.senders[worker].queue.put(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))
            in_flight.append(worker)
        while in_flight:
            yield self._result(in_flight.popleft())
        if bad_input is not None:
            raise bad_input

    def _result(self, worker: int) -> Any:
        try:
            reply = pickle.loads(self.outboxes[worker].recv_bytes())
        except (EOFError, OSError):
            proc = self.procs[worker]
            proc.join(timeout=5)
            raise WorkerDied(f"a worker process ended unexpectedly (exit code {proc.exitcode}); "
                             "rerun the same command to resume") from None
        if reply[0] == "ok":
            return reply[1]
        _, error, text = reply
        if error is None:
            raise RuntimeError(f"a worker failed:\n{text}")
        raise error from RuntimeError(f"in a worker process:\n{text}")

    def close(self, abort: bool = False) -> None:
        """Stop the workers: once they have read what was sent, or now (ABORT)."""
        senders = getattr(self, "senders", [])
        for s in senders:
            s.queue.put(_STOP)  # (after a kill, a sender's write fails and it returns)
        for proc in self.procs:
            if abort:
                proc.kill()  # nothing of theirs is kept: the parent writes every output
            proc.join()
        for s in senders:
            s.join()
        for conn in (*self.inboxes, *self.outboxes):
            conn.close()
