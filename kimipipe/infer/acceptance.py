"""Which answers kp-infer keeps: the routing and reasoning checks, and a refused prompt's
next routing.

Routing and reasoning are verified, not trusted (`Acceptance.refusal(answer)`): an answer
is not a result when (kinds.RefusalKind)
    routing_violation  the provider that served it is one the policy and the endpoints
                       table exclude (openrouter/routing.py); a provider name that covers
                       an excluded variant as well as an allowed endpoint cannot be traced
                       (no response field names the endpoint): its answers are kept,
                       marked `"routing": "unverifiable"` (infer/writing.py);
    think_marker       reasoning was asked for and a think tag is left where a leaked
                       reasoning block puts one: the content begins with `<think>`, or
                       holds `</think>` more than once while no reasoning came back, or holds
                       either tag after an inline block was split off (where the split fell
                       is then uncertain). A content with one `</think>`, no `<think>` and
                       no reasoning (the provider's template opened the block and never
                       parsed it) is not refused: the text before it is the reasoning
                       (`reasoning_source: inline`, kimipipe/think_tags.py);
    no_reasoning       reasoning was asked for and none came back (empty or blank);
    identity           (--tokenizer) its usage counts are not the target model's for its
                       prompt: another model, tokenizer or template (`self.identity`,
                       infer/identity.py: it learns the offset the providers share,
                       quarantines a provider refused --identity-strikes times, and may
                       make a verdict wait for the other providers' answers; the prompt's
                       work asks it once the checks here passed).
A tag elsewhere in the content of an answer whose reasoning came in its own field is text
the model wrote (the stand-in writes such traps on purpose) and is kept: refusing it would
pay for the same answer again at every provider. An answer cut by `max_tokens`
(`finish_reason: length`) whose reasoning ran into the limit has its reasoning and is kept,
marked by its finish reason.

A refused answer was paid for: the prompt's work (infer/prompt_work.py) counts its cost,
and sends the prompt again with the provider that served it added to that prompt's
`provider.ignore` (`next_policy`; not when that would leave the endpoints table no allowed
provider: then the same routing again), up to `--max-attempts`; the refusals ride on the
record finally written (`refused`, cost included) or on its failure line.
"""

from __future__ import annotations

from dataclasses import replace

from ..kinds import RefusalKind
from ..openrouter.answer import spelled_by, tokens_joined
from ..openrouter.attempt import Attempt
from ..openrouter.request import RequestOptions
from ..openrouter.routing import Endpoint, Policy, allowed_endpoints, slugs_of
from ..openrouter.routing import routing_violation as policy_violation
from ..think_tags import INLINE, THINK_CLOSE, THINK_OPEN, split_lone_think_close
from .servers import server_name


def recover_lone_think_close(answer: Attempt) -> None:
    """The reasoning of an answer from a stack with no reasoning parser (think_tags.py),
    taken from its content in place. Only where reasoning was asked for: with thinking off
    the prompt closed the block itself, and a `</think>` in the content is text."""
    split = split_lone_think_close(answer.content, answer.reasoning)
    if split is not None:
        joined = tokens_joined(answer)  # (spelled by the text as it came, before the split)
        answer.content, answer.reasoning = split
        answer.reasoning_source = INLINE if split[1] else ""
        if joined is not None:  # which text the tokens spell is said of the text kept
            answer.token_data, answer.token_spells = spelled_by(joined, answer.reasoning,
                                                                answer.content)


def reasoning_refusal(answer: Attempt) -> tuple[RefusalKind, str] | None:
    """(think_marker | no_reasoning, why) for an answer to a request that asked for
    reasoning, or None when its reasoning is what a record needs (module docstring)."""
    content = answer.content
    head = content.lstrip()
    has_reasoning = bool((answer.reasoning or "").strip())
    for tag in (THINK_OPEN, THINK_CLOSE):
        if head.startswith(tag):
            return RefusalKind.THINK_MARKER, f"the content begins with {tag}"
    if answer.reasoning_source == "inline" and (THINK_OPEN in content or THINK_CLOSE in content):
        return (RefusalKind.THINK_MARKER,
                "a think tag is left in the content after the inline reasoning")
    if not has_reasoning and THINK_CLOSE in content:
        return RefusalKind.THINK_MARKER, "no reasoning, and a </think> in the content"
    if not has_reasoning:
        return RefusalKind.NO_REASONING, "reasoning was asked for and none came back"
    return None


class Acceptance:
    """The checks of one run: its routing POLICY, the ENDPOINTS table (None: not fetched)
    and whether the request asks for reasoning."""

    def __init__(self, policy: Policy, endpoints: list[Endpoint] | None,
                 expects_reasoning: bool):
        self.policy = policy
        self.endpoints = endpoints
        self.expects_reasoning = expects_reasoning
        self.servers: frozenset[str] = frozenset()  # the --server names (infer/servers.py)
        # --tokenizer: whether each answer is the target model's (infer/identity.py), checked
        # once routing and reasoning passed; None: unchecked
        self.identity = None

    @classmethod
    def for_run(cls, policy: Policy, request: RequestOptions, servers: list[str],
                endpoints: list[Endpoint] | None) -> Acceptance:
        """The run's: its routing POLICY, the reasoning its REQUEST asks for, the --server
        URLs SERVERS (whose answers no routing check applies to)."""
        acceptance = cls(policy, endpoints, request.asks_for_reasoning())
        acceptance.servers = frozenset(server_name(url) for url in servers)
        return acceptance

    def routing_violation(self, provider: str | None) -> str | None:
        """Why an answer served by PROVIDER breaks the routing policy, or None (a
        self-hosted server's answer: OpenRouter's routing does not apply). With the
        identity checked, a provider quarantined during the run is not a routing matter:
        its answers still in flight are judged on their own counts (infer/identity.py)."""
        if provider in self.servers:
            return None
        policy = self.policy
        if self.identity is not None and policy.quarantine:
            policy = replace(policy, quarantine=[])
        return policy_violation(policy, provider, self.endpoints)

    def refusal(self, answer: Attempt) -> tuple[RefusalKind, str] | None:
        """(kind, why) when an `ok` ANSWER is not a result (module docstring), else None."""
        violation = self.routing_violation(answer.provider)
        if violation:
            return RefusalKind.ROUTING_VIOLATION, violation
        if self.expects_reasoning:
            recover_lone_think_close(answer)
            return reasoning_refusal(answer)
        return None

    def next_policy(self, policy: Policy, provider: str | None) -> Policy:
        """POLICY with PROVIDER (an answer of it refused) added to `ignore`, for that prompt's
        next attempt; POLICY itself when the endpoints table would have no provider left."""
        if not provider:
            return policy
        widened = policy.ignoring(slugs_of(provider, self.endpoints))
        if self.endpoints is not None and not allowed_endpoints(widened, self.endpoints):
            return policy
        return widened
