"""Response records in, token records out, a batch at a time (the work one process does).

`Settings` is everything a worker needs to rebuild the same `Engine` (it is pickled to each
worker process, which loads the tokenizer once). `Engine.process(batch)` takes
(line number, raw line) pairs and returns one `Outcome` per line, in order: a token record
line, a rejection with its reason, or a drop (`--drop-truncated`, `--drop-long`).

Batches keep the tokenizer's batch calls busy: all prompts of a batch are encoded in one
call, all text runs of the generated turns in another, and all rows decoded in a third.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ..records import Response, decode_passthrough, encode_line, merge_fields
from .codec import make_codec
from .load import load_tokenizer
from .render import PRESETS, PromptRenderer, SetupError, TurnLayout, detect_preset, render_prompt
from .verify import check_prompt_end, check_roundtrip, check_text_ids

TEXT_FIELDS = ("messages", "response")


@dataclass(frozen=True)
class Settings:
    tokenizer_dir: str
    trust_remote_code: bool = False
    chat_template: str | None = None
    preset: str = "auto"
    thinking: bool = True
    max_length: int | None = None
    drop_long: bool = False
    drop_truncated: bool = False
    drop_text: bool = False
    debug: bool = False


@dataclass
class Outcome:
    kind: str  # "ok", "reject", "drop"
    id: str
    line: int
    payload: bytes = b""  # the token record line (ok)
    reason: str = ""  # why rejected or dropped ("truncated", "long")
    n_in: int = 0
    n_out: int = 0
    truncated: bool = False
    long: bool = False
    no_reasoning: bool = False


_response_decoder = msgspec.json.Decoder(Response)


class Engine:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.tok = load_tokenizer(Path(settings.tokenizer_dir),
                                  trust_remote_code=settings.trust_remote_code,
                                  chat_template=settings.chat_template, debug=settings.debug)
        self.codec = make_codec(self.tok)
        if settings.preset == "auto":
            preset = detect_preset(lambda t: self.codec.token_id(t) is not None)
        else:
            preset = PRESETS[settings.preset]
        self.layout = TurnLayout.resolve(preset, settings.thinking, self.codec.token_id)
        self._check_template()
        self.renderer = PromptRenderer(self.tok, settings.thinking)

    def _check_template(self) -> None:
        """Fail fast when the template and the preset disagree about the generation prompt."""
        probe = [{"role": "user", "content": "ping"}]
        try:
            text = render_prompt(self.tok, probe, self.settings.thinking)
        except Exception as e:
            raise SetupError(f"the chat template fails on a one-message conversation: {e}") from None
        problem = check_prompt_end(text, self.layout.prompt_end, self.settings.thinking)
        if problem:
            raise SetupError(f"preset {self.layout.preset.name}: {problem}; check --preset, "
                             "--thinking/--no-thinking and the chat template")

    def describe(self) -> str:
        s = self.settings
        return (f"{self.codec.kind} tokenizer, preset {self.layout.preset.name}, "
                f"thinking {'on' if s.thinking else 'off'}")

    def process(self, batch: list[tuple[int, bytes]]) -> list[Outcome]:
        s = self.settings
        outcomes: list[Outcome | None] = [None] * len(batch)
        work = []  # (index, record, line, prompt_text, segments, truncated, no_reasoning)
        pending = []  # (index, record, line, truncated) waiting for their prompt text
        for k, (lineno, line) in enumerate(batch):
            rec = _response_decoder.decode(line)
            truncated = rec.finish_reason == "length"
            if truncated and s.drop_truncated:
                outcomes[k] = Outcome("drop", rec.id, lineno, reason="truncated", truncated=True)
            elif not s.thinking and rec.response.reasoning:
                outcomes[k] = Outcome("reject", rec.id, lineno, reason=(
                    "the response has reasoning but --no-thinking says the prompt closed the think block"))
            else:
                pending.append((k, rec, line, truncated))
        prompts = self.renderer.render(
            [[{"role": m.role, "content": m.content} for m in rec.messages] for _, rec, _, _ in pending])
        for (k, rec, line, truncated), prompt_text in zip(pending, prompts, strict=True):
            lineno = batch[k][0]
            if isinstance(prompt_text, Exception):
                outcomes[k] = Outcome("reject", rec.id, lineno, reason=f"chat template failed: {prompt_text}")
                continue
            problem = check_prompt_end(prompt_text, self.layout.prompt_end, s.thinking)
            if problem:
                outcomes[k] = Outcome("reject", rec.id, lineno, reason=problem)
                continue
            reasoning = rec.response.reasoning
            segments = self.layout.segments(reasoning or "", rec.response.content, truncated)
            if not segments:
                outcomes[k] = Outcome("reject", rec.id, lineno, reason="nothing was generated (empty cut turn)")
                continue
            work.append((k, rec, line, prompt_text, segments, truncated, not reasoning))

        if work:
            prompt_ids = self.codec.encode_prompt([w[3] for w in work])
            texts = [text for w in work for is_tok, text in w[4] if not is_tok]
            text_ids = iter(self.codec.encode_text(texts))
            token_ids = self.layout.token_ids
            rows = []
            for w, p_ids in zip(work, prompt_ids, strict=True):
                out_ids: list[int] = []
                problem = None
                for is_tok, text in w[4]:
                    if is_tok:
                        out_ids.append(token_ids[text])
                    else:
                        ids = next(text_ids)
                        problem = problem or check_text_ids(ids, self.codec.control_ids)
                        out_ids.extend(ids)
                rows.append((p_ids, out_ids, problem))
            decoded = self.codec.decode([p + o for p, o, _ in rows])
            for w, (p_ids, out_ids, problem), text in zip(work, rows, decoded, strict=True):
                k, rec, line, prompt_text, segments, truncated, no_reasoning = w
                lineno = batch[k][0]
                expected = prompt_text + "".join(t for _, t in segments)
                problem = problem or check_roundtrip(text, expected)
                if problem:
                    outcomes[k] = Outcome("reject", rec.id, lineno, reason=problem)
                    continue
                n = len(p_ids) + len(out_ids)
                long = s.max_length is not None and n > s.max_length
                if long and s.drop_long:
                    outcomes[k] = Outcome("drop", rec.id, lineno, reason="long", long=True,
                                          n_in=len(p_ids), n_out=len(out_ids))
                    continue
                passthrough = decode_passthrough(line)
                if s.drop_text:
                    for name in TEXT_FIELDS:
                        passthrough.pop(name, None)
                owned = {"input_ids": p_ids, "output_ids": out_ids}
                if long:
                    owned["over_max_length"] = True
                outcomes[k] = Outcome("ok", rec.id, lineno, payload=encode_line(merge_fields(passthrough, owned)),
                                      n_in=len(p_ids), n_out=len(out_ids), truncated=truncated,
                                      long=long, no_reasoning=no_reasoning and s.thinking)
        return outcomes


# Worker-process side: one Engine per process, forked with the parent's or built once by the
# pool's initializer.
_engine: Engine | None = None


def set_worker_engine(engine: Engine) -> None:
    global _engine
    _engine = engine


def init_worker(settings: Settings) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    set_worker_engine(Engine(settings))


def process_in_worker(batch: list[tuple[int, bytes]]) -> list[Outcome]:
    return _engine.process(batch)
