"""speculators 0.9.0's own code on kimipipe's output; run by tests/trainers/run.py with the
Python of speculators' environment: `python speculators_checks.py PATHS.json`.

Each check prints `ok NAME: what held` or `FAIL NAME: why`:
- prepare-data-export: `speculators prepare-data --data EXPORT/train.jsonl` (the command
  the export's speculators.yaml names) keeps every train row with its own loss_mask
  ("Speculator-format rows"): the saved dataset holds the manifest's train rows, the same
  (input_ids, loss_mask) pairs (prepare-data shuffles them);
- prepare-data-hf: the same from the shard set itself, `--data hf:SHARDS_DIR` (its card);
- shard-dir: `--data SHARDS_DIR` finds no .json/.jsonl there and says so (the manifest,
  kp-shard.manifest, is not taken for a row as manifest.json was);
- config: the export's speculators.yaml through speculators' own resolver
  (`TrainConfig.resolve(["--config", FILE])`) with no unrecognised key, total_seq_len the
  longest row;
- docs: each speculators config in docs/training.md (```yaml after `<!-- speculators-config
  -->`) through the same resolver, no unrecognised key.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

from checks_common import check, doc_configs, finish, rows  # (beside this file)


def pairs(items) -> Counter:
    return Counter((tuple(r["input_ids"]), tuple(r["loss_mask"])) for r in items)


def main() -> None:
    paths = json.loads(Path(sys.argv[1]).read_text())
    out = Path(paths["export_speculators"])
    tmp = Path(paths["tmp"])
    manifest = paths["manifest"]
    train = rows(out / "train.jsonl")
    longest = max(len(r["input_ids"]) for f in ("train.jsonl", "eval.jsonl")
                  if (out / f).exists() for r in rows(out / f))
    speculators = str(Path(sys.executable).parent / "speculators")

    def prepare(data: str, output: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [speculators, "prepare-data", "--model", paths["target"], "--trust-remote-code",
             "--data", data, "--output", str(output), "--seq-length", str(longest),
             "--num-preprocessing-workers", "1", "--no-skip-token-freq"],
            capture_output=True, text=True)

    def prepared(data: str, name: str) -> str:
        from datasets import load_from_disk

        p = prepare(data, tmp / name)
        assert p.returncode == 0, (p.stdout + p.stderr)[-2000:]
        assert "Speculator-format rows: using their loss mask" in p.stdout + p.stderr
        ds = load_from_disk(str(tmp / name))
        got = ds.to_list()
        expected = manifest["splits"]["train"]["records"]
        assert len(got) == expected, (len(got), expected)
        assert pairs(got) == pairs(train), "other input_ids/loss_mask than the rows'"
        assert (tmp / name / "token_freq.pt").exists()
        return (f"{len(got)} rows = the manifest's train records, each row's own loss_mask; "
                f"columns {ds.column_names}")

    def shard_dir():
        p = prepare(paths["shards"], tmp / "from-dir")
        text = p.stdout + p.stderr
        assert p.returncode != 0, "prepare-data read the shard directory"
        assert "No .json/.jsonl files found in directory" in text, text[-1500:]
        return "refused: 'No .json/.jsonl files found in directory' (no manifest read as a row)"

    def resolve(path: str):
        from speculators.train.config import TrainConfig

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "unrecognised keys (ignored)" is a warning
            return TrainConfig.resolve(["--config", path])

    def config():
        cfg = resolve(str(out / "speculators.yaml"))
        assert cfg.data.total_seq_len == longest, (cfg.data.total_seq_len, longest)
        assert cfg.verifier.verifier_name_or_path == paths["target"]
        assert cfg.data.data_path == str(out / "prepared")
        return (f"resolved, no unrecognised key: speculator_type {cfg.speculator_type}, "
                f"total_seq_len {cfg.data.total_seq_len}, draft_vocab_size "
                f"{cfg.draft.draft_vocab_size}")

    def docs():
        import tempfile

        blocks = doc_configs(Path(paths["docs"]), "speculators-config")
        assert blocks, "no <!-- speculators-config --> yaml block in docs/training.md"
        for block in blocks:
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                f.write(block)
            resolve(f.name)
        return f"{len(blocks)} config(s) of docs/training.md resolved, no unrecognised key"

    check("prepare-data-export", lambda: prepared(str(out / "train.jsonl"), "from-export"))
    check("prepare-data-hf", lambda: prepared("hf:" + paths["shards"], "from-hf"))
    check("shard-dir", shard_dir)
    check("config", config)
    check("docs", docs)


if __name__ == "__main__":
    main()
    finish()
