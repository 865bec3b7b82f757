"""What an identity quarantine costs at the user's scale: answers paid for and refused.

    .venv/bin/python bench/bench_identity_quarantine.py                  # this checkout only
    git archive 3269b59 | tar -x -C /tmp/kp-before                      # the code before
    .venv/bin/python bench/bench_identity_quarantine.py --before /tmp/kp-before

kp-infer --tokenizer at `--concurrency 2000` (`--no-stream`: the stand-in holds each answer
`--latency` seconds, so that the requests are in flight as long as a real run's; with
`--stream`, streamed at `--tokens-per-second`: what a quarantine can cancel, each stream
of the quarantined provider closed, `--bill-cancelled` when the provider bills it all the
same), against
the stand-in counting usage with the same tokenizer (the bundled mini one by default:
`--tokenizer DIR` for another) and five providers, four honest ones that overcount by
+0, +1, +2, +3 as the Kimi Vendor Verifier allows (`--usage-offset`) and Fireworks, in
each scenario:
  switch  honest for `--switch-after` answers, then another model (a redirect under a
          running job: DeepInfra announced one for K2.5)
  new     another model from its first answer (a host new to the run that redirects)
  late    the same with `--identity-strikes 40`: it outlives admission's probation (16 in
          flight until every provider is trusted or 64 answers judged), as a host that
          first answers after it does; what the small share bounds
  honest  honest too (+0): what the checks cost a run that has only honest providers
Each scenario runs with this checkout's kp-infer, and with `--before DIR` also with the
kimipipe exported there (the stand-in is this checkout's either way), one after the other,
each against a fresh stand-in. Printed per run, as JSON lines, from the stand-in's ledger
and kp-infer's records:
  impostor_paid_refused  answers the other model gave (every one after its first wrong
                         answer, all refused: the waste a quarantine cannot avoid once
                         they are in flight), and their USD
  honest_refused         honest answers refused (the band: none)
  cancelled              streams closed at the quarantine (refused for identity, paid for
                         at GET /generation's figure: $0 where the provider stops billing)
  quarantined            the providers kp-infer quarantined
  usd_paid, wall_s       the whole run's bill and wall time
and per scenario the ratios this / before. The figures are in bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
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
MINI = REPO / "kimipipe" / "data" / "tokenizers" / "kimi-k2.5-mini-fast"
HONEST = {"moonshotai": 0, "together": 1, "deepinfra": 2, "parasail": 3}
ROUTED = ("--quantization", "int4", "--quantization", "unknown", "--quantization", "nvfp4")


def scenario_settings(name: str, switch_after: int) -> dict:
    if name == "honest":
        return {"usage_offsets": {**HONEST, "fireworks": 0}}
    after = switch_after if name == "switch" else 1  # (new, late)
    return {"usage_offsets": HONEST, "impostors": {"fireworks": after}}


def one_run(code: str, scenario: str, tmp: Path, prompts: Path, args) -> dict:
    run_dir = tmp / f"{code}-{scenario}"
    run_dir.mkdir()
    out, summary = run_dir / "out.jsonl", run_dir / "summary.json"
    streaming = {"latency": 0.2, "tokens_per_second": args.tokens_per_second} if args.stream \
        else {"latency": args.latency}
    with StandIn(tokenizer=args.tokenizer, ledger=True, bill_cancelled=args.bill_cancelled,
                 **streaming,
                 workdir=run_dir / "standin", start_timeout=120,
                 **scenario_settings(scenario, args.switch_after)) as server:
        env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
        # each kimipipe from its own directory (an older commit's worker processes, started
        # with `python -m`, put the working directory first), as bench_infer.py's --kp-pythonpath does
        env["PYTHONPATH"] = cwd = str(args.before if code == "before" else REPO)
        cmd = [str(BIN / "kp-infer"), str(prompts), "-o", str(out), "--base-url",
               server.base_url, "--concurrency", str(args.concurrency),
               *(() if args.stream else ("--no-stream",)),
               "--max-tokens", "100", "--quiet", "--idle-timeout", "600",
               "--summary-json", str(summary), "--tokenizer", str(args.tokenizer), *ROUTED,
               *(("--identity-strikes", "40") if scenario == "late" else ())]
        measured = run_client(cmd, env, cwd)
        ledger = server.ledger()
    result = json.loads(summary.read_text())
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == args.requests, (len(records), result)
    cancelled = [r for rec in records for r in rec["refused"]
                 if r["message"].startswith("stream closed after")]
    impostor = [x for x in ledger if x.get("impostor")]
    impostor_ids = {x["generation_id"] for x in impostor}
    refused = [r for rec in records for r in rec["refused"]]
    # (a cancelled stream the provider did not bill is in no ledger line: not an honest one)
    honest_refused = [r for r in refused if r["generation_id"] not in impostor_ids
                      and not r["message"].startswith("stream closed after")]
    return {"code": code, "scenario": scenario, "requests": args.requests,
            "concurrency": args.concurrency,
            "impostor_paid_refused": len(impostor),
            "impostor_usd": round(sum(x["cost"] for x in impostor), 6),
            "honest_refused": len(honest_refused),
            "cancelled": len(cancelled), "stream": args.stream,
            "bill_cancelled": args.bill_cancelled,
            "quarantined": [q["provider"] for q in result["identity"]["quarantined"]],
            "usd_paid": round(sum(x["cost"] for x in ledger), 6),
            "wall_s": round(measured["wall_s"], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=8.0)
    parser.add_argument("--switch-after", type=int, default=200)
    parser.add_argument("--stream", action="store_true",
                        help="streamed requests (what a quarantine can cancel), each lasting "
                             "its answer's tokens at --tokens-per-second")
    parser.add_argument("--tokens-per-second", type=float, default=60.0)
    parser.add_argument("--bill-cancelled", action="store_true",
                        help="the stand-in bills a generation whose stream was closed")
    parser.add_argument("--scenario", action="append",
                        choices=["switch", "new", "late", "honest"])
    parser.add_argument("--tokenizer", type=Path, default=MINI)
    parser.add_argument("--before", type=Path, default=None,
                        help="run kp-infer's kimipipe from DIR too (`git archive` of the "
                             "commit before) for a before/after in one session")
    args = parser.parse_args()
    args.tokenizer = args.tokenizer.resolve()
    codes = ["this"] + (["before"] if args.before else [])
    with tempfile.TemporaryDirectory(prefix="kp-bench-quarantine-") as tmp:
        tmp = Path(tmp)
        prompts = tmp / "prompts.jsonl"
        write_prompts(prompts, args.requests)
        for scenario in args.scenario or ["switch", "new", "late", "honest"]:
            rows = {}
            for code in codes:
                rows[code] = one_run(code, scenario, tmp, prompts, args)
                print(json.dumps(rows[code]), flush=True)
            if "before" in rows:
                this, before = rows["this"], rows["before"]
                print(json.dumps({
                    "scenario": scenario,
                    "impostor_paid_refused_this_over_before": round(
                        this["impostor_paid_refused"] / max(1, before["impostor_paid_refused"]), 4),
                    "honest_refused": [this["honest_refused"], before["honest_refused"]],
                    "usd_paid_this_over_before": round(this["usd_paid"] / before["usd_paid"], 4),
                    "wall_this_over_before": round(this["wall_s"] / before["wall_s"], 4),
                    "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "load": os.getloadavg()[0]}), flush=True)


if __name__ == "__main__":
    main()
