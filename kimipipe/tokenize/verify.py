"""Proof that a row's IDs are the text, run on every record.

A row passes when:
- `decode(input_ids + output_ids)` equals the rendered prompt plus the rendered generated
  turn, character for character;
- the prompt ends as the preset says the generation prompt ends (e.g. `<think>`), so the
  thinking mode and the template agree;
- no ID encoded from the model's text is a control token: a literal `<|im_end|>` typed in an
  answer stays text (decoding alone cannot see this: both spell the same characters).
Each failure is a one-line reason, written to the rejects file.
"""

from __future__ import annotations


def first_difference(expected: str, got: str) -> str:
    """Where two texts part, shown briefly."""
    n = min(len(expected), len(got))
    i = next((k for k in range(n) if expected[k] != got[k]), n)
    return (f"at character {i} of {len(expected)}: expected {expected[i:i + 24]!r}, "
            f"decoded {got[i:i + 24]!r}")


def check_prompt_end(prompt_text: str, prompt_end: str, thinking: bool) -> str | None:
    if prompt_text.endswith(prompt_end):
        return None
    mode = "--thinking" if thinking else "--no-thinking"
    return (f"the rendered prompt does not end with {prompt_end!r} as the preset expects with "
            f"{mode} (it ends {prompt_text[-24:]!r})")


def check_text_ids(ids: list[int], control_ids: frozenset[int]) -> str | None:
    if control_ids.isdisjoint(ids):
        return None
    bad = next(i for i in ids if i in control_ids)
    return f"generated text encoded to control token ID {bad}"


def check_roundtrip(decoded: str, expected: str) -> str | None:
    if decoded == expected:
        return None
    return "decode(input_ids + output_ids) differs from the rendered text " + first_difference(expected, decoded)
