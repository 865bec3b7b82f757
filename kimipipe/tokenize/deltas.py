"""The provider's own token counts as a second opinion on every row (docs/kp-tokenize.md).

Each response record carries `usage.prompt_tokens` and `usage.completion_tokens`, counted
by the serving provider with the model's native tokenizer. kp-tokenize writes, per token
record (`records.TokenIds`):

    prompt_tokens_delta      usage.prompt_tokens - len(input_ids)
    completion_tokens_delta  usage.completion_tokens - (len(output_ids) - the structural
                             tokens kp-tokenize inserted: </think>, <|im_end|>)

A count of 0 (or none) is "not reported" (kp-infer writes 0 when a provider sent no usage):
no delta then. `DeltaTable` gathers them per provider, for kp-tokenize's summary and
`kp-infer report` (the same rows, the same text):

    {"provider": str, "rows": int,
     "prompt": {"zero": n, "typical": int, "min": int, "p50": int, "max": int},
     "completion": {... the same ...}}

`typical` is the most common value (ties: the one nearest 0; the median when no value
repeats). `warnings()` names a
provider whose prompt delta is non-zero on most of its rows, with its typical offset, and
says so once when every provider shares the same non-zero offset: then it is kimipipe's
rendering (the chat template) that differs, not the providers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

_SHOWN = 600  # characters of the rendered prompt a warning shows


def token_deltas(prompt_tokens: int | None, completion_tokens: int | None, n_in: int,
                 n_out_text: int) -> tuple[int | None, int | None]:
    """(prompt delta, completion delta); None for a count the provider did not report."""
    return ((prompt_tokens - n_in) if prompt_tokens else None,
            (completion_tokens - n_out_text) if completion_tokens else None)


def _summary(values: Counter) -> dict | None:
    n = sum(values.values())
    if not n:
        return None
    ordered = sorted(values.elements())
    typical = min(values, key=lambda v: (-values[v], abs(v), v))
    if values[typical] == 1 and n > 1:  # no value repeats: the median says more
        typical = ordered[(n - 1) // 2]
    return {"zero": values[0], "typical": typical, "min": ordered[0],
            "p50": ordered[(n - 1) // 2], "max": ordered[-1]}


@dataclass
class _Counts:
    rows: int = 0
    prompt: Counter = field(default_factory=Counter)
    completion: Counter = field(default_factory=Counter)
    example: dict = field(default_factory=dict)  # prompt delta -> (id, rendered prompt)


class DeltaTable:
    def __init__(self) -> None:
        self._by: dict[str, _Counts] = {}

    def add(self, provider: str | None, prompt_delta: int | None, completion_delta: int | None,
            example: tuple[str, str] | None = None) -> None:
        if prompt_delta is None and completion_delta is None:
            return
        c = self._by.setdefault(provider or "unknown", _Counts())
        c.rows += 1
        if prompt_delta is not None:
            c.prompt[prompt_delta] += 1
            if example and prompt_delta not in c.example:
                c.example[prompt_delta] = example
        if completion_delta is not None:
            c.completion[completion_delta] += 1

    def __bool__(self) -> bool:
        return bool(self._by)

    def rows(self) -> list[dict]:
        return [{"provider": name, "rows": c.rows, "prompt": _summary(c.prompt),
                 "completion": _summary(c.completion)}
                for name, c in sorted(self._by.items(), key=lambda kv: (-kv[1].rows, kv[0]))]

    def text(self, indent: str = "  ") -> str:
        """The rows for a terminal: per provider, each delta's zeros, typical value and range."""
        def cell(s: dict | None, rows: int) -> str:
            if s is None:
                return "not reported"
            return (f"{s['zero']:,}/{rows:,} zero, typical {s['typical']:+d}, "
                    f"p50 {s['p50']:+d}, range {s['min']:+d}..{s['max']:+d}")
        rows = self.rows()
        width = max(len(r["provider"]) for r in rows)
        lines = [f"{indent}provider token counts minus kimipipe's (prompt_tokens_delta | "
                 "completion_tokens_delta; completion: +2 expected on a finished thinking turn, "
                 "+1 on one cut or without thinking: the provider counts the </think> and "
                 "end-of-turn tokens it sampled, kimipipe's count leaves them out):"]
        for r in rows:
            lines.append(f"{indent}  {r['provider']:<{width}}  prompt {cell(r['prompt'], r['rows'])}"
                         f" | completion {cell(r['completion'], r['rows'])}")
        return "\n".join(lines)

    def warnings(self) -> list[str]:
        """A provider that renders prompts otherwise; or, all alike, the template that differs."""
        off = {}
        for name, c in self._by.items():
            n = sum(c.prompt.values())
            if n and n - c.prompt[0] > n / 2:
                off[name] = _summary(c.prompt)["typical"]
        reported = [name for name, c in self._by.items() if c.prompt]
        if not off:
            return []
        shared = set(off.values())
        if len(off) >= 2 and len(off) == len(reported) and len(shared) == 1:
            [offset] = shared
            name = min(off)
            example = self._by[name].example.get(offset)
            if example:
                rid, prompt = example
                shown = prompt if len(prompt) <= _SHOWN else prompt[:_SHOWN] + "..."
                compare = f"compare its rendering of {rid} with the model's own: {shown!r}"
            else:
                compare = "kp-tokenize's summary shows a rendered prompt to compare"
            return [f"every provider's prompt_tokens is {offset:+d} from kimipipe's count (all "
                    f"{len(off)}: {', '.join(sorted(off))}): the chat template kp-tokenize renders "
                    f"with is the one that differs (a default system prompt, another template "
                    f"version?); {compare}"]
        alone = " (the only provider: it, or the chat template, differs)" if len(reported) == 1 else ""
        return [f"provider {name}: prompt_tokens differs from kimipipe's count on "
                f"{sum(self._by[name].prompt.values()) - self._by[name].prompt[0]:,} of "
                f"{sum(self._by[name].prompt.values()):,} rows (typical offset {offset:+d}): it "
                "renders prompts otherwise (a default system prompt, another template version, "
                f"or injected text){alone}"
                for name, offset in sorted(off.items())]
