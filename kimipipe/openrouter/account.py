"""OpenRouter's control plane: the model's endpoints table and the account's balance.

One implementation, on httpx, for kp-infer (endpoints before a run, `--min-credits`
polling during it) and kp-credits:

    async with Account(api_key, base_url) as account:
        endpoints = await account.endpoints("moonshotai/kimi-k2.5")
        balance = await account.balance()
    fetch_endpoints(...), fetch_balance(...)      # the same, for synchronous callers

The endpoints table (`GET /models/{author}/{slug}/endpoints`) lists each provider serving
the model with its quantization and prices (USD per token, as strings): what `--plan`, the
routing check and a budget's worst-case price are made from (openrouter/routing.py).

The model's line in `GET /models` (OpenRouter has no `GET /model/{slug}`) says
whether its authors allow distillation (`is_trainable_text`, the property OpenRouter's
`?distillable=` filter and `provider.enforce_distillable_text` go by): `model_info(model)`.

The balance, read the way OpenRouter allows it: `GET /credits` gives total_credits and
total_usage, but it is documented as needing a management key: a normal key may get 403,
or 200 with zeros. `GET /key` works with any key and gives the key's usage and limit
(limit_remaining), but not the account's credits. So:

    /credits answers with a non-zero balance  -> source "credits": remaining = credits - usage
    /credits is refused (403/404) or zeros    -> source "key": total_credits unknown,
                                                 remaining = the key's limit_remaining
                                                 (unknown when the key has no limit)

`/key` is always read as well, for the key's limit. (What one generation cost, `GET
/generation`, is read over the completions' own connections: openrouter/client.py.)
`Balance.spendable` is what can still
be spent: the smaller of the account's remaining and the key's limit_remaining. When it is
unknown (a normal key without a limit), `unreadable_balance(balance)` says what the key
can and cannot read, for every balance guard to warn with (`GUARD_FIX`: what makes it work).
(docs/openrouter.md, "Account endpoints".)

Connections: httpx's `trust_env` stays on, so HTTPS_PROXY/NO_PROXY and SSL_CERT_FILE from
the environment are honoured; `proxy` and `verify` (a CA bundle path, an SSLContext, or
False) override them. Errors are `AccountError`s in one line: `AuthError` for a 401,
`NetworkError` naming the URL that could not be reached; no message ever holds the API
key (it is registered with `errors.redact`, the one scrubber).
"""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import msgspec

from ..errors import keep_secret, redact
from . import DEFAULT_BASE_URL
from .routing import Endpoint, parse_endpoints

__all__ = ["GUARD_FIX", "Account", "AccountError", "AuthError", "Balance", "ModelInfo",
           "NetworkError", "balance_from", "fetch_balance", "fetch_endpoints", "fetch_model_info",
           "unreadable_balance"]


class AccountError(Exception):
    """The account or the endpoints table could not be read (one line, free of the key)."""


class AuthError(AccountError):
    """401: the key is missing, wrong or revoked."""


class NetworkError(AccountError):
    """OpenRouter could not be reached (DNS, refused, reset, timeout, TLS)."""


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


GUARD_FIX = ("a key with a credit limit (set on the key at openrouter.ai/settings/keys; "
             "then /key gives limit_remaining), or a management key, makes it work")


def unreadable_balance(balance: Balance) -> str | None:
    """What this key can and cannot read, when it can read neither the account's balance
    nor a credit limit (a normal key without a limit: most users'); None when something
    can be spent is known. A balance guard (--min-credits, MIN_CREDITS, kp-credits --min)
    then guards nothing, and must say so rather than pass."""
    if balance.spendable is not None:
        return None
    credits = ("/credits answered zeros" if balance.note and "zeros" in balance.note
               else "/credits refused it")
    usage = (f"; it can read its own usage (${balance.total_usage:,.4f}, /key)"
             if balance.total_usage is not None else "")
    return (f"this key can read neither the account's balance ({credits}: it needs a "
            f"management key) nor a credit limit (/key: the key has none){usage}")


@dataclass(frozen=True)
class ModelInfo:
    """What the model's entry says beyond its endpoints (None: not said)."""

    model: str
    is_trainable_text: bool | None  # its authors allow text distillation
    default_parameters: dict | None = None
    source: str = ""  # the path it was read from


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AccountError(f"unexpected number in the balance: {value!r}")
    return float(value)


def _data(status: int, payload: Any, path: str) -> dict:
    if status == 401:
        raise AuthError(f"OpenRouter refused the API key (401 on {path}): check "
                        "OPENROUTER_API_KEY or --api-key-file")
    if status != 200:
        raise AccountError(f"GET {path} answered {status}{_error_message(payload)}")
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), dict):
        raise AccountError(f"GET {path} answered 200 without a `data` object")
    return payload["data"]


def _error_message(payload: Any) -> str:
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        return f": {redact(str(payload['error'].get('message', '')))[:300]}"
    return ""


def _credits_usable(status: int, payload: Any) -> tuple[dict | None, str | None]:
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
    credits, note = _credits_usable(credits_status, credits_payload)
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


@functools.lru_cache(maxsize=8)
def _trusted_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    """The context httpx makes for verify=True under trust_env (SSL_CERT_FILE, else
    SSL_CERT_DIR, else certifi's bundle), made once a process for each value of the two:
    loading the bundle is ~25 ms of CPU, and kp-infer opens three clients before a run."""
    return httpx.create_ssl_context(verify=True, trust_env=True)


def _ssl_verify(verify: bool | str | ssl.SSLContext) -> bool | ssl.SSLContext:
    """httpx takes a bool or an SSLContext; a CA bundle path becomes a context."""
    if verify is True:
        return _trusted_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    return ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify


class Account:
    """The account-level calls, over one httpx.AsyncClient (`async with`, or `aclose()`)."""

    def __init__(self, api_key: str, base_url: str = DEFAULT_BASE_URL, *, timeout: float = 30.0,
                 proxy: str | None = None, verify: bool | str | ssl.SSLContext = True):
        keep_secret(api_key)
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(timeout=timeout, headers=headers, proxy=proxy,
                                         verify=_ssl_verify(verify), trust_env=True)

    async def __aenter__(self) -> Account:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _get(self, path: str) -> httpx.Response:
        url = f"{self.base_url}{path}"
        try:
            return await self._client.get(url)
        except (httpx.HTTPError, httpx.InvalidURL, OSError) as e:
            kind = type(e).__name__
            detail = f"{kind}: {e}" if str(e) else kind
            raise NetworkError(redact(f"cannot reach OpenRouter at {url} ({detail})")) from None

    @staticmethod
    def _json(response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError:
            return None

    async def endpoints(self, model: str) -> list[Endpoint]:
        """The model's endpoints table: every provider serving it, with quantization and prices."""
        path = f"/models/{model}/endpoints"
        response = await self._get(path)
        if response.status_code == 401:
            _data(401, None, path)
        if response.status_code != 200:
            raise AccountError(f"GET {self.base_url}{path} answered HTTP {response.status_code}"
                               f"{_error_message(self._json(response))}")
        try:
            return parse_endpoints(response.content)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise AccountError(f"unexpected endpoints table from {self.base_url}{path}: {e}") from None

    async def model_info(self, model: str) -> ModelInfo:
        """The model's line in `GET /models` (an AccountError when it is not listed).
        OpenRouter has no `GET /model/{slug}`: the list is the only source."""
        path = "/models"
        response = await self._get(path)
        if response.status_code == 401:
            _data(401, None, path)
        if response.status_code != 200:
            raise AccountError(f"GET {self.base_url}{path} answered HTTP {response.status_code}"
                               f"{_error_message(self._json(response))}")
        payload = self._json(response)
        listed = payload.get("data") if isinstance(payload, dict) else None
        entry = next((m for m in listed or () if isinstance(m, dict)
                      and model in (m.get("id"), m.get("canonical_slug"))), None)
        if entry is None:
            raise AccountError(f"{model} is not listed by GET {self.base_url}{path}")
        trainable = entry.get("is_trainable_text")
        defaults = entry.get("default_parameters")
        return ModelInfo(model, trainable if isinstance(trainable, bool) else None,
                         defaults if isinstance(defaults, dict) else None, path)

    async def balance(self) -> Balance:
        """The account's balance and the key's limit (see the module docstring)."""
        credits = await self._get("/credits")
        if credits.status_code == 401:
            _data(401, None, "/credits")
        key = await self._get("/key")
        return balance_from(credits.status_code, self._json(credits), key.status_code,
                            self._json(key))


def fetch_balance(api_key: str, base_url: str = DEFAULT_BASE_URL, *, timeout: float = 30.0,
                  proxy: str | None = None, verify: bool | str | ssl.SSLContext = True) -> Balance:
    """`Account.balance()` for a synchronous caller (kp-credits)."""
    async def read() -> Balance:
        async with Account(api_key, base_url, timeout=timeout, proxy=proxy, verify=verify) as account:
            return await account.balance()

    return asyncio.run(read())


def fetch_endpoints(model: str, api_key: str, base_url: str = DEFAULT_BASE_URL, *,
                    timeout: float = 60.0, proxy: str | None = None,
                    verify: bool | str | ssl.SSLContext = True) -> list[Endpoint]:
    """`Account.endpoints(model)` for a synchronous caller (preparing a kp-infer run)."""
    async def read() -> list[Endpoint]:
        async with Account(api_key, base_url, timeout=timeout, proxy=proxy, verify=verify) as account:
            return await account.endpoints(model)

    return asyncio.run(read())


def fetch_model_info(model: str, api_key: str, base_url: str = DEFAULT_BASE_URL, *,
                     timeout: float = 60.0, proxy: str | None = None,
                     verify: bool | str | ssl.SSLContext = True) -> ModelInfo:
    """`Account.model_info(model)` for a synchronous caller (preparing a kp-infer run)."""
    async def read() -> ModelInfo:
        async with Account(api_key, base_url, timeout=timeout, proxy=proxy, verify=verify) as account:
            return await account.model_info(model)

    return asyncio.run(read())
