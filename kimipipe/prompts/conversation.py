"""What every source format gives: a Conversation, its turns in chat order, each plain text
or marked with what keeps it from being regenerated (a Blocker), and the error a bad record
raises (FormatError, with the JSON path inside the record: `$.conversations[2].from`).

kimipipe regenerates plain chat: a system prompt, user turns, assistant answers, all text.
What it cannot send as such is marked here, not refused, so that kp-prompts can skip the
record (or, with `--turns all`, end the conversation before that turn) and say so:
- a tool turn: a tool result (roles `tool`, `function`, `observation`, `ipython`), a call
  (ShareGPT `function_call`, an assistant turn with `tool_calls` or `function_call`, a
  `tool_call` part), whatever its content (an OpenAI call has `content: null` or "");
- a tool declaration: the record's `tools` (or `functions`), which every turn was asked with,
  and a system prompt that lists tools in `<tools>` XML (Hermes function calling, Qwen's
  template): sent, it would have the model answer with a tool call written as text;
- a non-text part: an image, audio or any content part other than text, and the
  `<image>`/`<video>`/`<audio>` placeholders of a record with media, in the plural fields
  (`images`/`videos`/`audios`, LLaMA-Factory's multimodal rows) or the singular ones
  (`image`/`video`/`audio`, LLaVA's and SpecForge's), which would otherwise be sent as
  literal text: a record whose media no turn places is blocked whole.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class FormatError(Exception):
    def __init__(self, message: str, json_path: str = "$"):
        super().__init__(message)
        self.message = message
        self.json_path = json_path


class Blocker(enum.Enum):
    """Why a turn (or a whole record) cannot be regenerated as plain chat."""

    TOOL_TURN = "a tool turn"
    TOOL_DECLARATION = "a tool declaration"
    NON_TEXT = "a non-text part"
    LATER_SYSTEM = "a system turn after the first user turn"


@dataclass(slots=True)
class SourceTurn:
    role: str  # system | user | assistant (a tool result: "tool", always blocked)
    content: str  # "" where blocked
    blocker: Blocker | None = None
    where: str = "$"  # the JSON path of what blocks the turn, or of the turn


@dataclass
class Conversation:
    turns: list[SourceTurn]
    # What blocks the record as a whole (a tool declaration, media without placeholders).
    record_blocker: tuple[Blocker, str] | None = None
    # False where the source holds user turns only (MT-Bench questions): a later turn then
    # has no history but the model's own answers.
    has_answers: bool = True

    def first_blocker(self) -> tuple[Blocker, str] | None:
        if self.record_blocker:
            return self.record_blocker
        return next(((t.blocker, t.where) for t in self.turns if t.blocker), None)


def json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
            int: "number", float: "number"}.get(type(value), type(value).__name__)


# Role names as sources spell them (lower-cased), and the chat role each one is.
ROLE_NAMES = {
    "system": "system", "developer": "system",
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bard": "assistant",
    "bing": "assistant", "model": "assistant",
}
# Tool turns: read, never regenerated (see the module docstring).
TOOL_ROLES = {"function_call": "assistant", "observation": "tool", "tool": "tool",
              "function": "tool", "ipython": "tool"}
ACCEPTED_ROLES = ", ".join([*ROLE_NAMES, *TOOL_ROLES])

TOOL_PARTS = {"tool_call", "function_call", "tool_use", "tool_result"}
# The placeholder each media field's items stand at: LLaMA-Factory's plural fields, and the
# singular ones of LLaVA (`"image": "x.jpg"` with `<image>` in the human turn) and
# SpecForge (`"image"` with no placeholder at all).
MEDIA_PLACEHOLDERS = {"images": "<image>", "videos": "<video>", "audios": "<audio>",
                      "image": "<image>", "video": "<video>", "audio": "<audio>"}
_MEDIA_KEYS = frozenset(MEDIA_PLACEHOLDERS)


@dataclass
class RecordContext:
    """What a record says about all its turns: the media placeholders it holds."""

    placeholders: tuple[str, ...] = ()
    placeholder_seen: bool = False


_NO_MEDIA = RecordContext()


def record_context(obj: dict) -> RecordContext:
    if _MEDIA_KEYS.isdisjoint(obj):
        return _NO_MEDIA  # never written to: placeholder_seen is set only where there are placeholders
    marks = {mark for key, mark in MEDIA_PLACEHOLDERS.items() if _declared(obj.get(key))}
    return RecordContext(tuple(sorted(marks)))


def record_blocker(obj: dict, context: RecordContext) -> tuple[Blocker, str] | None:
    """What blocks OBJ as a whole, once its turns are read: a tool declaration, or media
    that no turn places (nothing to cut before)."""
    for key in ("tools", "functions"):
        if key in obj and _declared(obj[key]):
            return Blocker.TOOL_DECLARATION, f"$.{key}"
    if context.placeholders and not context.placeholder_seen:
        key = next(k for k in MEDIA_PLACEHOLDERS if _declared(obj.get(k)))
        return Blocker.NON_TEXT, f"$.{key}"
    return None


def system_turn(text: str, where: str) -> SourceTurn:
    """A system prompt: a tool declaration where it lists tools in `<tools>` XML."""
    if "<tools>" in text and "</tools>" in text:
        return SourceTurn("system", "", Blocker.TOOL_DECLARATION, where)
    return SourceTurn("system", text, None, where)


def _declared(value: Any) -> bool:
    """A non-empty declaration: LLaMA-Factory writes no tools as "" or "[]"."""
    if value is None:
        return False
    if isinstance(value, str):
        return value.strip() not in ("", "[]", "{}", "null")
    return bool(value)


def text_of(value: Any, where: str) -> str:
    """A field that must be text: a string, or content parts that are all text."""
    text, blocker = content_of(value, where, RecordContext())
    if blocker:
        raise FormatError("only text content parts are supported", blocker[1])
    return text


def content_of(value: Any, where: str, context: RecordContext) -> tuple[str, tuple[Blocker, str] | None]:
    """A turn's text, or what keeps it from being text. Text parts are OpenAI's
    `{"type": "text", "text": ...}` and LLaMA-Factory v1's `{"type": "text", "value": ...}`."""
    if isinstance(value, str):
        for mark in context.placeholders:
            if mark in value:
                context.placeholder_seen = True
                return "", (Blocker.NON_TEXT, where)
        return value, None
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            text = part.get("text", part.get("value")) if kind == "text" else None
            if isinstance(text, str):
                inner, blocker = content_of(text, f"{where}[{i}]", context)
                if blocker:
                    return "", blocker
                texts.append(inner)
            elif kind in TOOL_PARTS:
                return "", (Blocker.TOOL_TURN, f"{where}[{i}]")
            elif isinstance(part, dict) and isinstance(kind, str) and kind != "text":
                return "", (Blocker.NON_TEXT, f"{where}[{i}]")
            else:
                raise FormatError('expected a content part such as {"type": "text", "text": str}', f"{where}[{i}]")
        return "".join(texts), None
    raise FormatError(f"expected a string, got {json_type(value)}", where)


def turns_of(obj: dict, key: str, role_key_pairs: tuple[tuple[str, str], ...]) -> Conversation:
    """OBJ[KEY] as a Conversation: a list of turns, each naming its role and content under
    one of ROLE_KEY_PAIRS (`from`/`value` for ShareGPT, `role`/`content` for OpenAI)."""
    turns = obj.get(key)
    if not isinstance(turns, list):
        raise FormatError(f"expected an array, got {json_type(turns)}", f"$.{key}")
    context = record_context(obj)
    out = []
    for i, turn in enumerate(turns):
        # JSON paths are made only where one can be shown (an error, a blocked turn, a
        # system turn, which can end a conversation): most turns are plain text.
        if not isinstance(turn, dict):
            raise FormatError(f"expected an object, got {json_type(turn)}", f"$.{key}[{i}]")
        for role_key, content_key in role_key_pairs:  # noqa: B007 (used after the loop)
            if role_key in turn:
                break
        else:
            names = " or ".join(f"`{r}`" for r, _ in role_key_pairs)
            raise FormatError(f"turn has no {names} field", f"$.{key}[{i}]")
        role = turn[role_key]
        name = role.lower() if isinstance(role, str) else None
        if name in TOOL_ROLES:
            out.append(SourceTurn(TOOL_ROLES[name], "", Blocker.TOOL_TURN, f"$.{key}[{i}].{role_key}"))
            continue
        if name not in ROLE_NAMES:
            raise FormatError(f"unknown role {role!r} (accepted: {ACCEPTED_ROLES})",
                              f"$.{key}[{i}].{role_key}")
        mapped = ROLE_NAMES[name]
        if len(turn) > 2:  # a plain turn has a role and a content only
            calls = ("tool_calls" if _declared(turn.get("tool_calls"))
                     else "function_call" if _declared(turn.get("function_call")) else None)
            if calls:
                out.append(SourceTurn(mapped, "", Blocker.TOOL_TURN, f"$.{key}[{i}].{calls}"))
                continue
        if content_key not in turn:
            raise FormatError(f"turn has no `{content_key}` field", f"$.{key}[{i}]")
        content = turn[content_key]
        if isinstance(content, str) and not context.placeholders:  # plain text, the usual case
            out.append(system_turn(content, f"$.{key}[{i}].{content_key}") if mapped == "system"
                       else SourceTurn(mapped, content, None, ""))
            continue
        text, blocker = content_of(content, f"$.{key}[{i}].{content_key}", context)
        if blocker:
            out.append(SourceTurn(mapped, "", *blocker))
        elif mapped == "system":
            out.append(system_turn(text, f"$.{key}[{i}].{content_key}"))
        else:
            out.append(SourceTurn(mapped, text, None, f"$.{key}[{i}]"))
    return Conversation(out, record_blocker(obj, context))


def plain(role: str, content: str, where: str = "$") -> SourceTurn:
    return SourceTurn(role, content, None, where)

