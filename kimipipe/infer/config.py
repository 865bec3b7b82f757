"""The configuration of a kp-infer run, as commands/infer.py builds it from the options: one
`RunConfig` made of the parts each room reads, and each room is handed only its part.

    Files          what goes in and out: the input, -o, --failures, --done, the rescue
                   directory, the disk guard's margin and wait, --partition, --sample
    Money          the caps and the balance: --max-cost, --token-budget, --total-cost and
                   what shares it, --min-credits, the cost lookup (infer/budget.py reads its
                   limits from here, keeping no copy)
    Sending        where requests go and how many at once: OpenRouter (its URL, key, proxy)
                   and the --server URLs, the concurrency, the idle timeout
    Retries        how a prompt is sent again: --max-attempts, the backoff; --grace
    IdentityCheck  --tokenizer and what checking each answer's identity takes

What the request asks (`RequestOptions`) and the routing (`Policy`) are their own types
(kimipipe/openrouter/). A new setting is one field of the part whose room reads it, filled
by its option (`fills=` in infer/options.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..openrouter import DEFAULT_BASE_URL
from ..openrouter.request import RequestOptions
from ..openrouter.routing import Policy
from .disk import DEFAULT_DISK_WAIT, DEFAULT_MARGIN


@dataclass
class Files:
    """What goes in and out (infer/writing.py, infer/resume.py, infer/rescue.py)."""

    input: str = "-"
    output: str = "-"
    done_files: list[str] = field(default_factory=list)  # --done: IDs that count as done
    failures: str | None = None  # --failures file (appended to)
    summary_json: str | None = None
    rescue_dir: str | None = None  # --rescue: paid answers -o could not take (None: the default)
    min_free_disk: int = DEFAULT_MARGIN  # bytes kept free on -o's filesystem (infer/disk.py)
    disk_wait: float = DEFAULT_DISK_WAIT  # seconds waiting for disk, nothing in flight, then stop
    partition: tuple[int, int] | None = None  # (K, N)
    sample: int | None = None  # --sample N: only the N prompts whose SHA-256 of id is smallest
    allow_mixed: bool = False  # --allow-mixed: resume into an output asked otherwise


@dataclass
class Money:
    """The caps and the balance (infer/budget.py, infer/total_cost.py, the run's polls)."""

    max_cost: float | None = None  # USD recorded in OUTPUT (and --failures), all runs
    token_budget: int | None = None  # completion tokens recorded in OUTPUT, all runs
    total_cost: float | None = None  # USD recorded here, in --failures and in --spent-in files
    spent_in: list[str] = field(default_factory=list)  # --spent-in: paths or globs
    reservations: str | None = None  # --reservations: the file runs sharing --total-cost lock
    min_credits: float | None = None  # USD of balance below which admission stops
    credits_interval: float = 60.0  # seconds between balance polls
    # seconds an answer without usage.cost waits for GET /generation's figure (infer/costs.py)
    cost_lookup_wait: float = 30.0


@dataclass
class Sending:
    """Where requests go and how many at once (the transport, infer/servers.py)."""

    base_url: str = DEFAULT_BASE_URL
    api_key: str = field(default="", repr=False)
    proxy: str | None = field(default=None, repr=False)  # --proxy (may hold a password)
    concurrency: int = 64
    idle_timeout: float = 180.0
    # self-hosted servers (infer/servers.py): --server URLs, each with its own concurrency,
    # beside OpenRouter (--openrouter; implied without --server)
    servers: list[str] = field(default_factory=list)
    server_concurrency: int = 64
    openrouter: bool = True

    @property
    def total_concurrency(self) -> int:
        """The run's concurrency limit: OpenRouter's slots and every server's."""
        return (self.concurrency if self.openrouter else 0) + \
            self.server_concurrency * len(self.servers)

    @property
    def apis(self) -> set[str]:
        """The hosts whose answers this run writes (a resume by ID covers them all)."""
        from ..recorded.api import api_of
        return ({api_of(self.base_url)} if self.openrouter else set()) | \
            {api_of(url) for url in self.servers}


@dataclass
class Retries:
    """How one prompt is sent again (infer/prompt_work.py), and how long a stop waits."""

    max_attempts: int = 8
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    grace: float = 300.0  # seconds a stop waits for the requests in flight


@dataclass
class IdentityCheck:
    """--tokenizer: the target's tokenizer and template, as kp-tokenize's (infer/identity.py)."""

    tokenizer: str | None = None  # None: answers' identity unchecked
    trust_remote_code: bool = False
    chat_template: str | None = None  # --chat-template FILE
    identity_strikes: int = 3  # refused for identity this many times: quarantined
    identity_wait: float = 180.0  # seconds an unconfirmed offset waits for other providers


@dataclass
class RunConfig:
    files: Files = field(default_factory=Files)
    money: Money = field(default_factory=Money)
    sending: Sending = field(default_factory=Sending)
    retries: Retries = field(default_factory=Retries)
    identity: IdentityCheck = field(default_factory=IdentityCheck)
    # what is asked of OpenRouter
    request: RequestOptions = field(default_factory=RequestOptions)
    policy: Policy = field(default_factory=Policy)
    history_reasoning: str = "drop"  # a conversation's earlier reasoning sent back: keep | drop
    plan: bool = False  # --plan: show routing and cost, send nothing
    plan_json: bool = False  # --plan --json: the plan as one JSON object
