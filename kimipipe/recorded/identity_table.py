"""Identity per provider: how its answers' token counts compared with the target model's.

One row per provider, made the same way from a run (infer/identity.py: the summary, stderr
and `--summary-json`'s `identity.providers`) and from files on disk (`kp-infer report`,
the HTML report: a response record's `identity`, a refusal of kind `identity`, the
output's identity file), JSON-stable:

    {"provider": str,
     "checked": int,                answers whose counts were checked (kept or refused)
     "refused": int,                of them, refused for identity (paid for, sent again)
     "unchecked": int,              answers that showed no usage.prompt_tokens
     "offset": int | null,          the typical usage.prompt_tokens minus kimipipe's count
                                    (0: the prompt as kimipipe renders it, token for token)
     "offsets": {"+0": n, ...},     the five most common offsets
     "refused_offset": int | null,  the typical offset of its answers refused
     "band": str | null,            where the typical offset lies against the vendor
                                    verifier's tolerance (VENDOR_BAND): "+2: inside the
                                    vendor verifier's tolerance", or outside
     "completion_ratio": float|null usage.completion_tokens / kimipipe's count of the
                                    answer (its text re-encoded, plus the structural
                                    tokens), the median: ~1.0 for the target's tokenizer
     "quarantined": bool}           put in provider.ignore for the rest of the run and
                                    for its resumes

Rows are sorted by answers checked, then name.

A run that checks identity keeps the providers it quarantined in a file beside its output,
OUTPUT.identity.json (contracts.IdentityState: `state_path`, `read_state`), which its
resumes and the reports over that output read.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

import msgspec

from ..contracts import IdentityState
from ..errors import InputError
from ..records import Identity, Usage
from .providers_table import percentile

# The overcount honest serving stacks of the same model show, as the model's owner accepts
# it: Moonshot's Kimi Vendor Verifier (tests/prompt_tokens/test_prompt_tokens.py,
# MAX_PROMPT_TOKEN_OVERCOUNT = 3, "prompt tokens fix gap", 2026-08-03) accepts a vendor's
# usage.prompt_tokens "between the expected value and three tokens above it, inclusive",
# and no undercount. kp-infer's judge (infer/identity.py) takes an offset from kimipipe's
# count inside it as the target's.
VENDOR_BAND = range(0, 3 + 1)


def band_text() -> str:
    """The band as messages write it: "0..+3"."""
    return f"{VENDOR_BAND.start}..{VENDOR_BAND.stop - 1:+d}"


def band_verdict(offset: int | None) -> str | None:
    """Where OFFSET lies against the vendor verifier's tolerance: "+2: inside the vendor
    verifier's tolerance" (`--preflight`, the summary, `kp-infer report`); None for none."""
    if offset is None:
        return None
    return (f"{offset:+d}: {'inside' if offset in VENDOR_BAND else 'outside'} the vendor "
            "verifier's tolerance")


def state_path(output: str) -> str | None:
    """Where a run on OUTPUT keeps its identity state (None for stdout)."""
    return None if output == "-" else f"{output}.identity.json"


def read_state(path: str | None) -> IdentityState:
    """The identity file at PATH (an empty state when there is none)."""
    if path is None or not os.path.exists(path):
        return IdentityState()
    try:
        with open(path, "rb") as f:
            return msgspec.json.decode(f.read(), type=IdentityState)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        raise InputError(f"not kp-infer's identity file ({e}); remove it to lift its "
                         "quarantine", path) from None


def typical(values: Counter) -> int | None:
    """The most common value (ties: the one nearest 0); None when there is none."""
    if not values:
        return None
    return min(values, key=lambda v: (-values[v], abs(v), v))


@dataclass
class _Tally:
    checked: int = 0
    refused: int = 0
    unchecked: int = 0
    offsets: Counter = field(default_factory=Counter)
    refused_offsets: Counter = field(default_factory=Counter)
    ratios: list[float] = field(default_factory=list)
    quarantined: bool = False


class IdentityTable:
    """Identity figures per provider; `rows()` for JSON, `text()` for a terminal."""

    def __init__(self) -> None:
        self._by: dict[str, _Tally] = {}

    def _of(self, provider: str | None) -> _Tally:
        return self._by.setdefault(provider or "unknown", _Tally())

    def checked(self, provider: str | None, offset: int | None, ratio: float | None,
                refused: bool = False) -> None:
        """One answer checked: OFFSET None when it showed no prompt count."""
        row = self._of(provider)
        row.checked += 1
        row.refused += refused
        if offset is None:
            row.unchecked += 1
        else:
            row.offsets[offset] += 1
            if refused:
                row.refused_offsets[offset] += 1
        if ratio is not None:
            row.ratios.append(ratio)

    def kept(self, provider: str | None, identity: Identity | None, usage: Usage) -> None:
        """A kept answer's check (its record's `identity`, None: its run made none)."""
        if identity is None:
            return
        ratio = (usage.completion_tokens / identity.completion_tokens
                 if identity.completion_tokens and usage.completion_tokens else None)
        self.checked(provider, identity.offset, ratio)

    def quarantine(self, provider: str) -> None:
        self._of(provider).quarantined = True

    def quarantined_beside(self, path: str) -> None:
        """The providers quarantined by the run that wrote PATH (its identity file)."""
        where = state_path(path)
        if where is None or not os.path.exists(where):
            return
        for q in read_state(where).quarantined:
            self.quarantine(q.provider)

    def is_quarantined(self, provider: str | None) -> bool:
        row = self._by.get(provider or "unknown")
        return row is not None and row.quarantined

    def __bool__(self) -> bool:
        return bool(self._by)

    def merge(self, other: IdentityTable) -> None:
        """OTHER's answers added to this table's (the build report's whole build)."""
        for name, o in other._by.items():
            row = self._of(name)
            row.checked += o.checked
            row.refused += o.refused
            row.unchecked += o.unchecked
            row.offsets.update(o.offsets)
            row.refused_offsets.update(o.refused_offsets)
            row.ratios += o.ratios
            row.quarantined = row.quarantined or o.quarantined

    def rows(self) -> list[dict]:
        out = []
        for name, r in self._by.items():
            ratios = sorted(r.ratios)
            ratio = percentile(ratios, 0.5)
            offset = typical(r.offsets)
            out.append({
                "provider": name, "checked": r.checked, "refused": r.refused,
                "unchecked": r.unchecked, "offset": offset, "band": band_verdict(offset),
                "offsets": {f"{k:+d}": n for k, n in r.offsets.most_common(5)},
                "refused_offset": typical(r.refused_offsets),
                "completion_ratio": None if ratio is None else round(ratio, 3),
                "quarantined": r.quarantined})
        out.sort(key=lambda r: (-r["checked"], r["provider"]))
        return out

    def text(self, indent: str = "") -> str:
        return identity_text(self.rows(), indent)


def identity_text(rows: list[dict], indent: str = "") -> str:
    """ROWS (`IdentityTable.rows()`) as a table."""
    lines = [indent + f"{'provider':<18}{'checked':>8}{'refused':>8}{'offset':>8}"
             f"{'compl ratio':>12}  quarantined  offsets seen"]
    for r in rows:
        offset = "-" if r["offset"] is None else f"{r['offset']:+d}"
        ratio = "-" if r["completion_ratio"] is None else f"{r['completion_ratio']:.3f}"
        seen = ", ".join(f"{k} x{n:,}" for k, n in r["offsets"].items())
        if r.get("band"):  # (rows of older runs have none)
            seen = f"{r['band']}; {seen}"
        if r["refused"] and r.get("refused_offset") is not None:
            seen += f"; refused at {r['refused_offset']:+d} typically"
        if r["unchecked"]:
            seen += (", " if seen else "") + f"{r['unchecked']:,} without a prompt count"
        lines.append(indent + (f"{r['provider'][:17]:<18}{r['checked']:>8,}{r['refused']:>8,}"
                               f"{offset:>8}{ratio:>12}  {'YES' if r['quarantined'] else 'no':<11}  "
                               f"{seen}").rstrip())
    return "\n".join(lines)
