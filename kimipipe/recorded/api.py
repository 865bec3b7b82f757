"""Which API answered a record, so that offline answers never pass for real ones.

- Every response and failure record kp-infer writes has `api`: the host of the base URL
  it was sent to (`api_of`), lower case, without port or credentials: `openrouter.ai`,
  `127.0.0.1`. The port is left out on purpose: the stand-in takes any free port, and one
  restarted on another port is the same API (its answers resume), not a new one.
- The stand-in marks its answers as its own: its generation ids begin with
  `STANDIN_GENERATION_PREFIX` (`gen-standin-`; OpenRouter's are `gen-<unix time>-<random>`),
  a string id as the API schema has it, so records, ledgers and failure lines of offline
  runs say so whatever wrote them.
- A resume against another API refuses (`other_api`, exit 2): previous records of
  another host in `-o` or `--failures` name both hosts. Answers of two APIs never mix in one
  file, so a file is either all real or all offline.
- Spend recorded by another API counts against no cap of this one (`counts_here`):
  `--spent-in` (hence `--total-cost`) and `make plan` skip such records (recorded/spend.py). A record without
  `api` (written before the field) counts: it cannot be told apart, and counting is the
  side that never overspends.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import InputError

STANDIN_GENERATION_PREFIX = "gen-standin-"


def api_of(base_url: str) -> str:
    """The API a base URL names, as records keep it: its host, lower case, no port."""
    try:
        host = urlsplit(base_url).hostname
    except ValueError:
        host = None
    return host or base_url


def counts_here(record_api: str | None, api: str | None) -> bool:
    """Whether spend recorded under RECORD_API counts against a cap of API (None: every
    record counts, as before the field)."""
    return api is None or record_api is None or record_api == api


def is_standin(generation_id: str | None) -> bool:
    return bool(generation_id) and generation_id.startswith(STANDIN_GENERATION_PREFIX)


def other_api(path: str, record_api: str, generation_id: str | None, record_id: str,
              api: str) -> InputError:
    """The refusal (exit 2) to resume PATH, whose record RECORD_ID another API answered."""
    whose = " (the kimipipe stand-in's offline filler, not the model's)" if is_standin(generation_id) else ""
    return InputError(
        f"holds answers of {record_api}{whose} (first: id {record_id!r}), and this run asks "
        f"{api}: answers of two APIs never mix in one file; write to another -o and --failures "
        f"(under make: another WORK, or `make D.clean` first), or resume with the --base-url of "
        f"{record_api}", path)
