"""Which answers belong to the current prompts: a changed source never mixes into the rows.

A responses file outlives the source it was answered from: fix or replace `sources/B3.json`
and kp-prompts writes new prompts, kp-infer answers the new ones into the same file (it
resumes by ID), and the old answers stay there. They were paid for, so nothing deletes them:
they keep counting in the spend (make's TOTAL_COST reads every responses file) and are
reused, unpaid, if the old prompts come back. They must not be trained on.

- `kp-tokenize --prompts FILE` tokenizes only the answers to FILE's prompts (`Prompts.holds`:
  the answer's prompt ID, a conversation turn's `conversation`, is in FILE, and its messages
  are that prompt's messages, then for each earlier turn an answer and the prompt's next
  follow-up: recorded/asked.py `answers_prompt`, the test kp-infer's resume applies too; a
  source fixed under the same IDs changes them). The others are counted and said, never
  written. make passes the dataset's prompts file.
- A row is an answer's: kp-tokenize tells rows and answers by (id, generation_id), not by
  id alone (`scan_rows`), since a prompt fixed under its id is answered again (kp-infer
  asks it again: recorded/asked.py) and its old answer stays in the responses file under
  the same id. The new answer's row is made; the old answer's is then a row the input does
  not give. A conversation fixed under its id is asked again from its first turn whose
  messages changed (infer/conversations.py): its turns from there on are answered again
  under their old turn ids, and their old answers' rows (and those of every later old
  turn, asked on an old history) are rows the input does not give.
- An output kp-tokenize resumes may hold rows its input no longer gives (an earlier input's,
  or an answer --prompts now leaves out). They are found at the end of the run (`stale_rows`:
  the output's rows minus those the input gave, which is all the run keeps in memory) and
  refused, exit 2, unless `--prune`, which rewrites the output without them
  (`prune_output`): token rows are made from the answers again at will, so dropping them
  loses nothing paid for. kp-shard rebuilds its whole set from its input, so its output
  never holds rows its input lacks.
"""

from __future__ import annotations

import os

import msgspec

from ..io import iter_finished, iter_lines, iter_records, repair_and_report
from ..recorded.asked import PromptKey, answers_prompt, prompt_key
from ..records import Prompt
from ..writers import AtomicOutput

_PROMPT_DECODER = msgspec.json.Decoder(Prompt)


class _RowOf(msgspec.Struct):
    """Which answer a row (or a response record) is: its id and generation id."""

    id: str
    generation_id: str | None = None

    @property
    def key(self) -> tuple[str, str | None]:
        return self.id, self.generation_id


_ROW_DECODER = msgspec.json.Decoder(_RowOf)

Row = tuple[str, str | None]  # (id, generation_id)


def scan_rows(path: str, quiet: bool = False) -> set[Row]:
    """The answers OUTPUT holds rows of (empty if it does not exist), a torn last line
    repaired first (its answer is redone)."""
    if path == "-" or not os.path.exists(path):
        return set()
    repair_and_report(path, quiet=quiet)
    return {row.key for row in iter_finished(path, _ROW_DECODER)}


class Prompts:
    """The prompts of a prompts file, as much as telling their answers apart needs: per ID,
    a digest of each message and of each follow-up (recorded/asked.py `PromptKey`)."""

    def __init__(self, path: str):
        self.path = path
        self._by_id: dict[str, PromptKey] = {}
        for _lineno, prompt, _line in iter_records(path, _PROMPT_DECODER, expect="prompt"):
            self._by_id[prompt.id] = prompt_key(prompt.messages, prompt.follow_ups)

    def holds(self, record_id: str, conversation: str | None, messages) -> bool:
        """Whether an answer (its id, its `conversation` on a conversation's turn, and the
        messages it was asked with) answers one of these prompts as they are now: the test
        kp-infer's resume applies to a conversation's turns (`answers_prompt`)."""
        known = self._by_id.get(conversation or record_id)
        return known is not None and answers_prompt(known, messages)


def stale_rows(done: set[Row], given: set[Row]) -> list[Row]:
    """The rows an output held before the run that the input (as filtered) did not give."""
    return sorted(done - given, key=lambda row: (row[0], row[1] or ""))


def prune_output(path: str, drop: set[Row]) -> int:
    """Rewrite output PATH (plain or `.zst`) without the rows DROP names, whole or not at
    all (a temporary file, then a rename); the rows removed. The caller holds the output's
    lock."""
    out = AtomicOutput(path)
    removed = 0
    try:
        for _lineno, line, _ended in iter_lines(path):
            if _ROW_DECODER.decode(line).key in drop:
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

