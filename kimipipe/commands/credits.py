"""kp-credits: the OpenRouter account's balance, and the key's limit; a guard for scripts.

Usage:
    kp-credits                     # human-readable on a terminal, one JSON record otherwise
    kp-credits --json              # one JSON record, always
    kp-credits --min 20 && make B3 # exit 3 when less than $20 can still be spent

Schema (one JSON object, `--json`):
    {"total_credits": float|null, "total_usage": float|null, "remaining": float|null,
     "key_limit": float|null, "key_limit_remaining": float|null, "source": "credits"|"key"}

Reads `GET /credits`; when that is refused (403) or answers zeros (a normal key, not a
management key), falls back to `GET /key` (source "key": total_credits unknown, remaining =
the key's limit_remaining) and says so on stderr. `--min` compares what can still be spent:
the smaller of `remaining` and `key_limit_remaining`. A key that can read neither (a normal
key without a credit limit: /credits refused, /key limit null) has no balance to show, and
kp-credits says why, and what makes one readable (a credit limit on the key, or a
management key).

The API key comes from OPENROUTER_API_KEY or `--api-key-file`; it never appears in any
output or message. Proxies: HTTPS_PROXY/HTTP_PROXY/NO_PROXY, or `--proxy URL`; a
corporate CA: SSL_CERT_FILE or SSL_CERT_DIR (see README, "Proxies and custom CAs"). Base URL: `--base-url`, else OPENROUTER_BASE_URL, else
https://openrouter.ai/api/v1.

Exit codes: 0 ok; 1 network or API error, or `--min` with an unknown balance;
2 no key, or the key was refused (401); 3 below `--min`.

Examples:
    OPENROUTER_API_KEY=sk-or-... kp-credits
    kp-credits --api-key-file ~/.openrouter-key --json | jq .remaining
    kp-credits --base-url http://127.0.0.1:8080/api/v1 --min 0.5
"""

from __future__ import annotations

import json
import os
import sys

import click

from ..cli import kp_command, run_command
from ..errors import ExitCode, KPError
from ..openrouter import DEFAULT_BASE_URL
from ..openrouter.account import (
    GUARD_FIX,
    AccountError,
    AuthError,
    Balance,
    fetch_balance,
    unreadable_balance,
)
from ..openrouter.api_key import read_api_key
from ..openrouter.proxy import parse_proxy, scrub
from ..options import DEBUG, QUIET, CommandSettings, option
from ..terminal import say


def usd(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.4f}"


def human(b: Balance) -> str:
    lines = [f"OpenRouter balance (from /{b.source})"]
    if b.source == "credits":
        lines += [f"  total credits  {usd(b.total_credits)}",
                  f"  total usage    {usd(b.total_usage)}",
                  f"  remaining      {usd(b.remaining)}"]
    else:
        lines += ["  total credits  unknown (/credits is for management keys)",
                  f"  key usage      {usd(b.total_usage)}"]
    if b.key_limit is not None:
        lines.append(f"  key limit      {usd(b.key_limit)} "
                     f"(remaining {usd(b.key_limit_remaining)})")
    else:
        lines.append("  key limit      none")
    why = unreadable_balance(b)
    if why:
        lines.append(f"  remaining      unknown: {why}; a balance guard (kp-credits --min, "
                     f"kp-infer --min-credits) cannot work with it: {GUARD_FIX}")
    return "\n".join(lines)


EXAMPLES = """
    OPENROUTER_API_KEY=sk-or-... kp-credits
    kp-credits --api-key-file ~/.openrouter-key --json | jq .remaining
    kp-credits --min 20 && make all
"""
EXIT_CODES = ("Exit codes: 0 ok; 1 network or API error, or --min with an unknown balance; "
              "2 no key, or the key was refused (401); 3 below --min.")


class CreditsSettings(CommandSettings):
    """kp-credits' command line, one field per option, in --help order."""

    as_json: bool = option(
        "--json", is_flag=True,
        help="Print one JSON record (the default when stdout is not a terminal).")
    as_text: bool = option(
        "--text", is_flag=True,
        help="Print the human-readable form even when stdout is not a terminal.")
    minimum: float | None = option(
        "--min", type=float, default=None, metavar="USD",
        help="Exit 3 when less than USD can still be spent.")
    api_key_file: str | None = option(
        "--api-key-file", type=click.Path(dir_okay=False), default=None,
        help="Read the API key from this file (else OPENROUTER_API_KEY).")
    base_url: str | None = option(
        "--base-url", default=None,
        help=f"API base URL (else OPENROUTER_BASE_URL, else {DEFAULT_BASE_URL}).")
    timeout: float = option(
        "--timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
        help="Seconds to wait for OpenRouter.")
    proxy: str | None = option(
        "--proxy", default=None, metavar="URL",
        help="Go through this HTTP proxy (http://[USER:PASSWORD@]HOST:PORT) instead of "
             "HTTPS_PROXY/HTTP_PROXY/NO_PROXY. The password is never printed.")
    quiet: bool = QUIET()
    debug: bool = DEBUG()


@kp_command("kp-credits", settings=CreditsSettings, examples=EXAMPLES, exit_codes=EXIT_CODES)
def cli(o: CreditsSettings) -> int:
    """Print the OpenRouter account's balance and the key's limit."""
    as_json, as_text, minimum, proxy, quiet = o.as_json, o.as_text, o.minimum, o.proxy, o.quiet
    if as_json and as_text:
        raise KPError("--json and --text exclude each other", ExitCode.USAGE)
    key = read_api_key(o.api_key_file)
    base = o.base_url or os.environ.get("OPENROUTER_BASE_URL") or DEFAULT_BASE_URL
    if proxy:
        try:
            parse_proxy(proxy)
        except ValueError as e:
            raise KPError(f"--proxy: {e}", ExitCode.USAGE) from None
    try:
        balance = fetch_balance(key, base, timeout=o.timeout, proxy=proxy)
    except AuthError as e:
        raise KPError(scrub(str(e), proxy), ExitCode.USAGE) from None
    except AccountError as e:  # NetworkError included: exit 1
        raise KPError(scrub(str(e), proxy), ExitCode.ERROR) from None
    if balance.note:
        say(f"kp-credits: {balance.note}", quiet)
    why = unreadable_balance(balance)
    if why and (as_json or (not as_text and not sys.stdout.isatty())):  # (the text form says it)
        say(f"kp-credits: no balance to show: {why}; {GUARD_FIX}", quiet)
    if as_json or (not as_text and not sys.stdout.isatty()):
        click.echo(json.dumps(balance.record()))
    else:
        click.echo(human(balance))
    if minimum is not None:
        spendable = balance.spendable
        if spendable is None:
            raise KPError(f"cannot check --min: the balance is unknown: {why}; {GUARD_FIX}",
                          ExitCode.ERROR)
        if spendable < minimum:
            raise KPError(f"{usd(spendable)} left, below --min {usd(minimum)}",
                          ExitCode.BUDGET)
    return ExitCode.OK


main = run_command(cli)
