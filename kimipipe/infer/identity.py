"""Whether an answer is the target model's: its own token counts against the target's.

A drafter learns the target model, and an answer from anything else poisons the data while
looking normal (HTTP 200, plausible text, a normal bill): a host that redirects the
model's calls to another model (DeepInfra announced it would send Kimi K2.5's to Kimi
K3), one that adds a system prompt of its own, another template or tokenizer. Every answer
already carries the evidence: `usage.prompt_tokens` is counted by the serving stack, with
the serving model's tokenizer, over the prompt as it rendered it. With `--tokenizer DIR`
kp-infer counts each request's prompt as the target's chat template renders it
(tokenize/counting.py: kp-tokenize's own loading, template and encoding; a conversation's
turn k with its whole history, as infer/conversations.py builds it), once per prompt, and
checks every answer as it is accepted (infer/acceptance.py, after routing and reasoning):

    offset = usage.prompt_tokens - kimipipe's count

Which offsets are the target's and which refuse an answer (the model owner's band, the
constant the providers share, the rules that refuse): infer/identity_votes.py, the
arithmetic this judge books, waits and quarantines on.

Until a first answer is found the target's, a run keeps at most PROBATION requests in
flight (`probation`): a host that serves another model from the start (the only one left,
redirecting) costs those answers, not all of --concurrency's, before it is quarantined.
The probation lasts until every allowed provider is trusted (its last answer judged was
accepted) or PROBATION_ANSWERS were judged. After it, a provider not trusted (new to the
run, or its last answer refused: it switched) is reached by at most TRIAL requests in
flight (`route`, asked by infer/prompt_work.py for each attempt); every other request has
it in provider.ignore until an answer of it is accepted.

The answers a provider that switches had in flight when it is quarantined are cancelled
where the API allows (`cancel_streams`, the transport's: openrouter/client.py): a stream
names its provider in its first chunk, so each stream of that provider is closed then (or
as soon as its first chunk comes, if later), and ends as `AttemptKind.CANCELLED`. A
cancelled generation may be billed all the same (OpenRouter's streaming docs list the
providers that stop billing on a cancel: DeepInfra, Together and Fireworks among them;
Moonshot AI, Parasail and BaseTen are not listed), so infer/prompt_work.py settles its cost
as a missing one (GET /generation, else its worst case), books it as refused
(RefusalKind.IDENTITY) and sends the prompt again elsewhere. A plain (non-streamed)
request names its provider only in its whole answer: it cannot be told apart before it
ends, so it runs on, is paid for and refused.

A provider refused this way `--identity-strikes` times is quarantined: its endpoints' tags
go into `provider.ignore` of every request from then on (Policy.quarantine), it is named on
stderr once with its typical offset and an example, and it is written to OUTPUT's identity
file (`contracts.IdentityState`, `OUTPUT.identity.json`), which a resume reads (infer/resume.py).
When the quarantine leaves the endpoints table no allowed provider, the run stops
(exit 2, resumable: StopReason.IDENTITY): what to do then is docs/real-run.md's.

The completion side is a second signal: usage.completion_tokens against the answer's text
re-encoded plus its structural tokens (`completion_ratio`, ~1.0 for the target's
tokenizer), counted on a sample of each provider's answers (COMPLETION_FIRST, then one in
COMPLETION_EVERY; every answer whose prompt side cannot judge). It is reported always
(per provider, the sample's median); where it refuses an answer: infer/identity_votes.py.

Answers of a self-hosted `--server` are not checked here (their usage is the server's,
and kp-tokenize compares its token IDs); an answer without usage.prompt_tokens is kept,
counted as unchecked.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from ..contracts import IdentityState, Quarantined
from ..openrouter.attempt import Attempt
from ..openrouter.request import RequestOptions
from ..openrouter.routing import Endpoint, Policy, allowed_endpoints, slugs_of
from ..recorded.identity_table import VENDOR_BAND, IdentityTable, typical
from .config import IdentityCheck
from .identity_votes import (
    ACCEPT,
    OFF,
    PENDING,
    UNCHECKED,
    CountCheck,
    Evidence,
    Votes,
    prompt_kind,
)

DEFAULT_STRIKES = 3
# Requests in flight (their verdict not waited for) until a first answer is found the
# target's: a run whose only provider serves another model pays for these, not for all of
# --concurrency, before the quarantine stops it
PROBATION = 16
# Once some provider is trusted (`route`): requests in flight that may still reach a provider
# not trusted yet (none of its answers accepted, or its last one refused); every other
# request ignores such providers. A host that redirects from its first answer, or switches
# mid-run, is then sent this many requests while it is judged, not its share of
# --concurrency (~500 of 2000 among four providers)
TRIAL = 8
# Admission's probation (PROBATION in flight) lasts until a first answer is accepted and,
# besides, until every allowed provider is trusted or this many answers were judged: the
# first answers then reach every provider as OpenRouter routes them, rather than the first
# one trusted taking the whole --concurrency while the others are on trial
PROBATION_ANSWERS = 4 * PROBATION
WAIT_SECONDS = 180.0  # how long an unconfirmed constant offset waits for the others
# The completion side is counted on each provider's first COMPLETION_FIRST answers, then on
# one in COMPLETION_EVERY (and always where the prompt side cannot judge): re-encoding an
# answer costs as much as counting its prompt, and a ratio's median needs no more
COMPLETION_FIRST, COMPLETION_EVERY = 32, 8
_SHOWN = 600  # characters of a rendered prompt a message shows



def tokenizer_settings(check: IdentityCheck, request: RequestOptions):
    """The tokenize.engine.Settings kp-tokenize would load for this run (CHECK: --tokenizer
    and its options; REQUEST: what is asked):
    thinking as the request asks, the preset of the model (Kimi K2.6's keeps earlier
    reasoning in its history: `kimi-k2.6`; else the tokenizer's own, `auto`)."""
    from ..tokenize.engine import Settings

    template = None
    if check.chat_template:
        with open(check.chat_template, encoding="utf-8") as f:
            template = f.read()
    preset = "kimi-k2.6" if request.model.lower() == "moonshotai/kimi-k2.6" else "auto"
    return Settings(tokenizer_dir=check.tokenizer, trust_remote_code=check.trust_remote_code,
                    chat_template=template, preset=preset,
                    thinking=request.asks_for_reasoning())


def check_tokenizer(check: IdentityCheck) -> None:
    """What can be checked of --tokenizer before anything is read or sent, without loading
    it (no such directory, not a tokenizer's, code to run without --trust-remote-code):
    exit 2 (tokenize/load.py)."""
    from ..tokenize.load import prepare_tokenizer_dir

    check.tokenizer = str(prepare_tokenizer_dir(check.tokenizer, check.trust_remote_code))


def load_counts(check: IdentityCheck, request: RequestOptions):
    """The target's counts (tokenize/counting.py TargetCounts), loaded and checked as
    kp-tokenize loads them: a tokenizer or template that does not load, or whose layout
    the preset does not match, is exit 2 before any request."""
    from ..tokenize.counting import TargetCounts

    return TargetCounts(tokenizer_settings(check, request))


UNCHECKED_WARNING = ("kp-infer: warning: answers' identity is unchecked: nothing compares their "
                     "token counts with the target model's, so an answer from another model (a "
                     "host redirecting the model, an injected system prompt) would be kept; "
                     "pass --tokenizer DIR (the target's tokenizer, as kp-tokenize takes it) "
                     "to check every answer")


def write_state(path: str, state: IdentityState) -> None:
    """STATE written whole under a temporary name, then renamed into place."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(msgspec.json.encode(state) + b"\n")
    os.replace(tmp, path)


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


class IdentityJudge:
    """The identity checks of one run: COUNTS (tokenize/counting.py TargetCounts), the run's
    POLICY (its `quarantine` list is this judge's to add to), the ENDPOINTS table (None: not
    read), STRIKES (--identity-strikes), SAY (stderr), STATE_PATH (the identity file, None
    for stdout) holding STATE (read by infer/resume.py), and STOP, called once when a quarantine
    leaves no allowed provider."""

    def __init__(self, counts, policy: Policy, endpoints: list[Endpoint] | None,
                 strikes: int = DEFAULT_STRIKES, say: Callable[[str], None] = lambda _: None,
                 state_path: str | None = None, state: IdentityState | None = None,
                 stop: Callable[[], None] = lambda: None, wait: float = WAIT_SECONDS):
        self.counts = counts
        self.policy = policy
        self.endpoints = endpoints
        self.strikes = strikes
        self.say = say
        self.state_path = state_path
        self.state = state or IdentityState()
        self.stop = stop
        self.wait = wait
        self.table = IdentityTable()
        self.votes = Votes(self.table, policy, endpoints)  # the evidence, and its verdicts
        self._changed = asyncio.Event()
        self._shared_said: set[tuple[str, int]] = set()
        self.shared: dict[str, dict] = {}  # kind -> the constant the providers share, shown
        for q in self.state.quarantined:  # (resume.py put their slugs in the policy already)
            self.table.quarantine(q.provider)
        self.none_left = False
        self.confirmed = False  # an answer was accepted (admission's probation is over)
        # providers (lower-case names) whose last answer judged was accepted (`route`)
        self.trusted: set[str] = set()
        self.on_trial = 0  # requests in flight that may reach a provider not trusted
        self._all_trusted = False  # (every allowed provider is: `route` has nothing to do)
        self.judged = 0  # answers given a final verdict
        self.waiting = 0  # checks waiting for the others' answers (holding no slot)
        self._precounted: dict[str, int | None] = {}  # prompt id -> its count (`precount`)
        # the transport's: close a quarantined provider's streams in flight (None: not
        # possible, e.g. a --server run's; set by infer/run.py once the transport is open)
        self.cancel_streams: Callable[[str], object] | None = None

    # -- counting (once per prompt: infer/prompt_work.py keeps it) -------------------------
    def count(self, messages: Sequence, prompt_id: str | None = None) -> int | None:
        """kimipipe's count of a prompt (PROMPT_ID's, counted ahead by `precount` if it
        was); None when the template cannot render it (then its answers are kept
        unchecked, as kp-tokenize would reject the row itself)."""
        if prompt_id is not None and prompt_id in self._precounted:
            return self._precounted.pop(prompt_id)
        try:
            return self.counts.prompt_tokens(messages)
        except Exception:
            return None

    def precount(self, prompts: Sequence) -> None:
        """Count PROMPTS (records.Prompt, about to be admitted) as one batch: rendered and
        encoded back to back, each costs a third of what it costs alone between answers
        (bench/README.md); `count` hands each its own."""
        try:
            found = self.counts.prompt_tokens_many([p.messages for p in prompts])
        except Exception:
            return  # (each is counted alone, at its answer)
        self._precounted.update((p.id, n) for p, n in zip(prompts, found, strict=True))

    # -- the check --------------------------------------------------------------------------
    def measure(self, prompt_id: str, messages: Sequence, count: int | None,
                answer: Attempt) -> CountCheck:
        """ANSWER's counts against kimipipe's (COUNT: its prompt's), recorded as evidence of
        its provider; no verdict yet."""
        provider = answer.provider or "unknown"
        evidence = self.votes.evidence.setdefault(provider, Evidence())
        evidence.answers += 1
        reported = answer.prompt_tokens if count is not None and answer.usage_seen else 0
        completion = None
        if (not reported or evidence.answers <= COMPLETION_FIRST
                or evidence.answers % COMPLETION_EVERY == 0):
            completion = self.counts.completion_tokens(answer.reasoning, answer.content,
                                                       answer.finish_reason == "length")
        check = CountCheck(prompt_id, provider, prompt_kind(messages), count or 0, reported,
                      completion, answer.completion_tokens if answer.usage_seen else 0, messages)
        if check.ratio is not None:
            evidence.ratios.append(check.ratio)
        if check.offset is not None:
            evidence.offsets.setdefault(check.kind, Counter())[check.offset] += 1
        return check

    def check(self, prompt_id: str, messages: Sequence, count: int | None, answer: Attempt) -> CountCheck:
        """ANSWER to the prompt PROMPT_ID (its MESSAGES, counted COUNT): measured, and its
        verdict (ACCEPT, OFF, PENDING: `settle` waits for it, UNCHECKED) booked."""
        check = self.measure(prompt_id, messages, count, answer)
        check.verdict, check.why = self.votes.first_verdict(check)
        self._conclude(check, count_strike=True)
        if check.verdict == PENDING:  # (its evidence may settle another waiting check)
            self._wake()
        return check

    async def settle(self, check: CountCheck, stopping: asyncio.Event) -> CountCheck:
        """A PENDING CHECK's verdict, waiting for the others' answers (see the module's
        text); a stop meanwhile refuses it without a strike (it was not shown wrong)."""
        deadline = time.monotonic() + self.wait
        self.waiting += 1
        try:
            await self._settle(check, stopping, deadline)
        finally:
            self.waiting -= 1
        return check

    async def _settle(self, check: CountCheck, stopping: asyncio.Event, deadline: float) -> None:
        while check.verdict == PENDING:
            verdict, why = self.votes.verdict(check)
            if verdict != PENDING:
                check.verdict, check.why = verdict, why
                self._conclude(check, count_strike=True)
                break
            left = deadline - time.monotonic()
            if stopping.is_set() or left <= 0:
                check.verdict = OFF
                check.why = (f"prompt_tokens {check.offset:+d} from kimipipe's count, which no "
                             "other provider has shown "
                             + ("before the run stopped" if stopping.is_set()
                                else f"within {self.wait:g} s"))
                self._conclude(check, count_strike=not stopping.is_set())
                break
            changed = asyncio.ensure_future(self._changed.wait())
            stopped = asyncio.ensure_future(stopping.wait())
            try:
                await asyncio.wait({changed, stopped}, timeout=left,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                stopped.cancel()

    @property
    def on_probation(self) -> bool:
        """Whether admission keeps at most PROBATION requests in flight: no answer found the
        target's yet, or (PROBATION_ANSWERS aside) a provider allowed not trusted yet."""
        if not self.confirmed:
            return True
        if self._all_trusted or self.endpoints is None or self.judged >= PROBATION_ANSWERS:
            return False
        self._all_trusted = not self.untrusted(self.policy)
        return not self._all_trusted

    async def probation(self, in_flight: Callable[[], int], stopping: asyncio.Event) -> None:
        """Hold admission while `on_probation` and PROBATION requests are in flight
        (IN_FLIGHT: the run's count, checks waiting excluded)."""
        while (self.on_probation and not stopping.is_set()
               and in_flight() - self.waiting >= PROBATION):
            changed = asyncio.ensure_future(self._changed.wait())
            stopped = asyncio.ensure_future(stopping.wait())
            try:
                await asyncio.wait({changed, stopped}, timeout=1.0,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                stopped.cancel()

    # -- a small share for a provider not trusted yet ---------------------------------------
    def untrusted(self, policy: Policy) -> list[Endpoint]:
        """POLICY's allowed endpoints whose provider is not trusted (nor quarantined)."""
        return [e for e in allowed_endpoints(policy, self.endpoints or [])
                if e.provider_name.lower() not in self.trusted]

    def route(self, policy: Policy) -> tuple[Policy, bool]:
        """The routing of one attempt of a prompt routed by POLICY, and whether it is on
        trial (it may reach a provider not trusted: `routed` counts it back). Until
        a first answer is accepted, POLICY itself (admission's probation bounds the run);
        then at most TRIAL requests in flight may reach the providers not trusted yet, and
        the others have them in provider.ignore (unless that leaves no route)."""
        if self._all_trusted or not self.trusted or self.endpoints is None:
            return policy, False
        untrusted = self.untrusted(policy)
        if not untrusted:
            self._all_trusted = not self.untrusted(self.policy)
            return policy, False
        if self.on_trial < TRIAL:
            self.on_trial += 1
            return policy, True
        narrowed = policy.ignoring([e.tag for e in untrusted if e.tag])
        if not allowed_endpoints(narrowed, self.endpoints):
            return policy, False
        return narrowed, False

    async def routed(self, policy: Policy, send: Callable[[Policy], Awaitable[Attempt]]) -> Attempt:
        """SEND (one attempt) with the routing `route` gives POLICY, its trial counted
        while it is in flight (its answer is judged next)."""
        routed, on_trial = self.route(policy)
        try:
            return await send(routed)
        finally:
            if on_trial:
                self.on_trial -= 1

    def _trust(self, provider: str, trusted: bool) -> None:
        name = provider.lower()
        if trusted:
            self.trusted.add(name)
        else:
            self.trusted.discard(name)
            self._all_trusted = False

    def refusal(self, check: CountCheck) -> str:
        """The refusal's message: why, with the two counts."""
        return f"not the target model's counts: {check.why} ({check.counts()})"

    def _conclude(self, check: CountCheck, count_strike: bool) -> None:
        """Book a final verdict (PENDING books nothing yet) and wake the waiting checks."""
        if check.verdict == PENDING:
            return
        evidence = self.votes.evidence[check.provider]
        refused = check.verdict == OFF
        self.judged += 1
        self.table.checked(check.provider, check.offset, check.ratio, refused=refused)
        if check.verdict in (ACCEPT, UNCHECKED):
            self.confirmed = True
        if check.verdict == ACCEPT:
            evidence.accepted[check.kind] += 1
            self._trust(check.provider, True)
            self._note_shared(check)
        elif refused:
            self._trust(check.provider, False)
            evidence.refused_kinds[check.kind] += 1
            if check.offset is not None:
                evidence.refused_offsets[check.offset] += 1
            evidence.example = evidence.example or check.counts()
            if count_strike:
                evidence.strikes += 1
                if evidence.strikes >= self.strikes:
                    self._quarantine(check.provider, evidence)
        self._wake()

    def _wake(self) -> None:
        """The evidence changed: the checks waiting (and admission on probation) look again."""
        if self.waiting or self.on_probation or self._changed._waiters:
            self._changed.set()
            self._changed = asyncio.Event()

    def _note_shared(self, check: CountCheck) -> None:
        """The first answer accepted at a shared constant: said once, with the prompt."""
        offset = check.offset
        if offset is None or offset in VENDOR_BAND or (check.kind, offset) in self._shared_said:
            return
        self._shared_said.add((check.kind, offset))
        agree = sorted(name for name, v in self.votes.modes(check.kind).items() if v == offset)
        try:
            rendered = self.counts.rendered(check.messages)
        except Exception:
            rendered = ""
        self.shared[check.kind] = {"offset": offset, "providers": agree,
                                   "example": check.prompt_id, "rendered": rendered[:_SHOWN]}
        self.say(f"kp-infer: {len(agree)} providers ({', '.join(agree)}) count prompts "
                 f"{check.kind} {offset:+d} tokens from kimipipe's rendering, more than count "
                 "them as kimipipe does: the chat "
                 "template kimipipe was given differs from theirs (a default system prompt "
                 "it omits, another template version?); accepted as shared, not "
                 "quarantined. kp-tokenize's input_ids follow kimipipe's template: compare "
                 f"its rendering of {check.prompt_id}, {_shown(rendered)}, with the model's "
                 "own, and give the right one (--chat-template) to kp-infer and kp-tokenize")

    def _quarantine(self, name: str, evidence: Evidence) -> None:
        if self.table.is_quarantined(name) or name == "unknown":
            return
        self.table.quarantine(name)
        slugs = slugs_of(name, self.endpoints)
        self.policy.quarantine.extend(s for s in slugs if s not in self.policy.quarantine)
        if self.cancel_streams is not None:  # its answers in flight are refused anyway
            self.cancel_streams(name)
        ratios = sorted(evidence.ratios)
        entry = Quarantined(
            provider=name, slugs=slugs, refused=sum(evidence.refused_offsets.values()) or evidence.strikes,
            offset=typical(evidence.refused_offsets), example=evidence.example,
            at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            completion_ratio=round(ratios[len(ratios) // 2], 3) if ratios else None)
        self.state.quarantined.append(entry)
        where = ""
        if self.state_path is not None:
            try:
                write_state(self.state_path, self.state)
                where = f", and for its resumes ({self.state_path})"
            except OSError as e:
                where = f" (its identity file could not be written: {e.strerror or e})"
        offset = "unknown" if entry.offset is None else f"{entry.offset:+d}"
        self.say(f"kp-infer: quarantined provider {name} ({', '.join(slugs)}): {evidence.strikes} "
                 f"answers refused for identity (--identity-strikes {self.strikes}); its prompt "
                 f"counts are typically {offset} from the target's, e.g. {entry.example}; its "
                 "prompts are sent again elsewhere, and it is in provider.ignore for the rest "
                 f"of this run{where}")
        if len(evidence.refused_offsets) == 1 and entry.offset:
            self.say(f"kp-infer: {name}'s offset is one constant ({entry.offset:+d}), which no "
                     "other provider confirmed: if kimipipe's chat template is the one that "
                     "differs (a default system prompt the hosts add), give the model's own "
                     f"with --chat-template"
                     + (f" and remove {self.state_path} to lift the quarantine"
                        if self.state_path else "")
                     + "; `kp-infer --preflight` asks every provider at once")
        if self.endpoints is not None and not allowed_endpoints(self.policy, self.endpoints):
            self.none_left = True
            self.stop()

    # -- what the summary shows ---------------------------------------------------------------
    def summary(self) -> dict:
        for kind, shown in self.shared.items():  # (all that agree by the end)
            shown["providers"] = sorted(name for name, v in self.votes.modes(kind).items()
                                        if v == shown["offset"])
        return {"checked": True, "providers": self.table.rows(),
                "shared_offsets": [{"prompts": kind, **shown} for kind, shown in self.shared.items()],
                "quarantined": [msgspec.to_builtins(q) for q in self.state.quarantined]}
