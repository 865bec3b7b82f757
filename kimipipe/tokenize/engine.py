"""Response records in, token records out, a batch at a time (the work one process does).

`Settings` is everything a worker needs to rebuild the same `Engine` (it is pickled to each
worker process, which loads the tokenizer once). `Engine.process(batch)` takes
(line number, raw line) pairs and returns one `Outcome` per line, in order: a token record
line, a rejection with its reason, a drop (`--drop-truncated`, `--drop-long`), or an input
the template cannot render faithfully ("invalid": the command stops with PATH:LINE; see
fields.py).

Each ok row also carries the provider's counts against kimipipe's (deltas.py), and a
response whose reasoning the content holds before a lone `</think>` is laid out with it
as reasoning (think_tags.py).

Only two endings are turns whose IDs are known: `finish_reason` `stop` (the model ended the
turn: the end-of-turn token follows) and `length` (cut by max_tokens: the IDs end where the
text ends). Any other (`content_filter`, `error`, `tool_calls`, null) is rejected: appending
an end-of-turn token would teach the drafter an ending the model never produced.

Batches keep the tokenizer's batch calls busy: all prompts of a batch are encoded in one
call, all text runs of the generated turns in another, and all rows decoded in a third.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..records import TokenIds, decode_passthrough, encode_over
from ..think_tags import INLINE, split_lone_think_close
from .codec import make_codec
from .deltas import token_deltas
from .fields import (
    DECODER,
    ProviderCounts,
    TokenizeInput,
    history_reasoning_refusal,
    template_messages,
    with_history_reasoning,
)
from .load import load_tokenizer
from .render import PRESETS, PromptRenderer, SetupError, TurnLayout, detect_preset, render_prompt
from .verify import check_prompt_end, check_roundtrip, check_text_ids, first_difference

TEXT_FIELDS = ("messages", "response")
FINISHED = ("stop", "length")  # the endings whose token IDs are known


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
    ignore_extra_fields: bool = False
    max_prompt_delta: int | None = None
    debug: bool = False
    strict: bool = False  # a server's prompt IDs unlike kimipipe's reject the row


@dataclass
class Outcome:
    kind: str  # "ok", "reject", "drop", "invalid" (stop: PATH:LINE, exit 2)
    id: str
    line: int
    payload: bytes = b""  # the token record line (ok)
    reason: str = ""  # why rejected or dropped ("truncated", "long")
    n_in: int = 0
    n_out: int = 0
    truncated: bool = False
    long: bool = False
    no_reasoning: bool = False
    provider: str | None = None
    prompt_delta: int | None = None
    completion_delta: int | None = None
    # (id, rendered prompt) of the batch's first row per provider and non-zero prompt
    # delta: what a warning shows to compare (only these cross the process boundary)
    example: tuple[str, str] | None = None
    # the server's own IDs (sampled_ids): what their check found (SampledCheck), or None
    sampled: SampledCheck | None = None


@dataclass(frozen=True)
class SampledCheck:
    """A row's server-sampled IDs against kimipipe's re-encoding (docs/servers.md).

    `used`: they passed (decode(ids) is the generated turn's text, control tokens where the
    layout puts them) and are the row's `output_ids`; else `problem` says why not.
    `differs`: the canonical re-encoding is not what was sampled; `span` the sampled tokens
    between the common prefix and suffix, `net` len(sampled) - len(re-encoded).
    `prompt_mismatch`: the server's prompt IDs are not kimipipe's `input_ids` (its template
    renders otherwise); None when it sent none."""

    used: bool
    differs: bool = False
    span: int = 0
    net: int = 0
    prompt_mismatch: bool | None = None
    problem: str = ""


def differing_span(a: list[int], b: list[int]) -> int:
    """The tokens of A between its common prefix and common suffix with B."""
    n = min(len(a), len(b))
    p = 0
    while p < n and a[p] == b[p]:
        p += 1
    q = 0
    while q < n - p and a[-1 - q] == b[-1 - q]:
        q += 1
    return len(a) - p - q




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
        self.template_kwargs = dict(self.layout.preset.template_kwargs)
        self._check_template()
        self.renderer = PromptRenderer(self.tok, settings.thinking, self.template_kwargs)

    def _check_template(self) -> None:
        """Fail fast when the template and the preset disagree.

        The generation prompt must end as the preset says. And where the template can render
        a finished assistant turn with its reasoning (the last turn, or `preserve_thinking`),
        that rendering must start with prompt + the preset's turn: the layout is then
        confirmed by the template itself (`layout_confirmed`). Templates that drop the
        reasoning of finished turns (Kimi K2 Thinking's history) cannot confirm it.
        """
        thinking = self.settings.thinking
        probe = [{"role": "user", "content": "ping"}]
        try:
            prompt = render_prompt(self.tok, probe, thinking, **self.template_kwargs)
        except Exception as e:
            raise SetupError(f"the chat template fails on a one-message conversation: {e}") from None
        problem = check_prompt_end(prompt, self.layout.prompt_end, thinking)
        if problem:
            raise SetupError(f"preset {self.layout.preset.name}: {problem}; check --preset, "
                             "--thinking/--no-thinking and the chat template")
        reasoning, content = ("REASONING-7f3a", "CONTENT-7f3a")
        answer = {"role": "assistant", "content": content}
        if thinking:
            answer["reasoning_content"] = reasoning
        try:
            finished = self.tok.apply_chat_template(
                [*probe, answer], tokenize=False, add_generation_prompt=False, thinking=thinking,
                enable_thinking=thinking, **{**self.template_kwargs, "preserve_thinking": True})
        except Exception:
            finished = ""
        turn = "".join(t for _, t in self.layout.segments(reasoning if thinking else "", content, False))
        self.layout_confirmed = False
        if content in finished and (not thinking or reasoning in finished):
            if not finished.startswith(prompt + turn):
                got = finished[len(prompt):] if finished.startswith(prompt) else finished
                raise SetupError(
                    f"preset {self.layout.preset.name}: the chat template renders a finished turn "
                    f"as {got!r}, the preset as {turn!r}; check --preset and the chat template")
            self.layout_confirmed = True

    def describe(self) -> str:
        s = self.settings
        source = "confirmed by the template" if self.layout_confirmed else "not renderable by the template"
        return (f"{self.codec.kind} tokenizer, preset {self.layout.preset.name} ({source}), "
                f"thinking {'on' if s.thinking else 'off'}")

    def process(self, batch: list[tuple[int, bytes]]) -> list[Outcome]:
        """One Outcome per (line number, raw line) of BATCH, in order."""
        outcomes: list[Outcome | None] = [None] * len(batch)
        rows = self._rows_to_render(batch, outcomes)
        rows = self._render_prompts(rows, outcomes)
        if rows:
            self._encode_and_verify(rows, outcomes)
        return outcomes

    def _rows_to_render(self, batch, outcomes) -> list[_Row]:
        s = self.settings
        rows = []
        for k, (lineno, line) in enumerate(batch):
            rec = DECODER.decode(line)
            truncated = rec.finish_reason == "length"
            if rec.finish_reason not in FINISHED:
                outcomes[k] = Outcome("reject", rec.id, lineno, reason=(
                    f"finish_reason {json.dumps(rec.finish_reason)}: the turn did not end normally "
                    f"(only `stop` and `length` turns are tokenized; an {self.layout.end_of_turn} "
                    "appended to it would be an ending the model never produced)"))
            elif truncated and s.drop_truncated:
                outcomes[k] = Outcome("drop", rec.id, lineno, reason="truncated", truncated=True)
            elif not s.thinking and rec.response.reasoning:
                outcomes[k] = Outcome("reject", rec.id, lineno, reason=(
                    "the response has reasoning but --no-thinking says the prompt closed the think block"))
            else:
                row = _Row(k, lineno, line, rec, truncated, rec.response.content,
                           rec.response.reasoning or "", rec.reasoning_source)
                # A stack with no reasoning parser left it in the content, before a lone
                # </think> (think_tags.py); with thinking off, a </think> there is text.
                split = split_lone_think_close(row.content, row.reasoning) if s.thinking else None
                if split is not None:
                    row.content, row.reasoning = split
                    row.reasoning_source = INLINE
                rows.append(row)
        return rows

    def _render_prompts(self, rows: list[_Row], outcomes) -> list[_Row]:
        """Render each row's prompt and lay out its generated turn; failures become rejects."""
        conversations = [template_messages(r.rec.messages) for r in rows]
        ready = []
        for row, prompt in zip(rows, self.renderer.render(conversations), strict=True):
            if isinstance(prompt, Exception):
                outcomes[row.k] = row.reject(f"chat template failed: {prompt}")
                continue
            refusal = None if self.settings.ignore_extra_fields else self._history_reasoning(row, prompt)
            if refusal:
                outcomes[row.k] = Outcome("invalid", row.rec.id, row.lineno, reason=refusal)
                continue
            problem = check_prompt_end(prompt, self.layout.prompt_end, self.settings.thinking)
            if problem:
                outcomes[row.k] = row.reject(problem)
                continue
            row.prompt_text = prompt
            row.segments = self.layout.segments(row.reasoning, row.content, row.truncated)
            if not row.segments:
                outcomes[row.k] = row.reject("nothing was generated (empty cut turn)")
                continue
            ready.append(row)
        return ready

    def _history_reasoning(self, row: _Row, prompt: str) -> str | None:
        """Why the earlier turns' reasoning makes ROW unrenderable: the template keeps it."""
        found = with_history_reasoning(row.rec.messages)
        if found is None:
            return None
        conversation, first = found
        [with_reasoning] = self.renderer.render([conversation])
        if isinstance(with_reasoning, str) and with_reasoning == prompt:
            return None  # the template drops it: nothing the model saw is missing
        return history_reasoning_refusal(first)

    def _encode_and_verify(self, rows: list[_Row], outcomes) -> None:
        """All prompts in one batch call, all text runs in another, all rows decoded in a third."""
        s = self.settings
        prompt_ids = self.codec.encode_prompt([r.prompt_text for r in rows])
        text_ids = iter(self.codec.encode_text(
            [text for r in rows for is_token, text in r.segments if not is_token]))
        structural = self.layout.token_ids
        for row, p_ids in zip(rows, prompt_ids, strict=True):
            row.input_ids = p_ids
            for is_token, text in row.segments:
                if is_token:
                    row.output_ids.append(structural[text])
                else:
                    ids = next(text_ids)
                    row.problem = row.problem or check_text_ids(ids, self.codec.control_ids)
                    row.output_ids.extend(ids)
        decoded = self.codec.decode([r.input_ids + r.output_ids for r in rows])
        with_sampled = [r for r in rows if r.rec.sampled_ids is not None]
        sampled_text = dict(zip((r.k for r in with_sampled), self.codec.decode(
            [r.rec.sampled_ids.output for r in with_sampled]) if with_sampled else [],
            strict=True))
        shown: set = set()
        for row, text in zip(rows, decoded, strict=True):
            expected = row.prompt_text + "".join(t for _, t in row.segments)
            problem = row.problem or check_roundtrip(text, expected)
            if problem:
                outcomes[row.k] = row.reject(problem)
                continue
            sampled = None
            reencoded = None
            if row.k in sampled_text:
                sampled = self._check_sampled(row, sampled_text[row.k])
                if s.strict and (sampled.prompt_mismatch or not sampled.used):
                    outcomes[row.k] = row.reject(
                        "the server's prompt_token_ids are not kimipipe's input_ids (its chat "
                        "template renders the prompt otherwise)" if sampled.prompt_mismatch
                        else sampled.problem)
                    continue
                if sampled.used:
                    reencoded = row.output_ids
                    row.output_ids = list(row.rec.sampled_ids.output)
            n_in, n_out = len(row.input_ids), len(row.output_ids)
            usage = row.rec.usage or ProviderCounts()
            structural_ids = sum(is_token for is_token, _ in row.segments)
            prompt_delta, completion_delta = token_deltas(
                usage.prompt_tokens, usage.completion_tokens, n_in, n_out - structural_ids)
            if (s.max_prompt_delta is not None and prompt_delta is not None
                    and abs(prompt_delta) > s.max_prompt_delta):
                outcomes[row.k] = row.reject(
                    f"prompt_tokens_delta {prompt_delta:+d}: the provider ({row.rec.provider}) "
                    f"counted {usage.prompt_tokens:,} prompt tokens, kimipipe's rendering "
                    f"has {n_in:,} (--max-prompt-delta {s.max_prompt_delta})")
                continue
            long = s.max_length is not None and n_in + n_out > s.max_length
            if long and s.drop_long:
                outcomes[row.k] = Outcome("drop", row.rec.id, row.lineno, reason="long", long=True,
                                          n_in=n_in, n_out=n_out)
                continue
            passthrough = decode_passthrough(row.line)
            if s.drop_text:
                for name in TEXT_FIELDS:
                    passthrough.pop(name, None)
            owned = TokenIds(input_ids=row.input_ids, output_ids=row.output_ids, over_max_length=long,
                             prompt_tokens_delta=prompt_delta,
                             completion_tokens_delta=completion_delta,
                             reasoning_source=row.reasoning_source,
                             output_ids_source="sampled" if reencoded is not None else None,
                             reencoded_ids=reencoded)
            key = (row.rec.provider, prompt_delta)
            example = None
            if prompt_delta and key not in shown:
                shown.add(key)
                example = (row.rec.id, row.prompt_text)
            outcomes[row.k] = Outcome(
                "ok", row.rec.id, row.lineno, payload=encode_over(passthrough, owned),
                n_in=n_in, n_out=n_out, truncated=row.truncated, long=long,
                no_reasoning=s.thinking and not row.reasoning, provider=row.rec.provider,
                prompt_delta=prompt_delta, completion_delta=completion_delta, example=example,
                sampled=sampled)

    def _check_sampled(self, row: _Row, decoded: str) -> SampledCheck:
        """The server's IDs of ROW against its text and kimipipe's own IDs."""
        ids = row.rec.sampled_ids
        prompt_mismatch = None if ids.prompt is None else ids.prompt != row.input_ids
        turn = "".join(t for _, t in row.segments)
        problem = ""
        if decoded != turn:
            problem = ("the server's sampled IDs do not decode to the answer's text "
                       + first_difference(turn, decoded))
        else:
            control = self.codec.control_ids
            if [i for i in ids.output if i in control] != [i for i in row.output_ids if i in control]:
                problem = ("the server's sampled IDs hold control tokens where the turn's layout "
                           "has none (or lack the layout's): a literal special-token string "
                           "sampled as the token, or another layout")
        if problem:
            return SampledCheck(used=False, prompt_mismatch=prompt_mismatch, problem=problem)
        own = row.output_ids
        differs = ids.output != own
        return SampledCheck(used=True, differs=differs,
                            span=differing_span(ids.output, own) if differs else 0,
                            net=len(ids.output) - len(own), prompt_mismatch=prompt_mismatch)


@dataclass
class _Row:
    """One record on its way through a batch."""

    k: int  # position in the batch
    lineno: int
    line: bytes
    rec: TokenizeInput
    truncated: bool
    content: str  # the generated turn's text (reasoning taken from a lone </think>: think_tags)
    reasoning: str
    reasoning_source: str | None
    prompt_text: str = ""
    segments: list = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    problem: str | None = None

    def reject(self, reason: str) -> Outcome:
        return Outcome("reject", self.rec.id, self.lineno, reason=reason)


def spawned_worker(settings: Settings):
    """A spawned worker's batch function (pool.py): the Engine built again from SETTINGS."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return Engine(settings).process
