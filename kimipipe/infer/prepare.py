"""Preparing a kp-infer run: everything decided before the first request is sent.

0. Outputs (`check_outputs`, `output_locks`): every file the run will write (`-o`,
   `--failures`, `--summary-json`, the rescue directory) is checked writable first (exit 2,
   nothing created). `-o` and `--failures` are then locked for the whole run (a lock file
   beside each, kimipipe/locks.py): a second kp-infer on either refuses at once (exit 2)
   naming who holds it, because two runs on one output would both pay for what neither has
   written yet, and two on one failures file would count each other's paid failures and
   could cut each other's records off after a failed write. `--done` files are only read,
   never locked. Everything below runs with the locks held.
1. Validate the whole input: format, duplicate IDs, empty messages, no user turn. A bad
   line stops the command (`PATH:LINE`, exit 2) before any money is spent. Standard input
   is spooled to a temporary file, since the run reads the input a second time. This pass
   keeps only the IDs and two sums (bytes and a token bound, for `--plan`).
2. Previous work: answers an earlier run paid for but could not write are taken in from
   the rescue file (infer/rescue.py), before anything is sent. Then the IDs already in
   OUTPUT (after cutting a torn last line a crash left) and in `--done` files are skipped; the spend and completion tokens recorded in OUTPUT
   (and the cost of paid failures in `--failures`) count against the budgets. A record
   another API answered (its `api`, the base URL's host, is not this run's) refuses the
   run, exit 2, naming both (recorded/api.py): offline answers never pass for real ones.
3. The partition (`--partition K/N`): how many prompts this run has to do, how many it
   skips as done.
   `--sample N` keeps only the N prompts whose SHA-256 of id is smallest (a stable
   sample: the same prompts in every run, so a pilot's answers are part of the final data).
4. The endpoints table (openrouter/account.py): the providers the routing flags allow, the
   highest prices they charge (a budget's worst case), and a warning for each allowed
   endpoint that serves re-quantized weights (openrouter/models.py). A run whose flags
   allow no endpoint, or that has `--max-cost` but no price bound, is refused (exit 2);
   without the table a run checks routing by provider name only. A `--ignore-provider` or
   `--only-provider` slug that names no provider of the table is refused (exit 2), with
   the closest known one. The model preset's token-logprobs default is decided here, against
   the table (openrouter/logprobs.py: asked where that leaves no allowed endpoint out).
5. Distillation (openrouter/account.py `model_info`): a model whose authors forbid it
   (`is_trainable_text: false`) is refused before any request while
   `provider.enforce_distillable_text` is sent (the default: OpenRouter would route none of
   them); with `--allow-non-distillable` it is a warning. Unreadable: said by `--plan` only
   (OpenRouter still enforces the flag).
6. `--total-cost` (infer/total_cost.py): with `--reservations`, this run's entry in the
   shared file and the snapshot of the entries' spend, THEN the spend recorded in the
   `--spent-in` files (finished lines only: another run may be writing one).
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import msgspec

from ..contracts import IdentityState
from ..errors import ExitCode, InputError, KPError
from ..ids import sample_key
from ..io import (
    OutputLock,
    check_writable,
    finished_records,
    iter_finished,
    iter_records,
    repair_and_report,
    require_distinct,
    scan_done,
    spool_stdin,
)
from ..openrouter import logprobs
from ..openrouter.account import AccountError, ModelInfo, fetch_endpoints, fetch_model_info
from ..openrouter.client import CompletionClient
from ..openrouter.models import preset_for, requantized_allowed, requantized_in_flags
from ..openrouter.proxy import scrub
from ..openrouter.routing import (
    Endpoint,
    Policy,
    PriceBound,
    allowed_endpoints,
    mixed_names,
    price_bound,
    unknown_slug,
    variant_ignores,
)
from ..partition import in_partition
from ..recorded.api import api_of, other_api
from ..recorded.identity_table import read_state, state_path
from ..recorded.spend import SPENT_DECODER, expand_spent_in, recorded_spend
from ..records import CostOnly, Failure, Prompt, Response
from .budget import MESSAGE_OVERHEAD_TOKENS, prompt_token_bound
from .config import RunConfig
from .conversations import OutputConversations, check_recipe, scan_output, turn_count
from .disk import DiskGuard
from .rescue import check_rescue_dir, take_in
from .servers import Server, discover, server_sampling
from .total_cost import ReservationFile, TotalCost

PROMPT_DECODER = msgspec.json.Decoder(Prompt)


class Answered(CostOnly):
    """What resume reads of a finished response record: its cost, and who answered."""

    api: str | None = None
    generation_id: str | None = None


_answered_decoder = msgspec.json.Decoder(Answered)
_failure_decoder = msgspec.json.Decoder(Failure)
_response_decoder = msgspec.json.Decoder(Response)


def check_outputs(config: RunConfig) -> None:
    """Refuse (exit 2, one line, nothing created) an output the run could not write: all
    of them, before a lock is taken or a request sent (an unwritable --summary-json found
    after the run would have paid for every answer and then failed)."""
    require_distinct(config.output, config.input)
    check_writable(config.output, "-o")
    if config.failures:
        require_distinct(config.failures, config.input, config.output)
        check_writable(config.failures, "--failures")
    if config.summary_json == "-" and config.output == "-":
        raise KPError("--summary-json - and -o - both want stdout: give one of them a file",
                      ExitCode.USAGE)
    if config.summary_json and config.summary_json != "-":
        require_distinct(config.summary_json, config.input, config.output,
                         *([config.failures] if config.failures else []))
        check_writable(config.summary_json, "--summary-json", in_place=False)
    if config.output != "-" or config.failures:
        check_rescue_dir(config.rescue_dir)


@contextmanager
def output_locks(config: RunConfig, say: Callable[[str], None]) -> Iterator[None]:
    """Hold the locks of -o and --failures (see the module docstring, step 0). Not for
    --plan: it only reads them (no repair, no rescue taken in), and `make plan` may run
    beside a build that is writing them."""
    def note(text: str) -> None:
        say(f"kp-infer: {text}")

    with ExitStack() as stack:
        for path in () if config.plan else (config.output, config.failures):
            if path:
                stack.enter_context(OutputLock(path, "kp-infer", note=note))
        yield


@dataclass
class InputScan:
    path: str  # a re-readable path (stdin spooled)
    shown: str  # the path as errors name it
    ids: set[str]
    records: int
    prompt_bytes: int
    prompt_token_bound: int
    turns: dict[str, int] = field(default_factory=dict)  # a conversation's id -> its turns
    # every request the input makes (a conversation's turns each count), for --plan: how
    # many, their prompts' bytes and token bound without the earlier answers in their
    # history, and how many earlier answers their histories carry in all
    requests: int = 0
    request_bytes: int = 0
    request_token_bound: int = 0
    history_answers: int = 0

    def turns_of(self, prompt_id: str) -> int:
        return self.turns.get(prompt_id, 1)


@dataclass
class Prepared:
    """What a run starts from."""

    scan: InputScan
    done: set[str]  # IDs answered already (OUTPUT and --done files)
    spent: float  # USD recorded by earlier runs
    tokens: int  # completion tokens recorded by earlier runs
    todo: int  # prompts of this partition still to do
    skipped: int  # prompts of this partition already done
    endpoints: list[Endpoint] | None  # None: the table could not be read
    price: PriceBound | None  # the highest prices the allowed endpoints charge
    taken_in: int = 0  # answers taken in from the rescue file (an earlier run paid for them)
    model_info: ModelInfo | str | None = None  # the model's entry, or why it is unknown
    sample: set[str] | None = None  # --sample: the IDs chosen
    spent_elsewhere: float = 0.0  # USD recorded in the --spent-in files (not OUTPUT/--failures)
    spent_in_files: list[str] = field(default_factory=list)  # the files they matched
    total: TotalCost | None = None  # --total-cost
    notes: list[str] = field(default_factory=list)  # for --plan
    conversations: OutputConversations | None = None  # the turns OUTPUT holds (conversations.py)
    turns_todo: int = 0  # requests still to send (a conversation's turns each count)
    conversations_todo: int = 0  # of `todo`, conversations (prompts with follow-ups)
    servers: list[Server] = field(default_factory=list)  # --server, as each says it serves
    identity: IdentityState = field(default_factory=IdentityState)  # OUTPUT's identity file

    def selected(self, prompt_id: str) -> bool:
        return self.sample is None or prompt_id in self.sample


class _Requests:
    """The sums InputScan keeps of the requests the input makes (see there)."""

    def __init__(self) -> None:
        self.n = self.bytes = self.token_bound = self.answers = 0

    def add(self, prompt: Prompt) -> None:
        size = sum(len(m.content.encode()) for m in prompt.messages)
        bound = prompt_token_bound(prompt.messages)
        for k, follow_up in enumerate(("", *prompt.follow_ups)):  # turn k+1 adds a user turn
            if k:
                size += len(follow_up.encode())
                bound += len(follow_up.encode()) + 2 * MESSAGE_OVERHEAD_TOKENS  # + its answer's
            self.n += 1
            self.bytes += size
            self.token_bound += bound
            self.answers += k


def validate_input(path: str, shown: str) -> InputScan:
    """Check every line before any money is spent: format, duplicate IDs, empty messages."""
    first_line: dict[str, int] = {}
    turns: dict[str, int] = {}
    requests = _Requests()
    prompt_bytes = 0
    token_bound = 0
    records = 0
    for lineno, prompt, _line in iter_records(path, PROMPT_DECODER, expect="prompt", shown=shown):
        if prompt.id in first_line:
            raise InputError(f"duplicate id {prompt.id!r} (first at line {first_line[prompt.id]})",
                             shown, lineno)
        if not prompt.messages:
            raise InputError("empty `messages` at `$.messages`", shown, lineno)
        if not any(m.role == "user" for m in prompt.messages):
            raise InputError("no user message at `$.messages`", shown, lineno)
        for i, text in enumerate(prompt.follow_ups):
            if not text.strip():
                raise InputError(f"empty user turn at `$.follow_ups[{i}]`", shown, lineno)
        first_line[prompt.id] = lineno
        records += 1
        prompt_bytes += sum(len(m.content.encode()) for m in prompt.messages)
        token_bound += prompt_token_bound(prompt.messages)
        requests.add(prompt)
        if prompt.follow_ups:
            turns[prompt.id] = turn_count(prompt)
    return InputScan(path, shown, set(first_line), records, prompt_bytes, token_bound, turns,
                     requests.n, requests.bytes, requests.token_bound, requests.answers)


def take_in_rescued(config: RunConfig, say: Callable[[str], None]) -> int:
    """Append what earlier runs paid for but could not write (infer/rescue.py) to OUTPUT
    and the failures file, after repairing their torn tails; the answers taken in."""
    answers = 0
    if config.output != "-":
        repair_and_report(config.output, report=say)
        answers, _cost = take_in(config.output, config.rescue_dir, _response_decoder, by_id=True,
                                 say=say, what="answer")
    if config.failures:
        repair_and_report(config.failures, report=say)
        take_in(config.failures, config.rescue_dir, _failure_decoder, by_id=False, say=say,
                what="failure record")
    return answers


def stable_sample(ids: set[str], n: int) -> set[str]:
    """The N IDs whose SHA-256 (of the UTF-8 id) is smallest: the same N in every run."""
    return set(heapq.nsmallest(n, ids, key=sample_key))


def previous_work(output: str, failures: str | None, say: Callable[[str], None],
                  repair: bool = True, api: str | set[str] | None = None
                  ) -> tuple[set[str], float, int]:
    """(IDs done, USD, completion tokens) recorded by earlier runs, in one pass over OUTPUT
    (after repairing a torn last line; without REPAIR, as --plan reads it, a torn last line
    is left alone) plus the failures file's costs. A record another API than API answered
    refuses the resume (recorded/api.py); API may be a set (a run with --server: every host
    it writes answers of)."""
    apis = {api} if isinstance(api, str) else api
    shown = None if apis is None else ", ".join(sorted(apis))
    if repair:
        repair_and_report(output, report=say)
    done: set[str] = set()
    cost = 0.0
    tokens = 0
    for rec in (iter_finished if repair else finished_records)(output, _answered_decoder):
        if apis is not None and rec.api is not None and rec.api not in apis:
            raise other_api(output, rec.api, rec.generation_id, rec.id, shown)
        done.add(rec.id)
        cost += rec.paid  # its own cost, and that of the answers refused before it
        tokens += rec.usage.completion_tokens
    if failures and os.path.exists(failures):
        for rec in (iter_finished if repair else finished_records)(failures, SPENT_DECODER):
            if apis is not None and rec.api is not None and rec.api not in apis:
                raise other_api(failures, rec.api, rec.generation_id, rec.id, shown)
            cost += rec.paid
    return done, cost, tokens


def requantization_warnings(model: str, policy: Policy, endpoints: list[Endpoint] | None) -> list[str]:
    """Endpoints the routing flags let through although they re-quantize the model's weights."""
    preset = preset_for(model)
    if preset is None:
        return []
    if endpoints is not None:
        names = [e.provider_name for e in endpoints]
        # a name covering several endpoints (variants) is told apart by the tag
        found = requantized_allowed(model, [
            (e.provider_name if names.count(e.provider_name) == 1 else f"{e.provider_name} ({e.tag})",
             e.quantization) for e in allowed_endpoints(policy, endpoints)])
    else:
        named = requantized_in_flags(model, policy.quantizations) if policy.quantizations else \
            sorted(preset.requantized)
        found = [f"the routing flags allow {', '.join(named)} endpoints, re-quantized from "
                 f"{model}'s native {preset.native_quantization} weights"] if named else []
    if found:
        found.append(f"to keep to the native weights, pass --quantization "
                     f"{' --quantization '.join(preset.allowed_quantizations)} (the default)")
    return found


def endpoint_warnings(policy: Policy, endpoints: list[Endpoint] | None) -> list[str]:
    """What the endpoints table says a long run should know (for --plan and --preflight):
    fewer than two endpoints allowed (one host retiring the model, or at capacity, stops
    the run), and provider names covering an excluded variant besides an allowed endpoint
    (their answers cannot be traced: kept, marked unverifiable)."""
    if endpoints is None:
        return []
    found = []
    allowed = allowed_endpoints(policy, endpoints)
    if len(allowed) == 1:
        e = allowed[0]
        found.append(f"only one endpoint is allowed ({e.provider_name}, {e.tag}): if it retires "
                     "the model or runs out of capacity, the run stops")
    for name, (ok, excluded) in sorted(mixed_names(policy, endpoints).items()):
        sent = [t for t in excluded if t in policy.variant_ignore]
        found.append(f"{name} names an allowed endpoint ({', '.join(ok)}) and an excluded variant "
                     f"({', '.join(excluded)}); answers name the provider, never the endpoint, so "
                     f"{name}'s are kept marked \"routing\": \"unverifiable\""
                     + (f" (sent in provider.ignore: {', '.join(sent)})" if sent else ""))
    return found


def read_endpoints(config: RunConfig, say: Callable[[str], None]) -> list[Endpoint] | None:
    """The model's endpoints table, or None (with a warning) when it cannot be read;
    `--plan` needs it, so there it is an error."""
    try:
        return fetch_endpoints(config.request.model, config.api_key, config.base_url,
                               proxy=config.proxy)
    except AccountError as e:
        why = scrub(str(e), config.proxy)
        if config.plan:
            raise KPError(f"cannot read the endpoints table: {why}") from None
        say(f"kp-infer: warning: cannot read the endpoints table ({why}); "
            "routing is checked by provider name only")
        return None


def check_transport(config: RunConfig) -> None:
    """Build what the workers will build, here: a bad base URL, key, CA file or proxy is
    exit 2 before anything is read or sent."""
    try:
        CompletionClient(config.base_url, config.api_key or "-", idle_timeout=config.idle_timeout,
                         proxy=config.proxy)
    except ValueError as e:
        raise KPError(scrub(str(e), config.proxy), ExitCode.USAGE) from None
def check_provider_slugs(config: RunConfig, endpoints: list[Endpoint]) -> None:
    """Refuse (exit 2) a --ignore-provider/--only-provider slug that names no provider of
    the endpoints table: it would ignore nothing, or allow nothing, silently."""
    for option, slugs in (("--ignore-provider", config.policy.ignore),
                          ("--only-provider", config.policy.only)):
        for slug in slugs:
            why = unknown_slug(slug, endpoints)
            if why:
                raise KPError(f"{option} {slug!r}: no provider of {config.request.model} is "
                              f"called that; {why}", ExitCode.USAGE)


def read_model_info(config: RunConfig) -> ModelInfo | str:
    """The model's entry (for its distillation permission), or why it could not be read."""
    try:
        return fetch_model_info(config.request.model, config.api_key, config.base_url,
                                proxy=config.proxy)
    except AccountError as e:
        return scrub(str(e), config.proxy)


def check_distillation(config: RunConfig, info: ModelInfo | str, say: Callable[[str], None]) -> None:
    """Refuse (exit 2) a model whose authors forbid distillation while it is enforced."""
    if not isinstance(info, ModelInfo) or info.is_trainable_text is not False:
        return
    if config.policy.enforce_distillable_text:
        raise KPError(f"the authors of {config.request.model} do not allow distillation "
                      "(is_trainable_text: false): with provider.enforce_distillable_text "
                      "(the default) OpenRouter routes no request; --allow-non-distillable "
                      "sends anyway, but the answers must not train a drafter", ExitCode.USAGE)
    say(f"kp-infer: warning: the authors of {config.request.model} do not allow distillation; "
        "sent anyway (--allow-non-distillable): the answers must not train a drafter")


def check_no_single_answers(scan: InputScan, done: set[str], conversations: OutputConversations,
                            config: RunConfig, say: Callable[[str], None]) -> None:
    """A conversation of the input (a prompt with follow-ups) that OUTPUT answers as one
    plain record (written under `kp-prompts --turns last` or `each`: one answer, on the
    source's own history) would be skipped as done, and its single off-policy answer kept
    for good: a mixed recipe, a drafter trained on turns the model never answered.
    Refused (exit 2), unless --allow-mixed."""
    single = sorted(i for i in scan.turns if i in done and i not in conversations.finished)
    if not single:
        return
    where = "" if config.output == "-" else f"{config.output}: "
    told = (f"{where}{len(single):,} conversation(s) of {scan.shown} (first: {single[0]!r}) are "
            "answered there as single prompts (kp-prompts --turns last/each: one answer on the "
            "source's history), and would be skipped as done")
    if not config.allow_mixed:
        raise KPError(f"{told}; write the turns to a new output (make: `make D.clean`, or "
                      "another WORK), or --allow-mixed to keep those single answers",
                      ExitCode.USAGE)
    say(f"kp-infer: warning: {told}; kept (--allow-mixed)")


def prepare(config: RunConfig, tmpdir: str, say: Callable[[str], None]) -> Prepared:
    """Validation, resume state and routing, before anything is sent (see the module doc)."""
    check_transport(config)
    path, shown = config.input, config.input
    if path == "-":
        path, shown = spool_stdin(tmpdir), "<stdin>"
    scan = validate_input(path, shown)
    require_distinct(config.output, config.input, *config.done_files)
    if not config.plan:  # a disk that cannot take one answer: exit 3 now, not a wait for ever
        DiskGuard(config.output, config.request.max_tokens, config.min_free_disk).check_room_at_start()
    # --plan may run beside a build writing OUTPUT: it neither repairs nor takes anything in
    taken_in = 0 if config.plan else take_in_rescued(config, say)
    done, spent, tokens = previous_work(config.output, config.failures, say, repair=not config.plan,
                                        api=config.apis)
    conversations = scan_output(config.output)
    check_recipe(conversations.recipes, config.request.model,
                 config.request.sampling(config.policy), config.history_reasoning,
                 config.output, config.allow_mixed, say,
                 server_sampling(config.request.fields(config.policy)) if config.servers else None)
    check_no_single_answers(scan, done, conversations, config, say)
    done |= conversations.finished  # a finished conversation is done as a whole
    for extra in config.done_files:
        if not os.path.exists(extra):
            raise InputError("no such file", extra)
        done |= scan_done(extra, repair=False)
    sample = stable_sample(scan.ids, config.sample) if config.sample is not None else None
    in_part = [i for i in scan.ids if in_partition(i, config.partition) and (sample is None or i in sample)]
    skipped = sum(1 for i in in_part if i in done)
    todo_ids = [i for i in in_part if i not in done]
    turns_todo = sum(scan.turns_of(i) - (conversations.open[i].turn if i in conversations.open else 0)
                     for i in todo_ids)

    if not config.openrouter:  # servers only: no endpoints table, no prices, no model entry
        if config.max_cost is not None or config.total_cost is not None:
            raise KPError("--max-cost and --total-cost cap OpenRouter's spend: a run with "
                          "--server and no --openrouter spends none (the token budget, "
                          "--token-budget, applies)", ExitCode.USAGE)
        prepared = Prepared(scan, done, spent, tokens, len(in_part) - skipped, skipped, None,
                            None, taken_in=taken_in, model_info="servers only", sample=sample,
                            servers=discover_servers(config, say))
        prepared.notes.append(f"servers only ({', '.join(config.servers)}): no OpenRouter "
                              "routing, prices or balance; the answers cost nothing")
        return prepared
    identity = take_in_quarantine(config, say)
    endpoints = read_endpoints(config, say)
    # the preset's token-logprobs default, decided against the table (openrouter/logprobs.py)
    logprobs_note = logprobs.resolve(config.request, config.policy, endpoints)
    if logprobs_note and not config.plan:
        say(f"kp-infer: {logprobs_note}")
    if endpoints is not None:
        check_provider_slugs(config, endpoints)
        # excluded variants under an allowed provider's name: kept out by the request itself
        config.policy.variant_ignore = variant_ignores(config.policy, endpoints)
        config.policy.unverifiable_names = sorted(mixed_names(config.policy, endpoints))
    bound = price_bound(config.policy, endpoints)
    info = read_model_info(config)
    if not config.plan:  # (the plan shows the warnings in its table)
        for warning in requantization_warnings(config.request.model, config.policy, endpoints):
            say(f"kp-infer: warning: {warning}")
        if endpoints is not None and not allowed_endpoints(config.policy, endpoints):
            quarantined = (f"; {state_path(config.output)} quarantines "
                           + ", ".join(q.provider for q in identity.quarantined)
                           + " for identity (remove it to lift that)") if identity.quarantined else ""
            raise KPError("no provider in the endpoints table matches the routing flags "
                          f"(see kp-infer --plan){quarantined}", ExitCode.USAGE)
        capped = "--max-cost" if config.max_cost is not None else "--total-cost"
        if (config.max_cost is not None or config.total_cost is not None) and bound is None:
            raise KPError(f"{capped} needs a price bound: the endpoints table could not be read; "
                          "pass --max-price-prompt and --max-price-completion", ExitCode.USAGE)
        check_distillation(config, info, say)
    prepared = Prepared(scan, done, spent, tokens, len(in_part) - skipped, skipped, endpoints, bound,
                        taken_in=taken_in, model_info=info, sample=sample,
                        conversations=conversations, turns_todo=turns_todo,
                        conversations_todo=sum(1 for i in todo_ids if i in scan.turns),
                        servers=discover_servers(config, say), identity=identity)
    if logprobs_note:
        prepared.notes.append(logprobs_note)
    if config.plan and config.output == "-":
        prepared.notes.append("no -o: the answers a run already wrote cannot be seen here, so every "
                              "prompt counts as to do; pass the -o (and --failures) of the run to "
                              "see what is left")
    if config.total_cost is not None:
        prepare_total_cost(config, prepared)
    return prepared


def take_in_quarantine(config: RunConfig, say: Callable[[str], None]) -> IdentityState:
    """The providers an earlier run on OUTPUT quarantined for identity (infer/identity.py):
    in provider.ignore again (Policy.quarantine), with or without --tokenizer, and said."""
    path = state_path(config.output)
    state = read_state(path)
    for q in state.quarantined:
        config.policy.quarantine.extend(s for s in q.slugs if s not in config.policy.quarantine)
        if not config.plan:  # (the plan's table names them)
            say(f"kp-infer: {q.provider} stays quarantined ({path}: quarantined {q.at}, its "
                f"prompt counts typically {'unknown' if q.offset is None else f'{q.offset:+d}'} "
                "from the target's): in provider.ignore; remove that file to lift it")
    return state


def discover_servers(config: RunConfig, say: Callable[[str], None]) -> list[Server]:
    """Each --server asked what it serves (infer/servers.py `discover`; exit 2 when one
    cannot say); not for --plan, which sends nothing anywhere."""
    if config.plan:
        return []
    servers = [discover(arg, config.request.model) for arg in config.servers]
    for server in servers:
        if server.model != config.request.model:
            say(f"kp-infer: {server.name} serves {config.request.model} as {server.model!r} "
                f"({server.kind}); its records name {config.request.model}")
    return servers


def prepare_total_cost(config: RunConfig, prepared: Prepared) -> None:
    """--total-cost: register with --reservations (not for --plan), then read the
    --spent-in files: in this order, see infer/total_cost.py."""
    shared = None
    snapshot = 0.0
    if config.reservations and not config.plan:
        shared = ReservationFile(config.reservations, label=config.output)
        try:
            snapshot = shared.register()
        except OSError as e:
            shared.close()
            raise KPError(f"--reservations: {e}", ExitCode.USAGE) from None
    try:
        files = expand_spent_in(config.spent_in, [config.output, config.failures or ""])
        elsewhere = sum(recorded_spend(path, api_of(config.base_url)) for path in files)
    except BaseException:
        if shared is not None:
            TotalCost(config.total_cost, 0.0, shared).close(0.0)
        raise
    prepared.spent_in_files, prepared.spent_elsewhere = files, elsewhere
    prepared.total = TotalCost(config.total_cost, prepared.spent + elsewhere - snapshot, shared)
