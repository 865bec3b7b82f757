"""OpenAssistant message trees (its exports' `*_message.jsonl` / `*_tree.jsonl`): a message
`{"message_id", "text", "role": "prompter"|"assistant", "rank"?, "deleted"?,
"review_result"?, "replies": [message, ...]}`, or a tree `{"message_tree_id", "prompt":
message}` around its root.

A tree holds alternative answers to each message, and prompter replies written to each
answer. One conversation is read: the thread that follows, from the root, the best reply
at each step (the lowest `rank`; unranked replies after ranked ones; the first among
equals), leaving out replies that are `deleted` or failed review (`review_result: false`).
The other branches are alternatives, not read. The id is the root's `message_id` (the
tree's `message_tree_id`)."""

from __future__ import annotations

from ..conversation import Conversation, FormatError, SourceTurn, json_type, text_of

# How docs/kp-prompts.md and README.md name and describe it (`make docs` writes them).
LABEL = 'OpenAssistant trees'
RECORD = 'OpenAssistant: `{"message_id", "text", "role", "replies": [...]}`, or a tree `{"message_tree_id", "prompt": message}`'
NOTES = (
    'one thread: from the root, the best reply at each step (lowest `rank`, unranked '
    'after ranked, the first among equals; `deleted` replies and those with '
    '`review_result: false` left out). Other branches are alternative answers and the '
    "replies to them: not read. The id is the root's `message_id`"
)
DETECT = ("replies", "message_tree_id")
ID_FIELD = ("message_id", "message_tree_id")
ROLES = {"prompter": "user", "assistant": "assistant"}


def conversation(obj: dict) -> Conversation:
    message, where = (obj.get("prompt"), "$.prompt") if "message_tree_id" in obj else (obj, "$")
    turns = []
    while message is not None:
        if not isinstance(message, dict):
            raise FormatError(f"expected a message object, got {json_type(message)}", where)
        role = message.get("role")
        if role not in ROLES:
            raise FormatError(f"unknown role {role!r} (accepted: {', '.join(ROLES)})", f"{where}.role")
        turns.append(SourceTurn(ROLES[role], text_of(message.get("text"), f"{where}.text"), None, where))
        replies = message.get("replies") or []
        if not isinstance(replies, list):
            raise FormatError(f"expected an array, got {json_type(replies)}", f"{where}.replies")
        best = _best(replies)
        message, where = (None, where) if best is None else (replies[best], f"{where}.replies[{best}]")
    return Conversation(turns)


def _best(replies: list) -> int | None:
    """The index of the reply the thread follows (see the module docstring), or None."""
    kept = [i for i, r in enumerate(replies)
            if not (isinstance(r, dict) and (r.get("deleted") is True or r.get("review_result") is False))]
    ranked = [i for i in kept if isinstance(replies[i], dict) and isinstance(replies[i].get("rank"), int)]
    if ranked:
        return min(ranked, key=lambda i: replies[i]["rank"])
    return kept[0] if kept else None
