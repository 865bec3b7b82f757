"""`usage` counted with a real tokenizer, as a serving stack counts it (`--tokenizer DIR`).

Without it the stand-in counts words (answers.py: a "token" is a word; the prompt is its
words plus 4 per message). With a tokenizer directory (its chat template included; loaded
with trust_remote_code, offline) the answer's counts are what a server running that model
reports:

    prompt_tokens      the messages' role and content rendered by the chat template with
                       the generation prompt (thinking on or off as asked), encoded as the
                       server encodes a prompt (control-token strings are control tokens)
    completion_tokens  every token sampled: the reasoning and the content encoded as text,
                       plus the `</think>` that ends the reasoning (thinking on, once the
                       content began) and the end-of-turn token of a finished turn
                       (`<|im_end|>`), which a server counts as generated
    reasoning_tokens   the reasoning's tokens

`max_tokens` cuts the answer in these tokens (answers.py `_counted_within`: the longest
run of its words whose count fits), so no answer is counted, nor billed, past it.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path

from .answers import Answer, message_text

_LOADED: dict[tuple[str, str | None], TokenCounter] = {}


def template_text(path: str | None) -> str | None:
    """The text of a `--chat-template FILE` (None: the tokenizer directory's own)."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


def counter_for(directory: str | Path, chat_template: str | None = None) -> TokenCounter:
    """DIRECTORY's counter (CHAT_TEMPLATE: a template's text), loaded once per process: a
    stand-in forked from a process that loaded it already (testing.py, `PRELOAD`) starts
    with it."""
    key = (str(Path(directory).resolve()), chat_template)
    if key not in _LOADED:
        _LOADED[key] = TokenCounter(directory, chat_template)
    return _LOADED[key]


class TokenCounter:
    """Counts through the tokenizer's own API (transformers' `apply_chat_template`, the
    tokenizer's `encode`), as a server does, not through kp-tokenize's code: the deltas
    kp-tokenize writes against these counts compare two ways of counting."""

    def __init__(self, directory: str | Path, chat_template: str | None = None):
        from ..tokenize.load import load_tokenizer, offline_environment

        offline_environment()
        self.tok = load_tokenizer(Path(directory), trust_remote_code=True,
                                  chat_template=chat_template)
        self.kimi_encode = "allow_special_tokens" in inspect.signature(self.tok.encode).parameters

    def _text_tokens(self, text: str) -> int:
        """TEXT's tokens as the model's text: special-token strings in it stay text."""
        if not text:
            return 0
        if self.kimi_encode:  # Kimi's TikTokenTokenizer
            return len(self.tok.encode(text, allow_special_tokens=False))
        return len(self.tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def prompt_tokens(self, messages: list[dict], thinking: bool) -> int:
        conversation = [{"role": m.get("role"), "content": message_text(m.get("content"))}
                        for m in messages if isinstance(m, dict)]
        ids = self.tok.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True,
                                           thinking=thinking, enable_thinking=thinking,
                                           return_dict=False)
        return len(ids)

    def recount(self, messages: list[dict], answer: Answer, thinking: bool) -> Answer:
        reasoning = self._text_tokens(answer.reasoning or "")
        sampled = reasoning + self._text_tokens(answer.content)
        if thinking and (answer.content or answer.finish_reason == "stop"):
            sampled += 1  # </think>
        if answer.finish_reason == "stop":
            sampled += 1  # the end-of-turn token
        return replace(answer, prompt_tokens=self.prompt_tokens(messages, thinking),
                       completion_tokens=sampled, reasoning_tokens=reasoning)
