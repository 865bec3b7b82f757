"""Token logprobs claims (docs/kp-tokenize.md "Where each row's IDs come from", docs/kp-infer.md
"Token logprobs", openrouter/logprobs.py) that a broken copy of the code once passed the
suite with (issue 51's mutation sample): each test here fails when its claim is broken.

The rows are made by kp-tokenize's Engine in this process (as test_logprobs.py's are), the
plan by kp-infer --plan against the stand-in. Two of kp-tokenize's reasons for not using
sampled tokens need a vocabulary the bundled tokenizers are not: a control token's string
that is also a text token of a byte-level vocabulary (GPT-2's `<|endoftext|>` is both), and
a tokenizer.json whose decoder does not give the tokens' bytes back; both are built here.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from conftest import TOKENIZER_KINDS, kp, response_record
from test_logprobs import CONTENT, REASONING, ids_of, layout_ids, line_with, pieces_of, run
from test_logprobs import engine as engine  # noqa: F401  (the fixture, both tokenizer kinds)

from kimipipe.tokenize.resegment import CONTROL_IN_TEXT, DECODES_OTHERWISE


def test_a_control_token_sent_as_an_empty_token_keeps_the_row_sampled(engine):  # noqa: F811
    """A provider that sends the layout's control tokens (</think>, the end of turn) as
    tokens with no bytes: they are the layout's IDs, and the row is still wholly sampled."""
    think, end = layout_ids(engine)
    reasoning, content = pieces_of(engine, REASONING), pieces_of(engine, CONTENT)
    [row], _ = run(engine, line_with("e", reasoning + [b""] + content + [b""]))
    assert row["output_ids_source"] == "sampled", row.get("sampled_fallback")
    assert row["output_ids"] == ids_of(engine, reasoning) + [think] + ids_of(engine, content) + [end]


def test_a_control_tokens_string_that_is_also_a_text_token_is_not_taken_as_text():
    """In a byte-level vocabulary that holds a control token's string as a text token too
    (GPT-2's `<|endoftext|>`), tokens spelling that string inside the text would name the
    control token's ID: the row is not taken as sampled (`a control token inside the
    text`), where the same text without it is. So too for a control token the layout
    does not place (`<|other|>`): no check of the layout's tokens finds it, its ID does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from kimipipe.tokenize.codec import FastCodec, byte_level_alphabet
    from kimipipe.tokenize.resegment import align

    alphabet = byte_level_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    vocab["<|end|>"] = 256
    vocab["<|other|>"] = 257
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|end|>", "<|other|>"])
    codec = FastCodec(PreTrainedTokenizerFast(tokenizer_object=tok))
    assert codec.control_ids == {256, 257} and codec.text_token_ids([b"<|end|>"]) == [256]
    layout = {"<|end|>": 256}
    segments = [(False, "a<|end|>b"), (True, "<|end|>")]
    control_inside = align([b"a", b"<|end|>", b"b", b"<|end|>"], segments, layout, codec)
    assert control_inside.problem == CONTROL_IN_TEXT
    other = align([b"a", b"<|other|>", b"b", b"<|end|>"], [(False, "a<|other|>b"), (True, "<|end|>")],
                  layout, codec)
    assert other.problem == CONTROL_IN_TEXT
    plain = align([b"a", b"b"], [(False, "ab"), (True, "<|end|>")], layout, codec)
    assert not plain.problem and plain.ids == [[97, 98], None]


def test_ids_that_decode_to_other_text_are_not_used(tmp_path):
    """A tokenizer.json whose decoder depends on how the text is cut (CTC's, which merges a
    token repeated in a row): tokens that spell the text ("hello" sampled as "he" "l" "l"
    "o") but whose IDs decode otherwise are not used; the row is re-encoded (`the IDs
    decode to other text`). The same tokens through the unchanged tokenizer are used."""
    from kimipipe.tokenize.engine import Engine, Settings

    source = TOKENIZER_KINDS["fast"]
    odd = tmp_path / "odd-decoder"
    odd.mkdir()
    for f in source.iterdir():
        (odd / f.name).write_bytes(f.read_bytes())
    spec = json.loads((odd / "tokenizer.json").read_text())
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "CTC", "pad_token": "<no pad>", "word_delimiter_token": "<no delimiter>",
         "cleanup": False}, spec["decoder"]]}
    (odd / "tokenizer.json").write_text(json.dumps(spec))
    engine = Engine(Settings(str(odd)))
    reasoning, content = "Say hello there.", "It is fine."
    canonical = pieces_of(engine, reasoning)
    at = canonical.index(b"lo")
    assert canonical[at - 1] == b"l"  # "hel" "lo": no token repeated in a row
    tokens = canonical[:at] + [b"l", b"o"] + canonical[at + 1:] + pieces_of(engine, content)
    line = line_with("d", tokens, reasoning=reasoning, content=content)
    [row], _ = run(engine, line)
    assert row.get("output_ids_source") is None
    assert row["sampled_fallback"] == DECODES_OTHERWISE
    [good], _ = run(Engine(Settings(str(source))), line)
    assert good["output_ids_source"] == "sampled"


def endpoint_prices(server) -> dict[str, float]:
    """Each endpoint's prompt + completion price per token, from the stand-in's table."""
    url = f"{server.base_url}/models/moonshotai/kimi-k2.5/endpoints"
    with urllib.request.urlopen(url, timeout=30) as resp:
        table = json.load(resp)
    return {e["tag"]: float(e["pricing"]["prompt"]) + float(e["pricing"]["completion"])
            for e in table["data"]["endpoints"]}


def test_plan_share_of_answers_with_tokens_weights_endpoints_by_inverse_square_price(
        standin, tmp_path):
    """Asked, not required: the share of answers expected to carry tokens is OpenRouter's
    load balancing, each allowed endpoint weighted by 1 / price squared."""
    server = standin(logprobs={"moonshotai": "all"})
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(response_record("p", "Why?", "")) + "\n")
    r = kp("infer", prompts, "--plan", "--json", "--logprobs", "--no-require-parameters",
           "--base-url", server.base_url, env=server.env)
    assert r.code == 0, r.stderr
    lp = json.loads(r.stdout)["logprobs"]
    assert (lp["asked"], lp["required"], lp["listing"]) == (True, False, ["moonshotai"])
    allowed = lp["listing"] + lp["not_listing"]
    assert len(allowed) >= 2 and not lp["unknown"]
    price = endpoint_prices(server)
    assert len({price[t] for t in allowed}) > 1  # (equal prices would hide the weighting)
    weight = {t: 1 / price[t] ** 2 for t in allowed}
    assert lp["share"] == pytest.approx(weight["moonshotai"] / sum(weight.values()), rel=1e-6)


def test_null_supported_parameters_do_not_stop_the_preset_from_asking(standin, tmp_path):
    """Kimi K2.5's preset asks for logprobs when no allowed endpoint would be left out: an
    endpoint whose supported_parameters is null (Parasail's here) counts as listing them,
    so they are asked (and required, with the sampling's require_parameters)."""
    server = standin(endpoint_nulls=True,
                     logprobs={s: "all" for s in ("moonshotai", "together", "deepinfra")})
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(response_record("p", "Why?", "")) + "\n")
    r = kp("infer", prompts, "--plan", "--json", "--base-url", server.base_url, env=server.env)
    assert r.code == 0, r.stderr
    data = json.loads(r.stdout)
    lp = data["logprobs"]
    assert lp["unknown"] == ["parasail"] and lp["not_listing"] == []
    assert lp["asked"] is True, data["notes"]
    assert not any("token logprobs not asked" in n for n in data["notes"])
