"""kp-shard, run as a user runs it: rows trainers read, manifest, splits, shuffle, filters,
verify, stats, crash safety, and interop with the zstd command-line tool."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess

import pytest
import zstandard
from conftest import BIN, kp, read_jsonl, write_jsonl
from helpers import wait_for
from msgspec import Raw, Struct  # (module level: the test's Structs resolve their annotations here)

from kimipipe.shard.rows import eval_point


def token_record(rid: str, n_in: int, n_out: int, dataset: str = "B3", start: int = 1000,
                 **extra) -> dict:
    return {"id": rid, "dataset": dataset,
            "messages": [{"role": "user", "content": f"question {rid}"}],
            "response": {"content": "answer", "reasoning": "thinking"},
            "finish_reason": "stop", "model": "moonshotai/kimi-k2.5", **extra,
            "input_ids": list(range(start, start + n_in)),
            "output_ids": list(range(start + 50_000, start + 50_000 + n_out))}


def records(n: int, prefix: str = "r", **kw) -> list[dict]:
    return [token_record(f"{prefix}{i}", 3 + i % 5, 2 + i % 7, start=i, **kw) for i in range(n)]


def shard_rows(directory) -> list[dict]:
    manifest = manifest_of(directory)
    rows = []
    for shard in manifest["shards"]:
        rows += read_jsonl(directory / shard["file"])
    return rows


def read_raw(path) -> bytes:
    """A shard's rows, decompressed, exactly as written."""
    with open(path, "rb") as f:
        return zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read()


def shard_bytes(directory) -> bytes:
    """The rows of every shard, decompressed, as one byte string (in manifest order)."""
    return b"".join(read_raw(directory / s["file"]) for s in manifest_of(directory)["shards"])


def manifest_of(directory) -> dict:
    """The set's manifest (an older kimipipe's set: its manifest.json)."""
    path = directory / "kp-shard.manifest"
    return json.loads((path if path.exists() else directory / "manifest.json").read_text())


def visible_files(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if not n.startswith("."))


def card_of(directory) -> tuple[dict, str]:
    """The dataset card's YAML block (parsed) and its text."""
    import yaml

    text = (directory / "README.md").read_text()
    assert text.startswith("---\n")
    head, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(head), body


def card_files(directory) -> dict[str, list[str]]:
    """The card's files per split, as `datasets` reads them (its `configs`)."""
    meta, _ = card_of(directory)
    [config] = meta["configs"]
    return {item["split"]: item["path"] for item in config["data_files"]}


# --- the eagle format, the manifest, interop ------------------------------------------

def test_eagle_rows_are_prompt_plus_output_with_mask_and_manifest_matches(tmp_path):
    src = write_jsonl(tmp_path / "tokens.jsonl", [
        token_record("a", 3, 2), token_record("b", 1, 4, start=7)])
    out = tmp_path / "shards"
    r = kp("shard", src, "--out", out)
    assert r.code == 0, r.stderr
    assert r.stdout == b""
    assert visible_files(out) == ["README.md", "kp-shard.manifest", "shard-train-00000.jsonl.zst"]
    raw = zstandard.ZstdDecompressor().stream_reader(
        (out / "shard-train-00000.jsonl.zst").read_bytes(), read_across_frames=True).read()
    lines = raw.splitlines()
    assert json.loads(lines[0]) == {
        "id": "a", "input_ids": [1000, 1001, 1002, 51000, 51001], "loss_mask": [0, 0, 0, 1, 1]}
    assert json.loads(lines[1]) == {
        "id": "b", "input_ids": [7, 50007, 50008, 50009, 50010], "loss_mask": [0, 1, 1, 1, 1]}
    for line in lines:  # compact JSON, exactly one object per line
        assert line == json.dumps(json.loads(line), separators=(",", ":")).encode()
    m = manifest_of(out)
    assert m["format"] == "eagle"
    assert m["command"].startswith("kp-shard ") and "--out" in m["command"]
    [shard] = m["shards"]
    data = (out / "shard-train-00000.jsonl.zst").read_bytes()
    assert shard == {"file": "shard-train-00000.jsonl.zst", "split": "train", "records": 2,
                     "input_tokens": 4, "output_tokens": 6, "bytes": len(data),
                     "uncompressed_bytes": len(raw),
                     "sha256": hashlib.sha256(data).hexdigest()}
    assert m["totals"]["records"] == 2 and m["totals"]["bytes"] == len(data)
    assert m["records_read"] == 2 and set(m["dropped"].values()) == {0}
    assert "wrote train 2 rows, 10 tokens in 1 shard" in r.stderr


def test_interop_zstd_cli_and_plain_json_loads(tmp_path):
    if shutil.which("zstd") is None:
        pytest.skip("the zstd command-line tool is not installed (apt-get install zstd)")
    src = write_jsonl(tmp_path / "tokens.jsonl", records(50))
    out = tmp_path / "shards"
    assert kp("shard", src, "--out", out, "--records-per-shard", "20", "-q").code == 0
    total = 0
    for shard in manifest_of(out)["shards"]:
        path = out / shard["file"]
        subprocess.run(["zstd", "-tq", str(path)], check=True)  # frame checksum too
        text = subprocess.run(["zstd", "-dc", str(path)], check=True,
                              capture_output=True).stdout.decode()
        assert text.endswith("\n")
        for line in text.splitlines():
            row = json.loads(line)
            assert len(row["input_ids"]) == len(row["loss_mask"]) and 1 in row["loss_mask"]
            assert all(isinstance(x, int) for x in row["input_ids"])
            total += 1
        # the zstandard module reads it the same
        with open(path, "rb") as f:
            assert zstandard.ZstdDecompressor().stream_reader(f).read().decode() == text
    assert total == 50


def test_many_inputs_stdin_and_zstd_input(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", records(3, "a"))
    b = tmp_path / "b.jsonl.zst"
    b.write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps(x) + "\n" for x in records(2, "b")).encode()))
    c = "".join(json.dumps(x) + "\n" for x in records(2, "c")).encode()
    out = tmp_path / "shards"
    r = kp("shard", a, b, "-", "--out", out, input=c)
    assert r.code == 0, r.stderr
    assert [x["id"] for x in shard_rows(out)] == ["a0", "a1", "a2", "b0", "b1", "c0", "c1"]
    assert manifest_of(out)["inputs"] == [str(a), str(b), "<stdin>"]


def test_ids_with_whitespace_are_read_and_written_compact(tmp_path):
    src = tmp_path / "pretty.jsonl"
    src.write_text('{"id": "p", "dataset": "B3", "input_ids": [ 1, 2 ,3 ], '
                   '"output_ids": [\t4 , 5 ]}\n')
    out = tmp_path / "shards"
    assert kp("shard", src, "--out", out).code == 0
    raw = read_raw_lines(out / "shard-train-00000.jsonl.zst")
    assert raw == [b'{"id":"p","input_ids":[1,2,3,4,5],"loss_mask":[0,0,0,1,1]}']


def read_raw_lines(path) -> list[bytes]:
    return read_raw(path).splitlines()


def test_raw_format_keeps_the_records_as_they_came(tmp_path):
    recs = [token_record("a", 2, 3, usage={"cost": 0.5}), token_record("b", 1, 1)]
    src = write_jsonl(tmp_path / "tokens.jsonl", recs)
    out = tmp_path / "shards"
    assert kp("shard", src, "--out", out, "--format", "raw").code == 0
    lines = read_raw_lines(out / "shard-train-00000.jsonl.zst")
    assert [json.loads(x) for x in lines] == recs
    assert lines[0] == json.dumps(recs[0], separators=(",", ":")).encode()
    m = manifest_of(out)
    assert m["format"] == "raw" and m["shards"][0]["input_tokens"] == 3
    assert kp("shard", "verify", out).code == 0


def test_a_manifest_naming_an_unknown_row_format_is_refused_by_verify_and_stats(tmp_path):
    """A format kp-shard does not know is an error naming the manifest and the formats it
    knows: never read as another format (stats once read it as raw)."""
    src = write_jsonl(tmp_path / "tokens.jsonl", records(3))
    out = tmp_path / "shards"
    assert kp("shard", src, "--out", out, "--format", "raw").code == 0
    m = manifest_of(out)
    m["format"] = "raw2"  # raw rows, under a name a newer kp-shard might write
    (out / "kp-shard.manifest").write_text(json.dumps(m))
    known = "unknown row format 'raw2' (kp-shard knows eagle, raw, parquet)"
    s = kp("shard", "stats", out)
    assert s.code == 2 and s.stdout == b""
    assert f"{out / 'kp-shard.manifest'}: {known}" in s.stderr
    v = kp("shard", "verify", out)
    assert v.code == 2 and v.stdout.decode().splitlines() == [f"{out / 'kp-shard.manifest'}: {known}"]


def test_a_row_format_is_one_entry_in_the_table(tmp_path, monkeypatch):
    """A new format registered in formats.FORMATS alone is built, verified and counted."""
    from kimipipe.shard import ShardOptions, build_shards, read_lengths, verify
    from kimipipe.shard.formats import FORMATS, RowFormat

    class Ids(Struct):
        id: str
        ids: list[int]
        n_in: int

    class IdsLengths(Struct):
        ids: Raw
        n_in: int

    def build(rid, prompt, n_in, output, n_out, line, cut):
        return b'{"id":"%s","ids":[%s,%s],"n_in":%d}\n' % (rid.encode(), prompt, output, n_in)

    def check(row):
        return (row.id, row.n_in, len(row.ids) - row.n_in) if 0 < row.n_in < len(row.ids) \
            else "n_in out of range"

    def count(row):
        n = bytes(row.ids).count(b",") + 1
        return row.n_in, n - row.n_in

    monkeypatch.setitem(FORMATS, "ids", RowFormat(
        name="ids", help="prompt + output IDs and the prompt's length", row_schema="ids, n_in",
        build=build, row=Ids, check=check, lengths=IdsLengths, count=count))
    src = write_jsonl(tmp_path / "t.jsonl", [token_record("a", 3, 2), token_record("b", 1, 4)])
    out = tmp_path / "shards"
    result = build_shards([str(src)], str(out), ShardOptions(fmt="ids"), "test")
    assert result.manifest.format == "ids" and result.manifest.row_schema == "ids, n_in"
    assert shard_rows(out) == [{"id": "a", "ids": [1000, 1001, 1002, 51000, 51001], "n_in": 3},
                               {"id": "b", "ids": [1000, 51000, 51001, 51002, 51003], "n_in": 1}]
    report = verify(str(out))
    assert report.problems == [] and (report.records, report.tokens) == (2, 10)
    _, lengths = read_lengths(str(out))
    assert (list(lengths.prompt), list(lengths.output)) == ([3, 1], [2, 4])


# --- shard sizes and names --------------------------------------------------------------

def test_records_per_shard_and_name(tmp_path):
    src = write_jsonl(tmp_path / "t.jsonl", records(7))
    out = tmp_path / "shards"
    assert kp("shard", src, "--out", out, "--records-per-shard", "3", "--name", "b3").code == 0
    assert visible_files(out) == ["README.md", "b3-train-00000.jsonl.zst", "b3-train-00001.jsonl.zst",
                                  "b3-train-00002.jsonl.zst", "kp-shard.manifest"]
    assert [s["records"] for s in manifest_of(out)["shards"]] == [3, 3, 1]
    assert kp("shard", src, "--out", out, "--name", "../x").code == 2


def test_tokens_per_shard_never_exceeded_except_by_one_long_row(tmp_path):
    recs = [token_record(f"r{i}", 5, 5, start=i) for i in range(6)]
    recs.insert(3, token_record("long", 20, 30))
    src = write_jsonl(tmp_path / "t.jsonl", recs)
    out = tmp_path / "shards"
    assert kp("shard", src, "--out", out, "--tokens-per-shard", "25").code == 0
    shards = manifest_of(out)["shards"]
    tokens = [s["input_tokens"] + s["output_tokens"] for s in shards]
    assert tokens == [20, 10, 50, 20, 10]
    assert [x["id"] for x in shard_rows(out)] == ["r0", "r1", "r2", "long", "r3", "r4", "r5"]


def test_compression_level_changes_the_bytes_not_the_rows(tmp_path):
    src = write_jsonl(tmp_path / "t.jsonl", records(3000))
    sizes, rows = {}, {}
    for level in ("1", "19"):
        out = tmp_path / f"l{level}"
        r = kp("shard", src, "--out", out, "--compression-level", level)
        assert r.code == 0, r.stderr
        m = manifest_of(out)
        assert m["options"]["compression_level"] == int(level)
        sizes[level] = m["totals"]["bytes"]
        rows[level] = shard_bytes(out)
        assert kp("shard", "verify", out).code == 0
    assert rows["1"] == rows["19"]
    assert sizes["19"] < sizes["1"]  # the level reached zstd
    default = tmp_path / "default"
    assert kp("shard", src, "--out", default).code == 0
    assert manifest_of(default)["options"]["compression_level"] == 3
    for bad in ("0", "23"):
        r = kp("shard", src, "--out", tmp_path / "bad", "--compression-level", bad)
        assert r.code == 2 and "--compression-level" in r.stderr
        assert not (tmp_path / "bad" / "kp-shard.manifest").exists()


# --- eval split -----------------------------------------------------------------------------

def test_eval_split_by_id_hash_is_stable_across_runs_inputs_and_datasets(tmp_path):
    recs = records(400)
    src = write_jsonl(tmp_path / "t.jsonl", recs)
    out = tmp_path / "shards"
    assert kp("shard", src, "--out", out, "--eval-fraction", "0.1").code == 0
    m = manifest_of(out)
    eval_files = [s["file"] for s in m["shards"] if s["split"] == "eval"]
    assert eval_files == ["shard-eval-00000.jsonl.zst"]
    eval_ids = {x["id"] for x in read_jsonl(out / eval_files[0])}
    assert eval_ids == {x["id"] for x in recs if eval_point(x["id"]) < 0.1}
    assert 15 < len(eval_ids) < 70
    assert m["splits"]["eval"]["records"] == len(eval_ids)
    assert m["splits"]["train"]["records"] == 400 - len(eval_ids)
    # Another dataset, another order, a subset: the same ids land in eval.
    other = [dict(x, dataset="B9") for x in reversed(recs[::2])]
    src2 = write_jsonl(tmp_path / "t2.jsonl", other)
    out2 = tmp_path / "shards2"
    assert kp("shard", src2, "--out", out2, "--eval-fraction", "0.1", "--shuffle").code == 0
    eval2 = {x["id"] for x in read_jsonl(out2 / "shard-eval-00000.jsonl.zst")}
    assert eval2 == {x["id"] for x in other} & eval_ids


def test_eval_point_is_the_documented_hash():
    digest = hashlib.blake2b(b"conv-1", digest_size=8, person=b"kp-shard-eval").digest()
    assert eval_point("conv-1") == int.from_bytes(digest, "big") / 2**64


# --- shuffle --------------------------------------------------------------------------------

def test_shuffle_is_deterministic_and_independent_of_input_order(tmp_path):
    recs = records(300)
    a = write_jsonl(tmp_path / "a.jsonl", recs)
    b1 = write_jsonl(tmp_path / "b1.jsonl", list(reversed(recs))[:150])
    b2 = write_jsonl(tmp_path / "b2.jsonl", list(reversed(recs))[150:])
    runs = {}
    for name, inputs, seed in (("a", [a], "7"), ("a2", [a], "7"), ("b", [b2, b1], "7"),
                               ("s8", [a], "8")):
        out = tmp_path / name
        r = kp("shard", *inputs, "--out", out, "--shuffle", "--seed", seed,
               "--records-per-shard", "100")
        assert r.code == 0, r.stderr
        runs[name] = [x["id"] for x in shard_rows(out)]
    assert runs["a"] == runs["a2"] == runs["b"]
    assert runs["a"] != [x["id"] for x in recs]
    assert sorted(runs["a"]) == sorted(x["id"] for x in recs)
    assert runs["s8"] != runs["a"] and sorted(runs["s8"]) == sorted(runs["a"])
    assert not [n for n in os.listdir(tmp_path / "a") if "spill" in n]


def test_shuffle_splits_buckets_larger_than_its_memory_and_keeps_the_order(tmp_path):
    recs = records(300)
    src = write_jsonl(tmp_path / "a.jsonl", recs)
    ids = {}
    for mem in ("64K", "1G"):
        out = tmp_path / mem
        spill = tmp_path / f"spill-{mem}"
        r = kp("shard", src, "--out", out, "--shuffle", "--seed", "3", "--shuffle-memory", mem,
               "--tmp-dir", spill)
        assert r.code == 0, r.stderr
        ids[mem] = [x["id"] for x in shard_rows(out)]
        assert not os.listdir(spill)
    assert ids["64K"] == ids["1G"]


def test_external_shuffle_bounded_buckets_directly(tmp_path):
    from kimipipe.shard.rows import Row
    from kimipipe.shard.shuffle import ExternalShuffle, row_shuffle_key
    shuffle = ExternalShuffle(str(tmp_path / "spill"), seed=5, memory_budget=3_000)
    for i in range(2000):
        shuffle.add("train", Row(f"id{i}", 1, 1, b"x" * 50 + b"\n"), 0, i + 1)
    out = list(shuffle.drain())
    assert shuffle.buckets_split > 0
    assert [o.row.id for o in out] == sorted((f"id{i}" for i in range(2000)),
                                             key=lambda s: row_shuffle_key(5, s))
    assert not (tmp_path / "spill").exists()


# --- filters and duplicates -------------------------------------------------------------------

def test_filters_are_applied_and_counted(tmp_path):
    recs = [token_record("ok", 4, 4), token_record("empty", 4, 0), token_record("short", 4, 1),
            token_record("long", 6, 10), token_record("hugeprompt", 12, 3)]
    src = write_jsonl(tmp_path / "t.jsonl", recs)
    out = tmp_path / "drop"
    r = kp("shard", src, "--out", out, "--min-output-tokens", "2", "--max-length", "10")
    assert r.code == 0, r.stderr
    assert [x["id"] for x in shard_rows(out)] == ["ok"]
    m = manifest_of(out)
    assert m["dropped"] == {"empty_output": 1, "too_long": 2, "prompt_too_long": 0,
                            "short_output": 1, "duplicate_id": 0}
    assert "dropped 1 empty output, 2 too long, 1 short output" in r.stderr

    out = tmp_path / "cut"
    r = kp("shard", src, "--out", out, "--min-output-tokens", "2", "--max-length", "10",
           "--truncate")
    assert r.code == 0, r.stderr
    rows = {x["id"]: x for x in shard_rows(out)}
    assert set(rows) == {"ok", "long"}
    assert rows["long"]["input_ids"] == list(range(1000, 1006)) + list(range(51000, 51004))
    assert rows["long"]["loss_mask"] == [0] * 6 + [1] * 4
    m = manifest_of(out)
    assert m["truncated"] == 1 and m["dropped"]["prompt_too_long"] == 1

    out = tmp_path / "rawcut"
    assert kp("shard", src, "--out", out, "--format", "raw", "--max-length", "10",
              "--truncate").code == 0
    long_row = [x for x in shard_rows(out) if x["id"] == "long"][0]
    assert long_row["output_ids"] == list(range(51000, 51004))
    assert long_row["messages"] == recs[3]["messages"]
    assert kp("shard", src, "--out", out, "--truncate").code == 2


def test_duplicate_ids_keep_the_first_row_or_stop(tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", [token_record("x", 2, 2), token_record("y", 2, 2)])
    again = write_jsonl(tmp_path / "b.jsonl", [token_record("y", 5, 5), token_record("z", 2, 2)])
    for extra in ([], ["--shuffle"]):
        out = tmp_path / f"d{len(extra)}"
        r = kp("shard", first, again, "--out", out, *extra)
        assert r.code == 0, r.stderr
        rows = {x["id"]: x for x in shard_rows(out)}
        assert set(rows) == {"x", "y", "z"} and len(rows["y"]["input_ids"]) == 4
        assert manifest_of(out)["dropped"]["duplicate_id"] == 1
        r = kp("shard", first, again, "--out", tmp_path / "e", "--on-duplicate", "error", *extra)
        assert r.code == 2
        assert f"{again}:1: duplicate id 'y'" in r.stderr
        assert not (tmp_path / "e" / "kp-shard.manifest").exists()


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("line, message", [
    ('{"id": "b", "dataset": "B3", "input_ids": [1, "2"], "output_ids": [3]}',
     "`input_ids` must be a list of non-negative integer token IDs"),
    ('{"id": "b", "dataset": "B3", "input_ids": [1], "output_ids": [-3]}', "`output_ids` must"),
    ('{"id": "b", "dataset": "B3", "input_ids": [1.5], "output_ids": [3]}', "`input_ids` must"),
    ('{"id": "b", "dataset": "B3", "input_ids": [1e3], "output_ids": [3]}', "`input_ids` must"),
    ('{"id": "b", "dataset": "B3", "input_ids": [[1]], "output_ids": [3]}', "`input_ids` must"),
    ('{"id": "b", "dataset": "B3", "input_ids": [1], "output_ids": [null]}', "`output_ids` must"),
    ('{"id": "b", "dataset": "B3", "input_ids": 5, "output_ids": [3]}', "`input_ids` must"),
    ('{"id": "b", "dataset": "B3", "input_ids": [1]}', "missing required field `output_ids`"),
    ('{"id": "b", "dataset": "B3", "input_ids": [1,], "output_ids": [3]}', ""),
    ('{"id": 5, "dataset": "B3", "input_ids": [1], "output_ids": [3]}', "at `$.id`"),
])
def test_bad_input_names_path_and_line_and_keeps_the_old_set(tmp_path, line, message):
    out = tmp_path / "shards"
    good = write_jsonl(tmp_path / "good.jsonl", records(3))
    assert kp("shard", good, "--out", out).code == 0
    before = manifest_of(out)
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps(token_record("a", 2, 2)) + "\n" + line + "\n")
    r = kp("shard", src, "--out", out)
    assert r.code == 2
    assert f"\nkp-shard: {src}:2: " in r.stderr and message in r.stderr, r.stderr
    assert manifest_of(out) == before
    assert visible_files(out) == ["README.md", "kp-shard.manifest", "shard-train-00000.jsonl.zst"]
    assert not [n for n in os.listdir(out) if ".tmp-" in n]


def test_empty_input_is_an_error(tmp_path):
    src = tmp_path / "empty.jsonl"
    src.write_text("")
    r = kp("shard", src, "--out", tmp_path / "o")
    assert r.code == 2 and "empty input" in r.stderr
    assert kp("shard", src).code == 2  # --out missing


# --- verify ---------------------------------------------------------------------------------

@pytest.fixture
def built(tmp_path):
    src = write_jsonl(tmp_path / "t.jsonl", records(30))
    out = tmp_path / "shards"
    assert kp("shard", src, "--out", out, "--records-per-shard", "10", "--eval-fraction",
              "0.2").code == 0
    return out


def rewrite_shard(out, name: str, lines: list[bytes], fix_manifest: bool = True) -> None:
    data = zstandard.ZstdCompressor().compress(b"".join(x + b"\n" for x in lines))
    (out / name).write_bytes(data)
    if fix_manifest:
        m = manifest_of(out)
        for s in m["shards"]:
            if s["file"] == name:
                s["bytes"] = len(data)
                s["sha256"] = hashlib.sha256(data).hexdigest()
        (out / "kp-shard.manifest").write_text(json.dumps(m))


def test_verify_passes_a_good_set_both_spellings(built):
    for args in (["verify", built], ["--verify", built]):
        r = kp("shard", *args)
        assert r.code == 0, r.stderr
        assert b"OK (" in r.stdout and r.stderr == ""


def test_verify_detects_a_flipped_byte(built):
    path = built / "shard-train-00001.jsonl.zst"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    r = kp("shard", "verify", built)
    assert r.code == 2
    out = r.stdout.decode()
    assert f"{built}/shard-train-00001.jsonl.zst: sha256 " in out and "does not match" in out


def test_verify_detects_a_wrong_count(built):
    m = manifest_of(built)
    m["shards"][0]["records"] += 1
    (built / "kp-shard.manifest").write_text(json.dumps(m))
    r = kp("shard", "verify", built)
    assert r.code == 2
    assert b"shard-train-00000.jsonl.zst: holds 10 records, the manifest says 11" in r.stdout
    assert b"totals.records" in r.stdout


def test_verify_detects_unequal_lengths_and_a_mask_without_a_one(built):
    lines = read_raw_lines(built / "shard-train-00000.jsonl.zst")
    row = json.loads(lines[2])
    row["loss_mask"] = row["loss_mask"][:-1]
    lines[2] = json.dumps(row).encode()
    row = json.loads(lines[4])
    row["loss_mask"] = [0] * len(row["loss_mask"])
    lines[4] = json.dumps(row).encode()
    rewrite_shard(built, "shard-train-00000.jsonl.zst", lines)
    r = kp("shard", "verify", built)
    assert r.code == 2
    assert b"shard-train-00000.jsonl.zst:3: input_ids has" in r.stdout
    assert b"shard-train-00000.jsonl.zst:5: loss_mask has no 1" in r.stdout


def test_verify_detects_a_missing_shard_and_a_stray_one(built):
    (built / "shard-eval-00000.jsonl.zst").rename(built / "shard-train-99999.jsonl.zst")
    r = kp("shard", "verify", built)
    assert r.code == 2
    assert b"shard-eval-00000.jsonl.zst: missing" in r.stdout
    assert b"shard-train-99999.jsonl.zst: not in the manifest" in r.stdout


def test_verify_without_a_manifest(tmp_path):
    r = kp("shard", "verify", tmp_path)
    assert r.code == 2 and b"no kp-shard.manifest" in r.stdout


# --- stats ----------------------------------------------------------------------------------

def test_stats_prints_a_length_histogram_to_stdout(tmp_path):
    recs = [token_record(f"r{i}", 100 + i, 300 * (i + 1), start=i) for i in range(10)]
    src = write_jsonl(tmp_path / "t.jsonl", recs)
    out = tmp_path / "shards"
    r = kp("shard", src, "--out", out, "--stats")
    assert r.code == 0 and "tokens per row" not in r.stderr
    s = kp("shard", "stats", out)
    assert s.code == 0 and s.stderr == ""
    for text in (r.stdout.decode(), s.stdout.decode()):
        assert "tokens per row" in text and "kept whole" in text
        assert re.search(r"\n  max +109 +3000 +3109\n", text)
        assert re.search(r"\n  4K +0 +4 +4 +100.0% +#{40}\n", text)
    assert s.stdout.split(b"tokens per row")[1] == r.stdout.split(b"tokens per row")[1]


# --- crash safety and reruns ------------------------------------------------------------------

def looks_finished(name: str) -> bool:
    return name.endswith((".jsonl.zst", ".parquet")) or name in ("kp-shard.manifest", "README.md")


def test_rerun_replaces_the_set_and_removes_only_stale_shards(tmp_path):
    src = write_jsonl(tmp_path / "t.jsonl", records(10))
    out = tmp_path / "shards"
    (tmp_path / "shards").mkdir()
    (out / "notes.txt").write_text("mine")
    (out / ".editor.tmp-1").write_text("not ours either")
    assert kp("shard", src, "--out", out, "--records-per-shard", "2").code == 0
    assert len(manifest_of(out)["shards"]) == 5
    assert kp("shard", src, "--out", out, "--records-per-shard", "4").code == 0
    assert visible_files(out) == ["README.md", "kp-shard.manifest", "notes.txt", "shard-train-00000.jsonl.zst",
                                  "shard-train-00001.jsonl.zst", "shard-train-00002.jsonl.zst"]
    assert kp("shard", src, "--out", out, "--name", "other").code == 0
    assert visible_files(out) == ["README.md", "kp-shard.manifest", "notes.txt", "other-train-00000.jsonl.zst"]
    assert (out / ".editor.tmp-1").exists()
    assert kp("shard", "verify", out).code == 0


def listed_files_whole(out, manifest: dict) -> None:
    """Every shard MANIFEST lists is in OUT, whole: size, SHA-256 and record count."""
    for shard in manifest["shards"]:
        data = (out / shard["file"]).read_bytes()
        assert len(data) == shard["bytes"], shard["file"]
        assert hashlib.sha256(data).hexdigest() == shard["sha256"], shard["file"]
        assert len(read_raw_lines(out / shard["file"])) == shard["records"], shard["file"]


# (scenario, the new run's extra flags, the steps, and which manifest each leaves): the new
# set reuses the old set's names (the old manifest goes first) or has names of its own
# (the old manifest stays until the swap, then six old shards are deleted one by one).
SWAP_STEPS = {
    "same-names": (["--records-per-shard", "3"], {
        "commit": "old", "manifest-written": "old", "old-manifest-removed": None,
        "renamed-1": None, "renamed-4": None, "card-renamed": None, "shards-renamed": None,
        "manifest-swapped": "new", "deleted-1": "new", "deleted-2": "new"}),
    "new-names": (["--records-per-shard", "3", "--name", "other"], {
        "commit": "old", "manifest-written": "old", "renamed-2": "old", "card-renamed": "old",
        "shards-renamed": "old", "manifest-swapped": "new", "deleted-1": "new",
        "deleted-3": "new", "deleted-6": "new"}),
}


@pytest.mark.parametrize("scenario", sorted(SWAP_STEPS))
def test_a_kill_9_at_each_step_of_the_swap_leaves_a_consistent_directory(tmp_path, scenario):
    """A real crash at every step of the swap (the set is complete, then renamed in): the
    process stops itself at the step (KP_TEST_PAUSE_AT, kimipipe/shard/writer.py) and is
    killed there with SIGKILL, so no cleanup runs. What it leaves: the old manifest with
    its files whole, no manifest, or the new manifest with its files whole, at the step
    the module docstring says; never a file that looks finished and is not. A rerun
    replaces the set and clears every leftover."""
    extra, steps = SWAP_STEPS[scenario]
    src = write_jsonl(tmp_path / "t.jsonl", records(12))
    template = tmp_path / "old"
    assert kp("shard", src, "--out", template, "--records-per-shard", "2").code == 0
    old = manifest_of(template)
    assert len(old["shards"]) == 6
    reference = tmp_path / "reference"  # the new set, built without a crash
    assert kp("shard", src, "--out", reference, *extra).code == 0
    new = manifest_of(reference)
    for step, expected in steps.items():
        out = tmp_path / f"o-{step}"
        shutil.copytree(template, out)
        proc = subprocess.Popen([str(BIN / "kp-shard"), str(src), "--out", str(out), "-q", *extra],
                                env={**os.environ, "KP_TEST_PAUSE_AT": step},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status = os.waitpid(proc.pid, os.WUNTRACED)  # returns once it has stopped itself
        assert os.WIFSTOPPED(status), f"{step}: never reached (exit status {status})"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        for name in visible_files(out):  # whatever looks finished is whole
            if name.endswith(".jsonl.zst"):
                read_raw(out / name)
        # the card a loader reads names only files that are there, whole: all of one set
        if (out / "README.md").exists():
            listed = {f for split in card_files(out).values() for f in split}
            found = {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in listed}
            assert any(found == {x["file"]: x["sha256"] for x in m["shards"]}
                       for m in (old, new)), step
        if expected is None:
            assert not (out / "kp-shard.manifest").exists(), step
        else:
            manifest = manifest_of(out)
            want = old if expected == "old" else new
            assert manifest["shards"] == want["shards"], step
            listed_files_whole(out, manifest)
        assert any(".tmp-" in n for n in os.listdir(out)) == (step in (
            "commit", "manifest-written", "old-manifest-removed", "card-renamed", "shards-renamed")
            or step.startswith("renamed-")), step
        r = kp("shard", src, "--out", out, *extra)  # the rerun: a clean, complete set
        assert r.code == 0, (step, r.stderr)
        assert manifest_of(out)["shards"] == new["shards"], step
        assert kp("shard", "verify", out).code == 0, step
        assert visible_files(out) == sorted(["README.md", "kp-shard.manifest", *(x["file"] for x in new["shards"])])
        assert not [n for n in os.listdir(out) if ".tmp-" in n], step
        assert not (out / ".kp-shard-stale").exists(), step


def big_input_lines(n: int, ids_per_row: int = 4000) -> list[bytes]:
    ids = ",".join(str(100_000 + i) for i in range(ids_per_row))
    return [(f'{{"id":"big{i}","dataset":"B","input_ids":[{ids}],'
             f'"output_ids":[{ids}]}}\n').encode() for i in range(n)]


@pytest.mark.parametrize("with_old_set", [False, True])
def test_kill_9_mid_run_leaves_nothing_that_looks_finished(tmp_path, with_old_set):
    out = tmp_path / "shards"
    if with_old_set:
        assert kp("shard", write_jsonl(tmp_path / "old.jsonl", records(5)), "--out", out).code == 0
        old = {n: (out / n).read_bytes() for n in visible_files(out)}
    lines = big_input_lines(400)
    proc = subprocess.Popen([str(BIN / "kp-shard"), "-", "--out", str(out),
                             "--records-per-shard", "50", "-q"],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for line in lines[:300]:  # feed most of it, keep the run open
            proc.stdin.write(line)
        proc.stdin.flush()
        # a finished shard of the new set exists, under its temporary name
        wait_for(lambda: any(n.startswith(".shard-train-00002.jsonl.zst.tmp-") for n in os.listdir(out)))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
        proc.stdin.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    names = os.listdir(out)
    assert any(".tmp-" in n for n in names)  # the run's work really was on disk
    new_looking = [n for n in names if looks_finished(n)]
    if with_old_set:
        assert {n: (out / n).read_bytes() for n in new_looking} == old
        assert kp("shard", "verify", out).code == 0
    else:
        assert new_looking == []
    # rerun: completes, cleans the leftovers, replaces the set
    r = kp("shard", "-", "--out", out, "--records-per-shard", "50", input=b"".join(lines))
    assert r.code == 0, r.stderr
    assert not [n for n in os.listdir(out) if ".tmp-" in n]
    assert manifest_of(out)["totals"]["records"] == 400
    assert visible_files(out) == ["README.md", "kp-shard.manifest"] + [f"shard-train-{i:05d}.jsonl.zst" for i in range(8)]
    assert kp("shard", "verify", out).code == 0


def test_a_second_run_on_the_same_directory_is_refused(tmp_path):
    out = tmp_path / "shards"
    out.mkdir()
    src = write_jsonl(tmp_path / "t.jsonl", records(3))
    with open(out / ".kp-shard.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = kp("shard", src, "--out", out)
    assert r.code == 2 and "another kp-shard is writing here" in r.stderr
    assert kp("shard", src, "--out", out).code == 0


# --- the fast decoder agrees with msgspec on every line ---------------------------------------

def test_fast_decoder_agrees_with_the_full_parse_and_refuses_what_json_refuses():
    import msgspec

    from kimipipe.shard.rows import TokenRecordDecoder
    dec = TokenRecordDecoder()
    good = [
        b'{"id":"a","dataset":"B","input_ids":[1,2,3],"output_ids":[4,0,50]}',
        b'{"output_ids":[7],"id":"b","dataset":"B","input_ids":[]}',
        b'{"id":"c","dataset":"B","meta":{"note":"\\"input_ids\\": [9]"},"input_ids":[0],'
        b'"output_ids":[10,0]}',
        b'{"id":"d","dataset":"B","meta":{"input_ids":[5]},"input_ids":[1],"output_ids":[2]}',
        b'{"id":"e","dataset":"B","input\\u005fids":[1],"output_ids":[2]}',
        b'{"id":"f","dataset":"B","input_ids": [1, 2],"output_ids":[3]}',
        b'{"id":"g","dataset":"B","input_ids":[0,10,0,100,0],"output_ids":[0],"z":1}',
        b'{"id":"h","dataset":"B","input_ids":[5],"output_ids":[6],"meta":{"output_ids":[9]}}',
    ]
    for line in good:
        want = msgspec.json.decode(line)
        got = dec.decode(line)
        assert got.id == want["id"]
        assert [int(x) for x in bytes(got.prompt).split(b",") if x] == want["input_ids"]
        assert [int(x) for x in bytes(got.output).split(b",") if x] == want["output_ids"]
        assert (got.n_in, got.n_out) == (len(want["input_ids"]), len(want["output_ids"]))
    # d (a nested key) and e (an escaped key) must not be taken apart by the fast path
    assert dec._fast(good[0]) is not None and dec._fast(good[3]) is None
    assert dec._fast(good[4]) is None and dec._fast(good[6]) is not None
    assert dec._fast(good[7]) is not None  # a nested key after the lists is just content
    assert dec._fast(good[1]) is None  # empty input_ids: slow path
    swapped = b'{"output_ids":[7,8],"id":"b","dataset":"B","input_ids":[1],"x":"]"}'
    got = dec._fast(swapped)
    assert (bytes(got.prompt), got.n_in, bytes(got.output), got.n_out) == (b"1", 1, b"7,8", 2)
    bad = [b"[1,,2]", b"[01]", b"[0,01]", b"[10,00]", b"[1,02,3]", b"[00]", b"[1,01]", b"[1,]", b"[,1]", b"[1.5]", b"[-1]", b'["1"]', b"[1x2]",
           b"[1e3]", b"[[1]]", b"[true]", b"[null]", b"{}", b"5", b'[1]]', b"[1"]
    for ids in bad:
        line = b'{"id":"x","dataset":"B","input_ids":' + ids + b',"output_ids":[1]}'
        with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
            dec.decode(line)
        line = b'{"id":"x","dataset":"B","input_ids":[1],"output_ids":' + ids + b'}'
        with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
            dec.decode(line)
    with pytest.raises(msgspec.ValidationError, match=r"Expected `str`, got `int` - at `\$.id`"):
        dec.decode(b'{"id":1,"dataset":"B","input_ids":[1],"output_ids":[2]}')
    with pytest.raises(msgspec.DecodeError):
        dec.decode(b'{"id":"x","dataset":"B","input_ids":[1],"output_ids":[2],"z":tru}')


def test_everything_dropped_gives_an_empty_set_and_a_warning(tmp_path):
    out = tmp_path / "shards"
    assert kp("shard", write_jsonl(tmp_path / "a.jsonl", records(4)), "--out", out).code == 0
    src = write_jsonl(tmp_path / "t.jsonl", [token_record("e", 3, 0), token_record("f", 2, 0)])
    r = kp("shard", src, "--out", out)
    assert r.code == 0, r.stderr
    assert "every record was dropped" in r.stderr
    m = manifest_of(out)
    assert m["shards"] == [] and m["totals"]["records"] == 0 and m["dropped"]["empty_output"] == 2
    assert visible_files(out) == ["README.md", "kp-shard.manifest"]
    assert kp("shard", "verify", out).code == 0


def test_out_that_is_a_file_is_a_usage_error(tmp_path):
    src = write_jsonl(tmp_path / "t.jsonl", records(2))
    r = kp("shard", src, "--out", src)
    assert r.code == 2 and "is a file" in r.stderr
    r = kp("shard", src, "--out", src / "sub")
    assert r.code == 2 and f"cannot write --out {src / 'sub'}: Not a directory" in r.stderr


def test_crlf_line_ends_and_blank_lines_give_the_same_rows_in_both_formats(tmp_path):
    """kp-shard reads lines with their line end kept (no copy per line): a `\r\n` file
    with blank lines, with and without a final newline, gives the rows an `\n` file gives."""
    recs = records(6)
    plain = write_jsonl(tmp_path / "lf.jsonl", recs)
    lines = [json.dumps(r, separators=(",", ":")).encode() for r in recs]
    variants = {"crlf": b"\r\n".join(lines) + b"\r\n",
                "blank": b"\n\n".join(lines[:3]) + b"\n \r\n" + b"\n".join(lines[3:]) + b"\n",
                "unended": b"\n".join(lines)}  # (no newline after the last record)
    for fmt in ("eagle", "raw"):
        want_dir = tmp_path / f"want-{fmt}"
        assert kp("shard", plain, "--out", want_dir, "--format", fmt).code == 0
        want = shard_bytes(want_dir)
        assert len(want.splitlines()) == 6 and b"\r" not in want
        for name, data in variants.items():
            src = tmp_path / f"{name}.jsonl"
            src.write_bytes(data)
            out = tmp_path / f"{name}-{fmt}"
            r = kp("shard", src, "--out", out, "--format", fmt, "--max-length", "8", "--truncate")
            assert r.code == 0, (name, r.stderr)
            cut = kp("shard", plain, "--out", tmp_path / "cut", "--format", fmt,
                     "--max-length", "8", "--truncate")
            assert cut.code == 0
            assert shard_bytes(out) == shard_bytes(tmp_path / "cut"), (name, fmt)
            r = kp("shard", src, "--out", out, "--format", fmt)
            assert r.code == 0 and shard_bytes(out) == want, (name, fmt)


def test_id_list_checks_match_json_on_random_bodies():
    import random

    from kimipipe.shard.rows import IdListChecker
    check = IdListChecker()
    rng = random.Random(0)
    for _ in range(5000):
        body = "".join(rng.choice("0123456789,,00") for _ in range(rng.randint(1, 9))).encode()
        try:
            values = json.loads(b"[" + body + b"]")
            want = body.count(b",")
        except ValueError:
            want = None
        assert check.commas(body, 0, len(body)) == want, body
        # in place, inside a line, with neighbours that would pass or fail the check
        for left, right in ((b"1,", b",2"), (b",", b","), (b"[", b"]")):
            line = left + body + right
            assert check.commas(line, len(left), len(line) - len(right)) == want, line
        if want is not None:
            assert len(values) == want + 1


def test_lists_that_end_the_record_are_found_from_the_end_and_checked_like_the_rest():
    import msgspec

    from kimipipe.shard.rows import TokenRecordDecoder, _lists_at_end

    dec = TokenRecordDecoder()

    def by_end_path(line):  # what the first fast path takes: lists that end the record
        spans = _lists_at_end(line)
        return dec._checked(line, *spans) if spans is not None else None

    big = ",".join(str(i) for i in range(1000, 3000))
    good = [
        # (line, taken by the end path?)
        (b'{"id":"a","dataset":"B","input_ids":[1,2,3],"output_ids":[4,0,50]}', True),
        (b'{"id":"b","dataset":"B","input_ids":[' + big.encode() + b'],"output_ids":[0,'
         + big.encode() + b'],"over_max_length":true}', True),
        (b'{"id":"c","dataset":"B","meta":{"input_ids":[5],"output_ids":[6]},'
         b'"input_ids":[1],"output_ids":[2]}', True),  # nested keys before: not the last `[`
        (b'{"id":"d","dataset":"B","input_ids":[5],"output_ids":[6],"meta":{"x":[9]}}', False),
        (b'{"id":"e","dataset":"B","input_ids":[1],"output_ids":[2],'
         b'"meta":{"input_ids":[3],"output_ids":[4]}}', False),  # the nested pair is refused
        (b'{"id":"f","dataset":"B","output_ids":[7],"input_ids":[8]}', False),  # other order
        (b'{"id":"g","dataset":"B","x":"\\"input_ids\\":[1],\\"output_ids\\":[2]"}'[:-1]
         + b',"input_ids":[3],"output_ids":[4]}', True),
    ]
    for line, at_end in good:
        want = msgspec.json.decode(line)
        got = dec.decode(line)
        assert got.id == want["id"]
        assert [int(x) for x in bytes(got.prompt).split(b",")] == want["input_ids"], line
        assert [int(x) for x in bytes(got.output).split(b",")] == want["output_ids"], line
        assert (got.n_in, got.n_out) == (len(want["input_ids"]), len(want["output_ids"]))
        assert (by_end_path(line) is not None) == at_end, line
    for ids in (b"[1,,2]", b"[01]", b"[1,02]", b"[1.5]", b"[-1]", b"[1 2]", b"[" + big.encode() + b",07]",
                b"[" + big.encode() + b",,7]", b"[" + big.encode() + b"x]"):
        for line in (b'{"id":"x","dataset":"B","input_ids":' + ids + b',"output_ids":[1]}',
                     b'{"id":"x","dataset":"B","input_ids":[1],"output_ids":' + ids + b'}'):
            assert by_end_path(line) is None, line
            with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
                dec.decode(line)


def test_id_list_check_on_long_lists_with_zeros_and_errors_far_in():
    from kimipipe.shard.rows import IdListChecker
    check = IdListChecker()
    base = ",".join(str(i) for i in range(1, 20000))  # longer than the scratch buffer
    for body, want in ((base, 19998), (base + ",0", 19999), ("0," + base, 19999),
                       (base + ",0,5", 20000), (base + ",05", None), (base + ",,5", None),
                       (base + ",", None), ("," + base, None), ("05," + base, None),
                       (base + ",-5", None), (base + ",5/", None), (base + ",5:", None),
                       ("0", 0), ("00", None), ("0,0,0", 2), ("0,00", None), ("10,0", 1),
                       (base + ",5 ", None), (base.replace(",777,", ",7,,7,"), None),
                       ("1,\x002", None), ("1,\xff", None), ("\x80", None), ("1\n", None)):
        data = body.encode("latin-1")  # (one byte per character, as written)
        assert check.commas(data, 0, len(data)) == want, body[-8:]
        line = b'x"input_ids":[' + data + b"]}"
        assert check.commas(line, 14, len(line) - 2) == want, body[-8:]
    assert check.commas(b"12", 1, 1) is None  # an empty span


def test_shards_synced_in_the_background_while_written_are_complete(tmp_path, monkeypatch):
    from kimipipe.shard import ShardOptions, build_shards, verify, writer
    monkeypatch.setattr(writer, "_SYNC_EVERY", 1)  # a background sync after every write
    src = write_jsonl(tmp_path / "t.jsonl", records(300))
    out = tmp_path / "shards"
    result = build_shards([str(src)], str(out), ShardOptions(records_per_shard=100), "test")
    assert [s.records for s in result.shards] == [100, 100, 100]
    report = verify(str(out))
    assert report.problems == [] and report.records == 300
    assert len(shard_rows(out)) == 300


def test_an_error_from_a_background_sync_fails_the_build_and_keeps_the_old_set(tmp_path, monkeypatch):
    """A disk error reported to a background fdatasync must not be lost: the build fails,
    the previous set stays as it was, and no temporary file is left."""
    from kimipipe.shard import ShardOptions, build_shards, verify, writer
    src = write_jsonl(tmp_path / "t.jsonl", records(300))
    out = tmp_path / "shards"
    build_shards([str(write_jsonl(tmp_path / "old.jsonl", records(7, "old")))], str(out),
                 ShardOptions(records_per_shard=5), "old")
    before = {n: (out / n).read_bytes() for n in visible_files(out)}
    monkeypatch.setattr(writer, "_SYNC_EVERY", 1)  # a background sync after every write
    synced = []

    def broken(fd):
        synced.append(fd)
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(writer.os, "fdatasync", broken)
    with pytest.raises(OSError, match="Input/output error"):
        build_shards([str(src)], str(out), ShardOptions(records_per_shard=100), "new")
    assert synced  # the error came from a background sync, not from the final fsync
    assert {n: (out / n).read_bytes() for n in visible_files(out)} == before
    assert verify(str(out)).problems == []
    assert not [n for n in os.listdir(out) if ".tmp-" in n]
