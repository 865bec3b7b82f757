"""The identity check's arithmetic: what each provider's answers showed (`Evidence`) and
the verdict it gives one answer's counts (`Votes.verdict`); infer/identity.py's judge
measures the answers, books the verdicts, waits, routes and quarantines on them.

The rule is the model owner's, per kind of prompt (with a system message first, or
without: a default system prompt is added only where a conversation has none). Moonshot's
Kimi Vendor Verifier accepts a vendor's usage.prompt_tokens from the expected count to
three above it (MAX_PROMPT_TOKEN_OVERCOUNT = 3): an offset inside VENDOR_BAND, 0..+3
(recorded/identity_table.py), is always the target's, each answer on its own (0 is the
prompt as kimipipe renders it, token for token; +1..+3 an honest stack's overcount), unless
the provider's answers to that kind were refused already at varying offsets (another
tokenizer inside the band by chance). Outside the band a constant C is the target's too
once the providers that agree show it: at least two, more than those inside the band
(each provider votes with the offset most of its answers show). That is the rendering
kimipipe was given differing from what every host renders (a default system prompt the
template omits, another template version): not quarantined, said in the summary with the
rendered prompt to compare, and the `--chat-template` to fix. An answer at any other
offset is refused (`RefusalKind.IDENTITY`, its cost counted like every refused answer) and
its prompt sent again with that provider ignored for it:

    a provider whose answers were at an accepted offset and now are not (it switched:
    honest, then redirected) is refused from its first such answer;
    counts whose offset varies from prompt to prompt are another tokenizer;
    an undercount (below the band) is no host's, unless every provider shares it;
    a constant offset that only this provider shows is refused once the others answering
    cannot make it the shared one (they are at 0, or none is left to answer);
    until then the answer waits, holding no concurrency slot (so the next requests reach
    the other providers), for up to WAIT_SECONDS (the judge's); unconfirmed by then, it is
    refused.

The completion side (`CountCheck.ratio`: usage.completion_tokens over kimipipe's count of
the answer) refuses an answer only where it is unambiguous: an answer of at least
LONG_ANSWER tokens whose ratio is outside FAR (another tokenizer family, or counting words)
and whose prompt side says nothing (no usage.prompt_tokens: `first_verdict`). A far ratio
beside a prompt count that matches is reasoning the provider bills but does not return in
full, not another model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..openrouter.routing import Endpoint, Policy, allowed_endpoints
from ..recorded.identity_table import VENDOR_BAND, IdentityTable, band_text, typical
from ..records import Identity

LONG_ANSWER = 256  # tokens (kimipipe's count) before a completion ratio can be far
FAR = (0.5, 2.0)  # completion ratios outside this: not the target's tokenizer

ACCEPT, OFF, PENDING, UNCHECKED = "accept", "off", "pending", "unchecked"
SYSTEM_FIRST, NO_SYSTEM = "with a system message first", "without a system message"


def shown_offsets(seen) -> str:
    """A few offsets seen (an iterable of ints), in order: "+0, +5, +9..."."""
    ordered = sorted(seen)
    return ", ".join(f"{v:+d}" for v in ordered[:4]) + ("..." if len(ordered) > 4 else "")


def expected_offsets(accepted: set[int]) -> str:
    """The offsets accepted, as the messages write them: the band, and a shared constant."""
    outside = sorted(v for v in accepted if v not in VENDOR_BAND)
    return "/".join([band_text(), *(f"{v:+d}" for v in outside)])


def prompt_kind(messages: Sequence) -> str:
    """The kind of prompt an offset is learned for: a system message first, or none."""
    return SYSTEM_FIRST if messages and messages[0].role == "system" else NO_SYSTEM


@dataclass
class CountCheck:
    """One answer's counts against kimipipe's, and the verdict on them."""

    prompt_id: str
    provider: str
    kind: str  # prompt_kind
    count: int  # kimipipe's count of the prompt
    reported: int  # usage.prompt_tokens (0: not reported)
    completion_count: int | None  # kimipipe's count of the answer (None: not sampled)
    completion_reported: int
    messages: Sequence = field(repr=False, default=())
    verdict: str = ""
    why: str = ""

    @property
    def offset(self) -> int | None:
        return self.reported - self.count if self.reported else None

    @property
    def ratio(self) -> float | None:
        if not self.completion_count or not self.completion_reported:
            return None
        return self.completion_reported / self.completion_count

    @property
    def far(self) -> bool:
        ratio = self.ratio
        return (ratio is not None and (self.completion_count or 0) >= LONG_ANSWER
                and not FAR[0] <= ratio <= FAR[1])

    def mark(self) -> Identity:
        """What the answer's record says it was checked against."""
        return Identity(prompt_tokens=self.count, completion_tokens=self.completion_count,
                        offset=self.offset)

    def counts(self) -> str:
        return (f"{self.prompt_id}: {self.provider} counted {self.reported:,} prompt tokens, "
                f"kimipipe {self.count:,} ({self.offset:+d})" if self.offset is not None else
                f"{self.prompt_id}: {self.provider} counted {self.completion_reported:,} "
                f"completion tokens, kimipipe {self.completion_count:,}")


@dataclass
class Evidence:
    """What one provider's answers showed, per kind of prompt."""

    offsets: dict[str, Counter] = field(default_factory=dict)
    answers: int = 0  # measured
    accepted: Counter = field(default_factory=Counter)  # answers at an accepted offset, by kind
    refused_kinds: Counter = field(default_factory=Counter)  # answers refused, by kind
    strikes: int = 0
    refused_offsets: Counter = field(default_factory=Counter)
    ratios: list[float] = field(default_factory=list)
    example: str = ""  # its first refused answer's counts


class Votes:
    """The providers' evidence (EVIDENCE, by the name their answers give) and the verdicts
    it gives: each provider votes with the offset most of its answers show (`modes`);
    quarantined providers (TABLE's) have none. POLICY and ENDPOINTS (None: not read) tell
    which providers may still answer (`unseen`)."""

    def __init__(self, table: IdentityTable, policy: Policy, endpoints: list[Endpoint] | None):
        self.table = table
        self.policy = policy
        self.endpoints = endpoints
        self.evidence: dict[str, Evidence] = {}

    def first_verdict(self, check: CountCheck) -> tuple[str, str]:
        """CHECK's verdict as its answer is measured: on the completion side alone when the
        prompt side says nothing (OFF when far, else UNCHECKED), else `verdict`."""
        if check.offset is None:
            return (OFF, self.far_why(check)) if check.far else (UNCHECKED, "")
        return self.verdict(check)

    def modes(self, kind: str) -> dict[str, int]:
        """Each provider's offset (the one most of its answers show) for prompts of KIND;
        quarantined providers have no vote."""
        return {name: typical(e.offsets[kind]) for name, e in self.evidence.items()
                if e.offsets.get(kind) and not self.table.is_quarantined(name)}

    def accepted_offsets(self, kind: str) -> set[int]:
        """The band (VENDOR_BAND), and the constant outside it that the providers that agree
        show, if they do (module's text)."""
        modes = self.modes(kind)
        in_band = sum(1 for v in modes.values() if v in VENDOR_BAND)
        constants = Counter(v for v in modes.values() if v not in VENDOR_BAND).most_common(2)
        if constants:
            (value, n), runner_up = constants[0], constants[1][1] if len(constants) > 1 else 0
            if n >= 2 and n > in_band and n > runner_up:
                return {*VENDOR_BAND, value}
        return set(VENDOR_BAND)

    def unseen(self, kind: str, provider: str) -> int:
        """Allowed providers that have not answered a prompt of KIND yet (besides PROVIDER)."""
        if self.endpoints is None:
            return 0
        names = {e.provider_name.lower() for e in allowed_endpoints(self.policy, self.endpoints)}
        seen = {name.lower() for name, e in self.evidence.items() if e.offsets.get(kind)}
        return len(names - seen - {provider.lower()})

    def verdict(self, check: CountCheck) -> tuple[str, str]:
        """CHECK's verdict on the evidence now (ACCEPT, OFF with why, or PENDING)."""
        offset, kind, name = check.offset, check.kind, check.provider
        evidence = self.evidence[name]
        seen = evidence.offsets[kind]
        if offset in VENDOR_BAND:
            # the target's, as the model's owner verifies a vendor: unless this provider's
            # answers to prompts of this kind were refused already, and its offsets vary:
            # another tokenizer whose count fell inside the band by chance on this prompt
            if not evidence.refused_kinds[kind] or len(seen) == 1:
                return ACCEPT, ""
            return OFF, (f"prompt_tokens {offset:+d} from kimipipe's count, inside the vendor "
                         "verifier's tolerance by chance: its other answers were refused and "
                         f"its offsets vary ({shown_offsets(seen)}): another tokenizer or model")
        accepted = self.accepted_offsets(kind)
        if offset in accepted:
            return ACCEPT, ""
        if check.far:
            return OFF, self.far_why(check)
        expected = expected_offsets(accepted)
        if evidence.accepted[kind]:
            return OFF, (f"prompt_tokens {offset:+d} from kimipipe's count, where its earlier "
                         f"answers were at {expected}: it serves another model now")
        if len(seen) > 1:
            return OFF, (f"prompt_tokens {offset:+d} from kimipipe's count, and its offsets vary "
                         f"from prompt to prompt ({shown_offsets(seen)}): another tokenizer or "
                         "template")
        modes = self.modes(kind)
        in_band = sum(1 for v in modes.values() if v in VENDOR_BAND)
        same = 1 + sum(1 for other, v in modes.items() if v == offset and other != name)
        possible = same + self.unseen(kind, name)
        if possible >= 2 and possible > in_band:
            return PENDING, ""
        if not modes.keys() - {name} and possible < 2:
            why = (f"prompt_tokens {offset:+d} from kimipipe's count on every answer, and no other "
                   "provider is left to tell whether it or the chat template differs")
        else:
            why = (f"prompt_tokens {offset:+d} from kimipipe's count, where {in_band} other "
                   f"provider(s) are at {expected}: "
                   + ("an undercount, which the vendor verifier accepts from no host"
                      if offset < 0 else
                      "it renders prompts otherwise (an injected system prompt, another "
                      "template) or serves another model"))
        return OFF, why

    @staticmethod
    def far_why(check: CountCheck) -> str:
        return (f"completion_tokens {check.completion_reported:,} for {check.completion_count:,} "
                f"tokens of text (ratio {check.ratio:.2f}): another tokenizer")
