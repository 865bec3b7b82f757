"""kp-infer at the user's scale against the stand-in, with the openai SDK as the reference.

    .venv/bin/python bench/bench_infer.py                       # both workloads, both clients
    .venv/bin/python bench/bench_infer.py --mode plain --requests 8000 --concurrency 2000
    .venv/bin/python bench/bench_infer.py --mode stream --requests 3000 --concurrency 1000
    .venv/bin/python bench/bench_infer.py --skip-reference      # kp-infer only

For each workload the stand-in (`python -m kimipipe.standin`, its own process) answers
after `--latency` seconds (8 s by default, so that the stand-in, which shares the two
cores, is not the bottleneck), streaming at `--tokens-per-second`. Then, one after the
other, on the same server:
  - kp-infer, the real command (`--workers N`, default the number of cores), and
  - a plain `openai.AsyncOpenAI` client with an asyncio.Semaphore (the reference),
each in its own process. Printed per client, as JSON lines:
  wall_over_ideal   wall time / (waves x (latency + mean answer tokens / token rate)):
                    the target's ideal (requests / concurrency x latency, plus the mean
                    streaming time); the target (<= 1.10) is judged on this one
  wall_over_schedule_ideal   wall time / the makespan of the same requests, in input
                    order, through `concurrency` slots with zero client overhead (each
                    lasting latency + its own answer tokens / token rate). For plain
                    they agree. Streamed answers are cut at --max-tokens (default 100:
                    about 100 chunks each, the target's workload), so they agree closely
                    for streams too; with --max-tokens 4096 answers run ~20 to ~250
                    tokens, the longest of the last wave set the end, and only the
                    schedule ideal can be reached (a perfect client scores ~1.16 on
                    the mean-based one)
  startup_s         kp-infer only: wall time minus the run's own elapsed time (process
                    start, imports, validation, the endpoints fetch)
  cpu_ms_per_request, cpu_us_per_chunk   user+system CPU of the client's whole process
                    tree (parent and workers), per request and per streamed chunk
  peak_rss_mb       peak of the summed RSS of the client's process tree (sampled)
and the ratio of kp-infer's CPU per request to the reference's. From the per-chunk figure,
`streams_per_worker_at_40_chunks_per_s` = 1 s / (40 x CPU per chunk): how many live
40-token/s streams one worker process can carry on one core.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kimipipe.standin.testing import StandIn  # noqa: E402

BIN = Path(sys.executable).parent

OPENAI_CLIENT = r'''
import asyncio, json, sys
import openai

async def main(base_url, api_key, prompts_path, concurrency, stream, max_tokens):
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=5, timeout=600)
    sem = asyncio.Semaphore(concurrency)
    prompts = [json.loads(line) for line in open(prompts_path)]
    done = 0
    async def one(p):
        nonlocal done
        async with sem:
            if stream:
                s = await client.chat.completions.create(model="moonshotai/kimi-k2.5",
                    messages=p["messages"], max_tokens=max_tokens, stream=True)
                text = []
                async for chunk in s:
                    if chunk.choices and chunk.choices[0].delta.content:
                        text.append(chunk.choices[0].delta.content)
            else:
                r = await client.chat.completions.create(model="moonshotai/kimi-k2.5",
                    messages=p["messages"], max_tokens=max_tokens)
                text = [r.choices[0].message.content]
            done += 1
    await asyncio.gather(*(one(p) for p in prompts))
    print(json.dumps({"done": done}))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1", int(sys.argv[6])))
'''


def tree_pids(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
        except (OSError, IndexError):
            continue
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total / 1e6


def run_client(cmd: list[str], env: dict) -> dict:
    """Run CMD; return wall, CPU of its whole process tree, and peak summed RSS."""
    before = os.times()
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0.0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mb(tree_pids(proc.pid)))
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.monotonic() - started
    stop.set()
    sampler.join()
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    if proc.returncode != 0:
        raise SystemExit(f"client failed ({proc.returncode}): {err.decode()[-2000:]}")
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak[0]}


def prompt_text(i: int) -> str:
    return f"Benchmark prompt {i}: tell me about the number {i}."


def write_prompts(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"b{i:06d}", "dataset": "bench", "messages": [
                {"role": "user", "content": prompt_text(i)}]}) + "\n")


def schedule_ideal(durations: list[float], concurrency: int) -> float:
    """Makespan of DURATIONS started in order on CONCURRENCY slots, each as soon as one frees."""
    slots = [0.0] * min(concurrency, len(durations))
    heapq.heapify(slots)
    end = 0.0
    for d in durations:
        finish = heapq.heappop(slots) + d
        end = max(end, finish)
        heapq.heappush(slots, finish)
    return end


def workload(mode: str, requests: int, concurrency: int, latency: float, tps: float,
             workers: int | None, skip_reference: bool, max_tokens: int) -> list[dict]:
    stream = mode == "stream"
    results = []
    with tempfile.TemporaryDirectory(prefix="kp-bench-") as tmp:
        tmp = Path(tmp)
        prompts = tmp / "prompts.jsonl"
        write_prompts(prompts, requests)
        clients = [("kp-infer", None)] + ([] if skip_reference else [("openai-sdk", None)])
        for name, _ in clients:
            with StandIn(latency=latency, tokens_per_second=tps if stream else None, ledger=True,
                         workdir=tmp / f"standin-{name}") as server:
                env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
                if name == "kp-infer":
                    cmd = [str(BIN / "kp-infer"), str(prompts), "-o", str(tmp / "out.jsonl"),
                           "--base-url", server.base_url, "--concurrency", str(concurrency),
                           "--max-tokens", str(max_tokens), "--quiet",
                           "--stream" if stream else "--no-stream", "--idle-timeout", "600",
                           "--summary-json", str(tmp / "summary.json")]
                    if workers is not None:
                        cmd += ["--workers", str(workers)]
                else:
                    script = tmp / "openai_client.py"
                    script.write_text(OPENAI_CLIENT)
                    cmd = [sys.executable, str(script), server.base_url, server.api_key, str(prompts),
                           str(concurrency), "1" if stream else "0", str(max_tokens)]
                measured = run_client(cmd, env)
                ledger = server.ledger()
            chunks = sum(x["completion_tokens"] for x in ledger)
            mean_tokens = chunks / max(1, len(ledger))
            per_request = latency + (mean_tokens / tps if stream and tps else 0.0)
            ideal = math.ceil(requests / concurrency) * per_request
            tokens_by_text = {x["request_user_text_sha256"]: x["completion_tokens"] for x in ledger}
            durations = [latency + (tokens_by_text.get(hashlib.sha256(prompt_text(i).encode()).hexdigest(), 0)
                                    / tps if stream and tps else 0.0) for i in range(requests)]
            scheduled = schedule_ideal(durations, concurrency)
            row = {
                "client": name, "mode": mode, "requests": requests, "answered": len(ledger),
                "concurrency": concurrency, "latency_s": latency,
                "tokens_per_second": tps if stream else None,
                "wall_s": round(measured["wall_s"], 2), "ideal_s": round(ideal, 2),
                "wall_over_ideal": round(measured["wall_s"] / ideal, 3),
                "schedule_ideal_s": round(scheduled, 2),
                "wall_over_schedule_ideal": round(measured["wall_s"] / scheduled, 3),
                "cpu_s": round(measured["cpu_s"], 2),
                "cpu_ms_per_request": round(1000 * measured["cpu_s"] / requests, 3),
                "peak_rss_mb": round(measured["peak_rss_mb"], 1),
            }
            if name == "kp-infer":
                elapsed = json.loads((tmp / "summary.json").read_text())["elapsed_s"]
                row["startup_s"] = round(measured["wall_s"] - elapsed, 2)
            if stream:
                row["chunks"] = chunks
                row["cpu_us_per_chunk"] = round(1e6 * measured["cpu_s"] / max(1, chunks), 2)
                if name == "kp-infer":
                    row["streams_per_worker_at_40_chunks_per_s"] = int(1e6 / (40 * row["cpu_us_per_chunk"]))
            print(json.dumps(row), flush=True)
            results.append(row)
    if len(results) == 2:
        ratio = results[0]["cpu_ms_per_request"] / results[1]["cpu_ms_per_request"]
        print(json.dumps({"mode": mode, "kp_infer_cpu_per_request_over_openai_sdk": round(ratio, 4),
                          "kp_infer_wall_over_openai_sdk": round(results[0]["wall_s"] / results[1]["wall_s"], 3)}),
              flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["plain", "stream", "both"], default="both")
    parser.add_argument("--requests", type=int, default=None, help="default: 8000 plain, 3000 stream")
    parser.add_argument("--concurrency", type=int, default=None, help="default: 2000 plain, 1000 stream")
    parser.add_argument("--latency", type=float, default=8.0)
    parser.add_argument("--tokens-per-second", type=float, default=40.0)
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="default: 4096 plain; 100 stream (answers cut at 100 tokens: about "
                             "100 chunks each, the target's workload; 4096 gives the stand-in's "
                             "natural 20-250 with a long tail)")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--skip-reference", action="store_true")
    args = parser.parse_args()
    modes = ["plain", "stream"] if args.mode == "both" else [args.mode]
    for mode in modes:
        workload(mode, args.requests or (8000 if mode == "plain" else 3000),
                 args.concurrency or (2000 if mode == "plain" else 1000), args.latency,
                 args.tokens_per_second, args.workers, args.skip_reference,
                 args.max_tokens or (4096 if mode == "plain" else 100))


if __name__ == "__main__":
    main()
