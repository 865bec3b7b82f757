"""kp-shard's logic: token records -> compressed training shards + a manifest you can check.

- `rows`: validation of token IDs, the filters, the eval split (a hash of the ID alone)
  and ID fingerprints.
- `formats`: the row formats (`eagle`, `raw`, `parquet`), one table: how each builds a
  row, what files hold it, how verify and stats read it, the card's features. A new
  format is one entry there.
- `parquet`: Parquet shards through pyarrow (an extra, imported only there).
- `provenance`: what the token records say of the rows kept (the manifest's
  `provenance`), carried with each row through the shuffle.
- `card`: the dataset card, DIR/README.md, in the Hugging Face Hub's format.
- `writer`: shard files under temporary names, rolling by records or tokens, SHA-256 as
  written, and the crash-safe swap of a whole set (see its docstring).
- `shuffle`: the deterministic shuffle in bounded memory (hash buckets on disk, each
  sorted in memory; see its docstring).
- `build`: the run itself, the manifest and the card (`write_card`: `kp-shard card`).
- `readback`: reading a finished set back: `verify` and `stats`, either container.

Duplicate IDs: an ID is one training row. Without `--shuffle` the first row with an ID
wins and later ones are dropped and counted (`dropped.duplicate_id`); duplicates are found
through a set of 64-bit ID hashes (Python's string hash: about 70 bytes of memory per row
kept; a false match, which would drop a row, needs billions of rows to become likely). With `--shuffle` they are found exactly, by
ID, inside the hash buckets, in bounded memory; the first row in input order still wins.
`--on-duplicate error` stops instead, `PATH:LINE: duplicate id`, exit 2, and the old set
stays in place.
"""

from .build import BuildResult, ShardOptions, build_shards
from .readback import read_lengths, render_histogram, shard_sets, verify

__all__ = ["BuildResult", "ShardOptions", "build_shards", "read_lengths", "render_histogram",
           "shard_sets", "verify"]
