"""Where the rows came from: what the token records say of each row kept, counted.

The token record of a row carries what kp-infer and kp-tokenize knew of its answer: the
model as served, the provider, the API, the sampling as sent, the reasoning, the turn of
its conversation, where its output IDs came from and the token-count deltas. The fast
path (rows.py) hands those fields over undecoded (msgspec Raw, `RecordFacts`); here each
row's are reduced to a profile (the categorical ones, interned: a build has a few dozen
distinct profiles) and its two deltas, small enough to travel with the row through the
shuffle's spill files. Only rows kept are counted (`count`, called where a row is written,
after the duplicate check), so the figures add up to the manifest's.

Fields are read generically: a field a record lacks counts as "unknown" (or its stated
default), one that is not a string as its compact JSON, so a field other stages extend
(`output_ids_source`) is counted by whatever value it holds, never refused.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import msgspec
from msgspec import Raw, Struct

from ..records import Tokens
from .manifest import DeltaStats, ProviderRows, SamplingRows, ShardProvenance

NULL = Raw(b"null")
NO_DELTA = -(2**31)  # a row without that delta (the spill's int32 field)
_DELTA_LIMIT = 2**31 - 1


class RecordFacts(Tokens):
    """A token record as the fast path decodes it: Tokens, and the fields counted here,
    left undecoded (any JSON value is accepted: nothing here can refuse a record)."""

    model: Raw = NULL
    provider: Raw = NULL
    api: Raw = NULL
    sampling: Raw = NULL
    usage: Raw = NULL
    reasoning_source: Raw = NULL
    history_reasoning: Raw = NULL
    turn: Raw = NULL
    turns: Raw = NULL
    output_ids_source: Raw = NULL
    routing: Raw = NULL
    prompt_tokens_delta: Raw = NULL
    completion_tokens_delta: Raw = NULL


class _Reasoning(Struct):
    reasoning_tokens: int = 0


_reasoning_decoder = msgspec.json.Decoder(_Reasoning)
_any_decoder = msgspec.json.Decoder()
_encode = msgspec.json.Encoder().encode
# The profile's parts, in order: a key is their raw JSON joined by NUL (which raw JSON
# never holds unescaped).
_PARTS = ("dataset", "model", "provider", "api", "finish_reason", "sampling", "reasoning",
          "reasoning_source", "history_reasoning", "turn", "turns", "output_ids_source",
          "routing")


def _delta(raw: Raw) -> int:
    text = bytes(raw)
    try:
        value = int(text)
    except ValueError:
        return NO_DELTA  # null, or not an integer: no delta
    return value if -_DELTA_LIMIT <= value <= _DELTA_LIMIT else NO_DELTA


def _had_reasoning(rec: RecordFacts) -> bool:
    if bytes(rec.reasoning_source) not in (b"null", b'""'):
        return True
    try:
        return _reasoning_decoder.decode(rec.usage).reasoning_tokens > 0
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False


def _text(raw: bytes, unknown: str = "unknown") -> str:
    """A profile part as a name: a string as it is, null as UNKNOWN, else compact JSON."""
    value = _any_decoder.decode(raw)
    if value is None:
        return unknown
    return value if isinstance(value, str) else _encode(value).decode()


def _add_delta(stats: DeltaStats, value: int) -> None:
    if value == NO_DELTA:
        return
    stats.rows += 1
    stats.zero += value == 0
    stats.sum += value
    stats.min = value if stats.min is None else min(stats.min, value)
    stats.max = value if stats.max is None else max(stats.max, value)


@dataclass
class _Profile:
    rows: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass
class Provenance:
    """The profiles seen (`profile`, when a row is built) and the rows kept (`count`)."""

    keys: dict[bytes, int] = field(default_factory=dict)
    kept: dict[int, _Profile] = field(default_factory=dict)
    # per profile: (prompt, completion) delta stats
    deltas: dict[int, tuple[DeltaStats, DeltaStats]] = field(default_factory=dict)

    def profile(self, rec: RecordFacts) -> int:
        """The interned profile of a token record (its categorical facts)."""
        parts = (_encode(rec.dataset), bytes(rec.model), bytes(rec.provider), bytes(rec.api),
                 _encode(rec.finish_reason), bytes(rec.sampling),
                 b"true" if _had_reasoning(rec) else b"false", bytes(rec.reasoning_source),
                 bytes(rec.history_reasoning), bytes(rec.turn), bytes(rec.turns),
                 bytes(rec.output_ids_source), bytes(rec.routing))
        key = b"\0".join(parts)
        index = self.keys.get(key)
        if index is None:
            index = self.keys[key] = len(self.keys)
        return index

    @staticmethod
    def deltas_of(rec: RecordFacts) -> tuple[int, int]:
        return _delta(rec.prompt_tokens_delta), _delta(rec.completion_tokens_delta)

    def count(self, profile: int, input_tokens: int, output_tokens: int,
              prompt_delta: int, completion_delta: int) -> None:
        """One row kept, of PROFILE."""
        p = self.kept.get(profile)
        if p is None:
            p = self.kept[profile] = _Profile()
            self.deltas[profile] = (DeltaStats(), DeltaStats())
        p.rows += 1
        p.input_tokens += input_tokens
        p.output_tokens += output_tokens
        prompt, completion = self.deltas[profile]
        _add_delta(prompt, prompt_delta)
        _add_delta(completion, completion_delta)

    def summary(self) -> ShardProvenance:
        by_index = {index: key for key, index in self.keys.items()}
        tallies: dict[str, Counter] = {name: Counter() for name in _PARTS}
        providers: dict[str, ProviderRows] = {}
        sampling: Counter = Counter()
        total = 0
        for index, kept in self.kept.items():
            parts = dict(zip(_PARTS, by_index[index].split(b"\0"), strict=True))
            n = kept.rows
            total += n
            for name in ("dataset", "model", "api", "finish_reason", "reasoning_source"):
                tallies[name][_text(parts[name], "none" if name == "reasoning_source" else "unknown")] += n
            tallies["reasoning"]["with" if parts["reasoning"] == b"true" else "without"] += n
            if parts["history_reasoning"] != b"null":
                tallies["history_reasoning"][_text(parts["history_reasoning"])] += n
            tallies["turn"][_text(parts["turn"], "1")] += n
            tallies["turns"][_text(parts["turns"], "1")] += n
            tallies["output_ids_source"][_text(parts["output_ids_source"], "reencoded")] += n
            tallies["routing"][_text(parts["routing"], "verified")] += n
            sampling[parts["sampling"]] += n
            row = providers.setdefault(_text(parts["provider"]), ProviderRows())
            row.rows += n
            row.input_tokens += kept.input_tokens
            row.output_tokens += kept.output_tokens
            for mine, theirs in zip((row.prompt_delta, row.completion_delta),
                                    self.deltas[index], strict=True):
                _merge(mine, theirs)

        def ordered(counts: Counter, numeric: bool = False) -> dict[str, int]:
            if numeric:
                return {k: counts[k] for k in sorted(counts, key=_number_first)}
            return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

        return ShardProvenance(
            rows=total,
            datasets=ordered(tallies["dataset"]),
            models=ordered(tallies["model"]),
            providers=dict(sorted(providers.items(), key=lambda kv: (-kv[1].rows, kv[0]))),
            apis=ordered(tallies["api"]),
            finish_reasons=ordered(tallies["finish_reason"]),
            sampling=[SamplingRows(_any_decoder.decode(raw), n) for raw, n in
                      sorted(sampling.items(), key=lambda kv: (-kv[1], kv[0]))],
            reasoning=ordered(tallies["reasoning"]),
            reasoning_sources=ordered(tallies["reasoning_source"]),
            history_reasoning=ordered(tallies["history_reasoning"]),
            turns=ordered(tallies["turns"], numeric=True),
            turn=ordered(tallies["turn"], numeric=True),
            output_ids_source=ordered(tallies["output_ids_source"]),
            routing=ordered(tallies["routing"]),
        )


def _number_first(key: str) -> tuple:
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


def _merge(into: DeltaStats, other: DeltaStats) -> None:
    if not other.rows:
        return
    into.rows += other.rows
    into.zero += other.zero
    into.sum += other.sum
    into.min = other.min if into.min is None else min(into.min, other.min)
    into.max = other.max if into.max is None else max(into.max, other.max)
