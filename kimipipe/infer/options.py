"""kp-infer's options, each declared once: its click declaration, the field it fills and
its --help section (kimipipe/cli.py: Declared, OptionTable).

A new option is one entry here (and, when it is a new setting, its field in RunConfig,
RequestOptions or Policy). `fills="config.max_cost"` copies the value into that field as
it is (`convert=` on the way; a repeatable option fills a list); a Derived names what is
computed from several options (the served sampling preset, the quantization default, the
API key, ...) and computes it here; `DISPATCH` options choose what the command does
(commands/infer.py reads them). The table checks itself at import: an option without a
section or a field fails every kp-infer start (and tests/test_filters.py).

`run_config(bundle)` builds the run's RunConfig, its RequestOptions and its Policy from the
parsed options; commands/infer.py checks the combinations first.
"""

from __future__ import annotations

import json
import operator

import click

from ..cli import (
    COUNT,
    DEBUG,
    MESSAGES,
    QUIET,
    Declared,
    Derived,
    OptionTable,
    Parsed,
    Quantity,
    input_argument,
    output_option,
    partition_option,
    read_api_key,
)
from ..errors import ExitCode, KPError
from ..openrouter import DEFAULT_BASE_URL
from ..openrouter.models import (
    QUANTIZATIONS,
    default_quantizations,
    history_reasoning_default,
    served_sampling,
)
from ..openrouter.request import RequestOptions
from ..openrouter.routing import Policy
from .config import RunConfig
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
SECTIONS = (MONEY, ROUTING, IDENTITY, REQUEST, FILES, TUNING, OTHER)


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


def _served(o: Parsed) -> dict:
    """The model's served sampling where the user set none (user flags win), and the
    preset's mode said in the body (and so in each record)."""
    served = served_sampling(o.model, o.reasoning, o.reasoning_effort)
    reasoning = o.reasoning
    if served is not None and reasoning is None and o.reasoning_effort is None:
        reasoning = True
    served = served or {}
    return {"temperature": o.temperature if o.temperature is not None else served.get("temperature"),
            "top_p": o.top_p if o.top_p is not None else served.get("top_p"),
            "reasoning": reasoning}


def _openrouter(o: Parsed) -> bool:
    """OpenRouter is a source with --openrouter, or without any --server."""
    return o.use_openrouter or not o.servers


# What is computed rather than copied; the record it goes to and how.
SERVED_SAMPLING = Derived("the served sampling preset (Kimi K2.5's, under the user's flags)",
                          "request", _served)
QUANTIZATION_DEFAULT = Derived(
    "the model's native quantizations unless given (or --any-quantization)", "policy",
    lambda o: {"quantizations": default_quantizations(o.model, o.quantization, o.any_quantization)})
HISTORY_DEFAULT = Derived(
    "the history policy of the model's template unless given", "config",
    lambda o: {"history_reasoning": o.history_reasoning or history_reasoning_default(o.model)})
SOURCES = Derived("OpenRouter a source or not (--server without --openrouter: not)", "config",
                  lambda o: {"openrouter": _openrouter(o)})
API_KEY = Derived(
    "the API key: --api-key-file or OPENROUTER_API_KEY (needed unless --plan; none without "
    "OpenRouter)", "config",
    lambda o: {"api_key": read_api_key(o.api_key_file, required=not o.plan) if _openrouter(o) else ""})
PLAN_JSON = Derived("--json: the plan as JSON (with --plan; also --report's and --preflight's)",
                    "config", lambda o: {"plan_json": o.as_json and o.plan})
# What the command does (commands/infer.py reads them): the report, the preflight or a run
DISPATCH = Derived("dispatch: --report [--html] / --preflight / the run")


OPTIONS = OptionTable("kp-infer", [
    input_argument().at("config.input"),
    # -- Plan and money
    Declared("--plan", is_flag=True, fills="config.plan", section=MONEY,
             help="Send nothing: show allowed providers and the cost estimate (on stdout)."),
    Declared("--preflight", type=click.IntRange(min=1), default=None, metavar="[N]",
             fills=DISPATCH, section=MONEY,
             help=f"Before the long run: send N real requests (default {DEFAULT_REQUESTS}) and check "
                  "what the run assumes (provider and quantization, reasoning, cost against the "
                  "prices, the stream's shape, the balance and how many requests it covers at "
                  "once); a pass/fail table on stdout, exit 4 on a failed check. The answers are "
                  "kept in -o FILE (needed) like a run's."),
    Declared("--max-cost", type=click.FloatRange(min=0), default=None, metavar="USD",
             fills="config.max_cost", section=MONEY,
             help="Cap on the cost recorded in OUTPUT across all runs; never exceeded "
                  "(reaching it stops the run with exit 3)."),
    Declared("--token-budget", type=COUNT, default=None, fills="config.token_budget", section=MONEY,
             help="Cap on completion tokens recorded in OUTPUT across runs (accepts 10M, 500k); "
                  "reaching it is done as asked (exit 0)."),
    Declared("--total-cost", type=click.FloatRange(min=0), default=None, metavar="USD",
             fills="config.total_cost", section=MONEY,
             help="Cap on the cost recorded in OUTPUT, --failures and every --spent-in file "
                  "together (a whole build); never exceeded (reaching it stops the run with exit 3)."),
    Declared("--spent-in", multiple=True, metavar="FILE", fills="config.spent_in", section=MONEY,
             help="A responses or failures file (or a glob) whose recorded spend counts against "
                  "--total-cost (repeatable; read at start)."),
    Declared("--reservations", type=click.Path(dir_okay=False), default=None, metavar="FILE",
             fills="config.reservations", section=MONEY,
             help="Share --total-cost with the kp-infer runs of this machine that name the same "
                  "FILE (a JSON file, locked): their requests in flight are reserved against it too."),
    Declared("--min-credits", type=click.FloatRange(min=0), default=None, metavar="USD",
             fills="config.min_credits", section=MONEY,
             help="Stop admitting work when the account balance falls below USD (polled; exit 3)."),
    Declared("--credits-interval", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
             fills="config.credits_interval", section=MONEY,
             help="Seconds between balance polls (the money in flight follows the balance; --min-credits)."),
    Declared("--cost-lookup-wait", type=click.FloatRange(min=0), default=30.0, show_default=True,
             metavar="SECONDS", fills="config.cost_lookup_wait", section=MONEY,
             help="An answer whose usage shows no cost is booked at its worst price, then its "
                  "cost is read from GET /generation for up to SECONDS before its record is "
                  "written (else the estimate stays; docs/money.md)."),
    Declared("--sample", type=click.IntRange(min=0), default=None, metavar="N",
             fills="config.sample", section=MONEY,
             help="Only the N prompts whose SHA-256 of id is smallest: the same N in every run "
                  "(a pilot whose answers stay part of the data)."),
    # -- Routing (which providers may answer)
    Declared("-m", "--model", default="moonshotai/kimi-k2.5", show_default=True,
             fills="request.model", section=ROUTING, help="OpenRouter model slug."),
    Declared("--quantization", multiple=True, type=click.Choice(QUANTIZATIONS),
             fills=QUANTIZATION_DEFAULT, section=ROUTING,
             help="Allowed quantizations (repeatable). Default for Kimi K2.5: int4 and unknown "
                  "(its native weights; first-party endpoints report unknown)."),
    Declared("--any-quantization", is_flag=True, fills=QUANTIZATION_DEFAULT, section=ROUTING,
             help="Drop the model's native-quantization default (re-quantized endpoints allowed)."),
    Declared("--ignore-provider", multiple=True, metavar="SLUG", fills="policy.ignore", section=ROUTING,
             help="Never route to this provider (repeatable; `deepinfra` also ignores `deepinfra/turbo`)."),
    Declared("--only-provider", multiple=True, metavar="SLUG", fills="policy.only", section=ROUTING,
             help="Route only to these providers (repeatable)."),
    Declared("--max-price-prompt", type=float, default=None, metavar="USD_PER_M",
             fills="policy.max_price_prompt", section=ROUTING,
             help="provider.max_price.prompt (USD per million tokens): a hard filter and a price bound."),
    Declared("--max-price-completion", type=float, default=None, metavar="USD_PER_M",
             fills="policy.max_price_completion", section=ROUTING,
             help="provider.max_price.completion (USD per million tokens)."),
    Declared("--sort", type=click.Choice(["price", "throughput", "latency"]), default=None,
             fills="policy.sort", section=ROUTING,
             help="OpenRouter's provider sort (turns off load balancing)."),
    Declared("--no-fallbacks", is_flag=True, fills="policy.allow_fallbacks", convert=operator.not_,
             section=ROUTING, help="provider.allow_fallbacks = false."),
    Declared("--data-collection", type=click.Choice(["allow", "deny"]), default=None,
             fills="policy.data_collection", section=ROUTING, help="provider.data_collection."),
    Declared("--allow-non-distillable", is_flag=True, fills="policy.enforce_distillable_text",
             convert=operator.not_, section=ROUTING,
             help="Do not send provider.enforce_distillable_text (sent by default: the answers "
                  "train a drafter, and a model whose authors forbid distillation must not "
                  "be used for that)."),
    # -- Identity (is each answer the target model's)
    Declared("--tokenizer", default=None, metavar="DIR", fills="config.tokenizer",
             section=IDENTITY,
             help="The target model's tokenizer and chat template, as kp-tokenize takes them "
                  "(a directory, or a model name in the local Hugging Face cache; nothing is "
                  "downloaded): every answer's usage.prompt_tokens is checked against the "
                  "prompt as that template renders it, and an answer that is not the target "
                  "model's is refused and its prompt sent again (docs/kp-infer.md: identity). "
                  "Without it, answers' identity is unchecked."),
    Declared("--trust-remote-code", is_flag=True, fills="config.trust_remote_code",
             section=IDENTITY,
             help="Run the tokenizer code the --tokenizer directory ships (Kimi K2.5's "
                  "tokenization_kimi.py)."),
    Declared("--chat-template", type=click.Path(exists=True, dir_okay=False), default=None,
             metavar="FILE", fills="config.chat_template", section=IDENTITY,
             help="A Jinja chat template file to use instead of the --tokenizer directory's "
                  "(as kp-tokenize's)."),
    Declared("--identity-strikes", type=click.IntRange(min=1), default=DEFAULT_STRIKES,
             show_default=True, metavar="N", fills="config.identity_strikes", section=IDENTITY,
             help="A provider with N answers refused for identity is quarantined: in "
                  "provider.ignore for the rest of the run and for its resumes (kept in "
                  "OUTPUT.identity.json)."),
    # -- Request (what is asked)
    Declared("--max-tokens", type=click.IntRange(min=1), default=16384, show_default=True,
             fills="request.max_tokens", section=REQUEST,
             help="Completion cap per request (reasoning included); bounds the worst-case cost."),
    Declared("--temperature", type=float, default=None, fills=SERVED_SAMPLING, section=REQUEST,
             help="Sampling temperature. Default for Kimi K2.5: as served, 1.0 thinking, 0.6 with "
                  "--no-reasoning; other models: not sent (each provider's own default)."),
    Declared("--top-p", type=float, default=None, fills=SERVED_SAMPLING, section=REQUEST,
             help="Nucleus sampling. Default for Kimi K2.5: as served, 0.95."),
    Declared("--seed", type=int, default=None, fills="request.seed", section=REQUEST,
             help="Sampling seed."),
    Declared("--reasoning/--no-reasoning", default=None, fills=SERVED_SAMPLING, section=REQUEST,
             help="Ask for reasoning (default: the model's)."),
    Declared("--reasoning-effort",
             type=click.Choice(["max", "xhigh", "high", "medium", "low", "minimal", "none"]),
             default=None, fills="request.reasoning_effort", section=REQUEST,
             help="OpenRouter's reasoning.effort."),
    Declared("--no-require-parameters", is_flag=True, fills="request.require_parameters",
             convert=operator.not_, section=REQUEST,
             help="Do not send provider.require_parameters with the sampling parameters (by "
                  "default sent, so no provider drops temperature/top_p silently)."),
    Declared("--logprobs/--no-logprobs", default=None, fills="request.logprobs", section=REQUEST,
             help="Ask for token logprobs (logprobs: true, top_logprobs: 0): the tokens the model "
                  "sampled, kept in each record (sampled_tokens) for kp-tokenize to use as IDs. "
                  "Not a routing requirement of its own, but provider.require_parameters (sent "
                  "with the sampling) makes it one: --plan shows which endpoints list them. "
                  "Default for Kimi K2.5: asked where that leaves no allowed endpoint out."),
    Declared("--require-logprobs", is_flag=True, fills="request.require_logprobs", section=REQUEST,
             help="Ask for token logprobs and route only to endpoints that list them "
                  "(provider.require_parameters)."),
    Declared("--extra-body", default=None, metavar="JSON", fills="request.extra_body",
             convert=parse_extra_body, section=REQUEST,
             help="JSON object merged into every request body (anything else OpenRouter accepts)."),
    Declared("--history-reasoning", type=click.Choice(HISTORY_POLICIES), default=None,
             fills=HISTORY_DEFAULT, section=REQUEST,
             help="A conversation's earlier turns in its history: with their reasoning "
                  "(keep) or their content only (drop). Default: as the model's template "
                  "renders history (Kimi K2.5: drop; K2.6's preserve_thinking: keep)."),
    # -- Files and resume
    output_option("Output file, appended to and resumed from (`-` = stdout, no resume).").at(
        "config.output", FILES),
    Declared("--failures", type=click.Path(), default=None, fills="config.failures", section=FILES,
             help="Append permanent failures here (JSONL: id, kind, status, code, message, attempts, "
                  "and for answers paid for and refused, provider, cost and refused)."),
    Declared("--summary-json", type=click.Path(), default=None, fills="config.summary_json",
             section=FILES, help="Write the final summary here as JSON (`-`: stdout, when -o is a file)."),
    Declared("--done", "done_files", multiple=True, type=click.Path(), fills="config.done_files",
             section=FILES, help="Another responses file whose IDs count as done (repeatable)."),
    Declared("--rescue", "rescue_dir", type=click.Path(), default=None, metavar="DIR",
             fills="config.rescue_dir", section=FILES,
             help="Where answers paid for that the output cannot take (a full disk) are kept "
                  "for the next run, which takes them in first; give the same DIR to that run "
                  "(default: kimipipe-rescue-UID in the temp dir). Best on another filesystem."),
    Declared("--min-free-disk", type=Quantity("size", 1024, minimum=0), default="64M",
             show_default=True, metavar="BYTES", fills="config.min_free_disk", section=FILES,
             help="Free space kept on the output's filesystem beyond the worst case of the "
                  "requests in flight (accepts 500M, 2G); below it admission waits for disk."),
    Declared("--disk-wait", type=click.FloatRange(min=0), default=600.0, show_default=True,
             metavar="S", fills="config.disk_wait", section=FILES,
             help="Seconds to wait for disk room with nothing in flight before stopping "
                  "(exit 3, resumable)."),
    partition_option.at("config.partition", FILES),
    Declared("--allow-mixed", is_flag=True, fills="config.allow_mixed", section=FILES,
             help="Resume into an output whose records were asked with another model, "
                  "sampling or history policy (refused by default, exit 2)."),
    Declared("--report", "report_files", multiple=True, type=click.Path(allow_dash=True),
             metavar="FILE", fills=DISPATCH, section=FILES,
             help="Send nothing: compare the providers in these responses/failures files (repeatable; "
                  "also `kp-infer report FILE...`): a table and a histogram on stdout; token "
                  "records add the provider counts against kimipipe's."),
    Declared("--json", "as_json", is_flag=True, fills=PLAN_JSON, section=FILES,
             help="With --plan, --report or --preflight: the report as JSON on stdout."),
    Declared("--html", type=click.Path(dir_okay=False, allow_dash=True), default=None, metavar="OUT",
             fills=DISPATCH, section=FILES,
             help="With --report: write the build report, one self-contained HTML page of plots, to "
                  "OUT instead (responses, failures, token records, rejects files, shard "
                  "directories; --total-cost, --max-cost and --token-budget drawn as its caps). "
                  "Needs the `report` extra (matplotlib)."),
    # -- Tuning and connection
    Declared("--concurrency", type=click.IntRange(min=1), default=64, show_default=True,
             fills="config.concurrency", section=TUNING,
             help="Requests in flight at most (the limit adapts down on 429s and back up). "
                  "64 suits a first try; the user's runs in the README use 2000 (one client "
                  "holds 2000 in flight: see docs/performance.md)."),
    Declared("--server", "servers", multiple=True, metavar="URL[#NAME]", fills="config.servers",
             section=TUNING,
             help="A self-hosted OpenAI-compatible server (vLLM, SGLang) to send prompts to, "
                  "e.g. http://gpu1:30000/v1 (repeatable); #NAME: the name it serves --model "
                  "under (else GET /v1/models tells). No provider object, balance or "
                  "endpoints table; thinking by chat_template_kwargs; the sampled token IDs "
                  "kept (sampled_ids). Without --openrouter, OpenRouter gets nothing. "
                  "See docs/servers.md."),
    Declared("--server-concurrency", type=click.IntRange(min=1), default=64, show_default=True,
             fills="config.server_concurrency", section=TUNING,
             help="Requests in flight at most per --server."),
    Declared("--openrouter", "use_openrouter", is_flag=True, fills=SOURCES, section=TUNING,
             help="With --server: send to OpenRouter too (up to --concurrency in flight there); "
                  "each prompt goes to whichever has room. Implied without --server."),
    Declared("--max-attempts", type=click.IntRange(min=1), default=8, show_default=True,
             fills="config.max_attempts", section=TUNING,
             help="Attempts per prompt before it is recorded as failed (this run); an answer "
                  "refused (routing, no reasoning, a think tag) counts as one."),
    Declared("--backoff-base", type=click.FloatRange(min=0), default=1.0, show_default=True,
             fills="config.backoff_base", section=TUNING,
             help="First retry delay in seconds (doubles per attempt, jittered, max 60 s)."),
    Declared("--grace", type=click.FloatRange(min=0), default=300.0, show_default=True,
             fills="config.grace", section=TUNING,
             help="Seconds a stop waits for requests in flight (they are paid for) before cancelling."),
    Declared("--idle-timeout", type=click.FloatRange(min=0.01), default=180.0, show_default=True,
             fills="config.idle_timeout", section=TUNING,
             help="Seconds without data (keep-alive comments don't count) before an attempt is retried."),
    Declared("--workers", type=click.IntRange(min=0), default=None, fills="config.workers",
             section=TUNING,
             help="Worker processes for the HTTP work (default: in this process when at most 256 "
                  "requests can be in flight, else the number of cores; 0 = in this process)."),
    Declared("--stream/--no-stream", default=True, show_default=True, fills="request.stream",
             section=TUNING, help="Stream answers (SSE)."),
    Declared("--proxy", default=None, metavar="URL", fills="config.proxy", section=TUNING,
             help="Send every request through this HTTP proxy (http://[USER:PASSWORD@]HOST:PORT), "
                  "instead of HTTPS_PROXY/HTTP_PROXY/NO_PROXY. The password is never printed."),
    Declared("--base-url", envvar="OPENROUTER_BASE_URL", default=DEFAULT_BASE_URL, show_default=True,
             fills="config.base_url", section=TUNING, help="API base URL (or OPENROUTER_BASE_URL)."),
    Declared("--api-key-file", type=click.Path(), default=None, fills=API_KEY, section=TUNING,
             help="Read the API key from this file (default: OPENROUTER_API_KEY)."),
    # -- Other options (--version and -h follow)
    QUIET.at(MESSAGES, OTHER),
    DEBUG.at(MESSAGES, OTHER),
], sections=SECTIONS, records={"config": RunConfig, "request": RequestOptions, "policy": Policy})


def run_config(o: Parsed) -> RunConfig:
    """The run's configuration from the parsed options (OPTIONS says which field each fills)."""
    request = RequestOptions(**OPTIONS.fields("request", o))
    if request.require_logprobs and request.logprobs is False:
        raise KPError("--require-logprobs and --no-logprobs: one or the other", ExitCode.USAGE)
    if request.require_logprobs and not request.require_parameters:
        raise KPError("--require-logprobs sends provider.require_parameters, which holds for "
                      "every parameter sent, the sampling too: it cannot go with "
                      "--no-require-parameters", ExitCode.USAGE)
    policy = Policy(**OPTIONS.fields("policy", o))
    policy.required_parameters = request.enforced_parameters(policy)
    try:
        request.sampling(policy)
    except ValueError as e:
        raise KPError(str(e), ExitCode.USAGE) from None
    return RunConfig(request=request, policy=policy, **OPTIONS.fields("config", o))
