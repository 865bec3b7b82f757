"""Conversations asked turn by turn, each turn on the model's own earlier answers.

A prompt record with `follow_ups` (`kp-prompts --turns all`) is a conversation of
`1 + len(follow_ups)` user turns. kp-infer asks turn 1 with the record's `messages`; turn
k+1 is sent only once turn k's answer is kept, with the history

    the record's messages, then for each earlier turn j: its own answer as an assistant
    message, then follow_ups[j-1] as the next user turn

The source's own assistant answers never appear (kp-prompts dropped them). An earlier
turn's reasoning goes back into the history only under `--history-reasoning keep` (as
`reasoning` on the assistant message: K2.6's template preserves it); under `drop` (the
default for Kimi K2.5, whose template renders history turns as an empty
<think></think>) only its content does (`history_reasoning_default`, openrouter/models.py).

Each turn is one response record: id `<conversation>#<k>` (k from 1), the `records.Turn`
fields (`conversation`, `turn`, `turns`, `history_reasoning`), and `messages` exactly as
sent (`TurnWork.line`). A prompt without follow-ups is a single request as before: its
record keeps the prompt's id and has no Turn fields.

Resume is an ID diff (`scan_output`): the turns already in the output are each
conversation's history. A conversation is finished when its last turn is there, or when a
turn was cut by `max_tokens` (`finish_reason: length`: its answer is kept, its later
turns are never sent); a rerun sends the next turn of each unfinished one, built from its
last turn's record (its messages as sent, and its answer). Memory holds, per unfinished
conversation, that one record; finished ones are IDs. A failed turn is not in the output,
so a rerun sends it again and the conversation goes on.

Only the turns asked on the conversation as the input holds it now count: a turn record
is the conversation's if its messages as sent are the prompt's messages, then for each
earlier turn an answer and the prompt's next follow-up (recorded/asked.py
`answers_prompt`, the test kp-tokenize --prompts applies to choose the turns it trains
on). A conversation fixed under its ID (a typo corrected in its opening, or in its
follow-up k, and kp-prompts run again) is so asked again from its first turn whose
messages changed: turn 1 if the opening did, else turn k+1, on its turns 1..k, which
still match and are kept as its history. They are reused rather than asked again: they
are the model's own answers to the very messages the conversation sends now, under the
same recipe (`recipe_mismatch`), so asking them again would pay for an answer of the
same kind, and kp-tokenize --prompts trains on them by the same test. The old turns from
there on stay in the output (paid for, counted in the spend) and are never taken as any
conversation's history; their IDs recur in the output, each answered again beside them
(told apart by `generation_id`). The turns a conversation has are the input's now: one
given more follow-ups goes on after its last turn; one given fewer ends at its last turn
the input still asks.

A resume does not mix recipes (`recipe_mismatch`): every record says how it was asked for
(`model`, `sampling` with the reasoning object, and on a turn `history_reasoning`); a run
whose settings differ from what the output holds is refused (exit 2), naming the
difference, unless `--allow-mixed`. `max_tokens` may change (`RECIPE_SAMPLING`).
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter, deque
from dataclasses import dataclass, field

import msgspec
from msgspec import Raw, Struct

from ..contracts import SummaryConversations
from ..errors import ExitCode, InputError, KPError
from ..io import describe_decode_error, iter_lines
from ..openrouter.attempt import Attempt
from ..recorded.asked import PromptKey, answers_prompt
from ..records import (
    Message,
    Prompt,
    ResponseText,
    Sampling,
    Turn,
    Usage,
    decode_passthrough,
    encode_over,
)

HISTORY_POLICIES = ("drop", "keep")
TURN_SEPARATOR = "#"

_encode = msgspec.json.Encoder().encode


def turn_id(conversation: str, turn: int) -> str:
    return f"{conversation}{TURN_SEPARATOR}{turn}"


def turn_count(prompt: Prompt) -> int:
    return 1 + len(prompt.follow_ups)


def is_conversation(prompt: Prompt) -> bool:
    """A prompt asked turn by turn (its records are turns): one with follow-ups."""
    return bool(prompt.follow_ups)


def assistant_turn(answer: ResponseText, history_reasoning: str) -> Message:
    """An earlier turn's own answer as the history carries it."""
    keep = history_reasoning == "keep" and bool(answer.reasoning)
    return Message(role="assistant", content=answer.content,
                   reasoning=answer.reasoning if keep else None)


@dataclass
class TurnWork:
    """One turn to send: `prompt` is what the request is built from (its id the turn's,
    its messages the history), `line` what the record is written over (the conversation's
    prompt line with the turn's id, messages and Turn fields, without `follow_ups`)."""

    prompt: Prompt
    line: bytes
    source: Prompt  # the conversation's prompt record
    source_line: bytes
    turn: int
    history_reasoning: str

    @property
    def conversation(self) -> str:
        return self.source.id

    @property
    def turns(self) -> int:
        return turn_count(self.source)

    @property
    def last(self) -> bool:
        return self.turn >= self.turns

    def next_turn(self, answer: ResponseText) -> TurnWork | None:
        """The conversation's next turn on this turn's ANSWER; None after the last."""
        if self.last:
            return None
        messages = [*self.prompt.messages, assistant_turn(answer, self.history_reasoning),
                    Message(role="user", content=self.source.follow_ups[self.turn - 1])]
        return make_turn(self.source, self.source_line, self.turn + 1, messages,
                         self.history_reasoning)


def make_turn(source: Prompt, source_line: bytes, turn: int, messages: list[Message],
              history_reasoning: str) -> TurnWork:
    """Turn TURN of conversation SOURCE, asked with MESSAGES."""
    tid = turn_id(source.id, turn)
    fields = decode_passthrough(source_line)
    fields.pop("follow_ups", None)  # the conversation's; each turn's messages hold its own
    fields["id"] = Raw(_encode(tid))
    fields["messages"] = Raw(_encode(messages))
    line = encode_over(fields, Turn(conversation=source.id, turn=turn, turns=turn_count(source),
                                    history_reasoning=history_reasoning))
    prompt = Prompt(id=tid, dataset=source.dataset, messages=messages, meta=source.meta)
    return TurnWork(prompt, line, source, source_line, turn, history_reasoning)


def first_turn(source: Prompt, source_line: bytes, history_reasoning: str,
               resume: OpenConversation | None = None) -> TurnWork | None:
    """The next turn of conversation SOURCE to send: turn 1, or the one after RESUME's
    last turn in the output (its messages as sent, then its own answer); None when that
    was the last (the input now has fewer turns than the output's records said)."""
    if resume is None:
        return make_turn(source, source_line, 1, list(source.messages), history_reasoning)
    if resume.turn >= turn_count(source):
        return None
    messages = [*resume.messages, assistant_turn(resume.answer, history_reasoning),
                Message(role="user", content=source.follow_ups[resume.turn - 1])]
    return make_turn(source, source_line, resume.turn + 1, messages, history_reasoning)


# -- a run's conversations ------------------------------------------------------------
class ConversationQueue:
    """A run's conversations in progress (infer/run.py admits from it): each one's next
    turn, queued when the turn before it is kept and admitted ahead of the input's next
    prompt, so conversations finish and memory stays bounded by the work in flight. It
    counts its own turns (by number), the conversations finished and cut, and the turns
    left unsent; the summary and the progress line read them."""

    def __init__(self, history_reasoning: str, resume: OutputConversations | None):
        self.history_reasoning = history_reasoning
        self.resume = resume
        self.ready: deque[TurnWork] = deque()
        self.open: set[str] = set()  # a turn in flight or queued
        self.changed = asyncio.Event()  # a turn queued, or a conversation ended
        self.turns: Counter = Counter()  # turns answered this run, by number
        self.done = 0  # conversations whose last turn was answered this run
        self.cut = 0  # ended by a turn cut by max_tokens (later turns not sent)
        self.turns_not_sent = 0  # turns of conversations ended early (cut, failed, stopped)

    def start(self, source: Prompt, source_line: bytes) -> TurnWork | None:
        """Conversation SOURCE's first turn to send this run (after the turns the output
        holds); None when it has none left."""
        point = self.resume.resume_point(source.id) if self.resume else None
        if self.resume:
            self.resume.forget(source.id)  # its last record now lives in the turn only
        turn = first_turn(source, source_line, self.history_reasoning, point)
        if turn is not None:
            self.open.add(source.id)
        return turn

    def next_ready(self) -> TurnWork | None:
        return self.ready.popleft() if self.ready else None

    def ended(self, turn: TurnWork, kept: Attempt | None, stopping: bool) -> None:
        """TURN's work ended: its answer KEPT (written), or None (failed, or not sent again
        after a stop). Queue the conversation's next turn, or end it for this run."""
        nxt = None
        if kept is not None:
            self.turns[turn.turn] += 1
            if kept.finish_reason == "length":
                self.cut += 1  # kept and marked; its later turns never go
            elif turn.last:
                self.done += 1
            elif not stopping:
                nxt = turn.next_turn(ResponseText(content=kept.content, reasoning=kept.reasoning))
        if nxt is not None:
            self.ready.append(nxt)
        else:
            self.open.discard(turn.conversation)
            if not turn.last and (kept is None or kept.finish_reason == "length" or stopping):
                self.turns_not_sent += turn.turns - turn.turn
        self.changed.set()

    def summary(self) -> SummaryConversations | None:
        """The summary's `conversations` (None: the run sent no turn of one)."""
        if not self.turns and not self.turns_not_sent:
            return None
        return SummaryConversations(
            turns_by_number={str(k): n for k, n in sorted(self.turns.items())},
            done=self.done, cut=self.cut, turns_not_sent=self.turns_not_sent)


# -- resume ---------------------------------------------------------------------------
class _RecordHead(Struct):
    """What the resume scan reads of every response record (msgspec skips the rest)."""

    id: str
    model: str | None = None
    sampling: Sampling | None = None
    finish_reason: str | None = None
    conversation: str | None = None
    turn: int | None = None
    turns: int | None = None
    history_reasoning: str | None = None
    usage: Usage | None = None


class _TurnBody(Struct):
    """What the next turn is built from: the last turn's messages as sent, its answer."""

    messages: list[Message]
    response: ResponseText


class _AskedMessage(Struct):
    role: str
    content: str


class _TurnAsked(Struct):
    """What tells whose turn a record is: the messages it was asked with (role, content)."""

    messages: list[_AskedMessage]


_head_decoder = msgspec.json.Decoder(_RecordHead)
_body_decoder = msgspec.json.Decoder(_TurnBody)
_asked_decoder = msgspec.json.Decoder(_TurnAsked)


@dataclass
class OpenConversation:
    """An unfinished conversation's last turn in the output."""

    turn: int
    messages: list[Message]
    answer: ResponseText


@dataclass(frozen=True)
class Recipe:
    """How a record was asked for: the settings that change its content (`sampling` as
    its JSON, so that a Recipe can be counted)."""

    model: str | None
    sampling_json: bytes | None
    history_reasoning: str | None

    @classmethod
    def of(cls, model: str | None, sampling: Sampling | None, history: str | None) -> Recipe:
        return cls(model, None if sampling is None else _encode(sampling), history)

    @property
    def sampling(self) -> Sampling | None:
        return None if self.sampling_json is None else _sampling_decoder.decode(self.sampling_json)


_sampling_decoder = msgspec.json.Decoder(Sampling)


@dataclass
class OutputConversations:
    """The conversations an output holds (`scan_output`)."""

    finished: set[str]  # conversation ids: every turn there, or one cut by max_tokens
    cut: int  # of them, cut by max_tokens
    open: dict[str, OpenConversation]  # unfinished: the last turn there
    turns: int  # turn records read
    recipes: Counter  # Recipe -> records
    answers: int = 0  # records read (turns or not), and their tokens: what --plan measures
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    # the input's conversations with turns there asked on another version of them (fixed
    # under the same id): those turns are no conversation's history
    replaced: set[str] = field(default_factory=set)

    def asked_again(self) -> dict[str, int]:
        """The conversations fixed under their IDs that are not finished as they are now,
        each with the turn they are asked again from (the first whose messages changed)."""
        return {c: (self.open[c].turn + 1 if c in self.open else 1)
                for c in sorted(self.replaced) if c not in self.finished}

    def mean_history_answer(self, history_reasoning: str) -> float | None:
        """The tokens an earlier answer adds to a later turn's prompt, as measured: its
        content (drop), or all of it (keep); None before any answer."""
        if not self.answers:
            return None
        kept = self.completion_tokens - (self.reasoning_tokens if history_reasoning == "drop" else 0)
        return kept / self.answers

    def resume_point(self, conversation: str) -> OpenConversation | None:
        return self.open.get(conversation)

    def forget(self, conversation: str) -> None:
        """The run took the conversation's last turn in: its record is no longer needed."""
        self.open.pop(conversation, None)


def _decode(decoder, line: bytes, path: str, lineno: int):
    try:
        return decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise InputError(describe_decode_error(e, True), path, lineno) from None


def scan_output(path: str, current: dict[str, PromptKey] | None = None) -> OutputConversations:
    """Group OUTPUT's turn records by conversation, in two passes: the first reads each
    record's head (id, recipe, conversation, turn) and keeps, per unfinished
    conversation, the line number of its last turn; the second decodes only those lines.
    A last line without its newline (being written by another process, as `--plan`
    reads it) is left alone.

    CURRENT: the input's conversations (their PromptKeys): a turn of one of them counts
    only if it was asked on it as it is now (`answers_prompt`: else it is an old
    version's, in `replaced`, and no history), and the conversation's turns are its
    current ones. Conversations the input does not hold count as their records say."""
    found = OutputConversations(set(), 0, {}, 0, Counter())
    if path == "-" or not os.path.exists(path):
        return found
    current = current or {}
    last: dict[str, tuple[int, int]] = {}  # conversation -> (its last turn there, line number)
    for lineno, line, ended in iter_lines(path):
        if not ended:
            break
        head = _decode(_head_decoder, line, path, lineno)
        found.recipes[Recipe.of(head.model, head.sampling, head.history_reasoning)] += 1
        if head.usage is not None:
            found.answers += 1
            found.completion_tokens += head.usage.completion_tokens
            found.reasoning_tokens += head.usage.reasoning_tokens
        conv = head.conversation
        if conv is None or head.turn is None:
            continue
        found.turns += 1
        turns = head.turns
        if (key := current.get(conv)) is not None:
            if not answers_prompt(key, _decode(_asked_decoder, line, path, lineno).messages):
                found.replaced.add(conv)  # asked on an earlier version of it: kept, not history
                continue
            turns = key.turns
        if conv in found.finished:
            continue
        if head.finish_reason == "length" or (turns is not None and head.turn >= turns):
            found.finished.add(conv)
            found.cut += head.finish_reason == "length"
            last.pop(conv, None)
            continue
        if conv not in last or last[conv][0] < head.turn:
            last[conv] = (head.turn, lineno)
    wanted = {lineno: conv for conv, (_turn, lineno) in last.items()}
    if wanted:
        for lineno, line, _ended in iter_lines(path):
            conv = wanted.get(lineno)
            if conv is not None:
                body = _decode(_body_decoder, line, path, lineno)
                found.open[conv] = OpenConversation(last[conv][0], body.messages, body.response)
    return found


# -- recipes --------------------------------------------------------------------------
# The sampling fields a resume must not change: how tokens are drawn, and the reasoning
# asked for. `max_tokens` is not among them: it decides only where an answer may be cut,
# which each record says (`finish_reason`), and lowering it is how a run is fitted to the
# money left ("lower --max-tokens and rerun to resume").
RECIPE_SAMPLING = tuple(n for n in Sampling.__struct_fields__ if n != "max_tokens")
def _same_model(asked: str, recorded: str | None) -> bool:
    """A record's `model` is the one that answered: the slug asked for, or a dated
    version of it (`moonshotai/kimi-k2.5-0127`)."""
    if recorded is None:
        return True
    a, r = asked.lower(), recorded.lower()
    return r == a or r.startswith((a + "-", a + ":"))


def _sampling_difference(recorded: Sampling, asked: Sampling | None) -> str | None:
    if asked is None:
        return "sampling"
    return next((n for n in RECIPE_SAMPLING if getattr(recorded, n) != getattr(asked, n)), None)


def recipe_mismatch(recipes: Counter, model: str, sampling: Sampling, history_reasoning: str,
                    output: str, server_sampling: Sampling | None = None) -> str | None:
    """Why this run's settings differ from what OUTPUT's records were asked with (the
    first difference, with how many records hold it), or None when they agree. A record
    that does not say a setting (older records: no sampling; a single-turn record: no
    history policy) does not disagree on it. SERVER_SAMPLING: how this run asks its
    --server (infer/servers.py), which a server's record agrees with instead."""
    for recipe, count in recipes.items():
        what = None
        if not _same_model(model, recipe.model):
            what = ("model", recipe.model, model)
        elif recipe.sampling is not None and (
                name := _sampling_difference(recipe.sampling, sampling)) and _sampling_difference(
                recipe.sampling, server_sampling):
            what = (f"sampling.{name}", _encode(getattr(recipe.sampling, name)).decode(),
                    _encode(getattr(sampling, name)).decode())
        elif recipe.history_reasoning is not None and recipe.history_reasoning != history_reasoning:
            what = ("history_reasoning", recipe.history_reasoning, history_reasoning)
        if what is not None:
            name, held, asked = what
            return (f"{output}: {count:,} record(s) were asked with {name} {held}, and this run "
                    f"asks with {asked}; a resume would mix two recipes in one output (and in "
                    "one conversation). Rerun with the settings the file was made with, write "
                    "to another -o, or pass --allow-mixed")
    return None


def check_recipe(recipes: Counter, model: str, sampling: Sampling, history_reasoning: str,
                 output: str, allow_mixed: bool, say, server_sampling: Sampling | None = None
                 ) -> None:
    """Refuse (exit 2) a resume that would mix recipes; with ALLOW_MIXED, warn."""
    why = recipe_mismatch(recipes, model, sampling, history_reasoning, output, server_sampling)
    if why is None:
        return
    if not allow_mixed:
        raise KPError(why, ExitCode.USAGE)
    say(f"kp-infer: warning: {why.split('; a resume')[0]}; mixed, as --allow-mixed asks")
