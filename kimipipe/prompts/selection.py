"""From source conversations to prompt records: turn selection, stable IDs, dedup, sampling.

A prompt is a conversation up to and including a user turn: the source's assistant
answers after it are dropped, since they are what the target model regenerates.

IDs are stable: the source's own id when it has one (`#N` added for the N-th user turn
with `--turns each`), else `<dataset>-<16 hex>` from a SHA-256 of the dataset and the
messages. The same input always gives the same IDs, byte for byte, which resume relies on.

kp-prompts reads its sources twice (`candidates` both times): `select` decides from the
first pass which candidates are written, under which IDs, keeping only IDs and content
hashes; the second pass writes the chosen ones (`write_order`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec

from ..errors import InputError
from ..records import Message, Prompt
from .conversation import FormatError
from .formats import source_id, to_messages
from .reading import SourceRecord, read_source

_hash_encoder = msgspec.json.Encoder(order="deterministic")


def content_hash(messages: list[dict]) -> str:
    return hashlib.sha256(_hash_encoder.encode(messages)).hexdigest()


def hash_id(dataset: str, messages: list[dict]) -> str:
    digest = hashlib.sha256(_hash_encoder.encode([dataset, messages])).hexdigest()[:16]
    return f"{dataset}-{digest}" if dataset else digest


def prompt_turns(messages: list[dict], turns: str) -> Iterator[tuple[int, list[dict]]]:
    """(user-turn number, conversation up to and including it): the last one, or each."""
    user_positions = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not user_positions:
        return
    chosen = user_positions if turns == "each" else user_positions[-1:]
    for i in chosen:
        yield user_positions.index(i) + 1, messages[: i + 1]


def with_system(messages: list[dict], system: str | None) -> list[dict]:
    """Prepend SYSTEM unless the conversation brings a system message of its own."""
    if system is None or (messages and messages[0]["role"] == "system"):
        return messages
    return [{"role": "system", "content": system}, *messages]


@dataclass(frozen=True)
class Reading:
    """How kp-prompts reads its sources: the flags that shape every candidate."""

    sources: list[tuple[str, str]]  # (path to read, path to show)
    fmt: str
    id_field: str
    system: str | None
    turns: str


@dataclass
class Candidate:
    position: tuple  # (file, record, user turn): what tells candidates apart
    pid: str | None  # the source's own id (None: a hash of the content is the id)
    messages: list[dict]
    meta: dict | None
    shown: str
    record: SourceRecord


@dataclass
class Selection:
    """Pass one's verdicts: which candidates are written, and the counts for the summary."""

    kept: dict[tuple, str] = field(default_factory=dict)  # position -> id
    seen_ids: dict[str, tuple[str, str, int | str]] = field(default_factory=dict)  # id -> (hash, file, where)
    seen_content: set[str] = field(default_factory=set)
    no_user_turn: int = 0
    duplicates: int = 0
    too_long: int = 0


def candidates(reading: Reading, counts: Selection) -> Iterator[Candidate]:
    """Every prompt the sources hold, in order; records without a user turn are counted."""
    for file_index, (path, shown) in enumerate(reading.sources):
        for rec in read_source(path, reading.fmt, shown):
            try:
                messages = to_messages(rec.obj, reading.fmt)
                sid = source_id(rec.obj, reading.id_field)
            except FormatError as e:
                raise InputError(rec.where(f"{e.message} at `{e.json_path}`"), shown, rec.line) from None
            found = False
            meta = rec.obj.get("meta") if isinstance(rec.obj, dict) else None
            for k, conversation in prompt_turns(messages, reading.turns):
                found = True
                conversation = with_system(conversation, reading.system)
                pid = None if sid is None else (f"{sid}#{k}" if reading.turns == "each" else sid)
                # By element, not by line: a one-line JSON array holds every record on line 1.
                yield Candidate((file_index, rec.index, k), pid, conversation,
                                meta if isinstance(meta, dict) else None, shown, rec)
            if not found:
                counts.no_user_turn += 1


def select(reading: Reading, dataset: str, keep_duplicates: bool, max_chars: int | None) -> Selection:
    """Pass one: validate every record and decide what is written, under which ID."""
    sel = Selection()
    for c in candidates(reading, sel):
        messages, rec = c.messages, c.record
        if max_chars is not None and sum(len(m["content"]) for m in messages) > max_chars:
            sel.too_long += 1
            continue
        digest = content_hash(messages)
        pid = c.pid
        hashed = pid is None
        if hashed:
            pid = hash_id(dataset, messages)
        if digest in sel.seen_content and not keep_duplicates:
            sel.duplicates += 1
            continue
        if hashed and pid in sel.seen_ids:  # --keep-duplicates: number the repeats
            n = 2
            while f"{pid}-{n}" in sel.seen_ids:
                n += 1
            pid = f"{pid}-{n}"
        first = sel.seen_ids.get(pid)
        if first is not None:
            if first[0] != digest:
                raise InputError(
                    rec.where(f"duplicate id {pid!r} with different content "
                              f"(first seen at {first[1]}:{first[2]})"),
                    c.shown, rec.line)
            sel.duplicates += 1
            continue
        sel.seen_ids[pid] = (digest, c.shown, rec.line if not rec.element else
                             f"{rec.line} (element {rec.index + 1})")
        sel.seen_content.add(digest)
        sel.kept[c.position] = pid
    del sel.seen_ids, sel.seen_content  # only `kept` and the counts are needed from here
    return sel


def write_order(sel: Selection, shuffle: bool, seed: int, limit: int | None) -> dict[tuple, int]:
    """position -> rank in the output, for the candidates written (`--shuffle`, `--limit`)."""
    chosen = list(sel.kept.items())
    if shuffle:
        chosen.sort(key=lambda item: prompt_shuffle_key(seed, item[1]))
    if limit is not None:
        chosen = chosen[:limit]
    return {position: i for i, (position, _pid) in enumerate(chosen)}


def make_prompt(pid: str, dataset: str, messages: list[dict], meta) -> Prompt:
    return Prompt(
        id=pid, dataset=dataset,
        messages=[Message(role=m["role"], content=m["content"]) for m in messages],
        meta=meta if isinstance(meta, dict) else None,
    )


def prompt_shuffle_key(seed: int, pid: str) -> bytes:
    """Where prompt PID falls in kp-prompts' `--shuffle` order: a SHA-256 of the seed and
    the ID, compared as bytes (the order depends on the seed and the IDs alone)."""
    return hashlib.sha256(f"{seed}\0{pid}".encode()).digest()
