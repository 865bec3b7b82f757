"""Which answers belong to the current prompts: a changed source never mixes into the rows.

A responses file outlives the source it was answered from: fix or replace `sources/B3.json`
and kp-prompts writes new prompts, kp-infer answers the new ones into the same file (it
resumes by ID), and the old answers stay there. They were paid for, so nothing deletes them:
they keep counting in the spend (make's TOTAL_COST reads every responses file) and are
reused, unpaid, if the old prompts come back. They must not be trained on.

- `kp-tokenize --prompts FILE` tokenizes only the answers to FILE's prompts (`Prompts.holds`:
  the answer's prompt ID, a conversation turn's `conversation`, is in FILE, and its messages
  start with that prompt's messages and user turns; a source fixed under the same IDs
  changes them). The others are counted and said, never written. make passes the dataset's
  prompts file.
- An output kp-tokenize resumes may hold rows its input no longer gives (an earlier input's,
  or an answer --prompts now leaves out). They are found at the end of the run (`stale_rows`:
  the output's IDs minus the IDs the input gave, which is all the run keeps in memory) and
  refused, exit 2, unless `--prune`, which rewrites the output without them
  (`prune_output`): token rows are made from the answers again at will, so dropping them
  loses nothing paid for. kp-shard rebuilds its whole set from its input, so its output
  never holds rows its input lacks.
"""

from __future__ import annotations

import hashlib
import os

import msgspec

from ..io import iter_lines, iter_records
from ..records import Prompt
from ..writers import AtomicOutput

_PROMPT_DECODER = msgspec.json.Decoder(Prompt)
_encoder = msgspec.json.Encoder(order="deterministic")


class _IdOnly(msgspec.Struct):
    id: str


_ID_DECODER = msgspec.json.Decoder(_IdOnly)


def _digest(role: str, content) -> bytes:
    # role and content only: what kp-infer sent of the prompt's messages (records.Message)
    return hashlib.blake2b(_encoder.encode([role, content]), digest_size=8).digest()


class Prompts:
    """The prompts of a prompts file, as much as telling their answers apart needs: per ID,
    a digest of each message and of each follow-up (8 bytes each)."""

    def __init__(self, path: str):
        self.path = path
        self._by_id: dict[str, tuple[tuple[bytes, ...], tuple[bytes, ...]]] = {}
        for _lineno, prompt, _line in iter_records(path, _PROMPT_DECODER, expect="prompt"):
            self._by_id[prompt.id] = (tuple(_digest(m.role, m.content) for m in prompt.messages),
                                      tuple(_digest("user", f) for f in prompt.follow_ups))

    def holds(self, record_id: str, conversation: str | None, messages) -> bool:
        """Whether an answer (its id, its `conversation` on a conversation's turn, and the
        messages it was asked with) answers one of these prompts as they are now."""
        known = self._by_id.get(conversation or record_id)
        if known is None:
            return False
        prompt, follow_ups = known
        asked = [_digest(m.role, msgspec.to_builtins(m.content)) for m in messages]
        if asked[:len(prompt)] != list(prompt):
            return False
        # a later turn's history: the prompt, then each earlier answer and the next user turn
        later_users = [d for m, d in zip(messages[len(prompt):], asked[len(prompt):], strict=True)
                       if m.role == "user"]
        return later_users == list(follow_ups[:len(later_users)])


def stale_rows(done: set[str], given: set[str]) -> list[str]:
    """The IDs an output held before the run that the input (as filtered) did not give."""
    return sorted(done - given)


def prune_output(path: str, drop: set[str]) -> int:
    """Rewrite output PATH (plain or `.zst`) without the rows whose id is in DROP, whole or
    not at all (a temporary file, then a rename); the rows removed. The caller holds the
    output's lock."""
    out = AtomicOutput(path)
    removed = 0
    try:
        for _lineno, line, _ended in iter_lines(path):
            if _ID_DECODER.decode(line).id in drop:
                removed += 1
                continue
            out.writer.write_line(line + b"\n")
    except BaseException:
        out.discard()
        raise
    mode = os.stat(path).st_mode
    out.commit()
    os.chmod(path, mode & 0o7777)
    return removed

