"""The dataset card (README.md of the Hub repository), written from this run's real figures."""

from __future__ import annotations

import json
from typing import Any

from personaemp.dataset.card_dialogues import (  # noqa: F401 - their import path
    behaviour_lines,
    dialogues_section,
    realism_lines,
    seekers_lines,
)
from personaemp.dataset.card_markdown import cell, count, counts, image, table  # noqa: F401 - cell: named here before
from personaemp.dataset.card_quality import quality_section
from personaemp.dataset.stats import STATS_FILE
from personaemp.records import BIG_FIVE

QUALITY_PLOT = "agreement.png"  # the agreement plot among the card's figures

PERSONAEMP_CITATION = """\
- **PersonaEmp** — Zheng et al., *From Empathy to Personalized Empathy: Adapting Empathetic
  Strategies to Individual Users* (2026), arXiv:2606.00728: the dataset design this build
  follows.
"""
ALPSBENCH_CITATIONS = """\
- **AlpsBench** — long-term user–LLM dialogues with human-verified memory annotations;
  GitHub `ThisIsCosine/AlpsBench`, Hugging Face `Cosineyx/Alpsbench` (ODC-BY).
- **WildChat** — Zhao et al., *WildChat: 1M ChatGPT Interaction Logs in the Wild*,
  ICLR 2024 (ODC-BY): the source of AlpsBench's dialogues.
"""


# What each split setting is, for the configs the build has.
SETTING_TEXT = {
    "random": "users shuffled with a seed, then split train/test",
    "ood": "users clustered on their five Big Five levels with KModes; one whole cluster is the "
    "test set, so its personality profiles never occur in train",
}


def from_log(facts: dict[str, Any]) -> bool:
    """Whether the memories came from a conversation log through extract-memories (else AlpsBench)."""
    return (facts.get("source") or {}).get("kind") == "log"


def default_config(facts: dict[str, Any]) -> str:
    """The config `load_dataset(repo)` loads: random when the build has it."""
    return next(iter(sorted(facts["data_files"], key=lambda s: s != "random")))


def _front_matter(facts: dict[str, Any]) -> str:
    languages = [code for code, _ in facts["languages"].most_common() if code][:20]
    configs = []
    for setting, paths in facts["data_files"].items():
        # Exact names, not `<split>-*`: they carry the digest that keys the `datasets` cache.
        files = "\n".join(f"  - split: {split}\n    path: {paths[split]}" for split in ("train", "test"))
        default = "\n  default: true" if setting == default_config(facts) else ""
        configs.append(f"- config_name: {setting}{default}\n  data_files:\n{files}")
    if facts.get("dialogue_files"):  # only the splits that hold dialogues
        files = "\n".join(f"  - split: {s}\n    path: {path}" for s, path in facts["dialogue_files"].items())
        configs.append(f"- config_name: dialogues\n  data_files:\n{files}")
    return "\n".join(
        [
            "---",
            # A user's log comes with its own terms, which the builder states (see the card).
            f"license: {'other' if from_log(facts) else 'odc-by'}",
            f"language: {json.dumps(languages)}",
            "task_categories:\n- text-generation",
            "tags:\n- empathy\n- personalization\n- persona\n- big-five\n- synthetic",
            "pretty_name: PersonaEmp (rebuilt with personaemp)",
            "configs:",
            *configs,
            "---",
        ]
    )


def _funnel(facts: dict[str, Any]) -> str:
    """One line per stage, from the reports found by following this build's files back.

    Reports are read leniently (a figure that is missing is shown as 0), so an older
    report never stops a push.
    """
    parts = []
    source = facts.get("source") or {}
    extract = source.get("run")
    if extract:
        done = count(extract.get("done")) + count(extract.get("done_before"))
        failed = count(extract.get("failed")) + count(extract.get("failed_before"))
        parts.append(
            f"- **extract-memories**: {count(extract.get('units'))} of the "
            f"{source.get('users_in_log', 0)} users read from the log, {done} done, {failed} failed "
            f"({counts(extract.get('failures_by_kind')) or 'none'}); "
            f"model `{extract.get('model', 'unknown')}` ({extract.get('endpoint_kind', 'unknown')})."
            + _embedded(extract.get("model"))
        )
    report = facts.get("filter")
    if report:
        dropped = counts(report.get("dropped")) or "none"
        flagged = count(report.get("flagged_memories_dropped"))
        parts.append(
            f"- **filter**: {count(report.get('users_in'))} users read, {count(report.get('kept'))} kept "
            f"(dropped: {dropped})"
            + (
                f"; {flagged} of {count(report.get('memories_in'))} memories were annotator-flagged "
                "false memories and were never used."
                if flagged or not from_log(facts)
                else "."
            )
        )
    stages = (facts.get("run") or {}).get("stages", {})
    split = facts.get("split")
    for name in ("infer-persona", "gen-queries"):
        stage = stages.get(name)
        if isinstance(stage, dict) and stage.get("full", True):
            done = count(stage.get("done")) + count(stage.get("done_before"))
            failed = count(stage.get("failed")) + count(stage.get("failed_before"))
            kinds = counts(stage.get("failures_by_kind")) or "none"
            parts.append(
                f"- **{name}**: {count(stage.get('units'))} users, {done} done, {failed} failed ({kinds}); "
                f"model `{stage.get('model', 'unknown')}` ({stage.get('endpoint_kind', 'unknown')})."
                + _embedded(stage.get("model"))
                + _billed(stage)
            )
    if split:
        left = ", ".join(f"{reason} {count}" for reason, count in sorted(split["left_out"].items()))
        parts.append(
            f"- **split**: {split['users_in']} users read, left out: {left or 'none'} "
            "(users need a Big Five profile and at least one accepted query)."
        )
    return "\n".join(parts) or "- (the stage reports of this build were not found)"


def _billed(stage: dict[str, Any]) -> str:
    """What the stage's last run was billed for: the tokens the endpoint counted (a provider
    counts the response schema it was sent as prompt), the cached ones apart, and the cost at
    the run's prices when it had some."""
    totals = stage.get("totals") or {}
    prompt = count(totals.get("prompt_tokens"))
    if not prompt:
        return ""
    cost = stage.get("cost")
    return (
        f" Its last run sent {prompt:,} prompt tokens ({count(totals.get('cached_tokens')):,} of them "
        f"served by the provider's prefix cache; the response schema counted) and got "
        f"{count(totals.get('completion_tokens')):,} completion tokens"
        + (f", ${cost:,.2f} at the run's prices." if isinstance(cost, int | float) else ".")
    )


def stats_section(stats: dict[str, Any], figures: list[str]) -> str:
    """The card's statistics: every figure from `stats` (personaemp.dataset.stats.compute_stats,
    the dict published as stats.json beside the card), and its plots (`figures`: their paths)."""
    out = ["## Statistics", "", f"The same figures are in `{STATS_FILE}` (from `personaemp stats`).", ""]
    funnel = stats.get("funnel") or {}
    if funnel.get("users"):
        out += image("funnel.png", "Users and queries through the build", figures)
        rows = [["users", s["stage"], s["count"]] for s in funnel["users"]]
        rows += [["queries", s["stage"], s["count"]] for s in funnel.get("queries", [])]
        out += [table(["unit", "stage", "count"], rows), ""]
    if "big_five" in stats or stats.get("splits"):
        out += ["### Big Five levels (users)", ""]
        out += image("big_five.png", "Big Five levels of all users", figures)
        rows = []
        if "big_five" in stats:
            levels = stats["big_five"]["levels"]
            rows += [["all", "", stats["big_five"]["users"], t, *levels[t].values()] for t in BIG_FIVE]
        for setting, parts in (stats.get("splits") or {}).items():
            out += image(f"big_five_{setting}.png", f"Big Five levels, {setting} train vs test", figures)
            for part, data in parts.items():
                rows += [[setting, part, data["users"], t, *data["levels"][t].values()] for t in BIG_FIVE]
        out += [table(["users", "split", "count", "trait", "low", "medium", "high"], rows), ""]
    queries = stats.get("queries")
    if queries:
        out += ["### Queries", ""]
        out += image("queries.png", "Queries per category, per language, per user", figures)
        out += image("query_shape.png", "Query length and memories cited", figures)
        per_user, length, cited = queries["per_user"], queries["length"], queries["memories_cited"]
        categories = ", ".join(f"{name} {n}" for name, n in queries["categories"].items())
        languages = ", ".join(f"{code} {n}" for code, n in queries["languages"].items())
        out += [
            table(
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
        out += image("checks.png", "Pass rate of each check", figures)
        out += [_checks_table(checks), ""]
    persona_checks = stats.get("persona_checks")
    if persona_checks:
        out += ["### Persona checks (every persona written)", "", _checks_table(persona_checks), ""]
    return "\n".join(out).rstrip("\n")


def _checks_table(checks: dict[str, Any]) -> str:
    """{name: {passed, of, rate, enforced}} as a table, saying which decided in this build."""
    rows = [
        [name, DECIDED[c.get("enforced")], c["passed"], c["of"], f"{c['rate']:.1%}"]
        for name, c in checks.items()
    ]
    return table(["check", "in this build", "passed", "of", "rate"], rows)


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
    "no_scaffolding": "no text of our own prompts (labels, frames, unfilled slots)",
    "no_internal_ids": "no internal id (memory, session, user or hex id) in what a reader sees",
    "level_matches_rationale": "the Big Five rationale states no other level than its own",
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


def source_sentence(facts: dict[str, Any]) -> str:
    """Where the memories came from, as this build's files record it."""
    source = facts.get("source") or {}
    if not from_log(facts):
        return (
            "Built with the `personaemp` toolkit from AlpsBench (long-term user–LLM dialogues from "
            "WildChat with human-verified memory annotations), following the PersonaEmp design."
        )
    log = f"`{source['log']}`" if source.get("log") else "a log its files no longer name"
    shape = f" ({source['format']} format)" if source.get("format") else ""
    model = f"`{source['model']}`" if source.get("model") else "an LLM"
    return (
        f"Built with the `personaemp` toolkit, following the PersonaEmp design, from a conversation "
        f"log: {log}{shape}. Its memories were extracted from the users' own messages by "
        f"{model} (`personaemp extract-memories`), not annotated by people."
    )


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _picked_line(facts: dict[str, Any]) -> str | None:
    """Which of the filter's users the build went on with, when not all of them."""
    units = ((facts.get("run") or {}).get("stages", {}).get("infer-persona") or {}).get("units")
    kept = count((facts.get("filter") or {}).get("kept"))
    if not isinstance(units, int) or units >= kept:
        return None
    how = {
        "named": f"{_plural(units, 'user')} chosen by hand (`[persona] users`) out of the {kept} kept by "
        "the filter",
        "first": f"a limit: only the first {units} of the {kept} users kept by the filter "
        "(`[persona] limit`)",
    }.get(
        facts.get("picked"),
        f"only {units} of the {kept} users kept by the filter (`[persona] users` or `limit`)",
    )
    return how[0].upper() + how[1:] + "."


def departures(facts: dict[str, Any], stats: dict[str, Any] | None) -> list[str]:
    """Every way this build is smaller or laxer than a full one, each from its own files."""
    from personaemp.llm.models import EMBEDDED

    lines = []
    source = facts.get("source") or {}
    extract = source.get("run") or {}
    stages = (facts.get("run") or {}).get("stages", {})
    models = {extract.get("model")} | {
        (stages.get(name) or {}).get("model") for name in ("infer-persona", "gen-queries")
    }
    if EMBEDDED.name in models:
        lines.append(
            "Built on the embedded demo model (a 0.5B model run offline): its personas and queries are "
            "far weaker than a real endpoint's. This build shows the pipeline working; it is not a "
            "dataset to train or evaluate on."
        )
    if extract and count(extract.get("units")) < source.get("users_in_log", 0):
        lines.append(
            f"Only {count(extract.get('units'))} of the {source['users_in_log']} users in the log went "
            "through extract-memories (`[extract] limit` or `users`)."
        )
    picked = _picked_line(facts)
    if picked:
        lines.append(picked)
    personas = facts.get("personas") or {}
    persona_run = (facts.get("run") or {}).get("stages", {}).get("infer-persona") or {}
    depth_off = "depth=False" in str(persona_run.get("fingerprint", "")).split("|")  # persona_stage's
    if depth_off or personas.get("depth_not_enforced"):
        lines.append(
            "The depth gate was off (`[persona] require_depth = false`): "
            f"{personas.get('depth_not_enforced', 0)} of the {personas.get('users', 0)} users in the dataset "
            "were kept although the depth check found no persona-deep memories."
        )
    warning, _ = acceptance_lines(stats)
    if warning:
        lines.append(warning)
    relaxed = {
        name: c
        for name, c in ((stats or {}).get("persona_checks") or {}).items()
        if c.get("enforced") is False
    }
    if relaxed:
        shown = ", ".join(f"`{name}` ({c['passed']} of {c['of']} passed)" for name, c in relaxed.items())
        lines.append(
            f"Persona checks recorded but not enforced (`[persona] enforce`): {shown}; a persona "
            "whose texts fail them was kept, not asked again."
        )
    if personas.get("uncited_levels"):
        lines.append(
            f"{personas['uncited_levels']} of {personas['levels']} Big Five levels rest on no cited memory."
        )
    return lines


def profiles_sentence(facts: dict[str, Any]) -> str:
    """How many distinct Big Five profiles the users hold (per split when an OOD split exists)."""
    personas = facts.get("personas") or {}
    if not personas.get("users"):
        return ""
    profiles = _plural(personas["profiles"], "distinct Big Five profile")
    text = f"The {_plural(personas['users'], 'user')} hold {profiles}"
    ood = personas.get("per_split", {}).get("ood")
    if ood:
        text += " (ood: " + ", ".join(f"{split} {n}" for split, n in ood.items()) + ")"
    return text + "."


def configs_section(facts: dict[str, Any]) -> list[str]:
    """The configs this build has, each described, with their sizes and parameters."""
    default = default_config(facts)
    described = "\n".join(
        f"- `{setting}`: {SETTING_TEXT.get(setting, setting)}"
        + (" (the default config: `load_dataset(repo)` loads it)." if setting == default else ".")
        for setting in facts["settings"]
    )
    out = [
        "## Configs and splits",
        "",
        f"Splits are by user: no user appears in two splits of a config.\n\n{described}",
    ]
    profiles = profiles_sentence(facts)
    if profiles:
        out += ["", profiles]
    rows = []
    for setting, parts in facts["settings"].items():
        for name, part in parts.items():
            categories = ", ".join(f"{c} {n}" for c, n in sorted(part["categories"].items()))
            rows.append([setting, name, part["users"], part["rows"], categories])
    out += ["", table(["config", "split", "users", "queries", "categories"], rows)]
    for setting, details in ((facts.get("split") or {}).get("settings") or {}).items():
        params = {k: details[k] for k in ("seed", "test_size", "k", "holdout_cluster") if k in details}
        out += ["", f"`{setting}` parameters: `{json.dumps(params)}`"]
        if "clusters" in details:
            cluster_rows = [
                [c["id"], c["users"], *(c["mode"][t] for t in BIG_FIVE)] for c in details["clusters"]
            ]
            out += ["", table(["cluster", "users", *BIG_FIVE], cluster_rows)]
            curve = ", ".join(f"k={k}: {v:g}" for k, v in details["cost_curve"].items())
            out += ["", f"KModes cost by k: {curve}."]
    return out


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
        "*personalized* empathetic responses. " + source_sentence(facts)
    )
    lines = departures(facts, stats)
    if lines:
        sections += ["", "**How this build departs from a full one:**", ""]
        sections += [f"- {line}" for line in lines]
    _, decided = acceptance_lines(stats)
    sections += ["", "## How it was built", "", _funnel(facts), ""]
    personas = facts.get("personas") or {}
    uncited = (
        f" {personas['uncited_levels']} of the {personas['levels']} Big Five levels cite no memory."
        if personas.get("uncited_levels")
        else ""
    )
    sections.append(
        "Persona traits and Big Five levels cite the memory ids that support them; the "
        f"citations were checked in code and traits without valid evidence were dropped.{uncited} " + decided
    )
    provenance = facts.get("provenance") or {}
    if provenance:
        sections += ["", "Models and prompt versions (prompt file hashes):", ""]
        for entry in provenance:
            sections.append(f"- `{entry}`")
    sections += ["", *configs_section(facts)]
    if facts.get("dialogues"):
        sections += ["", *dialogues_section(facts["dialogues"], figures)]
    if stats is not None:
        sections += ["", stats_section(stats, figures or [])]
    sections += ["", quality_section(quality, table)]
    if quality:
        sections += [""] + image(QUALITY_PLOT, "Judge agreement per LLM check", figures or [])[:1]
    sections += ["", "## Schema (one row per query)", ""]
    user = (
        "the user's id in the source log"
        if from_log(facts)
        else "AlpsBench user (the task1 benchmark id when the user id is empty)"
    )
    schema = [
        ["user_id", "string", user],
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
    sections += [table(["field", "type", "meaning"], schema)]
    sections += ["", "## License and citation", "", *license_lines(facts)]
    sections += ["## Ethical notes", ""]
    dialogue = (
        "This build includes the users' own messages (`user_turns`), at the builder's request."
        if include_dialogue
        else "No text of the users' own dialogues is published: only memories, personas and generated "
        "queries. The `dialogues` config publishes simulated conversations: every turn in it is "
        "model-written (the simulated user, its hidden need and the supporter)."
        if facts.get("dialogues")
        else "No dialogue text is published: only memories, personas and generated queries."
    )
    memories = (
        "- Memories were extracted by an LLM and checked in code against the messages they cite, "
        "not by people: they can be wrong."
        if from_log(facts)
        else "- Memories that AlpsBench annotators flagged as false were excluded."
    )
    sections.append(
        f"- {dialogue}\n"
        "- The users are real people; memories describe their lives. Do not try to identify them.\n"
        "- Personas, Big Five levels, situations and queries are LLM-generated: they are "
        "inferences, not facts about the users, and they can be wrong.\n" + memories
    )
    return "\n".join(sections) + "\n"


def license_lines(facts: dict[str, Any]) -> list[str]:
    """The license and what to cite: AlpsBench's terms, or the log's, which only its owner knows."""
    if from_log(facts):
        log = (facts.get("source") or {}).get("log") or "the source log"
        return [
            f"The terms are those of the source log, {log}, which personaemp cannot know: the card "
            "says `license: other` until the builder states them. Please cite:\n",
            PERSONAEMP_CITATION,
        ]
    return [
        "ODC-BY 1.0 (Open Data Commons Attribution License), inherited from AlpsBench and "
        "WildChat. Keep the attribution when you redistribute. Please cite:\n",
        PERSONAEMP_CITATION + ALPSBENCH_CITATIONS,
    ]


def _embedded(model) -> str:
    """What the card says of the embedded model: which weights, their licence and origin."""
    from personaemp.llm.models import EMBEDDED

    if model != EMBEDDED.name:
        return ""
    return f" That is the embedded model, {EMBEDDED.title} ({EMBEDDED.licence}): {EMBEDDED.origin}."
