"""kp-tokenize's exact IDs for pinned cases, on both bundled tokenizer kinds and on Kimi
K2.5's real tokenizer (given the project's K2.5 template with --chat-template, as a user
gives a directory that has none).

The golden files and the command that regenerates them are in tests/golden/tokenize/
(README.md, regenerate.sh). A failure here means the IDs changed: if that was intended,
regenerate and review the diff.
"""

from __future__ import annotations

import json

import pytest
from conftest import ALL_KINDS, REAL_TOKENIZER, REPO, TOKENIZER_KINDS, tokenize_in_process

GOLDEN = REPO / "tests" / "golden" / "tokenize"
CASES = {
    "single-turn", "multi-turn", "no-reasoning", "truncated-in-reasoning", "truncated-in-content",
    "empty-content", "unicode", "injected-special-tokens", "whitespace-verbatim",
}


TEMPLATE = TOKENIZER_KINDS["tiktoken"] / "chat_template.jinja"  # the project's K2.5 template


def tokenizer_args(request, kind) -> list:
    if kind != "real":
        return ["--tokenizer", TOKENIZER_KINDS[kind]]
    request.getfixturevalue("real_tokenizer")  # skips (an error in CI) without the files
    return ["--tokenizer", REAL_TOKENIZER, "--chat-template", TEMPLATE]


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("mode", ["thinking", "no-thinking"])
def test_ids_match_the_golden_file(request, kind, mode):
    suffix = "" if mode == "thinking" else ".no-thinking"
    args = ["--no-thinking"] if mode == "no-thinking" else []
    r = tokenize_in_process(GOLDEN / f"responses{suffix}.jsonl", *tokenizer_args(request, kind),
                            "--trust-remote-code", "--drop-text", "--workers", "1", "-q", *args)
    assert r.code == 0 and r.stderr == ""
    assert r.stdout == (GOLDEN / f"tokens{suffix}.{kind}.jsonl").read_bytes()


BASE = {"fast": 1158, "tiktoken": 1158, "real": 163584}  # [BOS]: the base vocabulary's size


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_golden_files_cover_the_cases_and_put_kimis_tokens_where_they_belong(kind):
    rows = {r["id"]: r for r in map(json.loads, (GOLDEN / f"tokens.{kind}.jsonl").read_text().splitlines())}
    assert set(rows) == CASES
    base = BASE[kind]
    think, think_end, im_end = base + 22, base + 23, base + 2
    for rid, row in rows.items():
        assert row["input_ids"][-1] == think, rid
        out = row["output_ids"]
        if rid == "truncated-in-reasoning":
            assert think_end not in out and im_end not in out
        elif rid == "truncated-in-content":
            assert out.count(think_end) == 1 and im_end not in out
        else:
            assert [i for i in out if i >= base] == [think_end, im_end], rid
    assert rows["no-reasoning"]["output_ids"][0] == think_end
    assert rows["empty-content"]["output_ids"][-2:] == [think_end, im_end]
