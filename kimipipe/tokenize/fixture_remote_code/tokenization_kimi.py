"""A tiktoken-backed tokenizer class packaged the way Kimi K2.5's is (a test fixture).

Kimi K2.5 ships `tokenization_kimi.py` with a `TikTokenTokenizer(PreTrainedTokenizer)`,
loaded by `AutoTokenizer.from_pretrained(dir, trust_remote_code=True)` through the
`auto_map` of `tokenizer_config.json`. This file keeps the same API surface, written for
kimipipe's offline fixtures:

- `tiktoken.model` holds the BPE ranks (base64 token, space, rank per line); the special
  tokens occupy the `num_reserved_special_tokens` IDs right after the base vocabulary,
  named by `added_tokens_decoder` (the rest are `<|reserved_token_N|>`);
- `encode(text, allow_special_tokens=True)`: special-token strings in TEXT become control
  tokens unless `allow_special_tokens=False`; any other keyword argument goes through
  `PreTrainedTokenizer.encode`;
- `decode(ids)` is tiktoken's decode; `apply_chat_template(..., thinking=True)` passes
  `thinking` (and `tools_ts_str` when tools are given) to the chat template.
It imports what Kimi's imports: tiktoken, tokenizers, transformers, and a sibling module
by a relative import.
"""

import os
from collections.abc import Iterator
from logging import getLogger
from pathlib import Path
from shutil import copyfile
from typing import Any

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tokenizers import AddedToken
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.tokenization_utils import PreTrainedTokenizer

from .tool_declaration_ts import encode_tools_to_typescript_style

logger = getLogger(__name__)
VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}

# tiktoken panics on very long inputs and is slow on very long runs of one character
# class: encode in slices.
MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]
    num_reserved_special_tokens = 256

    pat_str = "|".join([
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ])

    def __init__(self, vocab_file, bos_token: str | AddedToken = "[BOS]",
                 eos_token: str | AddedToken = "[EOS]", unk_token: str | AddedToken | None = None,
                 pad_token: str | AddedToken | None = None,
                 additional_special_tokens: list[str] | None = None,
                 added_tokens_decoder: dict | None = None, **kwargs):
        if not os.path.isfile(vocab_file):
            raise FileNotFoundError(vocab_file)
        if additional_special_tokens is None:
            additional_special_tokens = ["<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                                         "<|im_system|>", "<|im_middle|>"]
        names = {i: tok.content for i, tok in (added_tokens_decoder or {}).items()}
        self.vocab_file = vocab_file
        ranks = load_tiktoken_bpe(vocab_file)
        base = len(ranks)
        self.special_tokens = {
            names.get(i, f"<|reserved_token_{i}|>"): i
            for i in range(base, base + self.num_reserved_special_tokens)
        }
        self.model = tiktoken.Encoding(name=Path(vocab_file).name, pat_str=self.pat_str,
                                       mergeable_ranks=ranks, special_tokens=self.special_tokens)
        self.n_words: int = self.model.n_vocab
        self.bos_id = self.special_tokens[str(bos_token)]
        self.eos_id = self.special_tokens[str(eos_token)]
        self.pad_id = self.special_tokens.get(str(pad_token))
        self.unk_id = self.special_tokens.get(str(unk_token))

        # The "token strings" PreTrainedTokenizer works with: GPT-2's byte-to-unicode spelling.
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in self.byte_encoder.items()}
        self.decoder = {
            i: "".join(self.byte_encoder[b] for b in self.model.decode_single_token_bytes(i))
            for i in range(self.n_words)
        }
        self.encoder = {s: i for i, s in self.decoder.items()}

        super().__init__(bos_token=bos_token, eos_token=eos_token, unk_token=unk_token,
                         pad_token=pad_token, additional_special_tokens=additional_special_tokens,
                         added_tokens_decoder=added_tokens_decoder, **kwargs)
        self.all_special_ids_set = set(self.all_special_ids)

    def encode(self, text: str, allow_special_tokens: bool = True, **kwargs) -> list[int]:
        if kwargs:
            return super().encode(text, **kwargs)
        special = {"allowed_special": "all"} if allow_special_tokens else {"disallowed_special": ()}
        ids: list[int] = []
        for piece in self.pre_tokenizer_process(text):
            for start in range(0, len(piece), MAX_ENCODE_CHARS):
                for run in self._split_long_runs(piece[start:start + MAX_ENCODE_CHARS], MAX_RUN_CHARS):
                    ids.extend(self.model.encode(run, **special))
        return ids

    def decode(self, token_ids: int | list[int], **kwargs) -> str:
        if kwargs:
            return super().decode(token_ids, **kwargs)
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        return self.model.decode(list(token_ids))

    @staticmethod
    def _split_long_runs(s: str, limit: int) -> Iterator[str]:
        """S in slices holding no more than LIMIT consecutive spaces or non-spaces."""
        start = 0
        run = 0
        in_space = s[:1].isspace()
        for i, ch in enumerate(s):
            if ch.isspace() != in_space:
                in_space = not in_space
                run = 1
                continue
            run += 1
            if run > limit:
                yield s[start:i]
                start = i
                run = 1
        yield s[start:]

    def pre_tokenizer_process(self, text: str) -> list[str]:
        return [text]

    @property
    def vocab_size(self) -> int:
        return self.n_words

    def get_vocab(self) -> dict[str, int]:
        return dict(self.encoder)

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return [self.decoder[t] for t in self.encode(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoder.get(token, self.unk_id)

    def _convert_id_to_token(self, index: int) -> str:
        return self.decoder.get(index)

    @staticmethod
    def clean_up_tokenization(out_string: str) -> str:
        return out_string

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return bytes(self.byte_decoder[c] for c in "".join(tokens)).decode("utf-8", "replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        out = os.path.join(save_directory,
                           (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILES_NAMES["vocab_file"])
        if os.path.abspath(self.vocab_file) != os.path.abspath(out):
            copyfile(self.vocab_file, out)
        return (out,)

    def apply_chat_template(self, conversation, tools: list[dict] | None = None, tokenize: bool = False,
                            add_generation_prompt: bool = True, thinking: bool = True,
                            preserve_thinking: bool = False, **kwargs):
        tools = _sorted_deep(tools)
        if tools:
            kwargs["tools_ts_str"] = encode_tools_to_typescript_style(tools)
        return super().apply_chat_template(conversation, tools=tools, tokenize=tokenize,
                                           add_generation_prompt=add_generation_prompt,
                                           thinking=thinking, preserve_thinking=preserve_thinking,
                                           **kwargs)


def _sorted_deep(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _sorted_deep(v) for k, v in sorted(obj.items())}
    if isinstance(obj, list):
        return [_sorted_deep(v) for v in obj]
    return obj
