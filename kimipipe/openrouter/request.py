"""The body of a chat completion request: the one place kimipipe builds it.

`RequestOptions` holds what the user asked for (model, `max_tokens`, sampling, reasoning,
streaming, `--extra-body`); `RequestOptions.body(prompt, policy)` turns one prompt into the
JSON bytes POSTed to `/chat/completions`, with the routing policy as OpenRouter's
`provider` object (openrouter/routing.py). Only what the user set is sent: a parameter left
out is filled in by each provider's own default (docs/openrouter.md, "Request").

    {"model": ..., "messages": [{"role", "content"}, ...], "max_tokens": N, "stream": bool,
     "temperature"?, "top_p"?, "seed"?, "reasoning": {"enabled"?, "effort"?}?,
     "provider": {...}?, ...--extra-body}

`max_tokens` is always sent: without it OpenRouter's pre-flight credit check assumes the
model's largest output, and a budget's worst case could not be bounded. `--extra-body`
keys are written over the built body, except `provider`, whose keys are merged into the
policy's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from ..records import Prompt
from .routing import Policy


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
    extra_body: dict = field(default_factory=dict)

    def body(self, prompt: Prompt, policy: Policy) -> bytes:
        """The request body for PROMPT under POLICY, as the JSON bytes sent."""
        body: dict = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in prompt.messages],
            "max_tokens": self.max_tokens,
            "stream": self.stream,
        }
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
        provider = policy.provider_object()
        if provider:
            body["provider"] = provider
        for key, value in self.extra_body.items():
            if key == "provider" and isinstance(value, dict):
                body["provider"] = {**body.get("provider", {}), **value}
            else:
                body[key] = value
        return msgspec.json.encode(body)
