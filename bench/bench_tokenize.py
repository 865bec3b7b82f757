"""kp-tokenize's throughput against the same tokenizer's raw batch encode, in one run.

    .venv/bin/python bench/bench_tokenize.py                     # both bundled tokenizers
    .venv/bin/python bench/bench_tokenize.py --tokenizer ~/models/kimi-k2.5 --records 4000

Generates a responses file (8,000 records, ~20 MB by default) (multi-paragraph reasoning and content, some CJK),
then measures:
- kp-tokenize: the real command as a subprocess, verification on, --workers = all cores,
  --drop-text, output to a file. Its start-up (imports, tokenizer load, worker spawn) is
  measured on a one-record file in the same run and subtracted, so the figure is the
  steady-state rate a long file sees; the wall time with start-up is printed too.
Each side is timed --rounds times, interleaved, and the best run kept (the machine is shared);
CPU seconds (all processes) are printed too, being less sensitive to other load.
- raw: the same tokenizer's own batch encode of the same texts (each rendered prompt, each
  reasoning, each content) using all cores: `encode_batch_fast` of the Rust tokenizer for
  a fast tokenizer, tiktoken's `encode_batch` for a tiktoken-backed one. No decode, no JSON.
Tokens per second = tokens kp-tokenize wrote (input_ids + output_ids) / seconds; the ratio
kp/raw is the figure to watch (target >= 0.8).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
BIN = Path(sys.executable).parent

from kimipipe.tokenize.codec import make_codec  # noqa: E402
from kimipipe.tokenize.fixtures import BUNDLED, CORPUS, FAST_NAME, TIKTOKEN_NAME  # noqa: E402
from kimipipe.tokenize.load import load_tokenizer  # noqa: E402
from kimipipe.tokenize.render import render_prompt  # noqa: E402

WORDS = CORPUS.split()


def paragraph(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def make_responses(path: Path, n: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            messages = [{"role": "user", "content": paragraph(rng, rng.randint(10, 80)) + "?"}]
            if i % 4 == 0:
                messages = [{"role": "system", "content": "Be helpful."},
                            {"role": "user", "content": paragraph(rng, 20)},
                            {"role": "assistant", "content": paragraph(rng, 40)}] + messages
            reasoning = "\n\n".join(paragraph(rng, rng.randint(40, 120)) for _ in range(rng.randint(1, 4)))
            content = "\n".join(paragraph(rng, rng.randint(20, 80)) for _ in range(rng.randint(1, 3)))
            rec = {"id": f"b-{i}", "dataset": "bench", "messages": messages,
                   "response": {"content": content, "reasoning": reasoning},
                   "finish_reason": "length" if i % 50 == 0 else "stop", "model": "m",
                   "provider": "p", "generation_id": f"g{i}",
                   "usage": {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "cost": 0.0}}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


def run_kp(src: Path, out: Path, tokenizer: Path, trust: bool, workers: int) -> tuple[float, float]:
    """Wall seconds, and CPU seconds of the command and its worker processes."""
    args = [str(BIN / "kp-tokenize"), str(src), "--tokenizer", str(tokenizer), "--drop-text",
            "-q", "--workers", str(workers), "-o", str(out)]
    if trust:
        args.append("--trust-remote-code")
    if out.exists():
        out.unlink()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"kp-tokenize failed ({proc.returncode}): {proc.stderr}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return elapsed, cpu


class RawEncode:
    """The same tokenizer's own batch encode of the same texts, all cores."""

    def __init__(self, tokenizer: Path, trust: bool, src: Path):
        tok = load_tokenizer(tokenizer, trust_remote_code=trust)
        codec = make_codec(tok)
        texts = []
        with open(src, encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                texts.append(render_prompt(tok, rec["messages"], True))
                texts.append(rec["response"]["reasoning"])
                texts.append(rec["response"]["content"])
        cores = os.cpu_count() or 1
        if codec.kind == "fast":
            backend = codec.full
            self.encode = lambda: [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
        else:
            enc = tok.model
            self.encode = lambda: enc.encode_batch(texts, num_threads=cores, allowed_special="all")
        self.tokens = sum(len(x) for x in self.encode())  # also warms up thread pools and caches

    def run(self) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        self.encode()
        return time.perf_counter() - t0, time.process_time() - c0


def bench(tokenizer: Path, trust: bool, records: int, workers: int, rounds: int, tmp: Path) -> dict:
    src = tmp / "responses.jsonl"
    one = tmp / "one.jsonl"
    make_responses(src, records)
    one.write_text(src.read_text(encoding="utf-8").split("\n", 1)[0] + "\n", encoding="utf-8")
    out = tmp / "tokens.jsonl"
    raw = RawEncode(tokenizer, trust, src)
    kp_runs, raw_runs, startup_runs = [], [], []
    for _ in range(rounds):  # interleaved, so that load from elsewhere hits both sides alike
        startup_runs.append(run_kp(one, out, tokenizer, trust, workers))
        kp_runs.append(run_kp(src, out, tokenizer, trust, workers))
        raw_runs.append(raw.run())
    kp_tokens = 0
    with open(out, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            kp_tokens += len(rec["input_ids"]) + len(rec["output_ids"])
    startup_wall = min(w for w, _ in startup_runs)
    startup_cpu = min(c for _, c in startup_runs)
    wall = min(w for w, _ in kp_runs)
    cpu = min(c for _, c in kp_runs)
    raw_wall = min(w for w, _ in raw_runs)
    raw_cpu = min(c for _, c in raw_runs)
    return {
        "tokenizer": tokenizer.name, "records": records, "mb": src.stat().st_size / 1e6,
        "workers": workers, "kp_tokens": kp_tokens, "raw_tokens": raw.tokens,
        "startup_s": startup_wall, "wall_s": wall, "raw_s": raw_wall,
        "kp_tok_s": kp_tokens / max(wall - startup_wall, 1e-9), "kp_tok_s_with_startup": kp_tokens / wall,
        "raw_tok_s": raw.tokens / raw_wall,
        "kp_cpu_s": cpu - startup_cpu, "raw_cpu_s": raw_cpu,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, action="append",
                    help="tokenizer directory (repeatable; default: both bundled ones)")
    ap.add_argument("--trust-remote-code", action="store_true", default=True)
    ap.add_argument("--records", type=int, default=8000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=3, help="timed runs of each side (best kept)")
    args = ap.parse_args()
    dirs = args.tokenizer or [BUNDLED / FAST_NAME, BUNDLED / TIKTOKEN_NAME]
    print(f"cores: {os.cpu_count()}, workers: {args.workers}, records: {args.records}")
    for d in dirs:
        with tempfile.TemporaryDirectory(prefix="kp-bench-") as tmp:
            r = bench(d, args.trust_remote_code, args.records, args.workers, args.rounds, Path(tmp))
        print(f"{r['tokenizer']}: {r['mb']:.1f} MB, {r['kp_tokens']:,} tokens "
              f"(raw encode {r['raw_tokens']:,})")
        print(f"  kp-tokenize: {r['kp_tok_s']:,.0f} tok/s steady ({r['wall_s']:.2f} s wall, "
              f"{r['startup_s']:.2f} s of it start-up; {r['kp_tok_s_with_startup']:,.0f} tok/s with start-up)")
        print(f"  raw batch encode: {r['raw_tok_s']:,.0f} tok/s ({r['raw_s']:.3f} s)")
        print(f"  ratio kp/raw: {r['kp_tok_s'] / r['raw_tok_s']:.2f} steady, "
              f"{r['kp_tok_s_with_startup'] / r['raw_tok_s']:.2f} with start-up (target >= 0.8)")
        print(f"  CPU: kp-tokenize {r['kp_cpu_s']:.2f} s (all processes, start-up excluded), "
              f"raw {r['raw_cpu_s']:.2f} s; raw/kp {r['raw_cpu_s'] / r['kp_cpu_s']:.2f}")


if __name__ == "__main__":
    main()
