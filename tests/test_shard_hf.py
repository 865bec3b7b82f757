"""kp-shard's sets as Hugging Face datasets: `datasets.load_dataset(DIR)` (the real library,
offline, local files only) on both layouts, Parquet shards (the same rows as JSONL, verify
and stats, row groups), the dataset card (YAML, numbers, licence, ownership), and pyarrow
missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import zstandard
from conftest import kp, read_jsonl, write_jsonl
from test_shard import card_files, card_of, manifest_of, visible_files

PROVIDERS = ("Parasail", "Together")


def record(i: int) -> dict:
    """A token record as kp-tokenize writes one, with the fields the card counts: every
    fourth a two-turn conversation's turn, a provider each, every fifth with the server's
    sampled IDs, token-count deltas, reasoning on most."""
    n_in, n_out = 3 + i % 5, 2 + i % 7
    rec = {"id": f"r{i}", "dataset": "B3" if i % 3 else "B4",
           "response": {"content": "answer", "reasoning": "thinking" if i % 6 else None},
           "finish_reason": "stop" if i % 9 else "length",
           "model": "moonshotai/kimi-k2.5", "provider": PROVIDERS[i % 2],
           "usage": {"prompt_tokens": n_in, "completion_tokens": n_out,
                     "reasoning_tokens": 0 if i % 6 == 0 else 2, "cost": 0.001},
           "sampling": {"max_tokens": 512, "temperature": 1.0, "top_p": 0.95,
                        "reasoning": {"enabled": True}},
           "api": "openrouter.ai",
           "prompt_tokens_delta": i % 3 - 1, "completion_tokens_delta": 0 if i % 2 else 2}
    if i % 4 == 0:
        rec.update(conversation=f"c{i}", turn=1 + (i // 4) % 2, turns=2, history_reasoning="drop")
        rec["id"] = f"c{i}#{rec['turn']}"
    if i % 5 == 0:
        rec["output_ids_source"] = "sampled"
    rec["input_ids"] = list(range(i, i + n_in))
    rec["output_ids"] = list(range(100_000 + i, 100_000 + i + n_out))
    return rec


N = 60


def expected_kept() -> list[dict]:
    """The records a build with --max-length 10 --truncate keeps: all but the empty answer
    and the repeated id (the first copy stays); figured out here, apart from kp-shard."""
    return [record(i) for i in range(N)]


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """One token file, shard sets of it in both layouts (and Parquet shuffled)."""
    root = tmp_path_factory.mktemp("hf")
    rows = [record(i) for i in range(N)]
    empty = {**record(999), "id": "empty", "output_ids": []}
    repeat = {**record(7), "provider": "Elsewhere"}  # dropped as a duplicate
    src = write_jsonl(root / "tokens.jsonl", [*rows, empty, repeat])
    flags = ["--eval-fraction", "0.3", "--records-per-shard", "7", "--max-length", "10",
             "--truncate", "--name", "B3", "-q"]
    out = {}
    for name, extra in (("jsonl", []), ("parquet", ["--format", "parquet"]),
                        ("shuffled", ["--format", "parquet", "--shuffle", "--seed", "3"])):
        out[name] = root / name
        r = kp("shard", src, "--out", out[name], *flags, *extra)
        assert r.code == 0, r.stderr
    out["src"] = src
    return out


def parquet_rows(directory) -> list[dict]:
    import pyarrow.parquet as pq

    rows = []
    for shard in manifest_of(directory)["shards"]:
        rows += pq.read_table(directory / shard["file"]).to_pylist()
    return rows


def jsonl_rows(directory) -> list[dict]:
    rows = []
    for shard in manifest_of(directory)["shards"]:
        rows += read_jsonl(directory / shard["file"])
    return rows


LOAD = r"""
import json, sys
import datasets
out = {}
for d in sys.argv[1:]:
    ds = datasets.load_dataset(d)
    streamed = datasets.load_dataset(d, streaming=True)
    out[d] = {split: {"rows": ds[split].to_list(),
                      "features": {k: str(v) for k, v in ds[split].features.items()},
                      "streamed": [r["id"] for r in streamed[split]]} for split in ds}
print(json.dumps(out))
"""


def load_dataset(tmp_path, *dirs) -> dict:
    """`datasets.load_dataset(DIR)` and its streaming form, in a fresh interpreter with
    the hub switched off and a cache of its own: local files only, nothing downloaded."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "hf" / "ds")}
    p = subprocess.run([sys.executable, "-c", LOAD, *map(str, dirs)], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def split_rows(directory) -> dict[str, list[dict]]:
    rows = jsonl_rows(directory) if manifest_of(directory)["format"] == "eagle" \
        else parquet_rows(directory)
    manifest = manifest_of(directory)
    out: dict[str, list[dict]] = {}
    k = 0
    for shard in manifest["shards"]:
        out.setdefault(shard["split"], []).extend(rows[k:k + shard["records"]])
        k += shard["records"]
    return out


FEATURES = {"id": "Value('string')", "input_ids": "List(Value('int32'))",
            "loss_mask": "List(Value('int8'))"}


def test_load_dataset_gives_train_and_eval_with_the_rows_and_features_of_both_layouts(sets, tmp_path):
    loaded = load_dataset(tmp_path, sets["jsonl"], sets["parquet"])
    for name in ("jsonl", "parquet"):
        got = loaded[str(sets[name])]
        want = split_rows(sets[name])
        assert set(got) == {"train", "eval"}, name
        for split in ("train", "eval"):
            assert got[split]["rows"] == want[split], (name, split)
            assert got[split]["features"] == FEATURES, (name, split)
            assert got[split]["streamed"] == [r["id"] for r in want[split]], (name, split)
        m = manifest_of(sets[name])
        assert {s: len(got[s]["rows"]) for s in got} == {s: t["records"] for s, t in m["splits"].items()}
    # the same rows, in the same order, whichever layout
    assert loaded[str(sets["jsonl"])] == loaded[str(sets["parquet"])]


def test_a_set_without_its_card_still_loads_train_apart_from_eval_by_the_file_names(sets, tmp_path):
    """A set whose README.md is gone (copied without it): the split's name between
    separators in each file name is what `datasets` falls back to (eval as "test")."""
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(sets["jsonl"], bare)
    (bare / "README.md").unlink()
    got = load_dataset(tmp_path, bare)[str(bare)]
    want = split_rows(sets["jsonl"])
    assert {s: len(v["rows"]) for s, v in got.items()} == {"train": len(want["train"]),
                                                           "test": len(want["eval"])}


def test_parquet_shards_hold_the_jsonl_rows_with_the_same_manifest(sets):
    import pyarrow.parquet as pq

    from kimipipe.shard.parquet import file_sha256

    assert parquet_rows(sets["parquet"]) == jsonl_rows(sets["jsonl"])
    pm, jm = manifest_of(sets["parquet"]), manifest_of(sets["jsonl"])
    assert pm["format"] == "parquet" and pm["row_schema"] == jm["row_schema"]
    for key in ("splits", "totals"):
        for split_or_all in (pm[key].values() if key == "splits" else [pm[key]]):
            split_or_all.pop("bytes"), split_or_all.pop("uncompressed_bytes")
        for split_or_all in (jm[key].values() if key == "splits" else [jm[key]]):
            split_or_all.pop("bytes"), split_or_all.pop("uncompressed_bytes")
        assert pm[key] == jm[key], key
    for p, j in zip(pm["shards"], jm["shards"], strict=True):
        assert p["file"] == j["file"].replace(".jsonl.zst", ".parquet")
        assert (p["split"], p["records"], p["input_tokens"], p["output_tokens"]) == \
            (j["split"], j["records"], j["input_tokens"], j["output_tokens"])
        path = sets["parquet"] / p["file"]
        assert file_sha256(path) == p["sha256"] and path.stat().st_size == p["bytes"]
        schema = pq.read_schema(path)
        assert [str(t) for t in schema.types] == ["string", "list<element: int32>",
                                                  "list<element: int8>"]
    assert pm["provenance"] == jm["provenance"]
    assert visible_files(sets["parquet"]) == sorted(
        ["README.md", "kp-shard.manifest", *(s["file"] for s in pm["shards"])])
    for name in ("jsonl", "parquet", "shuffled"):
        r = kp("shard", "verify", sets[name])
        assert r.code == 0, r.stdout
    stats = [kp("shard", "stats", sets[n]).stdout.decode().split("\n", 1)[1] for n in ("jsonl", "parquet")]
    assert stats[0] == stats[1]


def test_parquet_row_groups_close_at_the_row_and_token_limits(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from kimipipe.shard import ShardOptions, build_shards, parquet

    src = write_jsonl(tmp_path / "t.jsonl", [record(i) for i in range(25)])
    monkeypatch.setattr(parquet, "ROW_GROUP_ROWS", 10)
    by_rows = build_shards([str(src)], str(tmp_path / "a"), ShardOptions(fmt="parquet"), "test")
    [shard] = by_rows.shards
    f = pq.ParquetFile(tmp_path / "a" / shard.file)
    assert [f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)] == [10, 10, 5]
    monkeypatch.setattr(parquet, "ROW_GROUP_TOKENS", 40)  # rows of 5 to 16 tokens here
    build_shards([str(src)], str(tmp_path / "b"), ShardOptions(fmt="parquet"), "test")
    f = pq.ParquetFile(tmp_path / "b" / shard.file)
    groups = [f.read_row_group(i) for i in range(f.num_row_groups)]
    tokens = [sum(len(x) for x in g.column("input_ids").to_pylist()) for g in groups]
    assert len(groups) > 3 and all(t - 16 < 40 for t in tokens)  # closed once at or past 40
    assert sum(len(g) for g in groups) == 25


def test_verify_names_a_damaged_parquet_file_and_a_bad_row(sets, tmp_path):
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from kimipipe.shard.parquet import file_sha256

    damaged = tmp_path / "damaged"
    shutil.copytree(sets["parquet"], damaged)
    m = manifest_of(damaged)
    name = m["shards"][1]["file"]
    data = bytearray((damaged / name).read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = b"\xff" * 64  # a run of garbage in the column data
    (damaged / name).write_bytes(bytes(data))
    r = kp("shard", "verify", damaged)
    out = r.stdout.decode()
    assert r.code == 2 and f"{damaged / name}: sha256 " in out and "does not match" in out
    assert f"verify: {damaged}: " in r.stderr
    # cut short: not Parquet at all any more (no footer)
    (damaged / name).write_bytes(bytes(data[: len(data) // 3]))
    out = kp("shard", "verify", damaged).stdout.decode()
    assert f"{damaged / name}: cannot read as Parquet" in out

    # a file that reads, with a row whose mask has no 1 and one of unequal lengths,
    # its manifest entry made to match: verify names each row by its number
    bad = tmp_path / "bad"
    shutil.copytree(sets["parquet"], bad)
    m = manifest_of(bad)
    entry = m["shards"][0]
    table = pq.read_table(bad / entry["file"]).to_pylist()
    table[2]["loss_mask"] = [0] * len(table[2]["loss_mask"])
    table[4]["loss_mask"] = table[4]["loss_mask"][:-1]
    pq.write_table(pa.Table.from_pylist(table, schema=pq.read_schema(bad / entry["file"])),
                   bad / entry["file"])
    entry["sha256"] = file_sha256(bad / entry["file"])
    entry["bytes"] = (bad / entry["file"]).stat().st_size
    m["totals"]["bytes"] = sum(s["bytes"] for s in m["shards"])
    (bad / "kp-shard.manifest").write_text(json.dumps(m))
    out = kp("shard", "verify", bad).stdout.decode()
    assert f"{bad / entry['file']} row 3: loss_mask has no 1" in out
    assert f"{bad / entry['file']} row 5: input_ids has " in out
    assert "sha256" not in out


HIDE_PYARROW = """
import sys
sys.modules["pyarrow"] = None  # `import pyarrow` fails as it does where it is not installed
from kimipipe.commands.shard import main
main()
"""


def kp_shard_without_pyarrow(*args, hide: bool = True) -> subprocess.CompletedProcess:
    script = HIDE_PYARROW if hide else HIDE_PYARROW.replace('sys.modules["pyarrow"] = None', "")
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def test_without_pyarrow_parquet_is_one_clear_line_and_exit_2(sets, tmp_path):
    out = tmp_path / "out"
    p = kp_shard_without_pyarrow(sets["src"], "--out", out, "--format", "parquet")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1, p.stderr
    assert "needs pyarrow" in p.stderr and "pip install 'kimipipe[parquet]'" in p.stderr
    assert not out.exists()  # nothing read, nothing written
    for word in ("verify", "stats"):
        p = kp_shard_without_pyarrow(word, sets["parquet"])
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert "needs pyarrow" in p.stderr and "pip install 'kimipipe[parquet]'" in p.stderr
    # the same runs with pyarrow there: the shim is what fails them
    p = kp_shard_without_pyarrow(sets["src"], "--out", out, "--format", "parquet", "-q", hide=False)
    assert p.returncode == 0, p.stderr
    assert kp_shard_without_pyarrow("verify", out, hide=False).returncode == 0
    # and a JSONL set needs no pyarrow at all
    p = kp_shard_without_pyarrow(sets["src"], "--out", tmp_path / "j", "-q")
    assert p.returncode == 0, p.stderr
    assert kp_shard_without_pyarrow("verify", tmp_path / "j").returncode == 0


def test_the_cards_yaml_lists_the_manifests_files_and_its_numbers_are_the_builds(sets):
    for name in ("jsonl", "parquet"):
        m = manifest_of(sets[name])
        meta, body = card_of(sets[name])
        assert "license" not in meta and "Licence: not set" in body
        assert "each under its own licence" in body
        assert card_files(sets[name]) == {
            split: [s["file"] for s in m["shards"] if s["split"] == split] for split in ("train", "eval")}
        info = meta["dataset_info"]
        assert info["features"] == [{"name": "id", "dtype": "string"},
                                    {"name": "input_ids", "list": "int32"},
                                    {"name": "loss_mask", "list": "int8"}]
        assert {s["name"]: s["num_examples"] for s in info["splits"]} == \
            {k: v["records"] for k, v in m["splits"].items()}
        assert info["download_size"] == m["totals"]["bytes"]
        t = m["totals"]
        assert (f"| all | {t['records']:,} | {t['input_tokens']:,} | {t['output_tokens']:,} | "
                f"{t['shards']} | {t['bytes']:,} |") in body
        assert (f"Token records read: {m['records_read']:,}; rows kept: {t['records']:,}; "
                f"dropped: 2; truncated: {m['truncated']:,}.") in body
        assert "Dropped, by reason: empty output 1, duplicate id 1." in body
        assert m["command"] in body and f"kimipipe {m['kimipipe_version']}" in body

    # the provenance, counted here from the records kept, independently of kp-shard
    kept = expected_kept()
    n = len(kept)
    m = manifest_of(sets["jsonl"])
    assert m["truncated"] > 0 and m["totals"]["records"] == n
    prov = m["provenance"]
    assert prov["rows"] == n
    assert prov["providers"]["Parasail"]["rows"] == sum(r["provider"] == "Parasail" for r in kept)
    assert "Elsewhere" not in prov["providers"]  # the duplicate's, dropped
    sampled = sum("output_ids_source" in r for r in kept)
    assert prov["output_ids_source"] == {"reencoded": n - sampled, "sampled": sampled}
    assert prov["reasoning"] == {"with": sum(r["usage"]["reasoning_tokens"] > 0 for r in kept),
                                 "without": sum(r["usage"]["reasoning_tokens"] == 0 for r in kept)}
    assert prov["datasets"] == dict(Counter(r["dataset"] for r in kept).most_common())
    assert prov["turns"] == {"1": sum("turns" not in r for r in kept),
                             "2": sum("turns" in r for r in kept)}
    deltas = [r["completion_tokens_delta"] for r in kept if r["provider"] == "Together"]
    together = prov["providers"]["Together"]["completion_delta"]
    assert together == {"rows": len(deltas), "zero": deltas.count(0), "sum": sum(deltas),
                        "min": min(deltas), "max": max(deltas)}
    assert [s["rows"] for s in prov["sampling"]] == [n]
    _, body = card_of(sets["jsonl"])
    share = prov["providers"]["Parasail"]["rows"] / n
    assert f"| Parasail | {prov['providers']['Parasail']['rows']:,} | {100 * share:.1f}% |" in body
    assert f"reencoded {n - sampled:,} ({100 * (n - sampled) / n:.1f}%), sampled {sampled:,}" in body
    # the shuffle's spill files carry each row's facts: the same counts
    assert manifest_of(sets["shuffled"])["provenance"] == prov


def test_kp_shard_card_adds_the_summary_and_the_plan_and_keeps_the_users_licence(sets, tmp_path):
    import shutil

    d = tmp_path / "set"
    shutil.copytree(sets["jsonl"], d)
    summary = write_jsonl(tmp_path / "s.json", [])
    summary.write_text(json.dumps({
        "exit_code": 4, "stop_reason": None, "input_records": 70, "done": 62, "skipped": 0,
        "failed": {"permanent": 3}, "spend_this_run": 0.25, "spend_total": 0.3125,
        "providers": {"Parasail": 0.5, "Together": 0.5}, "finish_reasons": {"stop": 62},
        "refused": {"routing_violation": {"Fireworks": 2}}, "a_newer_field": 1}))
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"model": "moonshotai/kimi-k2.5", "routes": [
        {"provider": "Parasail", "quantization": "int4", "allowed": True},
        {"provider": "Together", "quantization": "fp8", "allowed": False},
        {"provider": "Together", "quantization": None, "allowed": True}]}))
    r = kp("shard", "card", d, "--summary", summary, "--plan", plan, "--source", "sources/B3.json",
           "--command", "kp-infer prompts.jsonl --model moonshotai/kimi-k2.5")
    assert r.code == 0, r.stderr
    assert f"wrote {d / 'README.md'}" in r.stderr
    _, body = card_of(d)
    assert "answers written 62 (prompts in the input 70, already answered 0); failed 3 " \
           "(permanent 3); spend recorded in the output $0.3125; stop: none; exit 4." in body
    assert "Answers paid for and not kept: routing violation 2." in body
    assert "Asked for: `moonshotai/kimi-k2.5` (the plan)." in body
    assert "| int4 |" in body and "| unknown |" in body and "fp8" not in body
    assert "Source files: `sources/B3.json`." in body
    assert "kp-infer prompts.jsonl --model moonshotai/kimi-k2.5\n" in body

    # the user's licence is theirs: kept by `card` and by a rebuild
    text = (d / "README.md").read_text().replace("---\n", "---\nlicense: odc-by\n", 1)
    (d / "README.md").write_text(text)
    assert kp("shard", "card", d).code == 0
    meta, body = card_of(d)
    assert meta["license"] == "odc-by" and "Licence: not set" not in body
    assert kp("shard", sets["src"], "--out", d, "-q").code == 0
    assert card_of(d)[0]["license"] == "odc-by"

    # a bad summary is named, exit 2, the card unchanged
    before = (d / "README.md").read_text()
    (tmp_path / "bad.json").write_text("{")
    r = kp("shard", "card", d, "--summary", tmp_path / "bad.json")
    assert r.code == 2 and f"{tmp_path / 'bad.json'}: not a kp-infer summary" in r.stderr
    assert (d / "README.md").read_text() == before


def test_a_readme_that_is_not_a_card_is_left_alone_and_a_stale_card_fails_verify(sets, tmp_path):
    import shutil

    d = tmp_path / "set"
    shutil.copytree(sets["jsonl"], d)
    mine = "# My notes\n\nNot a card.\n"
    (d / "README.md").write_text(mine)
    r = kp("shard", sets["src"], "--out", d, "--eval-fraction", "0.3")
    assert r.code == 0 and "is not a kp-shard card: left as it is" in r.stderr
    assert (d / "README.md").read_text() == mine
    r = kp("shard", "card", d)
    assert r.code == 2 and "not a kp-shard card" in r.stderr
    assert (d / "README.md").read_text() == mine
    assert kp("shard", "verify", d).code == 0  # not ours to judge

    (d / "README.md").unlink()
    assert kp("shard", "card", d).code == 0
    text = (d / "README.md").read_text()
    train = card_files(d)["train"]
    (d / "README.md").write_text(text.replace(f"    - {train[-1]}\n", "", 1))
    r = kp("shard", "verify", d)
    assert r.code == 2
    assert f"{d / 'README.md'}: its data_files do not list the manifest's files" in r.stdout.decode()


def test_a_set_of_older_kimipipe_verifies_gets_a_card_and_is_replaced(sets, tmp_path):
    """A set older kp-shard wrote (train shards `<name>-00000.jsonl.zst`, its manifest
    `manifest.json`, no card, no provenance): verify passes, `kp-shard card` makes
    load_dataset read it right, export reads it, a rebuild in its directory replaces its
    files and its manifest.json with kp-shard.manifest."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(sets["jsonl"], old)
    (old / "README.md").unlink()
    m = manifest_of(old)
    del m["provenance"]
    m["kimipipe_version"] = "0.0.9"
    for s in m["shards"]:
        if s["split"] == "train":
            new = s["file"].replace("-train-", "-")
            (old / s["file"]).rename(old / new)
            s["file"] = new
    (old / "kp-shard.manifest").unlink()
    (old / "manifest.json").write_text(json.dumps(m, indent=1))
    assert kp("shard", "verify", old).code == 0
    assert kp("shard", "verify", tmp_path).stdout.decode().startswith(f"{old}: OK")  # found as a set
    r = kp("shard", "export", old, "--for", "speculators", "--out", tmp_path / "ex", "-q")
    assert r.code == 0, r.stderr
    assert len(read_jsonl(tmp_path / "ex" / "train.jsonl")) == m["splits"]["train"]["records"]
    r = kp("shard", "card", old)
    assert r.code == 0, r.stderr
    _, body = card_of(old)
    assert "Not recorded: this set was made by kimipipe 0.0.9" in body
    got = load_dataset(tmp_path, old)[str(old)]
    assert {s: len(v["rows"]) for s, v in got.items()} == {
        s: t["records"] for s, t in m["splits"].items()}
    olds = [s["file"] for s in m["shards"]]
    assert kp("shard", sets["src"], "--out", old, "--name", "B3", "-q").code == 0
    assert not [f for f in olds if (old / f).exists() and "-eval-" not in f]
    assert not (old / "manifest.json").exists() and (old / "kp-shard.manifest").is_file()
    assert kp("shard", "verify", old).code == 0


def test_the_zstd_layout_is_unchanged_by_the_card(sets):
    """The rows are still plain zstd JSON lines a trainer can decompress and read."""
    m = manifest_of(sets["jsonl"])
    for s in m["shards"]:
        data = zstandard.ZstdDecompressor().stream_reader(
            (sets["jsonl"] / s["file"]).read_bytes(), read_across_frames=True).read()
        assert len(data.splitlines()) == s["records"]


def test_a_token_id_beyond_int32_stops_a_parquet_build_and_keeps_the_old_set(sets, tmp_path):
    """Parquet's IDs are int32: a larger one (no Kimi ID is) is an error, exit 2, and the
    set already there stays; the JSONL layout takes it."""
    import shutil

    d = tmp_path / "set"
    shutil.copytree(sets["parquet"], d)
    before = manifest_of(d)
    src = write_jsonl(tmp_path / "big.jsonl", [{**record(1), "output_ids": [2**31]}])
    r = kp("shard", src, "--out", d, "--format", "parquet")
    assert r.code == 2 and "token ID 2147483648 does not fit a Parquet int32 column" in r.stderr
    assert manifest_of(d) == before and kp("shard", "verify", d).code == 0
    assert not [n for n in os.listdir(d) if ".tmp-" in n]
    assert kp("shard", src, "--out", tmp_path / "j").code == 0
