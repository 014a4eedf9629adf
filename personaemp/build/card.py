"""The dataset card (README.md of the Hub repository), written from this run's real figures."""

from __future__ import annotations

import json
from typing import Any

from personaemp.build.stats import FIGURE_DIR, STATS_FILE
from personaemp.records import BIG_FIVE
from personaemp.summaries import interval_text, judges_text, not_scored_text

QUALITY_PLOT = "agreement.png"  # the agreement plot among the card's figures

CITATIONS = """\
- **PersonaEmp** — Zheng et al., *From Empathy to Personalized Empathy: Adapting Empathetic
  Strategies to Individual Users* (2026), arXiv:2606.00728: the dataset design this build
  follows.
- **AlpsBench** — long-term user–LLM dialogues with human-verified memory annotations;
  GitHub `ThisIsCosine/AlpsBench`, Hugging Face `Cosineyx/Alpsbench` (ODC-BY).
- **WildChat** — Zhao et al., *WildChat: 1M ChatGPT Interaction Logs in the Wild*,
  ICLR 2024 (ODC-BY): the source of AlpsBench's dialogues.
"""


def _front_matter(facts: dict[str, Any]) -> str:
    languages = [code for code, _ in facts["languages"].most_common() if code][:20]
    configs = []
    for setting, paths in facts["data_files"].items():
        # Exact names, not `<split>-*`: they carry the digest that keys the `datasets` cache.
        files = "\n".join(f"  - split: {split}\n    path: {paths[split]}" for split in ("train", "test"))
        configs.append(f"- config_name: {setting}\n  data_files:\n{files}")
    return "\n".join(
        [
            "---",
            "license: odc-by",
            f"language: {json.dumps(languages)}",
            "task_categories:\n- text-generation",
            "tags:\n- empathy\n- personalization\n- persona\n- big-five\n- synthetic",
            "pretty_name: PersonaEmp (rebuilt with personaemp)",
            "configs:",
            *configs,
            "---",
        ]
    )


def cell(value: Any) -> str:
    """A value as one Markdown table cell: a `|` would end the cell (also inside code), a
    line break the row."""
    return " ".join(str(value).replace("|", "\\|").split())


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(cell(name) for name in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def _count(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _counts(value: Any) -> str:
    items = value.items() if isinstance(value, dict) else ()
    return ", ".join(f"{name} {count}" for name, count in items)


def _funnel(facts: dict[str, Any]) -> str:
    """One line per stage, from the reports found by following this build's files back.

    Reports are read leniently (a figure that is missing is shown as 0), so an older
    report never stops a push.
    """
    parts = []
    report = facts.get("filter")
    if report:
        dropped = _counts(report.get("dropped")) or "none"
        parts.append(
            f"- **filter**: {_count(report.get('users_in'))} users read, {_count(report.get('kept'))} kept "
            f"(dropped: {dropped}); {_count(report.get('flagged_memories_dropped'))} of "
            f"{_count(report.get('memories_in'))} memories were annotator-flagged false memories and "
            "were never used."
        )
    stages = (facts.get("run") or {}).get("stages", {})
    split = facts.get("split")
    for name in ("infer-persona", "gen-queries"):
        stage = stages.get(name)
        if isinstance(stage, dict) and stage.get("full", True):
            done = _count(stage.get("done")) + _count(stage.get("done_before"))
            failed = _count(stage.get("failed")) + _count(stage.get("failed_before"))
            kinds = _counts(stage.get("failures_by_kind")) or "none"
            parts.append(
                f"- **{name}**: {_count(stage.get('units'))} users, {done} done, {failed} failed ({kinds}); "
                f"model `{stage.get('model', 'unknown')}` ({stage.get('endpoint_kind', 'unknown')})."
                + _embedded(stage.get("model"))
            )
    if split:
        left = ", ".join(f"{reason} {count}" for reason, count in sorted(split["left_out"].items()))
        parts.append(
            f"- **split**: {split['users_in']} users read, left out: {left or 'none'} "
            "(users need a Big Five profile and at least one accepted query)."
        )
    return "\n".join(parts) or "- (the stage reports of this build were not found)"


def _image(name: str, text: str, figures: list[str]) -> list[str]:
    """A relative Markdown image link (the Hub shows it from the repository), if drawn."""
    path = f"{FIGURE_DIR}/{name}"
    return [f"![{text}]({path})", ""] if path in figures else []


def stats_section(stats: dict[str, Any], figures: list[str]) -> str:
    """The card's statistics: every figure from `stats` (personaemp.build.stats.compute_stats,
    the dict published as stats.json beside the card), and its plots (`figures`: their paths)."""
    out = ["## Statistics", "", f"The same figures are in `{STATS_FILE}` (from `personaemp stats`).", ""]
    funnel = stats.get("funnel") or {}
    if funnel.get("users"):
        out += _image("funnel.png", "Users and queries through the build", figures)
        rows = [["users", s["stage"], s["count"]] for s in funnel["users"]]
        rows += [["queries", s["stage"], s["count"]] for s in funnel.get("queries", [])]
        out += [_table(["unit", "stage", "count"], rows), ""]
    if "big_five" in stats or stats.get("splits"):
        out += ["### Big Five levels (users)", ""]
        out += _image("big_five.png", "Big Five levels of all users", figures)
        rows = []
        if "big_five" in stats:
            levels = stats["big_five"]["levels"]
            rows += [["all", "", stats["big_five"]["users"], t, *levels[t].values()] for t in BIG_FIVE]
        for setting, parts in (stats.get("splits") or {}).items():
            out += _image(f"big_five_{setting}.png", f"Big Five levels, {setting} train vs test", figures)
            for part, data in parts.items():
                rows += [[setting, part, data["users"], t, *data["levels"][t].values()] for t in BIG_FIVE]
        out += [_table(["users", "split", "count", "trait", "low", "medium", "high"], rows), ""]
    queries = stats.get("queries")
    if queries:
        out += ["### Queries", ""]
        out += _image("queries.png", "Queries per category, per language, per user", figures)
        out += _image("query_shape.png", "Query length and memories cited", figures)
        per_user, length, cited = queries["per_user"], queries["length"], queries["memories_cited"]
        categories = ", ".join(f"{name} {n}" for name, n in queries["categories"].items())
        languages = ", ".join(f"{code} {n}" for code, n in queries["languages"].items())
        out += [
            _table(
                ["figure", "value"],
                [
                    ["accepted queries", queries["accepted"]],
                    ["per category", categories or "none"],
                    ["per language (the user's)", languages or "none"],
                    ["per user: mean, median, min, max", _spread(per_user)],
                    ["users by accepted queries", _bins(per_user["counts"])],
                    ["length in characters: mean, median, min, max", _spread(length)],
                    ["queries by length", _bins(length["bins"])],
                    ["memories cited: mean, median, min, max", _spread(cited)],
                    ["queries by memories cited", _bins(cited["counts"])],
                ],
            ),
            "",
        ]
    checks = stats.get("checks")
    if checks:
        out += ["### Checks (every generated query, accepted or rejected)", ""]
        out += _image("checks.png", "Pass rate of each check", figures)
        rows = [
            [name, DECIDED[c.get("enforced")], c["passed"], c["of"], f"{c['rate']:.1%}"]
            for name, c in checks.items()
        ]
        out += [_table(["check", "in this build", "passed", "of", "rate"], rows), ""]
    return "\n".join(out).rstrip("\n")


DECIDED = {True: "decided acceptance", False: "recorded only", None: "not recorded"}
CHECK_MEANINGS = {
    "emotional_support": "the LLM judge: needs an emotionally intelligent answer",
    "logical_consistency": "the LLM judge: consistent with the memories and the situation",
    "role_awareness": "the LLM judge: fits the persona, written from the user's side",
    "memory_ids_valid": "the cited memories exist",
    "category_match": "the judge reads the category it was written for",
    "length_ok": "length",
    "language_match": "in the user's language",
    "not_duplicate": "no near-repeat of the user's other queries",
    "not_copied": "no long stretch of the user's own messages or memories",
}


def _names(names: list[str]) -> str:
    return ", ".join(f"`{name}`" for name in names) or "none"


def acceptance_lines(stats: dict[str, Any] | None) -> tuple[str, str]:
    """(a warning for the card's first paragraph, empty unless checks were relaxed; the
    sentence saying which checks decided acceptance), from the build's own rows."""
    acceptance = (stats or {}).get("acceptance")
    checks = (stats or {}).get("checks") or {}
    if not acceptance or not checks:
        return "", (
            "Each query records the outcome of every check (an LLM judge and deterministic "
            "checks); which of them decided acceptance is not known for this build."
        )
    relaxed = acceptance["recorded_only"]
    warning = ""
    if relaxed:
        failing, accepted = acceptance["accepted_failing_recorded_only"], acceptance["accepted"]
        warning = (
            f"**This build relaxed its checks:** {_names(relaxed)} "
            f"{'was' if len(relaxed) == 1 else 'were'} recorded but did not decide acceptance, "
            f"and {failing} of its {accepted} accepted queries failed at least one of them."
        )
    decided = [
        f"`{name}` ({CHECK_MEANINGS.get(name, name)}, {c['rate']:.1%} passed)"
        for name, c in checks.items()
        if c.get("enforced")
    ]
    only = [f"`{name}` ({c['rate']:.1%} passed)" for name, c in checks.items() if c.get("enforced") is False]
    unknown = [f"`{name}`" for name, c in checks.items() if c.get("enforced") is None]
    sentence = f"A query was accepted when it passed every one of: {'; '.join(decided) or 'none'}."
    if only:
        sentence += f" Recorded only, not required: {'; '.join(only)}."
    if unknown:
        sentence += f" Not recorded whether they decided: {', '.join(unknown)}."
    return warning, sentence


def _spread(values: dict[str, Any]) -> str:
    return ", ".join(f"{values[k]:g}" for k in ("mean", "median", "min", "max"))


def _bins(counts: dict[str, int]) -> str:
    return ", ".join(f"{name}: {n}" for name, n in counts.items()) or "none"


def render_card(
    facts: dict[str, Any],
    include_dialogue: bool,
    stats: dict[str, Any] | None = None,
    figures: list[str] | None = None,
    quality: dict[str, Any] | None = None,
) -> str:
    """The card; `quality`: the build's agreement report (personaemp.review.agreement), None
    when nobody labelled it (the card says so)."""
    sections = [_front_matter(facts), "", "# PersonaEmp (rebuilt with personaemp)", ""]
    sections.append(
        "Empathy-seeking user queries, each grounded in one real user's long-term memories "
        "and an evidence-grounded persona with Big Five levels, for training and evaluating "
        "*personalized* empathetic responses. Built with the `personaemp` toolkit from "
        "AlpsBench (long-term user–LLM dialogues from WildChat with human-verified memory "
        "annotations), following the PersonaEmp design."
    )
    warning, decided = acceptance_lines(stats)
    if warning:
        sections[-1] += " " + warning
    sections += ["", "## How it was built", "", _funnel(facts), ""]
    sections.append(
        "Persona traits and Big Five levels cite the memory ids that support them; the "
        "citations were checked in code and traits without valid evidence were dropped. " + decided
    )
    provenance = facts.get("provenance") or {}
    if provenance:
        sections += ["", "Models and prompt versions (prompt file hashes):", ""]
        for entry in provenance:
            sections.append(f"- `{entry}`")
    split = facts.get("split") or {}
    sections += ["", "## Configs and splits", ""]
    sections.append(
        "Splits are by user: no user appears in two splits of a config.\n\n"
        "- `random`: users shuffled with a seed, 9:1 train/test.\n"
        "- `ood`: users clustered on their five Big Five levels with KModes; one whole "
        "cluster is the test set, so its personality profiles never occur in train."
    )
    rows = []
    for setting, parts in facts["settings"].items():
        for name, part in parts.items():
            categories = ", ".join(f"{c} {n}" for c, n in sorted(part["categories"].items()))
            rows.append([setting, name, part["users"], part["rows"], categories])
    sections += ["", _table(["config", "split", "users", "queries", "categories"], rows)]
    for setting, details in (split.get("settings") or {}).items():
        params = {k: details[k] for k in ("seed", "test_size", "k", "holdout_cluster") if k in details}
        sections += ["", f"`{setting}` parameters: `{json.dumps(params)}`"]
        if "clusters" in details:
            cluster_rows = [
                [c["id"], c["users"], *(c["mode"][t] for t in BIG_FIVE)] for c in details["clusters"]
            ]
            sections += ["", _table(["cluster", "users", *BIG_FIVE], cluster_rows)]
            curve = ", ".join(f"k={k}: {v:g}" for k, v in details["cost_curve"].items())
            sections += ["", f"KModes cost by k: {curve}."]
    if stats is not None:
        sections += ["", stats_section(stats, figures or [])]
    sections += ["", quality_section(quality, _table)]
    if quality:
        sections += [""] + _image(QUALITY_PLOT, "Judge agreement per LLM check", figures or [])[:1]
    sections += ["", "## Schema (one row per query)", ""]
    schema = [
        ["user_id", "string", "AlpsBench user (the task1 benchmark id when the user id is empty)"],
        ["query_id", "string", "`<user_id>-q<n>`"],
        ["query", "string", "the user's message"],
        ["category", "string", "ES (emotional support), HEQ (high-EQ interaction), SS (social strategy)"],
        ["situation", "{topic, text}", "the moment the query was written for"],
        ["memory_ids", "list[string]", "memories the situation rests on"],
        ["language", "string", "ISO 639-1 code of the user's language"],
        ["persona_profile", "string", "the grounded traits as text"],
        ["persona_traits", "list[{aspect, statement, evidence}]", "traits with the memory ids citing them"],
        ["topics", "list[string]", "what the user's concerns are about"],
        ["big_five", "{openness, …: low|medium|high}", "Big Five levels"],
        ["memories", "list[{memory_id, label, value}]", "the user's memories (no dialogue text)"],
    ]
    if include_dialogue:
        schema.append(["user_turns", "list[string]", "the user's own messages from the source dialogue"])
    sections += [_table(["field", "type", "meaning"], schema)]
    sections += ["", "## License and citation", ""]
    sections.append(
        "ODC-BY 1.0 (Open Data Commons Attribution License), inherited from AlpsBench and "
        "WildChat. Keep the attribution when you redistribute. Please cite:\n"
    )
    sections.append(CITATIONS)
    sections += ["## Ethical notes", ""]
    dialogue = (
        "This build includes the users' own messages (`user_turns`), at the builder's request."
        if include_dialogue
        else "No dialogue text is published: only memories, personas and generated queries."
    )
    sections.append(
        f"- {dialogue}\n"
        "- The users are real people; memories describe their lives. Do not try to identify them.\n"
        "- Personas, Big Five levels, situations and queries are LLM-generated: they are "
        "inferences, not facts about the users, and they can be wrong.\n"
        "- Memories that AlpsBench annotators flagged as false were excluded."
    )
    return "\n".join(sections) + "\n"


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


def _embedded(model) -> str:
    """What the card says of the embedded model: which weights, their licence and origin."""
    from personaemp.llm.models import EMBEDDED

    if model != EMBEDDED.name:
        return ""
    return f" That is the embedded model, {EMBEDDED.title} ({EMBEDDED.licence}): {EMBEDDED.origin}."
