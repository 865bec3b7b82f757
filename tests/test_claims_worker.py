"""kp-infer's worker process (infer/worker_process.py) when its stdin closes: the parent
closes it only with nothing in flight, or by dying, so the attempts the worker still holds
are cancelled (nobody would record their answers), not finished.

The worker is started as WorkerPool starts it (`WorkerArgs.argv()`, the key in its
environment) and spoken to over its pipe in the pool's wire format (a 4-byte length, then
msgpack); the stand-in's `hold_after=0` gate holds the request, so it is provably in flight.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess

import msgspec
from helpers import MODEL, wait_for

from kimipipe.infer.worker_process import WorkerArgs


def test_a_worker_whose_stdin_closes_cancels_what_it_holds(standin):
    server = standin()
    server.configure(hold_after=0)
    args = WorkerArgs(base_url=server.base_url, idle_timeout=120)
    proc = subprocess.Popen(args.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            env={**os.environ, "OPENROUTER_API_KEY": server.api_key})
    try:
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi?"}],
                           "stream": True, "max_tokens": 50}).encode()
        payload = msgspec.msgpack.encode((1, True, body))
        proc.stdin.write(struct.pack(">I", len(payload)) + payload)
        proc.stdin.flush()
        wait_for(lambda: server.stats()["held"] == 1, "the request held by the stand-in", 60)
        proc.stdin.close()  # (what the parent's death does to the pipe)
        # the stand-in still holds the answer: only a cancelled attempt lets the worker end
        code = proc.wait(timeout=30)
        assert code == 0, proc.stderr.read().decode()
        assert proc.stdout.read() == b""  # no outcome sent for the cancelled attempt
        assert server.stats()["charged"] == 0, server.stats()  # never answered, never paid
    finally:
        server.configure(hold_after=None)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
