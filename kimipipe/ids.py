"""Stable hashes of IDs and prompts: every one kimipipe computes, spelled here once.

Each depends on its input alone (never on the process: no `hash()`, no salt), so every
machine, every run and every stage agrees on it. Anyone can reproduce them:

    partition_of(id, n)          --partition K/N: SHA-256 of the UTF-8 ID, its first 8 bytes
                                 big-endian, mod N, plus 1 (kp-infer and kp-tokenize agree)
    sample_key(id)               --sample N: the N IDs of smallest SHA-256 (the same N in
                                 every run)
    content_hash(messages, follow_ups)
                                 kp-prompts' duplicate check: SHA-256 hex of the messages
                                 (with the follow-ups, when any: [messages, follow_ups]) as
                                 deterministic JSON (keys sorted)
    hash_id(dataset, messages, follow_ups)
                                 kp-prompts' derived ID: `DATASET-` + the first 16 hex
                                 digits of SHA-256 of [dataset, messages(, follow_ups)] as
                                 that JSON
    prompt_shuffle_key(seed, id) kp-prompts --shuffle: SHA-256 of `SEED\\0ID`, as bytes
    eval_point(id)               kp-shard's eval split: a 64-bit BLAKE2b of the ID (person
                                 `kp-shard-eval`) / 2**64, in [0, 1)
    row_shuffle_key(seed, id)    kp-shard --shuffle: a 64-bit BLAKE2b of the ID keyed by the
                                 seed (16 bytes, big-endian, signed; person `kp-shard-shuf`)
"""

from __future__ import annotations

import hashlib

import msgspec

_hash_encoder = msgspec.json.Encoder(order="deterministic")


def _blake2b_64(record_id: str, person: bytes, key: bytes = b"") -> int:
    digest = hashlib.blake2b(record_id.encode(), digest_size=8, key=key, person=person).digest()
    return int.from_bytes(digest, "big")


def partition_of(record_id: str, parts: int) -> int:
    """The part (1-based) of PARTS that RECORD_ID falls in."""
    return int.from_bytes(hashlib.sha256(record_id.encode()).digest()[:8], "big") % parts + 1


def sample_key(record_id: str) -> bytes:
    """Where RECORD_ID falls in --sample's order (smallest first)."""
    return hashlib.sha256(record_id.encode()).digest()


def _hashed(messages: list[dict], follow_ups: list[str]) -> list:
    # Without follow-ups the messages alone, so single-turn prompts keep the IDs of every
    # earlier version (and of --turns last).
    return [messages, follow_ups] if follow_ups else [messages]


def content_hash(messages: list[dict], follow_ups: list[str] = ()) -> str:
    blob = messages if not follow_ups else _hashed(messages, list(follow_ups))
    return hashlib.sha256(_hash_encoder.encode(blob)).hexdigest()


def hash_id(dataset: str, messages: list[dict], follow_ups: list[str] = ()) -> str:
    digest = hashlib.sha256(_hash_encoder.encode([dataset, *_hashed(messages, list(follow_ups))])).hexdigest()[:16]
    return f"{dataset}-{digest}" if dataset else digest


def prompt_shuffle_key(seed: int, pid: str) -> bytes:
    """Where prompt PID falls in kp-prompts' `--shuffle` order: a SHA-256 of the seed and
    the ID, compared as bytes (the order depends on the seed and the IDs alone)."""
    return hashlib.sha256(f"{seed}\0{pid}".encode()).digest()


def eval_point(record_id: str) -> float:
    """Where an ID falls in [0, 1): rows below `--eval-fraction` form the eval split.

    A hash of the ID alone (no seed, no dataset, no position), so an ID lands in the same
    split on every rerun and in every dataset it appears in. A conversation's turns are
    split by the conversation's id (their `conversation` field, kp-shard's `Row.split_key`),
    never by their own, so no conversation has turns on both sides. Reproduce it elsewhere as
    `int.from_bytes(blake2b(id.encode(), digest_size=8, person=b"kp-shard-eval").digest(),
    "big") / 2**64`.
    """
    return _blake2b_64(record_id, b"kp-shard-eval") / 2.0**64


def row_shuffle_key(seed: int, record_id: str) -> int:
    """Where a row falls in kp-shard's `--shuffle` order: a 64-bit BLAKE2b of its ID keyed
    by the seed; its top bits also pick the row's spill bucket (shard/shuffle.py)."""
    return _blake2b_64(record_id, b"kp-shard-shuf", key=seed.to_bytes(16, "big", signed=True))
