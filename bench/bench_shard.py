"""kp-shard's throughput against `zstd -3 -T0` compressing the same output bytes, same run;
with --parquet, the Parquet layout against the zstd JSONL one.

    .venv/bin/python bench/bench_shard.py                 # ~300 MB of token records
    .venv/bin/python bench/bench_shard.py --mb 100 --repeat 2
    .venv/bin/python bench/bench_shard.py --parquet --mb 128   # ~100 MB of rows

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

--parquet: `kp-shard INPUT --out DIR -q` against the same with `--format parquet`
(write: wall and CPU-seconds), then reading every shard of each set into Arrow, as a
`datasets` loader does (its JSON loader parses with pyarrow's JSON reader, its Parquet
loader reads the file), and `kp-shard verify` of each; the bytes on disk of each set.
Ratios are Parquet over JSONL (time: above 1 is slower; size: below 1 is smaller).
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


def read_jsonl_arrow(directory: Path) -> int:
    """Every shard of a JSONL set into Arrow with pyarrow's JSON reader (zstd decoded by
    Arrow); the rows read."""
    import pyarrow as pa
    import pyarrow.json as pj

    schema = pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int32())),
                        ("loss_mask", pa.list_(pa.int8()))])
    rows = 0
    for shard in sorted(directory.glob("*.jsonl.zst")):
        with pa.input_stream(str(shard), compression="zstd") as f:
            rows += pj.read_json(f, parse_options=pj.ParseOptions(explicit_schema=schema)).num_rows
    return rows


def read_parquet_arrow(directory: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.read_table(shard).num_rows for shard in sorted(directory.glob("*.parquet")))


def in_process(f, *args) -> tuple[float, float]:
    """Wall and CPU seconds (this process, all threads) of F(*ARGS)."""
    cpu, start = time.process_time(), time.perf_counter()
    f(*args)
    return time.perf_counter() - start, time.process_time() - cpu


def parquet_bench(tokens: Path, work: Path, repeat: int) -> None:
    jdir, pdir = work / "jsonl", work / "parquet"
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in (
        "write jsonl", "write parquet", "read jsonl", "read parquet", "verify jsonl", "verify parquet")}
    load = os.getloadavg()[0]
    kp = str(BIN / "kp-shard")
    for _ in range(repeat):  # interleaved, so that a busy spell hits both alike
        runs["write jsonl"].append(timed([kp, str(tokens), "--out", str(jdir), "-q"]))
        runs["write parquet"].append(timed([kp, str(tokens), "--out", str(pdir), "-q",
                                            "--format", "parquet"]))
        runs["read jsonl"].append(in_process(read_jsonl_arrow, jdir))
        runs["read parquet"].append(in_process(read_parquet_arrow, pdir))
        runs["verify jsonl"].append(timed([kp, "verify", str(jdir), "-q"]))
        runs["verify parquet"].append(timed([kp, "verify", str(pdir), "-q"]))
    assert read_jsonl_arrow(jdir) == read_parquet_arrow(pdir)
    manifest = msgspec.json.decode((jdir / "kp-shard.manifest").read_bytes())
    rows_mb = manifest["totals"]["uncompressed_bytes"] / 1e6
    sizes = {k: sum(p.stat().st_size for p in d.glob(g)) for k, d, g in (
        ("jsonl", jdir, "*.jsonl.zst"), ("parquet", pdir, "*.parquet"))}
    print(f"input: {tokens.stat().st_size / 1e6:.0f} MB token records; {rows_mb:.0f} MB of rows "
          f"({manifest['totals']['records']:,} rows); {os.cpu_count()} CPUs; load average before: {load:.2f}")
    for name, timings in runs.items():
        best = min(timings)
        print(f"{name:<15} {best[0]:6.2f} s wall {rows_mb / best[0]:7.1f} MB/s of rows, "
              f"{best[1]:5.2f} CPU-s   (runs, wall/CPU: "
              + ", ".join(f"{w:.2f}/{c:.2f}" for w, c in timings) + ")")
    for what in ("write", "read", "verify"):
        j, p = runs[f"{what} jsonl"], runs[f"{what} parquet"]
        paired = sorted(b[0] / a[0] for a, b in zip(j, p, strict=True))
        print(f"ratio {what} parquet / jsonl wall: {min(p)[0] / min(j)[0]:.2f} best vs best, "
              f"{paired[len(paired) // 2]:.2f} median of paired runs; CPU {min(p)[1] / min(j)[1]:.2f}")
    print(f"size: jsonl-zstd {sizes['jsonl'] / 1e6:.1f} MB, parquet {sizes['parquet'] / 1e6:.1f} MB, "
          f"ratio parquet / jsonl {sizes['parquet'] / sizes['jsonl']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mb", type=int, default=300, help="size of the token-records file (MB)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir", default=None, help="keep files here (default: a temp dir)")
    ap.add_argument("--parquet", action="store_true",
                    help="Parquet against zstd JSONL: write, read into Arrow, verify, size")
    args = ap.parse_args()
    if not args.parquet and not shutil.which("zstd"):
        sys.exit("bench_shard: the zstd command-line tool is needed (apt-get install zstd)")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-shard-"))
    work.mkdir(parents=True, exist_ok=True)
    tokens = work / f"tokens-{args.mb}mb.jsonl"
    if not tokens.exists():
        t = time.perf_counter()
        n = generate(tokens, args.mb * 1_000_000)
        print(f"generated {n:,} token records, {tokens.stat().st_size / 1e6:.0f} MB "
              f"in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    if args.parquet:
        parquet_bench(tokens, work, args.repeat)
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
        return
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
