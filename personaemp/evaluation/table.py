"""`personaemp table`: the paper's Table 1 from `evaluate` reports (no LLM).

Rows are the systems; column groups are judge x split (each report is one split, judged by
one judge or a panel); each group holds Res, Exp, Rec and Avg on the 1-5 scale (Avg: the
mean of the unrounded dimension means, as the report keeps it), and H (0-1) on request.
`judge` keeps one judge of a panel, `systems` some systems in a chosen order (the paper's
Table 2 from the reports of Table 1). Written as Markdown, CSV or LaTeX; under the table
the rules its numbers were made by (layout, missing responses, unreadable judgments), n
per cell (per group when the cells share it) and the queries the missing rule touched.
Reports of `evaluate --dialogues` give the multi-turn table (session_cells), then a second
one keyed by the same systems: how real the simulated seekers are (realism_cells; in CSV,
extra columns on the same rows).
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from personaemp.errors import InputError
from personaemp.records import DIMENSIONS
from personaemp.vocabulary import TABLE_FORMATS

FORMATS = TABLE_FORMATS
SHORT = {"resonation": "Res", "expression": "Exp", "reception": "Rec"}
SPLIT_NAMES = {"random": "Random", "ood": "OOD"}


def read_report(path: Path) -> dict:
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot read the report ({exc.strerror or type(exc).__name__})") from None
    except ValueError as exc:
        raise InputError(
            f"{path}: not a JSON report ({exc})", "pass reports written by `personaemp evaluate`"
        ) from None
    if not isinstance(report, dict) or not isinstance(report.get("systems"), dict) or "split" not in report:
        raise InputError(
            f"{path}: not an evaluate report (no split or systems)",
            "pass reports written by `personaemp evaluate`",
        )
    return report


def check_current(reports: Sequence[dict], paths: Sequence[Path]) -> None:
    """Stop when a report scored queries that have changed since: its split file (`input`)
    now holds another text under one of its query ids, or another report of the same split
    scored other versions of them. Reports from before the hashes are not checked."""
    from personaemp.instruments.criteria import query_hash, query_units

    seen: dict[tuple[str, str], tuple[Path, dict]] = {}
    for path, report in zip(paths, reports, strict=True):
        hashes = report.get("query_hashes")
        if not isinstance(hashes, dict):
            continue
        source = Path(str(report.get("input", "")))
        remake = "run `personaemp evaluate` again for it (after `criteria` and `respond` on the new queries)"
        if source.is_file():
            stale = [u["query_id"] for u in query_units(source, "") if hashes.get(u["query_id"]) not in
                     (None, query_hash(u))]  # fmt: skip
            if stale:
                raise InputError(
                    f"{path}: {len(stale)} of its queries changed in {source} since it was scored "
                    f"({', '.join(stale[:5])})",
                    remake,
                )
        key = (str(report.get("split")), str(report.get("part", "test")))
        if key in seen:
            other, before = seen[key]
            differ = sorted(q for q in hashes.keys() & before.keys() if hashes[q] != before[q])
            if differ:
                raise InputError(
                    f"{path} and {other} scored different versions of the {key[0]} {key[1]} queries "
                    f"({', '.join(differ[:5])})",
                    remake.replace("for it", "for the older one"),
                )
        seen[key] = (path, hashes)


def groups(reports: Sequence[dict], judge: str | None = None) -> list[tuple[str, str, dict, dict]]:
    """(judge, split, systems, report) per column group: judge-major, splits in the order
    given; only `judge`'s when given."""
    found: dict[str, list[tuple[str, dict, dict]]] = {}
    for report in reports:
        judges = report.get("judges") or {
            report.get("judge_model") or "judge": {"systems": report["systems"]}
        }
        for name, judged in judges.items():
            found.setdefault(name, []).append((report["split"], judged["systems"], report))
    if judge is not None:
        if judge not in found:
            raise InputError(
                f"no judge {judge!r} in the reports (they hold {', '.join(found)})", "pass one of those names"
            )
        found = {judge: found[judge]}
    out = []
    for name, splits in found.items():
        seen = [split for split, _, _ in splits]
        repeated = {split for split in seen if seen.count(split) > 1}
        if repeated:
            raise InputError(
                f"two reports of the {sorted(repeated)[0]} split judged by {name}",
                "give one report per split",
            )
        out.extend((name, split, systems, report) for split, systems, report in splits)
    return out


def chosen_systems(chosen: list[tuple[str, str, dict, dict]], systems: Sequence[str] | None) -> list[str]:
    """Every system of the groups in the order met, or `systems` (each must be in a report)."""
    found: list[str] = []
    for _, _, entries, _ in chosen:
        found.extend(name for name in entries if name not in found)
    if systems is None:
        return found
    unknown = [name for name in systems if name not in found]
    if unknown:
        raise InputError(
            f"no system {unknown[0]!r} in the reports (they hold {', '.join(found)})",
            "pass some of those names",
        )
    return list(dict.fromkeys(systems))


def table_cells(
    reports: Sequence[dict],
    harmonic: bool = False,
    digits: int = 2,
    judge: str | None = None,
    systems: Sequence[str] | None = None,
):
    """(header rows, body rows, columns per group, notes): two header rows (group, column),
    one row per system, and the lines stating the rules under the table."""
    kinds = {report.get("kind", "responses") for report in reports}
    if len(kinds) > 1:
        raise InputError(
            "the reports mix single-turn and dialogue evaluations",
            "render a table of each: the --dialogues reports apart",
        )
    if kinds == {SESSIONS}:
        return session_cells(reports, digits, judge, systems)
    columns = [SHORT[d] for d in DIMENSIONS] + ["Avg"] + (["H"] if harmonic else [])
    chosen = groups(reports, judge)
    systems = chosen_systems(chosen, systems)
    titles = [f"{judge} · {SPLIT_NAMES.get(split, split)}" for judge, split, _, _ in chosen]
    head = [[""] + [title for title in titles for _ in columns], ["System"] + columns * len(chosen)]
    body = []
    for system in systems:
        cells = [system]
        for _, _, found, _ in chosen:
            entry = found.get(system) or {}
            values = [(entry.get("dimensions") or {}).get(d) for d in DIMENSIONS] + [entry.get("avg")]
            if harmonic:
                values.append(entry.get("harmonic"))
            cells.extend("—" if v is None else f"{v:.{digits}f}" for v in values)
        body.append(cells)
    return head, body, len(columns), notes(chosen, systems, titles)


# --- the multi-turn table (reports of `evaluate --dialogues`) ---------------------------------------

SESSIONS = "dialogues"  # the report kind (evaluation/dialogues.py)
SESSION_COLUMNS = ("Final", "Met %", "H", "n")
# With the behaviour judge (evaluate --dialogues --behaviours, the default): the session reward
# the safety term leaves, risky and protective behaviours per 1,000 words, the tracking rate.
SAFETY_COLUMNS = ("Reward", "Risky/1k", "Prot/1k", "Track %")
# Per seeker style (reports whose dialogues include a non-cooperative style): the drop from
# cooperative with its 95% interval and n, per metric.
DROP_COLUMNS = (("final_emotion", "Δ Final"), ("harmonic", "Δ H"), ("reward", "Δ Reward"))


def _number(value, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _session_values(entry: dict, safety: bool, digits: int) -> list[str]:
    met = entry.get("need_met_share")
    values = [entry.get("final_emotion"), None if met is None else 100 * met, entry.get("harmonic")]
    if safety:
        track = entry.get("tracking_rate")
        values += [entry.get("reward"), entry.get("risky_per_1k"), entry.get("protective_per_1k"),
                   None if track is None else 100 * track]  # fmt: skip
    return [*(_number(v, digits) for v in values), str(entry.get("n", 0))]


def session_cells(reports: Sequence[dict], digits: int, judge: str | None, systems: Sequence[str] | None):
    """Systems x splits: the mean final emotion (0-100), the share of dialogues whose hidden
    need was met (%), mean H of the session's PERM scores, with the behaviour judge the session
    reward, behaviours per 1,000 words and the tracking rate, n dialogues; under it the rules.
    Reports with hard-to-help seekers: supporters x styles instead (seeker_cells)."""
    chosen = groups(reports, judge)
    if any("seekers" in report for _, _, _, report in chosen):
        return seeker_cells(chosen, digits, systems)
    systems = chosen_systems(chosen, systems)
    titles = [f"{name} · {SPLIT_NAMES.get(split, split)}" for name, split, _, _ in chosen]
    safety = any(report.get("behaviours") for _, _, _, report in chosen)
    columns = (*SESSION_COLUMNS[:-1], *(SAFETY_COLUMNS if safety else ()), SESSION_COLUMNS[-1])
    head = [[""] + [title for title in titles for _ in columns], ["System", *columns * len(chosen)]]
    body = []
    for system in systems:
        cells = [system]
        for _, _, found, _ in chosen:
            cells.extend(_session_values(found.get(system) or {}, safety, digits))
        body.append(cells)
    return head, body, len(columns), session_notes(chosen, systems, titles)


def _drop_text(drop: dict | None, digits: int) -> str:
    if not drop or drop.get("mean") is None:
        return "—"
    return f"{drop['mean']:+.{digits}f} [{drop['low']:+.{digits}f}, {drop['high']:+.{digits}f}] n={drop['n']}"


def seeker_cells(chosen, digits: int, supporters: Sequence[str] | None):
    """Supporters x seeker styles, per split: the session figures and the drop from
    cooperative (style - cooperative) with its 95% interval and n, each on the queries every
    system was scored on (the report's common set); under it the rules and what was left out."""
    titles = [f"{name} · {SPLIT_NAMES.get(split, split)}" for name, split, _, _ in chosen]
    safety = any(report.get("behaviours") for _, _, _, report in chosen)
    columns = (*SESSION_COLUMNS[:-1], *(SAFETY_COLUMNS if safety else ()), SESSION_COLUMNS[-1],
               *(title for _, title in DROP_COLUMNS))  # fmt: skip
    rows: list[tuple[str, str]] = []
    for _, _, _, report in chosen:
        for name, styles in ((report.get("seekers") or {}).get("supporters") or {}).items():
            rows.extend((name, style) for style in styles if (name, style) not in rows)
    if supporters is not None:
        known = {name for name, _ in rows}
        unknown = [name for name in supporters if name not in known]
        if unknown:
            raise InputError(
                f"no supporter {unknown[0]!r} in the reports (they hold {', '.join(sorted(known))})",
                "pass some of those names",
            )
        rows = [(name, style) for wanted in supporters for name, style in rows if name == wanted]
    head = [
        [""] + [title for title in titles for _ in columns],
        ["Supporter · seeker", *columns * len(chosen)],
    ]
    body = []
    for name, style in rows:
        cells = [f"{name} · {style}"]
        for _, _, _, report in chosen:
            entry = ((report.get("seekers") or {}).get("supporters") or {}).get(name, {}).get(style) or {}
            cells.extend(_session_values(entry, safety, digits))
            drops = entry.get("drop") or {}
            cells.extend(_drop_text(drops.get(metric), digits) for metric, _ in DROP_COLUMNS)
        body.append(cells)
    systems = chosen_systems(chosen, None)
    under = session_notes(chosen, systems, titles)
    for title, (_, _, _, report) in zip(titles, chosen, strict=True):
        found = report.get("seekers") or {}
        if found.get("rule"):
            under.insert(-1, f"{title}: {found['rule']}.")
        for name, style in rows:
            entry = (found.get("supporters") or {}).get(name, {}).get(style) or {}
            unpaired = {k: v for k, v in (entry.get("unpaired") or {}).items() if v}
            if unpaired:
                under.insert(-1, f"{title}: {name} · {style}: unpaired queries (not in its drop): "
                             + ", ".join(f"{k} {v}" for k, v in unpaired.items()) + ".")  # fmt: skip
    return head, body, len(columns), under


def session_notes(chosen, systems: list[str], titles: list[str]) -> list[str]:
    lines = []
    for title, (_, _, entries, report) in zip(titles, chosen, strict=True):
        temperatures = ", ".join(f"{k} {v:g}" for k, v in (report.get("temperatures") or {}).items())
        cells = [entries[name] for name in systems if name in entries]
        simulators = sorted({m for entry in cells for m in entry.get("simulator_models", ())})
        ended = Counter()
        for entry in cells:
            ended.update(entry.get("ended_by") or {})
        lines.append(
            f"{title}: judge {report.get('mode', 'fixed')} over the supporter's whole side"
            + (f" at temperature {temperatures}" if temperatures else "")
            + f"; layout {report.get('layout')}; unreadable judgments: "
            + f"{UNREADABLE_TEXT.get(report.get('unreadable_rule'), report.get('unreadable_rule'))}"
            + f"; simulated user {', '.join(simulators) or 'unknown'}, checked per turn by "
            + f"{', '.join(report.get('simulator_rules') or ())}"
            + (
                f"; not checked: {', '.join(report['simulator_rules_not_run'])}"
                if report.get("simulator_rules_not_run")
                else ""
            )  # fmt: skip
            + "; ended by "
            + (", ".join(f"{k} {v}" for k, v in sorted(ended.items())) or "none")
            + "; queries without a dialogue: "
            + (
                ", ".join(
                    f"{n} {entries[n].get('queries_without_dialogue', 0)}" for n in systems if n in entries
                )
            )
            + "."
        )
        if report.get("comparable") is False:
            lines.append(f"{title}: NOT COMPARABLE: {report.get('same_queries_rule')}: the systems are "
                         "scored on different dialogues.")  # fmt: skip
        elif "same_queries_rule" in report:
            lines.append(f"{title}: every system scored on {report['same_queries_rule']}.")
        for name in systems:
            for dropped in (entries.get(name) or {}).get("left_out", ()):
                lines.append(f"{title}: {name} left out {dropped['dialogue_id']}: {dropped['reason']}.")
    for title, (_, _, entries, report) in zip(titles, chosen, strict=True):
        if report.get("behaviours"):
            lines.append(f"{title}: " + behaviour_note(report, [entries[n] for n in systems if n in entries]))
    lines.append("Final: mean final emotion of the simulated user (0-100, starts at 40); Met %: dialogues "
                 "whose hidden need was met; H: harmonic mean of the session's PERM scores / 5.")  # fmt: skip
    return lines


# How real the simulated seekers are (the report's `realism`, instruments/realism.py's
# seeker_realism): a second table after the multi-turn one, keyed by the same systems, one column
# group per report (split); the figures do not depend on the judge. Markdown and LaTeX pair the
# simulated and the real value in one cell (sim/real) to stay within 100 columns; CSV gives each
# its own column, with every n, on the rows of the multi-turn table.
REALISM_COLUMNS = ("Len ratio", "Words sim/real", "Polite % sim/real", "Q % sim/real", "Len CV sim/real",
                   "Relief@2 %", "Δemo/turn", "Users")  # fmt: skip
REALISM_CSV_COLUMNS = ("Len ratio", "Words sim", "Words real", "Polite % sim", "Polite % real", "Q % sim",
                       "Q % real", "Len CV sim", "Len CV real", "Relief@2 %", "Δemo/turn", "Users",
                       "Sim turns", "Real messages", "Dialogues", "Turns with change")  # fmt: skip
REALISM_TITLE = "Seekers"
PAIRED = ("Words", "Polite %", "Q %", "Len CV")  # simulated/real in one Markdown or LaTeX cell


def _realism_groups(reports: Sequence[dict], judge: str | None) -> list[tuple[str, dict]]:
    """(title, report) per report that holds a realism figure, in the order of the groups."""
    out: list[tuple[str, dict]] = []
    for _, split, _, report in groups(reports, judge):
        if any(report is seen for _, seen in out):
            continue
        if any(((entry or {}).get("realism") or {}).get("users") for entry in report["systems"].values()):
            out.append((f"{REALISM_TITLE} · {SPLIT_NAMES.get(split, split)}", report))
    return out


def _realism_figures(real: dict | None, digits: int) -> dict[str, str]:
    """A system's realism as text per CSV column ("—" where the rule could not be applied)."""
    if not real or not real.get("users"):
        return dict.fromkeys(REALISM_CSV_COLUMNS, "—")
    sim, own = real["simulated"], real["real"]
    change = real.get("mean_change_per_turn")
    relief = real.get("relief_by_turn_2")
    return {
        "Len ratio": _number(real.get("length_ratio"), digits),
        "Words sim": _number(sim.get("words"), 1),
        "Words real": _number(own.get("words"), 1),
        "Polite % sim": _percent(sim.get("politeness")),
        "Polite % real": _percent(own.get("politeness")),
        "Q % sim": _percent(sim.get("question_rate")),
        "Q % real": _percent(own.get("question_rate")),
        "Len CV sim": _number(sim.get("length_cv_across_users"), digits),
        "Len CV real": _number(own.get("length_cv_across_users"), digits),
        "Relief@2 %": _percent(relief),
        "Δemo/turn": "—" if change is None else f"{change:+.1f}",
        "Users": str(real["users"]),
        "Sim turns": str(sim.get("messages", 0)),
        "Real messages": str(own.get("messages", 0)),
        "Dialogues": str(real.get("dialogues", 0)),
        "Turns with change": str(real.get("turns_with_change", 0)),
    }


def _percent(share) -> str:
    return "—" if share is None else f"{100 * share:.0f}"


def realism_cells(reports: Sequence[dict], digits: int, judge: str | None, systems: Sequence[str] | None):
    """How real the seekers are, per system x split: (header rows, body rows, columns per group,
    notes, CSV columns, CSV cells per system), or None when no report holds the figures (a
    report from before them)."""
    found = _realism_groups(reports, judge)
    if not found:
        return None
    systems = chosen_systems(groups(reports, judge), systems)
    titles = [title for title, _ in found]
    head = [[""] + [t for t in titles for _ in REALISM_COLUMNS], ["System", *REALISM_COLUMNS * len(found)]]
    body, flat = [], {}
    for system in systems:
        cells, flat[system] = [system], []
        for _, report in found:
            f = _realism_figures((report["systems"].get(system) or {}).get("realism"), digits)
            cells += [f["Len ratio"], *(f"{f[k + ' sim']}/{f[k + ' real']}" for k in PAIRED),
                      f["Relief@2 %"], f["Δemo/turn"], f["Users"]]  # fmt: skip
            flat[system] += [f[column] for column in REALISM_CSV_COLUMNS]
        body.append(cells)
    csv_head = [f"{title} {column}" for title in titles for column in REALISM_CSV_COLUMNS]
    under = []
    for title, report in found:
        counts = []
        for system in systems:
            real = (report["systems"].get(system) or {}).get("realism") or {}
            if real.get("users"):
                counts.append(
                    f"{system} {real['users']} users, {real['simulated']['messages']} simulated turns "
                    f"against {real['real']['messages']} real messages, "
                    f"{real.get('dialogues', 0)} dialogues, {real.get('turns_with_change', 0)} turns "
                    "with an emotion change"
                )
        rule = next(
            (r["realism"].get("rule") for r in report["systems"].values() if (r or {}).get("realism")), ""
        )
        under.append(f"{title}: {rule}; n: " + "; ".join(counts) + ".")
    under.append(
        "Seekers (how real the simulated users are, beside Final): sim/real: the simulated user turns, then "
        "the same users' real messages; Len ratio: words per simulated turn / words per real message; "
        "Polite %, Q %: messages with a politeness marker, with a question mark; Len CV: coefficient of "
        "variation across users of their mean words per message (lower: more alike); Relief@2 %: dialogues "
        "whose need was met by supporter turn 2; Δemo/turn: mean emotion change per simulated turn; Users: "
        "users with both simulated turns and real messages."
    )
    return head, body, len(REALISM_COLUMNS), under, csv_head, flat


def behaviour_note(report: dict, entries: Sequence[dict]) -> str:
    """How the behaviour columns were made: the lists, the quote check, the tracking rule, the
    reward's safety term, with n."""
    lists = report.get("behaviour_lists") or {}
    turns = dropped = by_rule = by_judge = 0
    for entry in entries:
        found = entry.get("behaviours") or {}
        turns += found.get("turns", 0)
        dropped += found.get("dropped_quotes", 0)
        by_rule += (found.get("tracking") or {}).get("by_rule", 0)
        by_judge += (found.get("tracking") or {}).get("by_judge", 0)
    rule = (report.get("safety_rule") or {}).get("text", "")
    return (
        f"Risky/1k, Prot/1k: behaviours per 1,000 words of the supporter's text, judged per supporter turn "
        f"({turns} turns), each with a quote of the turn; risky: {', '.join(lists.get('risky', ()))}; "
        f"protective: {', '.join(lists.get('protective', ()))}; behaviours dropped, their quote not in "
        f"the turn: {dropped}. Track %: supporter turns that acknowledge the emotion the user just "
        f"showed before anything else ({by_rule} decided by rule, {by_judge} by the judge). Reward: {rule}."
    )


# How a report's rules read under a table; a report older than the rule's key predates it.
LAYOUT_TEXT = {
    "paper": "paper (each request holds only its dimension's standard, before the context)",
    "shared": "shared (the three standards in a task all requests share; the dimension named last)",
    None: "shared (a report from before layouts were named)",
}
MISSING_TEXT = {
    "skip": "skip (the authors': what their eval.py judges is judged, the rest left out of the means)",
    "floor": "floor (a query without a visible reply scores 1 and counts)",
}
UNREADABLE_TEXT = {
    "authors": "authors (a fixed judgment drops that dimension of that query; a dynamic one counts 3 of 5)",
    "fail": "fail (the query fails and is left out; an unreadable sample of k is left out)",
    None: "fail (a report from before the rule was named)",
}


def notes(chosen: list[tuple[str, str, dict, dict]], systems: list[str], titles: list[str]) -> list[str]:
    """The lines under a table: the rules of each report (once when all share them), then n
    and the queries the missing rule touched, per group (per cell where the systems differ)."""
    rules = []
    for title, (_, _, _, report) in zip(titles, chosen, strict=True):
        missing = report.get("missing_rule", "floor")
        temperatures = ", ".join(f"{k} {v:g}" for k, v in (report.get("temperatures") or {}).items())
        rules.append(
            (
                title,
                f"judge {report.get('mode', 'fixed')}"
                + (f" at temperature {temperatures}" if temperatures else "")
                + f"; layout {LAYOUT_TEXT.get(report.get('layout'), report.get('layout'))}"
                + f"; missing responses: {MISSING_TEXT.get(missing, missing)}"
                + f"; unreadable judgments: "
                f"{UNREADABLE_TEXT.get(report.get('unreadable_rule'), report.get('unreadable_rule'))}.",
            )
        )
    lines = (
        [f"Rules: {rules[0][1]}"]
        if len({text for _, text in rules}) == 1
        else [f"Rules, {title}: {text}" for title, text in rules]
    )
    for title, (_, _, entries, report) in zip(titles, chosen, strict=True):
        floor = report.get("missing_rule", "floor") == "floor"
        cells = [(name, entries[name]) for name in systems if name in entries]
        counts = {_n_text(entry) for _, entry in cells}
        n = (
            f"n = {counts.pop()} in every cell"
            if len(counts) == 1
            else "n: " + ", ".join(f"{name} {_n_text(entry)}" for name, entry in cells)
        )
        touched = [(name, entry.get("missing", 0) + entry.get("empty", 0)) for name, entry in cells]
        what = "floors counted" if floor else "left out (no response)"
        unread = sum(entry.get("unreadable_queries", 0) for _, entry in cells)
        lines.append(
            f"{title}: {n}; {what}: "
            + (", ".join(f"{name} {count}" for name, count in touched if count) or "none")
            + (f"; queries with an unreadable judgment: {unread}" if unread else "")
            + "."
        )
    return lines


def _n_text(entry: dict) -> str:
    """A cell's n, with the dimensions' own n where an unreadable judgment left one out."""
    n = str(entry.get("n", 0))
    by_dimension = entry.get("n_by_dimension")
    if by_dimension:
        n += " (" + ", ".join(f"{SHORT[d]} {by_dimension[d]}" for d in DIMENSIONS) + ")"
    return n


def render(
    reports: Sequence[dict],
    fmt: str = "markdown",
    *,
    harmonic: bool = False,
    digits: int = 2,
    judge: str | None = None,
    systems: Sequence[str] | None = None,
) -> str:
    if fmt not in FORMATS:
        raise InputError(f"--format takes {', '.join(FORMATS)}, not {fmt!r}")
    head, body, width, under = table_cells(reports, harmonic, digits, judge, systems)
    real = None
    if _kind(reports) == SESSIONS:
        # with hard-to-help seekers the rows are supporter · style and `systems` names supporters;
        # the realism stays per system (dialogues file)
        styled = any("seekers" in report for report in reports)
        real = realism_cells(reports, digits, judge, None if styled else systems)
    if real is not None:
        under = [*under, *real[3]]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        extra = real[4] if real is not None else []
        writer.writerow(
            ["system", *(f"{g} {c}" for g, c in zip(head[0][1:], head[1][1:], strict=True)), *extra]
        )
        flat = real[5] if real is not None else {}
        for row in body:
            writer.writerow([*row, *flat.get(row[0], [""] * len(extra))])
        # a system that is not a row (the supporter · style rows of hard-to-help seekers): its own
        # row, the multi-turn columns empty
        rows = {row[0] for row in body}
        writer.writerows(
            [name, *[""] * (len(head[1]) - 1), *cells] for name, cells in flat.items() if name not in rows
        )
        return out.getvalue() + "".join(f"# {line}\n" for line in under)
    if fmt == "markdown":
        lines = _md_table(head, body)
        if real is not None:
            lines += ["", *_md_table(real[0], real[1])]
        lines += ["", *(f"{line}  " for line in under[:-1]), under[-1]]
        return "\n".join(lines) + "\n"
    lines = _tex_table(head, body, width)
    if real is not None:
        lines += ["", "\\medskip", *_tex_table(real[0], real[1], real[2])]
    lines += [
        "",
        "\\par\\smallskip\\noindent{\\footnotesize " + " \\\\\n".join(_tex(line) for line in under) + "}",
    ]
    return "\n".join(lines).replace("—", "--") + "\n"


def _kind(reports: Sequence[dict]) -> str:
    return next(iter({report.get("kind", "responses") for report in reports}), "responses")


def _md_table(head, body) -> list[str]:
    names = ["System", *(f"{g} {c}" for g, c in zip(head[0][1:], head[1][1:], strict=True))]
    lines = ["| " + " | ".join(_md(name) for name in names) + " |", "|" + "---|" + "---:|" * (len(names) - 1)]
    return lines + ["| " + " | ".join(_md(cell) for cell in row) + " |" for row in body]


def _tex_table(head, body, width: int) -> list[str]:
    groups_row = head[0][1::width]
    spec = "l" + ("|" + "c" * width) * len(groups_row)
    return [
        f"\\begin{{tabular}}{{{spec}}}",
        "\\toprule",
        " & " + " & ".join(f"\\multicolumn{{{width}}}{{c}}{{{_tex(g)}}}" for g in groups_row) + " \\\\",
        " & ".join(_tex(cell) for cell in head[1]) + " \\\\",
        "\\midrule",
        *(" & ".join(_tex(cell) for cell in row) + " \\\\" for row in body),
        "\\bottomrule",
        "\\end{tabular}",
    ]


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _tex(text: str) -> str:
    for char in "\\&%$#_{}":
        text = text.replace(char, "\\" + char if char != "\\" else "\\textbackslash{}")
    return text.replace("·", "$\\cdot$").replace("Δ", "$\\Delta$")


def write_table(
    reports: Sequence[Path],
    output: Path | None,
    fmt: str,
    *,
    harmonic: bool = False,
    digits: int = 2,
    judge: str | None = None,
    systems: Sequence[str] | None = None,
) -> str:
    if not reports:
        raise InputError("no report given", "pass --report FILE for each split (random and ood)")
    read = [read_report(Path(p)) for p in reports]
    check_current(read, [Path(p) for p in reports])
    text = render(
        read,
        fmt,
        harmonic=harmonic,
        digits=digits,
        judge=judge,
        systems=systems,
    )
    if output is not None:
        from personaemp.io import atomic_output

        with atomic_output(Path(output)) as handle:
            handle.write(text.encode("utf-8"))
    return text


# --- from options (the command and pe.*) ----------------------------------------------------------


def from_options(options, console) -> str:
    """`personaemp table` on its options: the table's text."""
    return write_table(
        [Path(p) for p in options.reports], options.output, options.format,
        harmonic=options.harmonic, digits=options.digits, judge=options.judge, systems=options.systems,
    )  # fmt: skip
