"""Previous work: what earlier runs on the same output left, read before anything is sent.

- Answers an earlier run paid for but could not write are taken in from the rescue file
  first (infer/rescue.py `take_in_rescued`).
- The IDs already in OUTPUT (after cutting a torn last line a crash left) and in `--done`
  files are skipped; the spend and completion tokens recorded in OUTPUT (and the cost of
  paid failures in `--failures`) count against the budgets (`previous_work`). A record
  another API answered (its `api`, the base URL's host, is not this run's) refuses the
  run, exit 2, naming both (recorded/api.py): offline answers never pass for real ones.
- The conversations' turns OUTPUT holds (infer/conversations.py): they were asked under
  this run's recipe, and no conversation of the input is answered there as a single
  prompt (`check_no_single_answers`). Only the turns asked on a conversation as the input
  holds it now are its history (`scan_output` with the input's conversations).
- Answers OUTPUT holds to prompts the input does not (a changed source's) are kept, as
  paid work, and said (`note_answers_to_other_prompts`): kp-tokenize --prompts leaves them
  out of the training data.
- A single prompt fixed under its old ID (its messages are not those its answers in OUTPUT
  were asked with: recorded/asked.py) is not done: it is asked again, its new answer
  written beside the old one, which stays, paid for and counted in the spend, and is left
  out of the training data by kp-tokenize --prompts (`changed_prompts`). A conversation
  fixed under its ID (its opening or a follow-up) is asked again from its first turn whose
  messages changed, on its earlier turns, which still match (infer/conversations.py); its
  old turns from there on stay, paid for and counted in the spend, and kp-tokenize
  --prompts leaves them out (`note_conversations_asked_again`).
- The providers an earlier run quarantined for identity stay ignored
  (`take_in_quarantine`).

`--plan` may run beside a build writing OUTPUT: it neither repairs nor takes anything in.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from ..contracts import IdentityState
from ..errors import ExitCode, InputError, KPError
from ..io import finished_records, iter_finished, repair_and_report, scan_done
from ..recorded.api import other_api
from ..recorded.asked import prompt_digest
from ..recorded.identity_table import read_state, state_path
from ..recorded.spend import SPENT_DECODER
from ..records import CostOnly, Message
from .config import Files, RunConfig
from .conversations import OutputConversations, check_recipe, scan_output
from .inputs import InputScan
from .rescue import take_in_rescued
from .servers import server_sampling


class Answered(CostOnly):
    """What resume reads of a finished response record: its cost, and who answered."""

    api: str | None = None
    generation_id: str | None = None


_answered_decoder = msgspec.json.Decoder(Answered)


@dataclass
class PreviousWork:
    """What the run starts from, of what earlier runs left."""

    done: set[str]  # IDs answered (OUTPUT, its finished conversations, the --done files)
    spent: float  # USD recorded in OUTPUT and --failures
    tokens: int  # completion tokens recorded in OUTPUT
    taken_in: int  # answers taken in from the rescue file
    conversations: OutputConversations  # the turns OUTPUT holds


def read_previous_work(config: RunConfig, scan: InputScan, say: Callable[[str], None]
                       ) -> PreviousWork:
    """Everything above, in that order (see the module docstring)."""
    taken_in = 0 if config.plan else take_in_rescued(config.files, say)
    done, spent, tokens = previous_work(config.files.output, config.files.failures, say, repair=not config.plan,
                                        api=config.sending.apis)
    conversations = scan_output(config.files.output, scan.conversations)
    check_recipe(conversations.recipes, config.request.model,
                 config.request.sampling(config.policy), config.history_reasoning,
                 config.files.output, config.files.allow_mixed, say,
                 server_sampling(config.request.fields(config.policy)) if config.sending.servers else None)
    check_no_single_answers(scan, done, conversations, config.files, say)
    note_answers_to_other_prompts(scan, done, config.files, say)
    done -= changed_prompts(scan, done, config.files, say)
    note_conversations_asked_again(scan, conversations, config.files, say)
    done |= conversations.finished  # a finished conversation is done as a whole
    for extra in config.files.done_files:
        if not os.path.exists(extra):
            raise InputError("no such file", extra)
        done |= scan_done(extra, repair=False)
    return PreviousWork(done, spent, tokens, taken_in, conversations)


def previous_work(output: str, failures: str | None, say: Callable[[str], None],
                  repair: bool = True, api: str | set[str] | None = None
                  ) -> tuple[set[str], float, int]:
    """(IDs done, USD, completion tokens) recorded by earlier runs, in one pass over OUTPUT
    (after repairing a torn last line; without REPAIR, as --plan reads it, a torn last line
    is left alone) plus the failures file's costs. A record another API than API answered
    refuses the resume (recorded/api.py); API may be a set (a run with --server: every host
    it writes answers of)."""
    apis = {api} if isinstance(api, str) else api
    shown = None if apis is None else ", ".join(sorted(apis))
    if repair:
        repair_and_report(output, report=say)
    done: set[str] = set()
    cost = 0.0
    tokens = 0
    for rec in (iter_finished if repair else finished_records)(output, _answered_decoder):
        if apis is not None and rec.api is not None and rec.api not in apis:
            raise other_api(output, rec.api, rec.generation_id, rec.id, shown)
        done.add(rec.id)
        cost += rec.paid  # its own cost, and that of the answers refused before it
        tokens += rec.usage.completion_tokens
    if failures and os.path.exists(failures):
        for rec in (iter_finished if repair else finished_records)(failures, SPENT_DECODER):
            if apis is not None and rec.api is not None and rec.api not in apis:
                raise other_api(failures, rec.api, rec.generation_id, rec.id, shown)
            cost += rec.paid
    return done, cost, tokens


def check_no_single_answers(scan: InputScan, done: set[str], conversations: OutputConversations,
                            files: Files, say: Callable[[str], None]) -> None:
    """A conversation of the input (a prompt with follow-ups) that OUTPUT answers as one
    plain record (written under `kp-prompts --turns last` or `each`: one answer, on the
    source's own history) would be skipped as done, and its single off-policy answer kept
    for good: a mixed recipe, a drafter trained on turns the model never answered.
    Refused (exit 2), unless --allow-mixed."""
    single = sorted(i for i in scan.turns if i in done and i not in conversations.finished)
    if not single:
        return
    where = "" if files.output == "-" else f"{files.output}: "
    told = (f"{where}{len(single):,} conversation(s) of {scan.shown} (first: {single[0]!r}) are "
            "answered there as single prompts (kp-prompts --turns last/each: one answer on the "
            "source's history), and would be skipped as done")
    if not files.allow_mixed:
        raise KPError(f"{told}; write the turns to a new output (make: `make D.clean`, or "
                      "another WORK), or --allow-mixed to keep those single answers",
                      ExitCode.USAGE)
    say(f"kp-infer: warning: {told}; kept (--allow-mixed)")


def note_answers_to_other_prompts(scan: InputScan, done: set[str], files: Files,
                                  say: Callable[[str], None]) -> None:
    """Answers in OUTPUT to prompts the input no longer holds (a source changed or replaced
    under the same output): kept, as they were paid for, and said, with how to keep them
    out of the training data (kp-tokenize --prompts, which make passes)."""
    other = sorted(i for i in done if i not in scan.ids and i.rsplit("#", 1)[0] not in scan.ids)
    if not other or files.output == "-":
        return
    say(f"kp-infer: {files.output} holds {len(other):,} answer(s) to prompts {scan.shown} does "
        f"not hold (first: {other[0]!r}; an earlier source's?): kept there and counted in the "
        f"spend, not sent again; `kp-tokenize --prompts {scan.shown}` leaves them out of the "
        "training data (make does)")


class _Asked(msgspec.Struct):
    """What `changed_prompts` reads of a response record: what it was asked with."""

    id: str
    messages: list[Message]
    conversation: str | None = None


_asked_decoder = msgspec.json.Decoder(_Asked)


def changed_prompts(scan: InputScan, done: set[str], files: Files,
                    say: Callable[[str], None]) -> set[str]:
    """The single prompts of the input that OUTPUT answers only as they were asked before
    (a source fixed under the same IDs): to be asked again; said, with what stays. (A
    conversation's turns: `scan_output`, `note_conversations_asked_again`.)"""
    if files.output == "-" or not done or not scan.asked or not os.path.exists(files.output):
        return set()  # (no single prompt: conversations only)
    matched: set[str] = set()
    seen: set[str] = set()
    for rec in finished_records(files.output, _asked_decoder):
        if rec.conversation is not None:
            continue
        digest = scan.asked.get(rec.id)
        if digest is None:  # (not a single prompt of the input; a conversation answered as
            continue        # a single prompt is check_no_single_answers' case)
        seen.add(rec.id)
        if prompt_digest(rec.messages) == digest:
            matched.add(rec.id)
    changed = sorted(seen - matched)
    if changed:
        say(f"kp-infer: {files.output} answers {len(changed):,} prompt(s) of {scan.shown} as they "
            f"were asked before (first: {changed[0]!r}; fixed under the same id?): asked again; "
            "the old answers stay there, paid for and counted in the spend, and `kp-tokenize "
            f"--prompts {scan.shown}` leaves them out of the training data (make does)")
    return set(changed)


def note_conversations_asked_again(scan: InputScan, conversations: OutputConversations,
                                   files: Files, say: Callable[[str], None]) -> None:
    """Say the conversations of the input whose turns in OUTPUT were asked on another
    version of them (fixed under the same ID) and which are asked again (from the turn
    that changed: infer/conversations.py), with what stays."""
    again = conversations.asked_again()
    if not again or files.output == "-":
        return
    first, turn = next(iter(again.items()))
    say(f"kp-infer: {files.output} holds turns of {len(again):,} conversation(s) of {scan.shown} "
        f"asked with other messages (first: {first!r}, asked again from turn {turn}; fixed "
        "under the same id?): each is asked again from its first turn whose messages changed, "
        "on its earlier turns, which still match; the old turns stay there, paid for and "
        f"counted in the spend, and `kp-tokenize --prompts {scan.shown}` leaves them out of "
        "the training data (make does)")


def take_in_quarantine(config: RunConfig, say: Callable[[str], None]) -> IdentityState:
    """The providers an earlier run on OUTPUT quarantined for identity (infer/identity.py):
    in provider.ignore again (Policy.quarantine), with or without --tokenizer, and said."""
    path = state_path(config.files.output)
    state = read_state(path)
    for q in state.quarantined:
        config.policy.quarantine.extend(s for s in q.slugs if s not in config.policy.quarantine)
        if not config.plan:  # (the plan's table names them)
            say(f"kp-infer: {q.provider} stays quarantined ({path}: quarantined {q.at}, its "
                f"prompt counts typically {'unknown' if q.offset is None else f'{q.offset:+d}'} "
                "from the target's): in provider.ignore; remove that file to lift it")
    return state
