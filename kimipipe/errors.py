"""Exit codes and the expected-failure exception shared by every kp-* command.

Exit codes are part of the interface (README documents them once):

    0    success: done as asked (for kp-infer, also: --token-budget reached)
    1    unexpected error (a bug, a network failure kimipipe could not ride out)
    2    usage or input error: nothing was done (no request sent, no output finished)
    3    stopped by money: a cost cap (--max-cost), the account's balance or a credit limit
         OpenRouter enforces (the balance's 402, the key's limit or a workspace/guardrail
         budget as 402 or 403, --min-credits, kp-credits --min); or by a full disk (no
         room for the output: ENOSPC, a quota, a file size limit); rerun (with more budget,
         credits or room) to resume
    4    finished, but some records failed permanently (see the failures file)
    130  interrupted (SIGINT/SIGTERM); rerun to resume
"""

from __future__ import annotations

import os


class ExitCode:
    OK = 0
    ERROR = 1
    USAGE = 2
    BUDGET = 3
    PARTIAL = 4
    INTERRUPTED = 130


class KPError(Exception):
    """An expected failure: printed as one line, no traceback, with its exit code."""

    exit_code = ExitCode.ERROR

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(KPError):
    """Bad input or usage: `PATH:LINE: what is wrong`, exit 2, nothing done."""

    exit_code = ExitCode.USAGE

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{display_path(path)}:{line}: " if line is not None else f"{display_path(path)}: "
        super().__init__(where + message)
        self.path = path
        self.line = line


def display_path(path: str) -> str:
    return "<stdin>" if path == "-" else str(path)


_SECRETS: set[str] = set()


def keep_secret(value: str) -> None:
    """Have `redact` remove VALUE too (an API key read from a file, not the environment)."""
    if value and len(value) >= 8:
        _SECRETS.add(value)


def redact(text: str) -> str:
    """Remove the API key from any text that may reach a terminal or a log: the one key
    scrubber (OPENROUTER_API_KEY, and every key given to `keep_secret`)."""
    env_key = os.environ.get("OPENROUTER_API_KEY", "")
    for key in (env_key, *_SECRETS):
        if len(key) >= 8 and key in text:
            text = text.replace(key, "***")
    return text
