"""kp-infer at the user's scale against the stand-in, beside reference clients on the same work.

    .venv/bin/python bench/bench_infer.py                       # both workloads
    .venv/bin/python bench/bench_infer.py --mode plain --requests 8000 --concurrency 2000
    .venv/bin/python bench/bench_infer.py --mode stream --requests 3000 --concurrency 1000
    .venv/bin/python bench/bench_infer.py --mode stream --repeat 3   # the spread, run by run
    .venv/bin/python bench/bench_infer.py --skip-reference      # kp-infer only

For each workload the stand-in (`python -m kimipipe.standin`, its own process, a fresh one
per client run) answers after `--latency` seconds (8 s by default, so that the stand-in,
which shares the cores, is not the bottleneck), streaming at `--tokens-per-second` (each
token its own write, as a live stream arrives). Each client runs in its own process, one
after the other, on the same prompts:
  plain   kp-infer (`--no-stream`), then the openai SDK
          (`openai.AsyncOpenAI` and an asyncio.Semaphore)
  stream  kp-infer streamed, the naive aiohttp client streamed (bench/naive_client.py:
          uvloop, one session, json.loads per data line, deltas joined), then both plain on
          a stand-in at the same token rate (a plain answer comes when its stream would
          have ended, so the requests are in flight just as long); `--openai-sdk` adds
          the SDK streamed
Printed per run, as JSON lines:
  wall_over_ideal   wall time / (waves x (latency + mean answer tokens / token rate))
  wall_over_schedule_ideal   wall time / the makespan of the same requests, in input
                    order, through `concurrency` slots with zero client overhead (each
                    lasting latency + its own answer tokens / token rate). For plain
                    they agree. Streamed answers are cut at --max-tokens (default 100:
                    about 100 chunks each); with --max-tokens 4096 answers run ~20 to
                    ~250 tokens, the longest of the last wave set the end, and only the
                    schedule ideal can be reached
  startup_s         kp-infer only: wall time minus the run's own elapsed time
  cpu_ms_per_request, cpu_us_per_chunk   user+system CPU of the client's whole process
                    tree, per request and per streamed chunk (one
                    chunk per token)
  peak_rss_mb, load_avg_1m   peak summed RSS of the tree; the machine's load after the run
and per workload a summary line of ratios in the same run. For streams:
  kp_infer_streaming_us_per_chunk   kp-infer's streamed run's CPU minus its plain run's,
                    per chunk: what streaming costs it (the per-answer work is the same)
  kp_streaming_over_naive_whole     that over the naive client's whole CPU per chunk
                    (target <= 0.3); also kp-infer whole over naive whole, and streaming
                    over the naive client's own streamed-minus-plain
  core_share_2000_streams_at_40_tok_s   2000 x 40 chunks/s x kp-infer's whole CPU per chunk
                    (per-answer work included, at these ~100-token answers): the share of
                    one core the user's 2000 live streams need; streaming_core_share_...
                    the same at the streaming cost alone
`--kp-pythonpath DIR` runs kp-infer from an exported older commit, for a before/after in
one session.
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
# --kp-pythonpath: kp-infer imports kimipipe from there (an exported commit,
# for a before/after in one session); the stand-in and the references run from this checkout
KP_PYTHONPATH: str | None = None

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


def run_client(cmd: list[str], env: dict, cwd: str | None = None) -> dict:
    """Run CMD; return wall, CPU of its whole process tree, and peak summed RSS."""
    before = os.times()
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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


def client_command(name: str, stream: bool, tmp: Path, prompts: Path, server, concurrency: int,
                   max_tokens: int) -> list[str]:
    if name == "kp-infer":
        cmd = [str(BIN / "kp-infer"), str(prompts), "-o", str(tmp / "out.jsonl"),
               "--base-url", server.base_url, "--concurrency", str(concurrency),
               "--max-tokens", str(max_tokens), "--quiet",
               "--stream" if stream else "--no-stream", "--idle-timeout", "600",
               "--summary-json", str(tmp / "summary.json")]
        return cmd
    if name == "naive-aiohttp":
        return [sys.executable, str(REPO / "bench" / "naive_client.py"), server.base_url,
                str(prompts), str(concurrency), str(max_tokens), "stream" if stream else "plain"]
    script = tmp / "openai_client.py"
    script.write_text(OPENAI_CLIENT)
    return [sys.executable, str(script), server.base_url, server.api_key, str(prompts),
            str(concurrency), "1" if stream else "0", str(max_tokens)]


def one_run(name: str, stream: bool, tmp: Path, prompts: Path, requests: int, concurrency: int,
            latency: float, tps: float, max_tokens: int,
            paced: bool) -> dict:
    """One client's run against its own stand-in. PACED: the stand-in takes the token rate
    (a plain answer then comes after the time its stream would have taken)."""
    run_dir = Path(tempfile.mkdtemp(dir=tmp, prefix=f"{name}-{'stream' if stream else 'plain'}-"))
    with StandIn(latency=latency, tokens_per_second=tps if paced else None, ledger=True,
                 workdir=run_dir / "standin") as server:
        env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
        cwd = None
        if name == "kp-infer" and KP_PYTHONPATH:
            # and run from there (an older commit's worker processes, started with
            # `python -m`, put the working directory ahead of PYTHONPATH)
            env["PYTHONPATH"] = cwd = KP_PYTHONPATH
        cmd = client_command(name, stream, run_dir, prompts, server, concurrency, max_tokens)
        measured = run_client(cmd, env, cwd)
        ledger = server.ledger()
    tokens = sum(x["completion_tokens"] for x in ledger)
    mean_tokens = tokens / max(1, len(ledger))
    per_request = latency + (mean_tokens / tps if paced and tps else 0.0)
    ideal = math.ceil(requests / concurrency) * per_request
    tokens_by_text = {x["request_user_text_sha256"]: x["completion_tokens"] for x in ledger}
    durations = [latency + (tokens_by_text.get(hashlib.sha256(prompt_text(i).encode()).hexdigest(), 0)
                            / tps if paced and tps else 0.0) for i in range(requests)]
    scheduled = schedule_ideal(durations, concurrency)
    row = {
        "client": name, "mode": "stream" if stream else "plain", "requests": requests,
        "answered": len(ledger), "concurrency": concurrency, "latency_s": latency,
        "tokens_per_second": tps if paced else None,
        "wall_s": round(measured["wall_s"], 2), "ideal_s": round(ideal, 2),
        "wall_over_ideal": round(measured["wall_s"] / ideal, 3),
        "schedule_ideal_s": round(scheduled, 2),
        "wall_over_schedule_ideal": round(measured["wall_s"] / scheduled, 3),
        "cpu_s": round(measured["cpu_s"], 3),
        "cpu_ms_per_request": round(1000 * measured["cpu_s"] / requests, 3),
        "peak_rss_mb": round(measured["peak_rss_mb"], 1),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if name == "kp-infer":
        elapsed = json.loads((run_dir / "summary.json").read_text())["elapsed_s"]
        row["startup_s"] = round(measured["wall_s"] - elapsed, 2)
    if stream:
        # one chunk per token (the stand-in streams a token per SSE event)
        row["chunks"] = tokens
        row["cpu_us_per_chunk"] = round(1e6 * measured["cpu_s"] / max(1, tokens), 2)
    print(json.dumps(row), flush=True)
    return row


def plain_workload(requests: int, concurrency: int, latency: float,
                   skip_reference: bool, max_tokens: int) -> None:
    with tempfile.TemporaryDirectory(prefix="kp-bench-") as tmp:
        tmp = Path(tmp)
        prompts = tmp / "prompts.jsonl"
        write_prompts(prompts, requests)
        args = (tmp, prompts, requests, concurrency, latency, 0.0, max_tokens, False)
        kp = one_run("kp-infer", False, *args)
        if skip_reference:
            return
        sdk = one_run("openai-sdk", False, *args)
    print(json.dumps({"mode": "plain",
                      "kp_infer_cpu_per_request_over_openai_sdk":
                          round(kp["cpu_ms_per_request"] / sdk["cpu_ms_per_request"], 4),
                      "kp_infer_wall_over_openai_sdk": round(kp["wall_s"] / sdk["wall_s"], 3)}),
          flush=True)


def stream_workload(requests: int, concurrency: int, latency: float, tps: float,
                    skip_reference: bool, max_tokens: int,
                    openai_sdk: bool) -> None:
    """kp-infer streamed and plain, and the naive aiohttp client streamed and plain, on the
    same prompts, each against a stand-in at the same token rate (a plain answer comes
    when its stream would have ended, so both runs hold the same requests in flight for
    the same time). kp-infer's streaming cost per chunk is its streamed run's CPU minus its
    plain run's, over the chunks; the reference is the naive client's whole CPU per chunk."""
    with tempfile.TemporaryDirectory(prefix="kp-bench-") as tmp:
        tmp = Path(tmp)
        prompts = tmp / "prompts.jsonl"
        write_prompts(prompts, requests)
        args = (tmp, prompts, requests, concurrency, latency, tps, max_tokens, True)
        kp = one_run("kp-infer", True, *args)
        naive = None if skip_reference else one_run("naive-aiohttp", True, *args)
        kp_plain = one_run("kp-infer", False, *args)
        naive_plain = None if skip_reference else one_run("naive-aiohttp", False, *args)
        sdk = one_run("openai-sdk", True, *args) if openai_sdk else None
    chunks = kp["chunks"]
    kp_streaming = 1e6 * (kp["cpu_s"] - kp_plain["cpu_s"]) / chunks
    summary = {
        "mode": "stream", "requests": requests, "concurrency": concurrency,
        "tokens_per_second": tps, "chunks": chunks,
        "kp_infer_streaming_us_per_chunk": round(kp_streaming, 2),
        "kp_infer_whole_us_per_chunk": kp["cpu_us_per_chunk"],
        # the CPU one process tree needs for 2000 live streams at 40 chunks/s each, as a
        # share of one core, at this run's whole CPU per chunk (per-answer work included)
        "core_share_2000_streams_at_40_tok_s": round(2000 * 40 * kp["cpu_us_per_chunk"] / 1e6, 3),
        "streaming_core_share_2000_streams_at_40_tok_s": round(2000 * 40 * kp_streaming / 1e6, 3),
    }
    if naive is not None:
        naive_streaming = 1e6 * (naive["cpu_s"] - naive_plain["cpu_s"]) / chunks
        summary.update({
            "naive_whole_us_per_chunk": naive["cpu_us_per_chunk"],
            "naive_streaming_us_per_chunk": round(naive_streaming, 2),
            # the target: <= 0.3
            "kp_streaming_over_naive_whole": round(kp_streaming / naive["cpu_us_per_chunk"], 3),
            "kp_whole_over_naive_whole": round(kp["cpu_us_per_chunk"] / naive["cpu_us_per_chunk"], 3),
            "kp_streaming_over_naive_streaming": round(kp_streaming / naive_streaming, 3),
            "kp_wall_over_naive_wall": round(kp["wall_s"] / naive["wall_s"], 3),
        })
    if sdk is not None:
        summary["kp_whole_over_openai_sdk"] = round(kp["cpu_us_per_chunk"] / sdk["cpu_us_per_chunk"], 4)
    print(json.dumps(summary), flush=True)


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
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--openai-sdk", action="store_true",
                        help="stream mode: run the openai SDK streaming too (the older reference)")
    parser.add_argument("--repeat", type=int, default=1, help="run the workload N times")
    parser.add_argument("--kp-pythonpath", metavar="DIR",
                        help="run kp-infer's kimipipe from DIR (e.g. `git archive` of an older "
                             "commit); the stand-in and the references stay this checkout's")
    args = parser.parse_args()
    global KP_PYTHONPATH
    KP_PYTHONPATH = args.kp_pythonpath
    modes = ["plain", "stream"] if args.mode == "both" else [args.mode]
    for _ in range(args.repeat):
        for mode in modes:
            requests = args.requests or (8000 if mode == "plain" else 3000)
            concurrency = args.concurrency or (2000 if mode == "plain" else 1000)
            if mode == "plain":
                plain_workload(requests, concurrency, args.latency,
                               args.skip_reference, args.max_tokens or 4096)
            else:
                stream_workload(requests, concurrency, args.latency, args.tokens_per_second,
                                args.skip_reference, args.max_tokens or 100,
                                args.openai_sdk)


if __name__ == "__main__":
    main()
