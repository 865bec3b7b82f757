"""The records that flow between kimipipe's stages: the contract of the pipeline.

One msgspec Struct per record kind, and per stage the Struct of the fields it adds. Every
stage reads the previous stage's record, validates the fields it needs, and passes through
every field it does not own (undecoded), so that a pipeline can be cut and resumed at any
stage:

    stage        reads      writes (through)              the record it makes
    kp-prompts   sources    Prompt                        {id, dataset, messages, meta?,
                                                           follow_ups?}
    kp-infer     Prompt     Generation over the prompt    Response = Prompt + Generation
                            Failure (--failures)
    kp-tokenize  Response   TokenIds over the response    a token record: the response's
                            Rejected (--rejects)          fields (--drop-text: without
                                                          messages and response) + TokenIds
    kp-shard     Tokens     (rows: see shard/rows.py)

`encode_over(passthrough, fields)` writes a stage's record: the input record's fields as
they came (`decode_passthrough`), with the stage's own fields, a Struct from here, written
over them, at the end of the object. kp-shard reads token records through the `Tokens`
view (ID lists left undecoded); its fast path finds the `input_ids` and `output_ids` keys
in the raw bytes, the names declared by `TokenIds` and `Tokens` (tests/test_records.py
ties them).

Schema evolution follows msgspec's rules: new fields get defaults, types never change.
Decoders and encoders are built once and reused (msgspec's perf tips).
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import msgspec
from msgspec import Raw, Struct

Role = Literal["system", "user", "assistant"]


class Message(Struct, omit_defaults=True):
    role: Role
    content: str
    # an earlier assistant turn's reasoning, sent back in a conversation's history only
    # under `--history-reasoning keep` (OpenRouter's `reasoning` field of a message)
    reasoning: str | None = None


class Prompt(Struct, omit_defaults=True):
    """A prompt record (kp-prompts); what kp-infer reads.

    `follow_ups` came later (older records lack it: []): the later user turns of a
    conversation (`kp-prompts --turns all`), each to be asked after the model's own answer
    to the turn before."""

    id: str
    dataset: str
    messages: list[Message]
    meta: dict[str, Any] | None = None
    # `kp-prompts --turns all`: the conversation's later user turns, in order; kp-infer
    # asks them one by one on the model's own earlier answers (infer/conversations.py)
    follow_ups: list[str] = msgspec.field(default_factory=list)


class ResponseText(Struct):
    content: str
    reasoning: str | None = None


class Usage(Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float = 0.0  # USD, as billed (OpenRouter's usage.cost)
    cached_tokens: int = 0  # of prompt_tokens, read from the prompt cache (cheaper)


class Sampling(Struct, omit_defaults=True):
    """How an answer was asked for: the sampling parameters the request body held, as sent
    (the model preset's served values, the user's flags, `--extra-body`), `max_tokens`,
    the `reasoning` object, and whether `provider.require_parameters` was sent (then
    OpenRouter routed only to endpoints that apply every one of them). A parameter left
    out was not sent: the serving provider used its own default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    top_a: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    reasoning: dict[str, Any] | None = None
    require_parameters: bool = False
    # a self-hosted server's answer (docs/servers.md): thinking on/off as its chat template
    # was told it, in place of OpenRouter's `reasoning` (a server is sent no `reasoning`)
    chat_template_kwargs: dict[str, Any] | None = None


class SampledIds(Struct, omit_defaults=True):
    """The IDs as the server tokenized and sampled them (a self-hosted vLLM returns them for
    `return_token_ids`; OpenRouter never does): `prompt` the rendered prompt's IDs (None
    when the server gave none), `output` the generated turn's, its end-of-turn token
    included (docs/servers.md)."""

    output: list[int]
    prompt: list[int] | None = None


class SampledTokens(Struct, omit_defaults=True):
    """The tokens the model sampled, in order, as OpenRouter's token logprobs gave them
    (`logprobs.content[]` of each chunk: a token's `bytes`, or the UTF-8 of its `token`
    string where `bytes` was null), written compactly: `lengths` is each token's length
    in bytes, and the bytes themselves are either a text the record holds (`spells`:
    "answer" when the tokens, joined, are the reasoning then the content exactly as
    recorded, "content" when they are the content alone) or `data`, the joined bytes in
    base64. `null_bytes` counts the tokens whose `bytes` came null. kp-infer reads no
    tokenizer: kp-tokenize maps each token to its ID and proves them against the text
    (docs/kp-tokenize.md)."""

    lengths: list[int]
    spells: str | None = None  # "answer" | "content"; None: the bytes are in `data`
    data: str | None = None  # base64 of the tokens' bytes, joined (when `spells` is None)
    null_bytes: int = 0

    def token_bytes(self, reasoning: str | None, content: str) -> list[bytes] | None:
        """Each token's bytes, or None when `lengths` do not add up to the bytes they cut."""
        if self.spells == "answer":
            joined = ((reasoning or "") + content).encode("utf-8")
        elif self.spells == "content":
            joined = content.encode("utf-8")
        elif self.data is not None:
            try:
                joined = base64.b64decode(self.data, validate=True)
            except ValueError:
                return None
        else:
            return None
        if sum(self.lengths) != len(joined) or any(n < 0 for n in self.lengths):
            return None
        out, at = [], 0
        for n in self.lengths:
            out.append(joined[at:at + n])
            at += n
        return out


class Refusal(Struct, omit_defaults=True):
    """An answer kp-infer paid for and did not keep, and why: `routing_violation` (served
    by a provider the routing flags exclude), `no_reasoning` (reasoning asked for, none
    came back), `think_marker` (a `<think>`/`</think>` tag left in the content) or
    `identity` (its token counts were not the target model's: infer/identity.py). The
    prompt was then sent again with that provider added to its `provider.ignore`."""

    kind: str
    provider: str | None = None
    cost: float = 0.0
    generation_id: str | None = None
    message: str = ""
    cost_source: str = "usage"  # as Generation.cost_source
    # `identity`: usage.prompt_tokens minus kimipipe's count of the prompt (infer/identity.py)
    offset: int | None = None


class Identity(Struct, omit_defaults=True):
    """kimipipe's own counts of an answer kept by a run that checked identity (`kp-infer
    --tokenizer`, infer/identity.py): the prompt as the target's chat template renders it
    (`prompt_tokens`: what kp-tokenize's `input_ids` will hold), the answer re-encoded with
    its structural tokens (`completion_tokens`); `offset` is usage.prompt_tokens minus
    `prompt_tokens` (0, or the constant the providers were found to share)."""

    prompt_tokens: int
    completion_tokens: int | None = None
    offset: int | None = None


class Generation(Struct):
    """The fields kp-infer adds to a prompt record: the answer and what it cost.

    `sampling`, `refused`, `latency_s`, `cost_source`, `finished_at` and `api` came later
    (older records lack them: None, [], None, "usage", None and None): how the answer was
    asked for, the answers paid for before it and not kept (their cost is not in
    `usage.cost`, and counts against `--max-cost`), the seconds from the request sent to the
    answer's end, where `usage.cost` came from (infer/costs.py): "usage" (the answer's own
    `usage.cost`), "generation" (the answer showed none: GET /generation's `total_cost`) or
    "estimate" (no figure in time: its usage tokens at the highest price that could bill it,
    or with no usage at all its worst case; never less than the bill), when it was written
    (UTC, ISO 8601 to the millisecond: the build report's time axis), and the API that
    answered (the base URL's host, recorded/api.py). `reasoning_source` (later still; None
    before): where the reasoning came from, `field`, `details` or `inline` (a leading
    `<think>` block, or the text before a lone `</think>`: kimipipe/think_tags.py).
    `sampled_ids` (later still; None before, and from OpenRouter): the prompt and
    generated IDs as a self-hosted server returned them (`SampledIds`). `sampled_tokens`
    (later still; None before, and where no token logprobs came): the tokens the model
    sampled, from OpenRouter's token logprobs (`SampledTokens`, `kp-infer --logprobs`)."""

    response: ResponseText
    finish_reason: str | None
    model: str
    provider: str | None
    generation_id: str | None
    usage: Usage
    attempts: int = 1
    sampling: Sampling | None = None
    refused: list[Refusal] = msgspec.field(default_factory=list)
    latency_s: float | None = None
    cost_source: str = "usage"
    finished_at: str | None = None
    api: str | None = None  # the base URL's host (recorded/api.py)
    reasoning_source: str | None = None
    sampled_ids: SampledIds | None = None  # the server's own IDs (docs/servers.md)
    sampled_tokens: SampledTokens | None = None  # from token logprobs (docs/kp-infer.md)
    # "unverifiable": the provider named covers an endpoint the routing excludes (a variant
    # told apart by tag only), so the answer cannot be traced to an allowed one
    routing: str | None = None
    # kimipipe's counts the answer was checked against (`kp-infer --tokenizer`); None: unchecked
    identity: Identity | None = None
    # "context": a `length` answer a server stopped at the end of its context (prompt +
    # answer = its max_model_len) before max_tokens; None: any other ending (docs/servers.md)
    cut_by: str | None = None
    # the attempts sent again after a retryable failure before this answer, by cause
    # (kinds.RetryCause: "429" a rate limit, "timeout", "502", ...); None: none, or a record
    # written before the field (the build report draws them over time)
    retried: dict[str, int] | None = None


class Turn(Struct):
    """The fields kp-infer adds to each turn of a conversation (a prompt with
    `follow_ups`), before the Generation fields; the record's `id` is then
    `<conversation>#<turn>` and its `messages` the history exactly as sent:
    `history_reasoning` says whether the earlier turns' reasoning was in it ("keep") or
    left out ("drop"). A prompt without follow-ups keeps its own id and has none of these."""

    conversation: str
    turn: int  # from 1
    turns: int  # the conversation's user turns
    history_reasoning: str  # keep | drop


class Response(Generation, kw_only=True):
    """A response record (kp-infer): a prompt with the Generation fields over it, and on a
    conversation's turn the Turn fields; what kp-infer takes in from a rescue file. (A
    Struct's fields come from one base: Generation's, the larger set that grows, are
    inherited; the prompt's and the turn's are declared here, as Prompt and Turn declare
    them, tests/test_records.py ties them.)"""

    id: str
    dataset: str
    messages: list[Message]
    meta: dict[str, Any] | None = None
    follow_ups: list[str] = msgspec.field(default_factory=list)
    conversation: str | None = None  # records.Turn's fields, on a conversation's turns
    turn: int | None = None
    turns: int | None = None
    history_reasoning: str | None = None


class Failure(Struct, omit_defaults=True):
    """A line of kp-infer's `--failures` file: a prompt that got no answer this run.

    `cost` is set when the failure was paid for: the answers refused for this prompt this
    run (`refused`, each a `Refusal`: a provider the routing flags exclude, no reasoning,
    a think tag left in the content), and counts against `--max-cost` on a rerun; then
    `provider` and `generation_id` name the last of them."""

    id: str
    dataset: str
    kind: str  # permanent | retries_exhausted | routing_violation | no_reasoning | think_marker
    status: int
    code: str
    message: str
    attempts: int
    time: str  # UTC, ISO 8601
    provider: str | None = None
    generation_id: str | None = None
    cost: float = 0.0
    refused: list[Refusal] = msgspec.field(default_factory=list)
    api: str | None = None  # the base URL's host (recorded/api.py)
    # the last error's `metadata.error_type`, as OpenRouter typed it (provider_overloaded, ...)
    error_type: str | None = None
    # as Generation.retried: the attempts sent again after a retryable failure, by cause
    retried: dict[str, int] = msgspec.field(default_factory=dict)


class Resegmented(Struct, omit_defaults=True):
    """A row's sampled IDs against the canonical re-encoding of the same text (the sampled
    parts only; kp-tokenize's `tokenize/resegment.py`). Both spell the same bytes; where
    they cut them otherwise is a region: `regions` of them, holding `sampled` sampled
    tokens and `reencoded` re-encoded ones; `tokens` the sampled tokens compared in all.
    `patterns`: the first regions, each [the sampled pieces, the re-encoded pieces] as
    text (bytes that are not UTF-8 written `\\xNN`)."""

    tokens: int
    regions: int = 0
    sampled: int = 0
    reencoded: int = 0
    patterns: list[tuple[list[str], list[str]]] = msgspec.field(default_factory=list)


class TokenIds(Struct, omit_defaults=True, kw_only=True):
    """The fields kp-tokenize adds to a response record (written last; the ID lists last
    but for `over_max_length`, where kp-shard's fast path looks for them).

    The deltas (later: absent from older records, and where the provider reported no
    count) are the provider's `usage` count minus kimipipe's (tokenize/deltas.py).
    `reasoning_source` is the response record's, or `inline` where kp-tokenize took the
    reasoning from before a lone `</think>` in the content (kimipipe/think_tags.py)."""

    prompt_tokens_delta: int | None = None
    completion_tokens_delta: int | None = None
    reasoning_source: str | None = None
    # `output_ids` are the model's sampled IDs (a server's `sampled_ids`, or the IDs of the
    # `sampled_tokens` of token logprobs), proved against the text: "sampled" when every
    # text part's IDs are, "partial" when some are (the rest re-encoded); and kimipipe's own
    # re-encoding of the text beside them, for the comparison (docs/kp-tokenize.md)
    output_ids_source: str | None = None
    reencoded_ids: list[int] | None = None
    # the text parts whose IDs are sampled ("reasoning", "content"), with output_ids_source
    sampled_parts: list[str] | None = None
    # the sampled IDs against the re-encoding, where some are used (`Resegmented`)
    resegmented: Resegmented | None = None
    # why a record's sampled IDs or tokens were not used (re-encoded instead): a short reason
    sampled_fallback: str | None = None
    input_ids: list[int]
    output_ids: list[int]
    over_max_length: bool = False


class Tokens(Struct):
    """A token record as kp-shard reads it: the ID lists left undecoded (kp-shard checks
    and splices them as bytes, see shard/rows.py)."""

    id: str
    dataset: str
    input_ids: Raw
    output_ids: Raw
    finish_reason: str | None = None
    conversation: str | None = None  # a conversation's turn: the eval split goes by it


class Rejected(Struct):
    """A line of kp-tokenize's `--rejects` file: a record that failed verification."""

    id: str
    line: int
    reason: str


class IdOnly(Struct):
    """What resume needs from a finished record: its id (msgspec skips the rest fast)."""

    id: str


class _CostOfRefusal(Struct):
    cost: float = 0.0


class _CostOfUsage(Struct):
    cost: float = 0.0


def record_cost(usage_cost: float | None, refused_costs, failure_cost: float) -> float:
    """What a kp-infer record cost: THE definition, used by every reader of spend (resume,
    `--spent-in`, `--total-cost`, `make plan`, `kp-infer report`, the pilot's figures).

    A response record (it has `usage`; a token record too): `usage.cost` + the cost of the
    answers refused before it (`refused[].cost`: paid for, not kept, not in `usage.cost`).
    A failure line (no `usage`): its `cost`, which already holds its `refused[].cost`."""
    if usage_cost is not None:
        return usage_cost + sum(refused_costs)
    return failure_cost


class RecordCost(Struct):
    """A responses or failures line as far as spend goes (`paid`: `record_cost`)."""

    usage: _CostOfUsage | None = None
    refused: list[_CostOfRefusal] = msgspec.field(default_factory=list)
    cost: float = 0.0

    @property
    def paid(self) -> float:
        return record_cost(None if self.usage is None else self.usage.cost,
                           (r.cost for r in self.refused), self.cost)


class CostOnly(Struct):
    """What resume needs from a finished response record: its id, its tokens, and what it
    cost (`paid`: `record_cost`)."""

    id: str
    usage: Usage = msgspec.field(default_factory=Usage)
    refused: list[_CostOfRefusal] = msgspec.field(default_factory=list)

    @property
    def paid(self) -> float:
        return record_cost(self.usage.cost, (r.cost for r in self.refused), 0.0)


_encoder = msgspec.json.Encoder()
_passthrough_decoder = msgspec.json.Decoder(dict[str, Raw])


def encode_line(obj: Any) -> bytes:
    """One record as one JSON line, newline included."""
    buf = bytearray()
    _encoder.encode_into(obj, buf)
    buf.extend(b"\n")
    return bytes(buf)


def decode_passthrough(line: bytes) -> dict[str, Raw]:
    """The record's fields as undecoded JSON, to carry fields a stage does not own."""
    return _passthrough_decoder.decode(line)


def encode_over(passthrough: dict[str, Raw], fields: Struct) -> bytes:
    """One record line: PASSTHROUGH (the input record's fields, undecoded) with FIELDS, the
    stage's own Struct, written over them. Every field FIELDS declares is the stage's: an
    input value under one of its names is dropped, and FIELDS go at the end of the object
    (in their declared order; omitted defaults are left out, as the Struct's encoder does).
    """
    for name in type(fields).__struct_encode_fields__:
        passthrough.pop(name, None)
    own = _encoder.encode(fields)
    if not passthrough:
        return own + b"\n"
    base = _encoder.encode(passthrough)
    if own == b"{}":
        return base + b"\n"
    return b"".join((base[:-1], b",", own[1:], b"\n"))
