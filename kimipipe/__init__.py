"""kimipipe: OpenRouter answers turned into EAGLE-3 training data (see README.md)."""

import sys as _sys

__version__ = "0.1.0"

# httpx imports its own command-line tool (rich, pygments, click) at import time whenever
# `rich` is installed, and transformers installs it (through typer): ~0.15 s of CPU at every
# kp-infer and kp-credits start, for a tool kimipipe never runs. A None entry makes that one
# import fail, which httpx handles itself (its `httpx.main` then says the CLI extras are
# missing); the client is untouched. tests/test_imports.py checks both.
_sys.modules.setdefault("httpx._main", None)
