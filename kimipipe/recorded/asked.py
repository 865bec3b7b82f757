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
"""

from __future__ import annotations

import hashlib

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
