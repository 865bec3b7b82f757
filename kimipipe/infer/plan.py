"""`kp-infer --plan`: what a run would do, without sending a completion.

The plan shows every endpoint of the model's table with its quantization, prices and the
routing flags' verdict on it, the re-quantization warnings, the sampling each request
sends (the model preset's served values, or none for a model without a preset) and
whether `provider.require_parameters` goes with it, whether the model's authors allow
distillation (`is_trainable_text`), how many prompts are to do, and the
cost estimate:

    expected = todo x (prompt tokens x mean allowed prompt price
                       + completion tokens x mean allowed completion price)

with prompt tokens estimated at ~4 bytes a token (+16 for the template) and completion
tokens at half of `--max-tokens` (or what is left of `--token-budget`, shared out), and the
worst case, which is what the budget reserves: every prompt at its token bound and every
answer at `--max-tokens`, at the highest allowed prices.
"""

from __future__ import annotations

from ..openrouter.account import ModelInfo
from ..openrouter.models import served_sampling, thinking
from ..openrouter.request import SAMPLING_PARAMETERS, RequestOptions
from ..openrouter.routing import Policy, allowed_endpoints, why_excluded
from .budget import Budget
from .config import RunConfig
from .prepare import Prepared, requantization_warnings


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


def plan_text(config: RunConfig, prepared: Prepared, budget: Budget) -> str:
    request, policy, endpoints = config.request, config.policy, prepared.endpoints
    scan, todo = prepared.scan, prepared.todo
    out = []
    if endpoints is None:
        out.append("endpoints table unavailable: routing cannot be shown")
    else:
        out.append(f"providers for {request.model} under the routing flags:")
        out.append(f"  {'provider':<24} {'tag':<20} {'quant':<8} {'$/M in':>8} {'$/M out':>8}  verdict")
        for e in sorted(endpoints, key=lambda e: (e.completion_price, e.provider_name)):
            verdict = why_excluded(policy, e) or "allowed"
            out.append(f"  {e.provider_name:<24} {e.tag or '':<20} {e.quantization or '?':<8} "
                       f"{e.prompt_price * 1e6:>8.3f} {e.completion_price * 1e6:>8.3f}  {verdict}")
        if not allowed_endpoints(policy, endpoints):
            out.append("  no provider is allowed: requests would fail with 404 constraint_filtered")
    for warning in requantization_warnings(request.model, policy, endpoints):
        out.append(f"warning: {warning}")
    out.extend(sampling_lines(request, policy))
    out.append(distillation_line(config, prepared.model_info))
    out.append(f"prompts: {scan.records} in the input, {todo} to do")
    if budget.price is not None and todo:
        allowed = allowed_endpoints(policy, endpoints or [])
        mean_in = sum(e.prompt_price for e in allowed) / len(allowed) if allowed else budget.price.prompt
        mean_out = (sum(e.completion_price for e in allowed) / len(allowed) if allowed
                    else budget.price.completion)
        per_prompt_bound = scan.prompt_token_bound / max(1, scan.records)
        expected_prompt_tokens = scan.prompt_bytes / 4 / max(1, scan.records) + 16
        expected_completion = request.max_tokens / 2
        if budget.token_budget is not None:
            expected_completion = min(expected_completion, max(0, budget.token_budget - budget.tokens) / todo)
        expected = todo * (expected_prompt_tokens * mean_in + expected_completion * mean_out)
        worst = todo * (per_prompt_bound * budget.price.prompt + request.max_tokens * budget.price.completion)
        out.append(f"cost estimate for {todo} prompts: expected ~${expected:,.2f} (prompts at ~4 bytes/token, "
                   f"answers at half of --max-tokens {request.max_tokens}"
                   + (", within --token-budget" if budget.token_budget else "") + f"); worst case ${worst:,.2f}")
        if budget.max_cost is not None:
            out.append(f"--max-cost ${budget.max_cost:g}: ${budget.spent:.4f} already recorded; "
                       f"the run stops before exceeding it")
    elif todo:
        out.append("no price bound: cost cannot be estimated")
    return "\n".join(out)
