"""kp-infer under OpenRouter's in-flight spending budget, at the user's shape.

    .venv/bin/python bench/bench_credit.py                 # both parts
    .venv/bin/python bench/bench_credit.py --part spend    # the balance spent down
    .venv/bin/python bench/bench_credit.py --part speed    # the in-flight budget vs none

The user: 2000 requests in flight, --max-tokens 16384, a $100 balance; the worst cases of
2000 such requests are most of it. The stand-in (`python -m kimipipe.standin`, its own
process) answers with its own answer lengths (~20-250 tokens, ~$0.0004 each) and reserves
each running request's worst case against `--inflight-ratio R` x the balance left.

spend: a balance scaled from $100 (default $2, R 1.0: ~44 requests' worst case in flight
    at the start, ~5,400 answers to spend it), more prompts than it pays for, kp-infer at
    --concurrency 2000, answers after 0.2 s, reservations settling 0.05 s. Printed: the
    share of the balance turned into kept answers (the output's usage.cost summed, over the
    balance) when kp-infer stops (exit 3), the 402s by kind, what is left against one
    request's worst case. Target: >= 97% (the rest is below one request's worst case at R
    1: OpenRouter refuses a request larger than the whole budget). Smaller balances cannot
    reach 97%: one worst case ($0.045) is 2.3% of $2. The budget shrinks with the balance
    left, so the last requests go one at a time: a settle time long against the answers'
    (e.g. 1 s against 0.05 s) makes that tail slow for any client.
speed: the $100 itself, 6,000 prompts, R --ratio (0.5: ~1,000 of the 2,000 asked for fit; at R 1.0
    all 2,000 fit and no 402 comes), latency --latency s; answers cost ~3% of the balance,
    so the budget stays about what it was at the start. kp-infer at --concurrency 2000 with
    the budget on, then the same prompts against a stand-in without it at the concurrency
    the budget allows (R x `kp-infer --plan --json`'s in_flight.requests, which counts
    worst cases at the highest price of the table: OpenRouter's own, at the serving
    endpoint's price, are ~10% lower). Printed: wall of each, the ratio, the 402s.
    Target: <= 1.2. OpenRouter (and the stand-in, --settle S) counts a finished request
    for a while after it ends, which the reference does not pay: with answers lasting L s
    no client does better than (L + S) / L (1.125 at the defaults, 8 s and 1 s).
Why two parts: while a run spends the balance down, the budget shrinks with it (it is a
share of the balance left), so any client slows as the money runs out; a reference at a
constant concurrency would measure that, not kp-infer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kimipipe.standin.testing import StandIn  # noqa: E402

BIN = Path(sys.executable).parent


def write_prompts(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"b{i:06d}", "dataset": "bench", "messages": [
                {"role": "user", "content": f"Question {i}: explain why {i} matters, briefly."}]}) + "\n")
    return path


def kp_infer(server: StandIn, prompts: Path, out: Path, *flags) -> tuple[int, dict, float]:
    summary = out.with_suffix(".summary.json")
    env = {**os.environ, **server.env}
    started = time.monotonic()
    proc = subprocess.run([str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--quiet",
                           "--summary-json", str(summary), "--backoff-base", "0.2", *map(str, flags)],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.monotonic() - started
    if proc.returncode not in (0, 3):
        sys.exit(f"kp-infer exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    return proc.returncode, json.loads(summary.read_text()), wall


def kept_cost(out: Path) -> float:
    with open(out, "rb") as f:
        return sum(json.loads(line)["usage"]["cost"] for line in f if line.strip())


def part_spend(args, tmp: Path) -> dict:
    prompts = write_prompts(tmp / "spend.jsonl", args.spend_prompts)
    out = tmp / "spend-out.jsonl"
    with StandIn(balance=args.spend_balance, inflight_ratio=args.spend_ratio, settle=args.spend_settle,
                 latency=args.spend_latency, ledger=True, workdir=tmp / "standin-spend") as server:
        code, summary, wall = kp_infer(server, prompts, out, "--max-tokens", args.max_tokens,
                                       "--concurrency", args.concurrency)
        stats = server.stats()
        billed = sum(line["cost"] for line in server.ledger())
    kept = kept_cost(out)
    limit = summary.get("limit") or {}
    return {"part": "spend", "balance": args.spend_balance, "inflight_ratio": args.spend_ratio,
            "latency": args.spend_latency, "settle": args.spend_settle,
            "max_tokens": args.max_tokens, "concurrency": args.concurrency, "exit": code,
            "stop_reason": summary["stop_reason"], "answers": summary["done"],
            "kept_share_of_balance": round(kept / args.spend_balance, 4),
            "billed": round(billed, 6), "kept": round(kept, 6),
            "left": round(stats["balance_remaining"], 6),
            "worst_case_request": limit.get("worst_case_request"),
            "refusals_by_kind": stats["refusals"], "limit_refusals": summary["limit_refusals"],
            "money_in_flight": summary["money_in_flight"], "wall_s": round(wall, 1)}


def part_speed(args, tmp: Path) -> dict:
    prompts = write_prompts(tmp / "speed.jsonl", args.speed_prompts)
    common = dict(balance=100.0, settle=args.settle, latency=args.latency)
    with StandIn(inflight_ratio=args.ratio, **common, workdir=tmp / "standin-budget") as server:
        plan = subprocess.run([str(BIN / "kp-infer"), str(prompts), "--plan", "--json",
                               "--max-tokens", str(args.max_tokens), "--concurrency", str(args.concurrency)],
                              env={**os.environ, **server.env}, capture_output=True, check=True)
        allows = json.loads(plan.stdout)["in_flight"]["requests"]
        code, summary, wall = kp_infer(server, prompts, tmp / "speed-budget.jsonl",
                                       "--max-tokens", args.max_tokens, "--concurrency", args.concurrency)
        stats = server.stats()
    reference = min(args.concurrency, int(allows * args.ratio))
    with StandIn(**common, workdir=tmp / "standin-reference") as server:
        ref_code, ref_summary, ref_wall = kp_infer(server, prompts, tmp / "speed-reference.jsonl",
                                                   "--max-tokens", args.max_tokens,
                                                   "--concurrency", reference)
        ref_stats = server.stats()
    return {"part": "speed", "balance": 100.0, "inflight_ratio": args.ratio, "latency": args.latency,
            "requests": args.speed_prompts, "concurrency": args.concurrency,
            "plan_in_flight_requests": allows, "exit": code, "answers": summary["done"],
            "wall_s": round(wall, 1), "server_max_in_flight": stats["max_in_flight"],
            "server_inflight_peak_reserved": round(stats["inflight_peak_reserved"], 2),
            "refusals_by_kind": stats["refusals"], "money_in_flight": summary["money_in_flight"],
            "reference_concurrency": reference, "reference_exit": ref_code,
            "reference_answers": ref_summary["done"], "reference_wall_s": round(ref_wall, 1),
            "reference_server_max_in_flight": ref_stats["max_in_flight"],
            "wall_over_reference": round(wall / ref_wall, 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["spend", "speed", "both"], default="both")
    p.add_argument("--max-tokens", type=int, default=16384)
    p.add_argument("--concurrency", type=int, default=2000)
    p.add_argument("--settle", type=float, default=1.0)
    p.add_argument("--spend-balance", type=float, default=2.0, help="$100 scaled down (default 2)")
    p.add_argument("--spend-ratio", type=float, default=1.0)
    p.add_argument("--spend-prompts", type=int, default=8000)
    p.add_argument("--spend-latency", type=float, default=0.2)
    p.add_argument("--spend-settle", type=float, default=0.05)
    p.add_argument("--speed-prompts", type=int, default=6000)
    p.add_argument("--latency", type=float, default=8.0)
    p.add_argument("--ratio", type=float, default=0.5, help="the speed part's in-flight ratio")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="kp-bench-credit-") as tmp:
        if args.part in ("spend", "both"):
            print(json.dumps(part_spend(args, Path(tmp))), flush=True)
        if args.part in ("speed", "both"):
            print(json.dumps(part_speed(args, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
