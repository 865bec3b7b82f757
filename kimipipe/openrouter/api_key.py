"""The OpenRouter API key: read once, from --api-key-file or OPENROUTER_API_KEY, checked
(a key that would break a request header is refused) and registered as a secret, so no
message shows it (errors.keep_secret)."""

from __future__ import annotations

import os

from ..errors import ExitCode, KPError, keep_secret


def read_api_key(api_key_file: str | None, required: bool = True) -> str:
    """The OpenRouter key from --api-key-file or OPENROUTER_API_KEY (exit 2 when missing,
    or when it holds whitespace or a control character: sent in a header, a line break
    would end the header early, and HTTP libraries quote the bad value in their errors)."""
    key = _read_api_key(api_key_file, required)
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in key):
        where = f"--api-key-file {api_key_file}" if api_key_file else "OPENROUTER_API_KEY"
        raise KPError(f"the API key in {where} holds whitespace or a control character "
                      "(two lines?)", ExitCode.USAGE)
    return key


def _read_api_key(api_key_file: str | None, required: bool) -> str:
    if api_key_file:
        try:
            with open(api_key_file, encoding="utf-8") as f:
                key = f.read().strip()
        except OSError as e:
            raise KPError(f"cannot read --api-key-file {api_key_file}: {e.strerror}",
                          ExitCode.USAGE) from None
        if not key and required:
            raise KPError(f"--api-key-file {api_key_file} is empty", ExitCode.USAGE)
        keep_secret(key)  # no message may show it, wherever it came from
        return key
    key = os.environ.get("OPENROUTER_API_KEY", "").strip()
    if not key and required:
        raise KPError("no API key: set OPENROUTER_API_KEY or pass --api-key-file",
                      ExitCode.USAGE)
    return key
