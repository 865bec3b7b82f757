"""The plan files: what `kp-infer --plan --json` and `make pilot`/`make plan` leave for each
other, one Struct each (written by encoding, read by decoding; contracts.py holds the
other files that cross a process, records.py the pipeline's records):

    file                              written by                      read by
    WORK/D.plan.json                  kp-infer --plan --json          make/build_plan.py
    (InferPlan)                       (infer/plan.py)                 (make plan, make all)
    WORK/D.pilot.json                 make pilot (make/measure.py)    make/build_plan.py
    (PilotFigures)
    WORK/build.plan.json              make plan (make/build_plan.py)  scripts, tests
    (BuildPlanFile)

Here, not in infer/: make's rooms read them and never import the run package. Schema
evolution as for records: new fields get defaults, types never change.
"""

from __future__ import annotations

import msgspec
from msgspec import Struct

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


class DatasetFigures(Struct):
    """One dataset's figures in the build plan (make/build_plan.py's docstring: L, c, to go):
    make/build_plan.py's DatasetPlan computes the rest from them."""

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
    measured_answers: int  # how many answers (0: assumed)
    token_budget: int | None
    weight: float
    worst_case_request: float
    max_tokens: int
    notes: list[str] = msgspec.field(default_factory=list)
    like: str | None = None  # measured on other datasets' answers (no answers of its own yet)
    complete: bool = False  # its responses stage is stamped done, and make will not rerun it


class DatasetPlanFile(DatasetFigures, kw_only=True):
    """One dataset as WORK/build.plan.json has it: its figures, then what they give."""

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
