"""kp-infer: prompt records in, response records out, through OpenRouter, within budget.

Usage:
    export OPENROUTER_API_KEY=sk-or-...
    kp-infer B3.prompts.jsonl --plan --quantization int4 --quantization unknown
    kp-infer B3.prompts.jsonl -o B3.responses.jsonl --preflight      # 3 real requests, checked
    kp-infer B3.prompts.jsonl -o B3.responses.jsonl --concurrency 2000 \\
        --quantization int4 --quantization unknown --max-cost 95 --token-budget 10M \\
        --tokenizer ./kimi-k2.5 --trust-remote-code                    # identity checked
    kp-infer report B3.responses.jsonl B3.failures.jsonl               # providers compared
    kp-infer report work/*.jsonl work/*.zst shards/ --html report.html # the build, plotted

For Kimi K2.5, no --quantization flag means int4 and unknown (its native weights).

Schema (one JSON object per line): the prompt record's fields plus
    {"response": {"content": str, "reasoning": str|null}, "finish_reason": str,
     "model": str, "provider": str, "generation_id": str,
     "usage": {"prompt_tokens", "completion_tokens", "reasoning_tokens", "cost"},
     "attempts": int, "sampling": {"max_tokens", "temperature"?, "top_p"?, "seed"?, ...,
     "reasoning"?, "require_parameters"?}, "refused": [{"kind", "provider", "cost",
     "generation_id", "message", "offset"?}], "latency_s": float, "finished_at": str,
     "api": str, "identity": {"prompt_tokens", "completion_tokens"?, "offset"} | null}
("api": the base URL's host that answered; the stand-in's generation ids begin gen-standin-.
"identity": with --tokenizer, kimipipe's counts the answer was checked against: an answer
whose usage counts are not the target model's is refused and sent again, a provider refused
--identity-strikes times quarantined, here and in resumes: OUTPUT.identity.json; docs/kp-infer.md.)

For Kimi K2.5, what you do not set is sampled as served (thinking: temperature 1.0,
top_p 0.95; --no-reasoning: 0.6, 0.95), with provider.require_parameters. Token logprobs
(the tokens the model sampled, kept as `sampled_tokens` for kp-tokenize) are asked with
--logprobs, required with --require-logprobs, and by default for Kimi where asking leaves
no allowed endpoint out (kimipipe/openrouter/logprobs.py).

A whole build's cap: --total-cost USD counts the spend recorded in OUTPUT, --failures and
every --spent-in file (globs allowed); runs at the same time share it through
--reservations FILE. --sample N answers only the N prompts whose SHA-256 of id is
smallest (a pilot: its answers stay in OUTPUT, and the full run resumes from them).
--plan prints its report on stdout (--json: one JSON object).

Resume: rerun the same command. IDs already in OUTPUT (and in `--done` files) are
skipped; a torn last line left by a crash is repaired and its prompt redone; spend and
tokens recorded in OUTPUT count against `--max-cost` and `--token-budget`. OUTPUT or
--failures holding answers of another API (their "api") is refused, exit 2: answers of
two APIs never mix. --spent-in counts only the spend of this run's API.
The whole input is validated before the first request (so it is read twice; stdin is
spooled to a temporary file).

One writer per output: OUTPUT and the --failures file are locked for the run (a lock file
beside each); a second kp-infer on either exits 2 at once, naming who holds it.
A full disk: a request is admitted only while OUTPUT's filesystem has room for its
worst-case record (max_tokens at 16 bytes a token, the prompt line, 2 KiB) plus everything
in flight plus --min-free-disk; below that admission waits ("waiting for disk") and goes
on when space is freed, or, with nothing in flight, stops after --disk-wait seconds
(exit 3); a filesystem without room for one request is exit 3 at the start. A write that still fails cuts OUTPUT back to its last whole record
and stops the run (exit 3); the answers paid for that it could not take are kept in a
rescue file under --rescue DIR (printed; see kimipipe/infer/rescue.py for the path rule),
and the next run over the same OUTPUT, given the same --rescue (or none), takes them in
before it sends anything.

Exit codes: 0 done as asked: every prompt answered, or --token-budget reached (the summary
says `"stop_reason": "token-budget"`; raise it and rerun to continue); 2 bad input, flags,
an output that cannot be written or is locked by another run, key (401) or routing (404),
or every allowed provider quarantined for serving another model (--tokenizer);
3 stopped by money (--max-cost, --total-cost, --min-credits, OpenRouter's balance, the
key's limit or a workspace/guardrail budget: raise the budget or add credits; no prompt is
failed for it) or by a full disk (free some space): rerun to resume; an in-flight 402 is
a wait, not a stop; 4 done but some prompts
failed permanently (see --failures; a rerun retries them); 1 the output could not be
written (an I/O error); 130 interrupted (rerun to resume). --preflight: 0 every check
passed (warnings allowed), 4 one failed.
"""

from __future__ import annotations

import click

from ..cli import KPCommand, KPGroup, kp_command, run_command, sigterm_as_ctrl_c
from ..errors import ExitCode, KPError
from ..infer.config import Files, IdentityCheck, Money, Retries, RunConfig, Sending
from ..infer.options import SECTIONS, InferOptions, ReportOptions
from ..infer.preflight import DEFAULT_REQUESTS, run_preflight
from ..infer.report_files import format_report, read_report, report_json
from ..infer.run import run_infer
from ..openrouter.api_key import read_api_key
from ..openrouter.models import default_quantizations, history_reasoning_default, served_sampling
from ..openrouter.request import RequestOptions
from ..openrouter.routing import Policy
from ..options import fields_for
from ..terminal import Stderr

EXAMPLES = """
    kp-infer B3.prompts.jsonl --plan --max-cost 95
    kp-infer B3.prompts.jsonl --plan --json | jq .cost.expected
    kp-infer B3.prompts.jsonl -o B3.responses.jsonl --sample 200
    kp-infer B4.prompts.jsonl -o B4.responses.jsonl --total-cost 95 \\
        --spent-in 'work/*.responses.jsonl' --spent-in 'work/*.failures.jsonl'
    kp-infer B3.prompts.jsonl -o B3.responses.jsonl --concurrency 2000 \\
        --quantization int4 --quantization unknown --max-cost 95 --token-budget 10M \\
        --failures B3.failures.jsonl --summary-json B3.summary.json \\
        --tokenizer ./kimi-k2.5 --trust-remote-code
    kp-prompts questions.txt --format text | kp-infer --max-cost 1 > answers.jsonl
    kp-infer B3.prompts.jsonl -o B3.responses.jsonl --preflight
    kp-infer report B3.responses.jsonl B3.failures.jsonl
    kp-infer report work/B3.* shards/B3 --html B3.html --max-cost 95 --token-budget 10M
"""


class _Run(KPCommand):
    """`--preflight` takes an optional N: followed by anything but a number, it is 3."""

    def parse_args(self, ctx, args):
        args = [f"--preflight={DEFAULT_REQUESTS}" if arg == "--preflight"
                and not (i + 1 < len(args) and args[i + 1].isdigit()) else arg
                for i, arg in enumerate(args)]
        return super().parse_args(ctx, args)


@kp_command("kp-infer", settings=InferOptions, sections=SECTIONS, examples=EXAMPLES, cls=_Run,
            epilog=(
    "Also: `kp-infer report FILE...` (= --report FILE ...): the providers compared, from "
    "responses and failures files on disk; the report on stdout (--json for JSON); with "
    "--html OUT, the build plotted in one HTML page from any of its files (docs/report.md)."))
def run(o: InferOptions) -> int:
    """Send prompt records (default: stdin) to OpenRouter; write response records."""
    say = Stderr(o.quiet)
    if o.html and not o.report_files:
        raise KPError("--html goes with --report (kp-infer report FILE... --html OUT)", ExitCode.USAGE)
    if o.report_files:
        return _report(o.report_files, o.html, o.as_json, o.total_cost, o.max_cost,
                       o.token_budget, say)
    if o.as_json and not (o.plan or o.preflight is not None):
        raise KPError("--json goes with --plan, --report or --preflight", ExitCode.USAGE)
    if o.use_openrouter and not o.servers:
        raise KPError("--openrouter goes with --server (without --server, OpenRouter is the "
                      "only source)", ExitCode.USAGE)
    if (o.spent_in or o.reservations) and o.total_cost is None:
        raise KPError(f"{'--spent-in' if o.spent_in else '--reservations'} needs --total-cost",
                      ExitCode.USAGE)
    config = run_config(o)
    with sigterm_as_ctrl_c():  # a `kill` or a stopped container: exit 130 with the summary
        if o.preflight is not None:
            return run_preflight(config, o.preflight, o.as_json, say, click.echo)
        return run_infer(config, say)


@kp_command("kp-infer report", settings=ReportOptions, examples="""
    kp-infer report B3.responses.jsonl B3.failures.jsonl
    kp-infer report work/*.responses.jsonl --json
    kp-infer report work/B3.* shards/B3 --html B3.html --max-cost 95 --token-budget 10M
""")
def report(o: ReportOptions) -> int:
    """The providers compared, from responses and failures files on disk (= --report FILE
    ...): per provider its answers, failures, cost, tokens and latency, and a histogram; on
    stdout. With --html OUT, the build plotted in one HTML page from any of its files
    (docs/report.md). Sends nothing, needs no key."""
    return _report(o.files, o.html, o.as_json, o.total_cost, o.max_cost, o.token_budget,
                   Stderr(o.quiet))


def _report(files: list[str], html: str | None, as_json: bool, total_cost: float | None,
            max_cost: float | None, token_budget: int | None, say: Stderr) -> int:
    if html:
        from ..report import BuildLimits, write_report  # (the shard readers: only here)
        settings = BuildLimits(total_cost=total_cost, max_cost=max_cost, token_budget=token_budget)
        write_report(files, settings, html, say)
        if html != "-":
            say(f"kp-infer: the build report is in {html}")
        return ExitCode.OK
    table = read_report(files, say)
    click.echo(report_json(table) if as_json else format_report(table))
    return ExitCode.OK


def run_config(o: InferOptions) -> RunConfig:
    """The run's configuration from the options (`fills=` says which field each goes to)."""
    # The model's served sampling where the user set none (user flags win), and the
    # preset's mode said in the body (and so in each record).
    served = served_sampling(o.model, o.reasoning, o.reasoning_effort)
    reasoning = True if (served is not None and o.reasoning is None
                         and o.reasoning_effort is None) else o.reasoning
    served = served or {}
    request = RequestOptions(
        **fields_for(o, RequestOptions), reasoning=reasoning,
        temperature=o.temperature if o.temperature is not None else served.get("temperature"),
        top_p=o.top_p if o.top_p is not None else served.get("top_p"))
    if request.require_logprobs and request.logprobs is False:
        raise KPError("--require-logprobs and --no-logprobs: one or the other", ExitCode.USAGE)
    if request.require_logprobs and not request.require_parameters:
        raise KPError("--require-logprobs sends provider.require_parameters, which holds for "
                      "every parameter sent, the sampling too: it cannot go with "
                      "--no-require-parameters", ExitCode.USAGE)
    # the model's native quantizations unless given (or --any-quantization)
    policy = Policy(**fields_for(o, Policy), quantizations=default_quantizations(
        o.model, o.quantization, o.any_quantization))
    policy.required_parameters = request.enforced_parameters(policy)
    try:
        request.sampling(policy)
    except ValueError as e:
        raise KPError(str(e), ExitCode.USAGE) from None
    return RunConfig(
        **fields_for(o, RunConfig), request=request, policy=policy,
        files=Files(**fields_for(o, Files)), money=Money(**fields_for(o, Money)),
        retries=Retries(**fields_for(o, Retries)),
        identity=IdentityCheck(**fields_for(o, IdentityCheck)),
        sending=Sending(
            **fields_for(o, Sending), openrouter=o.openrouter,
            # needed unless --plan; none without OpenRouter
            api_key=read_api_key(o.api_key_file, required=not o.plan) if o.openrouter else ""),
        history_reasoning=o.history_reasoning or history_reasoning_default(o.model),
        plan_json=o.as_json and o.plan)


cli = KPGroup(run, [report])
main = run_command(cli)
