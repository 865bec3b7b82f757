"""The providers side by side: share, money, reasoning, latency, speed, lengths, refusals,
token-count deltas, sampled IDs against re-encoding (see canvas.py for what every plot
function returns)."""

from __future__ import annotations

import math
from collections import Counter

from matplotlib.patches import Patch

from ..recorded.providers_table import REFUSAL_KINDS
from ..terminal import money
from .canvas import (
    BUILD_COLOR,
    KIND_NAMES,
    MAX_PROVIDER_PANELS,
    REFUSAL_COLORS,
    Canvas,
    Colors,
    Note,
    Plot,
    barh_height,
    legend_above,
    log_edges,
)
from .facts import DatasetFacts

MAX_FLIER_ROWS = 20_000  # token records up to which each row beyond the whiskers is drawn


def _provider_bars(rows: list[dict], colors: Colors, key: str, title: str, field: str,
                   empty: str, label: str, xlabel: str) -> Plot | Note:
    """One horizontal bar per provider of ROWS' FIELD (rows without it left out), each
    bar labelled with LABEL (a format string); EMPTY is said when no row has it."""
    rows = [r for r in rows if r[field] is not None]
    if not rows:
        return Note(key, title, empty)
    canvas = Canvas(key, height=barh_height(len(rows)))
    ax = canvas.axes[0][0]
    names = [r["provider"] for r in rows][::-1]
    values = [r[field] for r in rows][::-1]
    bars = canvas.data(ax.barh(names, values, color=[colors.provider(n) for n in names]))
    ax.bar_label(bars, labels=[label.format(v) for v in values], padding=3, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.margins(x=0.15)
    return canvas.plot(title)


def usd_per_million(rows: list[dict], colors: Colors, key: str = "usd-per-m") -> Plot | Note:
    return _provider_bars(rows, colors, key, "$ per million output tokens, by provider",
                          "usd_per_m_output", "No answer with completion tokens.", "${:.2f}",
                          "USD per 1M completion tokens (kept answers, prompt cost included)")



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
    canvas = Canvas(key, height=barh_height(len(providers)))
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
    legend_above(ax, ncols=3)
    return canvas.plot(title, f"In all: {fmt(sum(left))}.")



def reasoning_share(rows: list[dict], d: DatasetFacts, colors: Colors, key: str = "reasoning") -> Plot | Note:
    title = "Reasoning share of completion tokens, by provider"
    rows = [r for r in rows if r["reasoning_share"] is not None]
    if not rows:
        return Note(key, title, "No answer with completion tokens.")
    canvas = Canvas(key, height=barh_height(len(rows)))
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
    legend_above(ax)
    return canvas.plot(title, "A provider that bills no reasoning tokens (reasoning inline) shows 0%.")



def answer_share(rows: list[dict], colors: Colors, key: str = "share") -> Plot | Note:
    title = "Answer share, by provider"
    rows = [r for r in rows if r["answers"]]
    if not rows:
        return Note(key, title, "No answer yet.")
    canvas = Canvas(key, height=barh_height(len(rows)))
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
    canvas = Canvas(key, height=barh_height(len(rows)) + 0.3)
    ax = canvas.axes[0][0]
    names = [r["provider"] for r in rows][::-1]
    ys = list(range(len(names)))
    p50 = [r["latency_s"]["p50"] for r in rows][::-1]
    p95 = [r["latency_s"]["p95"] for r in rows][::-1]
    c = [colors.provider(n) for n in names]
    b1 = canvas.data(ax.barh([y + 0.2 for y in ys], p50, height=0.4, color=c))
    b2 = canvas.data(ax.barh([y - 0.2 for y in ys], p95, height=0.4, color=c, alpha=0.45))
    ax.bar_label(b1, labels=[f"{v:.2f}s" for v in p50], padding=3, fontsize=7)
    ax.bar_label(b2, labels=[f"{v:.2f}s" for v in p95], padding=3, fontsize=7)
    ax.set_yticks(ys, names)
    ax.set_xlabel("seconds from request sent to the answer's last byte")
    ax.margins(x=0.15)
    # the keys in grey: each bar has its provider's colour
    legend_above(ax, ncols=2, handles=[Patch(color="#555555", label="p50"),
                                       Patch(color="#555555", alpha=0.45, label="p95")])
    return canvas.plot(title, "Solid: p50; light: p95 (nearest rank).")



def tokens_per_second(rows: list[dict], colors: Colors, key: str = "tokens-per-s") -> Plot | Note:
    return _provider_bars(rows, colors, key, "Tokens per second, by provider", "tokens_per_s",
                          "No answer has a latency (records written before `latency_s`).",
                          "{:,.0f}", "completion tokens / second of latency (whole answers)")



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
    edges = log_edges([a.completion for a in d.answers])
    canvas = Canvas(key, rows=len(shown), height=0.7 + 0.75 * len(shown), sharex=True, sharey=True)
    for ax, name in zip(canvas.axes[:, 0], shown, strict=True):
        values = by[name]
        weights = [100 / len(values)] * len(values)
        _, _, patches = ax.hist(values, bins=edges, weights=weights, color=colors.provider(name))
        canvas.data(list(patches))
        mid = sorted(values)[max(0, math.ceil(len(values) / 2) - 1)]
        ax.axvline(mid, color=BUILD_COLOR, lw=1, ls="--")
        ax.text(1.0, 0.9, f"{name}: {len(values):,} answers, p50 {mid:,}", transform=ax.transAxes,
                ha="right", va="top", fontsize=8,
                bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none", "pad": 1})
        ax.set_xscale("log", base=2)
        ax.set_ylabel("%")
    canvas.axes[-1][0].set_xlabel("completion tokens per answer (log scale, 4 bins an octave)")
    return canvas.plot(title, "Each panel: % of that provider's answers per bin; dashed: its p50.")



def token_deltas(d: DatasetFacts, colors: Colors, key: str = "deltas") -> Plot | Note:
    title = "Provider's token counts minus kimipipe's, by provider"
    if not d.deltas:
        return Note(key, title, "The token records carry no `prompt_tokens_delta` / "
                                "`completion_tokens_delta` (a kp-tokenize that does not write "
                                "them yet), or no token record was given.")
    panels = [(name, values) for name, values in (("prompt", d.deltas.prompt),
                                                  ("completion", d.deltas.completion)) if values]
    providers = sorted({p for _, values in panels for p in values})
    canvas = Canvas(key, cols=len(panels), height=barh_height(len(providers)) + 0.4, sharey=True)
    for ax, (name, values) in zip(canvas.axes[0], panels, strict=True):
        names = [p for p in providers if p in values]
        # each row outside the whiskers is a marker: drawn while they stay few
        few = sum(len(values[p]) for p in names) <= MAX_FLIER_ROWS
        box = ax.boxplot([values[p] for p in names], vert=False, tick_labels=names, patch_artist=True,
                         whis=(1, 99), showfliers=few, flierprops={"markersize": 3})
        for patch, p in zip(box["boxes"], names, strict=True):
            patch.set_facecolor(colors.provider(p))
            patch.set_alpha(0.7)
        canvas.data(box["boxes"], box["medians"], box["whiskers"])
        # a provider whose every row has one delta (0, when its counts are kimipipe's: what
        # the stand-in counting with the build's tokenizer gives) is a box of no width: a
        # marker shows where it stands
        for row, p in enumerate(names, start=1):
            if len(set(values[p])) == 1:
                canvas.data(ax.plot([values[p][0]], [row], marker="D", markersize=6, ls="none",
                                    color=colors.provider(p))[0])
        ax.axvline(0, color=BUILD_COLOR, lw=0.8)
        ax.set_title(f"{name}_tokens_delta")
        ax.set_xlabel("tokens (usage minus len(ids))")
    return canvas.plot(title, "Boxes: quartiles and median; whiskers: 1st to 99th percentile; a "
                              "diamond: every row at one value. Zero: the "
                              "provider counts the tokens kp-tokenize wrote; a steady offset for one "
                              "provider: it renders the prompt differently. The completion's +2 "
                              "(+1 on a turn cut short or without thinking) is expected: the "
                              "provider counts the </think> and end-of-turn tokens it sampled, "
                              "which kimipipe's side leaves out.")


def sampled_ids(d: DatasetFacts, colors: Colors, key: str = "sampled-ids") -> Plot | Note:
    """Per provider: the share of rows, and of sampled tokens, where the IDs the model
    sampled (token logprobs, a server's IDs) differ from the canonical re-encoding."""
    title = "Sampled IDs against the re-encoding of the text, by provider"
    rows = [r for r in d.sampled.rows() if r["used"]]
    if not rows:
        return Note(key, title, "No token record was made from sampled IDs (token logprobs "
                                "or a server's): every row's IDs are the re-encoding, or no "
                                "token record was given.")
    canvas = Canvas(key, cols=2, height=barh_height(len(rows)) + 0.4, sharey=True)
    names = [r["provider"] for r in rows][::-1]
    for ax, (field, what) in zip(canvas.axes[0], (("differ_share", "rows that differ"),
                                                  ("tokens_differing_share", "sampled tokens that differ")),
                                 strict=True):
        values = [100.0 * r[field] for r in rows][::-1]
        bars = canvas.data(ax.barh(names, values, color=[colors.provider(n) for n in names]))
        ax.bar_label(bars, labels=[f"{v:.1f}%" if field == "differ_share" else f"{v:.2f}%"
                                   for v in values], padding=3, fontsize=8)
        ax.set_xlabel(f"% of {what}")
        ax.margins(x=0.25)
    top = d.sampled.top_patterns(3)
    caption = ("A row differs where re-encoding its text cuts it otherwise than the model "
               "sampled it (e.g. one token for two); only its sampled parts are compared.")
    if top:
        from ..tokenize.stats import pattern_text
        caption += " Most frequent: " + "; ".join(f"{pattern_text(p)} ({n:,})" for p, n in top) + "."
    return canvas.plot(title, caption)
