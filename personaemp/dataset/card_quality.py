"""The dataset card's "Quality" section: how often the build's LLM judge agrees with people,
from the agreement report of `personaemp agreement` (personaemp.review.agreement)."""

from __future__ import annotations

from typing import Any

from personaemp.summaries import interval_text, judges_text, not_scored_text


def quality_section(report: dict[str, Any] | None, table) -> str:
    """The card's "Quality" section, from an agreement report (None: no labels exist)."""
    out = ["## Quality", ""]
    labels = (report or {}).get("labels") or {}
    if not report or not labels.get("events"):
        out.append(
            "No human labels exist for this build: how often its LLM judge is right is not "
            "measured (`personaemp review`, then `personaemp agreement`)."
        )
        return "\n".join(out)
    reviewers, imported = labels["reviewers"], labels.get("label_studio_reviewers", 0)
    tools = [
        ("on the review page (`personaemp review`)", len(reviewers) > imported),
        ("in Label Studio (imported by `personaemp review --import-label-studio`)", imported),
    ]
    out.append(
        f"{len(reviewers)} reviewer{'s' if len(reviewers) != 1 else ''} labelled "
        f"{labels['queries_labelled']} of the {report['queries']} generated queries "
        f"{' and '.join(tool for tool, used in tools if used)} (a sample balanced over category, "
        "language and check outcomes). Kappa is "
        "Cohen's, with a bootstrap 95% interval over queries; raw agreement is shown beside what "
        "always giving the most common answer would score."
    )
    out.append("")
    rows = []
    for check, figures in report["judge_vs_people"].items():
        judges = ((report.get("judge_vs_judge") or {}).get("checks") or {}).get(check) or {}
        raw = (
            "—" if figures["agreement"] is None else f"{figures['agreement']:.1%} ({figures['constant']:.1%})"
        )
        rows.append(
            [
                check, figures["pairs"], interval_text(figures, "kappa"), raw,
                interval_text(figures, "precision", True),
                "—" if figures["apparent_pass"] is None else f"{figures['apparent_pass']:.1%}",
                interval_text(figures, "corrected_pass", True), judges_text(judges),
            ]
        )  # fmt: skip
    out.append(
        table(
            [
                "LLM check", "labelled", "judge vs people κ", "agreement (constant)", "precision of passes",
                "judge's pass share", "corrected pass share", "judge vs judge κ",
            ],
            rows,
        )
    )  # fmt: skip
    out.append("")
    acceptance, traits = report["acceptance"], report["traits"]
    lines = []
    if acceptance["pairs"]:
        lines.append(
            f"- Of the accepted queries people labelled, {interval_text(acceptance, 'precision', True)} were "
            "accepted by them (Wilson interval); acceptance κ, build vs people: "
            f"{interval_text(acceptance, 'kappa')}."
        )
    if traits["labelled"]:
        lines.append(
            f"- Persona traits people found supported by their cited memories: "
            f"{interval_text(traits, 'share', True)} of {traits['labelled']}."
        )
    people = (report.get("people_vs_people") or {}).get("fields") or {}
    if people:
        shown = ", ".join(
            f"{kind} {interval_text(f, 'kappa')} (n={f['pairs']})" for kind, f in people.items()
        )
        lines.append(f"- People vs people (queries two reviewers labelled), κ: {shown}.")
    second = report.get("judge_vs_judge")
    if second:
        lines.append(f"- Second judge: `{second.get('model') or 'unknown'}` on {second['queries']} queries.")
    if not_scored_text(report):
        lines.append(f"- Not scored: {not_scored_text(report)}.")
    lines.append(
        "- The corrected pass share applies the judge's sensitivity and specificity against "
        "people to its pass share over every generated query (Rogan–Gladen)."
    )
    out += lines
    return "\n".join(out)
