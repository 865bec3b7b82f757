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

from ..records import Resegmented, TokenIds, decode_passthrough, encode_over
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
from .resegment import (
    BAD_FIELD,
    CONTROL_ORDER,
    DECODES_OTHERWISE,
    UNRENDERABLE,
    Alignment,
    align,
    resegmented,
)
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
    """A row's sampled IDs (a server's `sampled_ids`, or the IDs of the tokens of token
    logprobs, `sampled_tokens`) against kimipipe's re-encoding (docs/kp-tokenize.md).

    `used`: they proved out (they decode to the generated turn's text, control tokens where
    the layout puts them) and are the row's `output_ids`, wholly or for the text `parts`
    named (the rest re-encoded); else `problem` says why not (for token logprobs one of
    resegment.py's reasons, with `detail`). `reseg`: where the sampled IDs cut the text
    otherwise than the re-encoding (records.Resegmented). `prompt_mismatch`: a server's
    prompt IDs are not kimipipe's `input_ids` (its template renders otherwise); None when
    it sent none."""

    source: str  # "server" | "logprobs"
    used: bool
    parts: tuple[str, ...] = ()
    complete: bool = True  # every text part's IDs are sampled
    reseg: Resegmented | None = None
    prompt_mismatch: bool | None = None
    problem: str = ""
    detail: str = ""

    @property
    def differs(self) -> bool:
        return self.reseg is not None and self.reseg.regions > 0

    @property
    def fallback(self) -> str | None:
        """The short reason a token record keeps (`sampled_fallback`), when not used."""
        if self.used:
            return None
        return self.problem if self.source == "logprobs" else SERVER_IDS_REJECTED


SERVER_IDS_REJECTED = "the server's sampled IDs did not prove out"


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
        """All prompts in one batch call, all text runs in another, all rows decoded in a third
        (with the text parts of the sampled tokens that lie on a row's turn)."""
        s = self.settings
        prompt_ids = self.codec.encode_prompt([r.prompt_text for r in rows])
        text_ids = iter(self.codec.encode_text(
            [text for r in rows for is_token, text in r.segments if not is_token]))
        structural = self.layout.token_ids
        for row, p_ids in zip(rows, prompt_ids, strict=True):
            row.input_ids = p_ids
            for is_token, text in row.segments:
                if is_token:
                    ids = [structural[text]]
                else:
                    ids = next(text_ids)
                    row.problem = row.problem or check_text_ids(ids, self.codec.control_ids)
                row.segment_ids.append(ids)
                row.output_ids.extend(ids)
        aligned = {r.k: self._align_tokens(r) for r in rows
                   if r.rec.sampled_tokens is not None and r.rec.sampled_ids is None
                   and not r.problem}
        parts = [(k, n, ids) for k, al in aligned.items() if not al.problem
                 for n, ids in enumerate(al.ids) if ids is not None]
        with_sampled = [r for r in rows if r.rec.sampled_ids is not None]
        decoded = self.codec.decode([r.input_ids + r.output_ids for r in rows]
                                    + [r.rec.sampled_ids.output for r in with_sampled]
                                    + [ids for _, _, ids in parts])
        sampled_text = dict(zip((r.k for r in with_sampled), decoded[len(rows):],
                                strict=False))
        part_text = {(k, n): text for (k, n, _), text in
                     zip(parts, decoded[len(rows) + len(with_sampled):], strict=True)}
        shown: set = set()
        for row, text in zip(rows, decoded, strict=False):
            expected = row.prompt_text + "".join(t for _, t in row.segments)
            problem = row.problem or check_roundtrip(text, expected)
            if problem:
                outcomes[row.k] = row.reject(problem)
                continue
            sampled = None
            reencoded = None
            if row.k in sampled_text:
                sampled = self._check_sampled(row, sampled_text[row.k])
                if sampled.problem == CONTROL_ORDER:  # (resegment.UNRENDERABLE)
                    outcomes[row.k] = row.reject(
                        f"{CONTROL_ORDER}: the server's sampled IDs hold "
                        f"{sampled.detail}; the chat template cannot lay out what the model "
                        "sampled, and a re-encoding would not be it")
                    continue
                if s.strict and (sampled.prompt_mismatch or not sampled.used):
                    outcomes[row.k] = row.reject(
                        "the server's prompt_token_ids are not kimipipe's input_ids (its chat "
                        "template renders the prompt otherwise)" if sampled.prompt_mismatch
                        else sampled.problem)
                    continue
                if sampled.used:
                    reencoded = row.output_ids
                    row.output_ids = list(row.rec.sampled_ids.output)
            elif row.k in aligned:
                sampled, ids = self._check_tokens(row, aligned[row.k], part_text)
                if sampled.problem in UNRENDERABLE:
                    outcomes[row.k] = row.reject(
                        f"{sampled.problem} ({sampled.detail}): the chat template cannot lay "
                        "out what the model sampled (token logprobs), and a re-encoding "
                        "would not be it" if sampled.detail else
                        f"{sampled.problem}: the chat template cannot lay out what the model "
                        "sampled (token logprobs), and a re-encoding would not be it")
                    continue
                if sampled.used:
                    reencoded = row.output_ids
                    row.output_ids = ids
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
            used = sampled is not None and sampled.used
            owned = TokenIds(input_ids=row.input_ids, output_ids=row.output_ids, over_max_length=long,
                             prompt_tokens_delta=prompt_delta,
                             completion_tokens_delta=completion_delta,
                             reasoning_source=row.reasoning_source,
                             output_ids_source=(("sampled" if sampled.complete else "partial")
                                                if used else None),
                             reencoded_ids=reencoded,
                             sampled_parts=list(sampled.parts) if used else None,
                             resegmented=sampled.reseg if used else None,
                             sampled_fallback=sampled.fallback if sampled is not None else None)
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

    def _align_tokens(self, row: _Row) -> Alignment:
        """ROW's sampled tokens (token logprobs) laid on its turn (tokenize/resegment.py)."""
        response = row.rec.response
        tokens = row.rec.sampled_tokens.token_bytes(response.reasoning, response.content)
        if tokens is None:
            return Alignment(problem=BAD_FIELD)
        return align(tokens, row.segments, self.layout.token_ids, self.codec)

    def _check_tokens(self, row: _Row, al: Alignment, part_text: dict
                      ) -> tuple[SampledCheck, list[int]]:
        """The proof of ROW's aligned sampled tokens: each sampled part's IDs decode to its
        text; then the output IDs (sampled parts, the rest re-encoded) and the comparison."""
        if al.problem:
            return SampledCheck("logprobs", used=False, problem=al.problem, detail=al.detail), []
        named = self.layout.named_segments(row.reasoning, row.content, row.truncated)
        ids, parts, pairs, complete = [], [], [], True
        for n, ((is_token, text, name), own) in enumerate(zip(named, row.segment_ids, strict=True)):
            mine = al.ids[n]
            if is_token or mine is None:
                ids.extend(own)
                complete = complete and (is_token or name is None)
                continue
            if part_text[(row.k, n)] != text:
                return SampledCheck("logprobs", used=False, problem=DECODES_OTHERWISE,
                                    detail=first_difference(text, part_text[(row.k, n)])), []
            ids.extend(mine)
            if name:
                parts.append(name)
            pairs.append((al.tokens[n], self.codec.token_bytes(own)))
        return SampledCheck("logprobs", used=True, parts=tuple(parts), complete=complete,
                            reseg=resegmented(pairs)), ids

    def _check_sampled(self, row: _Row, decoded: str) -> SampledCheck:
        """The server's IDs of ROW against its text and kimipipe's own IDs."""
        ids = row.rec.sampled_ids
        prompt_mismatch = None if ids.prompt is None else ids.prompt != row.input_ids
        turn = "".join(t for _, t in row.segments)
        control = self.codec.control_ids
        sampled_controls = [i for i in ids.output if i in control]
        layout_controls = [i for i in row.output_ids if i in control]
        if sampled_controls != layout_controls:
            # what the model sampled, the template cannot lay out (resegment.UNRENDERABLE)
            def named(found):
                return " ".join(self.codec.decode([[i] for i in found])) or "none"
            return SampledCheck("server", used=False, prompt_mismatch=prompt_mismatch,
                                problem=CONTROL_ORDER,
                                detail=f"{named(sampled_controls)} where the layout has "
                                       f"{named(layout_controls)}")
        problem = ""
        if decoded != turn:
            problem = ("the server's sampled IDs do not decode to the answer's text "
                       + first_difference(turn, decoded))
        if problem:
            return SampledCheck("server", used=False, prompt_mismatch=prompt_mismatch,
                                problem=problem)
        named = self.layout.named_segments(row.reasoning, row.content, row.truncated)
        parts = tuple(name for is_token, _, name in named if not is_token and name)
        reseg = resegmented([(self.codec.token_bytes(list(ids.output)),
                              self.codec.token_bytes(row.output_ids))])
        return SampledCheck("server", used=True, parts=parts, reseg=reseg,
                            prompt_mismatch=prompt_mismatch)


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
    segment_ids: list[list[int]] = field(default_factory=list)  # the re-encoding, per segment
    problem: str | None = None

    def reject(self, reason: str) -> Outcome:
        return Outcome("reject", self.rec.id, self.lineno, reason=reason)


def spawned_worker(settings: Settings):
    """A spawned worker's batch function (pool.py): the Engine built again from SETTINGS."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return Engine(settings).process
