"""The build report's plotting ground: matplotlib (Agg, no screen) to SVG text, one per Plot.

Only `kp-infer report --html` and `make report` import this module (matplotlib is the
`report` extra: `pip install 'kimipipe[report]'`); every other command runs without it.

Each plot function (plots_build.py: one series or bar per dataset; plots_providers.py:
the providers side by side) takes the facts (facts.py) and returns a `Plot` (its SVG,
inlined by page.py) or a `Note` saying why there is nothing to draw: no plot is ever an
empty axis. Here: the shared style, the colours, and `Canvas`, which draws one figure.

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

from .facts import BuildFacts  # noqa: E402

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


class Canvas:
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


def count_text(n: float) -> str:
    for size, suffix in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if abs(n) >= size:
            return f"{n / size:.3g}{suffix}"
    return f"{n:.0f}"


def human_tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def legend_above(ax, ncols: int = 1, handles=None) -> None:
    """The legend over the axes, out of the bars' way (HANDLES: keys of its own)."""
    ax.legend(**({"handles": handles} if handles else {}), loc="lower left", bbox_to_anchor=(0, 1.0),
              ncols=ncols, borderaxespad=0.2)


def barh_height(n: int) -> float:
    return max(1.8, 0.9 + 0.32 * n)


def log_edges(values: list[int], top: int = 0, per_octave: int = 4) -> list[float]:
    """Bin edges a quarter of an octave apart, from the smallest value to the largest (or
    TOP): lengths spread over orders of magnitude, and a shape reads on a log axis."""
    low = max(1, min(values))
    high = max(2, max(values), top)
    k0 = math.floor(math.log2(low) * per_octave)
    k1 = math.ceil(math.log2(high) * per_octave) + 1
    return [2.0 ** (k / per_octave) for k in range(k0, k1 + 1)]
