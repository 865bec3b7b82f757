"""kimipipe.tokenize's parts: fixtures, loading (offline, remote code, HF cache), codecs, layouts;
and the partition rule kp-infer shares."""

from __future__ import annotations

import filecmp
import json
import shutil

import pytest
from conftest import (
    ALL_KINDS,
    TOKENIZER_KINDS,
    TOKENIZERS,
    fake_hf_cache,
    kp,
    read_jsonl,
    response_record,
    tokenize_in_process,
    tokenizer_dir,
    write_jsonl,
)
from test_infer import infer, make_prompts

from kimipipe.tokenize import fixtures
from kimipipe.tokenize.codec import FastCodec, make_codec
from kimipipe.tokenize.load import (
    TokenizerLoadError,
    _named_class,
    load_tokenizer,
    prepare_tokenizer_dir,
)
from kimipipe.tokenize.render import PRESETS, TurnLayout
from kimipipe.tokenize.verify import check_roundtrip, check_text_ids


def test_bundled_tokenizers_are_what_the_builder_makes(tmp_path):
    built = fixtures.build_all(tmp_path)
    for kind, path in built.items():
        bundled = TOKENIZER_KINDS[kind]
        cmp = filecmp.dircmp(path, bundled)
        assert not cmp.left_only and not cmp.right_only, kind
        _, mismatch, errors = filecmp.cmpfiles(path, bundled, cmp.common_files, shallow=False)
        assert mismatch == [] and errors == [], (kind, mismatch)
    total = sum(p.stat().st_size for p in TOKENIZERS.rglob("*") if p.is_file())
    assert total < 512 * 1024


def test_special_tokens_sit_at_kimis_offsets_in_both_kinds():
    for directory in TOKENIZER_KINDS.values():
        tok = load_tokenizer(directory, trust_remote_code=True)
        base = tok.convert_tokens_to_ids("[BOS]")
        got = {t: tok.convert_tokens_to_ids(t) - base for t in fixtures.KIMI_SPECIAL_OFFSETS}
        assert got == fixtures.KIMI_SPECIAL_OFFSETS


def test_fast_codec_keeps_non_special_added_tokens_as_text():
    """Qwen3/DeepSeek-R1 add <think> as a NON-special token: split_special_tokens misses it."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_file(str(TOKENIZER_KINDS["fast"] / "tokenizer.json"))
    backend.add_tokens([AddedToken("<reflect>", special=False, normalized=False)])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend)
    reflect = tok.convert_tokens_to_ids("<reflect>")
    text = "a <reflect> b <|im_end|>"
    assert reflect in tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    codec = FastCodec(tok)
    [ids] = codec.encode_text([text])
    assert reflect not in ids and tok.convert_tokens_to_ids("<|im_end|>") not in ids
    assert codec.decode([ids]) == [text]
    assert check_text_ids(ids, codec.control_ids) is None
    assert codec.encode_prompt([text])[0].count(reflect) == 1


def test_fast_codec_ignores_truncation_configured_in_tokenizer_json():
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_file(str(TOKENIZER_KINDS["fast"] / "tokenizer.json"))
    backend.enable_truncation(max_length=4)
    codec = FastCodec(PreTrainedTokenizerFast(tokenizer_object=backend))
    text = "a long answer that is far more than four tokens"
    assert codec.decode(codec.encode_text([text])) == [text]


def test_layout_splits_structure_before_filling_in_text():
    tok = load_tokenizer(TOKENIZER_KINDS["fast"])
    codec = make_codec(tok)
    kimi = TurnLayout.resolve(PRESETS["kimi-k2.5"], True, codec.token_id)
    assert kimi.segments("r</think>", "c<|im_end|>", False) == [
        (False, "r</think>"), (True, "</think>"), (False, "c<|im_end|>"), (True, "<|im_end|>")]
    assert kimi.segments("{content}", "x", False)[0] == (False, "{content}")
    assert kimi.segments("r", "", True) == [(False, "r")]
    assert kimi.segments("r", "c", True) == [(False, "r"), (True, "</think>"), (False, "c")]
    assert kimi.segments("", "", False) == [(True, "</think>"), (True, "<|im_end|>")]
    # A layout with literal newlines around the fields (Qwen3's): they join the text runs.
    qwen = TurnLayout.resolve(PRESETS["qwen3"], True, codec.token_id)
    assert qwen.segments("r", "c", False) == [
        (True, "<think>"), (False, "\nr\n"), (True, "</think>"), (False, "\n\nc"), (True, "<|im_end|>")]
    assert qwen.segments("r", "", True) == [(True, "<think>"), (False, "\nr")]


def test_roundtrip_check_names_where_texts_part():
    assert check_roundtrip("same", "same") is None
    reason = check_roundtrip("abcX", "abcd")
    assert "at character 3 of 4" in reason and "'d'" in reason and "'X'" in reason


def test_engine_rejects_a_row_whose_ids_do_not_decode_to_the_text(tmp_path):
    """A lossy decoder (as some tokenizers have) must be caught by the round-trip check."""
    from kimipipe.tokenize.engine import Engine, Settings

    engine = Engine(Settings(str(TOKENIZER_KINDS["fast"])))
    real_decode = engine.codec.decode
    engine.codec.decode = lambda seqs: [s.replace("  ", " ") for s in real_decode(seqs)]
    line = json.dumps(response_record("w", "Hi", content="two  spaces")).encode()
    [bad] = engine.process([(1, line)])
    assert bad.kind == "reject" and "differs from the rendered text" in bad.reason
    [ok] = engine.process([(2, json.dumps(response_record("v", "Hi", content="one space")).encode())])
    assert ok.kind == "ok"


def _kimi_copy(tmp_path, extra_import: str | None = None):
    d = tmp_path / "kimi"
    shutil.copytree(TOKENIZER_KINDS["tiktoken"], d)
    if extra_import:
        code = d / "tokenization_kimi.py"
        code.write_text(code.read_text().replace("import tiktoken\n", f"import tiktoken\nimport {extra_import}\n", 1))
    return d


def test_missing_package_of_the_tokenizer_code_is_named_in_one_line(tmp_path):
    d = _kimi_copy(tmp_path, "kp_not_a_real_package")
    src = write_jsonl(tmp_path / "r.jsonl", [response_record("a", "Hi", content="ok")])
    r = kp("tokenize", src, "--tokenizer", d, "--trust-remote-code",
           env={"HF_HOME": str(tmp_path / "hf")})
    assert r.code == 2
    assert r.stderr.strip().splitlines() == [
        f"kp-tokenize: the tokenizer code in {d} needs the Python package `kp_not_a_real_package`, "
        "which is not installed (pip install kp_not_a_real_package)"]


def test_a_model_name_in_the_hf_cache_loads_offline_despite_symlinked_code(tmp_path):
    """The cache keeps files as symlinks into blobs/; the code's relative import must still work."""
    env = fake_hf_cache(tmp_path / "hf", TOKENIZER_KINDS["tiktoken"])
    src = write_jsonl(tmp_path / "r.jsonl", [response_record("a", "Hi", content="ok")])
    by_name = kp("tokenize", src, "--tokenizer", "moonshotai/Kimi-K2.5", "--trust-remote-code", env=env)
    by_dir = kp("tokenize", src, "--tokenizer", TOKENIZER_KINDS["tiktoken"], "--trust-remote-code", env=env)
    assert by_name.code == 0, by_name.stderr
    assert by_name.stdout == by_dir.stdout and by_name.records()[0]["output_ids"]


CONVERSATIONS = [
    [{"role": "user", "content": "Hi <|im_end|> <think>x</think> 你好 😀"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4.", "reasoning_content": "Add."},
     {"role": "user", "content": "  and 3+3?\n\n"}],
]


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_a_tokenizer_naming_its_own_class_loads_as_autotokenizer_loads_it(request, kind):
    """load_tokenizer takes the class a directory names (its code, or the plain tokenizers
    backend) without AutoTokenizer's model table (0.25 CPU-s a start): the tokenizer must be
    the one AutoTokenizer gives, down to every ID the chat template makes."""
    d = tokenizer_dir(request, kind)
    assert _named_class(d, trust_remote_code=True) is not None  # each kind takes the short way
    direct = load_tokenizer(d, trust_remote_code=True)
    auto = load_tokenizer(d, trust_remote_code=True, auto=True)
    assert type(direct) is type(auto)
    assert direct.get_vocab() == auto.get_vocab() and len(direct) == len(auto)
    assert direct.all_special_tokens == auto.all_special_tokens
    assert direct.added_tokens_decoder == auto.added_tokens_decoder
    assert direct.chat_template == auto.chat_template
    for messages in CONVERSATIONS:
        for thinking in (True, False):
            args = dict(tokenize=True, add_generation_prompt=True, thinking=thinking,
                        return_dict=False)
            assert (list(direct.apply_chat_template(messages, **args))
                    == list(auto.apply_chat_template(messages, **args)))
    text = CONVERSATIONS[1][-1]["content"] + CONVERSATIONS[0][0]["content"]
    assert direct.encode(text) == auto.encode(text)


def test_a_tokenizer_of_a_known_model_is_left_to_autotokenizer(tmp_path):
    """Where AutoTokenizer has rules of its own (a model's config.json, a transformers class
    named beside the code, code from another repository, no trust), it decides."""
    cases = {
        "model-config": lambda d: (d / "config.json").write_text(json.dumps({"model_type": "llama"})),
        "transformers-class": lambda d: _edit_config(d, tokenizer_class="Qwen2TokenizerFast"),
        "upstream-code": lambda d: _edit_config(d, auto_map={"AutoTokenizer": [
            "moonshotai/Kimi-K2.5--tokenization_kimi.TikTokenTokenizer", None]}),
    }
    for name, edit in cases.items():
        d = shutil.copytree(TOKENIZER_KINDS["tiktoken"], tmp_path / name)
        edit(d)
        assert _named_class(d, trust_remote_code=True) is None, name
    assert _named_class(TOKENIZER_KINDS["tiktoken"], trust_remote_code=False) is None
    fast = shutil.copytree(TOKENIZER_KINDS["fast"], tmp_path / "fast-llama")
    _edit_config(fast, tokenizer_class="LlamaTokenizerFast")
    assert _named_class(fast, trust_remote_code=True) is None
    assert _named_class(TOKENIZER_KINDS["fast"], trust_remote_code=False) is not None


def _edit_config(d, **changes):
    config = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**config, **changes}))


def test_prepare_refuses_a_directory_that_is_not_a_tokenizer(tmp_path):
    with pytest.raises(TokenizerLoadError, match="not a tokenizer directory"):
        prepare_tokenizer_dir(str(tmp_path), False)


def test_tiktoken_codec_gives_kimis_own_encode_ids_on_both_paths():
    tok = load_tokenizer(TOKENIZER_KINDS["tiktoken"], trust_remote_code=True)
    codec = make_codec(tok)
    texts = ["plain words <|im_end|> <think> here\n\n", "  " * 15000 + "x", "the" * 8340 + " z",
             "你好，世界" * 10 + " e\u0301 😀", ""]
    assert codec.encode_text(texts) == [tok.encode(t, allow_special_tokens=False) for t in texts]
    assert codec.encode_prompt(texts) == [tok.encode(t) for t in texts]
    assert [codec._one_slice(t) for t in texts] == [True, False, False, True, True]
    # a prompt's special tokens named as found in it, as tiktoken's "all" would match them:
    # side by side, inside words, a head shared by several, a token's look-alike, none
    specials = sorted(codec.enc.special_tokens_set)
    prompts = ["<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>", "x<think></think>y",
               "".join(specials) + "tail", "<|im_end<|im_end|>|>[BOS[BOS]", "no special here <|"]
    assert [codec.encode_prompt([t])[0] for t in prompts] == [
        codec.enc.encode(t, allowed_special="all") for t in prompts]
    assert codec._specials_in(prompts[3]) == {"<|im_end|>", "[BOS]"} and not codec._specials_in(prompts[4])
    # The long-run slices really change the IDs, so the slow path is not for show.
    assert codec.enc.encode_ordinary(texts[2]) != tok.encode(texts[2], allow_special_tokens=False)


def test_model_config_code_in_the_directory_is_not_run(tmp_path):
    """A full model snapshot has config.json whose code may import torch: not needed to tokenize."""
    d = _kimi_copy(tmp_path)
    (d / "config.json").write_text(json.dumps({
        "model_type": "kimi_k25", "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"}}))
    (d / "configuration_kimi_k25.py").write_text(
        "import kp_not_a_real_package\nfrom transformers import PretrainedConfig\n\n\n"
        "class KimiK25Config(PretrainedConfig):\n    model_type = 'kimi_k25'\n")
    tok = load_tokenizer(prepare_tokenizer_dir(str(d), True), trust_remote_code=True)
    assert type(tok).__name__ == "TikTokenTokenizer"
    assert tok.decode(tok.encode("hello <|im_end|>")) == "hello <|im_end|>"


QWEN3_LIKE_TEMPLATE = """\
{%- for m in messages -%}
{%- if m['role'] == 'assistant' -%}
{{- '<|im_start|>assistant\\n<think>\\n' + (m.get('reasoning_content') or '') + '\\n</think>\\n\\n' + m['content'] + '<|im_end|>\\n' -}}
{%- else -%}
{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}
{%- endif -%}"""


def test_qwen3_preset_end_to_end_with_non_special_think_tokens(tmp_path):
    """A Qwen3-shaped fast tokenizer: <think> and </think> are added tokens that are NOT special."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    bare = fixtures.train_bpe()  # the BPE alone: no added token can match in it
    bpe = Tokenizer.from_str(bare.to_str())
    bpe.add_special_tokens([AddedToken("<|im_start|>", special=True, normalized=False),
                            AddedToken("<|im_end|>", special=True, normalized=False)])
    bpe.add_tokens([AddedToken("<think>", special=False, normalized=False),
                    AddedToken("</think>", special=False, normalized=False)])
    d = tmp_path / "qwen3-mini"
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>")
    tok.chat_template = QWEN3_LIKE_TEMPLATE
    tok.save_pretrained(d)
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>", "<|im_end|>")}

    def plain(text):
        return bare.encode(text).ids

    reasoning, content = "Is </think> text? Yes.", "Use <think> and <|im_end|> literally."
    rows = [response_record("q", "Hi", content=content, reasoning=reasoning),
            response_record("c", "Hi", content="", reasoning="cut", finish_reason="length")]
    src = write_jsonl(tmp_path / "r.jsonl", rows)
    r = tokenize_in_process(src, "--tokenizer", d, "--workers", "1")
    assert r.code == 0, r.stderr
    assert "preset qwen3 (confirmed by the template)" in r.stderr
    q, c = r.records()
    assert q["output_ids"] == ([ids["<think>"]] + plain("\n" + reasoning + "\n") + [ids["</think>"]]
                               + plain("\n\n" + content) + [ids["<|im_end|>"]])
    assert c["output_ids"] == [ids["<think>"]] + plain("\ncut")
    assert tok.decode(q["input_ids"] + q["output_ids"]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n" + reasoning
        + "\n</think>\n\n" + content + "<|im_end|>")
    off = tokenize_in_process(write_jsonl(tmp_path / "n.jsonl", [response_record("n", "Hi", content="ok")]),
                              "--tokenizer", d, "--workers", "1", "--no-thinking")
    [n] = off.records()
    assert tok.decode(n["input_ids"]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert n["output_ids"] == plain("ok") + [ids["<|im_end|>"]]


def test_code_written_for_another_transformers_is_not_called_a_missing_package(tmp_path):
    """Kimi K2's older tokenization_kimi.py imports bytes_to_unicode from where transformers 5 dropped it."""
    d = _kimi_copy(tmp_path)
    code = d / "tokenization_kimi.py"
    code.write_text(code.read_text().replace(
        "from transformers.convert_slow_tokenizer import bytes_to_unicode",
        "from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode_gone as bytes_to_unicode"))
    with pytest.raises(TokenizerLoadError) as e:
        load_tokenizer(prepare_tokenizer_dir(str(d), True), trust_remote_code=True)
    assert "does not import with the installed packages" in e.value.message
    assert "cannot import name 'bytes_to_unicode_gone'" in e.value.message


def test_kimi_k26_preset_is_k25s_layout_with_the_history_reasoning_kept(real_tokenizer):
    """There is no K2.6 tokenizer here: it is K2.5's family, so the preset is checked on
    K2.5's real tokenizer. The turn's IDs are K2.5's; the history differs: the template
    gets `preserve_thinking`, so an earlier turn's reasoning renders in the prompt (K2.5
    renders it as an empty think block), and a record carrying it is refused, not
    rendered without it."""
    from kimipipe.tokenize.engine import Engine, Settings

    engines = {name: Engine(Settings(str(real_tokenizer), trust_remote_code=True, preset=name))
               for name in ("kimi-k2.5", "kimi-k2.6")}
    assert "preset kimi-k2.6 (confirmed by the template)" in engines["kimi-k2.6"].describe()
    history = [{"role": "user", "content": "2+2?"},
               {"role": "assistant", "content": "4.", "reasoning_content": "Add them."},
               {"role": "user", "content": "3+3?"}]
    [k25], [k26] = (engines[n].renderer.render([history]) for n in ("kimi-k2.5", "kimi-k2.6"))
    turn = "<|im_assistant|>assistant<|im_middle|>"
    assert f"{turn}<think></think>4.<|im_end|>" in k25
    assert f"{turn}<think>Add them.</think>4.<|im_end|>" in k26
    assert k26.endswith(f"{turn}<think>") and k25.replace("<think></think>4.", "<think>Add them.</think>4.") == k26
    single = json.dumps(response_record("s", "Hi", content="Hello.", reasoning="Greet.")).encode()
    with_history = json.dumps(response_record("h", history, content="6.", reasoning="Add.")).encode()
    a = engines["kimi-k2.5"].process([(1, single), (2, with_history)])
    b = engines["kimi-k2.6"].process([(1, single), (2, with_history)])
    assert a[0].kind == b[0].kind == "ok" and a[0].payload == b[0].payload
    assert a[1].kind == "ok"  # K2.5 drops it: nothing the model saw is missing
    assert b[1].kind == "invalid" and "`$.messages[1].reasoning_content`" in b[1].reason


def test_the_added_token_table_is_what_kimis_real_files_say(real_tokenizer):
    """Kimi K2.5's tokenizer_config.json: <think> (163606) and </think> (163607) are added
    tokens but not special (nor the tool-call tokens); the bundled tiktoken kind has the
    same table at the same offsets. Special or not, each is a control token when a
    rendered prompt holds it, and text when the model's text does."""
    real = json.loads((real_tokenizer / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    by_name = {v["content"]: (int(k), v["special"]) for k, v in real.items()}
    assert by_name["<think>"] == (163606, False) and by_name["</think>"] == (163607, False)
    assert by_name["<|im_end|>"] == (163586, True) and by_name["<|im_middle|>"] == (163601, True)
    assert not any(special for name, (_, special) in by_name.items() if "tool_call" in name)
    assert len(by_name) == 23
    mini = json.loads((TOKENIZER_KINDS["tiktoken"] / "tokenizer_config.json").read_text())
    mini_by_name = {v["content"]: (int(k), v["special"]) for k, v in mini["added_tokens_decoder"].items()}
    base, mini_base = by_name["[BOS]"][0], mini_by_name["[BOS]"][0]
    assert {n: (i - mini_base, s) for n, (i, s) in mini_by_name.items()} == {
        n: (by_name[n][0] - base, by_name[n][1]) for n in mini_by_name}
    tok = load_tokenizer(real_tokenizer, trust_remote_code=True)
    assert 163606 not in tok.all_special_ids and 163586 in tok.all_special_ids
    codec = make_codec(tok)
    assert {163606, 163607, 163586} <= codec.control_ids
    assert codec.token_id("<think>") == 163606 and codec.token_id("</think>") == 163607
    assert codec.encode_prompt(["a<think>b</think>"]) == [tok.encode("a") + [163606] + tok.encode("b") + [163607]]
    [text] = codec.encode_text(["a<think>b</think>"])
    assert check_text_ids(text, codec.control_ids) is None and codec.decode([text]) == ["a<think>b</think>"]
    assert len(tok) == 163840 and tok.convert_tokens_to_ids("[BOS]") == 163584


def test_kp_infer_and_kp_tokenize_choose_the_same_ids_for_a_partition(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 40)
    everything = tmp_path / "all.jsonl"
    assert infer(server, prompts, "-o", everything).code == 0
    for k in (1, 2):
        part = tmp_path / f"infer{k}.jsonl"
        assert infer(server, prompts, "-o", part, "--partition", f"{k}/2").code == 0
        tokens = tmp_path / f"tokens{k}.jsonl"
        r = tokenize_in_process(everything, "--tokenizer", TOKENIZER_KINDS["fast"], "--workers",
                                "1", "-o", tokens, "--partition", f"{k}/2", "--quiet")
        assert r.code == 0, r.stderr
        inferred = {x["id"] for x in read_jsonl(part)}
        assert inferred and inferred == {x["id"] for x in read_jsonl(tokens)}

