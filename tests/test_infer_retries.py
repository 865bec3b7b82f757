"""kp-infer's retries and statuses through the command line against the stand-in:
Retry-After, 404 (exit 2), the permanent statuses into --failures (retried by a later
run), and the adaptive concurrency on 429s."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import BIN, kp, read_jsonl, write_jsonl
from helpers import time_left, wait_for
from test_infer import infer, make_prompts


def request_times(path, proc, want: int) -> dict[int, int]:
    """The write time (mtime, ns) of each line of the stand-in's request log, observed as the
    lines arrive: the mtime read between two reads that count the same N lines is the
    N-th line's own write (one write per line), whatever the delay of this loop."""
    times: dict[int, int] = {}

    def count() -> int:
        return len(path.read_bytes().splitlines()) if path.exists() else 0

    deadline = time.monotonic() + 120
    while len(times) < want and time.monotonic() < deadline:
        before = count()
        if before:
            mtime = path.stat().st_mtime_ns
            if count() == before:
                times.setdefault(before, mtime)
        if proc.poll() is not None and count() >= want:
            break
        time.sleep(0.01)
    return times


class StatusProxy:
    """A loopback front for the stand-in that answers a prompt containing `status=NNN`
    with HTTP NNN and an OpenRouter error body, and passes everything else through: the
    stand-in has no fault for 403, 413 or 422."""

    def __init__(self, upstream: str):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _pass(self, body: bytes | None):
                req = urllib.request.Request(upstream + self.path.removeprefix("/api/v1"), data=body,
                                             method=self.command,
                                             headers={k: v for k, v in self.headers.items()
                                                      if k.lower() in ("authorization", "content-type")})
                try:
                    with urllib.request.urlopen(req, timeout=60) as resp:
                        status, data = resp.status, resp.read()
                except urllib.error.HTTPError as e:
                    status, data = e.code, e.read()
                self._send(status, data)

            def _send(self, status: int, data: bytes):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._pass(None)

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                text = json.loads(body)["messages"][-1]["content"]
                m = re.search(r"status=(\d{3})", text)
                if m is None:
                    return self._pass(body)
                status = int(m.group(1))
                proxy.refused.append(status)
                self._send(status, json.dumps({"error": {
                    "code": status, "message": f"refused with {status} (test)",
                    "metadata": {"provider_name": "Together"}}}).encode())

        self.refused: list[int] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/api/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def shrink_steps(ceiling: int) -> list[int]:
    """The limits the rule gives after 1, 2, ... bursts of 429s with no growth between."""
    limit, seen = float(ceiling), []
    while not seen or seen[-1] > 1:
        limit = max(1.0, limit * 0.75)
        seen.append(int(limit))
    return seen


def test_retry_after_is_honoured(standin, tmp_path):
    """A 429 with `Retry-After: 2` is not retried sooner, although --backoff-base alone
    would retry within ~0.02 s: the gap between the stand-in's receipt of one attempt and
    the next is measured from its request log (a lower bound, so load cannot fail it)."""
    server = standin(faults={"429": 1.0}, retry_after=2, request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 1)
    failures = tmp_path / "f.jsonl"
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    proc = subprocess.Popen([str(BIN / "kp-infer"), str(prompts), "-o", str(tmp_path / "r.jsonl"),
                             "--base-url", server.base_url, "--backoff-base", "0.01",
                             "--max-attempts", "4", "--failures", str(failures), "--quiet"],
                            env=env)
    try:
        times = request_times(server.request_log_path, proc, 4)
        assert proc.wait(timeout=120) == 4
    finally:
        proc.kill()
        proc.wait()
    assert len(server.requests()) == 4
    gaps = [(times[k + 1] - times[k]) / 1e9 for k in range(1, 4) if k in times and k + 1 in times]
    assert gaps, f"no two consecutive attempts observed: {times}"
    assert all(gap >= 2.0 - 0.02 for gap in gaps), gaps  # (mtime granularity: a few ms)
    [fail] = read_jsonl(failures)
    assert fail["kind"] == "retries_exhausted" and fail["status"] == 429 and fail["attempts"] == 4


def test_404_no_route_during_the_run_stops_with_exit_2(standin, tmp_path):
    """The flags pass the endpoints-table check, yet OpenRouter answers 404 (no provider
    left: here `--extra-body` narrows routing to a provider that does not exist): the run
    stops at once with exit 2 and a message, nothing is written, nothing is retried."""
    server = standin(request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 50)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--failures", failures, "--concurrency", "4",
              "--extra-body", '{"provider": {"only": ["nobody"]}}')
    assert r.code == 2, r.stderr
    assert "OpenRouter can route no request (a 404" in r.stderr
    assert "constraint_filtered (HTTP 404, not retryable)" in r.stderr
    # nothing answered: the empty output a fatal stop leaves is removed (issue 49)
    assert not out.exists() and (not failures.exists() or read_jsonl(failures) == [])
    assert server.stats()["statuses"] == {"404": len(server.requests())}
    assert len(server.requests()) <= 4  # the requests in flight at most: no retry, no more admitted
    assert server.stats()["completions_started"] == 0


def test_400_403_413_422_go_to_failures_and_a_later_run_retries_them(standin, tmp_path):
    server = standin(ledger=True)
    proxy = StatusProxy(server.base_url)
    statuses = (400, 403, 413, 422)
    rows = [{"id": f"s{s}", "dataset": "B3", "messages": [{"role": "user", "content": f"please status={s}"}]}
            for s in statuses]
    rows += [{"id": f"ok{i}", "dataset": "B3", "messages": [{"role": "user", "content": f"fine {i}"}]}
             for i in range(6)]
    prompts = write_jsonl(tmp_path / "p.jsonl", rows)
    out, failures, summary = tmp_path / "r.jsonl", tmp_path / "f.jsonl", tmp_path / "s.json"
    try:
        r = kp("infer", prompts, "-o", out, "--failures", failures, "--summary-json", summary,
               "--base-url", proxy.base_url, "--no-stream", "--backoff-base", "0.01",
               env={"OPENROUTER_API_KEY": server.api_key})
    finally:
        proxy.close()
    assert r.code == 4, r.stderr
    assert sorted(proxy.refused) == list(statuses)  # each sent once: not retried
    assert sorted(x["id"] for x in read_jsonl(out)) == [f"ok{i}" for i in range(6)]
    fails = {f["id"]: f for f in read_jsonl(failures)}
    assert set(fails) == {f"s{s}" for s in statuses}
    for s in statuses:
        f = fails[f"s{s}"]
        assert (f["kind"], f["status"], f["code"], f["attempts"]) == ("permanent", s, str(s), 1)
        assert f["message"] == f"refused with {s} (test)"
        assert server.api_key not in json.dumps(f)
    assert json.loads(summary.read_text())["failed"] == {f"http_{s}": 1 for s in statuses}
    r = infer(server, prompts, "-o", out, "--failures", failures)  # the stand-in answers them now
    assert r.code == 0, r.stderr
    assert sorted(x["id"] for x in read_jsonl(out)) == sorted(x["id"] for x in rows)


def test_adaptive_concurrency_shrinks_by_a_quarter_per_burst(standin, tmp_path):
    """Every first attempt is refused with a 429 and none is retried (--max-attempts 1), so
    nothing can grow the limit back: it ends where the bursts left it, a quarter off per
    burst (one burst per 2 s, however many 429s it holds), never any other value."""
    server = standin(faults={"429": 1.0}, retry_after=0.01)
    prompts = make_prompts(tmp_path / "p.jsonl", 40)
    summary = tmp_path / "s.json"
    r = infer(server, prompts, "-o", tmp_path / "r.jsonl", "--concurrency", "40",
              "--max-attempts", "1", "--summary-json", summary)
    assert r.code == 4, r.stderr
    s = json.loads(summary.read_text())
    assert s["failed"] == {"retries_exhausted": 40} and server.stats()["faults"]["429"] == 40
    assert s["concurrency_limit_end"] in shrink_steps(40)
    assert shrink_steps(40)[:3] == [30, 22, 16]


def test_adaptive_concurrency_uses_the_ceiling_and_grows_back_after_429s(standin, tmp_path):
    """--concurrency 40: the stand-in sees exactly 40 in flight, never more; a burst of 429s
    (each retried) shrinks the limit (to at most 30: a quarter off, test above), and once
    the 429s stop it grows again: more than 30 are in flight while no 429 comes. Every
    request after the burst waits at the stand-in's gate (none ends), so what it holds is
    what kp-infer admitted, and it can only pass 30 by a growth step (5% of 40 after 2 s
    without a 429, on kp-infer's real clock). The growth all the way back to the ceiling
    is the limiter's arithmetic: tests/test_limiter.py, on a clock the test moves."""
    server = standin(retry_after=0.05)
    server.configure(hold_after=0)  # every completion waits at the gate
    prompts = make_prompts(tmp_path / "p.jsonl", 40)
    summary = tmp_path / "s.json"
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    proc = subprocess.Popen([str(BIN / "kp-infer"), str(prompts), "-o", str(tmp_path / "r.jsonl"),
                             "--base-url", server.base_url, "--concurrency", "40", "--quiet",
                             "--max-attempts", "100", "--backoff-base", "0.01",
                             "--summary-json", str(summary)], env=env)
    try:
        wait_for(lambda: server.stats()["held"] == 40, "40 in flight")
        assert server.stats()["max_in_flight"] == 40
        server.configure(faults={"429": 1.0}, hold_after=None)  # the 40 are refused, retried
        wait_for(lambda: server.stats()["faults"].get("429", 0) >= 20, "a burst of 429s")
        # no more 429s, and every request from now on is held: none ends
        server.configure(faults={}, hold_after=server.stats()["completions_started"])
        wait_for(lambda: server.stats()["held"] > 30, "the limit to grow past 30")
        stats = server.stats()
        assert stats["in_flight"] == stats["held"] <= 40
        server.configure(hold_after=None)
        assert proc.wait(timeout=time_left()) == 0
    finally:
        proc.kill()
        proc.wait()
    stats = server.stats()
    assert stats["max_in_flight"] == 40
    s = json.loads(summary.read_text())
    assert s["done"] == 40 and s["retries"]["429"] == stats["faults"]["429"]
    assert 30 < s["concurrency_limit_end"] <= 40

