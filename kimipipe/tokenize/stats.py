"""The run summary kp-tokenize prints on stderr."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from ..records import Resegmented
from ..terminal import counted
from .deltas import DeltaTable

TOP_PATTERNS = 5


@dataclass
class _Sampled:
    rows: int = 0          # rows that came with sampled IDs (a server's) or tokens (logprobs)
    used: int = 0          # ... whose IDs proved out and are (some of) the output_ids
    partial: int = 0       # ... for some text parts only (the rest re-encoded)
    differs: int = 0       # ... where re-encoding the text gives other IDs
    tokens: int = 0        # sampled tokens compared
    sampled: int = 0       # sampled tokens in the regions that differ
    reencoded: int = 0     # re-encoded tokens in them
    net: Counter = field(default_factory=Counter)   # per differing row: sampled - re-encoded
    parts: Counter = field(default_factory=Counter)  # the sampled parts of partial rows
    patterns: Counter = field(default_factory=Counter)  # (sampled pieces, re-encoded pieces)
    fallbacks: Counter = field(default_factory=Counter)  # why not used, by reason
    problem: str = ""      # the first failure's words
    prompt_checked: int = 0
    prompt_mismatch: int = 0
    server: bool = False   # a server's sampled IDs (else token logprobs)


def pattern_text(pattern) -> str:
    sampled, reencoded = pattern
    return "+".join(json.dumps(p, ensure_ascii=False) for p in sampled) + " for " + \
        "+".join(json.dumps(p, ensure_ascii=False) for p in reencoded)


class SampledTable:
    """Per provider (or server): how often the canonical re-encoding differs from the IDs
    the model sampled, by how many tokens, and where (the byte strings it cuts otherwise):
    the price of re-tokenizing, measured (docs/kp-tokenize.md). Filled from kp-tokenize's
    outcomes (`add_check`) or from token records (`add_record`: `kp-infer report`), the
    same rows either way."""

    def __init__(self) -> None:
        self.by: dict[str, _Sampled] = {}

    def _row(self, provider: str | None) -> _Sampled:
        return self.by.setdefault(provider or "unknown", _Sampled())

    def _add(self, c: _Sampled, used: bool, complete: bool, parts, reseg: Resegmented | None,
             fallback: str | None, problem: str = "") -> None:
        c.rows += 1
        if not used:
            if fallback:
                c.fallbacks[fallback] += 1
            c.problem = c.problem or problem or fallback or ""
            return
        c.used += 1
        if not complete:
            c.partial += 1
            c.parts["+".join(parts) or "none"] += 1
        if reseg is None:
            return
        c.tokens += reseg.tokens
        if reseg.regions:
            c.differs += 1
            c.sampled += reseg.sampled
            c.reencoded += reseg.reencoded
            c.net[reseg.sampled - reseg.reencoded] += 1
            for sampled, reencoded in reseg.patterns:
                c.patterns[(tuple(sampled), tuple(reencoded))] += 1

    def add_check(self, provider: str | None, check) -> None:
        """One row's SampledCheck (engine.py)."""
        c = self._row(provider)
        c.server = c.server or check.source == "server"
        if check.prompt_mismatch is not None:
            c.prompt_checked += 1
            c.prompt_mismatch += check.prompt_mismatch
        detail = f"{check.problem}: {check.detail}" if check.detail else check.problem
        self._add(c, check.used, check.complete, check.parts, check.reseg, check.fallback, detail)

    def add_record(self, provider: str | None, source: str | None, parts, reseg,
                   fallback: str | None) -> None:
        """One token record's fields: output_ids_source, sampled_parts, resegmented,
        sampled_fallback (a record with none of them is not counted)."""
        if source is None and fallback is None:
            return
        self._add(self._row(provider), source is not None, source == "sampled", parts or (),
                  reseg, fallback)

    def merge(self, other: SampledTable) -> None:
        """OTHER's rows added to these (the build report's whole build)."""
        for name, o in other.by.items():
            c = self._row(name)
            for f in ("rows", "used", "partial", "differs", "tokens", "sampled", "reencoded",
                      "prompt_checked", "prompt_mismatch"):
                setattr(c, f, getattr(c, f) + getattr(o, f))
            for f in ("net", "parts", "patterns", "fallbacks"):
                getattr(c, f).update(getattr(o, f))
            c.problem = c.problem or o.problem
            c.server = c.server or o.server

    def __bool__(self) -> bool:
        return bool(self.by)

    def rows(self) -> list[dict]:
        """The table as JSON (`kp-infer report --json`'s `sampled_ids`)."""
        out = []
        for name, c in sorted(self.by.items()):
            out.append({
                "provider": name, "rows": c.rows, "used": c.used, "partial": c.partial,
                "differ": c.differs, "differ_share": round(c.differs / c.used, 4) if c.used else 0.0,
                "tokens": c.tokens, "tokens_differing": c.sampled,
                "tokens_differing_share": round(c.sampled / c.tokens, 6) if c.tokens else 0.0,
                "reencoded_tokens_differing": c.reencoded,
                "net": {f"{k:+d}": n for k, n in sorted(c.net.items())},
                "parts": dict(c.parts), "fallbacks": dict(c.fallbacks.most_common()),
                "patterns": [{"sampled": list(s), "reencoded": list(r), "rows": n}
                             for (s, r), n in c.patterns.most_common(TOP_PATTERNS)]})
        return out

    def top_patterns(self, n: int = TOP_PATTERNS) -> list[tuple[tuple, int]]:
        """The patterns of every provider together, most frequent first."""
        total: Counter = Counter()
        for c in self.by.values():
            total.update(c.patterns)
        return total.most_common(n)

    def lines(self, indent: str) -> list[str]:
        out = [f"{indent}sampled IDs against re-encoding, per provider (a server's sampled IDs, "
               "or the tokens of token logprobs; rows whose re-encoding differs | sampled "
               "tokens in the differing regions | sampled minus re-encoded):"]
        width = max(len(name) for name in self.by)
        for name, c in sorted(self.by.items()):
            share = 100.0 * c.differs / c.used if c.used else 0.0
            tokens = 100.0 * c.sampled / c.tokens if c.tokens else 0.0
            net = ", ".join(f"{k:+d}: {n:,}" for k, n in sorted(c.net.items()))
            line = (f"{indent}  {name:<{width}}  {c.differs:,}/{c.used:,} differ ({share:.1f}%) | "
                    f"{c.sampled:,} of {c.tokens:,} tokens ({tokens:.2f}%) | "
                    f"{c.sampled - c.reencoded:+,} tokens" + (f" (rows {net})" if net else ""))
            if c.partial:
                line += f"; {c.partial:,} partial (" + ", ".join(
                    f"{k} sampled: {n:,}" for k, n in c.parts.most_common()) + ")"
            if c.rows - c.used:
                line += f"; {c.rows - c.used:,} unusable (re-encoded)"
            out.append(line)
        top = self.top_patterns()
        if top:
            out.append(f"{indent}  most frequent differences (sampled for re-encoded: rows): "
                       + ", ".join(f"{pattern_text(p)}: {n:,}" for p, n in top))
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
            unusable = c.rows - c.used
            if not unusable:
                continue
            if c.server:
                warnings.append(f"server {name}: {unusable:,} rows' sampled IDs failed the "
                                f"check and were re-encoded instead (first: {c.problem})")
            else:
                warnings.append(
                    f"provider {name}: {unusable:,} rows' sampled tokens did not prove out and "
                    "were re-encoded instead (" + ", ".join(
                        f"{k}: {n:,}" for k, n in c.fallbacks.most_common())
                    + (f"; first: {c.problem}" if c.problem else "") + ")")
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
    not_current: int = 0  # answers to prompts --prompts does not hold (tokenize/current.py)
    pruned: int = 0  # output rows of an earlier input removed (--prune)
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
                self.sampled.add_check(o.provider, o.sampled)
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
        if self.not_current:
            parts.append(f"left out {counted(self.not_current, 'answer')} to prompts --prompts "
                         "does not hold (an earlier source's: kept in the input, paid for)")
        if self.pruned:
            parts.append(f"removed {counted(self.pruned, 'row')} of an earlier input (--prune)")
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
