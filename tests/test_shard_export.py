"""`kp-shard export SETS --for specforge|speculators --out DIR`, run as a user runs it, on
real shard sets: the rows as one plain JSONL file per split (what SpecForge's
`data.prompts_path` and speculators' `prepare-data --data` read: neither reads zstd or
Parquet), byte for byte the shards' rows; each trainer's config with the sequence length
of the longest row, the target and the vocab-mapping step; a damaged set refused with
--out left as it was; and the manifest's name, which no trainer that globs a directory
for JSON files takes for data. The trainers' own code runs on these files in the tier
`make test-trainers` (tests/trainers/), which installs them; this suite does not."""

from __future__ import annotations

import json
import os
import py_compile
from pathlib import Path

import yaml
import zstandard
from conftest import kp, read_jsonl, write_jsonl
from test_shard import manifest_of, read_raw, records


def build(tmp_path, name="set", *flags, n=40, prefix="r") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = write_jsonl(tmp_path / f"{name}.tokens.jsonl", records(n, prefix=prefix))
    out = tmp_path / name
    r = kp("shard", src, "--out", out, "--name", "B3", "-q", *flags)
    assert r.code == 0, r.stderr
    return out


def split_bytes(directory: Path, split: str) -> bytes:
    """A split's rows as the shards hold them, decompressed, in the manifest's order."""
    return b"".join(read_raw(directory / s["file"]) for s in manifest_of(directory)["shards"]
                    if s["split"] == split)


def longest_row(*files: Path) -> int:
    return max(len(row["input_ids"]) for f in files for row in read_jsonl(f))


def test_specforge_export_is_the_rows_as_plain_jsonl_and_a_config_naming_them(tmp_path):
    shards = build(tmp_path, "set", "--eval-fraction", "0.3", "--records-per-shard", "7")
    target = tmp_path / "target"
    target.mkdir()  # a local model: its config.json's vocabulary goes to the vocab mapping
    (target / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 4321}}))
    out = tmp_path / "ex"
    r = kp("shard", "export", shards, "--for", "specforge", "--out", out, "--target", target,
           "--draft-vocab-size", "77")
    assert r.code == 0, r.stderr
    assert r.stdout == b""
    assert sorted(os.listdir(out)) == ["eval.jsonl", "specforge.yaml", "train.jsonl",
                                       "vocab_mapping.py"]
    (out / "vocab_mapping.pt").write_bytes(b"what vocab_mapping.py made of these rows")
    assert kp("shard", "export", shards, "--for", "specforge", "--out", out, "--target", target,
              "--draft-vocab-size", "77", "-q").code == 0
    # (SpecForge would reuse it as it is for rows that may have changed: it goes)
    assert sorted(os.listdir(out)) == ["eval.jsonl", "specforge.yaml", "train.jsonl",
                                       "vocab_mapping.py"]
    assert (out / "train.jsonl").read_bytes() == split_bytes(shards, "train")
    assert (out / "eval.jsonl").read_bytes() == split_bytes(shards, "eval")
    m = manifest_of(shards)
    assert len(read_jsonl(out / "train.jsonl")) == m["splits"]["train"]["records"]
    assert len(read_jsonl(out / "eval.jsonl")) == m["splits"]["eval"]["records"]
    config = yaml.safe_load((out / "specforge.yaml").read_text())
    longest = longest_row(out / "train.jsonl", out / "eval.jsonl")
    assert config == {
        "model": {"target_model_path": str(target), "trust_remote_code": True,
                  "vocab_mapping_path": str(out / "vocab_mapping.pt")},
        "data": {"prompts_path": str(out / "train.jsonl"), "max_length": longest},
        "training": {"strategy": "eagle3"},
        "deployment": {"mode": "disaggregated",
                       "disaggregated": {"backend": "mooncake",
                                         "control_dir": str(out / "control")}},
        "output_dir": str(out / "output")}
    script = (out / "vocab_mapping.py").read_text()
    py_compile.compile(str(out / "vocab_mapping.py"), doraise=True,
                       cfile=str(tmp_path / "vm.pyc"))
    assert "from specforge.data.preprocessing import generate_vocab_mapping_file" in script
    assert "target_vocab_size=4321" in script and "draft_vocab_size=77" in script
    steps = [f"python {out / 'vocab_mapping.py'}", f"specforge train -c {out / 'specforge.yaml'}"]
    text = (out / "specforge.yaml").read_text()
    stderr = r.stderr
    for step in steps:
        assert f"#   {step}" in text and f"  next: {step}" in stderr
    assert (f"kp-shard: exported train {m['splits']['train']['records']} rows, "
            f"{m['splits']['train']['input_tokens'] + m['splits']['train']['output_tokens']} "
            f"tokens; eval {m['splits']['eval']['records']} rows") in stderr
    assert f"(longest row {longest} tokens)" in stderr


def test_speculators_export_and_a_rerun_without_eval_removes_the_old_eval_file(tmp_path):
    shards = build(tmp_path)  # no eval split
    out = tmp_path / "ex"
    out.mkdir()
    (out / "eval.jsonl").write_text('{"id": "from an earlier export"}\n')
    (out / "notes.txt").write_text("mine")
    r = kp("shard", "export", shards, "--for", "speculators", "--out", out, "-q")
    assert r.code == 0 and r.stderr == "", r.stderr
    assert sorted(os.listdir(out)) == ["notes.txt", "speculators.yaml", "train.jsonl"]
    assert (out / "train.jsonl").read_bytes() == split_bytes(shards, "train")
    config = yaml.safe_load((out / "speculators.yaml").read_text())
    assert config == {"train": {
        "speculator_type": "eagle3",
        "verifier": {"verifier_name_or_path": "moonshotai/Kimi-K2.5", "trust_remote_code": True},
        "data": {"data_path": str(out / "prepared"),
                 "total_seq_len": longest_row(out / "train.jsonl")},
        "draft": {"draft_vocab_size": 32000}}}
    assert (f"speculators prepare-data --model moonshotai/Kimi-K2.5 --trust-remote-code "
            f"--data {out / 'train.jsonl'} --output {out / 'prepared'} --seq-length "
            f"{longest_row(out / 'train.jsonl')} --no-skip-token-freq --overwrite") in (
        out / "speculators.yaml").read_text()


def test_a_parquet_set_and_a_parent_of_sets_export_the_same_rows(tmp_path):
    jsonl = build(tmp_path, "b3", "--eval-fraction", "0.2")
    parquet = build(tmp_path, "pq", "--eval-fraction", "0.2", "--format", "parquet")
    for name, shards in (("from-jsonl", jsonl), ("from-parquet", parquet)):
        r = kp("shard", "export", shards, "--for", "specforge", "--out", tmp_path / name, "-q")
        assert r.code == 0, r.stderr
    for split in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / "from-parquet" / split).read_bytes() == (
            tmp_path / "from-jsonl" / split).read_bytes() == split_bytes(jsonl, split[:-6])
    parent = tmp_path / "parent"
    a = build(parent, "a", n=6, prefix="a")
    b = build(parent, "b", n=5, prefix="b")
    r = kp("shard", "export", parent, "--for", "speculators", "--out", tmp_path / "both", "-q")
    assert r.code == 0, r.stderr
    assert (tmp_path / "both" / "train.jsonl").read_bytes() == (
        split_bytes(a, "train") + split_bytes(b, "train"))


def test_a_damaged_set_is_refused_naming_the_shard_and_out_keeps_the_last_export(tmp_path):
    shards = build(tmp_path, "set", "--records-per-shard", "10")
    out = tmp_path / "ex"
    assert kp("shard", "export", shards, "--for", "specforge", "--out", out, "-q").code == 0
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    second = manifest_of(shards)["shards"][1]["file"]
    data = bytearray((shards / second).read_bytes())
    data[-5] ^= 0xFF  # a flipped byte in the second shard: the first is copied by then
    (shards / second).write_bytes(bytes(data))
    r = kp("shard", "export", shards, "--for", "specforge", "--out", out, "--target", "other")
    assert r.code == 2 and r.stdout == b""
    [line] = r.stderr.splitlines()
    assert line.startswith(f"kp-shard: {shards / second}: ") and "kp-shard verify" in line, line
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before  # no temp file


def test_a_set_whose_rows_disagree_with_its_manifest_is_refused(tmp_path):
    """A shard rewritten whole (a valid file, SHA-256 and all, but other rows than the
    manifest counts): the export stops on the counts, not only on the checksum."""
    shards = build(tmp_path, "set")
    m = manifest_of(shards)
    m["shards"][0]["records"] += 1
    (shards / "kp-shard.manifest").write_text(json.dumps(m))
    r = kp("shard", "export", shards, "--for", "speculators", "--out", tmp_path / "ex")
    assert r.code == 2
    assert f"{shards / m['shards'][0]['file']}: does not match kp-shard.manifest" in r.stderr
    assert not (tmp_path / "ex" / "train.jsonl").exists()
    assert not [n for n in os.listdir(tmp_path / "ex") if n.startswith(".")]


def test_a_shard_rewritten_with_the_same_counts_is_refused_on_its_sha256(tmp_path):
    """A shard rewritten whole with other rows of the same lengths (a valid zstd file, its
    rows and token counts what the manifest says): only its SHA-256 tells, and the export
    stops on it, naming the shard, with --out left as it was."""
    shards = build(tmp_path, "set")
    m = manifest_of(shards)
    first = shards / m["shards"][0]["file"]
    rows = read_jsonl(first)
    rows[0]["input_ids"][0] += 1  # another token, the same lengths
    first.write_bytes(zstandard.ZstdCompressor().compress(
        b"".join(json.dumps(row).encode() + b"\n" for row in rows)))
    out = tmp_path / "ex"
    r = kp("shard", "export", shards, "--for", "speculators", "--out", out)
    assert r.code == 2, r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith(f"kp-shard: {first}: does not match kp-shard.manifest") and (
        "another sha256" in line and "kp-shard verify" in line), line
    assert not (out / "train.jsonl").exists()
    assert not [n for n in os.listdir(out) if n.startswith(".")]


def test_a_raw_set_and_a_directory_without_a_set_are_one_clear_line(tmp_path):
    raw = build(tmp_path, "raw", "--format", "raw")
    r = kp("shard", "export", raw, "--for", "specforge", "--out", tmp_path / "ex")
    assert r.code == 2
    assert r.stderr.splitlines() == [
        f"kp-shard: {raw}: a raw set holds token records, not the rows trainers read: rebuild "
        "it with --format eagle (or parquet)"]
    (tmp_path / "empty").mkdir()
    r = kp("shard", "export", tmp_path / "empty", "--for", "specforge", "--out", tmp_path / "ex")
    assert r.code == 2 and "no kp-shard.manifest: not a kp-shard directory" in r.stderr
    r = kp("shard", "export", raw, "--out", tmp_path / "ex")
    assert r.code == 2 and "--for" in r.stderr


def test_no_file_of_a_set_is_json_a_trainer_globbing_the_directory_would_read(tmp_path):
    """speculators' `prepare-data --data DIR` loads every *.json and *.jsonl under DIR
    (recursively) as rows: the manifest of older sets, manifest.json, was read as a one-row
    dataset. A set now holds none, whatever its layout, eval split or card."""
    for name, flags in (("jsonl", ["--eval-fraction", "0.3"]), ("parquet", ["--format", "parquet"])):
        shards = build(tmp_path, name, *flags)
        assert (shards / "kp-shard.manifest").is_file()
        found = [p for p in shards.rglob("*") if p.name.endswith((".json", ".jsonl"))]
        assert found == [], found
