"""`error.availability`: the object OpenRouter's routing and capacity failures carry.

OpenRouter's changelog (2026-08-19) and errors docs: routing failures and capacity come
with `error.availability {code, retryable, retry_after, requested_models,
affected_providers, excluded_by, fallback_models, constraint, docs_url}`, and a client is
told to "always switch on `availability.retryable`, not just the code". The stand-in
sends these bodies for its no-route 404 (`constraint_filtered`), its 429 and 503 faults
(`capacity_exhausted`, `temporarily_unavailable`), and for `--unavailable CODE` (every
completion refused with that code, after routing: e.g. `model_deprecated` for a model a
host retires under a long run).
"""

from __future__ import annotations

DOCS_URL = "https://openrouter.ai/docs/api/errors-and-debugging#availability"

# code -> (HTTP status, retryable, message): the codes of OpenRouter's errors docs.
AVAILABILITY = {
    "model_not_found": (400, False, "Model not found"),
    "wrong_endpoint": (400, False, "This model is not served on this endpoint"),
    "no_endpoints": (404, False, "No endpoints found for this model"),
    "model_deprecated": (404, False, "This model has been deprecated and is no longer available"),
    "model_unavailable_upstream": (404, False, "The model is unavailable at every upstream provider"),
    "privacy_restricted": (404, False, "No endpoints found matching your data policy"),
    "constraint_filtered": (404, False, "No endpoints found matching your provider preferences"),
    "free_variant_ended": (404, False, "The free variant of this model has ended"),
    "region_restricted": (403, False, "This model is not available in your region"),
    "capacity_exhausted": (429, True, "Every provider of this model is at its capacity limit"),
    "temporarily_unavailable": (503, True, "This model is temporarily unavailable"),
}


def availability(code: str, model: str, providers: list[str], *, retry_after: float | None = None,
                 excluded_by: list[str] | None = None, constraint: str | None = None) -> dict:
    """The `error.availability` object for CODE (retry_after only when it is retryable)."""
    _status, retryable, _message = AVAILABILITY[code]
    return {"code": code, "retryable": retryable,
            "retry_after": retry_after if retryable else None,
            "requested_models": [model], "affected_providers": sorted(set(providers)),
            "excluded_by": excluded_by, "fallback_models": [], "constraint": constraint,
            "docs_url": DOCS_URL}


def unavailable_error(code: str, model: str, providers: list[str], retry_after: float
                      ) -> tuple[int, dict, dict | None]:
    """(status, error body, headers) of a completion refused with availability CODE."""
    status, retryable, message = AVAILABILITY[code]
    body = {"error": {"code": status, "message": message,
                      "metadata": {"error_type": "provider_unavailable" if retryable else "model_unavailable"},
                      "availability": availability(code, model, providers, retry_after=retry_after)}}
    headers = {"Retry-After": f"{retry_after:g}"} if retryable else None
    return status, body, headers
