"""`--turns`: which prompts a conversation gives.

- `all` (the default): one prompt per conversation. Its `messages` are the system turn (if
  any) and the first user turn; its `follow_ups` the later user turns' texts, in order, each
  to be asked after the model's own answer to the one before. The source's answers are
  dropped. The conversation ends before its first turn that is not plain text (a tool turn,
  a non-text part of a system or user turn, a later system turn); a tool declaration is
  left out (the turns before the first tool call were plain chat): the record's `tools`,
  and a system prompt that declares tools (it is there to declare them).
- `last`: the conversation up to its last user turn, the source's answers as its history.
- `each`: one prompt per user turn (`#k` after the id), each with the source's history.
  With `last` and `each` the history is sent as the source wrote it, so a record with
  anything that is not plain text is skipped whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .conversation import Blocker, Conversation, FormatError

TURNS = ("all", "last", "each")


@dataclass
class Pick:
    """One prompt a conversation gives: its user-turn number, messages and follow-ups."""

    k: int
    messages: list[dict]
    follow_ups: list[str] = field(default_factory=list)


@dataclass
class Picked:
    picks: list[Pick]
    skipped: tuple[Blocker, str] | None = None  # the record gives nothing: why, and where
    cut: tuple[Blocker, str] | None = None  # `all`: the conversation ends before this
    tools_left_out: bool = False  # `all`: its tool declaration is not sent


def pick_turns(conv: Conversation, turns: str) -> Picked:
    if turns == "all":
        return _all(conv)
    blocker = conv.first_blocker()
    if blocker:
        return Picked([], skipped=blocker)
    messages = [{"role": t.role, "content": t.content} for t in conv.turns]
    user_positions = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if len(user_positions) > 1 and not conv.has_answers:
        raise FormatError(f"no answers to build a later turn's history from: read these with "
                          f"--turns all, not --turns {turns}", conv.turns[user_positions[1]].where)
    chosen = user_positions if turns == "each" else user_positions[-1:]
    return Picked([Pick(user_positions.index(i) + 1, messages[: i + 1]) for i in chosen])


def _all(conv: Conversation) -> Picked:
    tools_left_out = False
    if conv.record_blocker:
        if conv.record_blocker[0] is not Blocker.TOOL_DECLARATION:
            return Picked([], skipped=conv.record_blocker)
        tools_left_out = True
    head: list[dict] = []  # the system turns before the first user turn
    first: dict | None = None
    follow_ups: list[str] = []
    cut = None
    for turn in conv.turns:
        blocker = turn.blocker
        if blocker is Blocker.NON_TEXT and turn.role == "assistant":
            continue  # the source's answers are dropped, whatever they hold
        if blocker is Blocker.TOOL_DECLARATION and first is None:
            tools_left_out = True  # a system prompt declaring tools, before the chat began
            continue
        if blocker is None and turn.role == "system" and first is not None:
            blocker = Blocker.LATER_SYSTEM
        if blocker:
            cut = (blocker, turn.where)
            break
        if turn.role == "system":
            head.append({"role": "system", "content": turn.content})
        elif turn.role == "user":
            if first is None:
                first = {"role": "user", "content": turn.content}
            else:
                follow_ups.append(turn.content)
    if first is None:
        return Picked([], skipped=cut)
    return Picked([Pick(1, [*head, first], follow_ups)], cut=cut, tools_left_out=tools_left_out)
