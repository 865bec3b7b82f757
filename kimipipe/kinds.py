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
"""

from __future__ import annotations

from enum import StrEnum


class AttemptKind(StrEnum):
    """What one completion attempt ended in, by what the caller must do about it."""

    OK = "ok"  # a complete answer: check it (infer/acceptance.py), keep it
    RETRY = "retry"  # transient: back off and send again (its RetryCause says why)
    WAIT = "wait"  # the in-flight budget is full: wait it out, not a failed attempt
    PAYMENT = "payment"  # a money limit: stop the run, fail no prompt
    AUTH = "auth"  # 401: stop the run
    NO_ROUTE = "no_route"  # 404: no provider left for the routing: stop the run
    PERMANENT = "permanent"  # the request's own fault (400/403/413/422, ...): fail it


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
    WORKER = "worker"  # the worker process that held the request ended

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
