"""The account's balance, read the way OpenRouter allows it.

`GET /credits` gives total_credits and total_usage, but it is documented as needing a
management key: a normal key may get 403, or 200 with zeros. `GET /key` works with any key
and gives the key's usage and limit (limit_remaining), but not the account's credits. So:

    /credits answers with a non-zero balance  -> source "credits": remaining = credits - usage
    /credits is refused (403/404) or zeros    -> source "key": total_credits unknown,
                                                 remaining = the key's limit_remaining
                                                 (unknown when the key has no limit)

`/key` is always read as well, for the key's limit. `Balance.spendable` is what can still
be spent: the smaller of the account's remaining and the key's limit_remaining.

`fetch_balance` (httpx, sync) serves kp-credits; `fetch_balance_async` (an aiohttp session
passed in) serves kp-infer's `--min-credits` polling. No message ever holds the API key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import httpx

from . import DEFAULT_BASE_URL

__all__ = ["Balance", "BalanceError", "AuthError", "NetworkError", "fetch_balance",
           "fetch_balance_async", "balance_from", "DEFAULT_BASE_URL"]


@dataclass(frozen=True)
class Balance:
    total_credits: float | None
    total_usage: float | None
    remaining: float | None
    key_limit: float | None
    key_limit_remaining: float | None
    source: str                      # "credits" or "key": which endpoint gave the balance
    note: str | None = None          # why /credits was not used, when it was not

    @property
    def spendable(self) -> float | None:
        known = [v for v in (self.remaining, self.key_limit_remaining) if v is not None]
        return min(known) if known else None

    def record(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("note")
        return d


class BalanceError(Exception):
    """The balance could not be read (a one-line message, free of the API key)."""


class AuthError(BalanceError):
    """401: the key is missing, wrong or revoked."""


class NetworkError(BalanceError):
    """OpenRouter could not be reached (DNS, refused, reset, timeout)."""


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BalanceError(f"unexpected number in the balance: {value!r}")
    return float(value)


def _data(status: int, payload: Any, path: str) -> dict:
    if status == 401:
        raise AuthError(f"OpenRouter refused the API key (401 on {path}): check "
                        "OPENROUTER_API_KEY or --api-key-file")
    if status != 200:
        message = ""
        if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
            message = f": {payload['error'].get('message', '')}"
        raise BalanceError(f"GET {path} answered {status}{message}")
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), dict):
        raise BalanceError(f"GET {path} answered 200 without a `data` object")
    return payload["data"]


def credits_usable(status: int, payload: Any) -> tuple[dict | None, str | None]:
    """The /credits data if it is usable, else (None, why it is not)."""
    if status in (403, 404):
        return None, f"/credits refused ({status}); balance from /key"
    data = _data(status, payload, "/credits")
    total, used = _number(data.get("total_credits")), _number(data.get("total_usage"))
    if not total and not used:
        return None, "/credits answered zeros (not a management key?); balance from /key"
    return data, None


def balance_from(credits_status: int, credits_payload: Any, key_status: int,
                 key_payload: Any) -> Balance:
    """Combine the answers of /credits and /key into one Balance (see the module doc)."""
    credits, note = credits_usable(credits_status, credits_payload)
    key = _data(key_status, key_payload, "/key")
    limit = _number(key.get("limit"))
    limit_remaining = _number(key.get("limit_remaining"))
    if limit is not None and limit_remaining is None:
        limit_remaining = limit - (_number(key.get("usage")) or 0.0)
    if credits is not None:
        total = _number(credits.get("total_credits")) or 0.0
        used = _number(credits.get("total_usage")) or 0.0
        return Balance(total, used, total - used, limit, limit_remaining, "credits")
    return Balance(None, _number(key.get("usage")), limit_remaining, limit, limit_remaining,
                   "key", note)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _network_message(base_url: str, err: Exception) -> str:
    kind = type(err).__name__
    return f"cannot reach OpenRouter at {base_url} ({kind}: {err})" if str(err) else \
        f"cannot reach OpenRouter at {base_url} ({kind})"


def fetch_balance(api_key: str, base_url: str = DEFAULT_BASE_URL, *,
                  timeout: float = 30.0, client: httpx.Client | None = None,
                  proxy: str | None = None) -> Balance:
    """Read the balance with httpx (two small GETs). httpx reads HTTPS_PROXY/NO_PROXY and
    SSL_CERT_FILE/SSL_CERT_DIR itself; PROXY (an http:// URL) overrides the environment."""
    base_url = base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"}
    own = client is None
    client = client or httpx.Client(timeout=timeout, proxy=proxy)
    try:
        try:
            c = client.get(f"{base_url}/credits", headers=headers)
            if c.status_code == 401:
                _data(401, None, "/credits")
            k = client.get(f"{base_url}/key", headers=headers)
        except httpx.HTTPError as e:
            raise NetworkError(_scrub(_network_message(base_url, e), api_key)) from None
        return balance_from(c.status_code, _json(c), k.status_code, _json(k))
    finally:
        if own:
            client.close()


async def fetch_balance_async(session, api_key: str, base_url: str = DEFAULT_BASE_URL, *,
                              timeout: float = 30.0) -> Balance:
    """Read the balance through an aiohttp ClientSession the caller owns."""
    import aiohttp

    base_url = base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"}
    t = aiohttp.ClientTimeout(total=timeout)

    async def get(path: str) -> tuple[int, Any]:
        async with session.get(f"{base_url}{path}", headers=headers, timeout=t) as r:
            try:
                return r.status, await r.json(content_type=None)
            except ValueError:
                return r.status, None

    try:
        cs, cp = await get("/credits")
        if cs == 401:
            _data(401, None, "/credits")
        ks, kp = await get("/key")
    except (aiohttp.ClientError, TimeoutError) as e:
        raise NetworkError(_scrub(_network_message(base_url, e), api_key)) from None
    return balance_from(cs, cp, ks, kp)


def _scrub(text: str, api_key: str) -> str:
    return text.replace(api_key, "***") if api_key else text
