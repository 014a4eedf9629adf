"""`personaemp stats`: the shape of a build, as numbers (stats.json), a summary and plots.

Computed once, rendered twice: `compute_stats` reads the build's files and returns one
JSON-ready dict; `render_figures` draws PNG plots from that dict only, and the dataset
card (`dataset_card.stats_section`) writes its tables from the same dict, so the card's
figures, its plots and stats.json cannot disagree. `push` calls both for the card.

What it reads, all optional but at least one (a build that stopped early is described
as far as it went): the filter's report, personas.jsonl, queries.jsonl and the splits.
Where they are: `sources_in(processed)` asks the manifest of the processed folder (each
stage notes its output there, workspace.py), falling back to the default file names;
`sources_of_split(report)` follows the split's input back through the manifests.

Figures (the paper describes its dataset with user personality distributions and query
categories, its Figure 6):
- funnel: users from the filter's input to the splits, and queries generated to accepted;
- Big Five levels per trait, over all users with a persona, and train vs test per split
  config (shares);
- accepted queries per category, per language, per user; query length (characters);
  memories cited per query;
- the pass rate of each check over every generated query (accepted and rejected), and of
  each persona check over the trait statements and Big Five levels it was run on
  (`persona_checks`, shaped as `checks`).
"""

from __future__ import annotations

import copy
import io
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
from rich.markup import escape
from rich.table import Table

from personaemp import freshness
from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy, atomic_output, iter_jsonl, write_json_atomic
from personaemp.parallel import fork_map
from personaemp.records import BIG_FIVE
from personaemp.vocabulary import CHECKS, PERSONA_CHECKS
from personaemp.workspace import read_manifest, stage_chain

STATS_FILE = "stats.json"
FIGURE_DIR = "figures"
LEVELS = ("low", "medium", "high")
CATEGORIES = ("ES", "HEQ", "SS")
LENGTH_BINS = (0, 100, 200, 300, 400, 600, 800, 1000)  # characters; a query has at most 1,000
SETTINGS = ("random", "ood")
PARTS = ("train", "test")
HINT = "re-run the stage that wrote it"


@dataclass(frozen=True)
class StatsSources:
    """The files a build's statistics are read from (None: not there)."""

    filter_report: Path | None = None
    personas: Path | None = None
    queries: Path | None = None
    splits: Path | None = None

    def found(self) -> dict[str, str | None]:
        return {name: str(path) if path else None for name, path in vars(self).items()}


@dataclass
class StatsResult:
    stats: dict[str, Any]
    sources: StatsSources
    out: Path
    files: list[str] = field(default_factory=list)
    unchanged_since: str | None = None  # set when skipped: its one line (freshness.py)


# --- where the files are -------------------------------------------------------------------------


def _existing(path: Any) -> Path | None:
    return Path(path) if path and Path(path).exists() else None


def sources_in(processed: Path) -> StatsSources:
    """The build in `processed`: the manifest's entries, else the default file names."""
    processed = Path(processed)
    if not processed.is_dir():
        raise InputError(f"{processed}: no such folder", "pass the folder the stages wrote to (--processed)")
    manifest = read_manifest(processed)

    def entry(stage: str, key: str, default: str) -> Path | None:
        return _existing((manifest.get(stage) or {}).get(key) or processed / default)

    sources = StatsSources(
        filter_report=entry("filter", "report", "filter_report.json"),
        personas=entry("infer-persona", "output", "personas.jsonl"),
        queries=entry("gen-queries", "output", "queries.jsonl"),
        splits=entry("split", "output", "splits"),
    )
    if not any(vars(sources).values()):
        raise InputError(
            f"{processed}: holds no output of the stages (filter_report.json, personas.jsonl, "
            "queries.jsonl, splits/)",
            "run personaemp filter (or personaemp run) first, or pass --processed DIR",
        )
    return sources


def sources_of_split(splits: Path, split_report: dict[str, Any]) -> StatsSources:
    """The build behind a split: its input (the queries) and the stages before, by manifest."""
    source = split_report.get("input")
    chain = stage_chain(Path(source)) if isinstance(source, str) and source else {}
    return StatsSources(
        filter_report=_existing((chain.get("filter") or {}).get("report")),
        personas=_existing((chain.get("infer-persona") or {}).get("output")),
        queries=_existing(source),
        splits=_existing(splits),
    )


# --- reading -------------------------------------------------------------------------------------


# Typed decoding builds only these fields (msgspec skips the rest of each row): a
# build's files are tens of MB of dialogue and memories the statistics never look at.


class _Level(msgspec.Struct):
    level: str


class _PersonaRow(msgspec.Struct):
    user_id: str
    eligible: bool = True
    language: str | None = None
    big_five: dict[str, _Level] | None = None


class _Checked(msgspec.Struct):
    """A trait or a Big Five level, as far as its persona checks go."""

    level: str = ""
    checks: dict[str, bool] | None = None


class _PersonaFileRow(_PersonaRow):
    big_five: dict[str, _Checked] | None = None
    traits: list[_Checked] = msgspec.field(default_factory=list)
    enforced: list[str] | None = None


class _Query(msgspec.Struct):
    category: str
    query: str
    memory_ids: list[str] = msgspec.field(default_factory=list)
    checks: dict[str, Any] = msgspec.field(default_factory=dict)


class _QueriesRow(_PersonaRow):
    queries: list[_Query] = msgspec.field(default_factory=list)
    rejected_queries: list[_Query] = msgspec.field(default_factory=list)


_RAW = msgspec.json.Decoder(msgspec.Raw)  # checks a line's syntax, builds nothing


def _rows(path: Path, model: type[msgspec.Struct], what: str) -> Iterator:
    """The rows of `path` as `model`, one at a time: the statistics are counted as they go."""
    typed = msgspec.json.Decoder(model)
    try:
        for lineno, _, line in iter_jsonl(path, ErrorPolicy("fail"), _RAW):
            try:
                yield typed.decode(line)
            except msgspec.ValidationError as exc:
                raise InputError(f"{path}:{lineno}: not a {what} row ({exc})", HINT) from None
            except UnicodeDecodeError:  # a string _RAW skipped over without decoding it
                raise InputError(f"{path}:{lineno}: not valid UTF-8", HINT) from None
    except RowError as error:  # an unreadable line
        raise InputError(f"{error.location}: {error.reason}", HINT) from None


def _profile(row: _PersonaRow) -> dict[str, str] | None:
    """The five levels, or None when the row has no complete, valid Big Five."""
    if not row.big_five:
        return None
    levels = {trait: row.big_five[trait].level for trait in BIG_FIVE if trait in row.big_five}
    return levels if len(levels) == len(BIG_FIVE) and set(levels.values()) <= set(LEVELS) else None


class _Levels:
    """Users at each level of each trait, counted one profile at a time."""

    def __init__(self) -> None:
        self.users = 0
        self.counts = {trait: dict.fromkeys(LEVELS, 0) for trait in BIG_FIVE}

    def add(self, profile: dict[str, str]) -> None:
        self.users += 1
        for trait in BIG_FIVE:
            self.counts[trait][profile[trait]] += 1


def _read_filter_report(path: Path) -> dict[str, Any]:
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})", HINT) from None
    if not isinstance(report, dict):
        raise InputError(f"{path}: not a filter report (a JSON object is expected)", HINT)
    return report


def _split_files(splits: Path) -> dict[str, dict[str, Path]]:
    """setting -> part -> file, for the settings whose train and test files are both there."""
    found = {}
    for setting in SETTINGS:
        paths = {part: splits / setting / f"{part}.jsonl" for part in PARTS}
        if all(path.is_file() for path in paths.values()):
            found[setting] = paths
    return found


# --- the numbers ---------------------------------------------------------------------------------


def _spread(values: Counter) -> dict[str, Any]:
    """Mean, median, min and max of the values `values` counts (value -> how many)."""
    n = sum(values.values())
    if not n:
        return {"mean": 0.0, "median": 0.0, "min": 0, "max": 0}
    ordered = sorted(values)

    def at(position: int) -> int:  # the value at `position` of the values sorted
        seen = 0
        for value in ordered:
            seen += values[value]
            if position < seen:
                return value
        raise AssertionError(position)

    low, high = at((n - 1) // 2), at(n // 2)
    return {
        "mean": round(sum(value * count for value, count in values.items()) / n, 2),
        "median": (low + high) / 2,  # statistics.median's
        "min": ordered[0],
        "max": ordered[-1],
    }


def _length_bins(lengths: Counter) -> dict[str, int]:
    bins = {}
    for low, high in zip(LENGTH_BINS, (*LENGTH_BINS[1:], None), strict=True):
        name = f"{low}-{high - 1}" if high else f"{low}+"
        bins[name] = sum(count for n, count in lengths.items() if low <= n and (high is None or n < high))
    return bins


def _counts(values: Counter) -> dict[str, int]:
    """How many items have each value, every value from the smallest to the largest."""
    if not values:
        return {}
    return {str(n): values.get(n, 0) for n in range(min(values), max(values) + 1)}


def compute_stats(sources: StatsSources) -> dict[str, Any]:
    """The statistics of a build, from its files (what is missing is left out, not made up).

    Every file is read once, a row at a time, into counts: memory does not grow with the
    build (a 15,000-user build held 140 MB of rows before)."""
    # No file paths in it: push publishes it beside the card.
    stats: dict[str, Any] = {"funnel": {"users": [], "queries": []}}
    users_funnel = stats["funnel"]["users"]
    if sources.filter_report:
        report = _read_filter_report(sources.filter_report)
        # An older report may lack a figure: it is left out, not made up (nor a reason to stop).
        for key, stage in (("users_in", "read by filter"), ("kept", "kept by filter")):
            if isinstance(report.get(key), int):
                users_funnel.append({"stage": stage, "count": report[key]})
    if sources.personas:
        personas, levels = 0, _Levels()
        passed, judged = Counter(), Counter()  # persona check -> items passing it / checked
        decided: dict[str, set[bool | None]] = {name: set() for name in PERSONA_CHECKS}
        for row in _rows(sources.personas, _PersonaFileRow, "persona"):
            personas += 1
            if row.eligible and (profile := _profile(row)):
                levels.add(profile)
            for item in [*row.traits, *(row.big_five or {}).values()]:
                for name, ok in (item.checks or {}).items():
                    if name in decided:
                        judged[name] += 1
                        passed[name] += ok
                        decided[name].add(None if row.enforced is None else name in row.enforced)
        users_funnel += [
            {"stage": "persona written", "count": personas},
            {"stage": "eligible, with Big Five", "count": levels.users},
        ]
        stats["big_five"] = {"users": levels.users, "levels": levels.counts}
        stats["persona_checks"] = _check_rates(
            PERSONA_CHECKS, passed, judged, lambda name: _one(decided[name])
        )
    if sources.queries:
        _query_stats(_rows(sources.queries, _QueriesRow, "queries"), stats)
    if sources.splits:
        settings = {}
        for setting, paths in _split_files(sources.splits).items():
            settings[setting] = {}
            for part, path in paths.items():
                users, queries, levels = 0, 0, _Levels()
                for row in _rows(path, _QueriesRow, "split"):
                    users += 1
                    queries += len(row.queries)
                    if profile := _profile(row):
                        levels.add(profile)
                settings[setting][part] = {"users": users, "queries": queries, "levels": levels.counts}
        if settings:
            first = next(iter(settings.values()))
            users_funnel.append(
                {"stage": "in the splits", "count": sum(first[part]["users"] for part in PARTS)}
            )
        stats["splits"] = settings
    return stats


def _query_stats(rows: Iterator[_QueriesRow], stats: dict[str, Any]) -> None:
    """The queries' part of the statistics (funnel, queries, checks, acceptance), counted
    over the rows as they are read."""
    with_accepted, accepted, generated = 0, 0, 0
    per_user, lengths, cited = Counter(), Counter(), Counter()
    categories, languages = Counter(), Counter()
    passed, judged = Counter(), Counter()  # check -> queries passing it / with a result for it
    decided: dict[str, set[bool]] = {name: set() for name in CHECKS}  # enforced or not, as recorded
    recorded = True  # every generated query records which checks it enforced
    failed_accepted = Counter()  # the checks an accepted query failed (a frozenset) -> queries
    for row in rows:
        with_accepted += bool(row.queries)
        per_user[len(row.queries)] += 1
        for is_accepted, queries in ((True, row.queries), (False, row.rejected_queries)):
            for q in queries:
                generated += 1
                enforced = q.checks.get("enforced")
                recorded = recorded and isinstance(enforced, list)
                for name in CHECKS:
                    result = q.checks.get(name)
                    if isinstance(result, bool):
                        judged[name] += 1
                        passed[name] += result
                    if recorded:
                        decided[name].add(name in enforced)
                if is_accepted:
                    accepted += 1
                    lengths[len(q.query)] += 1
                    cited[len(q.memory_ids)] += 1
                    categories[q.category] += 1
                    languages[row.language or "unknown"] += 1
                    failed_accepted[frozenset(n for n in CHECKS if q.checks.get(n) is False)] += 1
    stats["funnel"]["users"].append({"stage": "with an accepted query", "count": with_accepted})
    stats["funnel"]["queries"] += [
        {"stage": "generated", "count": generated},
        {"stage": "accepted", "count": accepted},
    ]
    stats["queries"] = {
        "accepted": accepted,
        "categories": {c: categories.get(c, 0) for c in sorted(categories, key=_category_order)},
        "languages": _most_first(languages),
        "per_user": {"users": sum(per_user.values()), **_spread(per_user), "counts": _counts(per_user)},
        "length": {**_spread(lengths), "bins": _length_bins(lengths)},
        "memories_cited": {**_spread(cited), "counts": _counts(cited)},
    }
    recorded = recorded and generated > 0
    stats["checks"] = _check_rates(
        CHECKS,
        passed,
        judged,
        lambda name: _enforced(name, decided[name] if recorded else None, failed_accepted),
    )
    relaxed = {name for name, c in stats["checks"].items() if c["enforced"] is False}
    stats["acceptance"] = {
        "recorded": recorded,
        "enforced": [name for name, c in stats["checks"].items() if c["enforced"]],
        "recorded_only": [name for name in stats["checks"] if name in relaxed],
        "accepted": accepted,
        "accepted_failing_recorded_only": sum(n for failed, n in failed_accepted.items() if failed & relaxed),
    }


def _check_rates(names, passed: Counter, judged: Counter, enforced) -> dict[str, dict[str, Any]]:
    """check -> passed, of, rate and `enforced(check)`, for the checks with a result."""
    return {
        name: {
            "passed": passed[name],
            "of": judged[name],
            "rate": round(passed[name] / judged[name], 4),
            "enforced": enforced(name),
        }
        for name in names
        if judged[name]
    }


def _one(decided: set[bool | None]) -> bool | None:
    """The one answer every row gave (None: they differ, or a row did not record it)."""
    return next(iter(decided)) if len(decided) == 1 else None


def _enforced(name: str, decided: set[bool] | None, failed_accepted: Counter) -> bool | None:
    """Whether a check decided acceptance: from what every query records (a check some
    queries enforced and others did not: None), else inferred: an accepted query that failed
    it shows it was not enforced; otherwise it is not known (None)."""
    if decided is not None:
        return _one(decided)
    return False if any(name in failed for failed in failed_accepted) else None


def _most_first(counts: Counter[str]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _category_order(category: str) -> tuple[int, str]:
    return (CATEGORIES.index(category) if category in CATEGORIES else len(CATEGORIES), category)


# --- the plots -------------------------------------------------------------------------------------

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


# --- the command -----------------------------------------------------------------------------------


_COMPUTED: dict[tuple, dict[str, Any]] = {}  # the statistics of the files' last state read


def _state(sources: StatsSources) -> tuple:
    """Every file the statistics read, with its inode, size and times (an atomic rewrite
    is a new inode; an edit in place changes the times)."""
    paths = []
    for path in vars(sources).values():
        if path is not None:
            paths.extend(sorted(Path(path).rglob("*.jsonl")) if Path(path).is_dir() else [Path(path)])
    states = [(str(path), path.stat()) for path in paths]
    return tuple((name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) for name, st in states)


def stats_and_figures(sources: StatsSources) -> tuple[dict[str, Any], dict[str, bytes]]:
    """compute_stats and render_figures, each once per state of the files in a process:
    `run`'s push reuses what its stats stage has just read (1 s at 1,000 users) and drew (2 s)."""
    key = _state(sources)
    if key not in _COMPUTED:
        _COMPUTED.clear()
        _COMPUTED[key] = compute_stats(sources)
    stats = copy.deepcopy(_COMPUTED[key])
    return stats, render_figures(stats)


def write_stats(processed: Path, out: Path, force: bool = False) -> StatsResult:
    """`personaemp stats`: compute the build's statistics once, write stats.json and the plots
    (each file atomically) into `out`; nothing is written if a file cannot be read. Skipped
    when the files read, the code and `out` are those of the last finished run and what it
    wrote is as it left it (`force`: never)."""
    sources = sources_in(Path(processed))
    out = Path(out)
    fingerprint = freshness.fingerprint(list(vars(sources).values()), {"out": out})
    last = freshness.current("stats", out, fingerprint, force)
    if last is not None:
        stats, files = last["result"]["stats"], last["result"]["files"]
        line = freshness.unchanged("stats", last)
        return StatsResult(stats=stats, sources=sources, out=out, files=files, unchanged_since=line)
    stats, figures = stats_and_figures(sources)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: not a folder", "pass a folder for --out")
    files = []
    for name, data in figures.items():
        with atomic_output(out / FIGURE_DIR / name) as handle:
            handle.write(data)
        files.append(f"{FIGURE_DIR}/{name}")
    write_json_atomic(out / STATS_FILE, stats)
    files.append(STATS_FILE)
    freshness.record(
        "stats", out, fingerprint, [out / name for name in files], {"stats": stats, "files": files}
    )
    return StatsResult(stats=stats, sources=sources, out=out, files=files)


# --- from options (the command, pe.* and `run`) ---------------------------------------------------


def from_options(options, console):
    """`personaemp stats` on its options."""
    from personaemp.results import of_stats

    return of_stats(write_stats(options.processed, options.out_dir, options.force))


def print_summary(made, console) -> None:
    """`personaemp stats`: the figures stats.json holds, in short, and where they came from."""
    result = made.report
    if result.unchanged_since:
        return console.print(result.unchanged_since)
    stats = result.stats
    for name, path in result.sources.found().items():
        console.print(f"{name}: {escape(path) if path else '[yellow]not found[/]'}")
    funnel = stats["funnel"]
    if funnel["users"]:
        console.print("users: " + " → ".join(f"{s['stage']} {s['count']}" for s in funnel["users"]))
    if funnel["queries"]:
        console.print("queries: " + " → ".join(f"{s['stage']} {s['count']}" for s in funnel["queries"]))
    if "big_five" in stats:
        levels = Table(title=f"Big Five levels of {stats['big_five']['users']} users", title_justify="left")
        levels.add_column("trait")
        for level in ("low", "medium", "high"):
            levels.add_column(level, justify="right")
        for trait in BIG_FIVE:
            levels.add_row(trait, *(str(n) for n in stats["big_five"]["levels"][trait].values()))
        console.print(levels)
    queries = stats.get("queries")
    if queries:
        per_user, length = queries["per_user"], queries["length"]
        console.print(
            "per category: " + (", ".join(f"{c} {n}" for c, n in queries["categories"].items()) or "none")
        )
        console.print(
            "per language: " + (", ".join(f"{c} {n}" for c, n in queries["languages"].items()) or "none")
        )
        console.print(
            f"per user: mean {per_user['mean']:g}, min {per_user['min']}, max {per_user['max']} · "
            f"length: mean {length['mean']:g}, min {length['min']}, max {length['max']} characters · "
            f"memories cited: mean {queries['memories_cited']['mean']:g}"
        )
    if stats.get("checks"):
        console.print(
            "checks passed: " + ", ".join(f"{name} {c['rate']:.0%}" for name, c in stats["checks"].items())
        )
    console.print(f"wrote {escape(str(result.out))}: {', '.join(result.files)}")
