"""kp-tokenize's throughput against the same work done with the tokenizer library's own
best path, in one run.

    .venv/bin/python bench/bench_tokenize.py     # the bundled ones, and Kimi K2.5's real one
    .venv/bin/python bench/bench_tokenize.py --tokenizer ../shared/kimi-k2.5-tokenizer --records 4000

A directory with no chat template of its own (Kimi K2.5's real files: ../shared/
kimi-k2.5-tokenizer, or $KP_KIMI_TOKENIZER; found and added by default when there) gets the
project's K2.5 template (--chat-template on kp-tokenize's side, the same text on the
references').

Generates a responses file (8,000 records, ~20 MB by default) (multi-paragraph reasoning and content, some CJK),
then measures:
- kp-tokenize: the real command as a subprocess, verification on, --workers = all cores,
  --drop-text, output to a file. Its start-up (imports, tokenizer load, worker spawn) is
  measured on a one-record file in the same run and subtracted, so the figure is the
  steady-state rate a long file sees; the wall time with start-up is printed too.
- reference: the same work through the library's public API, on all cores (a pool of
  forked processes, one per core, the tokenizer loaded before the fork, the records
  already parsed in memory, the pool warmed up before timing): render each prompt with
  `apply_chat_template` (a batch of conversations where the class takes one), encode the
  prompts with special-token strings matched and the reasoning and content as plain text
  in batches (the Rust tokenizer's `encode_batch`, with `encode_special_tokens` for the
  plain text, for a fast tokenizer; tiktoken's `encode_batch`/`encode_ordinary_batch` for
  a tiktoken one), join them with the turn's structural IDs, decode every row in a batch
  (`decode_batch` of either) and compare it with the rendered text.
  No JSON is read or written on this side: it does less I/O than kp-tokenize.
- raw: a bare batch encode of the same texts by the same tokenizer, on all cores (the same
  pool): the prompts rendered beforehand (not timed), then tiktoken's `encode_batch` /
  `encode_ordinary_batch` (or the Rust tokenizer's `encode_batch`) of the prompts, the
  reasoning and the content; no template, no join, no decode, no check. The target
  (docs/performance.md) is kp-tokenize >= 0.9 of this steady rate.
Each side is timed --rounds times, interleaved, and the best run kept (the machine is shared);
CPU seconds (all processes) are printed too, being less sensitive to other load.
Tokens per second = tokens kp-tokenize wrote (input_ids + output_ids) / seconds, records
per second likewise; the ratios kp/reference (target >= 0.8) and kp/raw (target >= 0.9)
are the figures to watch. Start-up (Python, imports, loading the tokenizer, checking the
template) is printed on its own.
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

REAL = Path(os.environ.get("KP_KIMI_TOKENIZER") or REPO.parent / "shared" / "kimi-k2.5-tokenizer")
K25_TEMPLATE = BUNDLED / TIKTOKEN_NAME / "chat_template.jinja"  # the project's K2.5 template
from kimipipe.tokenize.load import load_tokenizer  # noqa: E402

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


def template_for(tokenizer: Path) -> Path | None:
    """The chat template a directory without one is given (Kimi K2.5's real files)."""
    has = (tokenizer / "chat_template.jinja").exists() or "chat_template" in json.loads(
        (tokenizer / "tokenizer_config.json").read_text(encoding="utf-8"))
    return None if has else K25_TEMPLATE


def run_kp(src: Path, out: Path, tokenizer: Path, trust: bool, workers: int) -> tuple[float, float]:
    """Wall seconds, and CPU seconds of the command and its worker processes."""
    args = [str(BIN / "kp-tokenize"), str(src), "--tokenizer", str(tokenizer), "--drop-text",
            "-q", "--workers", str(workers), "-o", str(out)]
    if trust:
        args.append("--trust-remote-code")
    template = template_for(tokenizer)
    if template:
        args += ["--chat-template", str(template)]
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


_REF: dict = {}  # the reference's state, set before the pool forks (inherited, not pickled)


def _ref_chunk(bounds: tuple[int, int]) -> tuple[int, int]:
    """Render, encode, join, decode and compare records[lo:hi]: (tokens, rows verified)."""
    tok, kind, records = _REF["tok"], _REF["kind"], _REF["records"][bounds[0]:bounds[1]]
    think_end, im_end = _REF["think_end"], _REF["im_end"]
    conversations = [r["messages"] for r in records]
    if _REF["batch_render"]:
        prompts = tok.apply_chat_template(conversations, tokenize=False, add_generation_prompt=True,
                                          thinking=True)
    else:
        prompts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True, thinking=True)
                   for c in conversations]
    reasonings = [r["response"]["reasoning"] for r in records]
    contents = [r["response"]["content"] for r in records]
    if kind == "fast":  # the Rust tokenizer itself, without transformers' wrapping
        backend = tok.backend_tokenizer
        backend.encode_special_tokens = False
        prompt_ids = [e.ids for e in backend.encode_batch(prompts, add_special_tokens=False)]
        backend.encode_special_tokens = True  # special-token strings in the text stay text
        texts = [e.ids for e in backend.encode_batch(reasonings + contents, add_special_tokens=False)]
    else:
        enc = tok.model
        prompt_ids = enc.encode_batch(prompts, num_threads=1, allowed_special="all")
        texts = enc.encode_ordinary_batch(reasonings + contents, num_threads=1)
    n = len(records)
    rows, expected = [], []
    for i, r in enumerate(records):
        cut = r["finish_reason"] == "length"
        out = texts[i] + [think_end] + texts[n + i] + ([] if cut else [im_end])
        rows.append(prompt_ids[i] + out)
        expected.append(prompts[i] + reasonings[i] + "</think>" + contents[i] + ("" if cut else "<|im_end|>"))
    decoded = (tok.backend_tokenizer.decode_batch(rows, skip_special_tokens=False) if kind == "fast"
               else tok.model.decode_batch(rows, num_threads=1))
    verified = sum(1 for d, e in zip(decoded, expected, strict=True) if d == e)
    return sum(len(x) for x in rows), verified


def _raw_chunk(bounds: tuple[int, int]) -> int:
    """A bare batch encode of records[lo:hi]'s texts (prompts already rendered): tokens."""
    tok, kind = _REF["tok"], _REF["kind"]
    prompts = _REF["prompts"][bounds[0]:bounds[1]]
    texts = _REF["texts"][2 * bounds[0]:2 * bounds[1]]
    if kind == "fast":
        backend = tok.backend_tokenizer
        backend.encode_special_tokens = False
        ids = [e.ids for e in backend.encode_batch(prompts, add_special_tokens=False)]
        backend.encode_special_tokens = True
        ids += [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    else:
        ids = tok.model.encode_batch(prompts, num_threads=1, allowed_special="all")
        ids += tok.model.encode_ordinary_batch(texts, num_threads=1)
    return sum(len(x) for x in ids)


class Reference:
    """The same work through the library's public API, one forked process per core."""

    def __init__(self, tokenizer: Path, trust: bool, src: Path, workers: int):
        import multiprocessing

        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the processes are the parallelism
        tok = load_tokenizer(tokenizer, trust_remote_code=trust, chat_template=(
            template_for(tokenizer).read_text(encoding="utf-8") if template_for(tokenizer) else None))
        kind = make_codec(tok).kind
        with open(src, encoding="utf-8") as f:
            records = [json.loads(line) for line in f]
        try:
            tok.apply_chat_template([records[0]["messages"]] * 2, tokenize=False,
                                    add_generation_prompt=True, thinking=True)[1].startswith("")
            batch_render = True
        except Exception:
            batch_render = False
        # the raw side's texts: rendered here, before the fork, and not timed
        prompts = [tok.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True,
                                           thinking=True) for r in records]
        texts = [t for r in records for t in (r["response"]["reasoning"], r["response"]["content"])]
        _REF.update(tok=tok, kind=kind, records=records, batch_render=batch_render,
                    think_end=tok.convert_tokens_to_ids("</think>"),
                    im_end=tok.convert_tokens_to_ids("<|im_end|>"), prompts=prompts, texts=texts)
        step = 256
        self.chunks = [(i, min(i + step, len(records))) for i in range(0, len(records), step)]
        self.pool = multiprocessing.get_context("fork").Pool(workers)
        self.pool.map(_ref_chunk, [(0, 1)] * workers * 2)  # warm up every worker
        self.tokens = None
        self.verified = None

    def run(self) -> tuple[float, float]:
        """Wall seconds, and CPU seconds of the pool's processes (which stay alive)."""
        cpu0 = self._cpu()
        t0 = time.perf_counter()
        results = self.pool.map(_ref_chunk, self.chunks, chunksize=1)
        wall = time.perf_counter() - t0
        self.tokens = sum(t for t, _ in results)
        self.verified = sum(v for _, v in results)
        return wall, self._cpu() - cpu0

    def run_raw(self) -> tuple[float, int, float]:
        """Wall seconds of the bare batch encode, the tokens it made, its CPU seconds."""
        cpu0 = self._cpu()
        t0 = time.perf_counter()
        tokens = sum(self.pool.map(_raw_chunk, self.chunks, chunksize=1))
        return time.perf_counter() - t0, tokens, self._cpu() - cpu0

    def _cpu(self) -> float:
        total = 0.0
        for p in self.pool._pool:  # the worker processes (multiprocessing keeps them here)
            with open(f"/proc/{p.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def close(self) -> None:
        self.pool.terminate()
        self.pool.join()


def bench(tokenizer: Path, trust: bool, records: int, workers: int, rounds: int, tmp: Path) -> dict:
    src = tmp / "responses.jsonl"
    one = tmp / "one.jsonl"
    make_responses(src, records)
    one.write_text(src.read_text(encoding="utf-8").split("\n", 1)[0] + "\n", encoding="utf-8")
    out = tmp / "tokens.jsonl"
    ref = Reference(tokenizer, trust, src, workers)
    kp_runs, ref_runs, startup_runs, raw_runs = [], [], [], []
    try:
        for _ in range(rounds):  # interleaved, so that load from elsewhere hits both sides alike
            startup_runs.append(run_kp(one, out, tokenizer, trust, workers))
            kp_runs.append(run_kp(src, out, tokenizer, trust, workers))
            ref_runs.append(ref.run())
            raw_runs.append(ref.run_raw())
    finally:
        ref.close()
    kp_tokens = 0
    with open(out, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            kp_tokens += len(rec["input_ids"]) + len(rec["output_ids"])
    startup_wall = min(w for w, _ in startup_runs)
    startup_cpu = min(c for _, c in startup_runs)
    wall = min(w for w, _ in kp_runs)
    cpu = min(c for _, c in kp_runs)
    ref_wall = min(w for w, _ in ref_runs)
    ref_cpu = min(c for _, c in ref_runs)
    return {
        "tokenizer": tokenizer.name, "records": records, "mb": src.stat().st_size / 1e6,
        "workers": workers, "kp_tokens": kp_tokens, "ref_tokens": ref.tokens,
        "ref_verified": ref.verified, "batch_render": _REF["batch_render"],
        "startup_s": startup_wall, "wall_s": wall, "ref_s": ref_wall,
        "kp_tok_s": kp_tokens / max(wall - startup_wall, 1e-9), "kp_tok_s_with_startup": kp_tokens / wall,
        "ref_tok_s": ref.tokens / ref_wall,
        "kp_cpu_s": cpu - startup_cpu, "ref_cpu_s": ref_cpu,
        "kp_rec_s": records / max(wall - startup_wall, 1e-9),
        "raw_s": min(w for w, _, _ in raw_runs), "raw_tokens": raw_runs[0][1],
        "raw_tok_s": raw_runs[0][1] / min(w for w, _, _ in raw_runs),
        "raw_rec_s": records / min(w for w, _, _ in raw_runs),
        "raw_cpu_s": min(c for _, _, c in raw_runs),
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
    dirs = args.tokenizer or [BUNDLED / FAST_NAME, BUNDLED / TIKTOKEN_NAME,
                              *([REAL] if (REAL / "tiktoken.model").exists() else [])]
    print(f"cores: {os.cpu_count()}, workers: {args.workers}, records: {args.records}")
    for d in dirs:
        with tempfile.TemporaryDirectory(prefix="kp-bench-") as tmp:
            r = bench(d, args.trust_remote_code, args.records, args.workers, args.rounds, Path(tmp))
        print(f"{r['tokenizer']}: {r['mb']:.1f} MB, {r['kp_tokens']:,} tokens "
              f"(reference {r['ref_tokens']:,}, {r['ref_verified']:,} of {r['records']:,} rows verified; "
              f"template rendered {'in batches' if r['batch_render'] else 'per record'})")
        print(f"  kp-tokenize: {r['kp_tok_s']:,.0f} tok/s steady ({r['wall_s']:.2f} s wall, "
              f"{r['startup_s']:.2f} s of it start-up; {r['kp_tok_s_with_startup']:,.0f} tok/s with start-up)")
        print(f"  reference (render, encode, decode, compare; {args.workers} processes): "
              f"{r['ref_tok_s']:,.0f} tok/s ({r['ref_s']:.3f} s)")
        print(f"  ratio kp/reference: {r['kp_tok_s'] / r['ref_tok_s']:.2f} steady, "
              f"{r['kp_tok_s_with_startup'] / r['ref_tok_s']:.2f} with start-up (target >= 0.8)")
        print(f"  CPU: kp-tokenize {r['kp_cpu_s']:.2f} s (all processes, start-up excluded), "
              f"reference {r['ref_cpu_s']:.2f} s; reference/kp {r['ref_cpu_s'] / r['kp_cpu_s']:.2f}")
        print(f"  raw batch encode of the same texts ({args.workers} processes): "
              f"{r['raw_tok_s']:,.0f} tok/s, {r['raw_rec_s']:,.0f} rec/s ({r['raw_s']:.3f} s, "
              f"{r['raw_cpu_s']:.2f} CPU-s; {r['raw_tokens']:,} tokens)")
        print(f"  kp-tokenize: {r['kp_rec_s']:,.0f} rec/s steady; ratio kp/raw: "
              f"{r['kp_tok_s'] / r['raw_tok_s']:.2f} tok/s, {r['kp_rec_s'] / r['raw_rec_s']:.2f} rec/s "
              f"(target >= 0.9), by CPU-s {r['raw_cpu_s'] / r['kp_cpu_s']:.2f}; "
              f"start-up {r['startup_s']:.2f} s on its own")


if __name__ == "__main__":
    main()
