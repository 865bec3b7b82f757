"""The closed sets of names a kp-infer run sorts its work by: one table each, here only.

Each is a `StrEnum`: a member is the very string records, the summary (`retries`,
`failed`, `refused`) and the stand-in's faults spell, so files on disk do not change, and
a member compares and hashes equal to its string (a Counter keyed by either counts once).
Adding one is one member here plus what handles it:

    AttemptKind   what one HTTP attempt ended in (openrouter/attempt.py sorts an answer
                  into one; infer/prompt_work.py has one handler per kind)
    RetryCause    why a retryable attempt is sent again (the summary's `retries` keys);
                  an HTTP status that is retried is its own cause, spelled as its number
                  (`RetryCause.of_status`): "429" (a member, since it also shrinks the
                  concurrency), "502", "524", ...
    RefusalKind   why an answer paid for is not a result (infer/acceptance.py)
    FailureKind   why a prompt is given up on this run (a failure line's `kind`); a refused
                  answer not sent again fails with its RefusalKind instead
    Cap           a limit admission waits under for room (infer/admission.py): its
                  option, what the progress line says, the stop when nothing can free room
    StopReason    why a run stops admitting work before its input is exhausted: its name
                  in the summary (`stop_reason`), its exit code and its message (the
                  summary's last line; make's money-stop message falls back on it)
"""

from __future__ import annotations

from enum import Enum, StrEnum

from .errors import ExitCode


class AttemptKind(StrEnum):
    """What one completion attempt ended in, by what the caller must do about it."""

    OK = "ok"  # a complete answer: check it (infer/acceptance.py), keep it
    RETRY = "retry"  # transient: back off and send again (its RetryCause says why)
    WAIT = "wait"  # the in-flight budget is full: wait it out, not a failed attempt
    PAYMENT = "payment"  # a money limit: stop the run, fail no prompt
    AUTH = "auth"  # 401: stop the run
    NO_ROUTE = "no_route"  # 404: no provider left for the routing: stop the run
    PERMANENT = "permanent"  # the request's own fault (400/403/413/422, ...): fail it
    # a stream kimipipe closed because its provider was quarantined (infer/identity.py):
    # maybe billed all the same, so its cost is settled and it is booked as refused
    CANCELLED = "cancelled"


class RetryCause(StrEnum):
    """Why an attempt is retried; besides these, a retried HTTP status as its number."""

    RATE_LIMITED = "429"  # also shrinks the adaptive concurrency (infer/limiter.py)
    IN_FLIGHT_402 = "402-inflight"  # the in-flight budget was full (kind WAIT)
    TIMEOUT = "timeout"  # no connection, no response head, or no data for too long
    CONNECTION = "connection"  # the connection failed before a 200 head
    STALE = "stale"  # a kept-alive connection closed before answering
    CUT = "cut"  # a 200 whose body or stream ended early
    PROXY = "proxy"  # the proxy refused or failed
    EMPTY = "empty"  # a 200 with no body, no choices, no finish_reason or no output
    BAD_JSON = "bad_json"  # a 200 body or stream chunk that is not JSON
    ERROR200 = "error200"  # a 200 whose body is an error object
    MIDSTREAM = "midstream"  # an error chunk after output had flowed

    @staticmethod
    def of_status(status: int) -> str:
        """The cause of an attempt answered with HTTP STATUS: "429" is RATE_LIMITED."""
        return RetryCause.RATE_LIMITED if status == 429 else str(status)


class RefusalKind(StrEnum):
    """Why an answer paid for is not a result (the provider table's column order)."""

    ROUTING_VIOLATION = "routing_violation"  # served by a provider the routing excludes
    NO_REASONING = "no_reasoning"  # reasoning asked for, none came back
    THINK_MARKER = "think_marker"  # a leaked reasoning block's think tag in the content
    # its usage counts are not the target model's for this prompt (infer/identity.py):
    # another model, tokenizer or template (a redirect, an injected system prompt)
    IDENTITY = "identity"


class FailureKind(StrEnum):
    """Why a prompt is given up on this run (else the RefusalKind of its last answer)."""

    PERMANENT = "permanent"  # an error the request itself caused (counted by its status)
    RETRIES_EXHAUSTED = "retries_exhausted"  # --max-attempts retryable attempts, none answered
    # answers refused (paid for) and the prompt not sent again because the run stopped (a
    # cost cap without room for its next attempt, a signal, a limit): the paid answers are
    # kept on this line, and the prompt is no failure of its own (a rerun sends it)
    STOPPED = "stopped"


class Cap(StrEnum):
    """A cap a request waits under for room (infer/admission.py), spelled as its option and
    its stop's slug: the progress line says `waiting for --max-cost room`; when nothing in
    flight can free room under it, the run stops for it (`stop_reason`)."""

    MAX_COST = "max-cost"  # this output's spend and reservations (infer/budget.py)
    TOTAL_COST = "total-cost"  # the build's, shared through --reservations (infer/total_cost.py)
    TOKEN_BUDGET = "token-budget"  # completion tokens recorded and expected in flight

    @property
    def flag(self) -> str:
        return f"--{self.value}"

    @property
    def waiting(self) -> str:
        """What admission waits for, as the progress line says it."""
        return f"{self.flag} room"

    @property
    def stop_reason(self) -> StopReason:
        return StopReason.from_slug(self.value)


class StopReason(Enum):
    """Why a run stopped admitting work: its name in the summary, exit code and message."""

    MAX_COST = ("max-cost", ExitCode.BUDGET,
                "stopped: --max-cost reached; raise it and rerun to resume")
    TOTAL_COST = ("total-cost", ExitCode.BUDGET,
                  "stopped: --total-cost reached (the spend recorded here and in the --spent-in "
                  "files, with what the runs sharing --reservations have in flight); raise it "
                  "and rerun to resume")
    PAYMENT = ("payment", ExitCode.BUDGET,
               "stopped: OpenRouter answered 402: the balance cannot pay for one more "
               "request's worst case; add credits (or lower --max-tokens) and rerun to resume")
    KEY_LIMIT = ("key-limit", ExitCode.BUDGET,
                 "stopped: the API key's spending limit is reached (openrouter_key_limit); "
                 "raise the key's limit (or wait for it to reset) and rerun to resume")
    WORKSPACE_BUDGET = ("workspace-budget", ExitCode.BUDGET,
                        "stopped: the workspace's budget is spent (openrouter_workspace_budget); "
                        "raise it (or wait for it to reset) and rerun to resume")
    GUARDRAIL_BUDGET = ("guardrail-budget", ExitCode.BUDGET,
                        "stopped: a guardrail's budget is spent (openrouter_guardrail_budget); "
                        "raise it (or wait for it to reset) and rerun to resume")
    MIN_CREDITS = ("min-credits", ExitCode.BUDGET,
                   "stopped: account balance below --min-credits; add credits and rerun to resume")
    TOKEN_BUDGET = ("token-budget", ExitCode.OK,
                    "done: --token-budget reached (the output holds the tokens asked for); "
                    "raise it and rerun to continue")
    INTERRUPTED = ("interrupted", ExitCode.INTERRUPTED,
                   "interrupted; rerun the same command to resume")
    AUTH = ("auth", ExitCode.USAGE,
            "stopped: OpenRouter rejected the API key (401); check OPENROUTER_API_KEY")
    SYSTEMATIC = ("systematic-failure", ExitCode.USAGE,
                  "stopped: every request failed the same way (the line above names the "
                  "status and the message): a configuration error; check it with "
                  "--preflight, then rerun the same command to resume")
    NO_ROUTE = ("no-route", ExitCode.USAGE,
                "stopped: OpenRouter can route no request (a 404, or an error.availability that "
                "is not retryable: the line above names its code, models and providers); check "
                "--ignore-provider/--only-provider/--quantization, whether the model's authors "
                "allow distillation and whether it is still served (try --plan); rerun the same "
                "command to resume")
    IDENTITY = ("identity", ExitCode.USAGE,
                "stopped: no provider left that serves the target model (every allowed one is "
                "quarantined for identity, named above); docs/real-run.md says what to do "
                "when OpenRouter no longer serves it; rerun the same command to resume")
    DISK = ("disk", ExitCode.BUDGET,
            "stopped: no room for the output (a full disk, a quota or a file size limit); "
            "free some space and rerun the same command to resume")
    OUTPUT = ("output", ExitCode.ERROR,
              "stopped: the output cannot be written; fix it and rerun the same command to resume")
    CLOSED_PIPE = ("closed-pipe", ExitCode.OK,
                   "stopped: the reader of stdout went away (`| head`); nothing more is sent")

    def __init__(self, slug: str, exit_code: int, message: str):
        self.slug = slug
        self.exit_code = exit_code
        self.message = message

    @classmethod
    def from_slug(cls, slug: str) -> StopReason:
        return next(reason for reason in cls if reason.slug == slug)

    @classmethod
    def for_limit(cls, limit_source: str) -> StopReason:
        """The stop for a money limit OpenRouter named (`error.metadata.limit_source`)."""
        return {"openrouter_key_limit": cls.KEY_LIMIT,
                "openrouter_workspace_budget": cls.WORKSPACE_BUDGET,
                "openrouter_guardrail_budget": cls.GUARDRAIL_BUDGET}.get(limit_source, cls.PAYMENT)
