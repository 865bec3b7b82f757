"""Preparing a kp-infer run: everything decided before the first request is sent, each
step in the module of its job, in this order (the outputs are checked and locked first:
infer/writing.py `check_outputs`, `output_locks`):

1. The input, read whole (infer/inputs.py): every line checked before any money is
   spent, standard input spooled (the run reads it a second time); only IDs and sums kept.
2. Previous work (infer/resume.py): the rescue file taken in, the IDs already answered in
   OUTPUT and `--done` files skipped, the spend and tokens recorded there counted, a
   record of another API refused, the conversations' turns and recipe checked, the
   providers an earlier run quarantined for identity ignored again.
3. The partition (`--partition K/N`) and `--sample N`: how many prompts this run has to
   do (a conversation's turns each count as a request), how many it skips as done.
4. The endpoints table and the model's entry (infer/endpoints.py): the routing flags'
   endpoints, the price bound, the warnings, the refusals (no endpoint, no price bound
   for a cap, a forbidden distillation).
5. `--server`: each server asked what it serves (infer/discovery.py `discover_servers`).
6. `--total-cost` (infer/total_cost.py `open_total_cost`): this run's entry in
   `--reservations`, THEN the spend recorded in the `--spent-in` files.

A run with `--server` and no `--openrouter` skips 4 and 6: no table, no prices, no spend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..contracts import IdentityState
from ..errors import ExitCode, KPError
from ..io import require_distinct
from ..openrouter.account import ModelInfo
from ..openrouter.client import CompletionClient
from ..openrouter.proxy import scrub
from ..openrouter.routing import Endpoint, PriceBound
from ..partition import in_partition
from ..recorded.api import api_of
from .config import RunConfig
from .conversations import OutputConversations
from .discovery import discover_servers
from .disk import DiskGuard
from .endpoints import read_routing
from .inputs import InputScan, read_input, stable_sample
from .resume import read_previous_work, take_in_quarantine
from .servers import Server
from .total_cost import TotalCost, open_total_cost


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


def prepare(config: RunConfig, tmpdir: str, say: Callable[[str], None]) -> Prepared:
    """Validation, resume state and routing, before anything is sent (see the module doc)."""
    check_transport(config)
    scan = read_input(config.files.input, tmpdir)
    require_distinct(config.files.output, config.files.input, *config.files.done_files)
    if not config.plan:  # a disk that cannot take one answer: exit 3 now, not a wait for ever
        DiskGuard(config.files.output, config.request.max_tokens, config.files.min_free_disk).check_room_at_start()
    previous = read_previous_work(config, scan, say)
    done, conversations = previous.done, previous.conversations
    sample = stable_sample(scan.ids, config.files.sample) if config.files.sample is not None else None
    in_part = [i for i in scan.ids if in_partition(i, config.files.partition) and (sample is None or i in sample)]
    skipped = sum(1 for i in in_part if i in done)
    todo_ids = [i for i in in_part if i not in done]
    # what is left of each conversation: the turns OUTPUT holds of it as it is now are not
    # asked again (a conversation fixed under its id: from the turn that changed)
    turns_todo = sum(scan.turns_of(i) - (conversations.open[i].turn if i in conversations.open
                                         else 0) for i in todo_ids)
    conversations_todo = sum(1 for i in todo_ids if i in scan.turns)
    notes: list[str] = []
    if config.sending.openrouter:
        identity = take_in_quarantine(config, say)
        routing = read_routing(config, identity, say)
        endpoints, price, model_info = routing.endpoints, routing.price, routing.model_info
        notes += [routing.logprobs_note] if routing.logprobs_note else []
    else:  # servers only: no endpoints table, prices, model entry, balance or quarantine
        if config.money.max_cost is not None or config.money.total_cost is not None:
            raise KPError("--max-cost and --total-cost cap OpenRouter's spend: a run with "
                          "--server and no --openrouter spends none (the token budget, "
                          "--token-budget, applies)", ExitCode.USAGE)
        identity, endpoints, price, model_info = IdentityState(), None, None, "servers only"
        notes.append(f"servers only ({', '.join(config.sending.servers)}): no OpenRouter "
                     "routing, prices or balance; the answers cost nothing")
    prepared = Prepared(
        scan, done, previous.spent, previous.tokens, len(in_part) - skipped, skipped,
        endpoints, price, taken_in=previous.taken_in, model_info=model_info, sample=sample,
        conversations=conversations, turns_todo=turns_todo,
        conversations_todo=conversations_todo, servers=discover_servers(config, say),
        identity=identity, notes=notes)
    if config.plan and config.files.output == "-":
        prepared.notes.append("no -o: the answers a run already wrote cannot be seen here, so every "
                              "prompt counts as to do; pass the -o (and --failures) of the run to "
                              "see what is left")
    if config.money.total_cost is not None:
        prepared.total, prepared.spent_in_files, prepared.spent_elsewhere = open_total_cost(
            config.money, config.files, api_of(config.sending.base_url), config.plan, prepared.spent)
    return prepared


def check_transport(config: RunConfig) -> None:
    """Build the run's client once before the run: a bad base URL, key, CA file or proxy is
    exit 2 before anything is read or sent."""
    try:
        CompletionClient(config.sending.base_url, config.sending.api_key or "-", idle_timeout=config.sending.idle_timeout,
                         proxy=config.sending.proxy)
    except ValueError as e:
        raise KPError(scrub(str(e), config.sending.proxy), ExitCode.USAGE) from None
