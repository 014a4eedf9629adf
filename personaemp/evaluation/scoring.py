"""What single-turn `evaluate` and session `evaluate --dialogues` share: one unit's judgments
under the rules (missing, unreadable, @k samples, the bystander), the numbers over scored rows,
and where the scores go."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from personaemp.errors import UnitError
from personaemp.instruments.judges import (
    BYSTANDER,
    FLOOR,
    JUDGE,
    JUDGE_DYNAMIC,
    NEUTRAL,
    JudgeOptions,
    harmonic,
    judge_messages,
    step_temperature,
)
from personaemp.prompts import Prompt
from personaemp.records import DIMENSIONS
from personaemp.units import ENDPOINT_KINDS


async def score_unit(
    engine, unit: dict, options: JudgeOptions, prompts: dict[str, Prompt], *, step=None, build=judge_messages
) -> dict:
    """The judgments of one unit under the rules of `options`. `step` and `build` (the judge
    step and its request builder): the single-turn judges by default, the session judges for
    dialogues (evaluation/dialogues.py)."""
    row: dict[str, Any] = {
        key: unit[key]
        for key in ("unit_id", "system", "query_id", "user_id", "category", "big_five", "status")
    }
    row["truncated"], row["cut_in_reasoning"] = unit["truncated"], unit["cut_in_reasoning"]
    if unit["status"] != "judged":
        row["scores"] = dict.fromkeys(DIMENSIONS, float(FLOOR))
        row["bystander"] = 0.0 if options.bystander else None
        return row
    step = step or (JUDGE_DYNAMIC if options.dynamic else JUDGE)
    authors = options.unreadable == "authors"
    scores, samples, analyses, unparsed_samples, neutral, unreadable = {}, {}, {}, 0, 0, []
    for dimension in DIMENSIONS:
        messages = build(unit, dimension, prompts[step.name], options.layout)
        got, notes, last_error, dropped = [], [], None, 0
        for sample in range(options.samples if options.dynamic else 1):
            try:
                reply = await engine.call(step, messages, sample=sample)
            except UnitError as error:
                if error.kind in ENDPOINT_KINDS or not (options.dynamic or authors):
                    raise
                last_error = error
                if options.dynamic and authors:
                    got.append(NEUTRAL)  # the authors' reward: an unread judgment is 3 of 5
                    neutral += 1
                elif options.dynamic:
                    dropped += 1  # one unreadable sample of k: left out, counted
                continue
            got.append(reply.value.score)
            notes.append(reply.value.analysis)
        unparsed_samples += dropped
        if not got and not options.dynamic:
            unreadable.append(dimension)  # eval.py: this dimension's mean goes without it
            continue
        if not got:
            raise last_error  # type: ignore[misc]  # every sample failed
        scores[dimension] = statistics.fmean(got)
        samples[dimension], analyses[dimension] = got, notes[0] if notes else None
    row.update(
        scores=scores, samples=samples, analyses=analyses, bystander=None, unparsed_samples=unparsed_samples,
        neutral_samples=neutral, unreadable=unreadable,
    )  # fmt: skip
    if options.bystander:
        reply = await engine.call(BYSTANDER, prompts[BYSTANDER.name].render(
            query=unit["query"], response=unit["response"]))  # fmt: skip
        row["bystander_aspects"] = reply.value.model_dump()
        row["bystander"] = sum(row["bystander_aspects"].values()) / 100
    return row


def temperatures(settings, steps) -> dict[str, float]:
    return {step.name: step_temperature(settings, step) for step in steps}


def scores_file(report_path: Path) -> Path:
    return report_path.with_name(f"{report_path.stem}.scores.jsonl")


def failures_file(report_path: Path) -> Path:
    return report_path.with_name(f"{report_path.stem}.failures.jsonl")


def metrics(rows: list[dict], reward_lambda: float, missing: str = JudgeOptions.missing) -> dict[str, Any]:
    """Means over the scored rows (`n`: judged, missing and empty ones with the floor rule,
    the judged only with "skip"; never the unparsed): each dimension over the rows that have
    it (`n_by_dimension` when an unreadable judgment left one out), Avg (the mean of the
    unrounded dimension means), H over the rows with all three, and B and reward when judged."""
    if missing == "skip":
        rows = [r for r in rows if r["status"] == "judged"]
    if not rows:
        return {"n": 0}
    per = {d: [r["scores"][d] for r in rows if d in r["scores"]] for d in DIMENSIONS}
    means = {d: statistics.fmean(found) for d, found in per.items() if found}
    result: dict[str, Any] = {"n": len(rows), "dimensions": {d: round(m, 3) for d, m in means.items()}}
    if any(len(found) != len(rows) for found in per.values()):
        result["n_by_dimension"] = {d: len(found) for d, found in per.items()}
    if len(means) < len(DIMENSIONS):
        return result
    result["avg"] = round(statistics.fmean(means.values()), 3)
    rows = [r for r in rows if len(r["scores"]) == len(DIMENSIONS)]
    hs = [harmonic(r["scores"]) for r in rows]
    result["harmonic"] = round(statistics.fmean(hs), 4) if hs else None
    if rows and all(r.get("bystander") is not None for r in rows):
        result["bystander"] = round(statistics.fmean(r["bystander"] for r in rows), 4)
        rewards = [h + reward_lambda * (r["bystander"] - 1) for h, r in zip(hs, rows, strict=True)]
        result["reward"] = round(statistics.fmean(rewards), 4)
    return result
