"""The files kimipipe's commands leave for each other that are not records: one Struct each.

records.py holds what flows down the pipeline line by line; plans.py the plan files
(kp-infer --plan --json, make pilot, make plan); shard/manifest.py kp-shard's manifest;
this module the other files that cross a process or a stage. Each is written by encoding its Struct and read by
decoding it (a reader never walks a dict), so the schema is declared here once:

    file                              written by                      read by
    --summary-json FILE               kp-infer (infer/report.py)      make/stop.py (make's
    (InferSummary)                                                    money-stop message:
                                                                      SummaryStop)
    --reservations FILE               kp-infer --total-cost           the other runs sharing
    (Reservations)                    (infer/total_cost.py)           the cap
    kp-infer report --json (stdout)   kp-infer report                 scripts
    (InferReport)                     (infer/report_files.py)
    .NAME.lock beside an output       every resumable stage           the next run on it
    (LockHolder)                      (locks.py)
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
    retries: dict[str, int] = {}  # attempts sent again, by cause (records' `retried`)
    apis: dict[str, int] = {}  # answers and failures by the host that answered (`api`)
    standin_answers: int = 0  # answers of the kimipipe stand-in (offline: not the model's)


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
