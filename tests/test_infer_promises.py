"""kp-infer's promises in README.md, each held through the command line (a subprocess
against the stand-in on loopback): the money cap under misrouting, --plan's figures,
Retry-After, 404 and the permanent statuses, routing and request flags as they reach the
wire, adaptive concurrency, partitions shared with kp-tokenize, and KP_DEBUG."""

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

import httpx
import pytest
from conftest import BIN, TOKENIZER_KINDS, kp, read_jsonl, write_jsonl
from helpers import MODEL, wait_for
from test_infer import NATIVE, infer, make_prompts


def endpoints_table(server) -> list[dict]:
    """The stand-in's endpoints table, prices as it bills them (USD per token)."""
    doc = httpx.get(f"{server.base_url}/models/{MODEL}/endpoints").json()
    return doc["data"]["endpoints"]


# --- money ------------------------------------------------------------------------------

def test_max_cost_holds_when_an_excluded_pricier_endpoint_serves_anyway(standin, tmp_path):
    """Issue 17's money bug: the only endpoint allowed is the cheapest (DeepInfra Turbo),
    and every answer is served anyway by one the flags excluded, all pricier. Such answers
    are billed at their endpoint's price, so each request's worst case must be reserved at
    the highest price of the whole table: the stand-in's bill stays under the cap (before
    the fix it billed 2.0955 under --max-cost 2)."""
    server = standin(ledger=True, price_scale=1000.0, faults={"misroute": 1.0}, seed=2)
    prompts = make_prompts(tmp_path / "p.jsonl", 60)
    out, failures, summary = tmp_path / "r.jsonl", tmp_path / "f.jsonl", tmp_path / "s.json"
    flags = ("--any-quantization", "--only-provider", "deepinfra/turbo", "--concurrency", "8",
             "--max-tokens", "60", "--max-cost", "2")
    r = infer(server, prompts, "-o", out, "--failures", failures, "--summary-json", summary, *flags)
    assert r.code == 3, r.stderr
    assert "--max-cost reached" in r.stderr
    billed = server.ledger()
    assert billed and "deepinfra/turbo" not in {x["endpoint"] for x in billed}
    assert sum(x["cost"] for x in billed) <= 2
    violations = read_jsonl(failures)
    # each prompt is sent again with the violating provider ignored, and misrouted again,
    # until the cap leaves no room for another worst case: every answer billed is one
    # refused, or one from DeepInfra's int4 endpoint, which shares the allowed variant's
    # name: kept, marked unverifiable (an answer cannot name its endpoint)
    kept = read_jsonl(out)
    refused = [x for f in [*violations, *kept] for x in f["refused"]]
    assert all(x["provider"] == "DeepInfra" and x["routing"] == "unverifiable" for x in kept)
    assert len(refused) + len(kept) == len(billed)
    assert sorted(x["generation_id"] for x in [*refused, *kept]) == sorted(x["generation_id"] for x in billed)
    assert all(f["kind"] == "routing_violation" for f in violations)
    assert any(len(f["refused"]) > 1 for f in violations)
    assert sum(f["cost"] for f in violations) + sum(x["usage"]["cost"] + sum(r["cost"] for r in x["refused"])
                                                    for x in kept) == pytest.approx(
        sum(x["cost"] for x in billed), rel=1e-9)
    # a rerun counts what the failures file says was paid: still under the cap
    r = infer(server, prompts, "-o", out, "--failures", failures, *flags)
    assert r.code == 3, r.stderr
    assert sum(x["cost"] for x in server.ledger()) <= 2


def test_plan_figures_are_the_documented_estimate_and_worst_case(standin, tmp_path):
    """--plan's expected and worst-case cost, recomputed by hand from the stand-in's price
    table: expected = prompts x (bytes/4 + 16 tokens at the allowed endpoints' mean prompt
    price + max_tokens/2 at their mean completion price); worst case = prompts x (the
    prompt token bound at the table's highest prompt price + max_tokens at its highest
    completion price). With --max-price-* the worst case takes the flags' prices."""
    server = standin(price_scale=1000.0)
    prompts = make_prompts(tmp_path / "p.jsonl", 10)
    rows = read_jsonl(prompts)
    table = endpoints_table(server)
    allowed = [e for e in table if e["quantization"] in ("int4", "unknown") and e["tag"] != "together"]
    n = len(rows)
    content_bytes = sum(len(m["content"].encode()) for p in rows for m in p["messages"])
    token_bound = sum(64 + sum(len(m["content"].encode()) + 16 for m in p["messages"]) for p in rows)
    mean_in = sum(float(e["pricing"]["prompt"]) for e in allowed) / len(allowed)
    mean_out = sum(float(e["pricing"]["completion"]) for e in allowed) / len(allowed)
    expected = n * ((content_bytes / 4 / n + 16) * mean_in + 1000 / 2 * mean_out)
    top_in = max(float(e["pricing"]["prompt"]) for e in table)
    top_out = max(float(e["pricing"]["completion"]) for e in table)
    worst = n * (token_bound / n * top_in + 1000 * top_out)

    def figures(*flags):
        r = infer(server, prompts, "--plan", "--ignore-provider", "together", "--max-tokens", "1000",
                  "--max-cost", "95", *flags)
        assert r.code == 0, r.stderr
        report = r.stdout.decode()  # the plan is a report: stdout
        m = re.search(r"cost estimate for (\d+) prompts: expected ~\$([\d,.]+) .*; worst case \$([\d,.]+)",
                      report)
        assert m, report
        verdicts = {line.split()[0]: line for line in report.splitlines() if line.startswith("  ")}
        return int(m.group(1)), float(m.group(2).replace(",", "")), float(m.group(3).replace(",", "")), verdicts

    todo, shown_expected, shown_worst, verdicts = figures()
    assert todo == n
    assert shown_expected == pytest.approx(expected, abs=0.006)
    assert shown_worst == pytest.approx(worst, abs=0.006)
    assert verdicts["Together"].rstrip().endswith("ignored")
    assert verdicts["Moonshot"].rstrip().endswith("allowed")  # the priciest, allowed here
    # --max-price-* (USD per million tokens) below the table's top prices bound the worst case
    cap_in, cap_out = top_in * 1e6 * 0.9, top_out * 1e6 * 0.95
    _, _, shown_worst, _ = figures("--max-price-prompt", f"{cap_in:g}", "--max-price-completion", f"{cap_out:g}")
    capped = n * (token_bound / n * float(f"{cap_in:g}") / 1e6 + 1000 * float(f"{cap_out:g}") / 1e6)
    assert shown_worst == pytest.approx(capped, abs=0.006)
    assert server.stats()["completions_started"] == 0


# --- retries and statuses -------------------------------------------------------------------

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
    assert read_jsonl(out) == [] and (not failures.exists() or read_jsonl(failures) == [])
    assert server.stats()["statuses"] == {"404": len(server.requests())}
    assert len(server.requests()) <= 4  # the requests in flight at most: no retry, no more admitted
    assert server.stats()["completions_started"] == 0


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


# --- routing and request flags on the wire -------------------------------------------------------

def test_every_request_and_routing_flag_reaches_the_request_body(standin, tmp_path):
    server = standin(request_log=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    rows = {p["id"]: p for p in read_jsonl(prompts)}
    flags = ("--max-tokens", "500", "--temperature", "0.3", "--top-p", "0.9", "--seed", "7",
             "--reasoning-effort", "high", "--ignore-provider", "fireworks",
             "--only-provider", "together", "--only-provider", "moonshotai", "--sort", "throughput",
             "--no-fallbacks", "--data-collection", "deny", "--max-price-prompt", "0.7",
             "--max-price-completion", "3.5",
             "--extra-body", '{"user": "tester", "provider": {"require_parameters": true}}')
    for mode in ("--stream", "--no-stream"):
        before = len(server.requests())
        r = infer(server, prompts, "-o", tmp_path / f"r{mode}.jsonl", mode, *flags)
        assert r.code == 0, r.stderr
        bodies = server.requests()[before:]
        assert len(bodies) == 3
        for body in bodies:
            prompt = next(p for p in rows.values() if p["messages"] == body["messages"])
            assert body == {
                "model": MODEL, "messages": prompt["messages"], "max_tokens": 500,
                "stream": mode == "--stream", "temperature": 0.3, "top_p": 0.9, "seed": 7,
                "reasoning": {"effort": "high"}, "user": "tester",
                "provider": {"ignore": ["fireworks"], "only": ["together", "moonshotai"],
                             "quantizations": ["int4", "unknown"], "sort": "throughput",
                             "allow_fallbacks": False, "data_collection": "deny",
                             "max_price": {"prompt": "0.7", "completion": "3.5"},
                             "enforce_distillable_text": True, "require_parameters": True}}
    # sort=throughput among the two allowed: Together (60 tok/s) beats Moonshot AI (45)
    assert {x["provider"] for x in read_jsonl(tmp_path / "r--stream.jsonl")} == {"Together"}
    r = infer(server, prompts, "-o", tmp_path / "plain.jsonl", "--no-reasoning",
              "--model", "moonshotai/kimi-k2-0905", "--any-quantization")
    assert r.code == 0, r.stderr
    for body in server.requests()[-3:]:
        assert body["reasoning"] == {"enabled": False} and body["model"] == "moonshotai/kimi-k2-0905"
        # no preset for this model: no sampling invented, so no require_parameters either
        assert body["provider"] == {"enforce_distillable_text": True}
        assert "temperature" not in body and body["max_tokens"] == 16384


def test_quantization_routes_end_to_end_and_a_violation_by_quantization_is_caught(standin, tmp_path):
    """`--quantization int4` reaches the wire, answers come from int4 endpoints only, and an
    answer served anyway by an endpoint of another quantization (Moonshot AI's `unknown`
    among them) is a routing violation, paid for and not written."""
    server = standin(request_log=True, ledger=True, faults={"misroute": 0.4}, seed=11)
    prompts = make_prompts(tmp_path / "p.jsonl", 40)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--failures", failures, "--quantization", "int4",
              "--max-attempts", "1")  # no retry with the provider ignored: each one a failure
    assert r.code == 4, r.stderr
    assert all(b["provider"]["quantizations"] == ["int4"] for b in server.requests())
    quant: dict[str, set] = {}
    for e in endpoints_table(server):
        quant.setdefault(e["provider_name"], set()).add(e["quantization"])
    written = read_jsonl(out)
    assert written and {x["provider"] for x in written} <= {p for p, q in quant.items() if "int4" in q}
    # DeepInfra names an int4 endpoint and its FP4 variant: its answers cannot be verified
    assert all(x.get("routing") == ("unverifiable" if x["provider"] == "DeepInfra" else None)
               for x in written)
    violations = read_jsonl(failures)
    assert violations and len(written) + len(violations) == 40
    for f in violations:
        assert f["kind"] == "routing_violation" and f["cost"] > 0
        [q] = quant[f["provider"]]
        assert f["message"] == f"served by {f['provider']}: quantization {q} not allowed"
    assert "Moonshot AI" in {f["provider"] for f in violations}  # `unknown` is a quantization too
    assert sum(x["cost"] for x in server.ledger()) == pytest.approx(
        sum(x["usage"]["cost"] for x in written) + sum(f["cost"] for f in violations), rel=1e-9)


# --- load -----------------------------------------------------------------------------------------

def shrink_steps(ceiling: int) -> list[int]:
    """The limits the rule gives after 1, 2, ... bursts of 429s with no growth between."""
    limit, seen = float(ceiling), []
    while not seen or seen[-1] > 1:
        limit = max(1.0, limit * 0.75)
        seen.append(int(limit))
    return seen


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
    (each retried) shrinks the limit, and once the 429s stop it grows back to the ceiling
    (5% of 40 every 2 s without a 429): the run ends at 40. The run lasts long enough for
    that by itself, whatever the machine's speed: 400 answers of 3 s each."""
    server = standin(latency=3.0, retry_after=0.05)
    prompts = make_prompts(tmp_path / "p.jsonl", 400)
    summary = tmp_path / "s.json"
    env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
    proc = subprocess.Popen([str(BIN / "kp-infer"), str(prompts), "-o", str(tmp_path / "r.jsonl"),
                             "--base-url", server.base_url, "--concurrency", "40", "--quiet",
                             "--max-attempts", "100", "--backoff-base", "0.01",
                             "--summary-json", str(summary)], env=env)
    try:
        wait_for(lambda: server.stats()["in_flight"] == 40, "40 in flight")
        server.configure(faults={"429": 1.0})
        wait_for(lambda: server.stats()["faults"].get("429", 0) >= 20, "a burst of 429s")
        server.configure(faults={})
        assert proc.wait(timeout=240) == 0
    finally:
        proc.kill()
        proc.wait()
    stats = server.stats()
    assert stats["max_in_flight"] == 40
    s = json.loads(summary.read_text())
    assert s["done"] == 400 and s["retries"]["429"] == stats["faults"]["429"]
    assert s["concurrency_limit_end"] == 40


# --- partitions and debugging ---------------------------------------------------------------------

def test_kp_infer_and_kp_tokenize_choose_the_same_ids_for_a_partition(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 40)
    everything = tmp_path / "all.jsonl"
    assert infer(server, prompts, "-o", everything).code == 0
    for k in (1, 2):
        part = tmp_path / f"infer{k}.jsonl"
        assert infer(server, prompts, "-o", part, "--partition", f"{k}/2").code == 0
        tokens = tmp_path / f"tokens{k}.jsonl"
        r = kp("tokenize", everything, "--tokenizer", TOKENIZER_KINDS["fast"], "-o", tokens,
               "--partition", f"{k}/2", "--quiet")
        assert r.code == 0, r.stderr
        inferred = {x["id"] for x in read_jsonl(part)}
        assert inferred and inferred == {x["id"] for x in read_jsonl(tokens)}


INJECTED_BUG = """\
import click.core


def invoke(self, ctx):  # every kp-* command's body, as click runs it
    raise RuntimeError("a bug, injected by the test")


click.core.Command.invoke = invoke
"""


def test_kp_debug_shows_the_traceback_of_an_unexpected_error(tmp_path):
    """A bug (injected: a sitecustomize on PYTHONPATH makes click's command body raise) is
    reported in one line, and with its traceback under KP_DEBUG=1 (not under KP_DEBUG=0)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(INJECTED_BUG)
    src = tmp_path / "q.txt"
    src.write_text("a question\n")
    runs = {}
    for debug in ("", "0", "1"):
        env = {"PYTHONPATH": str(tmp_path / "site"), "KP_DEBUG": debug}
        runs[debug] = r = kp("prompts", src, "--format", "text", env=env)
        assert r.code == 1 and r.stdout == b""
    for quiet in ("", "0"):
        assert runs[quiet].stderr.strip().splitlines() == [
            "kp-prompts: unexpected error: RuntimeError: a bug, injected by the test "
            "(rerun with --debug or KP_DEBUG=1 for the traceback)"]
    shown = runs["1"].stderr
    assert shown.startswith("Traceback (most recent call last):")
    assert 'in invoke\n    raise RuntimeError("a bug, injected by the test")' in shown
    assert shown.rstrip().endswith("RuntimeError: a bug, injected by the test")


def test_native_providers_are_what_the_stand_in_calls_int4_or_unknown(standin):
    """NATIVE (test_infer.py) is the stand-in's int4/unknown endpoints, not a guess."""
    table = endpoints_table(standin())
    assert NATIVE == {e["provider_name"] for e in table if e["quantization"] in ("int4", "unknown")}
