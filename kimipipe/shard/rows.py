"""Token records in, training rows out: validation and filters (the row formats: formats.py).

The hot path never turns token IDs into Python ints, nor lets msgspec parse them (number
parsing is ~90% of msgspec's time on a token record): see `TokenRecordDecoder`. An `eagle`
row is then spliced from the raw bytes: the prompt's list, the output's list, and a
`loss_mask` built by repeating `0,` and `1,`. Only truncation (`--max-length --truncate`)
decodes a list of ints, and only for the rows it cuts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import stringzilla as sz
from msgspec import Raw

from ..ids import eval_point  # noqa: F401 (the hash: ids.py)
from .formats import EAGLE, RowFormat
from .provenance import NO_DELTA, Provenance, RecordFacts


@dataclass
class TokenLists:
    """A decoded token record: its id, and each ID list as the compact text between its
    brackets (a view into the line where possible) with its length."""

    id: str
    prompt: memoryview | bytes
    n_in: int
    output: memoryview | bytes
    n_out: int
    conversation: str | None = None  # a conversation's turn (kp-infer's `conversation`)
    record: RecordFacts | None = None  # the rest, as far as provenance.py counts it

    @property
    def split_key(self) -> str:
        """What the eval split hashes: the conversation, so that its turns stay together."""
        return self.conversation or self.id


# records.Tokens, the fields kp-shard reads, and (undecoded) those the card counts
_full_decoder = msgspec.json.Decoder(RecordFacts)
_COMMA = ord(",")
_ZERO = ord("0")
_encode = msgspec.json.Encoder().encode
_int_list = msgspec.json.Decoder(list[int])
# The keys records.TokenIds writes and records.Tokens reads (tests/test_records.py ties them).
_INPUT_KEY = b'"input_ids"'
_OUTPUT_KEY = b'"output_ids"'
_IN_LEN = len(_INPUT_KEY)
_OUT_LEN = len(_OUTPUT_KEY)
_MARKER = b'"\\u0000kp-shard"'  # what no token record holds as its input_ids
_MARKER_RAW = Raw(_MARKER)
_OUTPUT_AT_END = b'],"output_ids":['  # what precedes the output list when the lists end a record
_OUTPUT_AT_END_LEN = len(_OUTPUT_AT_END)
_INPUT_OPEN = b'"input_ids":['
_INPUT_OPEN_LEN = len(_INPUT_OPEN)
_ID_BYTES = b"0123456789,"
_COMMA_IS_ONE = bytes(int(i == _COMMA) for i in range(256))  # bytesum of the image = commas
_DIGIT_CLASS = bytes.maketrans(b"123456789", b"111111111")  # `0` and `,` kept, 1-9 -> `1`


def _bad_list(name: str) -> msgspec.ValidationError:
    return msgspec.ValidationError(f"`{name}` must be a list of non-negative integer token IDs")


class IdListChecker:
    """Checks and counts the body of an ID list in place: `N(,N)*`, N a JSON non-negative
    integer (digits, no leading zero), as the bytes [a:b] of a line, without copying it.

    Whole-span SIMD scans (stringzilla): no byte but digits and commas, no `,,`, no comma
    first or last, and no `,0` unless each such zero is a whole number (checked exactly,
    on a copy, only for a list holding one); the commas are counted by mapping each byte
    to 0 or 1 and summing. Holds the scratch buffer of that map, so one per thread.
    """

    def __init__(self) -> None:
        self._scratch = bytearray(1 << 16)

    def commas(self, buf, a: int, b: int) -> int | None:
        """The commas in buf[a:b] if it is a valid, non-empty list body, else None."""
        if (b <= a or sz.find_first_not_of(buf, _ID_BYTES, a, b) >= 0
                or buf[a] == _COMMA or buf[b - 1] == _COMMA or sz.find(buf, b",,", a, b) >= 0):
            return None
        if (buf[a] == _ZERO or sz.find(buf, b",0", a, b) >= 0) and not _zeros_whole(buf, a, b):
            return None
        n = b - a
        if n > len(self._scratch):
            self._scratch = bytearray(n)
        ones = memoryview(self._scratch)[:n]
        sz.translate(buf, _COMMA_IS_ONE, start=a, end=b, out=ones)
        return sz.bytesum(ones)

    def count(self, body, name: str) -> int:
        """The IDs in a list body (empty: 0). Raises naming NAME unless it is valid.
        (The slow path's check.)"""
        if not body:
            return 0
        commas = self.commas(body, 0, len(body))
        if commas is None:
            raise _bad_list(name)
        return commas + 1


def _zeros_whole(buf, a: int, b: int) -> bool:
    """No number in buf[a:b] (digits and commas, no empty number) has a leading zero."""
    classes = sz.translate(buf, _DIGIT_CLASS, start=a, end=b)  # a copy: rare, so fine
    return (classes[:2] not in (b"00", b"01") and sz.find(classes, b",00") < 0
            and sz.find(classes, b",01") < 0)


def _lists_at_end(line: bytes) -> tuple[int, int, int, int] | None:
    """Where the two lists are when they come last, as kimipipe writes them
    (`...,"input_ids":[...],"output_ids":[...]` and then nothing holding a `[`): found
    backwards from the end with single-byte searches (a list holds no `[`), so the text
    before them is never scanned. None if the line is not laid out that way."""
    o0 = line.rfind(b"[") + 1
    i1 = o0 - _OUTPUT_AT_END_LEN  # (a negative start would count from the end)
    if i1 < _INPUT_OPEN_LEN or not line.startswith(_OUTPUT_AT_END, i1):
        return None
    o1 = line.find(b"]", o0)
    i0 = line.rfind(b"[", 0, i1) + 1
    if (o1 <= o0 or i1 <= i0 or i0 < _INPUT_OPEN_LEN
            or not line.startswith(_INPUT_OPEN, i0 - _INPUT_OPEN_LEN)):
        return None
    return i0, i1, o0, o1


def _lists_by_key(line: bytes) -> tuple[int, int, int, int] | None:
    """Where the two lists are, at the first `"input_ids":[` and the `"output_ids":[`
    after it (or before it); None if either is missing or empty."""
    i = line.find(_INPUT_KEY)
    if i < 0 or line[i + _IN_LEN:i + _IN_LEN + 2] != b":[":
        return None
    i0 = i + _IN_LEN + 2
    i1 = line.find(b"]", i0)
    if i1 < 0:
        return None
    o = line.find(_OUTPUT_KEY, i1)  # kimipipe writes output_ids after input_ids
    if o < 0:
        o = line.find(_OUTPUT_KEY, 0, i)
    if o < 0 or line[o + _OUT_LEN:o + _OUT_LEN + 2] != b":[":
        return None
    o0 = o + _OUT_LEN + 2
    o1 = line.find(b"]", o0)
    if o1 < 0 or i1 == i0 or o1 == o0:
        return None  # (an empty list: rare, left to the slow path)
    return i0, i1, o0, o1


class TokenRecordDecoder:
    """Decodes a token-record line into TokenLists; plugs into `io.iter_records`.

    Fast path (lines as kimipipe writes them: compact, non-empty lists): the two ID lists
    are checked and counted where they lie in the line (`IdListChecker`), and the rest of
    the line, a marker string in place of each list, is parsed by msgspec. The lists are
    looked for first where kimipipe puts them, ending the record (`_lists_at_end`:
    searched backwards, one byte at a time, so the text before them is never scanned),
    then at their keys (`_lists_by_key`). The msgspec parse validates
    every other byte and field, so the line is proven valid JSON and well-typed, and the
    marker coming back as the record's own `input_ids` and `output_ids` proves the lists
    cut out were the record's own (not a key nested in another field). Anything else
    (whitespace or an empty list, escapes spelling a key) takes the slow path: msgspec
    parses the whole line and the lists are checked from its raw values. Errors come out
    of either path as msgspec errors, which `iter_records` reports as
    `PATH:LINE: what is wrong`.
    """

    def __init__(self) -> None:
        self.ids = IdListChecker()

    def decode(self, line: bytes) -> TokenLists:
        spans = _lists_at_end(line)
        fast = self._checked(line, *spans) if spans is not None else None
        if fast is None:
            fast = self._fast(line)
        return fast if fast is not None else self._slow(line)

    def _fast(self, line: bytes) -> TokenLists | None:
        """The fast path for lists anywhere, found at their keys (see `_lists_by_key`)."""
        spans = _lists_by_key(line)
        return self._checked(line, *spans) if spans is not None else None

    def _checked(self, line: bytes, i0: int, i1: int, o0: int, o1: int) -> TokenLists | None:
        """The record if the lists at [i0:i1] and [o0:o1] are its own and valid, else None."""
        # Each list checked and counted where it lies in the line (no copy).
        check = self.ids.commas
        in_commas = check(line, i0, i1)
        out_commas = check(line, o0, o1) if in_commas is not None else None
        if out_commas is None:
            return None  # let the slow path name the error exactly
        n_in, n_out = in_commas + 1, out_commas + 1
        # The rest of the line, each list replaced by a marker string, goes through
        # msgspec, which checks every byte and field of it. If the record's own fields
        # are not exactly our markers, the keys we found were not its own (nested, or
        # the record spells a key with an escape): the caller tries elsewhere or the slow
        # path decides.
        view = memoryview(line)
        (a0, a1), (b0, b1) = sorted(((i0, i1), (o0, o1)))
        try:
            rec = _full_decoder.decode(b"".join((view[:a0 - 1], _MARKER, view[a1 + 1:b0 - 1],
                                                 _MARKER, view[b1 + 1:])))
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None  # the slow path reports it, with byte offsets into the real line
        if rec.input_ids != _MARKER_RAW or rec.output_ids != _MARKER_RAW:
            return None
        return TokenLists(rec.id, view[i0:i1], n_in, view[o0:o1], n_out, rec.conversation, rec)

    def _slow(self, line: bytes) -> TokenLists:
        rec = _full_decoder.decode(line)
        prompt, n_in = _raw_list_body(rec.input_ids, "input_ids", self.ids)
        output, n_out = _raw_list_body(rec.output_ids, "output_ids", self.ids)
        return TokenLists(rec.id, prompt, n_in, output, n_out, rec.conversation, rec)


def _raw_list_body(raw: Raw, name: str, ids: IdListChecker) -> tuple[bytes, int]:
    """The compact body of a list msgspec has parsed (so valid JSON) and its length."""
    text = bytes(raw)
    if text[:1] != b"[":
        raise _bad_list(name)
    text = text.translate(None, b" \t\r\n")
    body = text[1:-1]
    return body, ids.count(body, name)


TOKEN_RECORD_DECODER = TokenRecordDecoder()


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
    split_key: str = ""  # the id, or the conversation of a turn (`eval_point` hashes it)
    # where it came from (provenance.py): its profile, and its token-count deltas
    profile: int = 0
    prompt_delta: int = NO_DELTA
    completion_delta: int = NO_DELTA


def id_fingerprint(record_id: str) -> int:
    """A 64-bit fingerprint of an ID, for duplicate detection within one process (Python's
    own string hash: cached on the string, and all that a set of fingerprints needs)."""
    return hash(record_id)


@dataclass
class RowBuilder:
    """Turns token records into rows of FMT (formats.py), applying the length filters.

    `build` returns the Row, or None when the record is dropped (counted in `drops`).
    """

    fmt: RowFormat = EAGLE
    min_output_tokens: int = 1
    max_length: int | None = None
    truncate: bool = False
    drops: Drops = field(default_factory=Drops)
    truncated: int = 0
    provenance: Provenance | None = None  # profiles of the rows built (None: not counted)

    def __post_init__(self) -> None:
        self._row = self.fmt.build  # (looked up once: build runs once per row)

    def build(self, rec: TokenLists, line: bytes) -> Row | None:
        prompt, n_in, output, n_out = rec.prompt, rec.n_in, rec.output, rec.n_out
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
        row = Row(rec.id, n_in, n_out, self._row(rec.id, prompt, n_in, output, n_out, line, cut),
                  rec.split_key)
        if self.provenance is not None and rec.record is not None:
            row.profile = self.provenance.profile(rec.record)
            row.prompt_delta, row.completion_delta = self.provenance.deltas_of(rec.record)
        return row
