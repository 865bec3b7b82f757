"""From source conversations to prompt records: turn selection, stable IDs, dedup, sampling.

A prompt is a conversation up to and including a user turn: the source's assistant
answers after it are dropped, since they are what the target model regenerates.

IDs are stable: the source's own id when it has one (`#N` added for the N-th user turn
with `--turns each`), else `<dataset>-<16 hex>` from a SHA-256 of the dataset and the
messages. The same input always gives the same IDs, byte for byte, which resume relies on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from .ids import content_hash, hash_id, prompt_shuffle_key  # noqa: F401 (the hashes: ids.py)
from .records import Message, Prompt


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


@dataclass
class Selection:
    """Pass one's verdicts: which candidates are written, and the counts for the summary."""

    kept: dict[tuple, str] = field(default_factory=dict)  # position -> id
    seen_ids: dict[str, tuple[str, str, int | str]] = field(default_factory=dict)  # id -> (hash, file, where)
    seen_content: set[str] = field(default_factory=set)
    no_user_turn: int = 0
    duplicates: int = 0
    too_long: int = 0


def make_prompt(pid: str, dataset: str, messages: list[dict], meta) -> Prompt:
    return Prompt(
        id=pid, dataset=dataset,
        messages=[Message(role=m["role"], content=m["content"]) for m in messages],
        meta=meta if isinstance(meta, dict) else None,
    )

