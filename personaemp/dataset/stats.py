"""`personaemp stats`: the shape of a build, as numbers (stats.json), a summary and plots.

Computed once, rendered twice: `compute_stats` reads the build's files and returns one
JSON-ready dict; `render_figures` draws PNG plots from that dict only, and the dataset
card (`dataset_card.stats_section`) writes its tables from the same dict, so the card's
figures, its plots and stats.json cannot disagree. `push` calls both for the card.

What it reads, all optional but at least one (a build that stopped early is described
as far as it went): the filter's report, personas.jsonl, queries.jsonl and the splits.
Where they are: `sources_in(processed)` asks the manifest of the processed folder (each
stage notes its output there, manifest.py), falling back to the default file names;
`sources_of_split(report)` follows the split's input back through the manifests.

Figures, drawn in figures.py (the paper describes its dataset with user personality
distributions and query categories, its Figure 6):
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
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from rich.markup import escape
from rich.table import Table

from personaemp import manifest
from personaemp.dataset.figures import (  # noqa: F401 - publish and the card import the plots from here
    FINAL_EMOTION_PLOT,
    figure_names,
    final_emotion_plot,
    render_figures,
)
from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy, atomic_output, iter_jsonl, write_json_atomic
from personaemp.manifest import read_manifest, stage_chain
from personaemp.records import BIG_FIVE
from personaemp.results import StageResult, of_stats
from personaemp.vocabulary import CHECKS, PERSONA_CHECKS

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
        """Each file as the user named the build: relative to the current folder when it lies
        there (a build names its files relative to itself; the machine's paths stay out)."""
        return {name: _shown(path) if path else None for name, path in vars(self).items()}


def _shown(path: Path) -> str:
    here = Path.cwd()
    absolute = Path(path).absolute()
    return absolute.relative_to(here).as_posix() if absolute.is_relative_to(here) else str(path)


@dataclass
class StatsResult:
    stats: dict[str, Any]
    sources: StatsSources
    out: Path
    files: list[str] = field(default_factory=list)
    unchanged_since: str | None = None  # set when skipped: its one line (manifest.py)


# --- where the files are -------------------------------------------------------------------------


def _existing(path: Any) -> Path | None:
    return Path(path) if path and Path(path).exists() else None


def sources_in(processed: Path) -> StatsSources:
    """The build in `processed`: the manifest's entries, else the default file names."""
    processed = Path(processed)
    if not processed.is_dir():
        raise InputError(f"{processed}: no such folder", "pass the folder the stages wrote to (--processed)")
    entries = read_manifest(processed)

    def entry(stage: str, key: str, default: str) -> Path | None:
        return _existing((entries.get(stage) or {}).get(key) or processed / default)

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


def write_stats(processed: Path, out: Path, force: bool = False) -> StageResult:
    """`personaemp stats`: compute the build's statistics once, write stats.json and the plots
    (each file atomically) into `out`; nothing is written if a file cannot be read. Skipped
    when the files read, the code and `out` are those of the last finished run and what it
    wrote is as it left it (`force`: never). The StageResult's `report` is the StatsResult."""
    return of_stats(_write_stats(processed, out, force))


def _write_stats(processed: Path, out: Path, force: bool) -> StatsResult:
    sources = sources_in(Path(processed))
    out = Path(out)
    fingerprint = manifest.fingerprint(list(vars(sources).values()), {"out": out})
    last = manifest.current("stats", out, fingerprint, force)
    if last is not None:
        stats, files = last["result"]["stats"], last["result"]["files"]
        line = manifest.unchanged("stats", last)
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
    manifest.record(
        "stats", out, fingerprint, [out / name for name in files], {"stats": stats, "files": files}
    )
    return StatsResult(stats=stats, sources=sources, out=out, files=files)


# --- from options (the command, pe.* and `run`) ---------------------------------------------------


def from_options(options, console):
    """`personaemp stats` on its options."""
    return write_stats(options.processed, options.out_dir, options.force)


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
