"""`personaemp evaluate --dialogues FILE`: session-level scores of gen-dialogues' output.

A dialogues file is a system (its supporter), named by its file name, as a responses file
is for single-turn `evaluate`; its dialogues are joined to the split's queries by query id
(what a judge reads about the user comes from the split file, as in single-turn). Per
dialogue:

  trajectory  read off the record, no LLM: initial and final emotion, their difference, the
              supporter turn at which the hidden need was first met, how it ended, turns;
  PERM        the three dimensions over the supporter's whole side of the conversation
              (instruments/session_judges.py), H their harmonic mean of score / 5: fixed (the
              default) against criteria written for the dialogue the paper's way (the
              criteria writer of `personaemp criteria` on the opening message, the moment,
              the persona and the memories: no reply seen, the same request, so the same
              cache entry), or dynamic (PereGRM, its own criteria, @k); with `per_turn`, each
              supporter turn too, graded in the context of the turns before it.

The conversation reaches the judge as one data block it cannot close; the judge never sees
the simulator's emotions or the hidden need, so the two signals stay apart. Unreadable
judgments follow evaluate's rule (`unreadable`); a query of the split without a dialogue in
the file is counted, not scored (gen-dialogues wrote it to its failures file). The report
(`kind: "dialogues"`) gives per system the means, the share of dialogues whose need was
met, how they ended, by category; `personaemp table` renders it as the multi-turn table.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from personaemp.aio import sync_twin
from personaemp.errors import InputError, RowError
from personaemp.evaluation.scoring import failures_file, metrics, score_unit, scores_file, temperatures
from personaemp.instruments import behaviours as behaviour_judge
from personaemp.instruments import seekers, simulator_rules
from personaemp.instruments.criteria import (
    CRITERIA,
    build_messages,
    definitions_hash,
    normalise,
    query_hash,
    query_units,
    with_room,
)
from personaemp.instruments.criteria import ROOM as CRITERIA_ROOM
from personaemp.instruments.judges import (
    DYNAMIC_ASPECTS,
    MISSING_RULES,
    UNREADABLE_RULES,
    JudgeOptions,
    harmonic,
)
from personaemp.instruments.judges import check_sampling as check_sampling
from personaemp.instruments.realism import seeker_realism
from personaemp.instruments.session_judges import (
    ROOM,
    SESSION_JUDGE,
    SESSION_JUDGE_DYNAMIC,
    dialogue_text,
    session_messages,
    turn_graded,
    up_to_turn,
)
from personaemp.instruments.simulator import MAX_TURNS
from personaemp.io import ErrorPolicy, iter_jsonl, iter_records, write_json_atomic
from personaemp.prompts import LAYOUTS, load_prompt
from personaemp.records import DIMENSIONS, SEEKERS, Dialogue
from personaemp.splits import split_file

STAGE = "evaluate-dialogues"
KIND = "dialogues"  # the report's kind: `table` renders it as the multi-turn table
HINT = "pass the output of `personaemp gen-dialogues`"


# --- inputs ------------------------------------------------------------------------------------


def read_dialogue_file(path: Path) -> dict[str, Dialogue]:
    """query id -> its dialogue, validated; one dialogue per query."""
    found: dict[str, Dialogue] = {}
    lines: dict[str, int] = {}
    try:
        for lineno, dialogue in iter_records(path, Dialogue, "a dialogue", HINT):
            if dialogue.query_id in found:
                raise InputError(
                    f"{path}:{lineno}: a second dialogue of query {dialogue.query_id} (first at line "
                    f"{lines[dialogue.query_id]})",
                    "keep one dialogue per query in a file (a system)",
                )
            found[dialogue.query_id], lines[dialogue.query_id] = dialogue, lineno
    except RowError as error:
        raise InputError(f"{error.location}: {error.reason}", HINT) from None
    if not found:
        raise InputError(f"{path}: no dialogues", "run `personaemp gen-dialogues` first")
    return found


def system_names(paths: Sequence[Path]) -> list[str]:
    names = [Path(path).stem for path in paths]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InputError(f"two dialogues files are both named {repeated[0]!r}", "rename one of them")
    return names


def need_met_at(dialogue: Dialogue) -> int | None:
    """The supporter turn after which the need was first met, as Met % counts it: a user turn
    that says "met" while its emotion fell breaks need_met_consistent and never counts (a
    kept turn cannot break it; rows from before the rule can)."""
    number = 0
    for turn in dialogue.turns:
        number += turn.role == "assistant"
        if turn.role == "user" and number and turn.need_met and (turn.change or 0) >= 0:
            return number
    return None


def trajectory(dialogue: Dialogue) -> dict[str, Any]:
    """The simulated user's emotion over the dialogue, read off the record."""
    emotions = [t.emotion for t in dialogue.turns if t.role == "user" and t.emotion is not None]
    return {
        "initial_emotion": dialogue.initial_emotion,
        "final_emotion": dialogue.final_emotion,
        "delta": dialogue.final_emotion - dialogue.initial_emotion,
        "need_met_at_turn": need_met_at(dialogue),
        "ended_by": dialogue.ended_by,
        "supporter_turns": sum(t.role == "assistant" for t in dialogue.turns),
        "emotions": emotions,
    }


def lost_reasons(path: Path) -> dict[str, str]:
    """query id -> why gen-dialogues lost its dialogue, from the failures file beside `path`."""
    failures = Path(path).with_name("gen-dialogues.failures.jsonl")
    reasons: dict[str, str] = {}
    if failures.exists():
        for _, _, row in iter_jsonl(failures, ErrorPolicy("skip")):
            query = row.get("query_id") or str(row.get("dialogue_id", "")).removesuffix("-d1")
            whose = row.get("lost_to", "simulator")
            reasons[query] = f"lost to the {whose} in gen-dialogues ({row.get('kind')})"
    return reasons


def scored_queries(
    query_ids: set[str],
    systems: dict[str, dict[str, Dialogue]],
    paths: dict[str, Path],
    every: bool,
    where: str,
) -> tuple[dict[str, set[str]], dict[str, list[dict[str, str]]]]:
    """Which queries each system is scored on, and the dialogues left out with the reason: by
    default the queries every system has a dialogue for (like with like); `every`
    (--all-dialogues): each system's own. A dialogue of a query outside the split is said."""
    have = {name: set(dialogues) & query_ids for name, dialogues in systems.items()}
    common = set.intersection(*have.values()) if have else set()
    lost = {name: lost_reasons(paths[name]) for name in systems}
    chosen: dict[str, set[str]] = {}
    left_out: dict[str, list[dict[str, str]]] = {}
    for name, dialogues in systems.items():
        chosen[name] = have[name] if every else common
        out = []
        for query in sorted(set(dialogues) - query_ids):
            out.append({"query_id": query, "dialogue_id": dialogues[query].dialogue_id,
                        "reason": f"its query is not in the {where} split"})  # fmt: skip
        for query in sorted(have[name] - chosen[name]):
            missing = [other for other in systems if query not in have[other]]
            why = "; ".join(
                f"{other}: {lost[other].get(query, 'no dialogue in its file')}" for other in missing
            )
            out.append({"query_id": query, "dialogue_id": dialogues[query].dialogue_id,
                        "reason": f"not every system has it ({why})"})  # fmt: skip
        left_out[name] = out
    return chosen, left_out


ALL_CHECKS = (*simulator_rules.RULES, seekers.RULE, *simulator_rules.JUDGED)


def checks_run(dialogues) -> list[str]:
    """The simulator's checks that ran on these dialogues' kept turns (RULES order): one that did
    not run (the LLM check under --no-character-check) is absent from a turn's checks."""
    ran = {name for d in dialogues for t in d.turns for name in (t.checks or {})}
    return [name for name in ALL_CHECKS if name in ran]


def build_units(
    queries: list[dict], systems: dict[str, dict[str, Dialogue]], chosen: dict[str, set[str]] | None = None
) -> list[dict]:
    """One unit per system and dialogue of a query of the split (of `chosen`'s, when given)."""
    units = []
    for system, dialogues in systems.items():
        for query in queries:
            dialogue = dialogues.get(query["query_id"])
            if dialogue is None or (chosen is not None and query["query_id"] not in chosen[system]):
                continue
            units.append({
                "unit_id": f"{system}/{dialogue.dialogue_id}", "system": system, **query,
                "dialogue_id": dialogue.dialogue_id, "response": dialogue_text(dialogue.turns),
                "turns": [t.model_dump(mode="json", include={"role", "text"}) for t in dialogue.turns],
                "trajectory": trajectory(dialogue), "status": "judged", "truncated": False,
                "cut_in_reasoning": False, "criteria": None,
                "supporter_model": dialogue.supporter_model, "simulator_model": dialogue.simulator_model,
                "seeker": dialogue.seeker, "context": dialogue.context,
            })  # fmt: skip
    return units


# --- one dialogue ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SafetyRule:
    """How evaluate --dialogues reads the behaviours: judged at all, and the session reward it
    reports beside the final emotion (final / 100 less the safety term, as the training
    Interaction's default session reward with [reward] safety at these values)."""

    behaviours: bool = True
    weight: float = behaviour_judge.SAFETY_WEIGHT
    bound: float = behaviour_judge.SAFETY_BOUND


async def score_dialogue(
    engine, unit: dict, options: JudgeOptions, per_turn: bool, prompts, safety: SafetyRule | None = None
) -> dict:
    """Criteria (fixed), the session's PERM scores, per turn when asked, the trajectory, and
    (safety.behaviours) each supporter turn's behaviours and the session reward they leave."""
    from personaemp.records import DialogueTurn

    step = SESSION_JUDGE_DYNAMIC if options.dynamic else SESSION_JUDGE
    unit = dict(unit)
    if not options.dynamic:
        criteria = {}
        for dimension in DIMENSIONS:
            messages = build_messages(unit, dimension, prompts[CRITERIA.name], options.layout)
            reply = await engine.call(CRITERIA, messages, parse=normalise)
            criteria[dimension] = [c.model_dump(mode="json") for c in reply.parsed]
        unit["criteria"] = criteria
    row = await score_unit(engine, unit, options, prompts, step=step, build=session_messages)
    row.update(dialogue_id=unit["dialogue_id"], seeker=unit["seeker"], context=unit["context"],
               supporter_model=unit["supporter_model"], **unit["trajectory"])  # fmt: skip
    if safety is not None and safety.behaviours:
        turns = [DialogueTurn.model_validate(t) for t in unit["turns"]]
        person = behaviour_judge.person_text(unit.get("situation", ""), unit.get("memories") or ())
        judged = await behaviour_judge.judge_turns(
            engine, turns, prompts[behaviour_judge.BEHAVIOUR_JUDGE.name], person
        )
        risky = behaviour_judge.risky_count(judged)
        penalty = behaviour_judge.safety_penalty(risky, safety.weight, safety.bound)
        row.update(
            behaviours=judged,
            risky=risky,
            safety_penalty=round(penalty, 4),
            reward=round(unit["trajectory"]["final_emotion"] / 100 - penalty, 4),
        )  # fmt: skip
    row["harmonic"] = harmonic(row["scores"]) if len(row["scores"]) == len(DIMENSIONS) else None
    if per_turn:
        turns = [DialogueTurn.model_validate(t) for t in unit["turns"]]
        row["per_turn"] = []
        for number in range(1, unit["trajectory"]["supporter_turns"] + 1):
            shown = {
                **unit,
                "response": dialogue_text(up_to_turn(turns, number)),
                "graded": turn_graded(number),
            }
            judged = await score_unit(engine, shown, options, prompts, step=step, build=session_messages)
            complete = len(judged["scores"]) == len(DIMENSIONS)
            row["per_turn"].append({
                "turn": number, "scores": judged["scores"],
                "harmonic": round(harmonic(judged["scores"]), 4) if complete else None,
            })  # fmt: skip
    return row


# --- the stage ---------------------------------------------------------------------------------


async def aevaluate_dialogues(
    splits: Path,
    dialogues: Sequence[Path],
    report_path: Path,
    settings,
    *,
    split: str = "random",
    part: str = "test",
    judge_model: str | None = None,
    options: JudgeOptions | None = None,
    per_turn: bool = False,
    all_dialogues: bool = False,
    safety: SafetyRule | None = None,
    retry_failed: bool = False,
    console=None,
):
    """Score the dialogues of `dialogues` (one file a system) whose query is in the split part:
    by default only the queries every system has a dialogue for (`all_dialogues`: each
    system's own, not comparable); returns (stage report, evaluation), the evaluation None
    after an estimate."""
    from personaemp.llm.stage import LLMStage, arun_llm_stage

    options = options or JudgeOptions()
    safety = safety or SafetyRule()
    if options.bystander:
        raise InputError(
            "--bystander does not apply to --dialogues", "the bystander reads one reply: leave it out"
        )
    if options.samples > 1 and not options.dynamic:
        raise InputError("--samples applies to --dynamic judging", "add --dynamic, or leave --samples out")
    if options.unreadable not in UNREADABLE_RULES:
        raise InputError(f"--unreadable takes {', '.join(UNREADABLE_RULES)}, not {options.unreadable!r}")
    if options.layout not in LAYOUTS:
        raise InputError(f"--layout takes {', '.join(LAYOUTS)}, not {options.layout!r}")
    if options.missing not in MISSING_RULES:
        raise InputError(f"--missing takes {', '.join(MISSING_RULES)}, not {options.missing!r}")
    model = judge_model or settings.model
    chosen = dataclasses.replace(settings, model=model) if judge_model else settings
    judge_settings = with_room(with_room(with_room(chosen, ROOM), CRITERIA_ROOM), behaviour_judge.ROOM)
    step = SESSION_JUDGE_DYNAMIC if options.dynamic else SESSION_JUDGE
    check_sampling(judge_settings, step, options)
    if not dialogues:
        raise InputError("no dialogues file given", "pass --dialogues FILE (repeat it for several systems)")
    input_path = split_file(Path(splits), split, part)
    queries = query_units(input_path, "pass a split file written by `personaemp split`")
    names = system_names(dialogues)
    systems = {name: read_dialogue_file(Path(path)) for name, path in zip(names, dialogues, strict=True)}
    query_ids = {q["query_id"] for q in queries}
    for name, path in zip(names, dialogues, strict=True):
        if query_ids.isdisjoint(systems[name]):
            raise InputError(
                f"{path}: none of its {len(systems[name])} dialogues is of a query of the "
                f"{split} {part} split",
                "pass the dialogues of this split, or choose the split they belong to with --split/--part",
            )
    paths = {name: Path(path) for name, path in zip(names, dialogues, strict=True)}
    chosen, left_out = scored_queries(query_ids, systems, paths, all_dialogues, f"{split} {part}")
    units = build_units(queries, systems, chosen)
    ran = {name: checks_run(systems[name][q] for q in chosen[name]) for name in names}
    used = [
        step, *([] if options.dynamic else [CRITERIA]),
        *([behaviour_judge.BEHAVIOUR_JUDGE] if safety.behaviours else []),
    ]  # fmt: skip
    prompts = {s.name: load_prompt(s.prompt) for s in used}
    mode = f"dynamic@{options.samples}" if options.dynamic else "fixed"
    calls = len(DIMENSIONS) * (options.samples if options.dynamic else 1)

    def make_work(engine):
        async def work(unit: dict) -> dict:
            return await score_dialogue(engine, unit, options, per_turn, prompts, safety)

        return work

    plan = LLMStage(
        STAGE, units, make_work, key="unit_id", output=scores_file(report_path),
        fingerprint=lambda engine: "|".join([
            *(engine.fingerprint(s, prompts[s.name].hash) for s in used), mode,
            definitions_hash(DYNAMIC_ASPECTS), f"layout={options.layout}", f"unreadable={options.unreadable}",
            f"per_turn={per_turn}",
            *([f"behaviours={behaviour_judge.BEHAVIOURS}", f"safety={safety.weight}/{safety.bound}"]
              if safety.behaviours else []),
        ]),
        input_path=input_path, retry_failed=retry_failed, failures=failures_file(report_path),
        steps=[*([] if options.dynamic else [CRITERIA]), step,
               *([behaviour_judge.BEHAVIOUR_JUDGE] if safety.behaviours else [])],
        calls={CRITERIA.name: len(DIMENSIONS), step.name: calls,
               behaviour_judge.BEHAVIOUR_JUDGE.name: MAX_TURNS},
    )  # fmt: skip
    report = await arun_llm_stage(plan, settings=judge_settings, console=console)
    if report.estimate is not None:
        return report, None
    rows = read_rows(scores_file(report_path), {u["unit_id"] for u in units})
    real = real_messages(input_path)  # the users' own messages: how real their simulated selves are
    evaluation = {
        "kind": KIND,
        "split": split,
        "part": part,
        "input": str(input_path),
        "dialogues": {name: str(path) for name, path in zip(names, dialogues, strict=True)},
        "mode": mode,
        "per_turn": per_turn,
        "behaviours": safety.behaviours,
        **(
            {
                "behaviour_lists": {
                    "risky": dict(behaviour_judge.RISKY),
                    "protective": dict(behaviour_judge.PROTECTIVE),
                },
                "safety_rule": {"weight": safety.weight, "bound": safety.bound, "text": safety_text(safety)},
            }
            if safety.behaviours
            else {}
        ),
        "lambda": options.reward_lambda,
        "missing_rule": "skip",  # a query without a dialogue is counted, never scored
        "unreadable_rule": options.unreadable,
        "layout": options.layout,
        "judge_model": report.model,
        "temperatures": temperatures(judge_settings, used),
        "prompts": {name: prompt.hash for name, prompt in prompts.items()},
        "instruments": {s.name: f"v{s.version}/{prompts[s.name].hash}" for s in used},
        # the checks that ran on the dialogues scored; the others are "not checked"
        "simulator_rules": [n for n in ALL_CHECKS if any(n in found for found in ran.values())],
        "simulator_rules_not_run": [
            n
            for n in ALL_CHECKS
            if not any(n in found for found in ran.values())
            and (n != seekers.RULE or any(u["seeker"] in ("guarded", "escalating") for u in units))
        ],  # fmt: skip
        "comparable": not all_dialogues or len({frozenset(q) for q in chosen.values()}) <= 1,
        "same_queries_rule": "each system on all its own dialogues (--all-dialogues)"
        if all_dialogues
        else "the queries every system has a dialogue for",  # fmt: skip
        "scores_file": str(scores_file(report_path)),
        "query_hashes": {q["query_id"]: query_hash(q) for q in queries},
        "systems": {
            name: {
                **summarise(
                    rows.get(name, []),
                    units,
                    name,
                    len(queries),
                    options,
                    own=len(set(systems[name]) & query_ids),
                ),
                "left_out": left_out[name],
                "checks_run": ran[name],
                "realism": seeker_realism(
                    [systems[name][q] for q in sorted(chosen[name]) if q in systems[name]], real
                ),
            }
            for name in names
        },
    }
    if any(u["seeker"] != seekers.DEFAULT for u in units):
        evaluation["seekers"] = seeker_figures(
            [r for found in rows.values() for r in found], options.reward_lambda
        )
    write_json_atomic(Path(report_path), evaluation)
    return report, evaluation


evaluate_dialogues = sync_twin(aevaluate_dialogues)


# --- the numbers -------------------------------------------------------------------------------


def real_messages(path: Path) -> dict[str, list[str]]:
    """user id -> their own real messages, from a split file's user rows (how real the
    simulated seekers are: instruments/realism.py's seeker_realism)."""
    found: dict[str, list[str]] = {}
    for _, _, row in iter_jsonl(Path(path), ErrorPolicy("fail")):
        texts = [t["text"] for t in row.get("turns") or () if t.get("role") == "user" and t.get("text")]
        found[str(row["user_id"])] = texts
    return found


def read_rows(path: Path, wanted: set[str]) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    if path.exists():
        for _, _, row in iter_jsonl(path, ErrorPolicy("fail")):
            if row["unit_id"] in wanted:
                rows.setdefault(row["system"], []).append(row)
    return rows


def session_metrics(rows: list[dict], reward_lambda: float) -> dict[str, Any]:
    """The trajectory's means and shares, then PERM (evaluate's metrics)."""
    if not rows:
        return {"n": 0}
    met = [r["need_met_at_turn"] for r in rows if r["need_met_at_turn"] is not None]
    found = {
        "initial_emotion": round(statistics.fmean(r["initial_emotion"] for r in rows), 2),
        "final_emotion": round(statistics.fmean(r["final_emotion"] for r in rows), 2),
        "delta": round(statistics.fmean(r["delta"] for r in rows), 2),
        "need_met_share": round(len(met) / len(rows), 4),
        "need_met_at_turn": round(statistics.fmean(met), 2) if met else None,
        "supporter_turns": round(statistics.fmean(r["supporter_turns"] for r in rows), 2),
        "ended_by": dict(Counter(r["ended_by"] for r in rows)),
    }
    return {**metrics(rows, reward_lambda, "skip"), **found, **behaviour_figures(rows)}


def behaviour_figures(rows: list[dict]) -> dict[str, Any]:
    """The behaviours' counts per 1,000 words, the tracking rate and the mean session reward
    (final emotion / 100 less the safety term) of rows judged for behaviours; {} if none was."""
    judged = [r for r in rows if r.get("behaviours") is not None]
    if not judged:
        return {}
    found = behaviour_judge.summarise([r["behaviours"] for r in judged])
    return {
        "behaviours": found,
        "tracking_rate": (found.get("tracking") or {}).get("rate"),
        "risky_per_1k": found.get("risky_per_1k"),
        "protective_per_1k": found.get("protective_per_1k"),
        "reward": round(statistics.fmean(r["reward"] for r in judged), 4),
        "safety_penalty": round(statistics.fmean(r["safety_penalty"] for r in judged), 4),
    }


def safety_text(safety: SafetyRule) -> str:
    return (
        f"reward = final emotion / 100 - min({safety.bound:g}, {safety.weight:g} x risky behaviours), "
        "a behaviour counted once per supporter turn"
    )


# --- per seeker style: each supporter's figures and its drop from cooperative -------------------

RESAMPLES, SEED = 2000, 0
DROP_METRICS = ("final_emotion", "harmonic", "reward", "tracking")
STYLE_FIGURES = ("n", "final_emotion", "need_met_share", "harmonic", "reward", "risky_per_1k",
                 "protective_per_1k", "tracking_rate")  # fmt: skip


def paired_bootstrap(diffs: Sequence[float], resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, Any]:
    """The mean of paired differences with a 95% percentile interval: the pairs (queries)
    resampled with replacement `resamples` times."""
    import random

    if not diffs:
        return {"n": 0, "mean": None, "low": None, "high": None}
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(statistics.fmean(rng.choices(diffs, k=n)) for _ in range(resamples))
    return {
        "n": n,
        "mean": round(statistics.fmean(diffs), 4),
        "low": round(means[int(0.025 * resamples)], 4),
        "high": round(means[min(resamples - 1, int(0.975 * resamples))], 4),
    }


def _tracking(row: dict) -> float | None:
    turns = row.get("behaviours")
    return statistics.fmean(t["acknowledged"] for t in turns) if turns else None


def _value(row: dict, metric: str) -> float | None:
    if metric == "tracking":
        return _tracking(row)
    return row.get(metric)


def supporter_keys(rows: Sequence[dict]) -> dict[tuple[str, str], str]:
    """(supporter model, context) -> the name a supporter goes by: its model, with the context
    when the model was run with several."""
    contexts: dict[str, set[str]] = {}
    for row in rows:
        contexts.setdefault(row["supporter_model"], set()).add(row.get("context") or "")
    return {
        (model, context): model if len(found) == 1 else f"{model} ({context})"
        for model, found in contexts.items()
        for context in found
    }


def seeker_figures(rows: Sequence[dict], reward_lambda: float) -> dict[str, Any]:
    """Per supporter and seeker style: its figures, and its drop from cooperative (style -
    cooperative) per metric over the queries both were scored on (paired bootstrap, 95%)."""
    keys = supporter_keys(rows)
    grouped: dict[str, dict[str, dict[str, dict]]] = {}
    for row in rows:
        name = keys[(row["supporter_model"], row.get("context") or "")]
        grouped.setdefault(name, {}).setdefault(row.get("seeker") or seekers.DEFAULT, {}).setdefault(
            row["query_id"], row
        )
    supporters: dict[str, Any] = {}
    for name, styles in grouped.items():
        base = styles.get(seekers.DEFAULT, {})
        entry = {}
        for style in (s for s in SEEKERS if s in styles):
            found = session_metrics(list(styles[style].values()), reward_lambda)
            figures = {k: found.get(k) for k in STYLE_FIGURES}
            if style != seekers.DEFAULT:
                common = sorted(set(base) & set(styles[style]))
                drops = {}
                for metric in DROP_METRICS:
                    pairs = [(_value(styles[style][q], metric), _value(base[q], metric)) for q in common]
                    diffs = [a - b for a, b in pairs if a is not None and b is not None]
                    drops[metric] = paired_bootstrap(diffs)
                figures["drop"] = drops
                figures["paired_queries"] = len(common)
                figures["unpaired"] = {
                    "cooperative_only": len(set(base) - set(styles[style])),
                    f"{style}_only": len(set(styles[style]) - set(base)),
                }
            entry[style] = figures
        supporters[name] = entry
    return {
        "rule": (
            f"drop = style - cooperative, per supporter, over the queries it was scored on in both; "
            f"mean with a 95% paired bootstrap interval ({RESAMPLES} resamples of the queries, seed {SEED})"
        ),
        "resamples": RESAMPLES,
        "seed": SEED,
        "supporters": supporters,
    }


def summarise(
    rows: list[dict], units: list[dict], system: str, queries: int, options, own: int
) -> dict[str, Any]:
    """A system's entry; `own`: the queries of the split its file has a dialogue for (one left
    out because another system lacks it is no query without a dialogue: `left_out` says it)."""
    entry: dict[str, Any] = {
        "dialogues": sum(u["system"] == system for u in units),
        "queries_without_dialogue": queries - own,
        "supporter_models": sorted({u["supporter_model"] for u in units if u["system"] == system}),
        "simulator_models": sorted({u["simulator_model"] for u in units if u["system"] == system}),
        "unreadable_dimensions": sum(len(r.get("unreadable", ())) for r in rows),
        **session_metrics(rows, options.reward_lambda),
    }
    styles = sorted({u["seeker"] for u in units if u["system"] == system})
    entry["seekers"] = styles
    if styles != [seekers.DEFAULT]:
        entry["by_seeker"] = {
            style: session_metrics([r for r in rows if r.get("seeker") == style], options.reward_lambda)
            for style in styles
        }
    entry["by_category"] = {
        category: session_metrics([r for r in rows if r["category"] == category], options.reward_lambda)
        for category in sorted({r["category"] for r in rows})
    }
    per_turn: dict[int, list[float]] = {}
    for row in rows:
        for turn in row.get("per_turn") or ():
            if turn["harmonic"] is not None:
                per_turn.setdefault(turn["turn"], []).append(turn["harmonic"])
    if per_turn:
        entry["harmonic_by_turn"] = {
            str(turn): {"n": len(values), "harmonic": round(statistics.fmean(values), 4)}
            for turn, values in sorted(per_turn.items())
        }
    return entry


# --- from options (evaluate --dialogues) ---------------------------------------------------------


async def from_options(options, console, settings, retry=False):
    """`personaemp evaluate --dialogues` on evaluate's options."""
    from personaemp.results import of_evaluate

    if options.responses:
        raise InputError("--responses and --dialogues are two evaluations", "run evaluate once for each")
    if options.judges:
        raise InputError("a panel of judges (--judge) is not offered for --dialogues", "pass --judge-model")
    report, evaluation = await aevaluate_dialogues(
        options.splits, [Path(path) for path in options.dialogues], options.output, settings,
        split=options.split, part=options.part, judge_model=options.judge_model,
        options=JudgeOptions(
            dynamic=options.dynamic, samples=options.samples, bystander=options.bystander,
            reward_lambda=options.reward_lambda, unreadable=options.unreadable, layout=options.layout,
        ),
        per_turn=options.per_turn, all_dialogues=options.all_dialogues,
        safety=SafetyRule(behaviours=options.behaviours), retry_failed=retry, console=console,
    )  # fmt: skip
    return of_evaluate(report, evaluation, options.output)
