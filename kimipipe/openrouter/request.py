"""The body of a chat completion request: the one place kimipipe builds it.

`RequestOptions` holds what the user asked for (model, `max_tokens`, sampling, reasoning,
streaming, `--extra-body`), with the model preset's served sampling already filled in
where the user set nothing (openrouter/models.py; commands/infer.py resolves it);
`RequestOptions.body(prompt, policy)` turns one prompt into the JSON bytes POSTed to
`/chat/completions`, with the routing policy as OpenRouter's `provider` object
(openrouter/routing.py). Only what is set is sent: a parameter left out is filled in by
each provider's own default (docs/openrouter.md, "Request").

    {"model": ..., "messages": [{"role", "content"}, ...], "max_tokens": N, "stream": bool,
     "temperature"?, "top_p"?, "seed"?, "reasoning": {"enabled"?, "effort"?}?,
     "logprobs"?: true, "top_logprobs"?: 0,
     "provider": {..., "require_parameters"?: true}?, ...--extra-body}

`max_tokens` is always sent: without it OpenRouter's pre-flight credit check assumes the
model's largest output, and a budget's worst case could not be bounded. `--extra-body`
keys are written over the built body, except `provider`, whose keys are merged into the
policy's.

Whenever a sampling parameter is sent (`SAMPLING_PARAMETERS`, from the flags, the preset
or `--extra-body`), so is `provider.require_parameters: true` (unless
`require_parameters=False`, `--no-require-parameters`, or `--extra-body` says otherwise):
a provider that does not support a parameter drops it silently, and the answer would be
sampled otherwise than the record says. `--require-logprobs` sends it too.
`require_parameters` covers every parameter the body sends, so with it `logprobs`
(`--logprobs`, openrouter/logprobs.py) is a routing requirement as well.
`sampling()` is what each response record carries as `sampling` (records.Sampling):
those parameters as the body holds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from ..records import Prompt, Sampling
from .routing import Policy

# The parameters that change how tokens are drawn (OpenRouter's request parameters).
SAMPLING_PARAMETERS = ("temperature", "top_p", "top_k", "min_p", "top_a", "frequency_penalty",
                       "presence_penalty", "repetition_penalty", "seed")
# Every request parameter OpenRouter checks an endpoint for under `require_parameters`
# (the SDK's `Parameter` values); `stream`, `model` and `messages` are not among them.
PARAMETERS = frozenset({
    *SAMPLING_PARAMETERS, "max_tokens", "max_completion_tokens", "logit_bias", "logprobs",
    "top_logprobs", "prediction", "response_format", "structured_outputs", "stop", "tools",
    "tool_choice", "parallel_tool_calls", "include_reasoning", "reasoning", "reasoning_effort",
    "web_search_options", "verbosity",
})


@dataclass
class RequestOptions:
    model: str = "moonshotai/kimi-k2.5"
    max_tokens: int = 16384
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    reasoning: bool | None = None
    reasoning_effort: str | None = None
    stream: bool = True
    require_parameters: bool = True  # sent with any sampling parameter
    extra_body: dict = field(default_factory=dict)
    # token logprobs (openrouter/logprobs.py): True asks for them (`logprobs: true,
    # top_logprobs: 0`), False not; None: the model preset's default, decided once the
    # endpoints table is read (infer/endpoints.py), not asked until then
    logprobs: bool | None = None
    require_logprobs: bool = False  # asked and made a routing requirement (require_parameters)

    def fields(self, policy: Policy) -> dict:
        """Every field of the body but `model` and `messages`, `--extra-body` applied."""
        body: dict = {"max_tokens": self.max_tokens, "stream": self.stream}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.seed is not None:
            body["seed"] = self.seed
        reasoning: dict = {}
        if self.reasoning is not None:
            reasoning["enabled"] = self.reasoning
        if self.reasoning_effort:
            reasoning["effort"] = self.reasoning_effort
        if reasoning:
            body["reasoning"] = reasoning
        if self.logprobs or self.require_logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = 0
        provider = policy.provider_object()
        if provider:
            body["provider"] = provider
        for key, value in self.extra_body.items():
            if key == "provider" and isinstance(value, dict):
                body["provider"] = {**body.get("provider", {}), **value}
            else:
                body[key] = value
        if (self.require_parameters and any(body.get(k) is not None for k in SAMPLING_PARAMETERS)
                or self.require_logprobs):
            provider = body.setdefault("provider", {})
            if isinstance(provider, dict):
                provider.setdefault("require_parameters", True)
        return body

    def body(self, prompt: Prompt, policy: Policy, session_id: str | None = None) -> bytes:
        """The request body for PROMPT under POLICY, as the JSON bytes sent; SESSION_ID
        (a conversation's id: OpenRouter's sticky routing) when given. An earlier turn's
        reasoning is sent back only where the history carries it (`Message.reasoning`)."""
        body: dict = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} if m.reasoning is None else
                         {"role": m.role, "content": m.content, "reasoning": m.reasoning}
                         for m in prompt.messages],
            **self.fields(policy),
        }
        if session_id is not None:
            body["session_id"] = session_id
        return msgspec.json.encode(body)

    def asks_for_reasoning(self) -> bool:
        """Whether the body asks for reasoning text back: `reasoning` enabled (or an effort
        other than none, or a max_tokens), and not `exclude`d (`--extra-body`)."""
        reasoning = self.fields(Policy()).get("reasoning")
        if not isinstance(reasoning, dict) or reasoning.get("exclude"):
            return False
        if reasoning.get("enabled") is False or reasoning.get("effort") == "none":
            return False
        return bool(reasoning.get("enabled") or reasoning.get("effort") or reasoning.get("max_tokens"))

    def enforced_parameters(self, policy: Policy | None = None) -> tuple[str, ...]:
        """The parameters OpenRouter will require an endpoint to support: every one the body
        sends, when it asks for `provider.require_parameters` (else none)."""
        body = self.fields(policy or Policy())
        provider = body.get("provider")
        if not (isinstance(provider, dict) and provider.get("require_parameters") is True):
            return ()
        return tuple(sorted(k for k, v in body.items() if k in PARAMETERS and v is not None))

    def sampling(self, policy: Policy | None = None) -> Sampling:
        """What a response record says about how it was asked for (records.Sampling).

        Raises ValueError when `--extra-body` gives one of them a value of the wrong type."""
        body = self.fields(policy or Policy())
        provider = body.get("provider")
        sent = {k: body[k] for k in Sampling.__struct_fields__
                if k in body and body[k] is not None and k != "require_parameters"}
        sent["require_parameters"] = isinstance(provider, dict) and provider.get("require_parameters") is True
        try:
            return msgspec.convert(sent, Sampling, strict=False)
        except msgspec.ValidationError as e:
            raise ValueError(f"--extra-body: {e}") from None
