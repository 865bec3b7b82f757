"""The build's plots with one series or bar per dataset: money, tokens, rows, multi-turn,
kp-tokenize's rejects (see canvas.py for what every plot function returns)."""

from __future__ import annotations

from collections import Counter

from matplotlib.ticker import FuncFormatter

from ..kinds import RetryCause
from ..terminal import money
from .canvas import (
    BUILD_COLOR,
    FINISH_COLORS,
    Canvas,
    Colors,
    Note,
    Plot,
    barh_height,
    count_text,
    human_tokens,
    legend_above,
    log_edges,
)
from .facts import MAX_LENGTHS, DatasetFacts, conversations

MAX_STEPS = 2000  # points of a spend curve


def spend_over_time(datasets: list[DatasetFacts], timed: bool, colors: Colors, max_cost: float | None,
                    total_cost: float | None, key: str = "spend") -> Plot | Note:
    title = "Spend over time"
    if not any(d.paid for d in datasets):
        return Note(key, title, "Nothing was paid for yet.")
    canvas = Canvas(key, height=3.2)
    ax = canvas.axes[0][0]
    start = min((p.at for d in datasets for p in d.paid if p.at is not None), default=0.0)
    end = max((p.at for d in datasets for p in d.paid if p.at is not None), default=0.0)
    span = end - start
    unit, scale = ("h", 3600.0) if span > 3 * 3600 else ("min", 60.0) if span > 180 else ("s", 1.0)

    def series(paid):
        ordered = sorted(paid, key=(lambda p: (p.at, p.order)) if timed else (lambda p: p.order))
        xs, ys, total = [0.0], [0.0], 0.0
        # At most ~MAX_STEPS points drawn: a million answers would be a million-point
        # path (tens of MB of SVG) for a curve no screen shows finer.
        every = max(1, len(ordered) // MAX_STEPS)
        for i, p in enumerate(ordered, 1):
            total += p.cost
            if i % every == 0 or i == len(ordered):
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
    legend_above(ax, ncols=1 if len(ax.get_legend_handles_labels()[1]) <= 4 else 2)
    caption = ("Each step is an answer written (its cost, with the answers refused before it)."
               + ("" if timed else " Some records have no `finished_at` (written before it "
                  "existed): the spend is drawn in file order, not in time."))
    return canvas.plot(title, caption)



RETRY_BINS = 40  # time bins of the retries plot


def retries_over_time(datasets: list[DatasetFacts], timed: bool, key: str = "retries") -> Plot | Note:
    """The attempts sent again, per time bin: rate limits (429) apart from the other causes."""
    title = "Retries and rate limits over time"
    retried = [r for d in datasets for r in d.retried]
    if not retried:
        return Note(key, title, "No attempt was sent again: no record has `retried` (a rate limit "
                                "or another retryable failure, by cause; records written before "
                                "the field have none).")
    totals: Counter = Counter()
    for r in retried:
        totals[r.cause] += r.n
    rate_limited = totals.get(RetryCause.RATE_LIMITED, 0)
    timed = timed and all(r.at is not None for r in retried)
    canvas = Canvas(key, height=2.8)
    ax = canvas.axes[0][0]
    times = [p.at for d in datasets for p in d.paid if p.at is not None] + [r.at for r in retried if r.at]
    start = min(times, default=0.0)
    span = max(times, default=0.0) - start
    unit, scale = ("h", 3600.0) if span > 3 * 3600 else ("min", 60.0) if span > 180 else ("s", 1.0)
    if timed:
        width = max(span, 1.0) / RETRY_BINS
        bins = [0] * (RETRY_BINS + 1)
        limits = [0] * (RETRY_BINS + 1)
        for r in retried:
            b = min(RETRY_BINS, int((r.at - start) / width))
            (limits if r.cause == RetryCause.RATE_LIMITED else bins)[b] += r.n
        xs = [(b + 0.5) * width / scale for b in range(RETRY_BINS + 1)]
        w = 0.9 * width / scale
        ax.set_xlabel(f"{unit} since the first answer (each retry at its record's time)")
    else:  # no times: one bar per record, in file order
        bins = [0 if r.cause == RetryCause.RATE_LIMITED else r.n for r in retried]
        limits = [r.n if r.cause == RetryCause.RATE_LIMITED else 0 for r in retried]
        xs, w = list(range(1, len(retried) + 1)), 0.9
        ax.set_xlabel("records with retries, in file order")
    if any(limits):
        canvas.data(ax.bar(xs, limits, width=w, color="#c44e52", label=f"rate limited (429) {rate_limited:,}"))
    if any(bins):
        canvas.data(ax.bar(xs, bins, width=w, bottom=limits, color="#8172b3",
                           label=f"other causes {sum(totals.values()) - rate_limited:,}"))
    ax.set_ylabel("attempts sent again")
    ax.set_xlim(left=0)
    legend_above(ax, ncols=2)
    caption = ("By cause: " + ", ".join(f"{c} {n:,}" for c, n in totals.most_common())
               + ". Counted on the answer or failure they led to, at its time; refused answers "
               "are the refusals' plots, not here.")
    return canvas.plot(title, caption)


def completion_vs_budget(datasets: list[DatasetFacts], budgets: dict[str, int | None], colors: Colors,
                         key: str = "tokens-budget") -> Plot | Note:
    title = "Completion tokens against TOKEN_BUDGET"
    datasets = [d for d in datasets if d.answers or budgets.get(d.name)]
    if not datasets:
        return Note(key, title, "No answer yet.")
    canvas = Canvas(key, height=barh_height(len(datasets)))
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
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: count_text(v)))
    ax.set_xlabel("completion tokens (usage, as billed; reasoning included)")
    ax.margins(x=0.35)
    caption = ("The red tick is the dataset's TOKEN_BUDGET." if any(budgets.get(n) for n in names)
               else "No dataset has a TOKEN_BUDGET: each answers all of its prompts.")
    return canvas.plot(title, caption)



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
    canvas = Canvas(key, height=barh_height(len(groups)))
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
    legend_above(ax, ncols=3)
    return canvas.plot(title, "`length`: cut by --max-tokens (kept, and marked for kp-tokenize).")



def row_lengths(datasets: list[DatasetFacts], colors: Colors, key: str = "row-lengths") -> Plot | Note:
    title = "Training rows: prompt, output and total length"
    datasets = [d for d in datasets if len(d.training_rows())]
    if not datasets:
        return Note(key, title, "No shard set or token record was given.")
    columns = {"prompt": lambda r: list(r.prompt), "output": lambda r: list(r.output),
               "total": lambda r: r.totals()}
    every = [v for d in datasets for column in columns.values() for v in column(d.training_rows())]
    edges = log_edges(every, top=MAX_LENGTHS[-1])
    canvas = Canvas(key, cols=3, height=2.8, sharex=True, sharey=True)
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
    canvas = Canvas(key, height=2.8)
    ax = canvas.axes[0][0]
    width = 0.8 / len(datasets)
    for i, d in enumerate(datasets):
        shares = d.training_rows().kept_whole()
        xs = [j + (i - (len(datasets) - 1) / 2) * width for j in range(len(MAX_LENGTHS))]
        values = [100 * shares[m] for m in MAX_LENGTHS]
        bars = canvas.data(ax.bar(xs, values, width=width * 0.95, color=colors.dataset(d.name),
                                  label=f"{d.name} ({len(d.training_rows()):,} rows)"))
        ax.bar_label(bars, labels=[f"{v:.1f}%" for v in values], padding=2, fontsize=7)
    ax.set_xticks(range(len(MAX_LENGTHS)), [human_tokens(m) for m in MAX_LENGTHS])
    ax.set_xlabel("max_length (prompt + output tokens)")
    ax.set_ylabel("% of rows that fit whole")
    ax.set_ylim(0, 112)
    legend_above(ax, ncols=3)
    return canvas.plot(title, "A row longer than max_length is cut (or dropped) by the trainer.")



def turns_per_conversation(datasets: list[DatasetFacts], colors: Colors, key: str = "turns") -> Plot | Note:
    title = "Turns per conversation"
    found = [(d, c) for d in datasets if (c := conversations(d)) is not None]
    if not found:
        return Note(key, title, "No record has a `conversation` field: every prompt is one turn.")
    canvas = Canvas(key, height=2.8)
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
    legend_above(ax, ncols=3)
    return canvas.plot(title)



def conversations_cut(datasets: list[DatasetFacts], colors: Colors, key: str = "cut") -> Plot | Note:
    title = "Conversations: complete, cut, unfinished"
    found = [(d.name, c) for d in datasets if (c := conversations(d)) is not None]
    if not found:
        return Note(key, title, "No record has a `conversation` field: every prompt is one turn.")
    canvas = Canvas(key, height=barh_height(len(found)))
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
    legend_above(ax, ncols=2)
    return canvas.plot(title, "A conversation is complete when every one of its `turns` was answered.")



def rejects(datasets: list[DatasetFacts], colors: Colors, key: str = "rejects") -> Plot | Note:
    title = "kp-tokenize's rejects, by reason"
    found = [d for d in datasets if d.rejects]
    if not found:
        return Note(key, title, "No reject recorded: every record given to kp-tokenize was verified.")
    reasons = Counter()
    for d in found:
        reasons.update(d.rejects)
    labels = [r for r, _ in reasons.most_common()][::-1]
    canvas = Canvas(key, height=barh_height(len(labels)))
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
        legend_above(ax, ncols=4)
    return canvas.plot(title, "Rejected records are left out of the shards (WORK/<D>.rejects.jsonl).")
