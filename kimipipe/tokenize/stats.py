"""The run summary kp-tokenize prints on stderr."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..cli import counted
from .deltas import DeltaTable


@dataclass
class _Sampled:
    rows: int = 0          # rows that came with the server's sampled IDs
    used: int = 0          # ... whose IDs passed the check and are the output_ids
    differs: int = 0       # ... where re-encoding the text gives other IDs
    span: int = 0          # tokens in the differing spans, summed
    net: int = 0           # len(sampled) - len(re-encoded), summed
    prompt_checked: int = 0
    prompt_mismatch: int = 0
    unusable: int = 0      # IDs that failed the check (the re-encoding was used)
    problem: str = ""      # the first such failure


class SampledTable:
    """Per server: how often the canonical re-encoding differs from what was sampled, and
    by how many tokens (the price of re-tokenizing, measured: docs/servers.md)."""

    def __init__(self) -> None:
        self.by: dict[str, _Sampled] = {}

    def add(self, server: str | None, check) -> None:
        c = self.by.setdefault(server or "unknown", _Sampled())
        c.rows += 1
        if check.prompt_mismatch is not None:
            c.prompt_checked += 1
            c.prompt_mismatch += check.prompt_mismatch
        if not check.used:
            c.unusable += 1
            c.problem = c.problem or check.problem
            return
        c.used += 1
        c.differs += check.differs
        c.span += check.span
        c.net += check.net

    def __bool__(self) -> bool:
        return bool(self.by)

    def lines(self, indent: str) -> list[str]:
        out = [f"{indent}sampled IDs against re-encoding, per server (rows whose re-encoding "
               "differs | tokens in the differing spans | sampled minus re-encoded):"]
        width = max(len(name) for name in self.by)
        for name, c in sorted(self.by.items()):
            share = 100.0 * c.differs / c.used if c.used else 0.0
            out.append(f"{indent}  {name:<{width}}  {c.differs:,}/{c.used:,} differ "
                       f"({share:.1f}%) | {c.span:,} tokens | {c.net:+,} tokens"
                       + (f"; {c.unusable:,} unusable (re-encoded)" if c.unusable else ""))
        return out

    def warnings(self) -> list[str]:
        warnings = []
        for name, c in sorted(self.by.items()):
            if c.prompt_mismatch:
                warnings.append(
                    f"server {name}: its prompt_token_ids differ from kimipipe's input_ids on "
                    f"{c.prompt_mismatch:,} of {c.prompt_checked:,} rows: it renders the chat "
                    "template otherwise (a default system prompt, another template version); "
                    "--strict rejects those rows")
            if c.unusable:
                warnings.append(f"server {name}: {c.unusable:,} rows' sampled IDs failed the "
                                f"check and were re-encoded instead (first: {c.problem})")
        return warnings


@dataclass
class Summary:
    written: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    truncated: int = 0
    no_reasoning: int = 0
    flagged_long: int = 0
    rejected: int = 0
    dropped_truncated: int = 0
    dropped_long: int = 0
    skipped_done: int = 0
    longest: int = 0
    longest_id: str = ""
    deltas: DeltaTable = field(default_factory=DeltaTable)
    sampled: SampledTable = field(default_factory=SampledTable)

    def add(self, o) -> None:
        if o.kind == "ok":
            self.written += 1
            self.tokens_in += o.n_in
            self.tokens_out += o.n_out
            self.truncated += o.truncated
            self.no_reasoning += o.no_reasoning
            self.flagged_long += o.long
            if o.n_in + o.n_out > self.longest:
                self.longest, self.longest_id = o.n_in + o.n_out, o.id
            self.deltas.add(o.provider, o.prompt_delta, o.completion_delta, o.example)
            if o.sampled is not None:
                self.sampled.add(o.provider, o.sampled)
        elif o.kind == "reject":
            self.rejected += 1
        elif o.reason == "truncated":
            self.dropped_truncated += 1
        else:
            self.dropped_long += 1

    def report(self, output: str, rejects: str | None) -> str:
        where = "" if output == "-" else f" to {output}"
        parts = [f"kp-tokenize: wrote {counted(self.written, 'record')}{where}: "
                 f"{counted(self.tokens_in, 'token')} in, {self.tokens_out:,} out; "
                 f"{counted(self.truncated, 'truncated turn')}"]
        if self.written:
            parts.append(f"longest row {counted(self.longest, 'token')} ({self.longest_id})")
        if self.no_reasoning:
            parts.append(f"{self.no_reasoning:,} with no reasoning")
        if self.flagged_long:
            parts.append(f"{self.flagged_long:,} flagged over --max-length")
        parts.append(f"rejected {self.rejected:,}" + (f" (see {rejects})" if self.rejected and rejects else ""))
        dropped = []
        if self.dropped_truncated:
            dropped.append(f"{self.dropped_truncated:,} truncated")
        if self.dropped_long:
            dropped.append(f"{self.dropped_long:,} over --max-length")
        if dropped:
            parts.append("dropped " + ", ".join(dropped))
        if self.skipped_done:
            parts.append(f"skipped {self.skipped_done:,} already in the output")
        return "; ".join(parts)

    def deltas_report(self) -> list[str]:
        """The provider counts against kimipipe's, per provider, and what stands out; the
        servers' sampled IDs against the re-encoding."""
        lines = []
        if self.deltas:
            lines += [self.deltas.text(indent="kp-tokenize: "),
                      *(f"kp-tokenize: warning: {w}" for w in self.deltas.warnings())]
        if self.sampled:
            lines += [*self.sampled.lines("kp-tokenize: "),
                      *(f"kp-tokenize: warning: {w}" for w in self.sampled.warnings())]
        return lines

    def rejects_note(self, output: str, rejects: str | None) -> str:
        """What exit 4 means here, and what a rerun does."""
        where = "the output" if output == "-" else output
        listed = (f"listed with their reasons in {rejects}" if rejects else
                  f"the first {min(self.rejected, 3)} shown above; --rejects FILE lists them all")
        return (f"kp-tokenize: {counted(self.rejected, 'record')} rejected ({listed}); they are "
                f"not in {where}, and rerunning the same command tries them again"
                + (f" (rewriting {rejects})" if rejects else ""))
