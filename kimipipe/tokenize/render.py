"""The prompt as the target model saw it, and the generated turn as the model emitted it.

The prompt comes from the model's own chat template (`add_generation_prompt=True`, the
`thinking`/`enable_thinking` variable set from `--thinking/--no-thinking`, no extra system
prompt). The generated turn is not something every template renders (Kimi K2 Thinking's
drops the reasoning of finished turns), so its layout comes from a preset, checked against
the template wherever the template can render a finished turn with its reasoning
(`Engine._check_template`). A preset is a pattern over the reasoning, the content and the
structural token *strings*, e.g. for Kimi K2.5 with thinking

    {reasoning}</think>{content}<|im_end|>

Structural tokens are looked up in the tokenizer by their string (never a hard-coded ID) and
inserted by ID; the text between them (reasoning and content, plus any literal newlines of
the layout) is encoded as plain text in one run, as the template's rendering would be.
A turn cut by `finish_reason: "length"` ends where its text ends: after the reasoning if
there is no content (no `</think>`), else after the content (no end-of-turn token).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from ..errors import ExitCode, KPError


class SetupError(KPError):
    exit_code = ExitCode.USAGE


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    structural: tuple[str, ...]
    # What the rendered prompt ends with, and the generated turn's layout, by thinking on/off.
    prompt_ends: dict[bool, str]
    turn: dict[bool, str]
    # Token strings that identify the model family (for --preset auto).
    detect: tuple[str, ...] = field(default=())
    # Variables the model's server passes its chat template (K2.6: `preserve_thinking`,
    # so earlier turns' reasoning renders in the history).
    template_kwargs: tuple[tuple[str, object], ...] = ()


_KIMI_K25 = Preset(
    name="kimi-k2.5",
    description="Kimi K2.5 / K2 Thinking: prompt ends <think>; reasoning</think>content<|im_end|>",
    structural=("<think>", "</think>", "<|im_end|>"),
    prompt_ends={True: "<think>", False: "<think></think>"},
    turn={True: "{reasoning}</think>{content}<|im_end|>", False: "{content}<|im_end|>"},
    detect=("<|im_assistant|>", "<|im_middle|>"),
)

PRESETS: dict[str, Preset] = {
    "kimi-k2.5": _KIMI_K25,
    # K2.5's successor: the same tokenizer family and turn layout (so `auto`, which cannot
    # tell the two tokenizers apart, picks kimi-k2.5: name this one), served with
    # `preserve_thinking`: history turns keep their reasoning.
    "kimi-k2.6": replace(
        _KIMI_K25, name="kimi-k2.6",
        description="Kimi K2.6: as kimi-k2.5, the history rendered with preserve_thinking",
        template_kwargs=(("preserve_thinking", True),)),
    "qwen3": Preset(
        name="qwen3",
        description="Qwen3: <think>\\nreasoning\\n</think>\\n\\ncontent<|im_end|>",
        structural=("<think>", "</think>", "<|im_end|>"),
        prompt_ends={True: "<|im_start|>assistant\n", False: "<think>\n\n</think>\n\n"},
        turn={True: "<think>\n{reasoning}\n</think>\n\n{content}<|im_end|>",
              False: "{content}<|im_end|>"},
        detect=("<|im_start|>",),
    ),
    "deepseek-r1": Preset(
        name="deepseek-r1",
        description="DeepSeek-R1: prompt ends <think>\\n; reasoning\\n</think>\\n\\ncontent<｜end▁of▁sentence｜>",
        structural=("</think>", "<｜end▁of▁sentence｜>"),
        prompt_ends={True: "<think>\n"},
        turn={True: "{reasoning}\n</think>\n\n{content}<｜end▁of▁sentence｜>"},
        detect=("<｜Assistant｜>",),
    ),
}

_FIELD = re.compile(r"\{(reasoning|content)\}")


def detect_preset(has_token) -> Preset:
    """The preset whose identifying tokens the tokenizer has (HAS_TOKEN: str -> bool)."""
    for preset in PRESETS.values():
        if all(has_token(t) for t in preset.detect):
            return preset
    raise SetupError("cannot tell which model family this tokenizer belongs to; pass --preset "
                     f"({', '.join(PRESETS)})")


@dataclass(frozen=True)
class TurnLayout:
    """A preset resolved against one tokenizer and one thinking mode."""

    preset: Preset
    thinking: bool
    token_ids: dict[str, int]
    _pattern: re.Pattern = field(repr=False, compare=False, default=None)

    @classmethod
    def resolve(cls, preset: Preset, thinking: bool, token_id) -> TurnLayout:
        if thinking not in preset.turn:
            raise SetupError(f"preset {preset.name} has no {'thinking' if thinking else 'non-thinking'} mode")
        ids = {}
        for tok in preset.structural:
            tid = token_id(tok)
            if tid is None:
                raise SetupError(
                    f"preset {preset.name}: {tok!r} is not a single control token of this "
                    "tokenizer (wrong --preset, or not this model's tokenizer)")
            ids[tok] = tid
        alternatives = "|".join(re.escape(t) for t in sorted(preset.structural, key=len, reverse=True))
        return cls(preset, thinking, ids, re.compile(f"({alternatives})"))

    @property
    def prompt_end(self) -> str:
        return self.preset.prompt_ends[self.thinking]

    @property
    def end_of_turn(self) -> str:
        return self.preset.structural[-1]

    def segments(self, reasoning: str, content: str, truncated: bool) -> list[tuple[bool, str]]:
        """The generated turn as (is_structural_token, text) pieces, empty text pieces left out."""
        return [(is_token, text) for is_token, text, _ in self.named_segments(reasoning, content, truncated)]

    def named_segments(self, reasoning: str, content: str, truncated: bool
                       ) -> list[tuple[bool, str, str | None]]:
        """`segments`, each text piece with the part it holds ("reasoning" or "content";
        None for a structural token, or a piece that is the layout's own text alone)."""
        layout = self.preset.turn[self.thinking]
        if truncated:
            cut_in_reasoning = self.thinking and "{reasoning}" in layout and content == ""
            placeholder = "{reasoning}" if cut_in_reasoning else "{content}"
            layout = layout[: layout.index(placeholder) + len(placeholder)]
        values = {"reasoning": reasoning, "content": content}
        out: list[tuple[bool, str, str | None]] = []
        # Split the layout before filling it in, so structural strings inside the model's
        # text stay text.
        for i, piece in enumerate(self._pattern.split(layout)):
            if i % 2:
                out.append((True, piece, None))
            else:
                text = _FIELD.sub(lambda m: values[m.group(1)], piece)
                if text:
                    held = _FIELD.findall(piece)
                    out.append((False, text, held[0] if held else None))
        return out


def render_prompt(tok, messages: list[dict], thinking: bool, **template_kwargs) -> str:
    """The prompt text exactly as the model's chat template renders it for generation
    (TEMPLATE_KWARGS: the preset's, e.g. K2.6's preserve_thinking)."""
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                   thinking=thinking, enable_thinking=thinking, **template_kwargs)


_PROBES = [
    [{"role": "user", "content": "ping"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "<|im_end|> 你好"}],
    [{"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4.", "reasoning_content": "Add </think> them."},
     {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "3+3?"}]}],
]


class PromptRenderer:
    """`render_prompt` for a batch of conversations.

    A tokenizer class that keeps transformers' own `apply_chat_template` is rendered through
    the function that method calls (`render_jinja_template`, with the same variables), once
    per batch, which halves the cost per record. A class with its own `apply_chat_template`
    (Kimi's, which adds what tools need and calls transformers' own) is given the batch
    through that method, which takes a list of conversations as its documented batched
    input: each conversation rendered by the same loop, the template's variables prepared
    once per batch, not once per record (Kimi K2.5's real tokenizer: ~40 -> ~30 us per
    short conversation). Either way the batch is compared with one call per conversation on
    probe conversations first, and a batch that raises is rendered record by record (the
    template's exception on its own record). Each item of the result is the text, or the
    exception the template raised.
    """

    def __init__(self, tok, thinking: bool, template_kwargs: dict | None = None):
        self.tok = tok
        self.thinking = thinking
        self.template_kwargs = dict(template_kwargs or {})
        self.batched = False
        try:
            from transformers.tokenization_utils_base import PreTrainedTokenizerBase
            from transformers.utils.chat_template_utils import render_jinja_template
        except ImportError:
            return
        self._own = type(tok).apply_chat_template is not PreTrainedTokenizerBase.apply_chat_template
        self._render = render_jinja_template
        self._kwargs = {**tok.special_tokens_map, "thinking": thinking, "enable_thinking": thinking,
                        **self.template_kwargs}
        try:
            self.batched = self._render_batch(_PROBES) == [
                render_prompt(tok, m, thinking, **self.template_kwargs) for m in _PROBES]
        except Exception:
            self.batched = False

    def _render_batch(self, conversations):
        if self._own:  # (its own method, given the batch: see the class's text)
            return self.tok.apply_chat_template(
                conversations, tokenize=False, add_generation_prompt=True, thinking=self.thinking,
                enable_thinking=self.thinking, **self.template_kwargs)
        rendered, _ = self._render(conversations=conversations, chat_template=self.tok.chat_template,
                                   add_generation_prompt=True, **self._kwargs)
        return rendered

    def render(self, conversations: list[list[dict]]) -> list[str | Exception]:
        if self.batched:
            try:
                return self._render_batch(conversations)
            except Exception:
                pass  # one bad conversation: find it below
        out: list[str | Exception] = []
        for messages in conversations:
            try:
                out.append(render_prompt(self.tok, messages, self.thinking, **self.template_kwargs))
            except Exception as e:  # a template's raise_exception, or a bad message shape
                out.append(e)
        return out
