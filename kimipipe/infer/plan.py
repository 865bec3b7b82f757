"""`kp-infer --plan`: what a run would do, without sending a completion.

The plan is a report, so it goes to stdout (chatter stays on stderr); `--plan --json`
gives the same figures as one JSON object (what `make plan` reads). It shows every
endpoint of the model's table with its quantization, prices and the routing flags'
verdict on it, the re-quantization warnings, the sampling each request sends (the model
preset's served values, or none for a model without a preset) and whether
`provider.require_parameters` goes with it, whether the model's authors allow distillation
(`is_trainable_text`), how many prompts are to do, and the cost estimate:

    expected = todo x (prompt tokens x mean allowed prompt price
                       + completion tokens x mean allowed completion price)

with prompt tokens estimated at ~4 bytes a token (+16 for the template) and completion
tokens at half of `--max-tokens` (or what is left of `--token-budget`, shared out), and the
worst case, which is what the budget reserves: every prompt at its token bound and every
answer at `--max-tokens`, at the price bound (openrouter/routing.py `price_bound`: the
highest price that can bill, a `pricing.overrides[]` entry's included; `override` names the
entry when one sets it, else null). The expected cost takes each endpoint's `discount`
off its prices; the bound never does.

The JSON object (`plans.InferPlan`; prices in USD per million tokens, money in USD):

    {"model", "input", "prompts": {"input", "todo", "done", "sample"},
     "requests": {"input", "todo", "conversations", "conversations_todo", "history_reasoning",
                  "history_answer_tokens", "history_answer_measured"}  (a conversation's turns
                  each count; the cost counts requests, a later turn's prompt carrying the
                  earlier answers: measured in the output, else the expected answer length;
                  in the worst case --max-tokens each; docs/conversations.md),
     "prompt_tokens": {"estimated", "per_prompt", "bound"},
     "routes": [{"provider", "tag", "quantization", "prompt_price", "completion_price",
                 "verdict", "allowed"}] | null  (null: the endpoints table could not be read),
     "prices": {"allowed_mean": {"prompt", "completion"} | null,
                "bound": {"prompt", "completion", "override"} | null},
     "max_tokens", "answer_tokens": {"expected", "assumed"},
     "cost": {"expected", "worst_case", "worst_case_request"} | null,
     "recorded": {"spend", "completion_tokens"},
     "max_cost", "token_budget", "total_cost": {"cap", "recorded", "spent_in"} | null,
     "warnings": [str], "sampling": [str], "distillation": str, "notes": [str],
     "in_flight": {"balance", "balance_source", "worst_case_request", "requests",
                   "concurrency", "max_tokens_for_concurrency"} | null,
     "logprobs": {"asked", "required", "listing", "not_listing", "unknown", "share"} | null
                 (token logprobs: the allowed endpoints that list them in
                 supported_parameters, and the share of the answers expected to carry
                 them; openrouter/logprobs.py),
     "availability": {"listed", "left", "providers", "quarantined"} | null  (the endpoints
                   the routing flags leave: a warning at one or none, infer/availability.py),
     "identity": str  (what each answer's token counts are checked against: --tokenizer)}

`in_flight` is what the balance can keep in flight at once: OpenRouter reserves each
running request's worst case (prompt + --max-tokens at the endpoint's prices) against the
balance (GET /key limit_remaining, GET /credits; null when neither could be read or there
is no price bound). `requests` is how many worst cases (at the highest allowed prices)
the balance covers, `max_tokens_for_concurrency` the largest --max-tokens at which it
covers all of --concurrency (null: none does). OpenRouter's in-flight budget is a share of
the balance it does not publish, so these are upper bounds: the run starts there and
learns the rest from OpenRouter's in-flight 402s (infer/inflight.py).
"""

from __future__ import annotations

import json

import msgspec

from ..openrouter import logprobs
from ..openrouter.account import Balance, ModelInfo
from ..openrouter.models import served_sampling, thinking
from ..openrouter.request import SAMPLING_PARAMETERS, RequestOptions
from ..openrouter.routing import Policy, PriceBound, allowed_endpoints, why_excluded
from ..plans import (
    InferPlan,
    PlanAnswerTokens,
    PlanCost,
    PlanInFlight,
    PlanLogprobs,
    PlanPriceBound,
    PlanPrices,
    PlanPrompts,
    PlanPromptTokens,
    PlanRequests,
    PlanRoute,
    PlanTotalCost,
    PricePair,
    Recorded,
)
from .availability import WHAT_TO_DO, availability_text, endpoints_left
from .budget import Budget, cap_below_one_request, request_worst_case
from .config import RunConfig
from .endpoints import endpoint_warnings, requantization_warnings
from .prepare import Prepared

PROMPT_BYTES_PER_TOKEN = 4
PROMPT_TEMPLATE_TOKENS = 16


def _per_m(price: float) -> float:
    return round(price * 1e6, 6)


def sampling_lines(request: RequestOptions, policy: Policy) -> list[str]:
    """What the plan says about sampling: the values sent and where they come from."""
    sampling = request.sampling(policy)
    sent = {k: getattr(sampling, k, None) for k in SAMPLING_PARAMETERS}
    sent = {k: v for k, v in sent.items() if v is not None}
    served = served_sampling(request.model, request.reasoning, request.reasoning_effort)
    shown = ", ".join(f"{k} {v}" for k, v in sent.items())
    mode = "thinking" if thinking(request.reasoning, request.reasoning_effort) else "instant"
    if served is None:
        lines = [f"sampling: no preset for {request.model}: no default is invented; "
                 + (f"sent as given: {shown}" if sent else
                    "nothing sent, each provider samples at its own defaults "
                    "(set --temperature/--top-p to choose)")]
    else:
        mine = [k for k, v in sent.items() if served.get(k) != v]
        lines = [f"sampling: {shown} ({request.model} as served in {mode} mode"
                 + (f"; set by you: {', '.join(mine)}" if mine else "") + ")"]
    if sampling.require_parameters:
        lines.append("  with provider.require_parameters: only endpoints that apply every "
                     "parameter sent serve")
    elif sent:
        lines.append("  warning: without provider.require_parameters, a provider that does not "
                     "support a sampling parameter drops it silently")
    return lines


def distillation_line(config: RunConfig, info: ModelInfo | str | None) -> str:
    """Whether the model's authors allow distillation, and what the run does about it."""
    model, enforced = config.request.model, config.policy.enforce_distillable_text
    sent = ("provider.enforce_distillable_text sent" if enforced
            else "not enforced (--allow-non-distillable)")
    if not isinstance(info, ModelInfo) or info.is_trainable_text is None:
        why = info if isinstance(info, str) else "the model's entry does not say"
        return f"distillation: unknown for {model} ({why}); {sent}"
    if info.is_trainable_text:
        return f"distillation: allowed by the authors of {model} (is_trainable_text); {sent}"
    if enforced:
        return (f"distillation: NOT allowed by the authors of {model}: with "
                "provider.enforce_distillable_text (the default) OpenRouter routes no request "
                "(a run is refused); the answers must not train a drafter")
    return (f"distillation: NOT allowed by the authors of {model}; {sent}: "
            "the answers must not train a drafter")


def in_flight_data(config: RunConfig, balance: Balance | None, prompt_tokens: float,
                   bound: PriceBound) -> PlanInFlight | None:
    """What the balance keeps in flight at once (see the module docstring), for requests
    of PROMPT_TOKENS at the prices of BOUND."""
    spendable = balance.spendable if balance is not None else None
    if spendable is None:
        return None
    worst = request_worst_case(prompt_tokens, config.request.max_tokens, bound)
    prompt_part, completion_price = prompt_tokens * bound.prompt, bound.completion
    per_slot = spendable / config.sending.concurrency - prompt_part
    allowing = int(per_slot / completion_price) if completion_price > 0 and per_slot > 0 else None
    return PlanInFlight(balance=round(spendable, 6), balance_source=balance.source,
                        worst_case_request=round(worst, 6),
                        requests=int(spendable / worst) if worst > 0 else None,
                        concurrency=config.sending.concurrency, max_tokens_for_concurrency=allowing)


def plan_data(config: RunConfig, prepared: Prepared, budget: Budget,
              balance: Balance | None = None) -> InferPlan:
    """The plan's figures (see the module docstring for the fields); BALANCE: as read."""
    request, policy, endpoints = config.request, config.policy, prepared.endpoints
    scan, todo = prepared.scan, prepared.todo
    routes = None
    allowed = []
    if endpoints is not None:
        allowed = allowed_endpoints(policy, endpoints)
        routes = []
        for e in sorted(endpoints, key=lambda e: (e.completion_price, e.provider_name)):
            verdict = why_excluded(policy, e) or "allowed"
            routes.append(PlanRoute(provider=e.provider_name, tag=e.tag,
                                    quantization=e.quantization,
                                    prompt_price=_per_m(e.prompt_price),
                                    completion_price=_per_m(e.completion_price),
                                    verdict=verdict, allowed=verdict == "allowed"))
    warnings = requantization_warnings(request.model, policy, endpoints)
    warnings += endpoint_warnings(policy, endpoints)
    too_small = cap_below_one_request(budget, scan.largest_prompt_bound, prepared.turns_todo,
                                      bool(config.sending.servers))
    if too_small:
        warnings.append(too_small)
    if endpoints is not None and not allowed:
        warnings.append("no provider is allowed: requests would fail with 404 constraint_filtered; "
                        + WHAT_TO_DO)
    requests = max(1, scan.requests)
    todo_requests = prepared.turns_todo  # a conversation's turns each count
    expected_completion = request.max_tokens / 2
    assumed = f"half of --max-tokens {request.max_tokens}"
    if budget.token_budget is not None and todo_requests:
        left = max(0, budget.token_budget - budget.tokens) / todo_requests
        if left < expected_completion:
            expected_completion, assumed = left, assumed + ", within --token-budget"
    # a later turn's prompt carries the earlier turns' answers: as measured in the output
    # (a pilot's), else at the expected answer length
    conversations = prepared.conversations
    measured = (conversations.mean_history_answer(config.history_reasoning)
                if conversations is not None else None)
    history_answer = measured if measured is not None else expected_completion
    answers_per_request = scan.history_answers / requests
    per_prompt = (scan.request_bytes / PROMPT_BYTES_PER_TOKEN / requests + PROMPT_TEMPLATE_TOKENS
                  + answers_per_request * history_answer)
    bound = budget.price
    mean = None
    if allowed:
        # (expected: at the default conditions' prices, less the discount; the bound takes
        # neither the discount nor a lower price than an override's)
        mean = {"prompt": sum(e.prompt_price * (1 - e.discount) for e in allowed) / len(allowed),
                "completion": sum(e.completion_price * (1 - e.discount) for e in allowed) / len(allowed)}
    elif bound is not None:
        mean = {"prompt": bound.prompt, "completion": bound.completion}
    cost = in_flight = None
    # each earlier answer in a history is at most --max-tokens tokens
    per_prompt_bound = (scan.request_token_bound / requests
                        + answers_per_request * request.max_tokens)
    if bound is not None:
        in_flight = in_flight_data(config, balance, per_prompt_bound, bound)
    if bound is not None and mean is not None:
        worst_request = request_worst_case(per_prompt_bound, request.max_tokens, bound)
        expected = todo_requests * (per_prompt * mean["prompt"]
                                    + expected_completion * mean["completion"])
        cost = PlanCost(expected=round(expected, 6), worst_case=round(todo_requests * worst_request, 6),
                        worst_case_request=round(worst_request, 6))
    total = None
    if config.money.total_cost is not None:
        total = PlanTotalCost(cap=config.money.total_cost,
                              recorded=prepared.spent + prepared.spent_elsewhere,
                              spent_in=prepared.spent_in_files)
    return InferPlan(
        model=request.model,
        input=scan.shown,
        prompts=PlanPrompts(input=scan.records, todo=todo, done=prepared.skipped,
                            sample=config.files.sample),
        prompt_tokens=PlanPromptTokens(estimated=round(per_prompt * scan.requests),
                                       per_prompt=round(per_prompt, 1),
                                       bound=round(per_prompt_bound * scan.requests)),
        requests=PlanRequests(input=scan.requests, todo=todo_requests,
                              conversations=len(scan.turns),
                              conversations_todo=prepared.conversations_todo,
                              history_reasoning=config.history_reasoning,
                              history_answer_tokens=round(history_answer, 1),
                              history_answer_measured=measured is not None),
        routes=routes,
        prices=PlanPrices(
            allowed_mean=(PricePair(prompt=_per_m(mean["prompt"]),
                                    completion=_per_m(mean["completion"])) if mean else None),
            bound=(PlanPriceBound(prompt=_per_m(bound.prompt), completion=_per_m(bound.completion),
                                  override=bound.override)
                   if bound else None)),
        max_tokens=request.max_tokens,
        answer_tokens=PlanAnswerTokens(expected=round(expected_completion, 1), assumed=assumed),
        cost=cost,
        recorded=Recorded(spend=round(prepared.spent, 10), completion_tokens=prepared.tokens),
        max_cost=config.money.max_cost,
        token_budget=config.money.token_budget,
        total_cost=total,
        warnings=warnings,
        sampling=sampling_lines(request, policy),
        distillation=distillation_line(config, prepared.model_info),
        notes=list(prepared.notes),
        in_flight=in_flight,
        logprobs=_logprobs_data(config, endpoints),
        availability=endpoints_left(policy, endpoints),
        identity=identity_line(config),
    )


def _logprobs_data(config: RunConfig, endpoints) -> PlanLogprobs | None:
    found = logprobs.plan(config.request, config.policy, endpoints)
    return None if found is None else PlanLogprobs(**vars(found))


def identity_line(config: RunConfig) -> str:
    """What the run checks each answer's identity against (infer/identity.py)."""
    if config.identity.tokenizer:
        return (f"identity: each answer's token counts checked against {config.identity.tokenizer} "
                f"(--tokenizer; a provider refused {config.identity.identity_strikes} times is quarantined)")
    return ("identity: unchecked: no --tokenizer, so nothing compares the answers' token "
            "counts with the target model's")


def plan_json(config: RunConfig, prepared: Prepared, budget: Budget,
              balance: Balance | None = None) -> str:
    # (json.dumps of the builtins: the bytes the plan has always had, spaces included)
    return json.dumps(msgspec.to_builtins(plan_data(config, prepared, budget, balance)))


def in_flight_lines(data: PlanInFlight | None) -> list[str]:
    if data is None:
        return ["in flight: the balance could not be read; the run learns what OpenRouter "
                "keeps in flight from its in-flight 402s"]
    n, c = data.requests, data.concurrency
    line = (f"in flight: the balance ${data.balance:,.2f} ({data.balance_source}) covers "
            f"{n:,} requests' worst case (${data.worst_case_request:.4f} each at --max-tokens) "
            f"at once, of --concurrency {c:,}")
    if n is not None and n >= c:
        return [line + ": all of them"]
    allowing = data.max_tokens_for_concurrency
    return [line, f"  --max-tokens {allowing:,} would let all {c:,} be in flight" if allowing
            else f"  no --max-tokens lets all {c:,} be in flight: the prompts alone use the balance",
            "  (OpenRouter's in-flight budget may be a smaller share of the balance: the run learns it)"]


def plan_text(config: RunConfig, prepared: Prepared, budget: Budget,
              balance: Balance | None = None) -> str:
    data = plan_data(config, prepared, budget, balance)
    out = []
    if data.routes is None:
        out.append("endpoints table unavailable: routing cannot be shown")
    else:
        out.append(f"providers for {data.model} under the routing flags:")
        out.append(f"  {'provider':<24} {'tag':<20} {'quant':<8} {'$/M in':>8} {'$/M out':>8}  verdict")
        for r in data.routes:
            out.append(f"  {r.provider:<24} {r.tag or '':<20} {r.quantization or '?':<8} "
                       f"{r.prompt_price:>8.3f} {r.completion_price:>8.3f}  {r.verdict}")
    if data.availability is not None:  # (one or none: the warnings below say so)
        out.append(f"endpoints left: {availability_text(data.availability, data.model)[1]}")
    for warning in data.warnings:
        out.append(f"warning: {warning}")
    out.append(data.identity)
    out.extend(data.sampling)
    if config.sending.openrouter:
        out.extend(logprobs.plan_lines(data.logprobs, config.request))
    out.append(data.distillation)
    for note in data.notes:
        out.append(f"note: {note}")
    prompts = data.prompts
    out.append(f"prompts: {prompts.input} in the input, {prompts.todo} to do"
               + (f" (--sample {prompts.sample})" if prompts.sample is not None else ""))
    bound = data.prices.bound
    if bound is not None:
        out.append(f"price bound (what a worst case is reserved at): ${bound.prompt:g}/M in, "
                   f"${bound.completion:g}/M out"
                   + (f"; set by a pricing override: {bound.override}" if bound.override
                      else ", the table's highest base prices"))
    requests = data.requests
    if requests.conversations:
        out.append(f"conversations: {requests.conversations:,} in the input, "
                   f"{requests.conversations_todo:,} to do; {requests.todo:,} requests to send "
                   f"(each turn one), each later turn's prompt carrying the earlier answers "
                   f"(--history-reasoning {requests.history_reasoning}: "
                   f"~{requests.history_answer_tokens:,.0f} tokens each, "
                   + ("measured in the output)" if requests.history_answer_measured
                      else "assumed)"))
    todo, cost = requests.todo, data.cost
    if cost is not None and todo:
        what = "requests" if requests.conversations else "prompts"  # (a turn is a request)
        out.append(f"cost estimate for {todo} {what}: expected ~${cost.expected:,.2f} (prompts at ~4 bytes/token, "
                   f"answers at {data.answer_tokens.assumed}); worst case ${cost.worst_case:,.2f}")
        if config.money.max_cost is not None:
            out.append(f"--max-cost ${config.money.max_cost:g}: ${budget.spent:.4f} already recorded; "
                       + ("not one request fits under it (the warning above)"
                          if any(w.startswith("--max-cost") for w in data.warnings)
                          else "the run stops before exceeding it"))
    elif todo:
        out.append("no price bound: cost cannot be estimated")
    total = data.total_cost
    if total is not None:
        out.append(f"--total-cost ${total.cap:g}: ${total.recorded:.4f} already recorded here and in "
                   f"{len(total.spent_in)} --spent-in file(s); "
                   + ("not one request fits under it (the warning above)"
                      if any(w.startswith("--total-cost") for w in data.warnings)
                      else "the runs stop before exceeding it"))
    if data.prices.bound is not None and todo:
        out.extend(in_flight_lines(data.in_flight))
    return "\n".join(out)
