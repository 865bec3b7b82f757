"""The stand-in's deterministic answers: a pure function of the request.

Tests use `expected_answer` (or `answer_for_request`) to check that a record holds exactly
the answer to its own prompt: the content names the first 12 hex digits of the sha256 of
the last user message, and every word is drawn from an RNG seeded by that hash, the model
and the request's `seed`.

A request whose history holds an assistant turn (a conversation's later turn) is answered
from the whole history: `history_sha256(messages)` hashes every message's role, text and
reasoning (`reasoning`, `reasoning_content` or `reasoning_details` text), its first 12 hex
digits follow the tag in the content (`Answer [tag] [h:history]:`) and it seeds the RNG
too. So a test proves from an answer alone which earlier answers, and which earlier
reasoning, the request carried.

A "token" here is one whitespace-separated word together with its leading whitespace
(" word", "\\nword"; the first token has none), so streaming one token per chunk and
joining the deltas gives the text back exactly. The texts carry non-ASCII (CJK, emoji,
accents) and, now and then, a literal `<|im_end|>` or `<think>` that a tokenizer must
treat as plain text.

Sampling: the words also depend on the temperature and top_p the serving provider applied,
but only where those differ from the values the model is served at by default
(`SERVED_SAMPLING`: Kimi K2.5 thinking at temperature 1.0, top_p 0.95; instant at 0.6,
0.95), so a request that sends the model's own values gets the same answer as one that
sends none, and an answer sampled otherwise is observably different. A provider that does
not support temperature/top_p serves at its own fixed `PROVIDER_OWN_SAMPLING` whatever the
request says (`answer_for_request(body, honours_sampling=False)`).

Provider quirks (`answer_for_request(..., drop_reasoning=True)` or `inline_reasoning=True`):
a dropped reasoning leaves the content only (reasoning_tokens 0); an inline one moves the
reasoning into the content as `<think>\n...\n</think>\n\n` (reasoning_tokens 0, the
completion tokens unchanged; with the reasoning cut by max_tokens and no content, the
`</think>` never comes); an unopened one (`unopened_reasoning=True`: no reasoning parser,
the `<think>` was the prompt's) as `reasoning</think>content`.

Usage counts are words unless a `counter` (token_counts.TokenCounter, the stand-in's
`--tokenizer DIR`) recounts them with a real tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field, replace
from typing import Any, Literal

# The models the stand-in serves; the value says whether reasoning is on by default.
REASONING_DEFAULT = {
    "moonshotai/kimi-k2.5": True,
    "moonshotai/kimi-k2-thinking": True,
    "moonshotai/kimi-k2.6": True,
    "moonshotai/kimi-k2-0905": False,
}

WORDS = (
    "the", "model", "answer", "because", "value", "first", "then", "which", "returns", "a",
    "list", "of", "tokens", "and", "we", "check", "each", "step", "carefully", "so", "that",
    "result", "is", "correct", "in", "practice", "this", "means", "one", "more", "time",
    "function", "data", "training", "drafter", "sequence", "probability", "naïve", "café",
    "résumé", "数据", "模型", "训练", "答案", "思考", "東京", "🙂", "🚀", "∑", "→", "x²", "—",
    "Ελληνικά", "русский", "(see", "above)", "42,", "3.14", "e.g.", "\"quoted\"", "it's",
)
# Literal special-token strings: plain text to the API, traps for a careless tokenizer.
SPECIAL = ("<|im_end|>", "<think>", "</think>", "<|im_start|>")

MIN_WORDS = 20
MAX_WORDS = 120

SAMPLING_PARAMETERS = ("temperature", "top_p")
# The sampling each model is served at when a request leaves it out, by reasoning on/off
# (Moonshot's model card: thinking at temperature 1.0, top_p 0.95; instant at 0.6).
SERVED_SAMPLING: dict[str, dict[bool, dict[str, float]]] = {
    "moonshotai/kimi-k2.5": {True: {"temperature": 1.0, "top_p": 0.95},
                             False: {"temperature": 0.6, "top_p": 0.95}},
    "moonshotai/kimi-k2-thinking": {True: {"temperature": 1.0, "top_p": 0.95},
                                    False: {"temperature": 0.6, "top_p": 0.95}},
    "moonshotai/kimi-k2.6": {True: {"temperature": 1.0, "top_p": 0.95},
                             False: {"temperature": 0.6, "top_p": 0.95}},
    "moonshotai/kimi-k2-0905": {True: {"temperature": 0.6, "top_p": 1.0},
                                False: {"temperature": 0.6, "top_p": 1.0}},
}
# What a provider that does not support temperature/top_p samples at, whatever is sent.
PROVIDER_OWN_SAMPLING = {"temperature": 0.7, "top_p": 1.0}
THINK_OPEN = "<think>\n"
THINK_CLOSE = "\n</think>\n\n"


@dataclass(frozen=True)
class Answer:
    """What the stand-in returns for one request (before any fault)."""

    reasoning: str | None
    content: str
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    # The same texts split into tokens (one streamed delta each); joined they give the texts.
    reasoning_pieces: tuple[str, ...] = field(default=(), repr=False)
    content_pieces: tuple[str, ...] = field(default=(), repr=False)


def message_text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a parts list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def last_user_text(messages: list[dict]) -> str:
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            return message_text(m.get("content"))
    return ""


def user_text_sha256(messages: list[dict]) -> str:
    """Hex sha256 of the last user message's text (UTF-8): the ledger's request key."""
    return hashlib.sha256(last_user_text(messages).encode("utf-8")).hexdigest()


def message_reasoning(m: dict) -> str:
    """The reasoning a message carries back in a history (any of the fields clients use)."""
    for name in ("reasoning", "reasoning_content"):
        if isinstance(m.get(name), str) and m[name]:
            return m[name]
    details = m.get("reasoning_details")
    if isinstance(details, list):
        return "".join(d.get("text") or "" for d in details
                       if isinstance(d, dict) and isinstance(d.get("text"), str))
    return ""


def has_history(messages: list[dict]) -> bool:
    """Whether the request holds an earlier assistant turn (a conversation's later turn)."""
    return any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages)


def history_sha256(messages: list[dict]) -> str:
    """Hex sha256 of the whole history: every message's role, text and reasoning."""
    canon = json.dumps([[m.get("role"), message_text(m.get("content")), message_reasoning(m)]
                        for m in messages if isinstance(m, dict)],
                       ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def count_prompt_tokens(messages: list[dict]) -> int:
    """Words in every message plus 4 per message (a stand-in for chat-template overhead)."""
    total = 0
    for m in messages:
        total += 4 + len(message_text(m.get("content") if isinstance(m, dict) else None).split())
    return total


def wants_reasoning(body: dict, model: str) -> bool:
    """Whether a request asks for reasoning, by OpenRouter's rules, with the model's default."""
    r = body.get("reasoning")
    if isinstance(r, dict):
        if r.get("enabled") is False or r.get("effort") == "none":
            return False
        if r.get("enabled") or r.get("effort") or r.get("max_tokens") or r == {}:
            return True
    if body.get("reasoning_effort") == "none":
        return False
    if body.get("reasoning_effort") or body.get("include_reasoning") is True:
        return True
    if body.get("include_reasoning") is False:
        return False
    return REASONING_DEFAULT.get(model, False)


def _pieces(rng: random.Random, first: list[str], n: int) -> list[str]:
    """n tokens: the given opening words, then random words with leading whitespace;
    about one answer in four carries one literal special-token string."""
    words = list(first)
    while len(words) < n:
        words.append(rng.choice(WORDS))
    if rng.random() < 0.25:
        words[rng.randrange(len(first), n)] = rng.choice(SPECIAL)
    pieces = [words[0]]
    for i, w in enumerate(words[1:n], start=1):
        pieces.append(("\n" if i >= len(first) and rng.random() < 0.05 else " ") + w)
    return pieces


def default_sampling_of(model: str, reasoning: bool) -> dict[str, float]:
    """The temperature and top_p a model is served at when the request sends none."""
    return dict(SERVED_SAMPLING.get(model, {}).get(reasoning, {}))


def sampling_key(model: str, reasoning: bool, temperature: float | None,
                 top_p: float | None) -> str:
    """What the sampling adds to an answer's RNG seed: nothing at the model's own values."""
    served = default_sampling_of(model, reasoning)
    applied = {"temperature": temperature if temperature is not None
               else served.get("temperature"),
               "top_p": top_p if top_p is not None else served.get("top_p")}
    if all(applied[k] == served.get(k) for k in SAMPLING_PARAMETERS):
        return ""
    return "".join(f"|{k}={float(v)!r}" for k, v in applied.items() if v is not None)


def applied_sampling(body: dict, *, honours_sampling: bool = True
                     ) -> tuple[dict[str, float], list[str]]:
    """(the temperature/top_p a provider samples this request at, the names it dropped).

    A provider that honours them applies what was sent and its served defaults for the
    rest; one that does not applies `PROVIDER_OWN_SAMPLING` and drops what was sent."""
    model = body.get("model") or ""
    sent = {k: float(body[k]) for k in SAMPLING_PARAMETERS
            if isinstance(body.get(k), (int, float)) and not isinstance(body.get(k), bool)}
    if not honours_sampling:
        return dict(PROVIDER_OWN_SAMPLING), sorted(sent)
    return {**default_sampling_of(model, wants_reasoning(body, model)), **sent}, []


def expected_answer(messages: list[dict], *, model: str, seed: int | None, reasoning: bool,
                    max_tokens: int | None, exclude_reasoning: bool = False,
                    temperature: float | None = None, top_p: float | None = None,
                    drop_reasoning: bool = False) -> Answer:
    """The stand-in's answer to a chat request (see the module docstring).

    `max_tokens` cuts the reasoning first, then the content; a cut answer ends with
    `finish_reason: "length"` (content may be "" when the reasoning ate every token).
    `exclude_reasoning` (the request's `reasoning.exclude`) keeps the reasoning tokens
    (and their bill) but returns no reasoning text. `temperature`/`top_p` are the values
    applied (None: the model's served default). `drop_reasoning`: the same words as the
    reasoned answer, without its reasoning (a provider that lost it, not a different
    sample).
    """
    digest = user_text_sha256(messages)
    tag = digest[:12]
    key = f"{digest}|{model}|{seed}" + sampling_key(model, reasoning, temperature, top_p)
    opening = ["Answer", f"[{tag}]:"]
    if has_history(messages):  # a later turn: the answer depends on the whole history
        history = history_sha256(messages)
        key += f"|history={history}"
        opening = ["Answer", f"[{tag}]", f"[h:{history[:12]}]:"]
    rng = random.Random(hashlib.sha256(key.encode()).digest())
    n_content = rng.randint(MIN_WORDS, MAX_WORDS)
    n_reasoning = rng.randint(MIN_WORDS, MAX_WORDS)
    content = _pieces(rng, opening, n_content)
    thought = _pieces(rng, ["Thinking", "about", f"[{tag}]:"], n_reasoning) if reasoning else []
    if drop_reasoning:
        thought, reasoning = [], False
    finish: Literal["stop", "length"] = "stop"
    if max_tokens is not None and len(thought) + len(content) > max_tokens:
        finish = "length"
        if len(thought) >= max_tokens:
            thought, content = thought[:max_tokens], []
        else:
            content = content[:max_tokens - len(thought)]
    n_thought = len(thought)
    if exclude_reasoning:
        thought = []
    return Answer(
        reasoning="".join(thought) if reasoning and not exclude_reasoning else None,
        content="".join(content),
        finish_reason=finish,
        prompt_tokens=count_prompt_tokens(messages),
        completion_tokens=n_thought + len(content),
        reasoning_tokens=n_thought,
        reasoning_pieces=tuple(thought),
        content_pieces=tuple(content),
    )


def answer_for_request(body: dict, *, honours_sampling: bool = True,
                       drop_reasoning: bool = False, inline_reasoning: bool = False,
                       unopened_reasoning: bool = False, counter=None) -> Answer:
    """The answer the stand-in gives to this chat request body (no faults), from a provider
    that honours (or not) temperature/top_p, and drops or inlines the reasoning (or not);
    COUNTER (token_counts.TokenCounter): its usage counted with a real tokenizer."""
    model = body.get("model") or ""
    r = body.get("reasoning")
    exclude = isinstance(r, dict) and bool(r.get("exclude"))
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_completion_tokens")
    applied, _ = applied_sampling(body, honours_sampling=honours_sampling)
    reasoning = wants_reasoning(body, model)
    messages = body.get("messages") or []
    # With a counter, max_tokens cuts in the counter's tokens (a server never generates,
    # nor bills, more than max_tokens), so the words are cut after counting
    answer = expected_answer(messages, model=model, seed=body.get("seed"),
                             reasoning=reasoning, max_tokens=None if counter else max_tokens,
                             exclude_reasoning=exclude and counter is None,
                             drop_reasoning=drop_reasoning,
                             temperature=applied.get("temperature"), top_p=applied.get("top_p"))
    if counter is not None:
        answer = _counted_within(counter, messages, answer, reasoning, max_tokens)
        if exclude:  # (its tokens, counted above, stay billed)
            answer = replace(answer, reasoning=None, reasoning_pieces=())
    if inline_reasoning or unopened_reasoning:
        answer = with_inline_reasoning(answer, opened=not unopened_reasoning)
    return answer


def _counted_within(counter, messages: list[dict], answer: Answer, thinking: bool,
                    max_tokens: int | None) -> Answer:
    """ANSWER recounted by COUNTER and, past MAX_TOKENS of it, cut to the longest run of
    its pieces (the reasoning's first) whose count fits: `finish_reason: "length"`."""
    counted = counter.recount(messages, answer, thinking)
    if max_tokens is None or counted.completion_tokens <= max_tokens:
        return counted
    pieces = answer.reasoning_pieces + answer.content_pieces
    n_thought = len(answer.reasoning_pieces)

    def cut(keep: int) -> Answer:
        thought, content = pieces[:min(keep, n_thought)], pieces[n_thought:keep]
        return counter.recount(messages, replace(
            answer, reasoning="".join(thought) if answer.reasoning is not None else None,
            content="".join(content), finish_reason="length", reasoning_pieces=thought,
            content_pieces=content, completion_tokens=keep,  # (in words, for a counter
            reasoning_tokens=len(thought)), thinking)        # that counts words)

    low, high = 0, len(pieces) - 1  # (the longest prefix that fits: a bisection)
    while low < high:
        mid = (low + high + 1) // 2
        if cut(mid).completion_tokens <= max_tokens:
            low = mid
        else:
            high = mid - 1
    return cut(low)


def with_inline_reasoning(answer: Answer, opened: bool = True) -> Answer:
    """The answer as a provider that puts the reasoning in the content gives it; OPENED
    false: a stack with no reasoning parser, whose prompt held the `<think>` (Kimi's
    generation prompt), returns the raw generation: reasoning, a lone `</think>`, content."""
    if answer.reasoning is None:
        return answer
    pieces = [THINK_OPEN, *answer.reasoning_pieces] if opened else [*answer.reasoning_pieces]
    if answer.content_pieces or answer.finish_reason == "stop":
        pieces += [THINK_CLOSE if opened else "</think>", *answer.content_pieces]
    return Answer(reasoning=None, content="".join(pieces), finish_reason=answer.finish_reason,
                  prompt_tokens=answer.prompt_tokens,
                  completion_tokens=answer.completion_tokens, reasoning_tokens=0,
                  reasoning_pieces=(), content_pieces=tuple(pieces))
