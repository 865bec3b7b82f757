"""`kp-infer --preflight [N]`: N real requests (default 3) that check what a long run assumes.

A run of hours rests on facts that are cheap to check first and costly to find out late.
The preflight prepares the run as a run does (input, routing, distillation, `--max-cost`),
then checks, each `pass`, `warn` or `fail`:

    endpoints table    readable; how many endpoints the routing flags allow
    distillation       the model's authors allow it (`is_trainable_text`)
    balance            `/credits` and `/key` readable with this key; what is spendable
    requests at once   how many requests' worst case the balance covers at once, against
                       --concurrency (OpenRouter's in-flight budget is at most the balance:
                       fewer than --concurrency means its 402s will pace the run)
and sends the first N prompts still to do (streamed or not, as the run will), through the
run's own transport (infer/transport.py: the same client, connections, proxy and answer
assembly) with a tap that sees every line of each answer (openrouter/probe.py); an answer
whose usage shows no cost is settled as the run settles it (infer/costs.py: GET
/generation over the same client). The verdicts: infer/preflight_checks.py. Per answer:
    status             an answer came back (else the error, classified as the run would)
    provider           the provider that served it is allowed, and the endpoints table
                       lists it, with the quantization the table gives it
    reasoning          present, and where it came from (field, details or inline), when
                       reasoning is asked for; the run's own check (infer/acceptance.py)
    cost               `usage.cost` present, and plausible against the serving endpoint's
                       listed prices (above them: fail, the budget's bound would not hold;
                       under half of them: warn)
    finish             `stop` (pass), `length` (warn: cut by --max-tokens), else fail
    logprobs           with token logprobs asked (`--logprobs`, or the preset's default):
                       which allowed endpoints list them and the share of answers expected
                       to carry them; per answer, the tokens that came (and whether they
                       spell the text), none from an endpoint that lists them: warn
    stream             keep-alive comments, where the usage came (its own last chunk or
                       the finish chunk: both are OpenRouter's), `[DONE]`; fails only
                       when no usage came (the spend cannot be booked) or no finish

With `--server` (docs/servers.md), each server has answered GET /v1/models before this
(prepare: the model name it serves, its kind; exit 2 when one cannot say), and:

    server NAME        its kind, and the name it serves --model under
    the prompts        go to the run's sources in turn: each server, then OpenRouter (with
                       --openrouter), so N at least their number has each answer one; a
                       server's answer is checked as a server's: its provider is the
                       server, its cost is none, and
    sampled IDs        returned, as its kind is asked for them (vLLM's return_token_ids,
                       SGLang's sglext), and as many as its usage's completion tokens
    NAME: thinking     the first prompt asked once more of each server with thinking
                       switched the other way (chat_template_kwargs; at most 512 tokens, not
                       kept): the template took the switch when reasoning comes or goes
Without --openrouter nothing of OpenRouter's is read (no endpoints table, distillation
or balance check) and no OpenRouter key is needed.

The answers are kept: appended to `-o` as the run would write them (so the run skips
them and they are not paid twice), or, when refused, to `--failures` with their cost. The
report goes to stdout (a table, or `--json`):

    {"model": str, "output": path, "requests": int, "spend": float,
     "checks": [{"check": str, "verdict": "pass"|"warn"|"fail"|"skip", "detail": str}],
     "answers": [{"id", "source", "status", "provider", "finish_reason", "reasoning_source", "cost",
                  "comments", "events", "usage_shape", "done", "seconds"}],
     "passed": bool}

Exit 0 when no check failed (warnings allowed), 4 when one did; 2 for bad input or flags
(as a run); 3 when `--max-cost` leaves no room for N requests' worst case.
"""

from __future__ import annotations

import asyncio
import functools
import json
import tempfile
from collections.abc import Callable
from dataclasses import asdict

import msgspec

from ..errors import ExitCode, KPError
from ..io import iter_records
from ..kinds import AttemptKind, RefusalKind
from ..openrouter.account import Account
from ..openrouter.attempt import Attempt
from ..openrouter.probe import Probe, send_probe
from ..partition import in_partition
from ..records import Prompt, Refusal
from . import costs
from .acceptance import Acceptance
from .availability import availability_text, endpoints_left
from .budget import Budget, prompt_token_bound
from .config import RunConfig
from .conversations import first_turn, is_conversation
from .endpoints import endpoint_warnings
from .identity import IdentityJudge, check_tokenizer, load_counts
from .identity_votes import OFF
from .identity_votes import CountCheck as IdentityCheck
from .inputs import PROMPT_DECODER
from .preflight_checks import (
    Check,
    answer_checks,
    balance_checks,
    distillation_check,
    format_preflight,
    logprobs_check,
    server_check,
    table_check,
)
from .preflight_identity import allowed_providers, only, provider_rows, verdicts
from .prepare import Prepared, prepare
from .servers import (
    Server,
    Sources,
    thinking_asked,
)
from .state import run_interruptible
from .transport import open_transport
from .writing import Output, failure_record

DEFAULT_REQUESTS = 3


def run_preflight(config: RunConfig, n: int, as_json: bool, say: Callable[[str], None],
                  echo: Callable[[str], None]) -> int:
    """Prepare, check, send N prompts, keep their answers; the report through ECHO."""
    if config.files.output == "-":
        raise KPError("--preflight keeps its answers for the run: give -o FILE (the run's output)",
                      ExitCode.USAGE)
    if config.plan:
        raise KPError("--preflight and --plan: one at a time", ExitCode.USAGE)
    if config.identity.tokenizer:
        check_tokenizer(config.identity)  # (a missing directory: exit 2 before anything is read)
    with tempfile.TemporaryDirectory(prefix="kp-infer-") as tmpdir:
        prepared = prepare(config, tmpdir, say)
        budget = Budget(config.money, config.request.max_tokens, prepared.price,
                        spent=prepared.spent, tokens=prepared.tokens)
        counts = load_counts(config.identity, config.request) if config.identity.tokenizer and config.sending.openrouter else None
        # with --tokenizer, one more request per allowed provider (infer/preflight_identity.py)
        providers = (allowed_providers(config.policy, prepared.endpoints)
                     if counts is not None else [])
        chosen = first_to_do(config, prepared, n + len(providers))
        prompts, probes = chosen[:n], list(zip(providers, chosen[n:], strict=False))
        worst = sum(budget.worst_case(prompt_token_bound(p.messages)) for p, _line, _sid in chosen)
        if not budget.cost_fits(worst):
            raise KPError(f"--max-cost ${config.money.max_cost:g} leaves no room for the preflight's "
                          f"{len(chosen)} requests (worst case ${worst:.4f}; "
                          f"${budget.spent:.4f} recorded)", ExitCode.BUDGET)
        report = run_interruptible(_preflight(config, prepared, budget, prompts, counts, probes,
                                           [name for (name, _tags), _p in probes]))
    echo(json.dumps(report, indent=2) if as_json else format_preflight(report))
    return ExitCode.OK if report["passed"] else ExitCode.PARTIAL


def first_to_do(config: RunConfig, prepared: Prepared, n: int
                ) -> list[tuple[Prompt, bytes, str | None]]:
    """The first N prompts of this partition not done yet (what the run would send first),
    each with its session_id: for a conversation, its next turn (infer/conversations.py),
    sent and kept as the run does it."""
    chosen = []
    for _lineno, prompt, line in iter_records(prepared.scan.path, PROMPT_DECODER):
        if prompt.id in prepared.done or not in_partition(prompt.id, config.files.partition):
            continue
        if is_conversation(prompt):
            resume = prepared.conversations
            turn = first_turn(prompt, line, config.history_reasoning,
                              resume.resume_point(prompt.id) if resume else None)
            if turn is None:
                continue
            chosen.append((turn.prompt, turn.line, prompt.id))
        else:
            chosen.append((prompt, line, None))
        if len(chosen) == n:
            break
    return chosen


async def _preflight(config: RunConfig, prepared: Prepared, budget: Budget,
                     prompts: list[tuple[Prompt, bytes, str | None]], counts=None,
                     one_each: list = (), probed: list[str] = ()) -> dict:
    """The checks (module docstring), over the clients a run opens (infer/run.py): its
    transport (infer/transport.py) and its Account (the balance, GET /generation)."""
    account = Account(config.sending.api_key, config.sending.base_url, proxy=config.sending.proxy)
    try:
        async with open_transport(config, prepared.servers) as transport:
            return await _checks(config, prepared, budget, prompts, counts, one_each, probed,
                                 account, transport)
    finally:
        await account.aclose()


async def _checks(config: RunConfig, prepared: Prepared, budget: Budget,
                  prompts: list[tuple[Prompt, bytes, str | None]], counts, one_each: list,
                  probed: list[str], account: Account, transport) -> dict:
    """The checks; ONE_EACH: ((provider, tags), prompt) sent to that provider alone, and
    PROBED their names (--tokenizer: infer/preflight_identity.py)."""
    checks = []
    if config.sending.openrouter:  # (a run with --server alone reads nothing of OpenRouter's)
        checks += [table_check(config, prepared), logprobs_check(config, prepared),
                   Check("availability", *availability_text(
                       endpoints_left(config.policy, prepared.endpoints), config.request.model)),
                   distillation_check(config, prepared.model_info)]
        checks += [Check("routing", "warn", w)
                   for w in endpoint_warnings(config.policy, prepared.endpoints)]
        checks.extend(await balance_checks(config, prepared, budget, account))
    checks += [server_check(server, config) for server in prepared.servers]
    # the prompts go to the run's sources in turn (each server, then OpenRouter), so that
    # every source answers one when N is at least their number
    targets: list[Server | None] = [*prepared.servers, *([None] if config.sending.openrouter else [])]
    sent_to = [targets[i % len(targets)] for i in range(len(prompts))]
    if len(prompts) < len(targets):
        checks.append(Check("sources", "warn", f"{len(prompts)} request(s) for {len(targets)} "
                            "sources: " + ", ".join(_source_name(t) for t in targets[len(prompts):])
                            + " not sent one (--preflight N with N at least the sources)"))
    output = Output(config)
    acceptance = Acceptance.for_run(config.policy, config.request, config.sending.servers,
                                    prepared.endpoints)
    sent = await asyncio.gather(*(
        [_send(transport, config, target, config.request.body(prompt, config.policy, session_id))
         for (prompt, _line, session_id), target in zip(prompts, sent_to, strict=True)]
        + [_send(transport, config, None,
                 config.request.body(prompt, only(config.policy, tags), session_id))
           for (_name, tags), (prompt, _line, session_id) in one_each]))
    switches = await _thinking_switches(transport, config, prepared.servers, prompts)
    # the requests to one provider each (--tokenizer): kept as the run keeps its answers
    probes, asked = sent[:len(prompts)], sent[len(prompts):]
    prompts = [*prompts, *(p for _provider, p in one_each)]
    sent_to = [*sent_to, *([None] * len(asked))]
    probes = [*probes, *asked]
    # an answer whose usage shows no cost: settled as the run settles it (infer/costs.py)
    sources = {id(probe): costs.SERVER for probe, target in zip(probes, sent_to, strict=True)
               if target is not None}
    unsettled = [(prompt, probe) for (prompt, _line, _sid), probe in zip(prompts, probes, strict=True)
                 if probe.attempt.kind == AttemptKind.OK and probe.attempt.cost is None]
    for prompt, probe in unsettled:
        worst = budget.worst_case(prompt_token_bound(prompt.messages))
        probe.attempt.cost, sources[id(probe)] = await costs.settle(
            probe.attempt, prepared.price, worst, transport.generation_cost,
            config.money.cost_lookup_wait)
    judge, identities = _identities(config, prepared, counts, prompts, probes, sent_to, acceptance)
    if counts is None and config.sending.openrouter:
        checks.append(Check("identity", "warn", "unchecked: the answers' token counts are not "
                            "compared with the target model's; pass --tokenizer DIR (the "
                            "target's tokenizer, as kp-tokenize takes it)"))
    output.open()
    spend = 0.0
    answers = []
    try:
        for i, ((prompt, line, _sid), probe, target) in enumerate(
                zip(prompts, probes, sent_to, strict=True), start=1):
            source = sources.get(id(probe), costs.USAGE)
            checks.extend(answer_checks(i, probe, acceptance, config, source, target))
            spend += _keep(prompt, line, probe, acceptance, output, source,
                           identities.get(id(probe)), judge)
            a = probe.attempt
            answers.append({"id": prompt.id, "source": _source_name(target),
                            "status": probe.status, "provider": a.provider,
                            "finish_reason": a.finish_reason,
                            "reasoning_source": a.reasoning_source or None, "cost": a.cost,
                            "comments": probe.comments, "events": probe.events,
                            "usage_shape": probe.usage_shape, "done": probe.done,
                            "seconds": round(probe.seconds, 3),
                            "identity_offset": (identities[id(probe)].offset
                                                if id(probe) in identities else None)})
    finally:
        output.close()
    checks += switches
    identity_rows = []
    if judge is not None:
        unanswered = {name: f"{p.attempt.kind} ({p.attempt.status or p.attempt.cause}): "
                            f"{p.attempt.message}"
                      for name, p in zip(probed, asked, strict=False)
                      if p.attempt.kind != AttemptKind.OK}
        allowed = [name for name, _tags in allowed_providers(config.policy, prepared.endpoints)]
        identity_rows = provider_rows(judge, list(identities.values()), allowed, unanswered)
        for row in identity_rows:
            verdict = ("pass" if row.get("in_band") else
                       "fail" if row["verdict"] in ("different", "no answer") else "warn")
            checks.append(Check(f"identity {row['provider']}", verdict,
                                f"{row['verdict']}: {row['detail']}"))
    if not prompts:
        checks.append(Check("answers", "warn", "no prompt left to send: every one is done"))
    return {"model": config.request.model, "output": config.files.output, "requests": len(prompts),
            "spend": round(spend, 10), "checks": [asdict(c) for c in checks],
            "answers": answers, "identity": identity_rows,
            "passed": not any(c.verdict == "fail" for c in checks)}


def _identities(config: RunConfig, prepared: Prepared, counts, prompts, probes, sent_to,
                acceptance: Acceptance):
    """Each OpenRouter answer's identity check (infer/identity.py), its verdict taken with
    every answer in hand (infer/preflight_identity.py): (the judge, {id(probe): Check})."""
    if counts is None:
        return None, {}
    judge = IdentityJudge(counts, config.policy, prepared.endpoints)
    found = {}
    for (prompt, _line, _sid), probe, target in zip(prompts, probes, sent_to, strict=True):
        a = probe.attempt
        if target is not None or a.kind != AttemptKind.OK or acceptance.refusal(a) is not None:
            continue
        found[id(probe)] = judge.measure(prompt.id, prompt.messages,
                                         judge.count(prompt.messages), a)
    verdicts(judge, list(found.values()))
    return judge, found


def _keep(prompt: Prompt, line: bytes, probe: Probe, acceptance: Acceptance,
          output: Output, source: str, identity: IdentityCheck | None = None,
          judge: IdentityJudge | None = None) -> float:
    """Write a paid answer as the run would (a result, or a failure with its cost, settled
    by infer/costs.py when its usage showed none; IDENTITY: its identity check, judged)."""
    a = probe.attempt
    if a.kind != AttemptKind.OK:
        return 0.0
    cost = a.cost
    refused = acceptance.refusal(a)
    if refused is None and identity is not None and identity.verdict == OFF:
        refused = (RefusalKind.IDENTITY, judge.refusal(identity))
    if refused is None:
        output.write_response(line, a, 1, latency=probe.seconds, cost=cost, cost_source=source,
                              identity=identity.mark() if identity is not None else None)
    else:
        kind, why = refused
        offset = identity.offset if kind == RefusalKind.IDENTITY else None
        output.write_failure(failure_record(
            prompt, kind, Attempt(AttemptKind.PERMANENT, message=why, status=200), 1, provider=a.provider,
            generation_id=a.generation_id, cost=cost, refused=[Refusal(
                kind=kind, provider=a.provider, cost=cost, generation_id=a.generation_id,
                message=why, cost_source=source, offset=offset)]))
    return cost


def _source_name(target: Server | None) -> str:
    return "openrouter" if target is None else target.name


async def _send(transport, config: RunConfig, target: Server | None, body: bytes,
                stream: bool | None = None) -> Probe:
    """BODY (the OpenRouter request) sent to TARGET (None: OpenRouter) by the run's
    TRANSPORT, as the run sends it (to a server as the server takes it, its answer the
    server's: infer/servers.py), a stream read through the probe's tap (openrouter/probe.py)."""
    stream = config.request.stream if stream is None else stream
    if isinstance(transport, Sources):
        source = transport.source_of(target)
        return await send_probe(functools.partial(transport.send, source), body, stream)
    return await send_probe(transport.attempt, body, stream)


SWITCH_MAX_TOKENS = 512  # enough for reasoning to begin, or for an answer without it


async def _thinking_switches(transport, config: RunConfig,
                             servers: list[Server], prompts) -> list[Check]:
    """Each server asked the first prompt with thinking switched the other way from the run
    (`chat_template_kwargs`): a server whose template ignores the switch answers both ways
    alike, and the run's own answers could not show it. Not kept: not the run's recipe."""
    asked = thinking_asked(config.request.fields(config.policy))
    if not servers or not prompts or asked is None:
        return []
    prompt, _line, session_id = prompts[0]
    fields = msgspec.json.decode(config.request.body(prompt, config.policy, session_id))
    fields["reasoning"] = {"enabled": not asked}
    fields["max_tokens"] = min(config.request.max_tokens, SWITCH_MAX_TOKENS)
    body = msgspec.json.encode(fields)
    probes = await asyncio.gather(*(_send(transport, config, server, body) for server in servers))
    checks = []
    for server, probe in zip(servers, probes, strict=True):
        name = f"{server.name}: thinking {'on' if not asked else 'off'}"
        a = probe.attempt
        if a.kind != AttemptKind.OK:
            checks.append(Check(name, "fail", f"{a.kind} ({a.status or a.cause}): {a.message}"))
        elif bool(a.reasoning) == (not asked):
            checks.append(Check(name, "pass", "the chat template took the switch: "
                                + (f"{len(a.reasoning or ''):,} characters of reasoning" if not asked
                                   else "no reasoning")))
        else:
            checks.append(Check(name, "fail", "the switch was not taken (chat_template_kwargs "
                                f"thinking={not asked}): " + ("no reasoning" if not asked else
                                f"{len(a.reasoning or ''):,} characters of reasoning")
                                + "; is the server's chat template the model's?"))
    return checks


