"""kp-shard's manifest (DIR/kp-shard.manifest): the set's files, totals, options and
provenance, one Struct each. Written by kp-shard (shard/build.py, shard/writer.py); read by
kp-shard verify/stats/export, the dataset card, make and the trainers' loaders (which read
it as JSON: the keys and their order are those the file has always had). Schema evolution
as for records: new fields get defaults, types never change.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct


class ShardTotals(Struct):
    shards: int
    records: int
    input_tokens: int
    output_tokens: int
    bytes: int
    uncompressed_bytes: int


class ShardEntry(Struct):
    """A finished shard as the manifest lists it."""

    file: str
    split: str
    records: int
    input_tokens: int
    output_tokens: int
    bytes: int
    uncompressed_bytes: int
    sha256: str


class ManifestOptions(Struct):
    """The options the set was made with (the manifest's `options`)."""

    name: str
    records_per_shard: int | None
    tokens_per_shard: int | None
    compression_level: int
    shuffle: bool
    seed: int | None
    eval_fraction: float
    eval_split: str
    min_output_tokens: int
    max_length: int | None
    truncate: bool
    on_duplicate: str


class DeltaStats(Struct):
    """A provider's token-count deltas (its `usage` count minus kimipipe's: kp-tokenize's
    `prompt_tokens_delta`/`completion_tokens_delta`) over the rows that have one."""

    rows: int = 0
    zero: int = 0  # rows whose count agreed exactly
    sum: int = 0
    min: int | None = None
    max: int | None = None


class ProviderRows(Struct):
    rows: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    prompt_delta: DeltaStats = msgspec.field(default_factory=DeltaStats)
    completion_delta: DeltaStats = msgspec.field(default_factory=DeltaStats)


class SamplingRows(Struct):
    sent: Any  # the record's `sampling`, as sent (None: older records, not recorded)
    rows: int


class ShardProvenance(Struct):
    """Where the set's rows came from, counted over the rows kept (the manifest's
    `provenance`; shard/provenance.py): what the token records say of each. A value a
    record does not have is counted under "unknown"; a value that is not a string, as its
    compact JSON."""

    rows: int
    datasets: dict[str, int]
    models: dict[str, int]  # as served: the answer's `model`
    providers: dict[str, ProviderRows]
    apis: dict[str, int]
    finish_reasons: dict[str, int]
    sampling: list[SamplingRows]  # most rows first
    reasoning: dict[str, int]  # "with" / "without": rows whose answer had reasoning
    reasoning_sources: dict[str, int]  # field, details, inline, none
    history_reasoning: dict[str, int]  # a conversation's turns: keep / drop
    turns: dict[str, int]  # rows by their conversation's `turns` ("1": a single prompt)
    turn: dict[str, int]  # rows by turn number ("1" for a single prompt)
    output_ids_source: dict[str, int]  # "reencoded" (kimipipe's), "sampled", ...
    routing: dict[str, int]  # "verified", or the record's `routing` ("unverifiable")


class ShardManifest(Struct):
    manifest_version: int
    kimipipe_version: str
    created: str  # UTC, ISO 8601
    command: str
    format: str  # the row format: a name in shard/formats.py (eagle, raw)
    row_schema: dict[str, str] | str
    options: ManifestOptions
    inputs: list[str]
    records_read: int
    dropped: dict[str, int]  # by reason
    truncated: int
    splits: dict[str, ShardTotals]  # train, eval (those that hold rows)
    totals: ShardTotals
    shards: list[ShardEntry]
    provenance: ShardProvenance | None = None  # (sets of older kimipipe: none)


class ShardFile(Struct):
    file: str


class ShardFiles(Struct):
    """The view of a manifest that needs only the names of the files it lists."""

    shards: list[ShardFile]
