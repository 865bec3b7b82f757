"""Any line of a build's record files, read through one view and sorted by its fields.

The readers of what a build left (`kp-infer report`, infer/report_files.py; the build
report, report/facts.py) take every line through `RecordLine`: the fields any of them
reads (msgspec skips the rest; a response's text, a token record's ID lists and the
sampled tokens are left undecoded). What a line is goes by its fields:

    is_tokens     `input_ids` and `output_ids`: a token record (kp-tokenize); it has a
                  response record's fields too (`response` unless --drop-text)
    is_response   `response`: an answer (kp-infer), or a token record that kept its text
    is_failure    `kind` and `status`: a --failures line
    is_reject     `id`, `line` and `reason`: a kp-tokenize --rejects line

`read_lines(path, say)` gives each line of a file another process may still be writing:
its unfinished last line is skipped with a note, any other bad line stops the reader
(`PATH:LINE`, exit 2). `refusals()` is what the line paid for and did not keep, `paid`
what it cost in all (records.record_cost, as every spend reader counts it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import msgspec

from ..errors import InputError
from ..io import describe_decode_error, iter_lines
from ..records import Identity, Refusal, Resegmented, Usage, record_cost
from .providers_table import REFUSAL_KINDS


class RecordLine(msgspec.Struct):
    """A line of any of a build's record files, as far as its readers go."""

    id: str | None = None
    dataset: str | None = None
    # a response's (kp-infer), kept by a token record
    response: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET  # left undecoded
    usage: Usage | None = None
    finish_reason: str | None = None
    provider: str | None = None
    latency_s: float | None = None
    finished_at: str | None = None
    sampling: dict | None = None
    refused: list[Refusal] = msgspec.field(default_factory=list)
    conversation: str | None = None  # a conversation's turn (records.Turn)
    turn: int | None = None
    turns: int | None = None
    sampled_tokens: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET  # token logprobs (undecoded)
    identity: Identity | None = None  # the counts its run checked it against (--tokenizer)
    # a response's or a failure's
    api: str | None = None  # the host that answered (recorded/api.py)
    generation_id: str | None = None  # the stand-in's begin `gen-standin-`
    retried: dict[str, int] | None = None  # attempts sent again, by cause
    # a token record's (kp-tokenize)
    input_ids: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    output_ids: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    prompt_tokens_delta: int | None = None
    completion_tokens_delta: int | None = None
    output_ids_source: str | None = None  # its sampled IDs' outcome (tokenize/stats.py)
    sampled_parts: list[str] | None = None
    resegmented: Resegmented | None = None
    sampled_fallback: str | None = None
    # a failure's (--failures)
    kind: str | None = None
    status: int | None = None
    cost: float = 0.0
    time: str | None = None
    # a reject's (kp-tokenize --rejects)
    line: int | None = None
    reason: str | None = None

    @property
    def is_tokens(self) -> bool:
        return self.input_ids is not msgspec.UNSET and self.output_ids is not msgspec.UNSET

    @property
    def is_response(self) -> bool:
        return self.response is not msgspec.UNSET

    @property
    def is_failure(self) -> bool:
        return self.kind is not None and self.status is not None

    @property
    def is_reject(self) -> bool:
        return self.id is not None and self.line is not None and self.reason is not None

    @property
    def carried_tokens(self) -> bool:
        """The answer carried the tokens the model sampled (token logprobs)."""
        return self.sampled_tokens is not msgspec.UNSET and bytes(self.sampled_tokens) != b"null"

    def refusals(self) -> list[Refusal]:
        """The answers this line paid for and did not keep: its `refused`; an older failure
        line without them, whose kind is a refusal, is itself the refused answer."""
        if not self.refused and self.is_failure and self.kind in REFUSAL_KINDS:
            return [Refusal(self.kind, self.provider, self.cost)]
        return self.refused

    @property
    def paid(self) -> float:
        """What the line cost (records.record_cost): an answer's usage.cost and its
        refused answers', or a failure's cost."""
        return record_cost(None if not self.is_response else (self.usage or Usage()).cost,
                           (r.cost for r in self.refused), self.cost)


_decoder = msgspec.json.Decoder(RecordLine)


def read_lines(path: str, say: Callable[[str], None]) -> Iterator[tuple[int, RecordLine]]:
    """(line number, line) of every line of PATH (see the module docstring)."""
    for lineno, raw, ended in iter_lines(path):
        try:
            line = _decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            if not ended:
                say(f"kp-infer: {path}:{lineno}: skipped an unfinished last line")
                continue
            raise InputError(describe_decode_error(e, ended), path, lineno) from None
        yield lineno, line
