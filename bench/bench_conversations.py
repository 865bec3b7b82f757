"""Conversations asked turn by turn against single-turn runs of the very same requests.

    .venv/bin/python bench/bench_conversations.py                  # 2000 x 3 turns, 2000 in flight
    .venv/bin/python bench/bench_conversations.py --conversations 500 --concurrency 500 --latency 4
    .venv/bin/python bench/bench_conversations.py --pairs 4     # alternating order, medians

Two kp-infer runs, each against its own stand-in (`--latency` seconds per answer,
non-streaming by default: the figure is about admission and the turn queue, not SSE):
  - conversations: CONVERSATIONS prompts of TURNS user turns each (`follow_ups`), so each
    conversation sends its turns one after the other, each on its own earlier answers;
  - single-turn: the same requests as separate prompts (every turn record's `messages`,
    exactly as the first run sent them), all admitted at once.
Both have the same ideal, turns x latency x conversations / concurrency (the requests in
waves of `concurrency`, with zero client overhead). Printed as JSON lines, per run:
wall_s, ideal_s, wall_over_ideal, cpu_ms_per_request (user+system of kp-infer's process
tree, per request) and peak_rss_mb; then the conversations' figures over the single-turn
ones (the target: neither worse).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_infer import BIN, run_client  # noqa: E402

from kimipipe.standin.testing import StandIn  # noqa: E402


def write_conversations(path: Path, n: int, turns: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({
                "id": f"c{i:06d}", "dataset": "bench",
                "messages": [{"role": "user", "content": f"Conversation {i}: tell me about {i}."}],
                "follow_ups": [f"And turn {k} of conversation {i}?" for k in range(2, turns + 1)],
            }) + "\n")


def single_turn_prompts(responses: Path, path: Path) -> int:
    """The requests the conversations sent, as separate prompts (no follow-ups)."""
    n = 0
    with open(responses) as src, open(path, "w") as f:
        for line in src:
            rec = json.loads(line)
            f.write(json.dumps({"id": rec["id"].replace("#", "-t"), "dataset": "bench",
                                "messages": rec["messages"]}) + "\n")
            n += 1
    return n


def run(name: str, prompts: Path, out: Path, tmp: Path, args, requests: int) -> dict:
    with StandIn(latency=args.latency, workdir=tmp / f"standin-{name}") as server:
        env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
        summary = tmp / f"{name}.summary.json"
        cmd = [str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--base-url", server.base_url,
               "--concurrency", str(args.concurrency), "--max-tokens", "4096", "--quiet",
               "--stream" if args.stream else "--no-stream", "--idle-timeout", "600",
               "--summary-json", str(summary)]
        measured = run_client(cmd, env)
        answered = server.stats()["charged"]
    elapsed = json.loads(summary.read_text())["elapsed_s"]
    ideal = math.ceil(requests / args.concurrency) * args.latency
    return {"run": name, "requests": requests, "answered": answered,
            "concurrency": args.concurrency, "latency_s": args.latency,
            "wall_s": round(measured["wall_s"], 2), "run_elapsed_s": elapsed,
            "ideal_s": round(ideal, 2), "wall_over_ideal": round(measured["wall_s"] / ideal, 3),
            "elapsed_over_ideal": round(elapsed / ideal, 3),
            "cpu_ms_per_request": round(1000 * measured["cpu_s"] / requests, 3),
            "peak_rss_mb": round(measured["peak_rss_mb"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=8.0)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--pairs", type=int, default=1,
                        help="run the pair N times, alternating which goes first; medians last")
    args = parser.parse_args()
    requests = args.conversations * args.turns
    ratios = []
    for pair in range(args.pairs):
        with tempfile.TemporaryDirectory(prefix="kp-bench-conv-") as tmp:
            tmp = Path(tmp)
            conversations, out = tmp / "conversations.jsonl", tmp / "conversations.out.jsonl"
            write_conversations(conversations, args.conversations, args.turns)
            singles = tmp / "singles.jsonl"
            if pair % 2 == 0:
                conv = run("conversations", conversations, out, tmp, args, requests)
                assert single_turn_prompts(out, singles) == requests
                single = run("single-turn", singles, tmp / "singles.out.jsonl", tmp, args, requests)
            else:  # the same requests need the conversations' answers: a first run makes them
                run("conversations-warmup", conversations, tmp / "warmup.jsonl", tmp, args, requests)
                assert single_turn_prompts(tmp / "warmup.jsonl", singles) == requests
                single = run("single-turn", singles, tmp / "singles.out.jsonl", tmp, args, requests)
                conv = run("conversations", conversations, out, tmp, args, requests)
            for row in (conv, single):
                print(json.dumps({"pair": pair + 1, **row}), flush=True)
            ratio = {
                "conversations_wall_over_single_turn": round(conv["wall_s"] / single["wall_s"], 3),
                "conversations_elapsed_over_single_turn": round(
                    conv["run_elapsed_s"] / single["run_elapsed_s"], 3),
                "conversations_cpu_per_request_over_single_turn": round(
                    conv["cpu_ms_per_request"] / single["cpu_ms_per_request"], 3)}
            print(json.dumps({"pair": pair + 1, **ratio}), flush=True)
            ratios.append(ratio)
    if len(ratios) > 1:
        print(json.dumps({"medians_of_pairs": len(ratios), **{
            key: statistics.median(r[key] for r in ratios) for key in ratios[0]}}), flush=True)


if __name__ == "__main__":
    main()
