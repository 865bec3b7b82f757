"""From source records to prompt records: stable IDs, dedup, `--max-chars`, sampling, and
the counts the summary gives.

IDs are stable: the source's own id when it has one (`#N` added for the N-th user turn
with `--turns each`), else `<dataset>-<16 hex>` from a SHA-256 of the dataset and the
messages (and the follow-ups, where there are any). The same input always gives the same
IDs, byte for byte, which resume relies on.

kp-prompts reads its sources twice (`candidates` both times): `select` decides from the
first pass which candidates are written, under which IDs, keeping only IDs, content
hashes and where they were; the second pass writes the chosen ones (`write_order`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ..errors import InputError
from ..ids import content_hash, hash_id, prompt_shuffle_key  # (the hashes: ids.py)
from ..records import Message, Prompt
from ..terminal import counted
from .conversation import Blocker, FormatError
from .formats import read_record
from .reading import SourceRecord, read_source
from .turns import Picked, pick_turns

SHOWN = 3  # the records a summary names per kind


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
    id_field: str | None  # None: each format's own (`id`; MT-Bench's `question_id`)
    system: str | None
    turns: str
    strict: bool = False


@dataclass
class Candidate:
    position: tuple  # (file, record, user turn): what tells candidates apart
    pid: str | None  # the source's own id (None: a hash of the content is the id)
    messages: list[dict]
    follow_ups: list[str]
    meta: dict | None
    shown: str
    record: SourceRecord

    @property
    def where(self) -> str:
        return self.record.located(self.shown)


@dataclass
class Named:
    """A count, and where its first few records were."""

    n: int = 0
    first: list[str] = field(default_factory=list)

    def add(self, what: str) -> None:
        self.n += 1
        if len(self.first) < SHOWN:
            self.first.append(what)

    def said(self, what: str, plural: str | None = None, lead: str = "first") -> str:
        more = ", ..." if self.n > len(self.first) else ""
        return f"{counted(self.n, what, plural)} ({lead}: {', '.join(self.first)}{more})"


@dataclass
class Selection:
    """Pass one's verdicts: which candidates are written, and the counts for the summary."""

    kept: dict[tuple, str] = field(default_factory=dict)  # position -> id
    # id -> (hash, where); hash -> (id, where): where as (file shown, line, element number
    # or 0), made into text only when a summary or an error names it
    seen_ids: dict[str, tuple[str, tuple]] = field(default_factory=dict)
    seen_content: dict[str, tuple[str, tuple]] = field(default_factory=dict)
    no_user_turn: int = 0
    too_long: int = 0
    duplicates: Named = field(default_factory=Named)
    skipped: dict[Blocker, Named] = field(default_factory=dict)  # records not regenerable
    cut: Named = field(default_factory=Named)  # --turns all: ended before a turn
    tools_left_out: int = 0

    def summary(self) -> list[str]:
        """The summary's clauses: what was skipped, and what was shortened."""
        out = []
        if self.no_user_turn:
            out.append(f"{self.no_user_turn:,} without a user turn")
        for blocker, named in self.skipped.items():
            out.append(f"{named.n:,} with {blocker.value} ({', '.join(named.first)}"
                       + (", ..." if named.n > len(named.first) else "") + ")")
        if self.duplicates.n:
            out.append(self.duplicates.said("duplicate", lead="dropped"))
        if self.too_long:
            out.append(f"{self.too_long:,} longer than --max-chars")
        return out

    def shortened(self) -> list[str]:
        out = []
        if self.cut.n:
            more = ", ..." if self.cut.n > len(self.cut.first) else ""
            out.append(f"{counted(self.cut.n, 'conversation')} ended early, before a turn that is not "
                       f"plain text (first: {', '.join(self.cut.first)}{more})")
        if self.tools_left_out:
            out.append(f"{counted(self.tools_left_out, 'tool declaration')} left out")
        return out


def candidates(reading: Reading, counts: Selection) -> Iterator[Candidate]:
    """Every prompt the sources hold, in order, with what is skipped counted in COUNTS."""
    for file_index, (path, shown) in enumerate(reading.sources):
        for rec in read_source(path, reading.fmt, shown):
            try:
                conv, sid = read_record(rec.obj, reading.fmt, reading.id_field)
                picked = pick_turns(conv, reading.turns)
                blocker = conv.first_blocker()
                if reading.strict and blocker:
                    raise FormatError(f"{blocker[0].value} (--strict: kp-prompts reads plain chat only; "
                                      f"without --strict {_instead(blocker, picked)})", blocker[1])
            except FormatError as e:
                raise InputError(rec.where(f"{e.message} at `{e.json_path}`"), shown, rec.line) from None
            if picked.skipped:
                counts.skipped.setdefault(picked.skipped[0], Named()).add(rec.located(shown))
            elif not picked.picks:
                counts.no_user_turn += 1
            if picked.cut:
                counts.cut.add(rec.located(shown))
            counts.tools_left_out += picked.tools_left_out
            meta = rec.obj.get("meta")
            for pick in picked.picks:
                pid = None if sid is None else (f"{sid}#{pick.k}" if reading.turns == "each" else sid)
                # By element, not by line: a one-line JSON array holds every record on line 1.
                yield Candidate((file_index, rec.index, pick.k), pid,
                                with_system(pick.messages, reading.system), pick.follow_ups,
                                meta if isinstance(meta, dict) else None, shown, rec)


def _instead(blocker: tuple[Blocker, str], picked: Picked) -> str:
    """What kp-prompts does with BLOCKER when not --strict: `--turns all` keeps what it can."""
    if not picked.picks:
        return "the record is skipped"
    if picked.cut == blocker:
        return "the conversation is kept up to this turn"
    if blocker[0] is Blocker.TOOL_DECLARATION:
        return "the declaration is left out"
    return "the source's answer holding it is dropped"  # --turns all reads no answer


def select(reading: Reading, dataset: str, keep_duplicates: bool, max_chars: int | None) -> Selection:
    """Pass one: validate every record and decide what is written, under which ID."""
    sel = Selection()
    for c in candidates(reading, sel):
        messages, rec = c.messages, c.record
        if max_chars is not None and (sum(len(m["content"]) for m in messages)
                                      + sum(len(f) for f in c.follow_ups)) > max_chars:
            sel.too_long += 1
            continue
        digest = content_hash(messages, c.follow_ups)
        pid = c.pid
        hashed = pid is None
        if hashed:
            pid = hash_id(dataset, messages, c.follow_ups)
        earlier = sel.seen_content.get(digest)
        if earlier is not None and not keep_duplicates:
            sel.duplicates.add(f"{c.where} repeats {_located(earlier[1])}" if hashed or earlier[0] == pid
                               else f"{pid} repeats {earlier[0]}")
            continue
        if hashed and pid in sel.seen_ids:  # --keep-duplicates: number the repeats
            n = 2
            while f"{pid}-{n}" in sel.seen_ids:
                n += 1
            pid = f"{pid}-{n}"
        first = sel.seen_ids.get(pid)
        if first is not None:
            if first[0] != digest:
                raise InputError(rec.where(f"duplicate id {pid!r} with different content "
                                           f"(first seen at {_located(first[1])})"), c.shown, rec.line)
            sel.duplicates.add(f"{c.where} repeats {_located(first[1])}")
            continue
        at = (c.shown, rec.line, rec.index + 1 if rec.element else 0)
        sel.seen_ids[pid] = (digest, at)
        sel.seen_content.setdefault(digest, (pid, at))
        sel.kept[c.position] = pid
    del sel.seen_ids, sel.seen_content  # only `kept` and the counts are needed from here
    return sel


def _located(at: tuple) -> str:
    shown, line, element = at
    return f"{shown}:{line}" + (f" (element {element})" if element else "")


def write_order(sel: Selection, shuffle: bool, seed: int, limit: int | None) -> dict[tuple, int]:
    """position -> rank in the output, for the candidates written (`--shuffle`, `--limit`)."""
    chosen = list(sel.kept.items())
    if shuffle:
        chosen.sort(key=lambda item: prompt_shuffle_key(seed, item[1]))
    if limit is not None:
        chosen = chosen[:limit]
    return {position: i for i, (position, _pid) in enumerate(chosen)}


def make_prompt(pid: str, dataset: str, c: Candidate) -> Prompt:
    return Prompt(id=pid, dataset=dataset,
                  messages=[Message(role=m["role"], content=m["content"]) for m in c.messages],
                  meta=c.meta, follow_ups=c.follow_ups)

