"""The dataset card's multi-turn part: the `dialogues` config (who played whom, what was
kept and lost, how the dialogues ended, each check's pass rate), how real the seekers are,
the seeker styles and the supporter behaviours the evaluation counted
(personaemp.dataset.card renders it)."""

from __future__ import annotations

from typing import Any

from personaemp.dataset.card_markdown import image, table


def dialogues_section(found: dict[str, Any], figures: list[str] | None = None) -> list[str]:
    """The `dialogues` config: who played whom and that it is model-written, per language and
    supporter what was kept and lost, how they ended, the final emotions, each check's pass
    rate over every reply it judged ("not checked" where it never ran), the checks relaxed."""
    from personaemp.dataset.stats import FINAL_EMOTION_PLOT

    turns = found["turns"]
    judged = found.get("judged") or {}
    replies = found["checked_replies"]
    rates = ", ".join(
        f"{rule} {'not checked' if rate is None else f'{100 * rate:.1f}%'}"
        + (f" (of {judged[rule]})" if rate is not None and judged.get(rule, replies) != replies else "")
        for rule, rate in found["pass_rates"].items()
    )
    unreached = found.get("unreached") or {}
    off = {rule: replies - judged.get(rule, replies) - unreached.get(rule, 0) for rule in found["pass_rates"]}
    relaxed = [f"{rule} (not checked on {n} of {replies} replies)" for rule, n in off.items() if n > 0]
    rows = [[split, count] for split, count in found["rows"].items()]
    ended = ", ".join(f"{how} {n}" for how, n in sorted(found["ended_by"].items()))
    languages = ", ".join(f"{language} {n}" for language, n in (found.get("languages") or {}).items())
    supporters = found.get("supporters") or {}
    supporter_rows = [
        [f"`{model}`", entry["kept"], entry["lost"],
         ", ".join(f"{kind} {n}" for kind, n in sorted(entry["lost_by_kind"].items())) or "—"]
        for model, entry in supporters.items()
    ]  # fmt: skip
    simulators = ", ".join(f"`{m}`" for m in found["simulator_models"])
    published = sum(found["rows"].values())
    lost = sum(entry["lost"] for entry in supporters.values())
    by_simulator = sum(entry.get("by_simulator", 0) for entry in supporters.values())
    out = [
        "## Dialogues (config `dialogues`)",
        "",
        "Multi-turn conversations (`personaemp gen-dialogues`): an LLM plays each user, grounded in "
        "their memories, persona and Big Five levels and given a hidden need (what would help them "
        "here, never shown to the supporter); it opens with the query and answers the supporter turn "
        "by turn, recording its emotion (0-100, from 40), the change, the reason, its inner thought and "
        "whether the need was met. Each dialogue sits in the split of the `random` config that holds "
        "its query.",
        "",
        "**A simulated user is not a person.** Its emotions, reasons and the hidden need are an LLM's "
        "role play on the user's memories, not what the real user felt or would say; use the "
        "dialogues to compare and train supporters, not as evidence about people.",
        "",
        f"- **Model-written:** the hidden needs and every simulated user turn (its text, emotion, "
        f"reason and thought) were written by the simulator model {simulators}; the supporter turns by "
        f"the supporter model ({', '.join(f'`{m}`' for m in found['supporter_models'])}); the opening "
        "message is the generated query. No real user's message is in this config.",
        f"- Dialogues per language: {languages or '—'}.",
        f"- Supporter turns per dialogue: {turns['mean']:g} on average ({turns['min']}-{turns['max']}); "
        f"ended by: {ended}; hidden need met in {found['need_met']} of {published}.",
    ]
    if supporter_rows:
        if not lost:
            why = "every dialogue finished"
        else:
            why = f"{lost} of {published + lost} not finished" + (
                f", {by_simulator} of them lost to the simulator: it broke its rules on every try, the "
                "simulator's failure, not the supporter's" if by_simulator else ""
            ) + (
                "; the others: the supporter's request failed" if by_simulator and by_simulator < lost
                else ": the supporter's request failed" if not by_simulator else ""
            )  # fmt: skip
        out += [
            f"- Dialogues kept and lost per supporter ({why}):",
            "",
            table(["supporter", "kept", "lost", "lost, by reason"], supporter_rows),
            "",
        ]
    from personaemp.instruments import simulator_rules

    def meant(names) -> str:
        return ", ".join(f"{name} ({simulator_rules.MEANINGS[name]})" for name in names)

    out += [
        "- The simulator's checks, run on every reply it wrote (a failing reply was asked again): "
        f"{meant(simulator_rules.RULES)}, and by an LLM check {meant(simulator_rules.JUDGED)}.",
        f"- Pass rates over the {replies} replies judged, kept and asked again: {rates}.",
    ]
    if unreached:
        out.append(
            f"- The LLM check asks only about a reply every rule passed: {', '.join(unreached)} did not "
            f"see the {max(unreached.values())} replies a rule had refused first."
        )
    if relaxed:
        out.append(f"- Checks relaxed: {'; '.join(relaxed)}.")
    if found.get("lost_replies_not_kept"):
        out.append(
            f"- The replies of {lost_dialogues(found['lost_replies_not_kept'])} are not in these rates: "
            "their failures rows do not keep them."
        )
    out += seekers_lines(found)
    if (found.get("realism") or {}).get("users"):
        out += ["", *realism_lines(found["realism"])]
    out += [
        "",
        *image(FINAL_EMOTION_PLOT, "Final emotion of the simulated user, per supporter", figures or []),
    ]
    out += [table(["split", "dialogues"], rows)]
    out += behaviour_lines(found.get("behaviours"))
    return out


def realism_lines(real: dict[str, Any]) -> list[str]:
    """How real the seekers are: the simulated user turns against the same users' real messages
    (instruments/realism.py's seeker_realism), with n."""

    def pct(value: Any) -> str:
        return "—" if value is None else f"{100 * value:.0f}%"

    def num(value: Any, digits: int = 1) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    sim, own = real["simulated"], real["real"]
    return [
        "### How real the seekers are",
        "",
        f"The simulated user turns ({sim['messages']}, the opening queries left out) against the same "
        f"{real['users']} users' real messages ({own['messages']}); LLM-played users are known to write "
        "longer, more alike and more politely than people, and to feel better sooner.",
        "",
        table(
            ["", "simulated", "real"],
            [
                ["words per message", num(sim["words"]), num(own["words"])],
                ["politeness markers", pct(sim["politeness"]), pct(own["politeness"])],
                ["question rate", pct(sim["question_rate"]), pct(own["question_rate"])],
                [
                    "length CV across users",
                    num(sim["length_cv_across_users"], 2),
                    num(own["length_cv_across_users"], 2),
                ],
            ],
        ),  # fmt: skip
        "",
        f"- Length ratio (simulated / real): {num(real['length_ratio'], 2)}.",
        f"- Speed of relief: hidden need met by supporter turn 2 in {pct(real['relief_by_turn_2'])} of "
        f"{real['dialogues']} dialogues; mean emotion change per simulated turn "
        f"{num(real['mean_change_per_turn'])} (n = {real['turns_with_change']} turns).",
        "",
    ]


def seekers_lines(found: dict[str, Any]) -> list[str]:
    """How hard the simulated users were to help (`gen-dialogues --seeker`), and the table by
    which `auto` picks a style from a user's Big Five levels."""
    from personaemp.instruments.seekers import auto_table_text

    styles = found.get("seekers") or {"cooperative": sum(found["rows"].values())}
    return [
        "- Seeker styles (how hard the simulated user is to help, `gen-dialogues --seeker`): "
        + ", ".join(f"{style} {n}" for style, n in styles.items())
        + ". A style is a few lines added to the simulator's task (prompts/seekers.md); cooperative "
        "adds none. guarded and escalating also hold each turn to a rule (seeker_style); every style "
        "is judged by the in-character check.",
        "- With `--seeker auto` a user's style follows their Big Five levels, the first row that "
        "matches: " + "; ".join(auto_table_text()) + ".",
    ]


def behaviour_lines(found: dict[str, Any] | None) -> list[str]:
    """The supporters' risky and protective behaviours per 1,000 words, their tracking rate,
    final emotion and session reward, per seeker style, from an `evaluate --dialogues` report."""
    if not found:
        return [
            "",
            "Behaviours of the supporters (risky, protective) were not counted for this card: pass "
            "`--dialogues-report`, the report of `personaemp evaluate --dialogues` on these dialogues.",
        ]
    lists = found.get("lists") or {}

    def figure(value: Any, scale: float = 1, unit: str = "") -> str:
        return "—" if value is None else f"{scale * value:.1f}{unit}" if unit else f"{value:g}"

    rows = [
        [f"`{r['system']}`", r["seeker"], r["n"], r["turns"], figure(r["risky_per_1k"]),
         figure(r["protective_per_1k"]), figure(r["tracking_rate"], 100, "%"), figure(r["final_emotion"]),
         figure(r["reward"]), r["dropped_quotes"]]
        for r in found["rows"]
    ]  # fmt: skip
    return [
        "",
        "### Behaviours of the supporters",
        "",
        "A judge read every supporter turn and named the behaviours it shows from two declared lists, "
        "each with a quote of the turn; a behaviour whose quote is not in the turn was dropped and "
        f"counted. Risky: {', '.join(lists.get('risky', ()))}. Protective: "
        f"{', '.join(lists.get('protective', ()))}. Counts are per 1,000 words of the supporter's text; "
        "tracking is the share of supporter turns that acknowledge the emotion the user had just shown "
        f"before anything else (a rule on the first sentence where it can tell, else the judge). "
        f"Reward: {found.get('rule', '')}. From `{found['report']}`.",
        "",
        table(
            [
                "supporter",
                "seeker",
                "n",
                "turns",
                "risky / 1k words",
                "protective / 1k words",
                "tracking",
                "final emotion",
                "reward",
                "quotes dropped",
            ],
            rows,
        ),  # fmt: skip
    ]


def lost_dialogues(n: int) -> str:
    """'1 lost dialogue', '2 lost dialogues'."""
    return f"{n} lost dialogue{'' if n == 1 else 's'}"
