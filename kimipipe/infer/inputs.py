"""kp-infer's input, read whole before anything is sent (IDs and sums only).

`read_input` spools standard input to a temporary file (the run reads the input a second
time, as it sends), then checks every line (`validate_input`): its format, duplicate IDs,
empty messages, no user turn, an empty follow-up. A bad line stops the command (`PATH:LINE`,
exit 2) before any money is spent. The pass keeps only the IDs, the turns of each
conversation, a digest of each prompt's messages (a prompt fixed under its id is
asked again: infer/resume.py) and of each conversation's messages and follow-ups (a
conversation fixed under its id is asked again from the turn that changed:
infer/conversations.py `scan_output`) and a few sums (bytes and a token bound, for `--plan`):
`InputScan`.
`--sample N` keeps the N prompts whose SHA-256 of id is smallest (`stable_sample`: the same
prompts in every run, so a pilot's answers are part of the final data).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import msgspec

from ..errors import InputError
from ..ids import sample_key
from ..io import iter_records, spool_stdin
from ..recorded.asked import PromptKey, prompt_digest, prompt_key
from ..records import Prompt
from .budget import MESSAGE_OVERHEAD_TOKENS, prompt_token_bound
from .conversations import turn_count

PROMPT_DECODER = msgspec.json.Decoder(Prompt)


@dataclass
class InputScan:
    """What the run keeps of its input (see the module docstring)."""

    path: str  # a re-readable path (stdin spooled)
    shown: str  # the path as errors name it
    ids: set[str]
    records: int
    prompt_bytes: int
    prompt_token_bound: int
    turns: dict[str, int] = field(default_factory=dict)  # a conversation's id -> its turns
    # every request the input makes (a conversation's turns each count), for --plan: how
    # many, their prompts' bytes and token bound without the earlier answers in their
    # history, and how many earlier answers their histories carry in all
    requests: int = 0
    request_bytes: int = 0
    request_token_bound: int = 0
    history_answers: int = 0
    largest_prompt_bound: int = 0  # the largest prompt's token bound (a cap's floor)
    # a single prompt's id -> its messages' digest (recorded/asked.py): an answer in the
    # output to the same id asked otherwise (a source fixed under its ids) is not its answer
    asked: dict[str, bytes] = field(default_factory=dict)
    # a conversation's id -> its messages' and follow-ups' digests: which of the output's
    # turns were asked on it as it is now (recorded/asked.py `answers_prompt`)
    conversations: dict[str, PromptKey] = field(default_factory=dict)

    def turns_of(self, prompt_id: str) -> int:
        return self.turns.get(prompt_id, 1)


class _Requests:
    """The sums InputScan keeps of the requests the input makes (see there)."""

    def __init__(self) -> None:
        self.n = self.bytes = self.token_bound = self.answers = 0

    def add(self, prompt: Prompt) -> None:
        size = sum(len(m.content.encode()) for m in prompt.messages)
        bound = prompt_token_bound(prompt.messages)
        for k, follow_up in enumerate(("", *prompt.follow_ups)):  # turn k+1 adds a user turn
            if k:
                size += len(follow_up.encode())
                bound += len(follow_up.encode()) + 2 * MESSAGE_OVERHEAD_TOKENS  # + its answer's
            self.n += 1
            self.bytes += size
            self.token_bound += bound
            self.answers += k


def read_input(path: str, tmpdir: str) -> InputScan:
    """PATH checked whole (`-`: standard input, spooled into TMPDIR first)."""
    shown = path
    if path == "-":
        path, shown = spool_stdin(tmpdir), "<stdin>"
    return validate_input(path, shown)


def validate_input(path: str, shown: str) -> InputScan:
    """Check every line before any money is spent: format, duplicate IDs, empty messages."""
    first_line: dict[str, int] = {}
    turns: dict[str, int] = {}
    asked: dict[str, bytes] = {}
    conversations: dict[str, PromptKey] = {}
    requests = _Requests()
    prompt_bytes = 0
    token_bound = 0
    largest = 0
    records = 0
    for lineno, prompt, _line in iter_records(path, PROMPT_DECODER, expect="prompt", shown=shown):
        if prompt.id in first_line:
            raise InputError(f"duplicate id {prompt.id!r} (first at line {first_line[prompt.id]})",
                             shown, lineno)
        if not prompt.messages:
            raise InputError("empty `messages` at `$.messages`", shown, lineno)
        if not any(m.role == "user" for m in prompt.messages):
            raise InputError("no user message at `$.messages`", shown, lineno)
        for i, text in enumerate(prompt.follow_ups):
            if not text.strip():
                raise InputError(f"empty user turn at `$.follow_ups[{i}]`", shown, lineno)
        first_line[prompt.id] = lineno
        records += 1
        prompt_bytes += sum(len(m.content.encode()) for m in prompt.messages)
        bound = prompt_token_bound(prompt.messages)
        token_bound += bound
        largest = max(largest, bound)
        requests.add(prompt)
        if prompt.follow_ups:
            turns[prompt.id] = turn_count(prompt)
            conversations[prompt.id] = prompt_key(prompt.messages, prompt.follow_ups)
        else:
            asked[prompt.id] = prompt_digest(prompt.messages)
    return InputScan(path, shown, set(first_line), records, prompt_bytes, token_bound, turns,
                     requests.n, requests.bytes, requests.token_bound, requests.answers,
                     largest, asked, conversations)


def stable_sample(ids: set[str], n: int) -> set[str]:
    """The N IDs whose SHA-256 (of the UTF-8 id) is smallest: the same N in every run."""
    return set(heapq.nsmallest(n, ids, key=sample_key))
