"""The build report as one HTML file: tables, and the plots (plots_build.py,
plots_providers.py) inlined as SVG.

The page needs nothing but itself: no script, no font, no image, no stylesheet from
anywhere, and its Content-Security-Policy (`default-src 'none'`, inline styles only) has
the browser refuse any request it might make. It opens offline, from a file or a mail.

Layout: which API answered (an offline build's stand-in answers in red), the build at a
glance (one row per dataset and one for the whole build: retries, `kp-shard verify`'s
verdict), then the sections the plots answer (money, retries, tokens, providers, the rows,
multi-turn, kp-tokenize),
plotted for the whole build with one series or bar per dataset; then, when the build has
more than one dataset, each dataset's own providers, finish reasons and rows.
"""

from __future__ import annotations

import datetime
import html
import re

from ..kinds import RetryCause
from ..recorded.providers_table import REFUSAL_KINDS
from ..terminal import money
from . import plots_build as build_plots
from . import plots_providers as provider_plots
from .canvas import Colors, Note, Plot, count_text
from .facts import MAX_LENGTHS, BuildFacts, BuildLimits, DatasetFacts

CSP = "default-src 'none'; style-src 'unsafe-inline'"

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222;
       margin: 0 auto; max-width: 1280px; padding: 16px 24px 48px; background: #fafafa; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px;
     border-bottom: 1px solid #ddd; padding-bottom: 4px; } h3 { font-size: 15px; margin: 18px 0 6px; }
.meta { color: #555; font-size: 12px; } .meta code { font-size: 11px; }
table { border-collapse: collapse; font-size: 12.5px; background: #fff; margin: 6px 0 10px; }
th, td { padding: 3px 8px; border-bottom: 1px solid #e4e4e4; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { background: #f0f0f0; font-weight: 600; white-space: normal; vertical-align: bottom; }
tr.all td { font-weight: 600; border-top: 2px solid #bbb; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 14px; }
figure { margin: 0; background: #fff; border: 1px solid #e2e2e2; border-radius: 6px; padding: 8px 10px; }
figure svg { width: 100%; height: auto; display: block; }
figcaption { font-size: 12.5px; color: #444; margin-bottom: 4px; } figcaption b { color: #222; font-size: 13.5px; }
figure.note p { color: #666; font-style: italic; margin: 6px 0; }
.over { color: #b22; font-weight: 600; }
.offline { background: #fde8e8; border: 2px solid #b22; padding: 6px 10px; color: #b22; font-weight: 600; }
details { margin: 10px 0; } summary { cursor: pointer; font-weight: 600; font-size: 15px; }
details.meta summary { font-size: 12px; font-weight: normal; }
.scroll { overflow-x: auto; }
"""


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "x"


def _item(item: Plot | Note) -> str:
    if isinstance(item, Note):
        return (f'<figure class="note" id="note-{_e(item.key)}"><figcaption><b>{_e(item.title)}</b>'
                f"</figcaption><p>{_e(item.text)}</p></figure>")
    caption = f" {_e(item.caption)}" if item.caption else ""
    return (f'<figure class="plot" id="plot-{_e(item.key)}"><figcaption><b>{_e(item.title)}</b>{caption}'
            f"</figcaption>{item.svg}</figure>")


def _grid(items) -> str:
    return '<div class="grid">' + "".join(_item(i) for i in items) + "</div>"


def _table(head: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    out = ['<div class="scroll"><table><tr>' + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
    out.append("</table></div>")
    return "".join(out)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _of(value: float, cap: float | None, fmt) -> str:
    if cap is None:
        return fmt(value)
    over = ' class="over"' if value > cap else ""
    return f"<span{over}>{fmt(value)}</span> of {fmt(cap)} ({100 * value / cap:.0f}%)" if cap else fmt(value)


def _overview(facts: BuildFacts, settings: BuildLimits) -> str:
    head = ["dataset", "answers", "failures", "refused", "spend", "refused cost", "completion tokens",
            "reasoning", "cut by length", "rows", "kept whole at 16k", "retries (429s)", "kp-shard verify",
            "rejects"]
    rows, classes = [], []
    datasets = list(facts.datasets.values())
    for d in datasets + ([facts.merged()] if len(datasets) > 1 else []):
        whole = d.name == "all"
        completion = sum(a.completion for a in d.answers)
        reasoning = sum(a.reasoning for a in d.answers)
        length = sum(a.finish == "length" for a in d.answers)
        training = d.training_rows()
        budget = None if whole else settings.budget(d.name)
        cap = settings.total_cost if whole else settings.max_cost
        failures = sum(d.failures.values())
        rows.append([
            _e("whole build" if whole else d.name), f"{len(d.answers):,}",
            f"{failures:,}" + (f'<br><span class="meta">{_e(", ".join(f"{k} {v}" for k, v in d.failures.most_common()))}'
                               "</span>" if failures else ""),
            f"{len(d.refused):,}", _of(d.spend, cap, money), money(sum(r.cost for r in d.refused)),
            _of(completion, budget, count_text), _pct(reasoning / completion if completion else None),
            _pct(length / len(d.answers) if d.answers else None),
            f"{len(training):,}" + (f" ({_e(training.source)})" if len(training) else ""),
            _pct(training.kept_whole()[16384] if len(training) else None), _retries(d), _verdict(d),
            f"{sum(d.rejects.values()):,}"])
        classes.append("all" if whole else "")
    caps = []
    if settings.total_cost is not None:
        caps.append(f"TOTAL_COST {money(settings.total_cost)} (whole build)")
    if settings.max_cost is not None:
        caps.append(f"MAX_COST {money(settings.max_cost)} (each dataset)")
    budgets = {d.name: settings.budget(d.name) for d in datasets}
    if any(budgets.values()):
        caps.append("TOKEN_BUDGET " + ", ".join(f"{n} {count_text(b) if b else 'none'}"
                                                for n, b in budgets.items()))
    note = (f'<p class="meta">Against: {_e("; ".join(caps))}.</p>' if caps
            else '<p class="meta">No cap given (TOTAL_COST, MAX_COST, TOKEN_BUDGET).</p>')
    return _table(head, rows, classes) + note


def _retries(d: DatasetFacts) -> str:
    causes = d.retries()
    if not causes:
        return "0"
    return f"{sum(causes.values()):,} ({causes.get(RetryCause.RATE_LIMITED, 0):,})"


def _verdict(d: DatasetFacts) -> str:
    """`kp-shard verify` on the dataset's shard sets, run for this page: OK, or the problems."""
    if not d.verdicts:
        return "-"
    bad = [v for v in d.verdicts if v.problems]
    if not bad:
        return "OK" + (f" ({len(d.verdicts)} sets)" if len(d.verdicts) > 1 else "")
    first = bad[0]
    more = sum(len(v.problems) for v in bad) - 1
    return (f'<span class="over">{len(first.problems) + more:,} problem(s)</span><br><span class="meta">'
            f"{_e(first.directory)}: {_e(first.problems[0])}{f' (and {more:,} more)' if more else ''}</span>")


def answered_by(facts: BuildFacts) -> str:
    """Which API answered: a line; an offline build (the stand-in's answers) in red."""
    seen: dict[str, list[int]] = {}  # api -> [records, the stand-in's]
    for d in facts.datasets.values():
        for (api, standin), n in d.apis.items():
            counts = seen.setdefault(api, [0, 0])
            counts[0] += n
            counts[1] += n if standin else 0
    if not seen:
        return '<p class="meta" id="api">Answered by: no answer or failure record was given.</p>'
    # a host that gave one stand-in answer is the stand-in: its failure lines, which carry
    # no generation id, are its too
    parts = [f"{_e(api)}{': the stand-in' if k else ''} ({n:,} records)"
             for api, (n, k) in sorted(seen.items(), key=lambda item: -item[1][0])]
    offline = sum(k for _, k in seen.values())
    if offline:
        return (f'<p class="offline" id="api">OFFLINE: {offline:,} answers are the kimipipe '
                "stand-in's (generation ids <code>gen-standin-</code>): filler text, not Kimi K2.5's; "
                f"train on none of them. Answered by: {', '.join(parts)}.</p>")
    return f'<p class="meta" id="api">Answered by: {", ".join(parts)}.</p>'


def _provider_table(rows: list[dict]) -> str:
    head = ["provider", "answers", "share", "mean tok", "p95 tok", "reasoning", "tok/s", "latency p50",
            "latency p95", "$/M out", "cost", "refused: routing / no reasoning / think / identity", "refused cost",
            "finish"]
    out = []
    for r in rows:
        ct, lat = r["completion_tokens"], r["latency_s"]
        out.append([
            _e(r["provider"]), f"{r['answers']:,}", _pct(r["share"]),
            "-" if ct["mean"] is None else f"{ct['mean']:,.0f}", "-" if ct["p95"] is None else f"{ct['p95']:,}",
            _pct(r["reasoning_share"]), "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}",
            "-" if lat["p50"] is None else f"{lat['p50']:.2f}s", "-" if lat["p95"] is None else f"{lat['p95']:.2f}s",
            "-" if r["usd_per_m_output"] is None else f"${r['usd_per_m_output']:.2f}", money(r["cost"]),
            "/".join(str(r["refused"][k]) for k in REFUSAL_KINDS), money(r["refused_cost"]),
            _e(" ".join(f"{k} {v}" for k, v in r["finish_reasons"].items()))])
    return _table(head, out)


def _identity_table(d: DatasetFacts) -> str:
    """Per provider, its answers' counts against the target's (kp-infer --tokenizer)."""
    rows = d.identity.rows()
    if not rows:
        return ('<p class="meta">No answer was checked against the target model\'s token counts '
                "(kp-infer --tokenizer checks each one).</p>")
    head = ["provider", "checked", "refused for identity", "offset", "completion ratio",
            "quarantined", "offsets seen"]
    out = [[_e(r["provider"]), f"{r['checked']:,}", f"{r['refused']:,}",
            "-" if r["offset"] is None else f"{r['offset']:+d}",
            "-" if r["completion_ratio"] is None else f"{r['completion_ratio']:.3f}",
            "yes" if r["quarantined"] else "no",
            _e(", ".join(f"{k} x{n:,}" for k, n in r["offsets"].items()))] for r in rows]
    return (_table(head, out) + '<p class="meta">offset: usage.prompt_tokens minus kimipipe\'s '
            "count of the prompt as the target's chat template renders it (0: token for token); "
            "completion ratio: usage.completion_tokens over the answer re-encoded.</p>")


def _provider_plots(d: DatasetFacts, rows: list[dict], colors: Colors, prefix: str) -> list:
    return [provider_plots.answer_share(rows, colors, f"{prefix}share"),
            provider_plots.latency(rows, colors, f"{prefix}latency"),
            provider_plots.tokens_per_second(rows, colors, f"{prefix}tokens-per-s"),
            provider_plots.completion_lengths(d, rows, colors, f"{prefix}lengths"),
            provider_plots.refusals_by_kind(d, colors, f"{prefix}refusals")]


def render(facts: BuildFacts, settings: BuildLimits, now: datetime.datetime | None = None) -> str:
    """The whole page (see the module docstring)."""
    now = now or datetime.datetime.now(datetime.UTC)
    colors = Colors(facts)
    datasets = list(facts.datasets.values())
    build = facts.merged() if len(datasets) > 1 else (datasets[0] if datasets else DatasetFacts("all"))
    rows = build.table().rows()
    by_provider_groups = [(r["provider"], [a for a in build.answers if a.provider == r["provider"]])
                          for r in rows]
    by_dataset_groups = ([(d.name, d.answers) for d in datasets] + [("whole build", build.answers)]
                         if len(datasets) > 1 else [])
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(settings.title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{_e(settings.title)}</h1>",
        f'<p class="meta">{len(datasets)} dataset(s): {_e(", ".join(d.name for d in datasets) or "none")}; '
        f"written {now.strftime('%Y-%m-%d %H:%M UTC')} from {len(facts.paths)} file(s).</p>",
        answered_by(facts),
        '<details class="meta" id="files"><summary>files read</summary>'
        + "<br>".join(f"<code>{_e(p)}</code>" for p in facts.paths) + "</details>",
        '<h2 id="overview">The build at a glance</h2>', _overview(facts, settings),
        '<h2 id="money">Money</h2>',
        _grid([build_plots.spend_over_time(datasets, facts.timed, colors, settings.max_cost, settings.total_cost),
               provider_plots.usd_per_million(rows, colors), provider_plots.refused_cost(build, colors)]),
        '<h2 id="retries">Retries and rate limits</h2>', _grid([build_plots.retries_over_time(datasets, facts.timed)]),
        '<h2 id="tokens">Tokens</h2>',
        _grid([build_plots.completion_vs_budget(datasets, {d.name: settings.budget(d.name) for d in datasets}, colors),
               provider_plots.reasoning_share(rows, build, colors),
               build_plots.finish_reasons(by_dataset_groups + by_provider_groups)]),
        '<h2 id="providers">Providers, side by side</h2>', _provider_table(rows),
        _grid(_provider_plots(build, rows, colors, "")),
        '<h2 id="identity">Identity: the target model\'s answers?</h2>', _identity_table(build),
        '<h2 id="rows">The rows (what the trainer reads)</h2>',
        _grid([build_plots.row_lengths(datasets, colors), build_plots.kept_whole(datasets, colors)]),
        _dropped(datasets),
        '<h2 id="multi-turn">Multi-turn</h2>',
        _grid([build_plots.turns_per_conversation(datasets, colors), build_plots.conversations_cut(datasets, colors)]),
        '<h2 id="tokenize">kp-tokenize: rejects and token counts</h2>',
        _grid([build_plots.rejects(datasets, colors), provider_plots.token_deltas(build, colors),
               provider_plots.sampled_ids(build, colors)]),
    ]
    if len(datasets) > 1:
        parts.append('<h2 id="datasets">Each dataset</h2>')
        for d in datasets:
            prefix = f"{_slug(d.name)}--"
            d_rows = d.table().rows()
            parts.append(f'<details id="dataset-{_e(_slug(d.name))}"><summary>{_e(d.name)}: '
                         f"{len(d.answers):,} answers, {money(d.spend)}</summary>")
            parts.append(_provider_table(d_rows))
            parts.append(_grid([
                build_plots.spend_over_time([d], facts.timed, colors, settings.max_cost, None, f"{prefix}spend"),
                provider_plots.usd_per_million(d_rows, colors, f"{prefix}usd-per-m"),
                build_plots.finish_reasons([(r["provider"], [a for a in d.answers if a.provider == r["provider"]])
                                    for r in d_rows], f"{prefix}finish"),
                *_provider_plots(d, d_rows, colors, prefix),
                build_plots.row_lengths([d], colors, f"{prefix}row-lengths"),
                build_plots.kept_whole([d], colors, f"{prefix}kept-whole"),
                provider_plots.token_deltas(d, colors, f"{prefix}deltas")]))
            parts.append("</details>")
    parts.append(f'<p class="meta">Made by <code>kp-infer report --html</code> / <code>make report</code>: '
                 f"max_lengths {', '.join(str(m) for m in MAX_LENGTHS)} tokens; see docs/report.md.</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _dropped(datasets: list[DatasetFacts]) -> str:
    drops = [(d.name, d.rows.dropped) for d in datasets if d.rows.dropped]
    if not drops:
        return ""
    return ('<p class="meta">Dropped by kp-shard: ' + "; ".join(
        f"{_e(name)}: " + ", ".join(f"{_e(k)} {v:,}" for k, v in c.most_common()) for name, c in drops) + "</p>")
