"""`kp-infer report FILE...`: the providers compared, from responses and failures files.

Any number of files, each kp-infer's output (response records; token records from
kp-tokenize read the same), a `--failures` file, or both mixed; `-` is stdin, zstd is read
by content. Each line is read and sorted by its fields as every reader of a build's
files does (kimipipe/recorded/lines.py): a record with `response` is an answer (its
`usage`, `finish_reason`, `provider`, `latency_s`, and the answers `refused` before it); a
line with `kind` and `status` is a failure (its `refused` answers; an older failure line
without them counts once when its kind is a refusal). A last line without its newline
(a run still writing) is skipped with a note; any other bad line is `PATH:LINE`, exit 2.

The report (text on stdout; `--json` for this object, stable for scripts:
`contracts.InferReport`):

    {"files": [path, ...],
     "answers": int,                      records with a response
     "failures": {kind: n},               failure lines by kind
     "refused": int,                      answers paid for and not kept (all providers)
     "spend": float,                      USD: kept answers + refused answers
     "prompt_tokens": {"total", "cached", "cached_share"}
                                          of the answers: cached = served from the
                                          provider's prompt cache (usage.cached_tokens)
     "turns": {"conversations": n, "by_number": {"1": n, ...}}
                                          a conversation's turns, by turn number
     "sampling": [{"sampling": {...} | null, "answers": n}, ...]
                                          each distinct `sampling` of the answers
                                          (null: records written before it existed)
     "by_provider": [row, ...],           recorded/providers_table.py (the same rows as the
                                          run's summary)
     "histogram": {"upto": [int, ...],    completion tokens per answer, shared bins
                   "by_provider": {provider: [answers per bin, ...]}},
     "token_deltas": [row, ...],          token records only: the provider's counts minus
                                          kimipipe's, per provider (tokenize/deltas.py; the
                                          same rows and warnings as kp-tokenize's summary)
     "logprobs": {provider: {"answers", "with_tokens"}}
                                          answers that carried the tokens the model sampled
                                          (token logprobs: `sampled_tokens`); {} when none did
     "sampled_ids": [row, ...],           token records only: per provider, the sampled IDs
                                          (token logprobs, a server's) against the
                                          re-encoding (tokenize/stats.py SampledTable: rows,
                                          used, partial, differ, differ_share, tokens,
                                          tokens_differing, tokens_differing_share, net,
                                          parts, fallbacks, patterns; the same as
                                          kp-tokenize's summary),
     "retries": {cause: n},               attempts sent again before the answers and
                                          failures, by cause ("429": rate limits; their
                                          `retried`)
     "apis": {host: n},                   answers and failures by the host that answered
                                          (`api`; "not recorded" for older records)
     "standin_answers": int,              answers of the kimipipe stand-in (generation ids
                                          `gen-standin-`): an offline build, not the model's
     "identity": [row, ...]}              answers a run checked against the target's counts
                                          (kp-infer --tokenizer: their `identity`, the
                                          refusals of kind `identity`, the quarantine in each
                                          responses file's OUTPUT.identity.json beside it):
                                          recorded/identity_table.py's rows, as the summary's
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from ..contracts import (
    InferReport,
    ReportHistogram,
    ReportPromptTokens,
    ReportSampling,
    ReportTurns,
    SummaryLogprobs,
)
from ..errors import InputError
from ..kinds import RefusalKind
from ..recorded.api import is_standin
from ..recorded.identity_table import IdentityTable, identity_text
from ..recorded.lines import read_lines
from ..recorded.providers_table import ProviderTable, table_text
from ..records import Usage
from ..tokenize.deltas import DeltaTable
from ..tokenize.stats import SampledTable


@dataclass
class FileReport:
    """The report (`result`, what --json prints) and the tables the text is drawn from."""

    result: InferReport
    table: ProviderTable  # the histogram
    deltas: DeltaTable  # token records: the provider's counts minus kimipipe's
    sampled: SampledTable  # token records: the sampled IDs against the re-encoding


def read_report(paths: list[str], say: Callable[[str], None]) -> FileReport:
    """The report over PATHS (see the module docstring)."""
    table = ProviderTable()
    deltas = DeltaTable()
    sampled = SampledTable()
    logprobs: dict[str, list[int]] = {}  # provider -> [answers, with sampled tokens]
    identity = IdentityTable()
    answers = refused = 0
    spend = 0.0
    failures: Counter = Counter()
    sampling: dict[str, list] = {}
    prompt_tokens = cached = 0
    turns: Counter = Counter()
    conversations: set[str] = set()
    retries: Counter = Counter()
    apis: Counter = Counter()
    standin = 0
    for path in paths:
        for lineno, line in read_lines(path, say):
            retries.update(line.retried or {})
            apis[line.api or "not recorded"] += 1
            standin += line.is_response and is_standin(line.generation_id)
            if line.is_response:
                usage = line.usage or Usage()
                answers += 1
                table.answer(line.provider, usage.completion_tokens, usage.reasoning_tokens,
                             line.finish_reason, usage.cost, line.latency_s)
                prompt_tokens += usage.prompt_tokens
                cached += usage.cached_tokens
                if line.turn is not None:
                    turns[line.turn] += 1
                    conversations.add(line.conversation or "")
                deltas.add(line.provider, line.prompt_tokens_delta, line.completion_tokens_delta)
                sampled.add_record(line.provider, line.output_ids_source, line.sampled_parts,
                                   line.resegmented, line.sampled_fallback)
                seen = logprobs.setdefault(line.provider or "unknown", [0, 0])
                seen[0] += 1
                seen[1] += line.carried_tokens
                identity.kept(line.provider, line.identity, usage)
                key = json.dumps(line.sampling, sort_keys=True)
                sampling.setdefault(key, [line.sampling, 0])[1] += 1
            elif line.is_failure:
                failures[line.kind] += 1
            else:
                raise InputError("neither a response record nor a failure line", path, lineno)
            for r in line.refusals():
                table.refusal(r.provider, r.kind, r.cost)
                refused += 1
                if r.kind == RefusalKind.IDENTITY:
                    identity.checked(r.provider, r.offset, None, refused=True)
            spend += line.paid  # what the line cost, as every spend reader counts it
        identity.quarantined_beside(path)  # (the providers its run quarantined)
    edges, counts = table.histogram_bins()
    result = InferReport(
        files=list(paths),
        answers=answers,
        failures=dict(failures.most_common()),
        refused=refused,
        spend=round(spend, 10),
        prompt_tokens=ReportPromptTokens(
            total=prompt_tokens, cached=cached,
            cached_share=round(cached / prompt_tokens, 4) if prompt_tokens else 0.0),
        turns=ReportTurns(conversations=len(conversations),
                          by_number={str(k): n for k, n in sorted(turns.items())}),
        sampling=[ReportSampling(sampling=s, answers=n)
                  for s, n in sorted(sampling.values(), key=lambda item: -item[1])],
        by_provider=table.rows(),
        histogram=ReportHistogram(upto=edges, by_provider=counts),
        token_deltas=deltas.rows(),
        logprobs={p: SummaryLogprobs(answers=n, with_tokens=k) for p, (n, k) in sorted(logprobs.items())
                  if any(k for _, k in logprobs.values())},
        sampled_ids=sampled.rows(),
        identity=identity.rows(),
        retries=dict(retries.most_common()),
        apis=dict(apis.most_common()),
        standin_answers=standin,
    )
    return FileReport(result, table, deltas, sampled)


def format_report(report: FileReport) -> str:
    """The report for a terminal: totals, the sampling seen, the table, the histogram."""
    result = report.result
    failures = result.failures
    lines = [f"kp-infer report: {len(result.files)} file(s), {result.answers:,} answers, "
             f"{result.refused:,} refused, {sum(failures.values()):,} failures"
             + (f" ({', '.join(f'{k}: {v}' for k, v in failures.items())})" if failures else "")
             + f"; ${result.spend:.6f} paid"]
    if result.apis:
        lines.append("  answered by: " + ", ".join(f"{k} ({v:,} records)" for k, v in result.apis.items())
                     + (f"; OFFLINE: {result.standin_answers:,} answers are the kimipipe stand-in's "
                        "(filler, not the model's: train on none)" if result.standin_answers else ""))
    if result.retries:
        lines.append(f"  retries: {sum(result.retries.values()):,} attempts sent again ("
                     + ", ".join(f"{k}: {v:,}" for k, v in result.retries.items()) + ")")
    tokens = result.prompt_tokens
    if tokens.cached:
        lines.append(f"  prompt tokens: {tokens.total:,}, of which {tokens.cached:,} "
                     f"({tokens.cached_share:.1%}) served from the prompt cache")
    if result.turns.by_number:
        lines.append(f"  conversations: {result.turns.conversations:,}; turns by number: "
                     + ", ".join(f"#{k} {n:,}" for k, n in result.turns.by_number.items()))
    for entry in result.sampling:
        shown = (", ".join(f"{k} {json.dumps(v)}" for k, v in entry.sampling.items())
                 if entry.sampling else "not recorded (older records)")
        lines.append(f"  sampling: {shown}: {entry.answers:,} answers")
    lines.append("")
    lines.append("by provider (refused r/n/t/i: routing violation, no reasoning, think marker, "
                 "identity):")
    lines.append(table_text(result.by_provider, indent="  "))
    lines.append("")
    lines.append(report.table.histogram())
    if result.identity:
        lines += ["", "identity (answers checked against the target's counts, kp-infer "
                  "--tokenizer: offset = usage.prompt_tokens - kimipipe's count):",
                  identity_text(result.identity, indent="  ")]
    if report.deltas:
        lines += ["", report.deltas.text(indent=""),
                  *(f"warning: {w}" for w in report.deltas.warnings())]
    if result.logprobs:
        lines += ["", "answers carrying the tokens the model sampled (token logprobs): " + ", ".join(
            f"{p} {c.with_tokens:,}/{c.answers:,}" for p, c in result.logprobs.items())]
    if report.sampled:
        lines += ["", *report.sampled.lines(""),
                  *(f"warning: {w}" for w in report.sampled.warnings())]
    return "\n".join(lines)


def report_json(report: FileReport) -> str:
    return json.dumps(msgspec.to_builtins(report.result), indent=2)
