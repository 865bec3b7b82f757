"""kp-infer's options, each declared once, on the typed field it fills: `InferOptions`
(kimipipe/options.py has the idiom), and `ReportOptions`, those of `kp-infer report`.

A new option is one field of InferOptions: its click declaration, its --help section, and
with `fills=` a part of RunConfig (Files, Money, Sending, Retries, IdentityCheck:
infer/config.py), RunConfig itself, RequestOptions or Policy, the field of that name it
goes to, as it is; when it is a new setting, that field too (its name and type checked against this
one at import). A value computed from several options (the served sampling preset, the
quantization default, the API key, ...) is computed by `run_config` in commands/infer.py,
which builds the run's RunConfig, its RequestOptions and its Policy; the options no record
takes choose what the command does (commands/infer.py reads them: --report, --html,
--preflight, --json). The declarations check themselves at import: an option without a
section, or filling a field that does not exist or is typed otherwise, fails every
kp-infer start (and tests/test_options.py).
"""

from __future__ import annotations

import functools
import json
import operator

import click

from ..errors import ExitCode, KPError
from ..openrouter import DEFAULT_BASE_URL
from ..openrouter.models import QUANTIZATIONS
from ..openrouter.request import RequestOptions
from ..openrouter.routing import Policy
from ..options import (
    COUNT,
    DEBUG,
    INPUT,
    OUTPUT,
    PARTITION,
    QUIET,
    CommandSettings,
    Quantity,
    argument,
    option,
)
from .config import Files, IdentityCheck, Money, Retries, RunConfig, Sending
from .conversations import HISTORY_POLICIES
from .identity import DEFAULT_STRIKES
from .preflight import DEFAULT_REQUESTS

# --help lists the options as a paying user reads them: what a run will cost and what stops
# it, where it may go, what it asks for, where its files go, then tuning.
MONEY = "Plan and money"
ROUTING = "Routing (which providers may answer)"
IDENTITY = "Identity (is each answer the target model's)"
REQUEST = "Request (what is asked)"
FILES = "Files and resume"
TUNING = "Tuning and connection"
OTHER = "Other options"
SECTIONS = [MONEY, ROUTING, IDENTITY, REQUEST, FILES, TUNING, OTHER]


def parse_extra_body(text: str | None) -> dict:
    if not text:
        return {}
    try:
        extra = json.loads(text)
    except json.JSONDecodeError as e:
        raise KPError(f"--extra-body is not valid JSON: {e}", ExitCode.USAGE) from None
    if not isinstance(extra, dict):
        raise KPError("--extra-body must be a JSON object", ExitCode.USAGE)
    return extra


# The options `kp-infer report` takes too (its caps, drawn in the page; its outputs).
MAX_COST = functools.partial(
    option, "--max-cost", type=click.FloatRange(min=0), default=None, metavar="USD",
    help="Cap on the cost recorded in OUTPUT across all runs; never exceeded "
         "(reaching it stops the run with exit 3).")
TOKEN_BUDGET = functools.partial(
    option, "--token-budget", type=COUNT, default=None,
    help="Cap on completion tokens recorded in OUTPUT across runs (accepts 10M, 500k); "
         "reaching it is done as asked (exit 0).")
TOTAL_COST = functools.partial(
    option, "--total-cost", type=click.FloatRange(min=0), default=None, metavar="USD",
    help="Cap on the cost recorded in OUTPUT, --failures and every --spent-in file "
         "together (a whole build); never exceeded (reaching it stops the run with exit 3).")
AS_JSON = functools.partial(
    option, "--json", is_flag=True,
    help="With --plan, --report or --preflight: the report as JSON on stdout.")
HTML = functools.partial(
    option, "--html", type=click.Path(dir_okay=False, allow_dash=True), default=None,
    metavar="OUT",
    help="With --report: write the build report, one self-contained HTML page of plots, to "
         "OUT instead (responses, failures, token records, rejects files, shard "
         "directories; --total-cost, --max-cost and --token-budget drawn as its caps). "
         "Needs the `report` extra (matplotlib).")


class InferOptions(CommandSettings):
    """kp-infer's command line, one field per option, in --help order."""

    input: str = INPUT(fills=Files)
    # -- Plan and money
    plan: bool = option(
        "--plan", is_flag=True, section=MONEY, fills=RunConfig,
        help="Send nothing: show allowed providers and the cost estimate (on stdout).")
    preflight: int | None = option(
        "--preflight", type=click.IntRange(min=1), default=None, metavar="[N]", section=MONEY,
        help=f"Before the long run: send N real requests (default {DEFAULT_REQUESTS}) and check "
             "what the run assumes (provider and quantization, reasoning, cost against the "
             "prices, the stream's shape, the balance and how many requests it covers at "
             "once); a pass/fail table on stdout, exit 4 on a failed check. The answers are "
             "kept in -o FILE (needed) like a run's.")
    max_cost: float | None = MAX_COST(section=MONEY, fills=Money)
    token_budget: int | None = TOKEN_BUDGET(section=MONEY, fills=Money)
    total_cost: float | None = TOTAL_COST(section=MONEY, fills=Money)
    spent_in: list[str] = option(
        "--spent-in", multiple=True, metavar="FILE", section=MONEY, fills=Money,
        help="A responses or failures file (or a glob) whose recorded spend counts against "
             "--total-cost (repeatable; read at start).")
    reservations: str | None = option(
        "--reservations", type=click.Path(dir_okay=False), default=None, metavar="FILE",
        section=MONEY, fills=Money,
        help="Share --total-cost with the kp-infer runs of this machine that name the same "
             "FILE (a JSON file, locked): their requests in flight are reserved against it too.")
    min_credits: float | None = option(
        "--min-credits", type=click.FloatRange(min=0), default=None, metavar="USD",
        section=MONEY, fills=Money,
        help="Stop admitting work when the account balance falls below USD (polled; exit 3).")
    credits_interval: float = option(
        "--credits-interval", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
        section=MONEY, fills=Money,
        help="Seconds between balance polls (the money in flight follows the balance; --min-credits).")
    cost_lookup_wait: float = option(
        "--cost-lookup-wait", type=click.FloatRange(min=0), default=30.0, show_default=True,
        metavar="SECONDS", section=MONEY, fills=Money,
        help="An answer whose usage shows no cost is booked at its worst price, then its "
             "cost is read from GET /generation for up to SECONDS before its record is "
             "written (else the estimate stays; docs/money.md).")
    sample: int | None = option(
        "--sample", type=click.IntRange(min=0), default=None, metavar="N", section=MONEY,
        fills=Files,
        help="Only the N prompts whose SHA-256 of id is smallest: the same N in every run "
             "(a pilot whose answers stay part of the data).")
    # -- Routing (which providers may answer)
    model: str = option(
        "-m", "--model", default="moonshotai/kimi-k2.5", show_default=True, section=ROUTING,
        fills=RequestOptions, help="OpenRouter model slug.")
    quantization: list[str] = option(
        "--quantization", multiple=True, type=click.Choice(QUANTIZATIONS), section=ROUTING,
        help="Allowed quantizations (repeatable). Default for Kimi K2.5: int4 and unknown "
             "(its native weights; first-party endpoints report unknown).")
    any_quantization: bool = option(
        "--any-quantization", is_flag=True, section=ROUTING,
        help="Drop the model's native-quantization default (re-quantized endpoints allowed).")
    ignore: list[str] = option(
        "--ignore-provider", multiple=True, metavar="SLUG", section=ROUTING, fills=Policy,
        help="Never route to this provider (repeatable; `deepinfra` also ignores `deepinfra/turbo`).")
    only: list[str] = option(
        "--only-provider", multiple=True, metavar="SLUG", section=ROUTING, fills=Policy,
        help="Route only to these providers (repeatable).")
    max_price_prompt: float | None = option(
        "--max-price-prompt", type=float, default=None, metavar="USD_PER_M", section=ROUTING,
        fills=Policy,
        help="provider.max_price.prompt (USD per million tokens): a hard filter and a price bound.")
    max_price_completion: float | None = option(
        "--max-price-completion", type=float, default=None, metavar="USD_PER_M",
        section=ROUTING, fills=Policy,
        help="provider.max_price.completion (USD per million tokens).")
    sort: str | None = option(
        "--sort", type=click.Choice(["price", "throughput", "latency"]), default=None,
        section=ROUTING, fills=Policy,
        help="OpenRouter's provider sort (turns off load balancing).")
    allow_fallbacks: bool = option(
        "--no-fallbacks", is_flag=True, convert=operator.not_, section=ROUTING, fills=Policy,
        help="provider.allow_fallbacks = false.")
    data_collection: str | None = option(
        "--data-collection", type=click.Choice(["allow", "deny"]), default=None,
        section=ROUTING, fills=Policy, help="provider.data_collection.")
    enforce_distillable_text: bool = option(
        "--allow-non-distillable", is_flag=True, convert=operator.not_, section=ROUTING,
        fills=Policy,
        help="Do not send provider.enforce_distillable_text (sent by default: the answers "
             "train a drafter, and a model whose authors forbid distillation must not "
             "be used for that).")
    # -- Identity (is each answer the target model's)
    tokenizer: str | None = option(
        "--tokenizer", default=None, metavar="DIR", section=IDENTITY, fills=IdentityCheck,
        help="The target model's tokenizer and chat template, as kp-tokenize takes them "
             "(a directory, or a model name in the local Hugging Face cache; nothing is "
             "downloaded): every answer's usage.prompt_tokens is checked against the "
             "prompt as that template renders it, and an answer that is not the target "
             "model's is refused and its prompt sent again (docs/kp-infer.md: identity). "
             "Without it, answers' identity is unchecked.")
    trust_remote_code: bool = option(
        "--trust-remote-code", is_flag=True, section=IDENTITY, fills=IdentityCheck,
        help="Run the tokenizer code the --tokenizer directory ships (Kimi K2.5's "
             "tokenization_kimi.py).")
    chat_template: str | None = option(
        "--chat-template", type=click.Path(exists=True, dir_okay=False), default=None,
        metavar="FILE", section=IDENTITY, fills=IdentityCheck,
        help="A Jinja chat template file to use instead of the --tokenizer directory's "
             "(as kp-tokenize's).")
    identity_strikes: int = option(
        "--identity-strikes", type=click.IntRange(min=1), default=DEFAULT_STRIKES,
        show_default=True, metavar="N", section=IDENTITY, fills=IdentityCheck,
        help="A provider with N answers refused for identity is quarantined: in "
             "provider.ignore for the rest of the run and for its resumes (kept in "
             "OUTPUT.identity.json).")
    # -- Request (what is asked)
    max_tokens: int = option(
        "--max-tokens", type=click.IntRange(min=1), default=16384, show_default=True,
        section=REQUEST, fills=RequestOptions,
        help="Completion cap per request (reasoning included); bounds the worst-case cost.")
    temperature: float | None = option(
        "--temperature", type=float, default=None, section=REQUEST,
        help="Sampling temperature. Default for Kimi K2.5: as served, 1.0 thinking, 0.6 with "
             "--no-reasoning; other models: not sent (each provider's own default).")
    top_p: float | None = option(
        "--top-p", type=float, default=None, section=REQUEST,
        help="Nucleus sampling. Default for Kimi K2.5: as served, 0.95.")
    seed: int | None = option(
        "--seed", type=int, default=None, section=REQUEST, fills=RequestOptions,
        help="Sampling seed.")
    reasoning: bool | None = option(
        "--reasoning/--no-reasoning", default=None, section=REQUEST,
        help="Ask for reasoning (default: the model's).")
    reasoning_effort: str | None = option(
        "--reasoning-effort",
        type=click.Choice(["max", "xhigh", "high", "medium", "low", "minimal", "none"]),
        default=None, section=REQUEST, fills=RequestOptions,
        help="OpenRouter's reasoning.effort.")
    require_parameters: bool = option(
        "--no-require-parameters", is_flag=True, convert=operator.not_, section=REQUEST,
        fills=RequestOptions,
        help="Do not send provider.require_parameters with the sampling parameters (by "
             "default sent, so no provider drops temperature/top_p silently).")
    logprobs: bool | None = option(
        "--logprobs/--no-logprobs", default=None, section=REQUEST, fills=RequestOptions,
        help="Ask for token logprobs (logprobs: true, top_logprobs: 0): the tokens the model "
             "sampled, kept in each record (sampled_tokens) for kp-tokenize to use as IDs. "
             "Not a routing requirement of its own, but provider.require_parameters (sent "
             "with the sampling) makes it one: --plan shows which endpoints list them. "
             "Default for Kimi K2.5: asked where that leaves no allowed endpoint out.")
    require_logprobs: bool = option(
        "--require-logprobs", is_flag=True, section=REQUEST, fills=RequestOptions,
        help="Ask for token logprobs and route only to endpoints that list them "
             "(provider.require_parameters).")
    extra_body: dict = option(
        "--extra-body", default=None, metavar="JSON", convert=parse_extra_body,
        section=REQUEST, fills=RequestOptions,
        help="JSON object merged into every request body (anything else OpenRouter accepts).")
    history_reasoning: str | None = option(
        "--history-reasoning", type=click.Choice(HISTORY_POLICIES), default=None,
        section=REQUEST,
        help="A conversation's earlier turns in its history: with their reasoning "
             "(keep) or their content only (drop). Default: as the model's template "
             "renders history (Kimi K2.5: drop; K2.6's preserve_thinking: keep).")
    # -- Files and resume
    output: str = OUTPUT(
        help="Output file, appended to and resumed from (`-` = stdout, no resume).",
        section=FILES, fills=Files)
    failures: str | None = option(
        "--failures", type=click.Path(), default=None, section=FILES, fills=Files,
        help="Append permanent failures here (JSONL: id, kind, status, code, message, attempts, "
             "and for answers paid for and refused, provider, cost and refused).")
    summary_json: str | None = option(
        "--summary-json", type=click.Path(), default=None, section=FILES, fills=Files,
        help="Write the final summary here as JSON (`-`: stdout, when -o is a file).")
    done_files: list[str] = option(
        "--done", multiple=True, type=click.Path(), section=FILES, fills=Files,
        help="Another responses file whose IDs count as done (repeatable).")
    rescue_dir: str | None = option(
        "--rescue", type=click.Path(), default=None, metavar="DIR", section=FILES,
        fills=Files,
        help="Where answers paid for that the output cannot take (a full disk) are kept "
             "for the next run, which takes them in first; give the same DIR to that run "
             "(default: kimipipe-rescue-UID in the temp dir). Best on another filesystem.")
    min_free_disk: int = option(
        "--min-free-disk", type=Quantity("size", 1024, minimum=0), default="64M",
        show_default=True, metavar="BYTES", section=FILES, fills=Files,
        help="Free space kept on the output's filesystem beyond the worst case of the "
             "requests in flight (accepts 500M, 2G); below it admission waits for disk.")
    disk_wait: float = option(
        "--disk-wait", type=click.FloatRange(min=0), default=600.0, show_default=True,
        metavar="S", section=FILES, fills=Files,
        help="Seconds to wait for disk room with nothing in flight before stopping "
             "(exit 3, resumable).")
    partition: tuple[int, int] | None = PARTITION(section=FILES, fills=Files)
    allow_mixed: bool = option(
        "--allow-mixed", is_flag=True, section=FILES, fills=Files,
        help="Resume into an output whose records were asked with another model, "
             "sampling or history policy (refused by default, exit 2).")
    report_files: list[str] = option(
        "--report", multiple=True, type=click.Path(allow_dash=True), metavar="FILE",
        section=FILES,
        help="Send nothing: compare the providers in these responses/failures files (repeatable; "
             "also `kp-infer report FILE...`): a table and a histogram on stdout; token "
             "records add the provider counts against kimipipe's.")
    as_json: bool = AS_JSON(section=FILES)
    html: str | None = HTML(section=FILES)
    # -- Tuning and connection
    concurrency: int = option(
        "--concurrency", type=click.IntRange(min=1), default=64, show_default=True,
        section=TUNING, fills=Sending,
        help="Requests in flight at most (the limit adapts down on 429s and back up). "
             "64 suits a first try; the user's runs in the README use 2000 (one client "
             "holds 2000 in flight: see docs/performance.md).")
    servers: list[str] = option(
        "--server", multiple=True, metavar="URL[#NAME]", section=TUNING, fills=Sending,
        help="A self-hosted OpenAI-compatible server (vLLM, SGLang) to send prompts to, "
             "e.g. http://gpu1:30000/v1 (repeatable); #NAME: the name it serves --model "
             "under (else GET /v1/models tells). No provider object, balance or "
             "endpoints table; thinking by chat_template_kwargs; the sampled token IDs "
             "kept (sampled_ids). Without --openrouter, OpenRouter gets nothing. "
             "See docs/servers.md.")
    server_concurrency: int = option(
        "--server-concurrency", type=click.IntRange(min=1), default=64, show_default=True,
        section=TUNING, fills=Sending, help="Requests in flight at most per --server.")
    use_openrouter: bool = option(
        "--openrouter", is_flag=True, section=TUNING,
        help="With --server: send to OpenRouter too (up to --concurrency in flight there); "
             "each prompt goes to whichever has room. Implied without --server.")
    max_attempts: int = option(
        "--max-attempts", type=click.IntRange(min=1), default=8, show_default=True,
        section=TUNING, fills=Retries,
        help="Attempts per prompt before it is recorded as failed (this run); an answer "
             "refused (routing, no reasoning, a think tag) counts as one.")
    backoff_base: float = option(
        "--backoff-base", type=click.FloatRange(min=0), default=1.0, show_default=True,
        section=TUNING, fills=Retries,
        help="First retry delay in seconds (doubles per attempt, jittered, max 60 s).")
    grace: float = option(
        "--grace", type=click.FloatRange(min=0), default=300.0, show_default=True,
        section=TUNING, fills=Retries,
        help="Seconds a stop waits for requests in flight (they are paid for) before cancelling.")
    idle_timeout: float = option(
        "--idle-timeout", type=click.FloatRange(min=0.01), default=180.0, show_default=True,
        section=TUNING, fills=Sending,
        help="Seconds without data (keep-alive comments don't count) before an attempt is retried.")
    stream: bool = option(
        "--stream/--no-stream", default=True, show_default=True, section=TUNING,
        fills=RequestOptions, help="Stream answers (SSE).")
    proxy: str | None = option(
        "--proxy", default=None, metavar="URL", section=TUNING, fills=Sending,
        help="Send every request through this HTTP proxy (http://[USER:PASSWORD@]HOST:PORT), "
             "instead of HTTPS_PROXY/HTTP_PROXY/NO_PROXY. The password is never printed.")
    base_url: str = option(
        "--base-url", envvar="OPENROUTER_BASE_URL", default=DEFAULT_BASE_URL, show_default=True,
        section=TUNING, fills=Sending, help="API base URL (or OPENROUTER_BASE_URL).")
    api_key_file: str | None = option(
        "--api-key-file", type=click.Path(), default=None, section=TUNING,
        help="Read the API key from this file (default: OPENROUTER_API_KEY).")
    # -- Other options (--version and -h follow); --quiet silences stderr, and
    # run_command shows tracebacks with --debug
    quiet: bool = QUIET(section=OTHER)
    debug: bool = DEBUG(section=OTHER)

    @property
    def openrouter(self) -> bool:
        """OpenRouter is a source with --openrouter, or without any --server."""
        return self.use_openrouter or not self.servers


class ReportOptions(CommandSettings):
    """`kp-infer report FILE...`: the files, the caps its page draws, where it goes."""

    files: list[str] = argument(nargs=-1, required=True, metavar="FILE...",
                                type=click.Path(allow_dash=True))
    max_cost: float | None = MAX_COST()
    token_budget: int | None = TOKEN_BUDGET()
    total_cost: float | None = TOTAL_COST()
    html: str | None = HTML()
    as_json: bool = AS_JSON()
    quiet: bool = QUIET()
    debug: bool = DEBUG(hidden=True)
