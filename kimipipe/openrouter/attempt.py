"""The outcome of one completion attempt, and how an error answer is classified.

`Attempt` is what the HTTP layer (openrouter/client.py) hands back for each request sent:
a complete answer (`kind == "ok"`) or what went wrong, sorted by what the caller must do
about it (the facts behind each row: docs/openrouter.md, "Errors"):

    ok         a complete answer: keep it
    retry      transient (408/429/5xx/524/529, connection errors, idle stalls, 200 with an
               error body, empty choices or empty output, mid-stream error, cut stream):
               retry with backoff, honouring `retry_after`
    wait       the in-flight spending budget is full (402 `reason: in_flight_budget_exhausted`,
               `limit_source: openrouter_in_flight_budget`; cause "402-inflight"): send it
               again once requests in flight settle, after `retry_after`; not a failed attempt
    permanent  400/403/413/422 and other 4xx without a `limit_source` (a 403 is moderation or
               a provider's refusal): record as failed, no retry this run
    payment    a money limit: stop admitting work (exit 3), no prompt is failed for it. Which
               one is `limit_source`: "openrouter_credits" (the balance gone, or with `reason:
               weight_exceeds_budget` one request's worst case beyond what the balance
               allows), "openrouter_key_limit", "openrouter_workspace_budget",
               "openrouter_guardrail_budget" (402 or 403, with `scope`, `limit_usd`,
               `spend_usd`, `resets_at` when given), or "" (a bare 402: the balance)
    auth       401: bad key: stop the run
    no_route   404 (e.g. constraint_filtered), or any error whose `availability` says it is
               not retryable (model_deprecated, no_endpoints, region_restricted, ...): the
               model cannot be served as asked: stop the run (its message names the code,
               the models and the providers the availability object names)

The status does not decide a 402's or a 403's kind: `error.metadata.limit_source` and
`reason` do (docs/openrouter.md, "Credit limits").

`error_attempt(status, payload, ...)` classifies a non-200 answer; `body_error(error)` an
`error` object inside a 200 body; `midstream_error(error, after_output)` an error chunk of a
stream. When the error carries `availability.retryable`, that flag decides ("always switch
on `availability.retryable`, not just the code"), and its `retry_after` wins over the
`Retry-After` header. `metadata.error_type` is kept (`error_type`). Messages are
cut to 500 characters and never hold the API key.
"""

from __future__ import annotations

import msgspec

from ..errors import redact
from ..kinds import AttemptKind, RetryCause

RETRYABLE_STATUSES = {408, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 525, 526, 529}


class Attempt(msgspec.Struct):
    """The outcome of one HTTP attempt."""

    kind: AttemptKind
    cause: str = ""  # for retries/failures: a RetryCause, or the HTTP status ("502", "400")
    status: int = 0
    code: str = ""
    message: str = ""
    retry_after: float | None = None
    content: str = ""
    reasoning: str | None = None
    finish_reason: str | None = None
    provider: str | None = None
    model: str | None = None
    generation_id: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float | None = None
    chunks: int = 0
    reasoning_source: str = ""  # field | details | inline ("" when there is none)
    # a money limit's `error.metadata` (kinds wait and payment)
    limit_source: str = ""
    limit_reason: str = ""
    limit_scope: str = ""
    limit_usd: float | None = None
    spend_usd: float | None = None
    resets_at: str | None = None
    cached_tokens: int = 0  # of prompt_tokens, served from the provider's prompt cache
    # an `ok` answer came with a `usage` object (a stream can end without one): when not,
    # its tokens are unknown and it is booked at its worst case (infer/costs.py)
    usage_seen: bool = True
    # the IDs a self-hosted server returned (vLLM's return_token_ids): None when it gave none
    prompt_ids: list[int] | None = None
    output_ids: list[int] | None = None
    api: str | None = None  # the host that answered, when not the run's base URL (infer/servers.py)
    # the error's `metadata.error_type` (rate_limit_exceeded, provider_overloaded, ...)
    error_type: str = ""
    # the sampled tokens of token logprobs (client.sampled_tokens): each one's length in
    # bytes; their bytes joined, or None where they are exactly the text `token_spells`
    # names ("answer": reasoning then content; "content"); how many had null `bytes`
    token_lengths: list[int] | None = None
    token_data: bytes | None = None
    token_spells: str = ""
    token_nulls: int = 0
    cut_by: str = ""  # "context": a server's `length` answer cut by its context (infer/servers.py)

    def limit_key(self) -> str:
        """How the summary counts a credit-limit refusal: status, then reason or source."""
        return f"{self.status} {self.limit_reason or self.limit_source or 'no limit named'}"

    def limit(self) -> dict:
        """The limit named by a payment attempt, for the summary (fields given only)."""
        named = {"status": self.status, "limit_source": self.limit_source,
                 "reason": self.limit_reason, "scope": self.limit_scope,
                 "limit_usd": self.limit_usd, "spend_usd": self.spend_usd,
                 "resets_at": self.resets_at, "message": self.message}
        return {k: v for k, v in named.items() if v not in ("", None)}


IN_FLIGHT_SOURCE = "openrouter_in_flight_budget"
IN_FLIGHT_REASON = "in_flight_budget_exhausted"


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _limit_attempt(status: int, err: dict, code: str, message: str,
                   retry_after: float | None) -> Attempt | None:
    """A money limit named by `error.metadata` (limit_source or reason); None: none named."""
    meta = err.get("metadata")
    if not isinstance(meta, dict):
        return None
    source, reason = str(meta.get("limit_source") or ""), str(meta.get("reason") or "")
    if not source and reason not in (IN_FLIGHT_REASON, "weight_exceeds_budget"):
        return None  # e.g. moderation's `reasons`: the prompt's own refusal
    if reason == IN_FLIGHT_REASON or source == IN_FLIGHT_SOURCE:
        return Attempt(AttemptKind.WAIT, cause=RetryCause.IN_FLIGHT_402, status=status, code=code, message=message,
                       retry_after=retry_after, limit_source=source, limit_reason=reason)
    resets = meta.get("resets_at")
    return Attempt(AttemptKind.PAYMENT, cause=RetryCause.of_status(status), status=status, code=code, message=message,
                   retry_after=retry_after, limit_source=source, limit_reason=reason,
                   limit_scope=str(meta.get("scope") or ""),
                   limit_usd=_number(meta.get("limit_usd")),
                   spend_usd=_number(meta.get("spend_usd")),
                   resets_at=str(resets) if resets else None)


def retry_after_seconds(value: str | None) -> float | None:
    """A `Retry-After` header in seconds (the HTTP-date form is not used by OpenRouter)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def error_attempt(status: int, payload: dict | None, retry_after: float | None,
                  default_message: str) -> Attempt:
    """A non-200 answer (or an error object carrying a status), classified."""
    err = (payload or {}).get("error") if isinstance(payload, dict) else None
    err = err if isinstance(err, dict) else {}
    message = redact(str(err.get("message") or default_message))[:500]
    code = str(err.get("code") or status)
    meta = err.get("metadata")
    error_type = str(meta.get("error_type") or "") if isinstance(meta, dict) else ""
    if status in (402, 403) and (limit := _limit_attempt(status, err, code, message, retry_after)):
        return limit
    availability = err.get("availability") or (payload or {}).get("availability")
    if isinstance(availability, dict):
        ra = availability.get("retry_after")
        if isinstance(ra, (int, float)) and not isinstance(ra, bool):
            retry_after = float(ra)
        avail_code = availability.get("code")
        if avail_code:
            code = str(avail_code)
        if "retryable" in availability:
            if availability["retryable"]:
                return Attempt(AttemptKind.RETRY, cause=RetryCause.of_status(status), status=status,
                               code=code, message=message, retry_after=retry_after,
                               error_type=error_type)
            return Attempt(AttemptKind.NO_ROUTE, cause=str(status), status=status, code=code,
                           message=redact(_unavailable_message(status, message, availability))[:500],
                           error_type=error_type)
    if status == 401:
        kind = AttemptKind.AUTH
    elif status == 402:
        kind = AttemptKind.PAYMENT
    elif status == 404:
        kind = AttemptKind.NO_ROUTE
    elif status in RETRYABLE_STATUSES or status >= 500:
        kind = AttemptKind.RETRY
    else:
        kind = AttemptKind.PERMANENT
    return Attempt(kind, cause=RetryCause.of_status(status), status=status, code=code, message=message,
                   retry_after=retry_after, error_type=error_type)


def _names(value) -> str:
    return ", ".join(str(v) for v in value) if isinstance(value, list) and value else ""


def _unavailable_message(status: int, message: str, availability: dict) -> str:
    """A non-retryable availability error, said with what it names: the code, the models
    and the providers affected (e.g. a model its hosts retire under a long run)."""
    parts = [f"{availability.get('code') or 'unavailable'} (HTTP {status}, not retryable): {message}"]
    if models := _names(availability.get("requested_models")):
        parts.append(f"models: {models}")
    if providers := _names(availability.get("affected_providers")):
        parts.append(f"providers: {providers}")
    if constraint := availability.get("constraint"):
        parts.append(f"constraint: {constraint}")
    return "; ".join(parts)


def body_error(error: dict) -> Attempt:
    """An `error` object in an HTTP 200 body: its own `code` decides when it is a 4xx that
    means auth, payment, no route or a bad request; anything else is retried (`error200`)."""
    code = error.get("code") if isinstance(error, dict) else None
    message = redact(str(error.get("message") if isinstance(error, dict) else error))[:500]
    status = code if isinstance(code, int) else 200
    if status in (401, 402, 404) or (400 <= status < 500 and status not in RETRYABLE_STATUSES):
        return error_attempt(status, {"error": error}, None, message)
    meta = error.get("metadata") if isinstance(error, dict) else None
    error_type = str(meta.get("error_type") or "") if isinstance(meta, dict) else ""
    return Attempt(AttemptKind.RETRY, cause=RetryCause.ERROR200, status=200, code=str(code or ""),
                   message=message, error_type=error_type)


def midstream_error(error: dict, after_output: bool) -> Attempt:
    """An error chunk: `midstream` once output has flowed, else like a 200 error body."""
    attempt = body_error(error)
    if attempt.kind == AttemptKind.RETRY and after_output:
        attempt.cause = RetryCause.MIDSTREAM
    return attempt
