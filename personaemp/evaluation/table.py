"""`personaemp table`: the paper's Table 1 from `evaluate` reports (no LLM).

Rows are the systems; column groups are judge x split (each report is one split, judged by
one judge or a panel); each group holds Res, Exp, Rec and Avg on the 1-5 scale (Avg: the
mean of the unrounded dimension means, as the report keeps it), and H (0-1) on request.
Written as Markdown, CSV or LaTeX.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path

from personaemp.errors import InputError
from personaemp.records import DIMENSIONS

FORMATS = ("markdown", "csv", "latex")
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


def groups(reports: Sequence[dict]) -> list[tuple[str, str, dict]]:
    """(judge, split, systems) per column group: judge-major, splits in the order given."""
    found: dict[str, list[tuple[str, dict]]] = {}
    for report in reports:
        judges = report.get("judges") or {
            report.get("judge_model") or "judge": {"systems": report["systems"]}
        }
        for name, judged in judges.items():
            found.setdefault(name, []).append((report["split"], judged["systems"]))
    out = []
    for name, splits in found.items():
        seen = [split for split, _ in splits]
        repeated = {split for split in seen if seen.count(split) > 1}
        if repeated:
            raise InputError(
                f"two reports of the {sorted(repeated)[0]} split judged by {name}",
                "give one report per split",
            )
        out.extend((name, split, systems) for split, systems in splits)
    return out


def table_cells(reports: Sequence[dict], harmonic: bool = False, digits: int = 2):
    """(header rows, body rows): two header rows (group, column) and one row per system."""
    columns = [SHORT[d] for d in DIMENSIONS] + ["Avg"] + (["H"] if harmonic else [])
    chosen = groups(reports)
    systems: list[str] = []
    for _, _, found in chosen:
        systems.extend(name for name in found if name not in systems)
    titles = [f"{judge} · {SPLIT_NAMES.get(split, split)}" for judge, split, _ in chosen]
    head = [[""] + [title for title in titles for _ in columns], ["System"] + columns * len(chosen)]
    body = []
    for system in systems:
        cells = [system]
        for _, _, found in chosen:
            entry = found.get(system) or {}
            values = [(entry.get("dimensions") or {}).get(d) for d in DIMENSIONS] + [entry.get("avg")]
            if harmonic:
                values.append(entry.get("harmonic"))
            cells.extend("—" if v is None else f"{v:.{digits}f}" for v in values)
        body.append(cells)
    return head, body, len(columns)


def render(reports: Sequence[dict], fmt: str = "markdown", *, harmonic: bool = False, digits: int = 2) -> str:
    if fmt not in FORMATS:
        raise InputError(f"--format takes {', '.join(FORMATS)}, not {fmt!r}")
    head, body, width = table_cells(reports, harmonic, digits)
    groups_row = head[0][1::width]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["system", *(f"{g} {c}" for g, c in zip(head[0][1:], head[1][1:], strict=True))])
        writer.writerows(body)
        return out.getvalue()
    if fmt == "markdown":
        names = ["System", *(f"{g} {c}" for g, c in zip(head[0][1:], head[1][1:], strict=True))]
        lines = ["| " + " | ".join(names) + " |", "|" + "---|" + "---:|" * (len(names) - 1)]
        lines += ["| " + " | ".join(_md(cell) for cell in row) + " |" for row in body]
        return "\n".join(lines) + "\n"
    spec = "l" + ("|" + "c" * width) * len(groups_row)
    lines = [
        f"\\begin{{tabular}}{{{spec}}}",
        "\\toprule",
        " & " + " & ".join(f"\\multicolumn{{{width}}}{{c}}{{{_tex(g)}}}" for g in groups_row) + " \\\\",
        " & ".join(_tex(cell) for cell in head[1]) + " \\\\",
        "\\midrule",
        *(" & ".join(_tex(cell) for cell in row) + " \\\\" for row in body),
        "\\bottomrule",
        "\\end{tabular}",
    ]
    return "\n".join(lines).replace("—", "--") + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _tex(text: str) -> str:
    for char in "\\&%$#_{}":
        text = text.replace(char, "\\" + char if char != "\\" else "\\textbackslash{}")
    return text.replace("·", "$\\cdot$")


def write_table(
    reports: Sequence[Path], output: Path | None, fmt: str, *, harmonic: bool = False, digits: int = 2
) -> str:
    if not reports:
        raise InputError("no report given", "pass --report FILE for each split (random and ood)")
    text = render([read_report(Path(p)) for p in reports], fmt, harmonic=harmonic, digits=digits)
    if output is not None:
        from personaemp.io import atomic_output

        with atomic_output(Path(output)) as handle:
            handle.write(text.encode("utf-8"))
    return text
