"""The dataset card: DIR/README.md, in the Hugging Face Hub's format, from what the build knows.

The YAML block is what `datasets.load_dataset(DIR)` and the Hub read: `configs` lists each
split's files exactly as the manifest does (so the loader gives `train` and `eval`, and
never a file the manifest does not list), `dataset_info` the features (formats.py: the
rows are cast to them, the same for JSONL and Parquet) and each split's `num_examples`
(which `datasets` checks against the rows it read: a stale card fails loudly). `license`
is left for the user (kept when the card is rewritten): the prompts' sources carry their
own licences.

The text: the rows kept, dropped and truncated (the manifest), the model as served, the
providers with their shares, quantizations (from kp-infer's plan, where given) and
token-count deltas, the sampling as sent, reasoning, turns, where the output IDs came from
(the manifest's `provenance`, counted over the rows kept), the prompt sources, the answers'
runs (kp-infer's `--summary-json`, where given), the kimipipe version and the commands.

kp-shard writes the card with every build (from the manifest alone) and `kp-shard card DIR`
rewrites it, with the summaries, plans, sources and commands it is given. A README.md
that is not a kp-shard card (no MARKER) is never overwritten.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import yaml

from ..errors import InputError
from .formats import FORMATS
from .manifest import ShardManifest, ShardProvenance

MARKER = "<!-- kp-shard card:"


@dataclass
class CardInputs:
    """What the card is told beyond the manifest (all optional)."""

    summaries: list[str] = field(default_factory=list)  # kp-infer --summary-json files
    plans: list[str] = field(default_factory=list)  # kp-infer --plan --json files
    sources: list[str] = field(default_factory=list)  # the prompts' source files, as named
    commands: list[str] = field(default_factory=list)  # the commands that made the inputs


class _Route(msgspec.Struct):
    provider: str
    quantization: str | None = None
    allowed: bool = True
    tag: str | None = None


class _Plan(msgspec.Struct):
    """The view of kp-infer's plan (plans.InferPlan) the card reads."""

    model: str | None = None
    routes: list[_Route] | None = None


class _Summary(msgspec.Struct):
    """The view of kp-infer's summary (contracts.InferSummary) the card reads: these
    fields only, so that an older or newer kp-infer's summary is read as well."""

    exit_code: int | None = None
    stop_reason: str | None = None
    input_records: int = 0
    done: int = 0
    skipped: int = 0
    failed: dict[str, int] = msgspec.field(default_factory=dict)
    spend_this_run: float | None = None
    spend_total: float | None = None
    providers: dict[str, float] = msgspec.field(default_factory=dict)
    finish_reasons: dict[str, int] = msgspec.field(default_factory=dict)
    refused: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)


def _read(path: str, kind: type, what: str):
    try:
        with open(path, "rb") as f:
            return msgspec.json.decode(f.read(), type=kind)
    except FileNotFoundError:
        raise InputError(f"no such {what}", path) from None
    except OSError as e:
        raise InputError(f"cannot read {what}: {e.strerror}", path) from None
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise InputError(f"not a {what}: {e}", path) from None


def read_inputs(inputs: CardInputs) -> tuple[list[tuple[str, _Summary]], list[tuple[str, _Plan]]]:
    """The summaries and plans named, decoded (InputError naming a bad one)."""
    return ([(p, _read(p, _Summary, "kp-infer summary (--summary-json)")) for p in inputs.summaries],
            [(p, _read(p, _Plan, "kp-infer plan (--plan --json)")) for p in inputs.plans])


def existing_card(directory: str) -> tuple[bool, dict]:
    """(may kp-shard write DIR/README.md, the YAML of the card there): True with its YAML
    when it is a kp-shard card, True and {} when there is none, False when it is not ours."""
    path = os.path.join(directory, "README.md")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return True, {}
    except OSError:
        return False, {}
    if MARKER not in text:
        return False, {}
    return True, front_matter(text) or {}


def front_matter(text: str) -> dict | None:
    """The YAML block at the top of a card (None if it has none or it does not parse)."""
    m = re.match(r"---\n(.*?)\n---\n", text, re.S)
    if not m:
        return None
    try:
        value = yaml.safe_load(m.group(1))
    except yaml.YAMLError:
        return None
    return value if isinstance(value, dict) else None


def data_files(manifest: ShardManifest) -> dict[str, list[str]]:
    """Each split's files, in the manifest's order (train first)."""
    out: dict[str, list[str]] = {}
    for s in manifest.shards:
        out.setdefault(s.split, []).append(s.file)
    return out


def _size_category(n: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
                        (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M")):
        if n < limit:
            return name
    return "10M<n<100M"


def metadata(manifest: ShardManifest, license: str | None = None) -> dict:
    """The card's YAML block, as data."""
    fmt = FORMATS.get(manifest.format)
    meta: dict[str, Any] = {}
    if license:
        meta["license"] = license
    meta["pretty_name"] = manifest.options.name
    meta["tags"] = ["kimipipe", "speculative-decoding", "eagle3", "synthetic", "distillation"]
    meta["task_categories"] = ["text-generation"]
    meta["size_categories"] = [_size_category(manifest.totals.records)]
    files = data_files(manifest)
    meta["configs"] = [{"config_name": "default",
                        "data_files": [{"split": split, "path": names}
                                       for split, names in files.items()]}]
    info: dict[str, Any] = {}
    if fmt is not None and fmt.features is not None:
        info["features"] = fmt.features
    # num_bytes: the rows uncompressed, as the manifest counts them (JSON text; Parquet:
    # the columns in memory); `datasets` checks num_examples only
    info["splits"] = [{"name": split, "num_bytes": manifest.splits[split].uncompressed_bytes,
                       "num_examples": manifest.splits[split].records}
                      for split in files if split in manifest.splits]
    info["download_size"] = manifest.totals.bytes
    info["dataset_size"] = manifest.totals.uncompressed_bytes
    meta["dataset_info"] = info
    return meta


def _pct(n: float, total: float) -> str:
    return f"{100 * n / total:.1f}%" if total else "-"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def _counts(counts: dict[str, int], total: int) -> str:
    return ", ".join(f"{k} {v:,} ({_pct(v, total)})" for k, v in counts.items()) or "none"


def _delta(d) -> str:
    if not d.rows:
        return "-"
    return f"{d.sum / d.rows:+.2f} ({d.min:+d}..{d.max:+d}; exact {_pct(d.zero, d.rows)})"


def _quantizations(provider: str, plans: list[tuple[str, _Plan]]) -> str:
    if not plans:
        return "(no plan given)"
    found = sorted({r.quantization or "unknown" for _, p in plans for r in (p.routes or [])
                    if r.provider == provider and r.allowed})
    return ", ".join(found) if found else "not an allowed route in the plan"


def render(manifest: ShardManifest, inputs: CardInputs | None = None,
           license: str | None = None) -> str:
    """The whole card: YAML block, then the text."""
    inputs = inputs or CardInputs()
    summaries, plans = read_inputs(inputs)
    name = manifest.options.name
    fmt = FORMATS.get(manifest.format)
    prov = manifest.provenance
    lines = ["---", yaml.safe_dump(metadata(manifest, license), sort_keys=False,
                                   allow_unicode=True, width=100).rstrip("\n"), "---",
             f"{MARKER} written by kp-shard from kp-shard.manifest and the files named under "
             "'How it was made'; `kp-shard card DIR` rewrites it. Set `license` above: it is "
             "kept when the card is rewritten; other edits are not. -->", "", f"# {name}", ""]
    models = ", ".join(f"`{m}`" for m in (prov.models if prov else {})) or "a model"
    lines += [f"Training rows for a speculative-decoding drafter (EAGLE-3): the answers of "
              f"{models} to prompts, as token IDs, made with kimipipe "
              f"{manifest.kimipipe_version} on {manifest.created}.", ""]
    if not license:
        lines += ["> **Licence: not set.** The prompts come from the sources listed below, each "
                  "under its own licence, and the answers are a model's outputs under its "
                  "provider's terms. Set `license:` in the YAML above to what they allow before "
                  "you publish this dataset.", ""]
    splits = list(data_files(manifest))
    lines += ["## Loading", "", "```python", "from datasets import load_dataset",
              f'ds = load_dataset("path/to/{name}")  # splits: {", ".join(splits) or "none"}',
              "```", ""]
    if fmt is not None and fmt.features is not None:
        lines += ["Each row: `id` (string), `input_ids` (int32: the prompt's tokens, then the "
                  "answer's), `loss_mask` (int8: 0 per prompt token, 1 per answer token). "
                  f"Files: {'Parquet' if fmt.container == 'parquet' else 'zstd JSON lines'} "
                  f"(kp-shard `--format {manifest.format}`); `kp-shard verify` checks them "
                  "against kp-shard.manifest (sizes, SHA-256, rows, tokens).", ""]
    else:
        lines += [f"Rows: the token records as kp-tokenize wrote them (`--format "
                  f"{manifest.format}`).", ""]
    lines += _files_section(manifest) + _rows_section(manifest)
    if prov is None:
        lines += ["## Where the rows came from", "",
                  f"Not recorded: this set was made by kimipipe {manifest.kimipipe_version}, "
                  "before kp-shard counted the token records' facts. Rebuild it with kp-shard "
                  "to have them here.", ""]
    else:
        lines += _provenance_sections(prov, plans)
    lines += _sources_section(manifest, prov, inputs)
    lines += _summaries_section(summaries)
    lines += ["## How it was made", "", f"kimipipe {manifest.kimipipe_version}, "
              f"manifest version {manifest.manifest_version}, created {manifest.created}.", ""]
    commands = [*inputs.commands, manifest.command]
    lines += ["```", *commands, "```", ""]
    named = [*(f"kp-infer summary: `{p}`" for p in inputs.summaries),
             *(f"kp-infer plan: `{p}`" for p in inputs.plans)]
    if named:
        lines += ["Read for this card: " + "; ".join(named) + ".", ""]
    return "\n".join(lines)


def _files_section(m: ShardManifest) -> list[str]:
    rows = []
    for split, t in m.splits.items():
        rows.append([split, f"{t.records:,}", f"{t.input_tokens:,}", f"{t.output_tokens:,}",
                     t.shards, f"{t.bytes:,}"])
    t = m.totals
    rows.append(["all", f"{t.records:,}", f"{t.input_tokens:,}", f"{t.output_tokens:,}",
                 t.shards, f"{t.bytes:,}"])
    return ["## Splits", "", *_table(["split", "rows", "prompt tokens", "answer tokens",
                                      "files", "bytes"], rows), ""]


def _rows_section(m: ShardManifest) -> list[str]:
    o = m.options
    dropped = sum(m.dropped.values())
    lines = ["## Rows kept", "",
             f"Token records read: {m.records_read:,}; rows kept: {m.totals.records:,}; "
             f"dropped: {dropped:,}; truncated: {m.truncated:,}.", ""]
    if dropped:
        lines += ["Dropped, by reason: " + ", ".join(
            f"{k.replace('_', ' ')} {v:,}" for k, v in m.dropped.items() if v) + ".", ""]
    rules = [f"min output tokens {o.min_output_tokens}",
             f"max length {o.max_length if o.max_length is not None else 'none'}"
             + (" (longer answers cut)" if o.truncate else ""),
             f"eval fraction {o.eval_fraction} (by a hash of the conversation or id)",
             f"shuffle seed {o.seed}" if o.shuffle else "input order",
             f"a repeated id: {o.on_duplicate}"]
    return lines + ["Rules: " + "; ".join(rules) + ".", ""]


def _provenance_sections(p: ShardProvenance, plans: list[tuple[str, _Plan]]) -> list[str]:
    n = p.rows
    requested = sorted({pl.model for _, pl in plans if pl.model})
    lines = ["## Model", ""]
    if requested:
        lines += [f"Asked for: {', '.join(f'`{r}`' for r in requested)} (the plan)."]
    lines += [f"Served as (the answers' `model`): {_counts(p.models, n)}.",
              f"API: {_counts(p.apis, n)}.", ""]
    rows = [[name, f"{r.rows:,}", _pct(r.rows, n), f"{r.output_tokens:,}",
             _quantizations(name, plans), _delta(r.prompt_delta), _delta(r.completion_delta)]
            for name, r in p.providers.items()]
    lines += ["## Providers", "", *_table(
        ["provider", "rows", "share", "answer tokens", "quantization",
         "prompt-token delta (mean, range, exact)", "answer-token delta"], rows), "",
        "A delta is the provider's own token count (`usage`) minus kimipipe's for the same "
        "text (kp-tokenize): 0 where the provider tokenizes as the target does.",
        f"Routing: {_counts(p.routing, n)} (unverifiable: the provider's name also covers "
        "an endpoint the routing excluded).", ""]
    lines += ["## Sampling, as sent", ""]
    for s in p.sampling:
        sent = "not recorded (older records)" if s.sent is None else \
            f"`{json.dumps(s.sent, sort_keys=True)}`"
        lines.append(f"- {s.rows:,} rows ({_pct(s.rows, n)}): {sent}")
    policies = sorted({json.dumps(s.sent.get("reasoning"), sort_keys=True)
                       for s in p.sampling if isinstance(s.sent, dict)})
    lines += ["", "A parameter not listed was not sent: the provider used its own default.", "",
              "## Reasoning", "",
              f"Asked for: {', '.join(f'`{x}`' for x in policies) or 'not recorded'}. "
              f"Rows whose answer had reasoning: {p.reasoning.get('with', 0):,} "
              f"({_pct(p.reasoning.get('with', 0), n)}); where it came from: "
              f"{_counts(p.reasoning_sources, n)}."]
    if p.history_reasoning:
        lines.append("Earlier turns' reasoning in a conversation's history: "
                     f"{_counts(p.history_reasoning, sum(p.history_reasoning.values()))}.")
    lines += ["", "## Turns", "",
              f"Rows by their conversation's turns (1: a single prompt): {_counts(p.turns, n)}.",
              f"Rows by turn number: {_counts(p.turn, n)}.", "",
              "## Output IDs", "",
              f"Where each row's answer IDs came from: {_counts(p.output_ids_source, n)} "
              "(reencoded: kimipipe's tokenizer on the answer's text; sampled: the IDs the "
              "server sampled).", "",
              f"Finish reasons: {_counts(p.finish_reasons, n)}.", ""]
    return lines


def _sources_section(m: ShardManifest, p: ShardProvenance | None, inputs: CardInputs) -> list[str]:
    lines = ["## Prompt sources", ""]
    if inputs.sources:
        lines.append("Source files: " + ", ".join(f"`{s}`" for s in inputs.sources) + ".")
    if p is not None:
        lines.append(f"Rows by dataset: {_counts(p.datasets, p.rows)}.")
    lines.append("Token records read: " + ", ".join(f"`{i}`" for i in m.inputs) + ".")
    return lines + ["", "Each source keeps its own licence and terms.", ""]


def _summaries_section(summaries: list[tuple[str, _Summary]]) -> list[str]:
    if not summaries:
        return []
    lines = ["## The answers' runs (kp-infer)", ""]
    for path, s in summaries:
        failed = sum(s.failed.values())
        spend = "-" if s.spend_total is None else f"${s.spend_total:.4f}"
        lines.append(f"- `{path}`: answers written {s.done:,} (prompts in the input "
                     f"{s.input_records:,}, already answered {s.skipped:,}); failed {failed:,}"
                     + (f" ({', '.join(f'{k} {v:,}' for k, v in s.failed.items())})" if failed else "")
                     + f"; spend recorded in the output {spend}; stop: {s.stop_reason or 'none'}; "
                     f"exit {s.exit_code}.")
        if s.providers:
            lines.append("  Providers, share of the answers: " + ", ".join(
                f"{k} {v:.2%}" for k, v in s.providers.items()) + ".")
        refused = {k: sum(v.values()) for k, v in s.refused.items() if v}
        if refused:
            lines.append("  Answers paid for and not kept: " + ", ".join(
                f"{k.replace('_', ' ')} {v:,}" for k, v in refused.items()) + ".")
    return lines + [""]
