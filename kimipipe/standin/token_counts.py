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

The words still decide where `max_tokens` cuts an answer (answers.py), so a cut answer's
count can exceed `max_tokens`; the texts are the same either way.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .answers import Answer, message_text


class TokenCounter:
    def __init__(self, directory: str | Path):
        from ..tokenize.codec import make_codec
        from ..tokenize.load import load_tokenizer, offline_environment

        offline_environment()
        self.tok = load_tokenizer(Path(directory), trust_remote_code=True)
        self.codec = make_codec(self.tok)

    def prompt_tokens(self, messages: list[dict], thinking: bool) -> int:
        from ..tokenize.render import render_prompt

        conversation = [{"role": m.get("role"), "content": message_text(m.get("content"))}
                        for m in messages if isinstance(m, dict)]
        text = render_prompt(self.tok, conversation, thinking)
        return len(self.codec.encode_prompt([text])[0])

    def recount(self, messages: list[dict], answer: Answer, thinking: bool) -> Answer:
        reasoning, content = self.codec.encode_text([answer.reasoning or "", answer.content])
        sampled = len(reasoning) + len(content)
        if thinking and (answer.content or answer.finish_reason == "stop"):
            sampled += 1  # </think>
        if answer.finish_reason == "stop":
            sampled += 1  # the end-of-turn token
        return replace(answer, prompt_tokens=self.prompt_tokens(messages, thinking),
                       completion_tokens=sampled, reasoning_tokens=len(reasoning))
