"""Scale-out by partition: `--partition K/N` selects the IDs whose hash falls in part K of N.

N machines (a Slurm array, GNU parallel over ssh, a Ray or Kubernetes job) run the same
command, each with its own K, and produce disjoint outputs whose union is the whole. The
part depends on the ID alone (SHA-256), so it is the same on every machine, in every run
and in every stage (kp-infer and kp-tokenize agree on it).
"""

from __future__ import annotations

from .ids import partition_of  # (the hash: ids.py)


def in_partition(record_id: str, partition: tuple[int, int] | None) -> bool:
    return partition is None or partition_of(record_id, partition[1]) == partition[0]


def parse_partition(text: str) -> tuple[int, int]:
    """`K/N` -> (K, N) with 1 <= K <= N."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"{text!r} is not K/N (e.g. 1/2)") from None
    if not 1 <= k <= n:
        raise ValueError(f"{text!r}: K must be between 1 and N")
    return k, n
