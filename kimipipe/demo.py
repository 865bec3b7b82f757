"""The offline demo (`make demo`): the whole pipeline, end to end, without spending a cent.

Starts the OpenRouter stand-in on a free port of 127.0.0.1 (with faults and a rate limit
switched on, so the retries are real), then runs the Makefile's own `make all` for one
dataset, `demo`, built from the bundled ShareGPT sample (kimipipe/data/demo/) with the
bundled small Kimi-style tokenizer, exactly as a real build runs against OpenRouter: the
checks and the money plan first (TOTAL_COST=2, at the stand-in's prices), then the stages,
then `make report` (the build report, WORK/report.html). Then it prints what was made
(records, tokens, spend as billed by the stand-in, retries survived, the report's path),
and the stand-in is stopped, also when the demo is interrupted.

    python -m kimipipe.demo --out demo-out
    python -m kimipipe.demo --row              # then: one finished row, decoded
    python -m kimipipe.demo --row ID --tokens work/B3.tokens.jsonl.zst --tokenizer ./kimi-k2.5
                                               # a row of your own build
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
import msgspec

from .cli import kp_command
from .contracts import read_summary
from .io import iter_records
from .options import CommandSettings, option
from .records import Prompt
from .shard.readback import read_manifest
from .standin.testing import StandIn

PACKAGE = Path(__file__).resolve().parent
REPO = PACKAGE.parent
DEMO_SOURCE = PACKAGE / "data" / "demo" / "sharegpt.json"
DEMO_TOKENIZER = PACKAGE / "data" / "tokenizers" / "kimi-k2.5-mini-tiktoken"
FAULTS = {"429": 0.05, "502": 0.02, "503": 0.02, "error200": 0.02, "midstream": 0.02, "cut": 0.02,
          "empty": 0.01, "misroute": 0.02}


def run_demo(out: Path, make: str = "make", venv: str = ".venv", quiet_make: bool = False) -> dict:
    if out.exists():
        shutil.rmtree(out)  # a demo starts from nothing, so that it shows every stage
    out.mkdir(parents=True)
    work, shards = out / "work", out / "shards"
    # the stand-in counts usage with the build's tokenizer, as a provider serving the model
    # counts it with the model's own: kp-infer checks every answer's counts against it
    with StandIn(latency=0.2, tokens_per_second=400, faults=FAULTS, retry_after=0.2, seed=7,
                 ledger=True, tokenizer=DEMO_TOKENIZER, workdir=out / "standin") as server:
        print(f"demo: OpenRouter stand-in listening on {server.base_url} "
              f"(faults: {', '.join(f'{k} {v:.0%}' for k, v in FAULTS.items())})", file=sys.stderr)
        env = {**os.environ, "OPENROUTER_API_KEY": server.api_key}
        cmd = [*make.split(), "-C", str(REPO), "all", "report", "DATASETS=demo", f"VENV={venv}",
               f"SOURCE_demo={DEMO_SOURCE}", f"WORK={work}", f"SHARDS={shards}",
               f"BASE_URL={server.base_url}", f"TOKENIZER={DEMO_TOKENIZER}",
               "CONCURRENCY=64", "TOTAL_COST=2", "MAX_COST=2", "TOKEN_BUDGET=", "MAX_TOKENS=2048",
               "MIN_CREDITS=1",
               "INFER_FLAGS=--backoff-base 0.2 --idle-timeout 10",
               "SHARD_FLAGS=--records-per-shard 100 --eval-fraction 0.05"]
        if quiet_make:
            cmd.append("--quiet")
        code = subprocess.call(cmd, env=env)
        if code != 0:
            raise SystemExit(f"demo: the build failed (make exit {code})")
        stats = server.stats()
    infer = read_summary(str(work / "demo.infer-summary.json"))
    manifest = read_manifest(str(shards / "demo"))
    totals = manifest.totals
    report = {
        "prompts": infer.input_records,
        # a conversation asks each of its user turns: one request, one answer each
        "requests": sum(1 + len(p.follow_ups) for _n, p, _l in iter_records(
            str(work / "demo.prompts.jsonl"), msgspec.json.Decoder(Prompt))),
        "responses": infer.done,
        "failed": infer.failed,
        "retries_survived": infer.retries,
        "spend_billed_by_standin_usd": round(stats["total_usage"], 6),
        "spend_recorded_usd": infer.spend_total,
        "shards": len(manifest.shards),
        "shard_records": totals.records,
        "input_tokens": totals.input_tokens,
        "output_tokens": totals.output_tokens,
        "out": str(out),
        "report": str(work / "report.html"),
    }
    return report


def show_row(out: Path, row_id: str | None, tokens: Path | None = None,
             tokenizer: Path | str = DEMO_TOKENIZER) -> str:
    """One record of a tokens file (the demo's, or TOKENS: a build's WORK/D.tokens.jsonl.zst),
    the first or ROW_ID (a conversation's id: its first turn), with its IDs decoded by TOKENIZER (the one that made them): what
    kp-shard turns into a training row."""
    from .io import iter_records
    from .tokenize.load import load_tokenizer, offline_environment, prepare_tokenizer_dir

    path = tokens if tokens is not None else out / "work" / "demo.tokens.jsonl.zst"
    if not path.exists():
        raise SystemExit(f"demo: {path} does not exist: " + (
            "give a tokens file of your build (WORK/D.tokens.jsonl.zst)" if tokens is not None
            else "run `make demo` first, or give --tokens FILE of your own build"))
    for _lineno, record, _line in iter_records(str(path), msgspec.json.Decoder()):
        # a conversation's id names its first turn (its rows are `<id>#<turn>`)
        if row_id is None or record["id"] in (row_id, f"{row_id}#1"):
            break
    else:
        raise SystemExit(f"demo: no row {row_id!r} in {path}")
    offline_environment()
    tok = load_tokenizer(prepare_tokenizer_dir(str(tokenizer), True), trust_remote_code=True)
    ins, outs = record["input_ids"], record["output_ids"]
    return "\n".join([
        f"{path}: row {record['id']} (dataset {record['dataset']})",
        f"input_ids   {len(ins)} tokens: {ins[:12]} ...",
        f"output_ids  {len(outs)} tokens: {outs[:12]} ...",
        "decoded input (the chat template, as the target saw it):",
        "  " + tok.decode(ins)[-300:].replace("\n", "\n  "),
        "decoded output (what the target wrote, reasoning first):",
        "  " + tok.decode(outs)[:300].replace("\n", "\n  ") + " ...",
    ])


# --help: the module's text, its examples (the indented block) kept as written
_HELP, _, _EXAMPLES = __doc__.partition("\n\n    python")


class DemoSettings(CommandSettings):
    out: str = option("--out", default="demo-out", help="where the demo writes (replaced)")
    make: str = option("--make", default="make", help="the make command to run")
    venv: str = option("--venv", default=".venv", help="the virtual environment make uses")
    row: str | None = option(
        "--row", is_flag=False, flag_value="", default=None, metavar="[ID]",
        help="run nothing: show one finished row of an earlier demo, decoded")
    tokens: str | None = option(
        "--tokens", metavar="FILE",
        help="with --row: a tokens file of your own build instead (WORK/D.tokens.jsonl.zst, "
             "or kp-tokenize's -o)")
    tokenizer: str | None = option(
        "--tokenizer", metavar="DIR",
        help="with --tokens: the tokenizer that made it (the build's TOKENIZER)")


@kp_command("python -m kimipipe.demo", settings=DemoSettings, help=_HELP,
            examples="    python" + _EXAMPLES, exit_codes="Exit codes: 0 done; 1 the build failed (make's "
            "exit code in the message); 2 a bad option; 130 interrupted (the stand-in is stopped).")
def command(args: DemoSettings) -> None:
    if (args.tokens or args.tokenizer) and args.row is None:
        raise click.UsageError("--tokens and --tokenizer go with --row")
    if bool(args.tokens) != bool(args.tokenizer):  # IDs decoded by another tokenizer read as noise
        raise click.UsageError("--tokens and --tokenizer go together: the tokens file and the "
                               "TOKENIZER that made it")
    if args.row is not None:
        print(show_row(Path(args.out).resolve(), args.row or None,
                       Path(args.tokens) if args.tokens else None,
                       args.tokenizer or DEMO_TOKENIZER))
        return
    try:
        report = run_demo(Path(args.out).resolve(), args.make, args.venv)
    except KeyboardInterrupt:
        print("demo: interrupted; the stand-in is stopped", file=sys.stderr)
        raise SystemExit(130) from None
    retries = ", ".join(f"{k}: {v}" for k, v in report["retries_survived"].items()) or "none"
    print(
        "\n".join([
            "",
            "demo: done, offline, against the OpenRouter stand-in",
            f"  prompts        {report['prompts']} conversations, {report['requests']} requests "
            "(one per user turn)",
            f"  answers        {report['responses']} of the requests (failed: "
            f"{sum(report['failed'].values())})",
            f"  retries        {retries}",
            f"  spend          ${report['spend_billed_by_standin_usd']:.6f} billed by the stand-in, "
            f"${report['spend_recorded_usd']:.6f} recorded by kp-infer",
            f"  shards         {report['shards']} files, {report['shard_records']} rows, "
            f"{report['input_tokens']} input + {report['output_tokens']} output tokens (verified)",
            f"  everything in  {report['out']}/ (work/: prompts, responses, tokens; shards/demo/)",
            f"  build report   {report['report']} (open it in a browser)",
            "  (the stand-in counts usage with the bundled mini tokenizer, as a provider counts",
            "   with the model's own: kp-infer checked every answer's counts against it, and",
            "   would have refused another model's. Against OpenRouter: the real Kimi tokenizer.)",
            "",
            "next: look at a row:  .venv/bin/python -m kimipipe.demo --row",
            "next: a real run:     docs/real-run.md, the checklist (make check, plan, preflight, pilot, all)",
        ]),
        file=sys.stderr,
    )


def main(argv: list[str] | None = None) -> None:
    command.main(args=argv, prog_name="python -m kimipipe.demo")


if __name__ == "__main__":
    main()
