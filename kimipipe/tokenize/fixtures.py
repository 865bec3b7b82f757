"""Small offline tokenizer directories shaped like Kimi K2.5's (for tests and the demo).

    python -m kimipipe.tokenize.fixtures kimipipe/data/tokenizers   # regenerate the bundled ones

Two kinds, both trained here on a small built-in corpus (byte-level BPE, ~1,500 tokens),
both with Kimi's special tokens and a K2.5-style chat template, so no download is needed:

- `kimi-k2.5-mini-tiktoken/`: packaged as Kimi K2.5 is: `tiktoken.model` (base64 token and
  rank per line), its own `tokenization_kimi.py` (`TikTokenTokenizer`, importing a sibling
  `tool_declaration_ts.py`), `tokenizer_config.json` with `auto_map` and
  `added_tokens_decoder`, `chat_template.jinja`. Load it with `trust_remote_code=True`.
  The special tokens sit at the same offsets past the base vocabulary as Kimi's
  (`[BOS]` +0, `[EOS]` +1, `<|im_end|>` +2, ... `<think>` +22, `</think>` +23).
- `kimi-k2.5-mini-fast/`: a Hugging Face fast tokenizer (`tokenizer.json`, tokenizers
  library) with the same special tokens as added special tokens and the same template.

The build is deterministic: the same code gives the same files byte for byte (a test checks
the bundled copies against a fresh build).
"""

from __future__ import annotations

import base64
import json
import shutil
import sys
from pathlib import Path

BUNDLED = Path(__file__).resolve().parent.parent / "data" / "tokenizers"
TIKTOKEN_NAME = "kimi-k2.5-mini-tiktoken"
# The tiktoken kind's trust_remote_code files are written by hand and kept in one place: the
# bundled directory itself (transformers imports them from the directory it loads), so a
# fresh build copies them from there.
REMOTE_CODE = BUNDLED / TIKTOKEN_NAME
FAST_NAME = "kimi-k2.5-mini-fast"
VOCAB_SIZE = 1500

# Kimi K2.5's special tokens, by their offset past the base vocabulary (163584 in the real
# model: [BOS] is 163584, <think> is 163606).
KIMI_SPECIAL_OFFSETS = {
    "[BOS]": 0, "[EOS]": 1, "<|im_end|>": 2, "<|im_user|>": 3, "<|im_assistant|>": 4,
    "<|start_header_id|>": 6, "<|end_header_id|>": 7, "[EOT]": 9, "<|im_system|>": 10,
    "<|im_middle|>": 17, "<think>": 22, "</think>": 23,
}

# A K2.5-style template: no default system prompt; history assistant turns render with an
# empty think block; the generation prompt opens <think> (or closes it at once when the
# `thinking` variable is false). No newlines between turns.
CHAT_TEMPLATE = """\
{%- macro render_content(msg) -%}
  {%- set c = msg.get('content') -%}
  {%- if c is string -%}
    {{- c -}}
  {%- elif c is not none -%}
    {%- for part in c -%}
      {%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- macro role_header(message) -%}
  {%- set name = message.get('name') or message['role'] -%}
  {%- if message['role'] == 'user' -%}
    <|im_user|>{{- name -}}<|im_middle|>
  {%- elif message['role'] == 'assistant' -%}
    <|im_assistant|>{{- name -}}<|im_middle|>
  {%- else -%}
    <|im_system|>{{- name -}}<|im_middle|>
  {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
  <|im_system|>tool_declare<|im_middle|>{{- tools_ts_str if tools_ts_str is defined else (tools | tojson) -}}<|im_end|>
{%- endif -%}
{%- for message in messages -%}
  {{- role_header(message) -}}
  {%- if message['role'] == 'assistant' -%}
    {%- if preserve_thinking is defined and preserve_thinking and message.get('reasoning_content') -%}
      <think>{{- message['reasoning_content'] -}}</think>
    {%- else -%}
      <think></think>
    {%- endif -%}
  {%- endif -%}
  {{- render_content(message) -}}<|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}
  <|im_assistant|>assistant<|im_middle|>
  {%- if thinking is defined and not thinking -%}
    <think></think>
  {%- else -%}
    <think>
  {%- endif -%}
{%- endif -%}
"""

CORPUS = """\
The quick brown fox jumps over the lazy dog. A drafter model learns to guess the next tokens
of a larger target model, so that the target only has to check them. Speculative decoding
turns one expensive step into a cheap guess and a parallel verification.
To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the
slings and arrows of outrageous fortune, or to take arms against a sea of troubles.
It was the best of times, it was the worst of times, it was the age of wisdom, it was the
age of foolishness. Call me Ishmael. Some years ago, never mind how long precisely, having
little or no money in my purse, I thought I would sail about a little and see the world.
Let me think about this step by step. First, we compute the sum: 2 + 2 = 4, and 3 * 7 = 21.
Then we check the answer again. The answer is 42. Wait, that is not right; let me recount.
User: What is the capital of France? Assistant: The capital of France is Paris.
What are the first three prime numbers? They are 2, 3 and 5. The next one is 7, then 11.
def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, i))

class Stack:
    def __init__(self):
        self.items = []
    def push(self, x):
        self.items.append(x)
{"id": "B3-0001", "messages": [{"role": "user", "content": "Hello"}], "usage": {"cost": 0.001}}
SELECT name, count(*) FROM users WHERE age > 30 GROUP BY name ORDER BY 2 DESC;
In the beginning the Universe was created. This has made a lot of people very angry and been
widely regarded as a bad move. The ships hung in the sky in much the same way that bricks don't.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828 1e-9 -17 +23 50% $12.50
我们今天学习中文。你好，世界！机器学习和自然语言处理是人工智能的重要领域。
今天天气很好，我们去公园散步吧。模型的推理过程需要仔细检查。
日本語の文章も少しだけ含めます。こんにちは、元気ですか。
Emoji: 😀 🎉 🚀 ❤️ 👍🏽 🇫🇷 — and symbols: © ® ™ € £ ¥ → ← ≤ ≥ ≠ ∑ ∫ √ ∞
Accents: café naïve résumé coöperate Ångström São Paulo Zürich Dvořák
Combining marks: e\u0301 a\u0308 n\u0303 o\u0302 (decomposed) versus é ä ñ ô (composed).
Markdown: # Title\n## Section\n- item one\n- item two\n**bold** _italic_ `code`
"""


def _corpus_lines() -> list[str]:
    # Repeat so that frequent pairs are learned; the order is fixed for determinism.
    return [line for _ in range(8) for line in CORPUS.splitlines()]


def train_bpe():
    """A byte-level BPE trained on CORPUS, Kimi's special tokens added as special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[],
    )
    tok.train_from_iterator(_corpus_lines(), trainer=trainer)
    return tok


# Kimi K2.5's tokenizer_config.json marks <think> and </think> as added tokens that are not
# special (tests/test_tokenize_parts.py checks this against the real files); the tiktoken
# kind copies that. (Kimi's code makes every one of them a control token either way.)
NOT_SPECIAL = frozenset({"<think>", "</think>"})


def _added_tokens_decoder(base: int) -> dict[str, dict]:
    return {
        str(base + offset): {"content": name, "lstrip": False, "normalized": False,
                             "rstrip": False, "single_word": False,
                             "special": name not in NOT_SPECIAL}
        for name, offset in sorted(KIMI_SPECIAL_OFFSETS.items(), key=lambda kv: kv[1])
    }


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


def build_fast(out: Path, bpe=None) -> Path:
    """The fast-tokenizer directory (tokenizer.json) with Kimi's special tokens."""
    from tokenizers import AddedToken

    bpe = bpe or train_bpe()
    data = json.loads(bpe.to_str())
    base = len(data["model"]["vocab"])
    # Special tokens at Kimi's offsets; the unnamed reserved IDs in between are left out
    # (a fast tokenizer's vocabulary may have gaps).
    tok = type(bpe).from_str(bpe.to_str())
    for name, offset in sorted(KIMI_SPECIAL_OFFSETS.items(), key=lambda kv: kv[1]):
        while tok.get_vocab_size(with_added_tokens=True) < base + offset:
            tok.add_special_tokens([AddedToken(f"<|reserved_token_{tok.get_vocab_size(True)}|>",
                                               special=True, normalized=False)])
        tok.add_special_tokens([AddedToken(name, special=True, normalized=False)])
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(
        json.dumps(json.loads(tok.to_str()), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": None, "unk_token": None,
        "model_max_length": 262144, "clean_up_tokenization_spaces": False,
        "add_bos_token": False, "add_eos_token": False,
    })
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return out


def build_tiktoken(out: Path, bpe=None) -> Path:
    """The Kimi-packaged directory: tiktoken.model + tokenization_kimi.py + auto_map."""
    from tokenizers.pre_tokenizers import ByteLevel

    bpe = bpe or train_bpe()
    data = json.loads(bpe.to_str())
    to_byte = {ch: b for b, ch in _bytes_to_unicode().items()}
    ranks: dict[bytes, int] = {bytes([b]): b for b in range(256)}
    assert len(ByteLevel.alphabet()) == 256
    for merge in data["model"]["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        token = bytes(to_byte[c] for c in left + right)
        ranks.setdefault(token, len(ranks))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "tiktoken.model", "w", encoding="ascii", newline="\n") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(token).decode('ascii')} {rank}\n")
    for name in ("tokenization_kimi.py", "tool_declaration_ts.py"):
        if (out / name).resolve() != (REMOTE_CODE / name).resolve():  # regenerating in place
            shutil.copyfile(REMOTE_CODE / name, out / name)
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "added_tokens_decoder": _added_tokens_decoder(len(ranks)),
        "additional_special_tokens": ["<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                                      "<|im_system|>", "<|im_middle|>"],
        "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[EOS]", "unk_token": "[EOS]",
        "model_max_length": 262144, "clean_up_tokenization_spaces": False,
    })
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return out


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte-to-character table (what byte-level BPE files spell bytes with)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


def build_all(root: Path) -> dict[str, Path]:
    bpe = train_bpe()
    return {
        "tiktoken": build_tiktoken(root / TIKTOKEN_NAME, bpe),
        "fast": build_fast(root / FAST_NAME, bpe),
    }


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else BUNDLED
    for kind, path in build_all(root).items():
        print(f"{kind}: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
