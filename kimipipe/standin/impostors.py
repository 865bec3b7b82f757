"""Providers that serve another model under the target's name (`--impostor PROVIDER=N[:HOW]`).

From its N-th answer on, the provider answers as another model would: other text (the
same words drawn with another seed), and `usage` counted as that model counts it. What
stays the same, and why, is what OpenRouter's documents and the hosts' notices say of such
answers (OPENROUTER.md, "The model's lifecycle"; docs/robustness.md):

- A redirect answers HTTP 200 with another model's text, and the declared provider and
  quantization stay the same (DeepInfra announced it would redirect Kimi K2.5's calls to
  Kimi K3 after 2026-09-07): so the impostor keeps its provider name, endpoint tag,
  quantization, prices, `model` field and wire format; nothing but the answer changes.
- `usage.prompt_tokens` is counted by the serving stack with the serving model's tokenizer,
  over the prompt as its chat template rendered it; `usage.completion_tokens` is every
  token it sampled: so HOW says what the other model counts with:

      words          another tokenizer: the stand-in's word counts (answers.py), which
                     differ from a tokenizer's by an amount that varies prompt to prompt
      tokenizer=DIR  another model's tokenizer and its chat template (token_counts.py)
      template=FILE  the stand-in's tokenizer (`--tokenizer`) under another chat template
                     (Kimi K3's new chat format, say): per message, another overhead
      system=TEXT    an injected system prompt (Moonshot's Kimi Vendor Verifier exists
                     because vendors serving "the same" model differ, default system
                     prompts among them): where the conversation has no system message,
                     the provider answers it with a system message TEXT first, and counts
                     that prompt: a constant offset; where it has one, it is untouched

- "From its N-th answer": a host switches under a running job (honest answers first,
  then the redirect), as DeepInfra's notice dated its own.

The N counts the answers the provider served (any endpoint of its tag), faults included;
each answer another model gave (or given to an injected prompt) is marked `"impostor":
true` in the ledger and counted in stats `quirks`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from .answers import Answer, count_prompt_tokens

HOWS = ("words", "system", "tokenizer", "template")


def split_how(how: str) -> tuple[str, str]:
    kind, _, value = how.partition("=")
    return kind, value


def check_impostor(after: int, how: str) -> None:
    kind, value = split_how(how)
    if after < 1:
        raise ValueError(f"an impostor serves another model from its N-th answer: N >= 1, got {after}")
    if kind not in HOWS:
        raise ValueError(f"impostor counts: one of words, system=TEXT, tokenizer=DIR, "
                         f"template=FILE; got {how!r}")
    if kind != "words" and not value:
        raise ValueError(f"impostor counts {kind}=... needs its value")


def impostor_body(body: dict, how: str) -> dict | None:
    """BODY as the impostor answers it: another model's draw of the words (answers.py
    seeds its RNG with the request's seed), or the conversation with the injected system
    prompt first; None when the injection leaves it untouched (it has a system message)."""
    kind, value = split_how(how)
    if kind != "system":
        return {**body, "seed": f"{body.get('seed')}|another model"}
    messages = body.get("messages") or []
    first = messages[0] if messages else {}
    if isinstance(first, dict) and first.get("role") == "system":
        return None
    return {**body, "messages": [{"role": "system", "content": value}, *messages]}


class _Words:
    """Counts the prompt in words, as the stand-in does without a tokenizer."""

    @staticmethod
    def recount(messages: list[dict], answer: Answer, thinking: bool) -> Answer:
        from dataclasses import replace
        return replace(answer, prompt_tokens=count_prompt_tokens(messages))


class Impostors:
    """The stand-in's impostors (`Config.impostors`): which answers are theirs, and the
    counters they count with (COUNTER: the stand-in's own, `--tokenizer`; None: words)."""

    def __init__(self, tokenizer: str | None):
        self.tokenizer = tokenizer
        self.served: Counter[str] = Counter()  # answers served, by endpoint tag

    def serving(self, impostors: dict[str, tuple], endpoint) -> str | None:
        """Count one answer of ENDPOINT; HOW when it is served by another model."""
        self.served[endpoint.tag] += 1
        for slug, (after, how) in impostors.items():
            if endpoint.matches(slug):
                served = sum(n for tag, n in self.served.items()
                             if tag == endpoint.tag or tag.startswith(slug.lower() + "/")
                             or tag == slug.lower())
                return how if served >= int(after) else None
        return None

    def counter(self, how: str, own):
        """The counter the other model's usage comes from (None: words)."""
        kind, value = split_how(how)
        if kind == "words":
            return None
        if kind == "system":  # (the body carries the injected prompt: counted as it is)
            return own if own is not None else _Words()
        from .token_counts import counter_for
        if kind == "tokenizer":
            return counter_for(value)
        if self.tokenizer is None:
            raise ValueError("impostor counts template=FILE needs --tokenizer")
        return counter_for(self.tokenizer, Path(value).read_text(encoding="utf-8"))
