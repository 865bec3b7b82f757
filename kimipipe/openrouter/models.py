"""What kimipipe knows about a model beyond its slug: its native weights, and so its routing default.

Kimi K2.5 ships natively as INT4 (quantization-aware training): `int4` endpoints serve the
official weights, and first-party endpoints report `unknown`. Fireworks (NVFP4), BaseTen
(FP4) and DeepInfra's turbo variant (FP4) re-quantize those weights to another 4-bit format,
which changes what the model emits; training data for a drafter must come from the model
as it is served natively. So, with no `--quantization` flag, kp-infer allows only the
preset's `allowed_quantizations`; `--any-quantization` lifts the default, and any
quantization the flags allow that is in `requantized` draws a warning.

Sampling as served: training data for a drafter must be sampled the way the target is
served. Moonshot serves Kimi K2.5 in thinking mode at temperature 1.0 and top_p 0.95 (its
own API accepts no other temperature in thinking mode), and in instant mode (thinking off)
at temperature 0.6, top_p 0.95. Through OpenRouter a parameter left out is filled by each
provider's own default, so kp-infer sends the preset's values for whatever the user did
not set (`served_sampling`), and `provider.require_parameters: true` with them
(openrouter/request.py). Thinking is the mode unless `--no-reasoning` or
`--reasoning-effort none` turns it off; with no reasoning flag at all, the preset's mode is
said in the body as `reasoning: {"enabled": true}` (so each record says it, and the
reasoning check knows it was asked for).

Kimi K2.6 is K2.5's successor in the same family (the same tokenizer, native INT4 weights)
and is served the same way: Moonshot's parameter table fixes K2.6's top_p at 0.95 and its
temperature (1.0 thinking, 0.6 instant, as Tencent Cloud's Kimi guide gives them for K2.6
and K2.5 alike). What differs is its history: K2.6's template keeps earlier turns'
reasoning (`preserve_thinking`), see kp-tokenize's `kimi-k2.6` preset.

Token logprobs (the tokens the model sampled, so kp-tokenize can use their IDs instead of
re-encoding the text): the Kimi presets ask for them wherever that narrows no routing
(openrouter/logprobs.py): measured at 1.7x the chunk parse's CPU and 1.1-1.5x kp-infer's
CPU per streamed chunk at 2000 in flight, under the 2x that would have kept them off, and
about half the text's size more per record (bench/README.md, bench_logprobs.py).

An unknown model gets no preset: no routing default, no warning (kimipipe cannot know its
native weights), and no sampling invented for it (`--plan` says so).
"""

from __future__ import annotations

from dataclasses import dataclass

# OpenRouter's `provider.quantizations` values (ProviderPreferences.quantizations).
QUANTIZATIONS = ("int4", "int8", "fp4", "mxfp4", "nvfp4", "fp6", "fp8", "mxfp8", "fp16", "bf16",
                 "fp32", "unknown")


@dataclass(frozen=True)
class ModelPreset:
    slug: str
    native_quantization: str
    allowed_quantizations: tuple[str, ...]  # the routing default
    requantized: frozenset[str]  # quantizations below the native weights' fidelity
    thinking_sampling: tuple[tuple[str, float], ...] = ()  # as served with reasoning on
    instant_sampling: tuple[tuple[str, float], ...] = ()  # as served with reasoning off
    # token logprobs asked by default where asking costs no endpoint (openrouter/logprobs.py)
    logprobs: bool = False


_KIMI_NATIVE_INT4 = dict(
    native_quantization="int4",
    allowed_quantizations=("int4", "unknown"),
    requantized=frozenset({"fp4", "mxfp4", "nvfp4"}),
    thinking_sampling=(("temperature", 1.0), ("top_p", 0.95)),
    instant_sampling=(("temperature", 0.6), ("top_p", 0.95)),
    logprobs=True,
)

PRESETS: dict[str, ModelPreset] = {
    slug: ModelPreset(slug=slug, **_KIMI_NATIVE_INT4)
    for slug in ("moonshotai/kimi-k2.5", "moonshotai/kimi-k2-thinking", "moonshotai/kimi-k2.6")
}

# What a model's chat template does with an earlier turn's reasoning in a conversation's
# history, and so kp-infer's `--history-reasoning` default (infer/conversations.py):
# Kimi K2.5's and K2 Thinking's render it as an empty <think></think> ("drop"); K2.6's
# `preserve_thinking` keeps it ("keep"). A model not listed: "drop", as most templates do.
HISTORY_REASONING: dict[str, str] = {
    "moonshotai/kimi-k2.5": "drop",
    "moonshotai/kimi-k2-thinking": "drop",
    "moonshotai/kimi-k2.6": "keep",
}


def history_reasoning_default(model: str) -> str:
    return HISTORY_REASONING.get(model.lower(), "drop")


def preset_for(model: str) -> ModelPreset | None:
    return PRESETS.get(model.lower())


def thinking(reasoning: bool | None, reasoning_effort: str | None) -> bool:
    """Whether a request runs in thinking mode (Kimi's default), by the reasoning flags."""
    return reasoning is not False and reasoning_effort != "none"


def served_sampling(model: str, reasoning: bool | None, reasoning_effort: str | None
                    ) -> dict[str, float] | None:
    """The sampling MODEL is served at in the mode the flags ask for, or None for a model
    kimipipe has no preset for (nothing is invented for it)."""
    preset = preset_for(model)
    if preset is None:
        return None
    mode = preset.thinking_sampling if thinking(reasoning, reasoning_effort) else preset.instant_sampling
    return dict(mode)


def default_quantizations(model: str, given: list[str] | tuple[str, ...], any_quantization: bool
                          ) -> list[str]:
    """The quantizations a run allows: the flags given, else the model's native default."""
    if given or any_quantization:
        return list(given)
    preset = preset_for(model)
    return list(preset.allowed_quantizations) if preset else []


def requantized_allowed(model: str, allowed: list[tuple[str, str | None]]) -> list[str]:
    """Warnings for endpoints the routing allows whose weights are re-quantized.

    ALLOWED: (provider name, quantization) of every endpoint the policy lets through.
    """
    preset = preset_for(model)
    if preset is None:
        return []
    return [f"{name} serves {model} as {quant}, re-quantized from its native "
            f"{preset.native_quantization} weights"
            for name, quant in allowed if quant in preset.requantized]


def requantized_in_flags(model: str, quantizations: list[str]) -> list[str]:
    """The re-quantized formats a `--quantization` list names (for runs without an endpoints table)."""
    preset = preset_for(model)
    if preset is None:
        return []
    return [q for q in quantizations if q in preset.requantized]
