"""The reference for kp-infer's streaming CPU: a user's first aiohttp client, written plainly.

    python bench/naive_client.py BASE_URL PROMPTS.jsonl CONCURRENCY MAX_TOKENS stream|plain

uvloop, one `aiohttp.ClientSession` (no connection limit), a semaphore for the
concurrency, `json.loads` of every `data:` line, the content and reasoning deltas joined.
No retries, no records written: it is what per-chunk work costs with nothing else on top.
The API key comes from OPENROUTER_API_KEY. bench/bench_infer.py runs it beside kp-infer on
the same prompts and the same stand-in; it prints one JSON line (answers, chunks, characters).
"""

import asyncio
import json
import os
import sys

import aiohttp
import uvloop


async def main(base_url, prompts_path, concurrency, max_tokens, stream):
    headers = {"Authorization": f"Bearer {os.environ['OPENROUTER_API_KEY']}"}
    with open(prompts_path) as f:
        prompts = [json.loads(line) for line in f]
    sem = asyncio.Semaphore(concurrency)
    totals = {"answers": 0, "chunks": 0, "chars": 0}

    async def one(session, prompt):
        body = {"model": "moonshotai/kimi-k2.5", "messages": prompt["messages"],
                "max_tokens": max_tokens, "stream": stream}
        async with sem, session.post(base_url + "/chat/completions", json=body) as resp:
            resp.raise_for_status()
            content, reasoning = [], []
            if stream:
                async for line in resp.content:
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    chunk = json.loads(data)
                    totals["chunks"] += 1
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        if delta.get("content"):
                            content.append(delta["content"])
                        if delta.get("reasoning"):
                            reasoning.append(delta["reasoning"])
            else:
                message = (await resp.json())["choices"][0]["message"]
                content.append(message.get("content") or "")
                reasoning.append(message.get("reasoning") or "")
            totals["answers"] += 1
            totals["chars"] += len("".join(content)) + len("".join(reasoning))

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(headers=headers, connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        await asyncio.gather(*(one(session, p) for p in prompts))
    print(json.dumps(totals))


if __name__ == "__main__":
    url, path, concurrency, max_tokens, mode = sys.argv[1:6]
    uvloop.run(main(url.rstrip("/"), path, int(concurrency), int(max_tokens), mode == "stream"))
