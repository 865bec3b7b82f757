"""Sticky routing and the prompt cache, keyed by a request's `session_id`.

OpenRouter keeps the requests that carry one `session_id` (the body field, or the
`x-session-id` header) on one provider, so that its prompt cache serves the prefix they
share: the history of a conversation. The stand-in does the same: the load-balanced draw
is keyed by the session instead of the request body (`routing_key`), and each session
remembers the messages of its last request on each endpoint; a later request on that
endpoint whose messages begin with those reports their tokens as
`usage.prompt_tokens_details.cached_tokens` and bills them at `CACHE_READ_FACTOR` of the
prompt price (Moonshot bills cache reads at 0.25x its input price). A request without a
session is never served from the cache. Whole messages are the unit (a provider caches
blocks of tokens; the shared history of a conversation is whole messages).

Memory is bounded: the `MAX_SESSIONS` most recently used sessions are remembered.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict

from .answers import count_prompt_tokens

CACHE_READ_FACTOR = 0.25
MAX_SESSIONS = 100_000
MAX_SESSION_ID = 256  # OpenRouter's limit on a session_id's length


def session_of(body: dict, header: str | None) -> str | None:
    """The request's session: the body's `session_id`, else the `x-session-id` header."""
    sid = body.get("session_id")
    if isinstance(sid, str) and sid:
        return sid
    return header or None


def _message_digests(messages: list[dict]) -> list[bytes]:
    return [hashlib.blake2b(json.dumps(m, sort_keys=True, ensure_ascii=False).encode(),
                            digest_size=16).digest() for m in messages]


class Sessions:
    """What each session's last request on each endpoint left in that endpoint's cache."""

    def __init__(self, max_sessions: int = MAX_SESSIONS):
        self.max_sessions = max_sessions
        self._seen: OrderedDict[tuple[str, str], list[bytes]] = OrderedDict()

    @staticmethod
    def routing_key(session: str | None, raw: bytes) -> bytes:
        """What the load-balanced draw hashes: the session (sticky), else the body."""
        return b"session|" + session.encode() if session else raw

    def cached_tokens(self, session: str | None, endpoint_tag: str, messages: list[dict]) -> int:
        """The prompt tokens of MESSAGES this endpoint has cached for SESSION (the whole
        messages its last request there shared with these); remembers these messages."""
        if not session:
            return 0
        key = (session, endpoint_tag)
        digests = _message_digests(messages)
        before = self._seen.pop(key, None)
        self._seen[key] = digests
        while len(self._seen) > self.max_sessions:
            self._seen.popitem(last=False)
        if not before:
            return 0
        shared = 0
        for a, b in zip(before, digests[:-1], strict=False):  # the last message is new
            if a != b:
                break
            shared += 1
        return count_prompt_tokens(messages[:shared]) if shared else 0
