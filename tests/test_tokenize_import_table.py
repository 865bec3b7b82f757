"""transformers' models import table, saved once per installation (kimipipe/tokenize/imports.py).

Each case is a fresh interpreter (the table is built when transformers is first imported,
so only a new process shows whether it was read from the files or from the saved table),
with its own XDG_CACHE_HOME. transformers' own `create_import_structure_from_path` is
lru-cached: its cache being empty after `import transformers` means the ~1,700 model files
were not read.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

from conftest import TOKENIZER_KINDS

# Run in the child: the hook, transformers' import, then what the test asks.
CHILD = r"""
import json, sys
from kimipipe.tokenize.load import load_tokenizer, offline_environment
offline_environment()
import transformers
from transformers.utils import import_utils as iu
from pathlib import Path
read = iu.create_import_structure_from_path.cache_info().currsize
out = {"read_files": read > 0}
if "compare" in sys.argv:  # the saved file's table against a read of transformers' own
    import pickle
    from kimipipe.tokenize.imports import cache_dir
    models = Path(transformers.__file__).parent / "models"
    iu.create_import_structure_from_path.cache_clear()
    iu.define_import_structure.__wrapped__.cache_clear()
    own = iu.define_import_structure.__wrapped__(models, prefix="models")
    files = sorted(cache_dir().glob("*-models.pickle")) if cache_dir().is_dir() else []
    out["same_table"] = [pickle.loads(f.read_bytes())[1] == own for f in files]
    out["entries"] = sum(len(v) for v in own.values())
    # the lazy names resolve to what their modules hold: the tokenizer classes kp-tokenize
    # loads, a model's config
    import transformers.tokenization_utils_tokenizers as fast
    import transformers.models.auto.tokenization_auto as auto
    import transformers.models.llama.configuration_llama as llama
    out["lazy"] = [transformers.PreTrainedTokenizerFast is fast.PreTrainedTokenizerFast,
                   transformers.AutoTokenizer is auto.AutoTokenizer,
                   transformers.LlamaConfig is llama.LlamaConfig]
if "ids" in sys.argv:  # each bundled kind's chat-template IDs
    out["ids"] = {}
    for directory in sys.argv[sys.argv.index("ids") + 1:]:
        tok = load_tokenizer(Path(directory), trust_remote_code=True)
        out["ids"][directory] = tok.apply_chat_template(
            [{"role": "user", "content": "Hi there"}], tokenize=True,
            add_generation_prompt=True, return_dict=False)
print(json.dumps(out))
"""


def child(cache, *args, **env):
    full = {k: v for k, v in os.environ.items() if k != "KP_NO_IMPORT_CACHE"}
    full.update(XDG_CACHE_HOME=str(cache), **env)
    r = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True,
                       env=full, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def saved_files(cache):
    """The saved tables: transformers' top-level one (`-models`), and `transformers.models`'
    own (`-`), saved once something looks a name up there (as LlamaConfig does)."""
    d = cache / "kimipipe" / "transformers-imports"
    return sorted(d.glob("*.pickle")) if d.is_dir() else []


KINDS = [str(TOKENIZER_KINDS[kind]) for kind in ("fast", "tiktoken")]


def test_first_start_saves_the_table_and_the_next_serves_transformers_own_table(tmp_path):
    first = child(tmp_path, "compare", "ids", *KINDS)  # transformers reads its files
    assert first["read_files"] and first["same_table"] == [True]
    files = saved_files(tmp_path)
    assert sorted(f.name.rsplit("-", 1)[1] for f in files) == [".pickle", "models.pickle"]
    second = child(tmp_path, "compare", "ids", *KINDS)
    assert not second["read_files"]  # served from the file
    assert second["same_table"] == [True] and second["entries"] > 1000
    assert second["lazy"] == [True, True, True]
    assert second["ids"] == first["ids"] and all(len(ids) > 3 for ids in first["ids"].values())
    assert saved_files(tmp_path) == files


def test_a_foreign_or_stale_file_is_read_anew_and_replaced(tmp_path):
    child(tmp_path)
    [file] = saved_files(tmp_path)  # the top-level table only: nothing looked in models
    file.write_bytes(b"not a pickle")
    out = child(tmp_path, "compare")
    assert out["read_files"] and out["same_table"] == [True]
    mark, _ = pickle.loads(file.read_bytes())  # rewritten, valid
    # another installation's signature (as after a pip upgrade): not trusted
    stale = (*mark[:-1], (("albert", 0),))
    file.write_bytes(pickle.dumps((stale, {frozenset(): {"models.nothing": {"Nothing"}}})))
    again = child(tmp_path, "compare")
    assert again["read_files"] and again["same_table"] == [True]
    assert pickle.loads(file.read_bytes())[0] == mark


def test_no_writable_cache_directory_or_turned_off_is_transformers_own_read(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("XDG_CACHE_HOME is a file: no directory can be made in it")
    out = child(blocked, "compare")
    assert out["read_files"] and out["same_table"] == []
    assert out["lazy"] == [True, True, True]
    off = child(tmp_path / "off", KP_NO_IMPORT_CACHE="1")
    assert off["read_files"] and saved_files(tmp_path / "off") == []
