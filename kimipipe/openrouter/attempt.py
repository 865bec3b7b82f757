"""The outcome of one completion attempt, and how an error answer is classified.

`Attempt` is what the HTTP layer (openrouter/client.py) hands back for each request sent:
a complete answer (`kind == "ok"`) or what went wrong, sorted by what the caller must do
about it (the facts behind each row: docs/openrouter.md, "Errors"):

    ok         a complete answer: keep it
    retry      transient (408/429/5xx/524/529, connection errors, idle stalls, 200 with an
               error body, empty choices or empty output, mid-stream error, cut stream):
               retry with backoff, honouring `retry_after`
    permanent  400/403/413/422 and other 4xx: record as failed, no retry this run
    payment    402: the balance cannot cover the request: stop admitting work
    auth       401: bad key: stop the run
    no_route   404 (e.g. constraint_filtered): a configuration error: stop the run

`error_attempt(status, payload, ...)` classifies a non-200 answer; `body_error(error)` an
`error` object inside a 200 body; `midstream_error(error, after_output)` an error chunk of a
stream. When the error carries `availability.retryable`, that flag decides. Messages are
cut to 500 characters and never hold the API key.

An Attempt crosses process boundaries as msgpack (kimipipe/infer/process_pool.py), so it
is a flat Struct sent as an array.
"""

from __future__ import annotations

import msgspec

from ..errors import redact

RETRYABLE_STATUSES = {408, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 525, 526, 529}


class Attempt(msgspec.Struct, omit_defaults=True, array_like=True):
    """The outcome of one HTTP attempt (sent between processes as msgpack: keep it flat)."""

    kind: str  # ok | retry | permanent | payment | auth | no_route
    cause: str = ""  # for retries/failures: "429", "502", "timeout", "cut", "error200", ...
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
    availability = err.get("availability") or (payload or {}).get("availability")
    if isinstance(availability, dict):
        ra = availability.get("retry_after")
        if isinstance(ra, (int, float)):
            retry_after = float(ra)
        avail_code = availability.get("code")
        if avail_code:
            code = str(avail_code)
        if "retryable" in availability:
            kind = "retry" if availability["retryable"] else ("no_route" if status == 404 else "permanent")
            return Attempt(kind, cause=str(status), status=status, code=code, message=message,
                           retry_after=retry_after)
    if status == 401:
        kind = "auth"
    elif status == 402:
        kind = "payment"
    elif status == 404:
        kind = "no_route"
    elif status in RETRYABLE_STATUSES or status >= 500:
        kind = "retry"
    else:
        kind = "permanent"
    return Attempt(kind, cause=str(status), status=status, code=code, message=message,
                   retry_after=retry_after)


def body_error(error: dict) -> Attempt:
    """An `error` object in an HTTP 200 body: its own `code` decides when it is a 4xx that
    means auth, payment, no route or a bad request; anything else is retried (`error200`)."""
    code = error.get("code") if isinstance(error, dict) else None
    message = redact(str(error.get("message") if isinstance(error, dict) else error))[:500]
    status = code if isinstance(code, int) else 200
    if status in (401, 402, 404) or (400 <= status < 500 and status not in RETRYABLE_STATUSES):
        return error_attempt(status, {"error": error}, None, message)
    return Attempt("retry", cause="error200", status=200, code=str(code or ""), message=message)


def midstream_error(error: dict, after_output: bool) -> Attempt:
    """An error chunk: `midstream` once output has flowed, else like a 200 error body."""
    attempt = body_error(error)
    if attempt.kind == "retry" and after_output:
        attempt.cause = "midstream"
    return attempt
