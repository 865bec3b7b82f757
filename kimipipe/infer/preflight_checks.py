"""The verdicts of `kp-infer --preflight` (infer/preflight.py): one `Check` per fact.

Each function here reads what the preflight found (the prepared run, the balance, one
probe's answer and the shape of its stream) and says `pass`, `warn`, `fail` or `skip`
with a one-line detail; `format_preflight` lays the report out as a table. Nothing here
sends a request: the requests, the keeping of the answers and the report's assembly are
infer/preflight.py's (which lists, in its docstring, what each check checks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..kinds import AttemptKind
from ..openrouter import logprobs
from ..openrouter.account import Account, AccountError, ModelInfo
from ..openrouter.attempt import Attempt
from ..openrouter.probe import Probe
from ..openrouter.routing import allowed_endpoints, serving_endpoints
from ..recorded.identity_table import band_text
from . import costs
from .acceptance import Acceptance, reasoning_refusal
from .budget import Budget
from .config import RunConfig
from .preflight_identity import table_text as identity_table_text
from .prepare import Prepared
from .servers import ID_REQUEST, Server, ServerKind


@dataclass
class Check:
    check: str
    verdict: str  # pass | warn | fail | skip
    detail: str


def server_check(server: Server, config: RunConfig) -> Check:
    alias = f" as {server.model!r}" if server.model != config.request.model else ""
    return Check(f"server {server.name}", "pass",
                 f"answers GET /v1/models: a {server.kind} server serving "
                 f"{config.request.model}{alias}")


def ids_check(name: str, a: Attempt, server: Server) -> Check:
    """The sampled IDs a server of its kind returns (infer/servers.py ID_REQUEST)."""
    if a.output_ids is None:
        verdict = "warn" if server.kind == ServerKind.OTHER else "fail"
        return Check(name + "sampled IDs", verdict, f"none returned (a {server.kind} server "
                     f"asked with {', '.join(ID_REQUEST[server.kind])}): kp-tokenize will "
                     "re-encode the text")
    detail = (f"{len(a.output_ids):,} generated"
              + (f", {len(a.prompt_ids):,} prompt" if a.prompt_ids is not None else ", no prompt IDs"))
    if a.completion_tokens and len(a.output_ids) != a.completion_tokens:
        return Check(name + "sampled IDs", "warn",
                     f"{detail}, against {a.completion_tokens:,} completion tokens in its usage")
    return Check(name + "sampled IDs", "pass", detail)


def table_check(config: RunConfig, prepared: Prepared) -> Check:
    if prepared.endpoints is None:
        return Check("endpoints table", "fail", "unreadable: routing can be checked by name only")
    allowed = allowed_endpoints(config.policy, prepared.endpoints)
    return Check("endpoints table", "pass",
                 f"{len(prepared.endpoints)} endpoints, {len(allowed)} allowed by the routing flags: "
                 + ", ".join(f"{e.provider_name} ({e.quantization or 'unknown'})" for e in allowed))


def logprobs_check(config: RunConfig, prepared: Prepared) -> Check:
    """Which allowed endpoints list token logprobs, and the share of answers to carry them."""
    found = logprobs.plan(config.request, config.policy, prepared.endpoints)
    lines = logprobs.plan_lines(found, config.request)
    detail = "; ".join(line.strip() for line in lines).removeprefix("token logprobs: ")
    if found is None:
        return Check("token logprobs", "warn", detail)
    if found.asked and not found.listing and not found.unknown:
        return Check("token logprobs", "warn", detail + ": no answer will carry them")
    return Check("token logprobs", "pass", detail)


def logprobs_answer_check(name: str, a: Attempt, acceptance: Acceptance) -> Check:
    """The answer's sampled tokens (token logprobs asked), as the record keeps them."""
    served = serving_endpoints(a.provider or "", acceptance.endpoints)
    listed = [logprobs.lists_logprobs(e) for e in served]
    if a.token_lengths is None:
        if served and not any(listed):
            return Check(name + "logprobs", "pass", f"none: {a.provider} does not list them")
        return Check(name + "logprobs", "warn", f"none came from {a.provider}, which lists "
                     "them: kp-tokenize re-encodes its text")
    spelled = {"answer": "spelling the reasoning and the content",
               "content": "spelling the content only"}.get(
        a.token_spells, "not spelling the text as recorded (kept whole)")
    nulls = f", {a.token_nulls:,} with null bytes" if a.token_nulls else ""
    return Check(name + "logprobs", "pass", f"{len(a.token_lengths):,} tokens, {spelled}{nulls}")


def distillation_check(config: RunConfig, info: ModelInfo | str | None) -> Check:
    if not isinstance(info, ModelInfo) or info.is_trainable_text is None:
        why = info if isinstance(info, str) else "the model's entry does not say"
        return Check("distillation", "warn", f"unknown ({why}); "
                     + ("OpenRouter enforces it (enforce_distillable_text)"
                        if config.policy.enforce_distillable_text else "not enforced"))
    if info.is_trainable_text:
        return Check("distillation", "pass", "allowed by the model's authors (is_trainable_text)")
    return Check("distillation", "fail", "NOT allowed by the model's authors "
                 "(--allow-non-distillable): the answers must not train a drafter")


async def balance_checks(config: RunConfig, prepared: Prepared, budget: Budget,
                          account: Account) -> list[Check]:
    try:
        balance = await account.balance()
    except AccountError as e:
        return [Check("balance", "fail", f"not readable with this key: {e}"),
                Check("requests at once", "skip", "the balance is unknown")]
    spendable = balance.spendable
    shown = "unknown" if spendable is None else f"${spendable:,.2f}"
    checks = [Check("balance", "pass", f"readable with this key (from /{balance.source}"
                    + (f"; {balance.note}" if balance.note else "") + f"): {shown} spendable")]
    records = max(1, prepared.scan.records)
    worst = budget.worst_case(math.ceil(prepared.scan.prompt_token_bound / records))
    if spendable is None or worst <= 0:
        checks.append(Check("requests at once", "warn",
                            "unknown (no balance or no price bound to size a request's worst case)"))
        return checks
    if config.money.max_cost is not None:
        spendable = min(spendable, max(0.0, config.money.max_cost - budget.spent))
    at_once = int(spendable // worst)
    detail = (f"the balance covers {at_once:,} requests' worst case at once (${worst:.4f} each: "
              f"a mean prompt and --max-tokens {config.request.max_tokens:,} at the highest price)")
    if at_once >= config.sending.concurrency:
        return [*checks, Check("requests at once", "pass", f"{detail}; --concurrency {config.sending.concurrency:,}")]
    return [*checks, Check("requests at once", "warn",
                           f"{detail}, fewer than --concurrency {config.sending.concurrency:,}: OpenRouter's "
                           "in-flight budget will refuse the rest with 402s (kp-infer waits them out); "
                           "lower --max-tokens or add credits")]


def answer_checks(i: int, probe: Probe, acceptance: Acceptance, config: RunConfig,
                   source: str = "usage", server: Server | None = None) -> list[Check]:
    a = probe.attempt
    name = f"answer {i}: "
    if a.kind != AttemptKind.OK:
        return [Check(name + "status", "fail",
                      f"{a.kind} ({a.status or a.cause}): {a.message or 'no answer'}")]
    checks = [Check(name + "status", "pass",
                    f"{probe.status}, {a.completion_tokens:,} completion tokens in {probe.seconds:.1f} s")]
    if server is not None:
        checks.append(Check(name + "provider", "pass", f"the server {server.name}"))
    else:
        checks.append(provider_check(name, a, acceptance))
    if acceptance.expects_reasoning:
        refused = reasoning_refusal(a)
        if refused:
            checks.append(Check(name + "reasoning", "fail", f"{refused[0]}: {refused[1]}"))
        else:
            wire = f"; on the wire: {', '.join(sorted(probe.reasoning_fields))}" if probe.reasoning_fields else ""
            checks.append(Check(name + "reasoning", "pass",
                                f"{len(a.reasoning or ''):,} characters, from {a.reasoning_source}{wire}"))
    else:
        checks.append(Check(name + "reasoning", "skip", "not asked for"))
    if server is not None:
        checks.append(Check(name + "cost", "skip", "a server's answer costs nothing"))
        checks.append(ids_check(name, a, server))
    else:
        checks.append(cost_check(name, a, acceptance, source))
        if config.request.logprobs or config.request.require_logprobs:
            checks.append(logprobs_answer_check(name, a, acceptance))
    if a.finish_reason == "stop":
        checks.append(Check(name + "finish", "pass", "stop"))
    elif a.finish_reason == "length":
        checks.append(Check(name + "finish", "warn", f"length: cut by --max-tokens {config.request.max_tokens:,}"))
    else:
        checks.append(Check(name + "finish", "fail", f"{a.finish_reason}"))
    if not probe.streamed:
        checks.append(Check(name + "stream", "skip", "--no-stream"))
    else:
        # Both shapes of the last chunk are OpenRouter's: only a stream that would lose
        # money (no usage to book) or data (no finish) fails.
        shape = (f"{probe.events:,} events, {probe.comments:,} keep-alive comments, "
                 + (f"usage on the {probe.usage_shape}" if probe.usage_shape else "NO usage")
                 + ("" if probe.finished else ", NO finish_reason")
                 + (", [DONE]" if probe.done else ", no [DONE]"))
        ok = probe.usage_shape is not None and probe.finished
        checks.append(Check(name + "stream", "pass" if ok else "fail", shape))
    return checks


def provider_check(name: str, a: Attempt, acceptance: Acceptance) -> Check:
    violation = acceptance.routing_violation(a.provider)
    if violation:
        return Check(name + "provider", "fail", violation)
    if not a.provider:
        return Check(name + "provider", "warn", "the answer names no provider")
    if acceptance.endpoints is None:
        return Check(name + "provider", "warn", f"{a.provider}: no endpoints table, name checked only")
    served = serving_endpoints(a.provider, acceptance.endpoints)
    if not served:
        return Check(name + "provider", "fail",
                     f"{a.provider} is not in the endpoints table: its quantization is unknown")
    quants = ", ".join(sorted({e.quantization or "unknown" for e in served}))
    return Check(name + "provider", "pass", f"{a.provider}: {quants} in the endpoints table, allowed")


def cost_check(name: str, a: Attempt, acceptance: Acceptance, source: str = "usage") -> Check:
    if source == costs.ESTIMATE:
        return Check(name + "cost", "warn", f"usage.cost missing and GET /generation had no figure "
                     f"in time: booked at the estimate ${a.cost:.6f} (the run does the same)")
    if source == costs.GENERATION:
        return Check(name + "cost", "warn", f"usage.cost missing: ${a.cost:.6f} read from GET "
                     "/generation (the run does the same)")
    served = serving_endpoints(a.provider or "", acceptance.endpoints)
    if not served:
        return Check(name + "cost", "warn", f"${a.cost:.6f}; no listed price to compare it with")
    listed = max(a.prompt_tokens * e.prompt_price + a.completion_tokens * e.completion_price
                 for e in served)
    detail = f"${a.cost:.6f} (the listed prices give ${listed:.6f})"
    if a.cost <= 0 or listed <= 0:
        return Check(name + "cost", "fail" if a.cost <= 0 < listed else "warn", detail)
    if a.cost > listed * 1.01:
        return Check(name + "cost", "fail", detail + ": above the listed price, so the budget's "
                     "worst case would not hold")
    if a.cost < listed * 0.5:
        return Check(name + "cost", "warn", detail + ": well below the listed price")
    return Check(name + "cost", "pass", detail)


def format_preflight(report: dict) -> str:
    checks = report["checks"]
    width = max([len(c["check"]) for c in checks] + [5]) + 2
    lines = [f"kp-infer preflight: {report['requests']} request(s) to {report['model']}, "
             f"${report['spend']:.6f} paid; answers kept in {report['output']}",
             f"  {'check':<{width}}{'verdict':<9}detail"]
    for c in checks:
        lines.append(f"  {c['check']:<{width}}{c['verdict']:<9}{c['detail']}")
    if report.get("identity"):
        lines.append("identity per provider (usage.prompt_tokens minus kimipipe's count of the "
                     f"prompt, the target's inside the vendor verifier's tolerance, {band_text()}; "
                     "completion ratio: usage.completion_tokens over the answer re-encoded):")
        lines.append(identity_table_text(report["identity"]))
    failed = sum(c["verdict"] == "fail" for c in checks)
    warned = sum(c["verdict"] == "warn" for c in checks)
    lines.append(f"preflight: {'FAILED' if failed else 'passed'}: {failed} failed, {warned} "
                 f"warning{'s' if warned != 1 else ''}")
    return "\n".join(lines)
