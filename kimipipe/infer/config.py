"""The one configuration of a kp-infer run, as commands/infer.py builds it from the options.

Every limit lives here once: the budget (infer/budget.py) reads `max_cost`,
`token_budget` and `request.max_tokens` from this object, it keeps no copy of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..openrouter import DEFAULT_BASE_URL
from ..openrouter.request import RequestOptions
from ..openrouter.routing import Policy
from .disk import DEFAULT_DISK_WAIT, DEFAULT_MARGIN


@dataclass
class RunConfig:
    # what goes in and out
    input: str = "-"
    output: str = "-"
    done_files: list[str] = field(default_factory=list)  # --done: IDs that count as done
    failures: str | None = None  # --failures file (appended to)
    summary_json: str | None = None
    rescue_dir: str | None = None  # --rescue: paid answers -o could not take (None: the default)
    min_free_disk: int = DEFAULT_MARGIN  # bytes kept free on -o's filesystem (infer/disk.py)
    disk_wait: float = DEFAULT_DISK_WAIT  # seconds waiting for disk, nothing in flight, then stop
    partition: tuple[int, int] | None = None  # (K, N)
    plan: bool = False  # --plan: show routing and cost, send nothing
    plan_json: bool = False  # --plan --json: the plan as one JSON object
    sample: int | None = None  # --sample N: only the N prompts whose SHA-256 of id is smallest
    # what is asked of OpenRouter
    request: RequestOptions = field(default_factory=RequestOptions)
    policy: Policy = field(default_factory=Policy)
    history_reasoning: str = "drop"  # a conversation's earlier reasoning sent back: keep | drop
    # identity (infer/identity.py): the target's tokenizer and template, as kp-tokenize's
    tokenizer: str | None = None  # --tokenizer: None, answers' identity unchecked
    trust_remote_code: bool = False
    chat_template: str | None = None  # --chat-template FILE
    identity_strikes: int = 3  # refused for identity this many times: quarantined
    identity_wait: float = 180.0  # seconds an unconfirmed offset waits for other providers
    allow_mixed: bool = False  # --allow-mixed: resume into an output asked otherwise
    base_url: str = DEFAULT_BASE_URL
    api_key: str = field(default="", repr=False)
    # load and retries
    concurrency: int = 64
    max_attempts: int = 8
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    idle_timeout: float = 180.0
    grace: float = 300.0  # seconds a stop waits for the requests in flight
    proxy: str | None = field(default=None, repr=False)  # --proxy (may hold a password)
    # money and tokens
    max_cost: float | None = None  # USD recorded in OUTPUT (and --failures), all runs
    token_budget: int | None = None  # completion tokens recorded in OUTPUT, all runs
    total_cost: float | None = None  # USD recorded here, in --failures and in --spent-in files
    spent_in: list[str] = field(default_factory=list)  # --spent-in: paths or globs
    reservations: str | None = None  # --reservations: the file runs sharing --total-cost lock
    min_credits: float | None = None  # USD of balance below which admission stops
    credits_interval: float = 60.0  # seconds between balance polls
    # seconds an answer without usage.cost waits for GET /generation's figure (infer/costs.py)
    cost_lookup_wait: float = 30.0
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
