"""The run summary kp-tokenize prints on stderr."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..cli import counted
from .deltas import DeltaTable


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
        """The provider counts against kimipipe's, per provider, and what stands out."""
        if not self.deltas:
            return []
        return [self.deltas.text(indent="kp-tokenize: "),
                *(f"kp-tokenize: warning: {w}" for w in self.deltas.warnings())]

    def rejects_note(self, output: str, rejects: str | None) -> str:
        """What exit 4 means here, and what a rerun does."""
        where = "the output" if output == "-" else output
        listed = (f"listed with their reasons in {rejects}" if rejects else
                  f"the first {min(self.rejected, 3)} shown above; --rejects FILE lists them all")
        return (f"kp-tokenize: {counted(self.rejected, 'record')} rejected ({listed}); they are "
                f"not in {where}, and rerunning the same command tries them again"
                + (f" (rewriting {rejects})" if rejects else ""))
