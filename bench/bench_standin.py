"""Can the stand-in carry 2000 concurrent slow requests on one core without being the
bottleneck? Starts a stand-in, drives it from an aiohttp client in a separate process,
and reports the stand-in's own CPU per request (utime+stime from /proc/PID/stat, before
and after), the wall time over the ideal, and max_in_flight.

    .venv/bin/python bench/bench_standin.py                      # plain and stream, 2 s
    .venv/bin/python bench/bench_standin.py --mode stream --tokens-per-second 40
    .venv/bin/python bench/bench_standin.py --requests 8000 --latency 8

Ideal wall: the schedule's own, as bench_infer.py computes it (`schedule_ideal`): each
request lasts latency + its own answer's tokens / rate (the answers are deterministic), and
they start in order on `concurrency` slots, each as soon as one frees; what an infinitely
fast server and client would take. (With no token rate every request lasts the latency,
and this is ceil(requests / concurrency) x latency.) Figures go in bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kimipipe.standin.testing import StandIn  # noqa: E402

MODEL = "moonshotai/kimi-k2.5"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS     # utime, stime


async def client(base_url: str, api_key: str, requests: int, concurrency: int, stream: bool,
                 max_tokens: int) -> dict:
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    statuses: dict[int, int] = {}
    events = 0
    errors = 0
    headers = {"Authorization": f"Bearer {api_key}"}
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)

    async def one(session, i):
        nonlocal events, errors
        payload = {"model": MODEL, "max_tokens": max_tokens, "stream": stream,
                   "messages": [{"role": "user", "content": f"bench prompt {i}"}]}
        async with sem:
            try:
                async with session.post(base_url + "/chat/completions", json=payload,
                                        headers=headers) as r:
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                    if stream:
                        async for line in r.content:
                            if line.startswith(b"data: "):
                                events += 1
                    else:
                        await r.read()
            except (TimeoutError, aiohttp.ClientError):
                errors += 1

    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(one(session, i) for i in range(requests)))
    return {"wall": time.monotonic() - t0, "statuses": statuses, "events": events,
            "errors": errors}


def run_client(args) -> None:
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    result = runner(client(args.client, "sk-or-standin", args.requests, args.concurrency,
                           args.client_mode == "stream", args.max_tokens))
    print(json.dumps(result))


def measure(mode: str, args) -> dict:
    with StandIn(latency=args.latency, tokens_per_second=args.tokens_per_second,
                 balance=1e9) as server:
        before = cpu_seconds(server.pid)
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, __file__, "--client", server.base_url, "--client-mode", mode,
             "--requests", str(args.requests), "--concurrency", str(args.concurrency),
             "--max-tokens", str(args.max_tokens)],
            capture_output=True, text=True, check=True)
        wall = time.monotonic() - t0
        used = cpu_seconds(server.pid) - before
        stats = server.stats()
    result = json.loads(proc.stdout)
    # the answers are deterministic: each request's own duration, on the schedule's slots
    from bench_infer import schedule_ideal

    from kimipipe.standin.answers import answer_for_request
    durations = []
    for i in range(args.requests):
        generation = 0.0
        if args.tokens_per_second > 0:
            generation = answer_for_request(
                {"model": MODEL, "max_tokens": args.max_tokens,
                 "messages": [{"role": "user", "content": f"bench prompt {i}"}]}
            ).completion_tokens / args.tokens_per_second
        durations.append(args.latency + generation)
    ideal = schedule_ideal(durations, args.concurrency)
    return {
        "mode": mode, "requests": args.requests, "concurrency": args.concurrency,
        "latency": args.latency, "tokens_per_second": args.tokens_per_second,
        "client_wall": round(result["wall"], 2), "ideal": round(ideal, 2),
        "wall_over_ideal": round(result["wall"] / ideal, 2) if ideal else None,
        "server_cpu_s": round(used, 2),
        "server_cpu_ms_per_request": round(1000 * used / args.requests, 3),
        "server_cpu_us_per_event": (round(1e6 * used / result["events"], 1)
                                    if result["events"] else None),
        "sse_events": result["events"], "max_in_flight": stats["max_in_flight"],
        "statuses": result["statuses"], "client_errors": result["errors"],
        "total_wall": round(wall, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["plain", "stream", "both"], default="both")
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--concurrency", type=int, default=2000)
    p.add_argument("--latency", type=float, default=2.0)
    p.add_argument("--tokens-per-second", type=float, default=0.0)
    p.add_argument("--max-tokens", type=int, default=100000)
    p.add_argument("--client", help=argparse.SUPPRESS)
    p.add_argument("--client-mode", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        run_client(args)
        return
    modes = ["plain", "stream"] if args.mode == "both" else [args.mode]
    print("command:", " ".join([os.path.relpath(sys.executable), *sys.argv]), file=sys.stderr)
    for mode in modes:
        print(json.dumps(measure(mode, args)))


if __name__ == "__main__":
    main()
