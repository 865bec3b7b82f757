"""The tokens the model sampled, laid on the generated turn, and where they differ from
the canonical re-encoding (docs/kp-tokenize.md, "Where each row's IDs come from").

A response record may carry the tokens the model sampled, from OpenRouter's token
logprobs (`sampled_tokens`: each token's bytes, in order). They are laid on the turn's
layout segment by segment (`align`): the reasoning, `</think>`, the content, the
end-of-turn token (tokenize/render.py `TurnLayout.segments`):

- a text segment is sampled when a run of the tokens, from where the last sampled segment
  ended, spells exactly its bytes; each token is then named by its bytes in the text
  vocabulary (codec `text_token_ids`: no encoder, which would re-segment them), and the
  IDs must decode to exactly the segment's text;
- a text segment the tokens do not begin is not covered (a provider whose logprobs cover
  the content but not the reasoning): it is re-encoded, the boundary with the sampled part
  being a control token of the layout;
- a control token of the layout is the layout's ID, whether the tokens hold it (its
  string's bytes, or an empty token there) or not;
- anything else does not prove out, and the whole row is re-encoded, with the reason:
  tokens left over or a segment begun and not finished (a token missing, wrong bytes,
  text trimmed or added by the provider), a token the vocabulary does not hold, a
  control token inside the text, IDs that decode otherwise.

`regions(sampled, canonical)` compares two segmentations of the same bytes: the cut
points they share split both into stretches, and a stretch where they differ is a region
(e.g. "\\n\\n" sampled as "\\n" + "\\n", " 42" as " 4" + "2"). `Resegmented` (records.py)
is what a token record keeps of them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..records import Resegmented

PATTERNS_KEPT = 8  # regions shown per row (all are counted)

# Why sampled tokens were not used (the row re-encoded), as kp-tokenize counts them.
NOT_SPELLED = "the tokens do not spell the text"
NOT_IN_VOCABULARY = "a token the vocabulary does not hold"
CONTROL_IN_TEXT = "a control token inside the text"
DECODES_OTHERWISE = "the IDs decode to other text"
BAD_FIELD = "sampled_tokens unreadable (lengths do not add up)"
NOTHING_COVERED = "the tokens cover no part of the turn"
SPLIT_CHARACTER = "a character split over tokens came as empty bytes, and its tokens cannot be told"
CONTROL_ORDER = "the model's control tokens are not where the layout puts them"
# What the model sampled, the chat template cannot lay out (its reasoning ended at the
# end-of-turn token, no `</think>`; a second `</think>`; a control token inside the text):
# re-encoding would train on a control token it never sampled, or lose one it did, so
# such a row is rejected (kp-tokenize's rejects, counted by reason), never re-encoded.
UNRENDERABLE = (CONTROL_IN_TEXT, CONTROL_ORDER)


@dataclass
class Alignment:
    """The sampled tokens laid on a turn: per segment, the sampled IDs (None: re-encode)."""

    ids: list[list[int] | None] = field(default_factory=list)
    tokens: list[list[bytes] | None] = field(default_factory=list)
    problem: str = ""  # a reason above: nothing is used
    detail: str = ""


def _spelling_run(tokens: list[bytes], start: int, target: bytes) -> tuple[int | None, int]:
    """(the end of the run of TOKENS from START whose bytes are exactly TARGET, or None;
    how many of TARGET's bytes the tokens spelled before they parted from it)."""
    pos, j, n = 0, start, len(tokens)
    while j < n and pos < len(target):
        t = tokens[j]
        if not t or not target.startswith(t, pos):
            return None, pos
        pos += len(t)
        j += 1
    return (j if pos == len(target) else None), pos


def _pieces_of_character(whole: bytes, n: int, codec) -> list[list[bytes]]:
    """Every way WHOLE can be N tokens of the vocabulary, each but the last ending inside a
    UTF-8 character (what made vLLM give it empty bytes)."""
    found = []
    for cuts in itertools.combinations(range(1, len(whole)), n - 1):
        pieces = [whole[a:b] for a, b in itertools.pairwise((0, *cuts, len(whole)))]
        if any(_complete(whole[:b]) for b in cuts):
            continue
        if None not in codec.text_token_ids(pieces):
            found.append(pieces)
    return found


def _complete(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def rebuild_split_characters(tokens: list[bytes], codec) -> tuple[list[bytes], int]:
    """TOKENS with vLLM's split characters rebuilt (its logprobs give a token that ends
    inside a UTF-8 character `bytes []`, and the token completing it the whole character:
    the run's bytes all at its end): each run of empty tokens and the one after it, cut
    into as many tokens of the vocabulary as the run has, where exactly one cut is possible
    (each piece but the last ending inside a character). How many runs were left as they
    came (none fits, or several do: which tokens were sampled cannot be told) is returned
    too. An empty token before one that does not end a multi-byte character (a control
    token's place) is left alone."""
    if b"" not in tokens:
        return tokens, 0
    out: list[bytes] = []
    left = 0
    i, n = 0, len(tokens)
    while i < n:
        j = i
        while j < n and tokens[j] == b"":
            j += 1
        if j == i:
            out.append(tokens[i])
            i += 1
            continue
        if j == n or not tokens[j] or max(tokens[j]) < 0x80:  # (" \xe6" + ... ends inside one)
            out.extend(tokens[i:j])  # not a character's run (a control token's empty place)
            i = j
            continue
        ways = _pieces_of_character(tokens[j], j - i + 1, codec)
        if len(ways) == 1:
            out.extend(ways[0])
        else:
            out.extend(tokens[i:j + 1])
            left += 1
        i = j + 1
    return out, left


def align(tokens: list[bytes], segments: list[tuple[bool, str]], layout_ids: dict[str, int],
          codec) -> Alignment:
    """TOKENS laid on SEGMENTS (see the module text); LAYOUT_IDS: control token -> ID.
    vLLM's split characters are rebuilt first (`rebuild_split_characters`); where one
    cannot be and the tokens do not prove out, the reason says so (SPLIT_CHARACTER)."""
    tokens, unresolved = rebuild_split_characters(tokens, codec)
    found = _align(tokens, segments, layout_ids, codec)
    if found.problem == NOT_SPELLED:
        # more control tokens sampled than the layout has (a reasoning parser drops a
        # second `</think>` from the text, vLLM's kimi_k2 does): what the model sampled,
        # the template cannot lay out (UNRENDERABLE)
        controls = {t.encode("utf-8") for t in layout_ids}
        held = sum(t in controls for t in tokens)
        laid = sum(is_token for is_token, _ in segments)
        if held > laid:
            return _failed(CONTROL_ORDER, f"{held} control tokens sampled, the layout has {laid}")
    if found.problem and found.problem not in UNRENDERABLE:
        # what stopped the tokens spelling a part (a split character left as it came, a
        # character vLLM never finished: `bytes []`, U+FFFD in the text) hides where the
        # control tokens after it stand; where they are is still seen without the text
        misplaced = _misplaced_control(tokens, segments, layout_ids)
        if misplaced:
            return _failed(CONTROL_ORDER, misplaced)
    if found.problem and found.problem not in UNRENDERABLE and unresolved:
        return _failed(SPLIT_CHARACTER, f"{unresolved:,} such character(s)")
    return found


def _misplaced_control(tokens: list[bytes], segments: list[tuple[bool, str]],
                       layout_ids: dict[str, int]) -> str:
    """Where TOKENS hold control tokens (their strings' bytes) that the layout cannot have
    there, whatever their text spells: the first one not the layout's next control token,
    or one right after a text token where the layout has none before it (the model ended its
    reasoning with `<|im_end|>`: the layout has `</think>` and an empty content there).
    The tokens may begin inside the turn (a provider's logprobs that skip the reasoning),
    so the first one is matched to the layout's first of its kind. "" when none is."""
    controls = {t.encode("utf-8"): t for t in layout_ids}
    laid, text = [], False  # the layout's control tokens: (name, text right before it)
    for is_token, piece in segments:
        if is_token:
            laid.append((piece, text))
            text = False
        elif piece:
            text = True
    k, text = None, False
    for t in tokens:
        if t not in controls:
            text = bool(t)  # (an empty token may be a control token's place: none then)
            continue
        name = controls[t]
        if k is None:
            k = next((n for n, (laid_name, _) in enumerate(laid) if laid_name == name), None)
            if k is None:
                return f"{name} where the layout has none"
        elif k >= len(laid) or laid[k][0] != name:
            return f"{name} where the layout has {laid[k][0] if k < len(laid) else 'none'}"
        if text and not laid[k][1]:
            return (f"{name} after text, where the layout has it right after "
                    f"{laid[k - 1][0] if k else 'the start'}")
        k, text = k + 1, False
    return ""


def _align(tokens: list[bytes], segments: list[tuple[bool, str]], layout_ids: dict[str, int],
           codec) -> Alignment:
    out = Alignment()
    i, n = 0, len(tokens)
    parted = ""  # where the tokens began a text segment and parted from it
    controls = {t.encode("utf-8") for t in layout_ids}
    for is_token, text in segments:
        if is_token:
            if i < n and tokens[i] in controls and tokens[i] != text.encode("utf-8"):
                # another control token where the layout has this one: the model ended
                # its reasoning with the end of turn, say; the layout would insert TEXT
                return _failed(CONTROL_ORDER, f"{tokens[i].decode()} where the layout has {text}")
            if i < n and (tokens[i] == text.encode("utf-8") or tokens[i] == b""):
                i += 1
            out.ids.append(None)
            out.tokens.append(None)
            continue
        target = text.encode("utf-8")
        end, reached = _spelling_run(tokens, i, target) if i < n else (None, 0)
        if end is None:
            if reached and not parted:
                parted = (f"; they part from a text piece at its byte {reached:,} of "
                          f"{len(target):,} ({target[reached:reached + 16]!r})")
            out.ids.append(None)
            out.tokens.append(None)
            continue
        run = tokens[i:end]
        if not controls.isdisjoint(run):  # one token spelling a control token is that token
            return _failed(CONTROL_IN_TEXT, "")
        ids = codec.text_token_ids(run)
        if any(t is None for t in ids):
            bad = next(t for t, tid in zip(run, ids, strict=True) if tid is None)
            return _failed(NOT_IN_VOCABULARY, f"{bad!r}")
        control = codec.control_ids
        if not control.isdisjoint(ids):
            return _failed(CONTROL_IN_TEXT, "")
        out.ids.append(ids)
        out.tokens.append(run)
        i = end
    if i < n:
        return _failed(NOT_SPELLED, f"{n - i:,} of {n:,} tokens left over{parted}")
    if all(ids is None for ids in out.ids):
        return _failed(NOTHING_COVERED, "")
    return out


def _failed(problem: str, detail: str) -> Alignment:
    return Alignment(problem=problem, detail=detail)


def regions(sampled: list[bytes], canonical: list[bytes]) -> list[tuple[list[bytes], list[bytes]]]:
    """The stretches where two segmentations of the same bytes cut them otherwise, each as
    (the sampled pieces, the canonical pieces); [] when they are the same."""
    def cuts(pieces):
        at, out = 0, {0: 0}
        for k, p in enumerate(pieces, start=1):
            at += len(p)
            out[at] = k
        return out

    a, b = cuts(sampled), cuts(canonical)
    common = sorted(a.keys() & b.keys())
    found = []
    for lo, hi in itertools.pairwise(common):
        s, c = sampled[a[lo]:a[hi]], canonical[b[lo]:b[hi]]
        if s != c:
            found.append((s, c))
    return found


def shown(piece: bytes) -> str:
    """A piece as text: its UTF-8, bytes that are not UTF-8 as \\xNN."""
    return piece.decode("utf-8", "backslashreplace")


def resegmented(pairs: list[tuple[list[bytes], list[bytes]]]) -> Resegmented:
    """What a token record keeps of a row's comparison (PAIRS: per sampled part, its
    sampled pieces and its canonical pieces)."""
    found = [r for s, c in pairs for r in regions(s, c)]
    return Resegmented(
        tokens=sum(len(s) for s, _ in pairs), regions=len(found),
        sampled=sum(len(s) for s, _ in found), reencoded=sum(len(c) for _, c in found),
        patterns=[([shown(p) for p in s], [shown(p) for p in c])
                  for s, c in found[:PATTERNS_KEPT]])
