"""kp-shard's throughput against `zstd -3 -T0` compressing the same output bytes, same run.

    .venv/bin/python bench/bench_shard.py                 # ~300 MB of token records
    .venv/bin/python bench/bench_shard.py --mb 100 --repeat 2

1. Generates token records (records.Tokens with the pass-through fields kp-tokenize keeps:
   messages, response text, usage...) whose token IDs follow a Zipf-like law over Kimi's
   163,840-token vocabulary, prompts of 50-2,000 and outputs of 100-6,000 tokens.
2. Runs the real command, `kp-shard INPUT --out DIR -q` (eagle rows, level 3), as a
   subprocess; wall time.
3. Decompresses the shards it wrote into one plain file (the exact bytes kp-shard
   compressed) and times `zstd -3 -T0 -q -f FILE -o OUT` on it.
Best of --repeat runs each, interleaved (the machine may be shared), and the median
ratio of the paired runs. Prints MB/s of shard rows (uncompressed) for both
and the ratio kp-shard / zstd (target: at least 0.7). Both read from the page cache.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

BIN = Path(sys.executable).parent
WORDS = ("the of and to in is that for it as with was on be by this are at from or an have "
         "not we can which will step so then let me think about answer because if").split()


def generate(path: Path, target_bytes: int, seed: int = 1) -> int:
    rng = random.Random(seed)
    vocab = 163_840
    ranks = list(range(vocab))
    rng.shuffle(ranks)
    cumulative = list(itertools.accumulate(1.0 / (r + 10) ** 1.1 for r in range(vocab)))
    top = cumulative[-1]

    def ids(n: int) -> list[int]:
        return [ranks[bisect.bisect(cumulative, rng.random() * top)] for _ in range(n)]

    enc = msgspec.json.Encoder()
    buf = bytearray()
    written = records = 0
    with open(path, "wb") as f:
        while written < target_bytes:
            n_in, n_out = rng.randint(50, 2000), rng.randint(100, 6000)
            text = " ".join(rng.choices(WORDS, k=n_out))
            record = {
                "id": f"B3-{records:016x}", "dataset": "B3",
                "messages": [{"role": "user", "content": " ".join(rng.choices(WORDS, k=n_in))}],
                "response": {"content": text[: len(text) // 3], "reasoning": text[len(text) // 3:]},
                "finish_reason": "stop", "model": "moonshotai/kimi-k2.5", "provider": "bench",
                "generation_id": f"gen-{records}", "attempts": 1,
                "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "cost": 0.001},
                "input_ids": ids(n_in), "output_ids": ids(n_out),
            }
            enc.encode_into(record, buf, -1)
            buf += b"\n"
            records += 1
            if len(buf) > 1 << 22:
                written += f.write(buf)
                buf.clear()
        written += f.write(buf)
    return records


def timed(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, all threads) of one run of CMD."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mb", type=int, default=300, help="size of the token-records file (MB)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir", default=None, help="keep files here (default: a temp dir)")
    args = ap.parse_args()
    if not shutil.which("zstd"):
        sys.exit("bench_shard: the zstd command-line tool is needed (apt-get install zstd)")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-shard-"))
    work.mkdir(parents=True, exist_ok=True)
    tokens = work / f"tokens-{args.mb}mb.jsonl"
    if not tokens.exists():
        t = time.perf_counter()
        n = generate(tokens, args.mb * 1_000_000)
        print(f"generated {n:,} token records, {tokens.stat().st_size / 1e6:.0f} MB "
              f"in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    out = work / "shards"
    rows = work / "rows.jsonl"
    load = os.getloadavg()[0]
    kp_times, zstd_times = [], []
    for i in range(args.repeat):
        kp_times.append(timed([str(BIN / "kp-shard"), str(tokens), "--out", str(out), "-q"]))
        if i == 0:
            with open(rows, "wb") as f:
                for shard in sorted(out.glob("*.jsonl.zst")):
                    subprocess.run(["zstd", "-dc", str(shard)], check=True, stdout=f)
        zstd_times.append(timed(["zstd", "-3", "-T0", "-q", "-f", str(rows), "-o",
                                 str(work / "rows.jsonl.zst")]))
    size = rows.stat().st_size
    kp, zs = min(kp_times), min(zstd_times)
    shard_bytes = sum(p.stat().st_size for p in out.glob("*.jsonl.zst"))
    print(f"input: {tokens.stat().st_size / 1e6:.0f} MB token records; "
          f"output: {size / 1e6:.0f} MB of rows -> {shard_bytes / 1e6:.0f} MB of shards; "
          f"{os.cpu_count()} CPUs; load average before: {load:.2f}")
    for name, best, runs in (("kp-shard", kp, kp_times), ("zstd -3 -T0", zs, zstd_times)):
        print(f"{name:<12} {best[0]:6.2f} s wall {size / best[0] / 1e6:7.1f} MB/s of rows, "
              f"{best[1]:5.2f} CPU-s   (runs, wall/CPU: "
              + ", ".join(f"{w:.2f}/{c:.2f}" for w, c in runs) + ")")
    paired = sorted(z[0] / k[0] for k, z in zip(kp_times, zstd_times, strict=True))
    print(f"ratio kp-shard / zstd throughput: {zs[0] / kp[0]:.2f} best vs best, "
          f"{paired[len(paired) // 2]:.2f} median of paired runs (target >= 0.7); "
          f"CPU per byte, zstd / kp-shard: {zs[1] / kp[1]:.2f}")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
