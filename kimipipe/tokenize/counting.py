"""The target model's own token counts of what kp-infer sends and gets back (`--tokenizer`).

kp-infer checks every answer's `usage` against these (infer/identity.py). They are
kp-tokenize's, made by kp-tokenize's own parts: the tokenizer loaded as `Engine` loads it
(load.py, offline; `--trust-remote-code`, `--chat-template`), its preset's turn layout
checked against the template, the prompt rendered by `PromptRenderer` (render.py) and
encoded as a serving stack encodes a rendered prompt (codec.py), so the count kp-infer
checks an answer against is `len(input_ids)` of the row kp-tokenize will make of it:

    prompt_tokens(messages)     (and `prompt_tokens_many`, a batch of prompts at once)
                                the messages (role, content, and an earlier turn's
                                `reasoning` as its `reasoning_content`: fields.py, as
                                kp-tokenize renders a record) through the chat template
                                with the generation prompt, thinking as asked
    completion_tokens(...)      the generated turn as the preset lays it out: the reasoning
                                and the content encoded as text, plus the structural tokens
                                the model emits (`</think>`, the end-of-turn token; a turn
                                cut by `length` ends where its text ends), which a serving
                                stack counts as generated
    rendered(messages)          the prompt's text, for a message that shows it

Loading imports transformers (a second or two with Kimi's real tokenizer): only a run with
`--tokenizer` imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence

from .engine import Engine, Settings
from .fields import template_messages


class TargetCounts:
    """The counts of one target model (SETTINGS: the tokenizer, its template, thinking)."""

    def __init__(self, settings: Settings):
        self.engine = Engine(settings)
        self._render = self.engine.renderer.render
        self._encode_prompt = self.engine.codec.encode_prompt
        self._encode_text = self.engine.codec.encode_text
        self._segments = self.engine.layout.segments

    def describe(self) -> str:
        return self.engine.describe()

    def rendered(self, messages: Sequence) -> str:
        """MESSAGES (records.Message or fields.SeenMessage) as the template renders them for
        generation; raises what the template raised."""
        [text] = self._render([template_messages(list(messages))])
        if isinstance(text, Exception):
            raise text
        return text

    def prompt_tokens(self, messages: Sequence) -> int:
        return len(self._encode_prompt([self.rendered(messages)])[0])

    def prompt_tokens_many(self, conversations: list[Sequence]) -> list[int | None]:
        """`prompt_tokens` of each conversation, rendered and encoded as one batch (the
        renderer's batched path); None for one the template cannot render."""
        texts = self._render([template_messages(list(m)) for m in conversations])
        ok = [t for t in texts if not isinstance(t, Exception)]
        lengths = iter(len(ids) for ids in self._encode_prompt(ok)) if ok else iter(())
        return [None if isinstance(t, Exception) else next(lengths) for t in texts]

    def completion_tokens(self, reasoning: str | None, content: str, truncated: bool) -> int:
        pieces = self._segments(reasoning or "", content, truncated)
        texts = [text for is_token, text in pieces if not is_token]
        return (len(pieces) - len(texts)) + sum(len(ids) for ids in self._encode_text(texts))
