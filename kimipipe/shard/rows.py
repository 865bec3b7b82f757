"""Token records in, training rows out: validation, filters, and the two row formats.

The hot path never turns token IDs into Python ints. A token record is decoded with its
`input_ids` and `output_ids` as `msgspec.Raw` (msgspec still checks that they are valid
JSON); a few `bytes.find`s (memchr) then prove each list holds only non-negative integers,
and its commas are counted. An `eagle` row is spliced from the raw bytes: the prompt's
list, the output's list, and a `loss_mask` built by repeating `0,` and `1,`. Only
truncation (`--max-length --truncate`) decodes a list of ints, and only for the rows it cuts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import msgspec
from msgspec import Raw, Struct

from ..errors import InputError
from ..records import decode_passthrough, merge_fields


class TokenIds(Struct):
    """What kp-shard needs from a token record (records.Tokens), IDs left undecoded."""

    id: str
    dataset: str
    input_ids: Raw
    output_ids: Raw
    finish_reason: str | None = None


TOKEN_IDS_DECODER = msgspec.json.Decoder(TokenIds)
_encode = msgspec.json.Encoder().encode
_int_list = msgspec.json.Decoder(list[int])


@dataclass
class Drops:
    """Rows left out, by reason (the manifest's `dropped`)."""

    empty_output: int = 0
    too_long: int = 0
    prompt_too_long: int = 0
    short_output: int = 0
    duplicate_id: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)

    def total(self) -> int:
        return sum(self.__dict__.values())


@dataclass
class Row:
    """One training row, encoded: `data` is its compact JSON line, newline included."""

    id: str
    input_tokens: int
    output_tokens: int
    data: bytes


def id_list_body(raw: Raw, name: str, path: str, line: int) -> tuple[memoryview, int]:
    """The compact text between the brackets of a JSON list of token IDs, and its length.

    RAW is already known to be valid JSON (msgspec parsed it). A valid JSON array holds
    only non-negative integers exactly when none of the characters that start another
    kind of value or a sign, fraction or exponent occur in it after its `[`: ten `find`s
    (memchr) prove it. The length is the commas plus one.
    """
    text = bytes(raw)
    if (text[:1] != b"[" or text.find(b"[", 1) >= 0 or b'"' in text or b"-" in text
            or b"." in text or b"e" in text or b"E" in text or b"{" in text or b"t" in text
            or b"f" in text or b"n" in text):
        raise InputError(f"`{name}` must be a list of non-negative integer token IDs", path, line)
    if b" " in text or b"\n" in text or b"\t" in text or b"\r" in text:
        text = text.translate(None, b" \t\r\n")
    if len(text) == 2:
        return memoryview(b""), 0
    return memoryview(text)[1:-1], text.count(b",") + 1


def eval_point(record_id: str) -> float:
    """Where an ID falls in [0, 1): rows below `--eval-fraction` form the eval split.

    A hash of the ID alone (no seed, no dataset, no position), so an ID lands in the same
    split on every rerun and in every dataset it appears in. Reproduce it elsewhere as
    `int.from_bytes(blake2b(id.encode(), digest_size=8, person=b"kp-shard-eval").digest(),
    "big") / 2**64`.
    """
    digest = hashlib.blake2b(record_id.encode(), digest_size=8, person=b"kp-shard-eval").digest()
    return int.from_bytes(digest, "big") / 2.0**64


def id_fingerprint(record_id: str) -> int:
    """A 64-bit fingerprint of an ID, for duplicate detection in bounded memory."""
    digest = hashlib.blake2b(record_id.encode(), digest_size=8, person=b"kp-shard-dup").digest()
    return int.from_bytes(digest, "big")


@dataclass
class RowBuilder:
    """Turns token records into rows of FORMAT, applying the length filters.

    `build` returns the Row, or None when the record is dropped (counted in `drops`).
    """

    fmt: str = "eagle"
    min_output_tokens: int = 1
    max_length: int | None = None
    truncate: bool = False
    drops: Drops = field(default_factory=Drops)
    truncated: int = 0

    def build(self, rec: TokenIds, line: bytes, path: str, lineno: int) -> Row | None:
        prompt, n_in = id_list_body(rec.input_ids, "input_ids", path, lineno)
        output, n_out = id_list_body(rec.output_ids, "output_ids", path, lineno)
        if n_out == 0:
            self.drops.empty_output += 1
            return None
        cut = False
        if self.max_length is not None and n_in + n_out > self.max_length:
            if not self.truncate:
                self.drops.too_long += 1
                return None
            if n_in >= self.max_length:
                self.drops.prompt_too_long += 1
                return None
            n_out = self.max_length - n_in
            output = _encode(_int_list.decode(b"[" + output + b"]")[:n_out])[1:-1]
            cut = True
        if n_out < self.min_output_tokens:
            self.drops.short_output += 1
            return None
        if cut:
            self.truncated += 1
        if self.fmt == "eagle":
            data = eagle_row(rec.id, prompt, n_in, output, n_out)
        else:
            data = raw_row(line, output if cut else None)
        return Row(rec.id, n_in, n_out, data)


def eagle_row(record_id: str, prompt: bytes, n_in: int, output: bytes, n_out: int) -> bytes:
    """`{"id","input_ids": prompt+output,"loss_mask": [0]*n_in+[1]*n_out}` as one line."""
    return b"".join((
        b'{"id":', _encode(record_id),
        b',"input_ids":[', prompt, b"," if n_in else b"", output,
        b'],"loss_mask":[', b"0," * n_in, b"1," * (n_out - 1), b'1]}\n',
    ))


def raw_row(line: bytes, cut_output: bytes | None) -> bytes:
    """The token record as it came, made compact; with its output cut when truncated."""
    if cut_output is not None:
        fields = decode_passthrough(line)
        line = _encode(merge_fields(fields, {"output_ids": Raw(b"[" + cut_output + b"]")}))
    return msgspec.json.format(line, indent=-1) + b"\n"
