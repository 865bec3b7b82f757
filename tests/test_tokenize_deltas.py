"""The provider's own token counts as a second opinion on every row (docs/tokenize.md).

kp-infer buys answers from the stand-in counting usage with Kimi K2.5's real tokenizer as
a server does (transformers' apply_chat_template and the tokenizer's encode: not
kp-tokenize's code), then kp-tokenize on the same tokenizer writes each row's
`prompt_tokens_delta` and `completion_tokens_delta`, summarises them per provider, warns
about a provider that renders prompts otherwise (or, all alike, about the template), and
`--max-prompt-delta` rejects rows further off. `kp-infer report` shows the same table.
"""

from __future__ import annotations

import json

import pytest
from conftest import kp, read_jsonl, tokenize_in_process, write_jsonl
from test_infer import infer, make_prompts


@pytest.fixture(scope="module")
def bought(real_tokenizer, tmp_path_factory):
    """Response records from the stand-in counting with the real tokenizer (one run)."""
    from kimipipe.standin.testing import StandIn

    tmp = tmp_path_factory.mktemp("deltas")
    server = StandIn(tokenizer=real_tokenizer, workdir=tmp / "standin").start()
    try:
        prompts = make_prompts(tmp / "p.jsonl", 24)
        out = tmp / "r.jsonl"
        r = infer(server, prompts, "-o", out, "--max-tokens", "150")
        assert r.code == 0, r.stderr
    finally:
        server.stop()
    records = read_jsonl(out)
    assert {x["finish_reason"] for x in records} == {"stop", "length"}
    assert len({x["provider"] for x in records}) >= 2
    return tmp, out, records


def test_no_answer_is_counted_or_billed_past_max_tokens(bought):
    """A server stops at max_tokens of its own tokens: a cut answer's count is at most
    150 and only a word short of it (the stand-in cut in words, and counted 669 under 160)."""
    _, _, records = bought
    cut = [x["usage"]["completion_tokens"] for x in records if x["finish_reason"] == "length"]
    assert cut and max(x["usage"]["completion_tokens"] for x in records) <= 150
    assert min(cut) > 150 - 16, cut  # (the longest word of the stand-in's is under 16 tokens)


def tokenize(src, tokenizer, *args):
    """kp-tokenize run in this process: the counts are the engine's (conftest.tokenize_in_process)."""
    return tokenize_in_process(src, "--tokenizer", tokenizer, "--trust-remote-code", "--workers",
                               "1", *args)


def test_counts_agree_with_a_server_counting_on_the_same_tokenizer(bought, real_tokenizer):
    tmp, src, responses = bought
    r = tokenize(src, real_tokenizer, "-o", tmp / "t.jsonl")
    assert r.code == 0, r.stderr
    rows = read_jsonl(tmp / "t.jsonl")
    think_end, im_end = 163607, 163586
    for row, rec in zip(rows, responses, strict=True):
        assert row["prompt_tokens_delta"] == rec["usage"]["prompt_tokens"] - len(row["input_ids"]) == 0
        # the server counts the </think> and <|im_end|> it sampled; kp-tokenize's count
        # leaves out the structural tokens it inserts: the delta is exactly those
        structural = sum(i in (think_end, im_end) for i in row["output_ids"])
        assert row["completion_tokens_delta"] == structural, row["id"]
        assert structural == (2 if row["finish_reason"] == "stop" else int(bool(rec["response"]["content"])))
    assert "warning" not in r.stderr
    # and the summary says why the completion's delta is +2, not 0
    assert ("completion: +2 expected on a finished thinking turn, +1 on one cut or without "
            "thinking: the provider counts the </think> and end-of-turn tokens it sampled, "
            "kimipipe's count leaves them out):") in r.stderr
    providers = sorted({x["provider"] for x in rows})
    for name in providers:
        n = sum(x["provider"] == name for x in rows)
        assert f"  {name}" in r.stderr and f"prompt {n}/{n} zero, typical +0" in r.stderr


def shifted(responses, path, offsets: dict):
    """RESPONSES with each provider's prompt_tokens moved by OFFSETS[provider] (as a
    provider that renders a default system prompt would count)."""
    rows = []
    for rec in responses:
        rec = json.loads(json.dumps(rec))
        rec["usage"]["prompt_tokens"] += offsets.get(rec["provider"], 0)
        rows.append(rec)
    return write_jsonl(path, rows)


def test_a_provider_that_renders_otherwise_is_named_and_max_prompt_delta_rejects_it(bought, real_tokenizer):
    tmp, _, responses = bought
    odd = responses[0]["provider"]
    src = shifted(responses, tmp / "odd.jsonl", {odd: 12})
    tokens = tmp / "odd.tokens.jsonl"
    first = r = tokenize(src, real_tokenizer, "-o", tokens)
    assert r.code == 0, r.stderr
    n = sum(x["provider"] == odd for x in responses)
    assert (f"kp-tokenize: warning: provider {odd}: prompt_tokens differs from kimipipe's count on "
            f"{n} of {n} rows (typical offset +12)") in r.stderr
    assert r.stderr.count("warning") == 1  # the others count as kimipipe does
    assert {x["prompt_tokens_delta"] for x in read_jsonl(tokens) if x["provider"] == odd} == {12}

    rejects = tmp / "rejects.jsonl"
    r = tokenize(src, real_tokenizer, "--max-prompt-delta", "3", "--rejects", rejects)
    assert r.code == 4, r.stderr
    assert {x["id"] for x in read_jsonl(rejects)} == {x["id"] for x in responses if x["provider"] == odd}
    assert all("prompt_tokens_delta +12" in x["reason"] for x in read_jsonl(rejects))
    assert {x["provider"] for x in r.records()} == {x["provider"] for x in responses} - {odd}
    assert tokenize(src, real_tokenizer, "--max-prompt-delta", "12", "-q").code == 0

    # kp-infer report: the same table from the token records, and the same warning
    report = kp("infer", "report", tokens)
    assert report.code == 0, report.stderr
    table = [line.removeprefix("kp-tokenize: ") for line in first.stderr.splitlines()
             if line.startswith("kp-tokenize:   ")]
    assert len(table) == len({x["provider"] for x in responses})
    text = report.stdout.decode()
    assert all(line in text.splitlines() for line in table)
    assert f"warning: provider {odd}: prompt_tokens differs" in text
    as_json = json.loads(kp("infer", "report", tokens, "--json").stdout)
    [row] = [x for x in as_json["token_deltas"] if x["provider"] == odd]
    assert row["rows"] == n and row["prompt"] == {"zero": 0, "typical": 12, "min": 12, "p50": 12, "max": 12}


def test_an_offset_every_provider_shares_blames_the_template_with_its_rendering(bought, real_tokenizer):
    tmp, _, responses = bought
    src = shifted(responses, tmp / "all.jsonl", {x["provider"]: 9 for x in responses})
    r = tokenize(src, real_tokenizer)
    assert r.code == 0, r.stderr
    [warning] = [line for line in r.stderr.splitlines() if "warning" in line]
    assert "every provider's prompt_tokens is +9 from kimipipe's count" in warning
    assert "the chat template kp-tokenize renders with is the one that differs" in warning
    rid = warning.split("compare its rendering of ")[1].split(" ")[0]
    [rec] = [x for x in responses if x["id"] == rid]
    rendered = "<|im_user|>user<|im_middle|>" + rec["messages"][-1]["content"] + "<|im_end|>"
    assert rendered in warning and warning.endswith("<think>'")
    assert "provider " not in warning.split("(all")[0]
