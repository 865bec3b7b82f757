"""The files kimipipe's commands leave for each other that are not records: one Struct each.

records.py holds what flows down the pipeline line by line; this module holds the other
files that cross a process or a stage. Each is written by encoding its Struct and read by
decoding it (a reader never walks a dict), so the schema is declared here once:

    file                              written by                      read by
    WORK/D.plan.json                  kp-infer --plan --json          make/build_plan.py
    (InferPlan)                       (infer/plan.py)                 (make plan, make all)
    --summary-json FILE               kp-infer (infer/report.py)      make/stop.py (make's
    (InferSummary)                                                    money-stop message:
                                                                      SummaryStop)
    --reservations FILE               kp-infer --total-cost           the other runs sharing
    (Reservations)                    (infer/total_cost.py)           the cap
    kp-infer report --json (stdout)   kp-infer report                 scripts
    (InferReport)                     (infer/report_files.py)
    WORK/D.pilot.json                 make pilot (make/measure.py)    make/build_plan.py
    (PilotFigures)
    WORK/build.plan.json              make plan (make/build_plan.py)  scripts, tests
    (BuildPlanFile)
    .NAME.lock beside an output       every resumable stage           the next run on it
    (LockHolder)                      (locks.py)
    DIR/kp-shard.manifest             kp-shard (shard/build.py)       kp-shard verify/stats,
    (ShardManifest)                                                   card, trainers, make
    OUTPUT.identity.json              kp-infer --tokenizer            its resumes (resume.py),
    (IdentityState)                   (infer/identity.py)             kp-infer report

The keys and their order are those the files have always had (tests and users read them).
Schema evolution as for records: new fields get defaults, types never change.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct

from .errors import InputError

# -- kp-infer --plan --json -----------------------------------------------------------------


class PlanPrompts(Struct):
    input: int  # records in the input
    todo: int
    done: int  # already in the output (skipped)
    sample: int | None = None  # --sample


class PlanRequests(Struct):
    """The requests the input makes: a conversation's turns each count (conversations.py)."""

    input: int
    todo: int
    conversations: int = 0  # prompts with follow_ups in the input
    conversations_todo: int = 0
    history_reasoning: str = "drop"
    history_answer_tokens: float = 0.0  # what each earlier answer adds to a later prompt
    history_answer_measured: bool = False  # measured in the output (a pilot's), else assumed


class PlanPromptTokens(Struct):
    estimated: int  # in all, at ~4 bytes a token
    per_prompt: float
    bound: int  # the prompts' token bound, in all (infer/budget.py)


class PlanRoute(Struct):
    """One endpoint of the model's table, and the routing flags' verdict on it."""

    provider: str
    tag: str | None
    quantization: str | None
    prompt_price: float  # USD per million tokens
    completion_price: float
    verdict: str  # "allowed", or why it is excluded
    allowed: bool


class PricePair(Struct):
    prompt: float  # USD per million tokens
    completion: float


class PlanPriceBound(Struct):
    """The prices a worst case is reserved at (openrouter/routing.py `price_bound`)."""

    prompt: float  # USD per million tokens
    completion: float
    override: str | None = None  # the `pricing.overrides[]` entry that sets it, if one does


class PlanPrices(Struct):
    allowed_mean: PricePair | None  # the mean of the allowed routes, less their discounts
    bound: PlanPriceBound | None


class PlanAnswerTokens(Struct):
    expected: float
    assumed: str  # what the expectation rests on


class PlanCost(Struct):
    expected: float
    worst_case: float
    worst_case_request: float


class Recorded(Struct):
    spend: float  # USD in the output and --failures already
    completion_tokens: int


class PlanTotalCost(Struct):
    cap: float
    recorded: float
    spent_in: list[str]


class PlanInFlight(Struct):
    """What the balance keeps in flight at once (infer/plan.py)."""

    balance: float
    balance_source: str
    worst_case_request: float
    requests: int | None
    concurrency: int
    max_tokens_for_concurrency: int | None


class PlanLogprobs(Struct):
    """Token logprobs in the plan (openrouter/logprobs.py): asked or not, required or not,
    the allowed endpoints listing them (tags), not listing them (with `required`: those
    the requirement leaves out), unknown (supported_parameters null), and the share of the
    answers expected to carry them (None: cannot be told, or not asked)."""

    asked: bool
    required: bool
    listing: list[str]
    not_listing: list[str]
    unknown: list[str]
    share: float | None


class PlanAvailability(Struct):
    """How many endpoints the routing flags leave (infer/availability.py)."""

    listed: int  # endpoints in the model's table
    left: int  # of them, allowed
    providers: list[str]  # the providers of those left
    quarantined: list[str] = msgspec.field(default_factory=list)  # for identity


class InferPlan(Struct):
    """`kp-infer --plan --json` (infer/plan.py's docstring says what each figure means)."""

    model: str
    input: str
    prompts: PlanPrompts
    prompt_tokens: PlanPromptTokens
    routes: list[PlanRoute] | None  # None: the endpoints table could not be read
    prices: PlanPrices
    max_tokens: int
    answer_tokens: PlanAnswerTokens
    cost: PlanCost | None
    recorded: Recorded
    max_cost: float | None
    token_budget: int | None
    total_cost: PlanTotalCost | None
    warnings: list[str]
    sampling: list[str]
    distillation: str
    notes: list[str]
    in_flight: PlanInFlight | None
    requests: PlanRequests | None = None  # (older plans: none; then `prompts` are the requests)
    logprobs: PlanLogprobs | None = None  # (None: no endpoints table, or an older plan)
    availability: PlanAvailability | None = None  # None: no endpoints table
    identity: str | None = None  # what answers are checked against (--tokenizer), or why not


# -- kp-infer --summary-json ------------------------------------------------------------------


class PaidNotWritten(Struct):
    answers: int
    cost: float
    rescued: int
    rescue_file: str | None
    error: str | None


class FailuresNotWritten(Struct):
    records: int
    rescued: int
    rescue_file: str | None


class SummaryTokens(Struct):
    prompt: int
    completion: int
    reasoning: int
    completion_total: int  # the output's, earlier runs included
    cached: int = 0  # of `prompt`, served from the provider's prompt cache
    cached_share: float = 0.0


class MoneyLimit(Struct, omit_defaults=True):
    """The money limit that stopped a run: the fields OpenRouter gave, and what was left."""

    status: int | None = None
    limit_source: str | None = None
    reason: str | None = None
    scope: str | None = None
    limit_usd: float | None = None
    spend_usd: float | None = None
    resets_at: str | None = None
    message: str | None = None
    # what the run knew: null when the balance could not be read, absent in a limit
    # written by something else
    balance_left: float | None | msgspec.UnsetType = msgspec.UNSET
    worst_case_request: float | None = None

    def text(self) -> str:
        """Its figures in one line: what OpenRouter said and what is left (the summary's
        line, and make's money-stop message)."""
        parts = []
        if self.limit_usd is not None:
            parts.append(f"limit ${self.limit_usd:g}")
        if self.spend_usd is not None:
            parts.append(f"spent ${self.spend_usd:g}")
        if self.resets_at:
            parts.append(f"resets at {self.resets_at}")
        if self.balance_left not in (None, msgspec.UNSET) and self.worst_case_request is not None:
            parts.append(f"about ${self.balance_left:.4f} of the balance left against "
                         f"${self.worst_case_request:.4f} for one request's worst case")
        status = self.status if self.status is not None else ""
        said = f"OpenRouter {status}: " + "; ".join(
            [f"{self.reason or self.limit_source or 'no limit named'}"] + parts)
        if self.message:
            said += f" ({self.message})"
        return said


class MoneyInFlightEnd(Struct):
    """The money in flight at the end of a run (infer/inflight.py)."""

    ceiling_end: float | None
    ratio_end: float | None
    peak: float
    cuts: int
    balance_read: float | None


class SummaryCosts(Struct):
    """Answers paid for (kept or refused) by where their cost came from (infer/costs.py)."""

    usage: int = 0  # usage.cost
    generation: int = 0  # GET /generation (the answer showed none)
    estimate: int = 0  # neither in time: usage tokens at the price bound, or the worst case
    server: int = 0  # a --server's answer: no bill (infer/servers.py)


class SourceShare(Struct):
    """One source of a run with --server (a server by name, or "openrouter")."""

    answers: int
    share: float  # of the answers written this run
    completion_tokens: int
    tokens_per_s: float  # completion tokens over the run's time


class SummaryConversations(Struct):
    """A run's conversations (prompts with follow_ups), turn by turn."""

    turns_by_number: dict[str, int]  # turns answered, by turn number
    done: int  # conversations whose last turn was answered
    cut: int  # ended by a turn cut by max_tokens (later turns not sent)
    turns_not_sent: int  # turns of conversations ended early (cut, failed, stopped)


class SummaryLogprobs(Struct):
    answers: int  # kept this run
    with_tokens: int  # ... that carried the sampled tokens (token logprobs)


class SharedOffset(Struct):
    """A constant prompt-count offset the providers share (infer/identity.py): kimipipe's
    rendering differs from theirs, shown with one rendered prompt."""

    prompts: str  # which prompts: with a system message first, or without
    offset: int
    providers: list[str]
    example: str  # its prompt id
    rendered: str  # the prompt as kimipipe renders it (its first 600 characters)


class SummaryIdentity(Struct):
    """Whether the answers were the target model's (kp-infer --tokenizer)."""

    checked: bool
    providers: list[dict[str, Any]]  # recorded/identity_table.py's rows
    shared_offsets: list[SharedOffset] = msgspec.field(default_factory=list)
    quarantined: list[Quarantined] = msgspec.field(default_factory=list)


class InferSummary(Struct):
    """kp-infer's summary (infer/report.py's docstring says what each figure means)."""

    exit_code: int
    stop_reason: str | None  # kinds.StopReason's slug
    input_records: int
    todo: int
    skipped: int
    done: int
    failed: dict[str, int]  # by kinds.FailureKind, a refusal kind, or http_<status>
    failures_file: str | None
    retries: dict[str, int]  # by kinds.RetryCause (or a status), or a refusal kind
    abandoned_in_flight: int
    taken_in_from_rescue: int
    paid_not_written: PaidNotWritten
    failures_not_written: FailuresNotWritten
    spend_this_run: float
    spend_total: float
    max_cost: float | None
    total_cost: float | None
    tokens: SummaryTokens
    token_budget: int | None
    providers: dict[str, float]  # share of the answers
    finish_reasons: dict[str, int]
    refused: dict[str, dict[str, int]]  # {refusal kind: {provider: answers}}
    by_provider: list[dict[str, Any]]  # recorded/providers_table.py's rows
    elapsed_s: float
    requests_per_s: float
    completion_tokens_per_s: float
    concurrency_limit_end: int
    limit: MoneyLimit | None
    limit_refusals: dict[str, int]  # "402 in_flight_budget_exhausted": n
    money_in_flight: MoneyInFlightEnd | None
    costs: SummaryCosts = msgspec.field(default_factory=lambda: SummaryCosts())
    sources: dict[str, SourceShare] = msgspec.field(default_factory=dict)  # with --server
    # answers from a provider name that covers an excluded variant too: kept, marked
    # "routing": "unverifiable" (openrouter/routing.py: mixed_names)
    routing_unverifiable: dict[str, int] = msgspec.field(default_factory=dict)
    conversations: SummaryConversations | None = None
    # token logprobs asked: per provider, the answers kept and those carrying the tokens
    logprobs: dict[str, SummaryLogprobs] | None = None
    identity: SummaryIdentity | None = None  # None: no --tokenizer, identity unchecked
    # a --server's answers refused (not paid for; sent again to a server, nothing ignored)
    server_refused: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)


class SummaryStop(Struct):
    """The view of a summary that make's money-stop message reads (make/stop.py):
    only these fields, so a summary of an older or newer kp-infer is read as well."""

    spend_this_run: float
    spend_total: float
    stop_reason: str | None = None
    limit: MoneyLimit | None = None


def read_contract(path: str, decoder: msgspec.json.Decoder, what: str, fix: str):
    """The file at PATH decoded by DECODER, or None when there is none; a file that does
    not decode is PATH and why: "WHAT (the decoder's reason); FIX"."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise InputError(f"{what} ({e}); {fix}", path) from None


def read_summary(path: str, view: type = InferSummary):
    """A --summary-json file decoded as VIEW (the whole summary, or a view of some of its
    fields: SummaryStop); None when there is none (make removes it before each run, and a
    run killed before its end leaves none)."""
    try:
        with open(path, "rb") as f:
            return msgspec.json.decode(f.read(), type=view)
    except FileNotFoundError:
        return None


# -- kp-infer report --json (infer/report_files.py) ------------------------------------------


class ReportPromptTokens(Struct):
    total: int
    cached: int  # served from the provider's prompt cache (usage.cached_tokens)
    cached_share: float


class ReportTurns(Struct):
    conversations: int
    by_number: dict[str, int]  # a conversation's turns answered, by turn number


class ReportSampling(Struct):
    sampling: dict[str, Any] | None  # a distinct `sampling` (None: records before it existed)
    answers: int


class ReportHistogram(Struct):
    upto: list[int]  # the bins' upper edges, completion tokens
    by_provider: dict[str, list[int]]  # answers per bin


class InferReport(Struct):
    """`kp-infer report FILE... --json` (infer/report_files.py's docstring says what each
    figure means)."""

    files: list[str]
    answers: int
    failures: dict[str, int]  # failure lines by kind
    refused: int
    spend: float
    prompt_tokens: ReportPromptTokens
    turns: ReportTurns
    sampling: list[ReportSampling]
    by_provider: list[dict[str, Any]]  # recorded/providers_table.py's rows
    histogram: ReportHistogram
    token_deltas: list[dict[str, Any]]  # tokenize/deltas.py's rows
    logprobs: dict[str, SummaryLogprobs]  # {} when no answer carried the sampled tokens
    sampled_ids: list[dict[str, Any]]  # tokenize/stats.py SampledTable's rows
    identity: list[dict[str, Any]]  # recorded/identity_table.py's rows


# -- make pilot: WORK/D.pilot.json (make/measure.py) -----------------------------------------


class CompletionFigures(Struct):
    total: int
    mean: float | None  # None: no answers
    sd: float | None
    p50: int
    p90: int
    max: int


class CostPerAnswer(Struct):
    mean: float | None  # USD: every answer's cost, refused and paid failures shared out
    sd: float | None


class PilotFigures(Struct):
    """What a responses file's answers measured (`make pilot`; make/measure.py's docstring
    says what each figure means); make plan reads it."""

    answers: int
    spend: float
    completion_tokens: CompletionFigures
    prompt_tokens_mean: float | None
    reasoning_share: float | None
    cost_per_answer: CostPerAnswer
    cost_per_completion_token: float | None
    length_cut_share: float | None
    providers: dict[str, float]  # share of the answers
    failures: dict[str, int]  # failure lines by kind


# -- make plan --json: WORK/build.plan.json (make/build_plan.py) ---------------------------


class DatasetPlanFile(Struct):
    """One dataset of the build plan (make/build_plan.py's docstring: L, c, to go)."""

    name: str
    prompts: int  # requests of the input (a conversation's turns each count)
    todo: int
    answered: int
    prompt_tokens: float  # per prompt, estimated (~4 bytes a token)
    recorded_spend: float  # in D's responses and failures files
    recorded_tokens: int  # completion tokens in D's responses file
    answer_tokens: float  # L
    cost_per_answer: float  # c
    measured: str | None  # what L and c were measured on (None: assumed)
    measured_answers: int
    token_budget: int | None
    weight: float
    worst_case_request: float
    max_tokens: int
    notes: list[str]
    like: str | None  # measured on other datasets' answers (no answers of its own yet)
    complete: bool  # its responses stage is stamped done
    answers_to_go: int
    short: bool  # too few prompts to reach its TOKEN_BUDGET
    expected_to_go: float
    expected_total: float


class BuildPlanFile(Struct):
    """The build's money plan (`make plan`, `make all`'s gate), for scripts and tests."""

    datasets: list[DatasetPlanFile]
    routes: list[PlanRoute]  # the allowed routes, as kp-infer --plan read them
    prices: PlanPrices | None  # None: no dataset
    total_cost: float | None
    max_cost: float | None
    recorded: float  # USD recorded across the build (what TOTAL_COST counts)
    recorded_elsewhere: float  # of it, outside these datasets' files
    expected_total: float
    room_for_last_request: float
    fits: bool
    fitting_budgets: dict[str, int] | None  # the TOKEN_BUDGET per dataset that fits TOTAL_COST


# -- --reservations (infer/total_cost.py) -----------------------------------------------------


class ReservationEntry(Struct):
    """One run sharing --total-cost."""

    token: str  # this run's, random
    pid: int = 0
    host: str = ""
    proc_start: str | None = None  # to tell a reused pid (Linux clock ticks since boot)
    label: str = ""
    spent: float = 0.0  # USD this run
    claim: float = 0.0  # USD it may have in flight (>= its reservations)
    ended: bool = False
    started: float = 0.0  # time.time() at registration
    # true once another run found it dead (its claim dropped); absent until then
    died: bool | msgspec.UnsetType = msgspec.UNSET
    # true while all it holds is prompts waiting for room after a refused answer: its claim
    # frees nothing until it stops, so no other run waits for it (absent: false)
    stuck: bool | msgspec.UnsetType = msgspec.UNSET


class Reservations(Struct):
    version: int = 1
    entries: list[ReservationEntry] = msgspec.field(default_factory=list)


# -- OUTPUT.identity.json (infer/identity.py) ----------------------------------------------


class Quarantined(Struct):
    """A provider kp-infer stopped routing to: its answers' token counts were not the
    target model's for their prompts (another model, tokenizer or template)."""

    provider: str  # the name its answers give (`provider`)
    slugs: list[str]  # what provider.ignore gets: its endpoints' tags
    refused: int  # its answers refused for identity when it was quarantined
    offset: int | None  # its typical usage.prompt_tokens minus kimipipe's count
    example: str  # one refused answer: its prompt id, the two counts
    at: str  # when (UTC, ISO 8601)
    completion_ratio: float | None = None  # its typical usage.completion_tokens / kimipipe's


class IdentityState(Struct):
    """What a kp-infer run checking identity leaves beside its output, for its resumes."""

    version: int = 1
    quarantined: list[Quarantined] = msgspec.field(default_factory=list)


# -- output locks (locks.py) ------------------------------------------------------------------


class LockHolder(Struct, omit_defaults=True):
    """Who holds an output's lock. Every field may be missing from an old or torn file."""

    pid: int | None = None
    host: str | None = None
    since: str | None = None  # ISO 8601, local time with its offset
    command: str | None = None  # kp-infer, kp-tokenize, ...
    output: str | None = None  # the output's absolute path


# -- kp-shard's manifest -----------------------------------------------------------------------


class ShardTotals(Struct):
    shards: int
    records: int
    input_tokens: int
    output_tokens: int
    bytes: int
    uncompressed_bytes: int


class ShardEntry(Struct):
    """A finished shard as the manifest lists it."""

    file: str
    split: str
    records: int
    input_tokens: int
    output_tokens: int
    bytes: int
    uncompressed_bytes: int
    sha256: str


class ShardSettings(Struct):
    """The options the set was made with (the manifest's `options`)."""

    name: str
    records_per_shard: int | None
    tokens_per_shard: int | None
    compression_level: int
    shuffle: bool
    seed: int | None
    eval_fraction: float
    eval_split: str
    min_output_tokens: int
    max_length: int | None
    truncate: bool
    on_duplicate: str


class DeltaStats(Struct):
    """A provider's token-count deltas (its `usage` count minus kimipipe's: kp-tokenize's
    `prompt_tokens_delta`/`completion_tokens_delta`) over the rows that have one."""

    rows: int = 0
    zero: int = 0  # rows whose count agreed exactly
    sum: int = 0
    min: int | None = None
    max: int | None = None


class ProviderRows(Struct):
    rows: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    prompt_delta: DeltaStats = msgspec.field(default_factory=DeltaStats)
    completion_delta: DeltaStats = msgspec.field(default_factory=DeltaStats)


class SamplingRows(Struct):
    sent: Any  # the record's `sampling`, as sent (None: older records, not recorded)
    rows: int


class ShardProvenance(Struct):
    """Where the set's rows came from, counted over the rows kept (the manifest's
    `provenance`; shard/provenance.py): what the token records say of each. A value a
    record does not have is counted under "unknown"; a value that is not a string, as its
    compact JSON."""

    rows: int
    datasets: dict[str, int]
    models: dict[str, int]  # as served: the answer's `model`
    providers: dict[str, ProviderRows]
    apis: dict[str, int]
    finish_reasons: dict[str, int]
    sampling: list[SamplingRows]  # most rows first
    reasoning: dict[str, int]  # "with" / "without": rows whose answer had reasoning
    reasoning_sources: dict[str, int]  # field, details, inline, none
    history_reasoning: dict[str, int]  # a conversation's turns: keep / drop
    turns: dict[str, int]  # rows by their conversation's `turns` ("1": a single prompt)
    turn: dict[str, int]  # rows by turn number ("1" for a single prompt)
    output_ids_source: dict[str, int]  # "reencoded" (kimipipe's), "sampled", ...
    routing: dict[str, int]  # "verified", or the record's `routing` ("unverifiable")


class ShardManifest(Struct):
    manifest_version: int
    kimipipe_version: str
    created: str  # UTC, ISO 8601
    command: str
    format: str  # the row format: a name in shard/formats.py (eagle, raw)
    row_schema: dict[str, str] | str
    options: ShardSettings
    inputs: list[str]
    records_read: int
    dropped: dict[str, int]  # by reason
    truncated: int
    splits: dict[str, ShardTotals]  # train, eval (those that hold rows)
    totals: ShardTotals
    shards: list[ShardEntry]
    provenance: ShardProvenance | None = None  # (sets of older kimipipe: none)


class ShardFile(Struct):
    file: str


class ShardFiles(Struct):
    """The view of a manifest that needs only the names of the files it lists."""

    shards: list[ShardFile]
