"""SpecForge 0.2.0's own code on kimipipe's output; run by tests/trainers/run.py with the
Python of SpecForge's environment: `python specforge_checks.py PATHS.json`.

Each check prints `ok NAME: what held` or `FAIL NAME: why`:
- config: `specforge.config.schema.load_config` accepts the export's specforge.yaml, whose
  prompts_path is the export's train.jsonl and max_length its longest row;
- prompt-tasks: `specforge.data.prompt_builder.prepare_prompt_tasks` (what `specforge
  train` calls on data.prompts_path) gives one task per train row of the manifest, each
  with the row's own input_ids and loss_mask;
- shard-dir: the same function on the shard directory itself fails (IsADirectoryError):
  why the export exists;
- vocab-mapping: the export's vocab_mapping.py (SpecForge's generate_vocab_mapping_file)
  writes vocab_mapping.pt: d2t int64 [draft vocab], t2d bool [target vocab], every output
  token of the rows among the draft's;
- docs: each SpecForge config in docs/training.md (```yaml after `<!-- specforge-config
  -->`) goes through load_config.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from checks_common import check, doc_configs, finish, rows  # (beside this file)


def main() -> None:
    paths = json.loads(Path(sys.argv[1]).read_text())
    out = Path(paths["export_specforge"])
    manifest = paths["manifest"]
    train = rows(out / "train.jsonl")
    longest = max(len(r["input_ids"]) for f in ("train.jsonl", "eval.jsonl")
                  if (out / f).exists() for r in rows(out / f))

    from specforge.config.schema import load_config
    from specforge.data.prompt_builder import prepare_prompt_tasks

    def config():
        cfg = load_config(str(out / "specforge.yaml"))
        assert cfg.data.prompts_path == str(out / "train.jsonl"), cfg.data.prompts_path
        assert cfg.data.max_length == longest, (cfg.data.max_length, longest)
        assert cfg.mode == "online" and cfg.deployment.mode == "disaggregated"
        return (f"mode {cfg.mode}, deployment {cfg.deployment.mode}/"
                f"{cfg.deployment.disaggregated.backend}, max_length {cfg.data.max_length}, "
                f"vocab_mapping_path {cfg.model.vocab_mapping_path}")

    def tasks(path, max_length):
        return prepare_prompt_tasks(path, None, chat_template=None, max_length=max_length,
                                    is_preformatted=False, train_only_last_turn=False,
                                    cache_dir=None, cache_key=None, num_proc=None)

    def prompt_tasks():
        got = tasks(str(out / "train.jsonl"), load_config(str(out / "specforge.yaml")).data.max_length)
        expected = manifest["splits"]["train"]["records"]
        assert len(got) == len(train) == expected, (len(got), len(train), expected)
        for task, row in zip(got, train, strict=True):
            assert task["payload"]["input_ids"] == row["input_ids"], row["id"]
            assert task["payload"]["loss_mask"] == row["loss_mask"], row["id"]
        ones = sum(sum(t["payload"]["loss_mask"]) for t in got)
        assert ones == manifest["splits"]["train"]["output_tokens"], ones
        return (f"{len(got)} tasks = the manifest's train records, input_ids and loss_mask "
                f"as the rows hold them ({ones} mask-1 tokens = its output_tokens)")

    def shard_dir():
        try:
            tasks(paths["shards"], 2048)
        except IsADirectoryError as e:
            return f"IsADirectoryError ({e.strerror}), as docs/training.md says"
        raise AssertionError("prompts_path accepted a directory")

    def vocab_mapping():
        import torch

        p = subprocess.run([sys.executable, str(out / "vocab_mapping.py")],
                           capture_output=True, text=True)
        assert p.returncode == 0, (p.stdout + p.stderr)[-2000:]
        mapping = torch.load(out / "vocab_mapping.pt")
        d2t, t2d = mapping["d2t"], mapping["t2d"]
        assert d2t.dtype == torch.int64 and tuple(d2t.shape) == (32000,), (d2t.dtype, d2t.shape)
        assert t2d.dtype == torch.bool and tuple(t2d.shape) == (163840,), (t2d.dtype, t2d.shape)
        assert int(t2d.sum()) == 32000
        output_ids = {i for r in train for i, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m}
        assert all(t2d[i] for i in output_ids), "an output token is not in the draft vocab"
        return (f"d2t int64 [32000], t2d bool [163840]; all {len(output_ids)} distinct output "
                "tokens in the draft vocab")

    def docs():
        import tempfile

        blocks = doc_configs(Path(paths["docs"]), "specforge-config")
        assert blocks, "no <!-- specforge-config --> yaml block in docs/training.md"
        for block in blocks:
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                f.write(block)
            load_config(f.name)
        return f"{len(blocks)} config(s) of docs/training.md accepted by load_config"

    check("config", config)
    check("prompt-tasks", prompt_tasks)
    check("shard-dir", shard_dir)
    check("vocab-mapping", vocab_mapping)
    check("docs", docs)


if __name__ == "__main__":
    main()
    finish()
