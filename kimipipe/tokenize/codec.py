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

Sampled tokens (token logprobs give each token's bytes) are named by their bytes:
`text_token_ids` looks each one up in the text vocabulary (tiktoken: its mergeable ranks;
a byte-level BPE tokenizer.json: the token string of those bytes in GPT-2's byte alphabet),
never through the encoder, which would re-segment them; `token_bytes` is the way back.
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

    def text_token_ids(self, tokens: list[bytes]) -> list[int | None]:
        """Each token's ID in the text vocabulary, by its bytes (None: no such text token,
        or a control token's): a sampled token named by what it spells."""
        raise NotImplementedError

    def token_bytes(self, ids: list[int]) -> list[bytes]:
        """Each ID's bytes (a control token's: its string's UTF-8)."""
        raise NotImplementedError


def byte_level_alphabet() -> dict[int, str]:
    """The byte-level BPE alphabet (GPT-2's `bytes_to_unicode`): each byte's character in a
    byte-level vocabulary's token strings (printable bytes stand for themselves, the rest
    are moved past U+0100)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


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

    def _byte_level(self) -> bool:
        """Whether the vocabulary is byte-level BPE (token strings in GPT-2's alphabet),
        checked once: the only kind whose tokens can be named by their bytes here."""
        if not hasattr(self, "_alphabet"):
            spec = json.loads(self.plain.to_str())
            kinds = {spec.get("decoder") and spec["decoder"].get("type"),
                     spec.get("pre_tokenizer") and spec["pre_tokenizer"].get("type")}
            for part in (spec.get("pre_tokenizer") or {}).get("pretokenizers") or ():
                kinds.add(part.get("type"))
            self._alphabet = byte_level_alphabet() if "ByteLevel" in kinds else None
            self._unalphabet = ({c: b for b, c in self._alphabet.items()}
                                if self._alphabet else None)
        return self._alphabet is not None

    def text_token_ids(self, tokens):
        if not self._byte_level():
            return [None] * len(tokens)
        alphabet, to_id = self._alphabet, self.plain.token_to_id
        return [to_id("".join(alphabet[b] for b in t)) if t else None for t in tokens]

    def token_bytes(self, ids):
        out = []
        added = self.full.get_added_tokens_decoder()
        byte_level = self._byte_level()
        for i in ids:
            if i in added:
                out.append(added[i].content.encode("utf-8"))
                continue
            token = self.plain.id_to_token(i) or ""
            if byte_level:
                try:
                    out.append(bytes(self._unalphabet[c] for c in token))
                    continue
                except KeyError:
                    pass
            out.append(self.plain.decode([i]).encode("utf-8"))
        return out


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

    def text_token_ids(self, tokens):
        # tiktoken's mergeable ranks name every text token by its bytes (encode_single_token
        # takes special tokens' strings too: those are control tokens, not text)
        encode, control = self.enc.encode_single_token, self.control_ids
        out: list[int | None] = []
        for t in tokens:
            try:
                tid = encode(t)
            except KeyError:
                tid = None
            out.append(None if tid is None or tid in control else tid)
        return out

    def token_bytes(self, ids):
        one = self.enc.decode_single_token_bytes
        out = []
        for i in ids:
            try:
                out.append(one(i))
            except KeyError:  # an added token the Encoding does not hold
                out.append(self.tok.decode([i]).encode("utf-8"))
        return out


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
