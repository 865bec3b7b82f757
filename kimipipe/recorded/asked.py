"""What a prompt asks, as a digest: telling an answer to a prompt as it is now from an answer
to the same ID before its source was fixed.

A source fixed under the same IDs (a typo corrected in `sources/B3.json`, kp-prompts run
again) gives prompts whose IDs are the old ones and whose messages are not. Their old answers
stay in the responses file (paid for), so the ID alone cannot say whether a prompt is
answered: its messages must match too.

- `message_digest(role, content)`: 8 bytes of one message, role and content only (what
  kp-infer sends of a message, records.Message). kp-tokenize's `--prompts`
  (tokenize/current.py) compares an answer's messages with its prompt's, one by one.
- `prompt_digest(messages)`: 8 bytes of a single prompt's messages, in order. kp-infer's
  resume (infer/resume.py `changed_prompts`) compares each answer in its output with the
  input's prompt of its ID, and asks again a prompt no answer there matches.
- `prompt_key(messages, follow_ups)` and `answers_prompt(key, messages)`: whether an answer
  (a single prompt's, or any turn of a conversation's) was asked with a prompt as it is now:
  its messages, then for each earlier turn an assistant answer and the next follow-up as a
  user turn. The one test both kp-tokenize's `--prompts` (which answers are trained on) and
  kp-infer's resume of conversations (infer/conversations.py `scan_output`: which turns are
  a conversation's history, and from which turn a conversation fixed under its ID is asked
  again) apply.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import msgspec

_encoder = msgspec.json.Encoder(order="deterministic")


def message_digest(role: str, content) -> bytes:
    return hashlib.blake2b(_encoder.encode([role, content]), digest_size=8).digest()


def prompt_digest(messages) -> bytes:
    """MESSAGES (records.Message, or anything with `role` and `content`) as one digest."""
    whole = hashlib.blake2b(digest_size=8)
    for m in messages:
        whole.update(message_digest(m.role, msgspec.to_builtins(m.content)))
    return whole.digest()


class PromptKey(NamedTuple):
    """A prompt as `answers_prompt` compares answers with it: how many messages it opens
    with, and the digests (8 bytes each, concatenated) of those messages and then of each
    follow-up as a user turn."""

    opening: int
    digests: bytes

    @property
    def turns(self) -> int:
        """Its turns: 1 + its follow-ups."""
        return len(self.digests) // 8 - self.opening + 1


def prompt_key(messages, follow_ups=()) -> PromptKey:
    """MESSAGES (the prompt's) and FOLLOW_UPS (its later user turns) as a PromptKey."""
    return PromptKey(len(messages), b"".join(
        [*(message_digest(m.role, msgspec.to_builtins(m.content)) for m in messages),
         *(message_digest("user", f) for f in follow_ups)]))


def answers_prompt(key: PromptKey, messages) -> bool:
    """Whether MESSAGES, as an answer was asked with them, are the prompt KEY's as it is now:
    its opening messages, then for each earlier turn j an assistant message (the model's own
    answer, whatever it says) and follow-up j as a user turn; so turn k of a conversation is
    answered on the current prompt only if its opening and its first k-1 follow-ups are the
    current ones. A single prompt's answer: its messages exactly."""
    n = key.opening
    later = messages[n:]
    if len(later) % 2:
        return False
    asked = b"".join(message_digest(m.role, msgspec.to_builtins(m.content)) for m in messages[:n])
    if asked != key.digests[:8 * n]:
        return False
    if any(a.role != "assistant" or u.role != "user" for a, u in zip(later[::2], later[1::2], strict=True)):
        return False
    users = b"".join(message_digest("user", msgspec.to_builtins(u.content)) for u in later[1::2])
    return users == key.digests[8 * n:8 * n + len(users)]  # (past the last turn: longer)
