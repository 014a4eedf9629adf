"""The plots of `personaemp stats` and the dataset card, drawn from the statistics' dict alone
(`render_figures`), over the cores, one PNG per figure; a plot whose figures did not change
is not drawn again in a process."""

from __future__ import annotations

import io
import json
from functools import partial
from typing import Any

from personaemp.parallel import fork_map
from personaemp.records import BIG_FIVE
from personaemp.splits import LEVELS

FIGURE_SIZE = (9.0, 3.2)  # inches
DPI = 100
LEVEL_COLORS = {"low": "#9ecae1", "medium": "#4292c6", "high": "#08519c"}
BAR = "#4292c6"


def _figure(columns: int, rows: int = 1, height: float = FIGURE_SIZE[1], widths: list[int] | None = None):
    # matplotlib is imported here: it takes a few hundred ms, which `--help` should not pay.
    # Figure + the Agg canvas directly: no pyplot global state, no interactive backend.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(FIGURE_SIZE[0], height * rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False, width_ratios=widths)
    return figure, axes


def _png(figure) -> bytes:
    import numpy as np
    from matplotlib.image import imsave

    # One draw (it runs the constrained layout, then renders): savefig drew every plot twice,
    # once without rendering to lay it out. The same bytes, 15% less time.
    figure.canvas.draw()
    buffer = io.BytesIO()
    # No "Software" (matplotlib's version) in the PNG: the same stats give the same bytes.
    imsave(
        buffer, np.asarray(figure.canvas.buffer_rgba()), format="png", dpi=DPI, metadata={"Software": None}
    )
    return buffer.getvalue()


def _count(value: float) -> str:
    """A count as a short label: 880, 1.8k, 32k, 1.2M (at 10,000 users full numbers ran
    together over neighbouring bars); the exact figures are in stats.json and the card."""
    for size, suffix in ((1_000_000, "M"), (1_000, "k")):
        if value >= size:
            shown = value / size
            text = f"{shown:.1f}".removesuffix(".0") if shown < 10 else f"{shown:.0f}"
            return text + suffix
    return f"{value:g}"


def _count_axis(axis) -> None:
    """Few ticks, whole numbers, short labels: the funnel's 9 ticks of 4-5 digits touched."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    axis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    axis.set_major_formatter(FuncFormatter(lambda value, _: _count(value)))


def _percent_axis(axis) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter

    axis.set_major_locator(FixedLocator([0, 25, 50, 75, 100]))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.0f}%"))


def _bars(
    axis,
    labels: list[str],
    values: list[float],
    title: str,
    horizontal: bool = False,
    *,
    value_label: str,
    category_label: str = "",
    percent: bool = False,
) -> None:
    """Bars with their value written at their end. `percent`: values are rates 0-1, shown
    as percent (the card's unit). `value_label` titles the value axis, `category_label` the
    other one (left out where the tick labels say it)."""
    positions = range(len(labels))
    shown = [value * 100 for value in values] if percent else values
    texts = [f"{value:.1f}%" for value in shown] if percent else [_count(value) for value in shown]
    value_axis = axis.xaxis if horizontal else axis.yaxis
    _percent_axis(value_axis) if percent else _count_axis(value_axis)
    if horizontal:
        axis.barh(positions, shown, color=BAR)
        axis.set_yticks(list(positions), labels)
        axis.invert_yaxis()
        for y, value, text in zip(positions, shown, texts, strict=True):
            axis.annotate(
                text, (value, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8
            )
        axis.set_xlabel(value_label, fontsize=9)
        axis.set_ylabel(category_label, fontsize=9)
    else:
        axis.bar(positions, shown, color=BAR)
        axis.set_xticks(list(positions), labels)
        for x, value, text in zip(positions, shown, texts, strict=True):
            axis.annotate(
                text, (x, value), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=8
            )
        axis.set_ylabel(value_label, fontsize=9)
        axis.set_xlabel(category_label, fontsize=9)
    axis.set_title(title, fontsize=10)
    if percent:  # room for "100.0%" after the longest bar, ticks only up to 100%
        (axis.set_xlim if horizontal else axis.set_ylim)(0, 118)
    else:
        axis.margins(x=0.22 if horizontal else 0.05, y=0.05 if horizontal else 0.15)


FINAL_EMOTION_PLOT = "dialogues_final_emotion.png"
EMOTION_BINS = 10  # bins of 10 points over the simulated emotion's 0-100


def final_emotion_plot(finals: dict[str, list[int]], initial: int | None = None) -> bytes:
    """The histogram of the dialogues' final emotion (the card's dialogues section), one bar
    group per supporter; `initial`: the emotion every dialogue starts at, marked."""
    figure, axes = _figure(1)
    axis = axes[0][0]
    edges = [EMOTION_BINS * i for i in range(100 // EMOTION_BINS + 1)]
    width = 0.8 / max(1, len(finals))
    colours = ["#4292c6", "#e6550d", "#31a354", "#756bb1"]
    for n, (supporter, values) in enumerate(sorted(finals.items())):
        # the last bin holds 100 itself (the satisfied end)
        counts = [sum(low <= v < high or (high == 100 and v == 100) for v in values)
                  for low, high in zip(edges, edges[1:], strict=False)]  # fmt: skip
        xs = [i + (n - (len(finals) - 1) / 2) * width for i in range(len(counts))]
        axis.bar(xs, counts, width, color=colours[n % len(colours)], label=f"{supporter} (n={len(values)})")
        for x, count in zip(xs, counts, strict=True):
            if count:
                axis.annotate(str(count), (x, count), xytext=(0, 2), textcoords="offset points",
                              ha="center", fontsize=7)  # fmt: skip
    names = [f"{low}-{high}" for low, high in zip(edges, edges[1:], strict=False)]
    axis.set_xticks(range(len(names)), names, fontsize=8)
    if initial is not None:
        start = initial / EMOTION_BINS - 0.5  # the left edge of the bin that holds it
        axis.axvline(start, color="grey", linestyle="--", linewidth=1)
        axis.annotate(f"start ({initial})", (start, 1), xycoords=("data", "axes fraction"),
                      xytext=(3, -10), textcoords="offset points", fontsize=8, color="grey")  # fmt: skip
    _count_axis(axis.yaxis)
    axis.margins(y=0.15)
    axis.set_xlabel("final emotion of the simulated user (0-100)", fontsize=9)
    axis.set_ylabel("dialogues", fontsize=9)
    axis.set_title("Where the dialogues ended: the simulated user's final emotion", fontsize=10)
    axis.legend(fontsize=8, frameon=False, loc="upper left")
    return _png(figure)


def _level_bars(axis, levels: dict[str, dict[str, float]], title: str, share: bool) -> None:
    """Grouped bars: per trait (its whole name), one bar per level; shares in percent."""
    width = 0.27
    for offset, level in enumerate(LEVELS):
        values = [levels[trait][level] * (100 if share else 1) for trait in BIG_FIVE]
        xs = [i + (offset - 1) * width for i in range(len(BIG_FIVE))]
        axis.bar(xs, values, width, color=LEVEL_COLORS[level], label=level)
    axis.set_xticks(range(len(BIG_FIVE)), list(BIG_FIVE), fontsize=9)
    axis.set_title(title, fontsize=10)
    if share:
        axis.set_ylim(0, 100)
        _percent_axis(axis.yaxis)
        axis.set_ylabel("users at the level (%)", fontsize=9)
    else:
        _count_axis(axis.yaxis)
        axis.margins(y=0.08)
        axis.set_ylabel("users", fontsize=9)


def _level_legend(figure) -> None:
    """One legend for the figure, above the plots (inside, it covered bars near 100%)."""
    handles, labels = figure.axes[0].get_legend_handles_labels()
    figure.legend(
        handles,
        labels,
        loc="outside upper center",
        ncols=3,
        frameon=False,
        fontsize=9,
        title="Big Five level",
    )


def _shares(levels: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
    return {
        trait: {lv: (n / total if (total := sum(counts.values())) else 0.0) for lv, n in counts.items()}
        for trait, counts in levels.items()
    }


def figure_names(stats: dict[str, Any]) -> list[str]:
    """The plots `render_figures` draws for these stats (a missing part of the build has none)."""
    names = ["funnel.png"] if stats["funnel"]["users"] else []
    names += ["big_five.png"] if "big_five" in stats else []
    names += [f"big_five_{setting}.png" for setting in stats.get("splits") or {}]
    names += ["queries.png", "query_shape.png"] if "queries" in stats else []
    names += ["checks.png"] if stats.get("checks") else []
    return names


def render_figures(stats: dict[str, Any]) -> dict[str, bytes]:
    """PNG plots (file name -> bytes) drawn from `compute_stats`' dict alone; a dict drawn
    before in this process is not drawn again (the PNGs are the same bytes)."""
    key = json.dumps(stats, sort_keys=True)
    if key not in _RENDERED:
        if len(_RENDERED) >= 8:
            _RENDERED.pop(next(iter(_RENDERED)))
        names = figure_names(stats)
        # Drawn over the cores (1.6 s for the 7 plots on one); matplotlib imported before the fork.
        import matplotlib.backends.backend_agg  # noqa: F401

        drawn = fork_map(partial(_drawn_png, stats=stats), names, worth_it=len(names) > 2)
        _RENDERED[key] = dict(zip(names, drawn, strict=True))
    return dict(_RENDERED[key])


_RENDERED: dict[str, dict[str, bytes]] = {}  # stats dict as JSON -> its plots (the last few drawn)


def _drawn_png(name: str, stats: dict[str, Any]) -> bytes:
    return _png(_draw(name, stats))


def _draw(name: str, stats: dict[str, Any]):
    if name == "funnel.png":
        users, queries = stats["funnel"]["users"], stats["funnel"]["queries"]
        figure, axes = _figure(2 if queries else 1)
        labels, counts = [s["stage"] for s in users], [s["count"] for s in users]
        _bars(axes[0][0], labels, counts, "Users through the build", horizontal=True, value_label="users")
        if queries:
            labels, counts = [s["stage"] for s in queries], [s["count"] for s in queries]
            _bars(axes[0][1], labels, counts, "Queries", value_label="queries")
    elif name == "big_five.png":
        figure, axes = _figure(1)
        title = f"Big Five levels of all {stats['big_five']['users']:,} users with a persona"
        _level_bars(axes[0][0], stats["big_five"]["levels"], title, share=False)
        _level_legend(figure)
    elif name.startswith("big_five_"):
        setting = name.removeprefix("big_five_").removesuffix(".png")
        parts = stats["splits"][setting]
        # One row per part: side by side, the five whole trait names did not fit.
        figure, axes = _figure(1, rows=len(parts))
        for row, (part, data) in zip(axes, parts.items(), strict=True):
            users = f"{data['users']:,} user" + ("" if data["users"] == 1 else "s")
            _level_bars(row[0], _shares(data["levels"]), f"{setting} {part}: {users}", share=True)
        _level_legend(figure)
    elif name == "queries.png":
        queries = stats["queries"]
        figure, axes = _figure(3)
        categories = queries["categories"]
        _bars(axes[0][0], list(categories), list(categories.values()), "Queries per category",
              value_label="accepted queries", category_label="category")  # fmt: skip
        top = list(queries["languages"].items())[:8]
        _bars(axes[0][1], [code for code, _ in top], [n for _, n in top], "Queries per language",
              value_label="accepted queries", category_label="the user's language (top 8)")  # fmt: skip
        counts = queries["per_user"]["counts"]
        _bars(axes[0][2], list(counts), list(counts.values()), "Users by accepted queries",
              value_label="users", category_label="accepted queries of a user")  # fmt: skip
    elif name == "query_shape.png":
        queries = stats["queries"]
        figure, axes = _figure(2, widths=[2, 1])  # eight bins whose labels need the room
        bins = queries["length"]["bins"]
        _bars(axes[0][0], list(bins), list(bins.values()), "Queries by length",
              value_label="accepted queries", category_label="characters")  # fmt: skip
        axes[0][0].tick_params(axis="x", labelsize=8)
        cited = queries["memories_cited"]["counts"]
        _bars(axes[0][1], list(cited), list(cited.values()), "Queries by memories cited",
              value_label="accepted queries", category_label="memories cited")  # fmt: skip
    else:  # checks.png
        checks = stats["checks"]
        figure, axes = _figure(1)
        rates = [c["rate"] for c in checks.values()]
        title = "Pass rate of each check over the generated queries (accepted and rejected)"
        _bars(axes[0][0], list(checks), rates, title, True, value_label="queries passing", percent=True)
    return figure
