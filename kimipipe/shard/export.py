"""`kp-shard export`: a shard set as the files one trainer reads, with its config.

The shards are zstd JSONL (or Parquet) in a directory with a manifest; the trainers read
neither as they are. SpecForge 0.2.0's `data.prompts_path` is ONE plain JSONL file
opened with `open()` (no directory, no `.zst`, no Parquet); speculators 0.9.0's
`prepare-data --data` reads local `.json`/`.jsonl` files, or a directory of them, and
calls everything else an "Unsupported dataset". So export writes, into --out DIR:

    train.jsonl, eval.jsonl (when the set has an eval split): the rows, exactly as the
        shards hold them ({"id", "input_ids", "loss_mask"} per line; a Parquet set's rows
        re-encoded so), train shards then eval shards, in the manifest's order;
    specforge.yaml (--for specforge): a config SpecForge's own `load_config` accepts:
        pre-tokenized online training (`data.prompts_path`), which 0.2.0 runs only as
        `deployment.mode: disaggregated` with `backend: mooncake` and a
        `model.vocab_mapping_path`; `data.max_length` is the longest row;
    vocab_mapping.py (--for specforge): makes that vocab mapping (vocab_mapping.pt, d2t/t2d)
        with SpecForge's own `generate_vocab_mapping_file`, run in SpecForge's environment
        (it needs torch, which kimipipe does not);
    speculators.yaml (--for speculators): `speculators train --config` for the rows
        `prepare-data --data DIR/train.jsonl --output DIR/prepared --overwrite` makes (each
        row's own mask is kept: "Speculator-format rows"; without --overwrite it skips an
        output directory that holds data, an earlier export's); `data.total_seq_len` is
        the longest row.

Each YAML starts with the commands to run next, as comments. An earlier export's
vocab_mapping.pt is removed (SpecForge would reuse it for the new rows). Several sets (DIR..., or a
parent of sets) are exported into one train.jsonl. Nothing is trusted: each shard's
SHA-256, rows and token counts are checked against the manifest as they are copied, and a
mismatch stops the export with the file named (run `kp-shard verify`), leaving --out as
it was: every file is written under a temporary name and renamed when all are complete.
Memory stays bounded by one row (a Parquet row group).

A new trainer is one entry in TRAINERS: its name, its help and the function writing its
config.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import msgspec
import yaml
import zstandard

from ..errors import InputError
from .formats import PARQUET, EagleLengths, row_format
from .readback import iter_shard_lines, read_manifest
from .writer import manifest_path, temp_name

# The model kimipipe's shards are made for, by its Hugging Face id (a --target of another
# model replaces it); its vocabulary when the target's config.json cannot be read.
DEFAULT_TARGET = "moonshotai/Kimi-K2.5"
KIMI_VOCAB_SIZE = 163_840
# The draft vocabulary both trainers' EAGLE-3 defaults use (SpecForge derives 32,000
# from the target; speculators builds d2t/t2d of --draft-vocab-size from token counts).
DEFAULT_DRAFT_VOCAB = 32_000
TRAIN, EVAL = "train", "eval"

_lengths = msgspec.json.Decoder(EagleLengths)


@dataclass
class ExportOptions:
    trainer: str  # a key of TRAINERS
    out_dir: str
    target: str = DEFAULT_TARGET
    draft_vocab_size: int = DEFAULT_DRAFT_VOCAB


@dataclass
class ExportResult:
    """What was written: rows and tokens per split, the longest row, the files."""

    rows: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    longest: int = 0
    files: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)


def export_sets(sets: list[str], opts: ExportOptions) -> ExportResult:
    """Write the rows of SETS (shard set directories) and OPTS.trainer's config into
    OPTS.out_dir; InputError naming the file when a set is not what its manifest says."""
    trainer = TRAINERS[opts.trainer]
    out = opts.out_dir
    os.makedirs(out, exist_ok=True)
    result = ExportResult()
    written: dict[str, str] = {}  # final path -> its temporary path
    try:
        # each split's rows, set by set; a split none of the sets has leaves no file
        for split in (TRAIN, EVAL):
            final = os.path.join(out, f"{split}.jsonl")
            tmp = os.path.join(out, temp_name(f"{split}.jsonl"))
            written[final] = tmp
            with open(tmp, "wb") as f:
                for directory in sets:
                    for line, n_tokens in _split_rows(directory, split):
                        f.write(line)
                        result.rows[split] = result.rows.get(split, 0) + 1
                        result.tokens[split] = result.tokens.get(split, 0) + n_tokens
                        result.longest = max(result.longest, n_tokens)
            if not result.rows.get(split):
                os.unlink(tmp)
                del written[final]
        if not result.rows.get(TRAIN):
            raise InputError("no train rows to export", ", ".join(sets))
        for name, text in trainer.write(opts, result).items():
            final = os.path.join(out, name)
            written[final] = os.path.join(out, temp_name(name))
            with open(written[final], "w", encoding="utf-8") as f:
                f.write(text)
    except BaseException:
        for tmp in written.values():
            if os.path.exists(tmp):
                os.unlink(tmp)
        raise
    for final, tmp in written.items():
        os.replace(tmp, final)
        result.files.append(final)
    # An earlier export's files made from other rows: its eval.jsonl, and what the
    # trainers derive from train.jsonl and would reuse as it is (SpecForge's
    # generate_vocab_mapping_file returns an existing vocab_mapping.pt untouched).
    stale = [trainer.derived for trainer in TRAINERS.values() if trainer.derived]
    if not result.rows.get(EVAL):
        stale.append("eval.jsonl")
    for name in stale:
        if os.path.isfile(os.path.join(out, name)):
            os.unlink(os.path.join(out, name))
    result.next_steps = trainer.next_steps(opts, result)
    return result


def _split_rows(directory: str, split: str) -> Iterator[tuple[bytes, int]]:
    """(row line, tokens) of SPLIT's shards of the set in DIRECTORY, checked against its
    manifest shard by shard (SHA-256, rows, prompt and output tokens)."""
    manifest = read_manifest(directory)
    fmt = row_format(manifest.format, manifest_path(directory))
    if fmt.lengths is not EagleLengths:
        raise InputError(f"a {fmt.name} set holds token records, not the rows trainers read: "
                         "rebuild it with --format eagle (or parquet)", directory)
    for entry in manifest.shards:
        if entry.split != split:
            continue
        path = os.path.join(directory, entry.file)
        rows = n_in = n_out = 0
        # (the file is hashed before its rows are read: a second read of the compressed
        # bytes, from the page cache, against a decompression and a decode of each row)
        sha = _file_sha256(path)
        lines = _parquet_lines(path) if fmt.container == PARQUET else _jsonl_lines(path)
        for lineno, line in lines:
            try:
                prompt, output = fmt.count(_lengths.decode(line))
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                raise InputError(f"{e} (run kp-shard verify)", path, lineno) from None
            rows += 1
            n_in += prompt
            n_out += output
            yield line if line.endswith(b"\n") else line + b"\n", prompt + output
        found = (rows, n_in, n_out, sha.hexdigest())
        expected = (entry.records, entry.input_tokens, entry.output_tokens, entry.sha256)
        if found != expected:
            raise InputError(
                f"does not match {os.path.basename(manifest_path(directory))} (rows, prompt "
                f"tokens, output tokens, sha256: {found[:3]} against {expected[:3]}"
                f"{', another sha256' if found[3] != expected[3] else ''}): "
                "run kp-shard verify", path)


def _jsonl_lines(path: str) -> Iterator[tuple[int, bytes]]:
    try:
        yield from iter_shard_lines(path)
    except FileNotFoundError:
        raise InputError("missing shard (run kp-shard verify)", path) from None
    except zstandard.ZstdError as e:
        raise InputError(f"cannot decompress: {e} (run kp-shard verify)", path) from None


def _parquet_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """A Parquet shard's rows as eagle JSON lines, a row group at a time."""
    from . import parquet

    try:
        yield from enumerate(parquet.eagle_lines(path), 1)
    except FileNotFoundError:
        raise InputError("missing shard (run kp-shard verify)", path) from None
    except parquet.Unreadable as e:
        raise InputError(f"{e} (run kp-shard verify)", path) from None


def _file_sha256(path: str):
    sha = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                sha.update(chunk)
    except FileNotFoundError:
        raise InputError("missing shard (run kp-shard verify)", path) from None
    return sha


def target_vocab_size(target: str) -> int:
    """The target's vocabulary: its config.json's (text_config's for a multimodal model
    such as Kimi K2.5), when TARGET is a directory holding one; else Kimi K2.5's."""
    try:
        with open(os.path.join(target, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return KIMI_VOCAB_SIZE
    size = (config.get("text_config") or {}).get("vocab_size") or config.get("vocab_size")
    return size if isinstance(size, int) and size > 0 else KIMI_VOCAB_SIZE


def _target(opts: ExportOptions) -> str:
    """The target as the config names it: a local directory made absolute (the trainer
    may run elsewhere in the tree), a Hub id as given."""
    return os.path.abspath(opts.target) if os.path.isdir(opts.target) else opts.target


def _yaml(header: list[str], config: dict) -> str:
    return "".join(f"# {line}\n" if line else "#\n" for line in header) + yaml.safe_dump(
        config, sort_keys=False, default_flow_style=False)


# --- SpecForge 0.2.0 -------------------------------------------------------------------

VOCAB_MAPPING_SCRIPT = '''\
"""vocab_mapping.pt for SpecForge (model.vocab_mapping_path in specforge.yaml): the d2t/t2d
maps between the draft's {draft:,} tokens and the target's {target:,}, made by SpecForge's
own generate_vocab_mapping_file from the output tokens (loss_mask 1) of train.jsonl.
Run it with the Python SpecForge is installed in (it needs torch and datasets):
    python {script}
"""
import os

from datasets import load_dataset
from specforge.data.preprocessing import generate_vocab_mapping_file

here = os.path.dirname(os.path.abspath(__file__))
rows = load_dataset("json", data_files=os.path.join(here, "train.jsonl"), split="train")
print(generate_vocab_mapping_file(rows.with_format("torch"), target_vocab_size={target},
                                  draft_vocab_size={draft}, cache_dir=here,
                                  cache_key="vocab_mapping"))
'''


def _specforge_files(opts: ExportOptions, result: ExportResult) -> dict[str, str]:
    out = os.path.abspath(opts.out_dir)
    target = _target(opts)
    config = {
        "model": {
            "target_model_path": target,
            "trust_remote_code": True,
            "vocab_mapping_path": os.path.join(out, "vocab_mapping.pt"),
        },
        "data": {
            "prompts_path": os.path.join(out, "train.jsonl"),
            "max_length": result.longest,
        },
        "training": {"strategy": "eagle3"},
        "deployment": {
            "mode": "disaggregated",
            "disaggregated": {"backend": "mooncake",
                              "control_dir": os.path.join(out, "control")},
        },
        "output_dir": os.path.join(out, "output"),
    }
    header = [
        "SpecForge 0.2.0 run config, written by kp-shard export (SpecForge's load_config",
        "accepts it). Pre-tokenized rows mean online training: an SGLang capture server",
        "for the target and Mooncake (GPUs) make the hidden states as the trainer reads.",
        f"data.max_length is the longest row ({result.longest:,} tokens); SpecForge's",
        "default is 2048 and it cuts longer rows. SpecForge 0.2.0 has no online eval input:",
        "eval.jsonl, where written, is for your own evaluation.",
        "",
        *(f"  {step}" for step in _specforge_steps(opts)),
    ]
    return {
        "specforge.yaml": _yaml(header, config),
        "vocab_mapping.py": VOCAB_MAPPING_SCRIPT.format(
            draft=opts.draft_vocab_size, target=target_vocab_size(opts.target),
            script=os.path.join(out, "vocab_mapping.py")),
    }


def _specforge_steps(opts: ExportOptions, result: ExportResult | None = None) -> list[str]:
    out = os.path.abspath(opts.out_dir)
    return [f"python {os.path.join(out, 'vocab_mapping.py')}   # in SpecForge's environment",
            f"specforge train -c {os.path.join(out, 'specforge.yaml')}"]


# --- speculators 0.9.0 -----------------------------------------------------------------

def _speculators_files(opts: ExportOptions, result: ExportResult) -> dict[str, str]:
    out = os.path.abspath(opts.out_dir)
    config = {"train": {
        "speculator_type": "eagle3",
        "verifier": {"verifier_name_or_path": _target(opts), "trust_remote_code": True},
        "data": {"data_path": os.path.join(out, "prepared"),
                 "total_seq_len": result.longest},
        "draft": {"draft_vocab_size": opts.draft_vocab_size},
    }}
    header = [
        "speculators 0.9.0 train config (speculators train --config), written by kp-shard",
        "export. data.data_path is what prepare-data writes from train.jsonl (each row keeps",
        "its own loss_mask); hidden states come from a vLLM server of the target",
        "(--vllm-endpoint) or from generate-offline-data first (GPUs).",
        f"data.total_seq_len is the longest row ({result.longest:,} tokens; the default",
        "is 8192).",
        "",
        *(f"  {step}" for step in _speculators_steps(opts, result)),
    ]
    return {"speculators.yaml": _yaml(header, config)}


def _speculators_steps(opts: ExportOptions, result: ExportResult) -> list[str]:
    out = os.path.abspath(opts.out_dir)
    return [f"speculators prepare-data --model {_target(opts)} --trust-remote-code "
            f"--data {os.path.join(out, 'train.jsonl')} --output {os.path.join(out, 'prepared')} "
            f"--seq-length {result.longest} --no-skip-token-freq --overwrite",
            f"speculators train --config {os.path.join(out, 'speculators.yaml')} "
            "--vllm-endpoint http://HOST:PORT/v1"]


@dataclass(frozen=True)
class Trainer:
    name: str
    help: str
    write: Callable[[ExportOptions, ExportResult], dict[str, str]]  # file name -> text
    next_steps: Callable[[ExportOptions, ExportResult], list[str]]
    derived: str | None = None  # a file its next steps make from train.jsonl, in --out


TRAINERS: dict[str, Trainer] = {t.name: t for t in (
    Trainer("specforge", "SpecForge 0.2.0: train.jsonl (data.prompts_path), specforge.yaml, "
            "vocab_mapping.py", _specforge_files, _specforge_steps, "vocab_mapping.pt"),
    Trainer("speculators", "speculators 0.9.0: train.jsonl (prepare-data --data), "
            "speculators.yaml", _speculators_files, _speculators_steps),
)}
