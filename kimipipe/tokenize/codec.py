"""Text to IDs and back, for the two kinds of tokenizer kimipipe knows.

Three operations matter, and each kind needs its own reliable way to do them:

| operation | HF fast tokenizer (tokenizer.json) | tiktoken-backed (Kimi's TikTokenTokenizer) |
|---|---|---|
| `encode_text`: generated text as plain text | the Rust tokenizer with every added token removed | `encode(t, allow_special_tokens=False)` (tiktoken `disallowed_special=()`) |
| `encode_prompt`: a rendered prompt, as a serving stack does | the Rust tokenizer, added tokens matched | `encode(t)` (special-token strings are control tokens) |
| `decode` | Rust `decode_batch`, special tokens kept | tiktoken's `decode` |

Why not `split_special_tokens=True` for fast tokenizers: it only stops *special* added
tokens from matching. Qwen3's and DeepSeek-R1's `<think>`/`</think>` are added tokens that
are not special, so a literal `</think>` in a model's answer would still become the control
token. Removing all added tokens from a copy of the tokenizer leaves exactly the BPE
pipeline (normalizer, pre-tokenizer, model) that text between control tokens goes through.

Truncation and padding configured in a tokenizer.json are switched off: a row is never
silently cut here.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from .load import TokenizerLoadError


class Codec:
    kind = "?"
    control_ids: frozenset[int] = frozenset()

    def encode_text(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def encode_prompt(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def decode(self, sequences: list[list[int]]) -> list[str]:
        raise NotImplementedError

    def token_id(self, token: str) -> int | None:
        """The ID of TOKEN if a rendered text holding it yields exactly that one control token."""
        raise NotImplementedError


class FastCodec(Codec):
    kind = "fast"

    def __init__(self, hf_tokenizer: Any):
        from tokenizers import Tokenizer

        backend = hf_tokenizer.backend_tokenizer
        spec = backend.to_str()
        self.full = Tokenizer.from_str(spec)
        self.full.no_truncation()
        self.full.no_padding()
        data = json.loads(spec)
        data["added_tokens"] = []
        self.plain = Tokenizer.from_str(json.dumps(data))
        self.plain.no_truncation()
        self.plain.no_padding()
        self.control_ids = frozenset(self.full.get_added_tokens_decoder())

    def encode_text(self, texts):
        return [e.ids for e in self.plain.encode_batch_fast(texts, add_special_tokens=False)]

    def encode_prompt(self, texts):
        return [e.ids for e in self.full.encode_batch_fast(texts, add_special_tokens=False)]

    def decode(self, sequences):
        return self.full.decode_batch(sequences, skip_special_tokens=False)

    def token_id(self, token):
        tid = self.full.token_to_id(token)
        if tid is None or self.encode_prompt([token]) != [[tid]]:
            return None
        return tid


class TiktokenCodec(Codec):
    """Kimi's TikTokenTokenizer, called the way its own `encode` works, minus its Python loop.

    Kimi's `encode` cuts the text into slices (at most 400,000 characters, and no run of more
    than 25,000 spaces or non-spaces) with a per-character Python loop, then tiktoken-encodes
    each slice. A text with no such long run is one slice, so tiktoken's own encode of the
    whole text gives the same IDs at Rust speed; texts with a long run (or a tokenizer whose
    `pre_tokenizer_process` splits text) go through the tokenizer's `encode` itself. A test
    holds both paths to `encode`'s output. A prompt's special tokens are allowed as
    tiktoken's "all" allows them, by naming the ones the text holds (`_specials_in`: every
    match tiktoken can find is one of them), which spares it converting all of them.
    """

    kind = "tiktoken"
    _LONG_RUN = re.compile(r"\s{25001}|\S{25001}")
    _MAX_CHARS = 400_000
    _HEAD = 5  # characters a special token is looked up by (Kimi's shortest: [BOS])

    def __init__(self, hf_tokenizer: Any):
        self.tok = hf_tokenizer
        self.enc = hf_tokenizer.model
        ids = set(getattr(hf_tokenizer, "special_tokens", {}).values())
        ids.update(int(i) for i in getattr(hf_tokenizer, "added_tokens_decoder", {}))
        self.control_ids = frozenset(ids)
        probe = "a  b\n"
        self.whole_text_ok = (hf_tokenizer.pre_tokenizer_process(probe) == [probe]
                              if hasattr(hf_tokenizer, "pre_tokenizer_process") else False)
        # tiktoken's encode with allowed_special="all" hands all 256 special strings to its
        # Rust core on every call (~90 us of a ~110 us encode of a short prompt); the ones a
        # text holds are all it can match, so those are what it is given (`_specials_in`)
        self._heads: dict[str, list[str]] = {}
        specials = self.enc.special_tokens_set
        for token in specials:
            self._heads.setdefault(token[:self._HEAD], []).append(token)
        self._firsts = sorted({token[0] for token in specials if token})
        self._exact_heads = (bool(specials) and len(self._firsts) <= 8
                             and min(map(len, specials)) >= self._HEAD)

    def _one_slice(self, text: str) -> bool:
        return self.whole_text_ok and len(text) <= self._MAX_CHARS and not self._LONG_RUN.search(text)

    def encode_text(self, texts):
        enc, encode = self.enc, self.tok.encode
        return [enc.encode_ordinary(t) if self._one_slice(t) else encode(t, allow_special_tokens=False)
                for t in texts]

    def _specials_in(self, text: str):
        """The special-token strings TEXT holds (where they could match), or "all"."""
        if not self._exact_heads:
            return "all"
        found, heads, size = set(), self._heads, self._HEAD
        for first in self._firsts:
            at = text.find(first)
            while at >= 0:
                for token in heads.get(text[at:at + size], ()):
                    if text.startswith(token, at):
                        found.add(token)
                at = text.find(first, at + 1)
        return found

    def encode_prompt(self, texts):
        enc, encode = self.enc, self.tok.encode
        return [enc.encode(t, allowed_special=self._specials_in(t), disallowed_special=())
                if self._one_slice(t) else encode(t, allow_special_tokens=True) for t in texts]

    def decode(self, sequences):
        decode = self.tok.decode
        return [decode(list(s)) for s in sequences]

    def token_id(self, token):
        ids = self.encode_prompt([token])[0]
        if len(ids) != 1 or ids[0] not in self.control_ids:
            return None
        return ids[0]


def _is_tiktoken_backed(tok: Any) -> bool:
    try:
        import tiktoken
    except ImportError:
        return False
    if not isinstance(getattr(tok, "model", None), tiktoken.Encoding):
        return False
    try:
        return "allow_special_tokens" in inspect.signature(tok.encode).parameters
    except (TypeError, ValueError):
        return False


def make_codec(tok: Any) -> Codec:
    if _is_tiktoken_backed(tok):
        return TiktokenCodec(tok)
    if getattr(tok, "is_fast", False) and getattr(tok, "backend_tokenizer", None) is not None:
        return FastCodec(tok)
    raise TokenizerLoadError(
        f"unsupported tokenizer class {type(tok).__name__}: kp-tokenize knows Hugging Face fast "
        "tokenizers (tokenizer.json) and tiktoken-backed ones shipped with their code (Kimi's "
        "TikTokenTokenizer, with --trust-remote-code)")
