"""The build report's plots: matplotlib (Agg, no screen) drawn to SVG text, one per Plot.

Only `kp-infer report --html` and `make report` import this module (matplotlib is the
`report` extra: `pip install 'kimipipe[report]'`); every other command runs without it.

Each function takes the facts (facts.py) and returns a `Plot` (its SVG, inlined by
page.py) or a `Note` saying why there is nothing to draw: no plot is ever an empty axis.
Every artist that draws data gets an SVG id `kp-data-<plot>-<n>` (matplotlib writes an
artist's gid as its group's id), so a test can check, in a browser, that each plot has
drawn marks; and every figure is written with its own hash salt, so the ids matplotlib
makes for clip paths and markers never repeat across the plots of one page.
"""

from __future__ import annotations

import io
import math
import re
from collections import Counter
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # no display, no GUI toolkit: SVG text only

from matplotlib.figure import Figure  # noqa: E402  (after the backend is chosen)

from ..infer.providers_table import REFUSAL_KINDS  # noqa: E402
from .facts import MAX_LENGTHS, BuildFacts, DatasetFacts  # noqa: E402

STYLE = {
    "svg.fonttype": "none",  # text stays text: smaller files, the browser's own font
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.fontsize": 8,
    "legend.frameon": False,
}
WIDTH = 6.4  # inches (72 SVG units each); the page scales every plot to its column
PROVIDER_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                   "#7f7f7f", "#bcbd22", "#17becf"]
DATASET_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
                  "#8c8c8c", "#ccb974", "#64b5cd"]
BUILD_COLOR = "#222222"
FINISH_COLORS = {"stop": "#55a868", "length": "#dd8452", "other": "#c44e52"}
REFUSAL_COLORS = {"routing_violation": "#c44e52", "no_reasoning": "#8172b3", "think_marker": "#ccb974"}
KIND_NAMES = {"routing_violation": "routing violation", "no_reasoning": "no reasoning",
              "think_marker": "think marker"}
MAX_PROVIDER_PANELS = 8


@dataclass
class Plot:
    key: str
    title: str
    svg: str
    caption: str = ""


@dataclass
class Note:
    key: str
    title: str
    text: str


class Colors:
    """One colour per provider and per dataset, the same in every plot of the page."""

    def __init__(self, facts: BuildFacts):
        ranked = Counter()
        for d in facts.datasets.values():
            ranked.update(a.provider for a in d.answers)
            ranked.update(r.provider for r in d.refused)
            ranked.update({p: len(v) for p, v in d.deltas.prompt.items()})
        self._providers = {p: PROVIDER_COLORS[i % len(PROVIDER_COLORS)]
                           for i, (p, _) in enumerate(sorted(ranked.items(), key=lambda kv: (-kv[1], kv[0])))}
        self._datasets = {name: DATASET_COLORS[i % len(DATASET_COLORS)]
                          for i, name in enumerate(facts.datasets)}

    def provider(self, name: str) -> str:
        return self._providers.get(name, "#7f7f7f")

    def dataset(self, name: str) -> str:
        return BUILD_COLOR if name == "all" else self._datasets.get(name, "#7f7f7f")


class _Canvas:
    """One figure being drawn: tags its data artists, then writes itself as inline SVG."""

    def __init__(self, key: str, rows: int = 1, cols: int = 1, height: float = 3.0, **kw):
        self.key = key
        self.n = 0
        with matplotlib.rc_context(STYLE):
            self.fig = Figure(figsize=(WIDTH, height), layout="constrained")
            self.axes = self.fig.subplots(rows, cols, squeeze=False, **kw)

    def data(self, *artists):
        """Mark ARTISTS (a bar container, lines, a collection...) as drawn data."""
        for artist in artists:
            items = getattr(artist, "patches", None)  # a BarContainer's bars
            if items is None:
                items = artist if isinstance(artist, (list, tuple)) else [artist]
            for item in items:
                self.n += 1
                item.set_gid(f"kp-data-{self.key}-{self.n}")
        return artists[0] if len(artists) == 1 else artists

    def svg(self) -> str:
        buf = io.StringIO()
        with matplotlib.rc_context({**STYLE, "svg.hashsalt": self.key}):
            self.fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None,
                                                          "Format": None, "Type": None})
        text = buf.getvalue()
        text = text[text.index("<svg"):]  # no XML prolog nor DOCTYPE inside HTML
        # sized by the page (CSS), drawn to its viewBox
        return re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1', text, count=1)

    def plot(self, title: str, caption: str = "") -> Plot:
        return Plot(self.key, title, self.svg(), caption)


def money(x: float) -> str:
    return f"${x:,.2f}" if abs(x) >= 1 else f"${x:.4f}"


def count_text(n: float) -> str:
    for size, suffix in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if abs(n) >= size:
            return f"{n / size:.3g}{suffix}"
    return f"{n:.0f}"


def _human_tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _legend_above(ax, ncols: int = 1) -> None:
    """The legend over the axes, out of the bars' way."""
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncols=ncols, borderaxespad=0.2)


def _barh_height(n: int) -> float:
    return max(1.8, 0.9 + 0.32 * n)


# --- money --------------------------------------------------------------------------------


def spend_over_time(datasets: list[DatasetFacts], timed: bool, colors: Colors, max_cost: float | None,
                    total_cost: float | None, key: str = "spend") -> Plot | Note:
    title = "Spend over time"
    if not any(d.paid for d in datasets):
        return Note(key, title, "Nothing was paid for yet.")
    canvas = _Canvas(key, height=3.2)
    ax = canvas.axes[0][0]
    start = min((p.at for d in datasets for p in d.paid if p.at is not None), default=0.0)
    end = max((p.at for d in datasets for p in d.paid if p.at is not None), default=0.0)
    span = end - start
    unit, scale = ("h", 3600.0) if span > 3 * 3600 else ("min", 60.0) if span > 180 else ("s", 1.0)

    def series(paid):
        ordered = sorted(paid, key=(lambda p: (p.at, p.order)) if timed else (lambda p: p.order))
        xs, ys, total = [0.0], [0.0], 0.0
        for i, p in enumerate(ordered, 1):
            total += p.cost
            xs.append((p.at - start) / scale if timed else i)
            ys.append(total)
        return xs, ys

    top = 0.0
    for d in datasets:
        if d.paid:
            xs, ys = series(d.paid)
            canvas.data(ax.step(xs, ys, where="post", color=colors.dataset(d.name), lw=1.6,
                                label=f"{d.name} {money(ys[-1])}"))
            top = max(top, ys[-1])
    if len(datasets) > 1 and timed:
        xs, ys = series([p for d in datasets for p in d.paid])
        canvas.data(ax.step(xs, ys, where="post", color=BUILD_COLOR, lw=1.2, ls="--",
                            label=f"whole build {money(ys[-1])}"))
        top = max(top, ys[-1])
    # A cap far above the spend would flatten the curve to its axis: then the axis stops
    # above the spend and the legend says how far up the cap is.
    spent = top
    for cap, label, style in ((max_cost, "MAX_COST (each dataset)", ":"),
                              (total_cost, "TOTAL_COST (whole build)", "-.")):
        if cap is None:
            continue
        if cap <= 4 * spent:
            ax.axhline(cap, color="#c44e52", ls=style, lw=1.2, label=f"{label} {money(cap)}")
            top = max(top, cap)
        else:
            ax.plot([], [], color="#c44e52", ls=style, lw=1.2,
                    label=f"{label} {money(cap)}: above the plot ({100 * spent / cap:.1f}% spent)")
    ax.set_ylim(0, top * 1.08 or 1)
    ax.set_xlim(left=0)
    ax.set_ylabel("USD spent (kept + refused answers)")
    ax.set_xlabel(f"{unit} since the first answer" if timed else "payments, in file order")
    ax.legend(loc="lower right")
    caption = ("Each step is an answer written (its cost, with the answers refused before it)."
               + ("" if timed else " Some records have no `finished_at` (written before it "
                  "existed): the spend is drawn in file order, not in time."))
    return canvas.plot(title, caption)


def usd_per_million(rows: list[dict], colors: Colors, key: str = "usd-per-m") -> Plot | Note:
    title = "$ per million output tokens, by provider"
    rows = [r for r in rows if r["usd_per_m_output"] is not None]
    if not rows:
        return Note(key, title, "No answer with completion tokens.")
    canvas = _Canvas(key, height=_barh_height(len(rows)))
    ax = canvas.axes[0][0]
    names = [r["provider"] for r in rows][::-1]
    values = [r["usd_per_m_output"] for r in rows][::-1]
    bars = canvas.data(ax.barh(names, values, color=[colors.provider(n) for n in names]))
    ax.bar_label(bars, labels=[f"${v:.2f}" for v in values], padding=3, fontsize=8)
    ax.set_xlabel("USD per 1M completion tokens (kept answers, prompt cost included)")
    ax.margins(x=0.15)
    return canvas.plot(title)


def refused_cost(d: DatasetFacts, colors: Colors, key: str = "refused-cost") -> Plot | Note:
    title = "Refused answers' cost (paid, not kept)"
    if not d.refused:
        return Note(key, title, "No answer was refused: nothing was paid for and not kept.")
    return _refusals(d, key, title, lambda r: r.cost, "USD paid for refused answers", money)


def refusals_by_kind(d: DatasetFacts, colors: Colors, key: str = "refusals") -> Plot | Note:
    title = "Refusals by kind, by provider"
    if not d.refused:
        return Note(key, title, "No answer was refused (routing violation, no reasoning, think marker).")
    return _refusals(d, key, title, lambda r: 1, "answers refused", lambda v: f"{v:.0f}")


def _refusals(d: DatasetFacts, key: str, title: str, value, label: str, fmt) -> Plot:
    by: dict[str, Counter] = {}
    for r in d.refused:
        by.setdefault(r.provider, Counter())[r.kind] += value(r)
    providers = sorted(by, key=lambda p: sum(by[p].values()))
    canvas = _Canvas(key, height=_barh_height(len(providers)))
    ax = canvas.axes[0][0]
    left = [0.0] * len(providers)
    kinds = [k for k in REFUSAL_KINDS if any(by[p][k] for p in providers)]
    kinds += sorted({k for p in providers for k in by[p]} - set(REFUSAL_KINDS))
    for kind in kinds:
        widths = [by[p][kind] for p in providers]
        canvas.data(ax.barh(providers, widths, left=left, color=REFUSAL_COLORS.get(kind, "#7f7f7f"),
                            label=KIND_NAMES.get(kind, kind)))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for i, total in enumerate(left):
        ax.text(total, i, " " + fmt(total), va="center", fontsize=8)
    ax.set_xlabel(label)
    ax.margins(x=0.18)
    _legend_above(ax, ncols=3)
    return canvas.plot(title, f"In all: {fmt(sum(left))}.")


# --- tokens -------------------------------------------------------------------------------


def completion_vs_budget(datasets: list[DatasetFacts], budgets: dict[str, int | None], colors: Colors,
                         key: str = "tokens-budget") -> Plot | Note:
    title = "Completion tokens against TOKEN_BUDGET"
    datasets = [d for d in datasets if d.answers or budgets.get(d.name)]
    if not datasets:
        return Note(key, title, "No answer yet.")
    canvas = _Canvas(key, height=_barh_height(len(datasets)))
    ax = canvas.axes[0][0]
    names = [d.name for d in datasets][::-1]
    done = [sum(a.completion for a in d.answers) for d in datasets][::-1]
    bars = canvas.data(ax.barh(names, done, color=[colors.dataset(n) for n in names], height=0.6))
    labels = []
    for i, (name, n) in enumerate(zip(names, done, strict=True)):
        budget = budgets.get(name)
        if budget:
            ax.plot([budget, budget], [i - 0.4, i + 0.4], color="#c44e52", lw=2)
            labels.append(f"{count_text(n)} of {count_text(budget)} ({100 * n / budget:.0f}%)")
        else:
            labels.append(f"{count_text(n)} (no TOKEN_BUDGET)")
    ax.bar_label(bars, labels=labels, padding=3, fontsize=8)
    ax.set_xlabel("completion tokens (usage, as billed; reasoning included)")
    ax.margins(x=0.35)
    caption = ("The red tick is the dataset's TOKEN_BUDGET." if any(budgets.get(n) for n in names)
               else "No dataset has a TOKEN_BUDGET: each answers all of its prompts.")
    return canvas.plot(title, caption)


def reasoning_share(rows: list[dict], d: DatasetFacts, colors: Colors, key: str = "reasoning") -> Plot | Note:
    title = "Reasoning share of completion tokens, by provider"
    rows = [r for r in rows if r["reasoning_share"] is not None]
    if not rows:
        return Note(key, title, "No answer with completion tokens.")
    canvas = _Canvas(key, height=_barh_height(len(rows)))
    ax = canvas.axes[0][0]
    names = [r["provider"] for r in rows][::-1]
    values = [100 * r["reasoning_share"] for r in rows][::-1]
    bars = canvas.data(ax.barh(names, values, color=[colors.provider(n) for n in names]))
    ax.bar_label(bars, labels=[f"{v:.1f}%" for v in values], padding=3, fontsize=8)
    completion = sum(a.completion for a in d.answers)
    overall = 100 * sum(a.reasoning for a in d.answers) / completion if completion else 0.0
    ax.axvline(overall, color=BUILD_COLOR, ls="--", lw=1, label=f"all answers {overall:.1f}%")
    ax.set_xlim(0, 105)
    ax.set_xlabel("% of completion tokens billed as reasoning")
    _legend_above(ax)
    return canvas.plot(title, "A provider that bills no reasoning tokens (reasoning inline) shows 0%.")


def _finish_shares(answers) -> dict[str, float]:
    counts = Counter(a.finish if a.finish in ("stop", "length") else "other" for a in answers)
    n = sum(counts.values())
    return {k: 100 * counts[k] / n for k in FINISH_COLORS} if n else {}


def finish_reasons(groups: list[tuple[str, list]], key: str = "finish") -> Plot | Note:
    """GROUPS: (label, answers) rows, drawn as 100% bars of stop / length / other."""
    title = "Finish reasons (stop / length / other)"
    groups = [(label, answers) for label, answers in groups if answers]
    if not groups:
        return Note(key, title, "No answer yet.")
    canvas = _Canvas(key, height=_barh_height(len(groups)))
    ax = canvas.axes[0][0]
    labels = [label for label, _ in groups][::-1]
    shares = [_finish_shares(answers) for _, answers in groups][::-1]
    left = [0.0] * len(labels)
    for reason, color in FINISH_COLORS.items():
        widths = [s[reason] for s in shares]
        if any(widths):
            canvas.data(ax.barh(labels, widths, left=left, color=color, label=reason))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for i, s in enumerate(shares):
        ax.text(101, i, f"length {s['length']:.1f}%", va="center", fontsize=8)
    ax.set_xlim(0, 125)
    ax.set_xlabel("% of answers")
    _legend_above(ax, ncols=3)
    return canvas.plot(title, "`length`: cut by --max-tokens (kept, and marked for kp-tokenize).")


# --- providers ------------------------------------------------------------------------------


def answer_share(rows: list[dict], colors: Colors, key: str = "share") -> Plot | Note:
    title = "Answer share, by provider"
    rows = [r for r in rows if r["answers"]]
    if not rows:
        return Note(key, title, "No answer yet.")
    canvas = _Canvas(key, height=_barh_height(len(rows)))
    ax = canvas.axes[0][0]
    names = [r["provider"] for r in rows][::-1]
    values = [100 * r["share"] for r in rows][::-1]
    bars = canvas.data(ax.barh(names, values, color=[colors.provider(n) for n in names]))
    ax.bar_label(bars, labels=[f"{v:.1f}% ({r['answers']:,})" for v, r in zip(values, rows[::-1], strict=True)],
                 padding=3, fontsize=8)
    ax.set_xlabel("% of kept answers")
    ax.margins(x=0.25)
    return canvas.plot(title)


def latency(rows: list[dict], colors: Colors, key: str = "latency") -> Plot | Note:
    title = "Latency p50 / p95, by provider"
    rows = [r for r in rows if r["latency_s"]["p50"] is not None]
    if not rows:
        return Note(key, title, "No answer has a latency (records written before `latency_s`).")
    canvas = _Canvas(key, height=_barh_height(len(rows)) + 0.3)
    ax = canvas.axes[0][0]
    names = [r["provider"] for r in rows][::-1]
    ys = list(range(len(names)))
    p50 = [r["latency_s"]["p50"] for r in rows][::-1]
    p95 = [r["latency_s"]["p95"] for r in rows][::-1]
    c = [colors.provider(n) for n in names]
    b1 = canvas.data(ax.barh([y + 0.2 for y in ys], p50, height=0.4, color=c, label="p50"))
    b2 = canvas.data(ax.barh([y - 0.2 for y in ys], p95, height=0.4, color=c, alpha=0.45, label="p95"))
    ax.bar_label(b1, labels=[f"{v:.2f}s" for v in p50], padding=3, fontsize=7)
    ax.bar_label(b2, labels=[f"{v:.2f}s" for v in p95], padding=3, fontsize=7)
    ax.set_yticks(ys, names)
    ax.set_xlabel("seconds from request sent to the answer's last byte")
    ax.margins(x=0.15)
    _legend_above(ax, ncols=2)
    return canvas.plot(title, "Solid: p50; light: p95 (nearest rank).")


def tokens_per_second(rows: list[dict], colors: Colors, key: str = "tokens-per-s") -> Plot | Note:
    title = "Tokens per second, by provider"
    rows = [r for r in rows if r["tokens_per_s"] is not None]
    if not rows:
        return Note(key, title, "No answer has a latency (records written before `latency_s`).")
    canvas = _Canvas(key, height=_barh_height(len(rows)))
    ax = canvas.axes[0][0]
    names = [r["provider"] for r in rows][::-1]
    values = [r["tokens_per_s"] for r in rows][::-1]
    bars = canvas.data(ax.barh(names, values, color=[colors.provider(n) for n in names]))
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], padding=3, fontsize=8)
    ax.set_xlabel("completion tokens / second of latency (whole answers)")
    ax.margins(x=0.15)
    return canvas.plot(title)


def _log_edges(values: list[int], top: int = 0, per_octave: int = 4) -> list[float]:
    """Bin edges a quarter of an octave apart, from the smallest value to the largest (or
    TOP): lengths spread over orders of magnitude, and a shape reads on a log axis."""
    low = max(1, min(values))
    high = max(2, max(values), top)
    k0 = math.floor(math.log2(low) * per_octave)
    k1 = math.ceil(math.log2(high) * per_octave) + 1
    return [2.0 ** (k / per_octave) for k in range(k0, k1 + 1)]


def completion_lengths(d: DatasetFacts, rows: list[dict], colors: Colors, key: str = "lengths") -> Plot | Note:
    title = "Completion length, by provider (shared axes)"
    providers = [r["provider"] for r in rows if r["answers"]]
    if not providers:
        return Note(key, title, "No answer yet.")
    shown = providers[:MAX_PROVIDER_PANELS]
    by = {p: [] for p in providers}
    for a in d.answers:
        by[a.provider].append(a.completion)
    if len(providers) > len(shown):
        rest = [t for p in providers[len(shown):] for t in by[p]]
        by["other providers"] = rest
        shown.append("other providers")
    edges = _log_edges([a.completion for a in d.answers])
    canvas = _Canvas(key, rows=len(shown), height=0.7 + 0.75 * len(shown), sharex=True, sharey=True)
    for ax, name in zip(canvas.axes[:, 0], shown, strict=True):
        values = by[name]
        weights = [100 / len(values)] * len(values)
        _, _, patches = ax.hist(values, bins=edges, weights=weights, color=colors.provider(name))
        canvas.data(list(patches))
        mid = sorted(values)[max(0, math.ceil(len(values) / 2) - 1)]
        ax.axvline(mid, color=BUILD_COLOR, lw=1, ls="--")
        ax.text(1.0, 0.9, f"{name}: {len(values):,} answers, p50 {mid:,}", transform=ax.transAxes,
                ha="right", va="top", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_ylabel("%")
    canvas.axes[-1][0].set_xlabel("completion tokens per answer (log scale, 4 bins an octave)")
    return canvas.plot(title, "Each panel: % of that provider's answers per bin; dashed: its p50.")


# --- rows (the shards) ---------------------------------------------------------------------


def row_lengths(datasets: list[DatasetFacts], colors: Colors, key: str = "row-lengths") -> Plot | Note:
    title = "Training rows: prompt, output and total length"
    datasets = [d for d in datasets if len(d.training_rows())]
    if not datasets:
        return Note(key, title, "No shard set or token record was given.")
    columns = {"prompt": lambda r: list(r.prompt), "output": lambda r: list(r.output),
               "total": lambda r: r.totals()}
    every = [v for d in datasets for column in columns.values() for v in column(d.training_rows())]
    edges = _log_edges(every, top=MAX_LENGTHS[-1])
    canvas = _Canvas(key, cols=3, height=2.8, sharex=True, sharey=True)
    for ax, (name, column) in zip(canvas.axes[0], columns.items(), strict=True):
        for d in datasets:
            values = column(d.training_rows())
            weights = [100 / len(values)] * len(values)
            _, _, patches = ax.hist(values, bins=edges, weights=weights, histtype="step", lw=1.6,
                                    color=colors.dataset(d.name), label=d.name)
            canvas.data(list(patches))
        if name == "total":
            for m in MAX_LENGTHS:
                ax.axvline(m, color="#c44e52", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_title(name)
        ax.set_xlabel("tokens")
    canvas.axes[0][0].set_ylabel("% of rows")
    if len(datasets) > 1:
        canvas.axes[0][0].legend(loc="upper left")
    sources = sorted({d.training_rows().source for d in datasets})
    return canvas.plot(title, f"From the {' and '.join(sources)}; log scale. Red dotted: "
                              "max_length 4k, 8k, 16k, 32k.")


def kept_whole(datasets: list[DatasetFacts], colors: Colors, key: str = "kept-whole") -> Plot | Note:
    title = "Rows kept whole at a trainer's max_length"
    datasets = [d for d in datasets if len(d.training_rows())]
    if not datasets:
        return Note(key, title, "No shard set or token record was given.")
    canvas = _Canvas(key, height=2.8)
    ax = canvas.axes[0][0]
    width = 0.8 / len(datasets)
    for i, d in enumerate(datasets):
        shares = d.training_rows().kept_whole()
        xs = [j + (i - (len(datasets) - 1) / 2) * width for j in range(len(MAX_LENGTHS))]
        values = [100 * shares[m] for m in MAX_LENGTHS]
        bars = canvas.data(ax.bar(xs, values, width=width * 0.95, color=colors.dataset(d.name),
                                  label=f"{d.name} ({len(d.training_rows()):,} rows)"))
        ax.bar_label(bars, labels=[f"{v:.1f}%" for v in values], padding=2, fontsize=7)
    ax.set_xticks(range(len(MAX_LENGTHS)), [_human_tokens(m) for m in MAX_LENGTHS])
    ax.set_xlabel("max_length (prompt + output tokens)")
    ax.set_ylabel("% of rows that fit whole")
    ax.set_ylim(0, 112)
    _legend_above(ax, ncols=3)
    return canvas.plot(title, "A row longer than max_length is cut (or dropped) by the trainer.")


# --- multi-turn ---------------------------------------------------------------------------


@dataclass
class Conversations:
    turns: Counter  # answered turns per conversation -> conversations
    complete: int
    cut: int  # the last kept turn ended by length: its later turns were not sent
    unfinished: int  # fewer turns than `turns` for another reason (a failure, a run going on)


def conversations(d: DatasetFacts) -> Conversations | None:
    by: dict = {}
    for a in d.answers:
        if a.conversation is not None:
            by.setdefault(str(a.conversation), []).append(a)
    if not by:
        return None
    turns: Counter = Counter()
    complete = cut = unfinished = 0
    for answers in by.values():
        answers.sort(key=lambda a: a.turn or 0)
        turns[len(answers)] += 1
        last = answers[-1]
        planned = max((a.turns or 0) for a in answers)
        if len(answers) >= planned:
            complete += 1
        elif last.finish == "length":
            cut += 1
        else:
            unfinished += 1
    return Conversations(turns, complete, cut, unfinished)


def turns_per_conversation(datasets: list[DatasetFacts], colors: Colors, key: str = "turns") -> Plot | Note:
    title = "Turns per conversation"
    found = [(d, c) for d in datasets if (c := conversations(d)) is not None]
    if not found:
        return Note(key, title, "No record has a `conversation` field: every prompt is one turn.")
    canvas = _Canvas(key, height=2.8)
    ax = canvas.axes[0][0]
    top = max(n for _, c in found for n in c.turns)
    width = 0.8 / len(found)
    for i, (d, c) in enumerate(found):
        total = sum(c.turns.values())
        xs = [k + (i - (len(found) - 1) / 2) * width for k in range(1, top + 1)]
        canvas.data(ax.bar(xs, [100 * c.turns[k] / total for k in range(1, top + 1)], width=width * 0.95,
                           color=colors.dataset(d.name), label=f"{d.name} ({total:,} conversations)"))
    ax.set_xticks(range(1, top + 1))
    ax.set_xlabel("turns answered")
    ax.set_ylabel("% of conversations")
    _legend_above(ax, ncols=3)
    return canvas.plot(title)


def conversations_cut(datasets: list[DatasetFacts], colors: Colors, key: str = "cut") -> Plot | Note:
    title = "Conversations: complete, cut, unfinished"
    found = [(d.name, c) for d in datasets if (c := conversations(d)) is not None]
    if not found:
        return Note(key, title, "No record has a `conversation` field: every prompt is one turn.")
    canvas = _Canvas(key, height=_barh_height(len(found)))
    ax = canvas.axes[0][0]
    names = [n for n, _ in found][::-1]
    parts = {"complete": ("#55a868", [c.complete for _, c in found][::-1]),
             "cut (a turn ended by length)": ("#dd8452", [c.cut for _, c in found][::-1]),
             "unfinished (a failure, or still running)": ("#c44e52", [c.unfinished for _, c in found][::-1])}
    left = [0] * len(names)
    for label, (color, values) in parts.items():
        if any(values):
            canvas.data(ax.barh(names, values, left=left, color=color, label=label))
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlabel("conversations")
    ax.margins(x=0.05)
    _legend_above(ax, ncols=2)
    return canvas.plot(title, "A conversation is complete when every one of its `turns` was answered.")


# --- kp-tokenize ----------------------------------------------------------------------------


def rejects(datasets: list[DatasetFacts], colors: Colors, key: str = "rejects") -> Plot | Note:
    title = "kp-tokenize's rejects, by reason"
    found = [d for d in datasets if d.rejects]
    if not found:
        return Note(key, title, "No reject recorded: every record given to kp-tokenize was verified.")
    reasons = Counter()
    for d in found:
        reasons.update(d.rejects)
    labels = [r for r, _ in reasons.most_common()][::-1]
    canvas = _Canvas(key, height=_barh_height(len(labels)))
    ax = canvas.axes[0][0]
    left = [0] * len(labels)
    for d in found:
        values = [d.rejects[r] for r in labels]
        canvas.data(ax.barh(labels, values, left=left, color=colors.dataset(d.name), label=d.name))
        left = [a + b for a, b in zip(left, values, strict=True)]
    for i, total in enumerate(left):
        ax.text(total, i, f" {total:,}", va="center", fontsize=8)
    ax.set_xlabel("records rejected")
    ax.margins(x=0.12)
    if len(found) > 1:
        _legend_above(ax, ncols=4)
    return canvas.plot(title, "Rejected records are left out of the shards (WORK/<D>.rejects.jsonl).")


def token_deltas(d: DatasetFacts, colors: Colors, key: str = "deltas") -> Plot | Note:
    title = "Provider's token counts minus kimipipe's, by provider"
    if not d.deltas:
        return Note(key, title, "The token records carry no `prompt_tokens_delta` / "
                                "`completion_tokens_delta` (a kp-tokenize that does not write "
                                "them yet), or no token record was given.")
    panels = [(name, values) for name, values in (("prompt", d.deltas.prompt),
                                                  ("completion", d.deltas.completion)) if values]
    providers = sorted({p for _, values in panels for p in values})
    canvas = _Canvas(key, cols=len(panels), height=_barh_height(len(providers)) + 0.4, sharey=True)
    for ax, (name, values) in zip(canvas.axes[0], panels, strict=True):
        names = [p for p in providers if p in values]
        box = ax.boxplot([values[p] for p in names], vert=False, tick_labels=names, patch_artist=True,
                         showfliers=True, flierprops={"markersize": 3})
        for patch, p in zip(box["boxes"], names, strict=True):
            patch.set_facecolor(colors.provider(p))
            patch.set_alpha(0.7)
        canvas.data(box["boxes"], box["medians"], box["whiskers"])
        ax.axvline(0, color=BUILD_COLOR, lw=0.8)
        ax.set_title(f"{name}_tokens_delta")
        ax.set_xlabel("tokens (usage minus len(ids))")
    return canvas.plot(title, "Zero: the provider counts the tokens kp-tokenize wrote. A steady offset "
                              "for one provider: it renders the prompt differently.")
