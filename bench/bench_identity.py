"""kp-infer with --tokenizer (each answer's identity checked) against the same run without.

    .venv/bin/python bench/bench_identity.py                 # 4000 streams at 2000 in flight
    .venv/bin/python bench/bench_identity.py --repeat 3 --mode plain
    .venv/bin/python bench/bench_identity.py --tokenizer kimipipe/data/tokenizers/kimi-k2.5-mini-fast

The target is Kimi K2.5's real tokenizer (163,840 tokens: `../shared/kimi-k2.5-tokenizer`,
or KP_KIMI_TOKENIZER, given the project's K2.5 chat template in a directory of links, as
tests/conftest.py's `real_tokenizer` does), or `--tokenizer DIR`. The stand-in counts usage
with the same tokenizer (every answer passes: what is measured is the checking, not
refusals). Each repeat runs the real command on the same workload, one run after the
other, each against a fresh stand-in: `reference` without --tokenizer (the warning that
identity is unchecked), `identity` with it (`--trust-remote-code`), each once with the one
first prompt (its start, and one request) and once with all of them. Printed per run, as
JSON lines:
  cpu_ms_per_request  user+system CPU of kp-infer's whole process tree (start-up
                      included) per request
  steady_cpu_ms_per_request  the same without the start: (CPU of the whole run - CPU of
                      the one-prompt run) / (requests - 1)
  startup_s           wall time minus the run's own elapsed time: process start, imports,
                      validation, the endpoints fetch, and with --tokenizer the tokenizer's
                      load (the difference of the two is what a start with it adds)
  wall_s, first_answer  (the identity run holds 16 requests in flight until a first answer
                      is found the target's: infer/identity.py PROBATION; its wall is about
                      one answer's time longer)
and per repeat the ratios identity / reference of CPU per request, steady and with the
start, and what the start adds (wall and CPU), then their medians over the repeats (the
targets: steady CPU per request <= 1.2x; a start with the real tokenizer adds at most a
few seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_infer import run_client, write_prompts  # noqa: E402

from kimipipe.standin.testing import StandIn  # noqa: E402

BIN = Path(sys.executable).parent
REAL = Path(os.environ.get("KP_KIMI_TOKENIZER") or REPO.parent / "shared" / "kimi-k2.5-tokenizer")
TEMPLATE = REPO / "kimipipe" / "data" / "tokenizers" / "kimi-k2.5-mini-tiktoken" / "chat_template.jinja"


def real_tokenizer(tmp: Path) -> Path:
    """Kimi K2.5's real tokenizer files, linked, with the project's K2.5 chat template."""
    if not (REAL / "tiktoken.model").is_file():
        raise SystemExit(f"Kimi K2.5's real tokenizer is not in {REAL} (KP_KIMI_TOKENIZER=DIR, "
                         "or --tokenizer DIR)")
    d = tmp / "kimi-k2.5-real"
    d.mkdir()
    for f in sorted(REAL.iterdir()):
        if f.is_file():
            (d / f.name).symlink_to(f.resolve())
    (d / "chat_template.jinja").write_bytes(TEMPLATE.read_bytes())
    return d


def one_run(name: str, tmp: Path, prompts: Path, tokenizer: Path, args, requests: int) -> dict:
    stream = args.mode == "stream"
    out = tmp / f"{name}.jsonl"
    summary = tmp / f"{name}.summary.json"
    with StandIn(latency=args.latency, tokens_per_second=args.tokens_per_second if stream else None,
                 tokenizer=tokenizer, workdir=tmp / f"standin-{name}") as server:
        env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
        cmd = [str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--base-url", server.base_url,
               "--concurrency", str(args.concurrency), "--max-tokens", str(args.max_tokens),
               "--quiet", "--stream" if stream else "--no-stream", "--idle-timeout", "600",
               "--summary-json", str(summary)]
        if name == "identity":
            cmd += ["--tokenizer", str(tokenizer), "--trust-remote-code"]
        measured = run_client(cmd, env)
    result = json.loads(summary.read_text())
    assert result["done"] == requests, result
    if name == "identity":
        rows = result["identity"]["providers"]
        assert sum(r["checked"] for r in rows) == requests and not any(r["refused"] for r in rows)
    out.unlink()
    return {"run": name, "mode": args.mode, "requests": requests,
            "concurrency": args.concurrency, "wall_s": round(measured["wall_s"], 2),
            "cpu_s": round(measured["cpu_s"], 3),
            "cpu_ms_per_request": round(1000 * measured["cpu_s"] / requests, 4),
            "startup_s": round(measured["wall_s"] - result["elapsed_s"], 2),
            "peak_rss_mb": round(measured["peak_rss_mb"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["stream", "plain"], default="stream")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=8.0)
    parser.add_argument("--tokens-per-second", type=float, default=40.0)
    parser.add_argument("--max-tokens", type=int, default=100,
                        help="the stand-in's answers cut at this many words (~100 chunks each)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="default: Kimi K2.5's real tokenizer (see above)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kp-bench-identity-") as tmp:
        tmp = Path(tmp)
        tokenizer = args.tokenizer.resolve() if args.tokenizer else real_tokenizer(tmp)
        prompts, first = tmp / "prompts.jsonl", tmp / "first.jsonl"
        write_prompts(prompts, args.requests)
        write_prompts(first, 1)
        steady, whole, start, start_cpu = [], [], [], []
        for k in range(args.repeat):
            runs = {}
            for name in ("reference", "identity"):
                one = one_run(name, tmp, first, tokenizer, args, 1)
                row = one_run(name, tmp, prompts, tokenizer, args, args.requests)
                row["steady_cpu_ms_per_request"] = round(
                    1000 * (row["cpu_s"] - one["cpu_s"]) / (args.requests - 1), 4)
                row["one_prompt_cpu_s"], row["repeat"] = one["cpu_s"], k + 1
                print(json.dumps(row), flush=True)
                runs[name] = row
            ref, ident = runs["reference"], runs["identity"]
            steady.append(ident["steady_cpu_ms_per_request"] / ref["steady_cpu_ms_per_request"])
            whole.append(ident["cpu_ms_per_request"] / ref["cpu_ms_per_request"])
            start.append(ident["startup_s"] - ref["startup_s"])
            start_cpu.append(ident["one_prompt_cpu_s"] - ref["one_prompt_cpu_s"])
            print(json.dumps({"repeat": k + 1,
                              "steady_cpu_per_request_identity_over_reference": round(steady[-1], 4),
                              "cpu_per_request_with_start_identity_over_reference": round(whole[-1], 4),
                              "startup_added_s": round(start[-1], 2),
                              "startup_added_cpu_s": round(start_cpu[-1], 2)}), flush=True)
        print(json.dumps({"tokenizer": str(tokenizer), "mode": args.mode, "repeats": args.repeat,
                          "requests": args.requests, "concurrency": args.concurrency,
                          "median_steady_cpu_per_request_ratio": round(statistics.median(steady), 4),
                          "median_cpu_per_request_ratio_with_start": round(statistics.median(whole), 4),
                          "median_startup_added_s": round(statistics.median(start), 2),
                          "median_startup_added_cpu_s": round(statistics.median(start_cpu), 2),
                          "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                          "load": os.getloadavg()[0]}), flush=True)


if __name__ == "__main__":
    main()
