"""kp-infer when one of its worker processes dies mid-run (docs/robustness.md).

An OOM kill or a crash in a C extension takes a worker process down with the requests it
holds. The run must see it at once (the worker's pipe closes), send those requests again
through the live workers or a worker started in its place, and end as it would have.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
from conftest import BIN, read_jsonl
from helpers import stderr_after, wait_for, worker_pids
from test_infer import assert_correct, ids_of, make_prompts


@pytest.mark.parametrize("workers", [1, 2], ids=["1worker", "2workers"])
def test_a_killed_worker_costs_its_requests_one_retry_never_the_run(standin, tmp_path, workers):
    """The stand-in answers 20 and holds the rest at its gate, so the kill lands with a
    full window of requests in flight through every worker, on any machine. A worker is
    started in the dead one's place before anything is let go (with two, the survivor
    alone could finish this run, and a long run would lose its workers one by one), and
    the run ends as it would have: every prompt answered, the dead one's requests sent
    again once each."""
    server = standin(ledger=True)
    server.configure(hold_after=20)
    prompts = make_prompts(tmp_path / "p.jsonl", 120)
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    proc = subprocess.Popen([str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--base-url",
                             server.base_url, "--concurrency", "30", "--workers", str(workers),
                             "--backoff-base", "0.01", "--summary-json", str(summary), "-q"],
                            env=env, stderr=subprocess.PIPE)

    def kill_a_worker_under_load():
        # under load: 20 answered, a full window held at the gate
        wait_for(lambda: server.stats()["held"] >= 25 or proc.poll() is not None,
                 "a window of requests held at the gate", 60)
        assert proc.poll() is None, "the run ended before the gate"
        started = worker_pids(proc.pid)
        assert len(started) == workers
        os.kill(started[0], signal.SIGKILL)
        wait_for(lambda: (len(now := worker_pids(proc.pid)) == workers
                          and started[0] not in now) or proc.poll() is not None,
                 f"a worker started in the killed one's place ({workers} again)", 30)
        assert proc.poll() is None
        server.configure(hold_after=None)

    # A hang shows as this timeout: the run is answered in a few seconds otherwise.
    stderr = stderr_after(proc, kill_a_worker_under_load, timeout=90)
    assert proc.returncode == 0, stderr.decode()
    assert sorted(ids_of(out)) == [f"p{i:05d}" for i in range(120)]
    assert_correct(read_jsonl(out), prompts)
    s = json.loads(summary.read_text())
    assert s["done"] == 120 and not s["failed"]
    # the killed worker's requests were sent again, once each
    assert 1 <= s["retries"].get("worker", 0) <= 30
