"""`personaemp evaluate`: score systems' responses on a split, the paper's way (LLM judge).

Per system (a responses file) and query, for each PERM dimension (resonation,
expression, reception) the judge returns a short analysis and a whole score 1-5:
  fixed    (default) against the query's pre-written criteria (`personaemp criteria`),
  dynamic  (PereGRM) writing its own criteria in the same call, k samples averaged.
With `bystander`, a persona-blind judge scores five aspects 0-20 (B = sum / 100).

Per query: H = harmonic mean of the three scores / 5; reward = H + lambda * (B - 1).
The report gives per system the mean of each dimension, Avg (their mean, as the paper's
tables), mean H, B and reward, also by query category and by each Big Five level.

Nothing is made up: a query without a response ("missing") or with a blank one ("empty")
gets the floor (1 on every dimension, B = 0) without a judge call and is counted as such;
a judge reply that cannot be read after the re-asks fails the unit (counted "unparsed",
written to the failures file, retried with --retry-failed), never filled with a default.
Scores are keyed by query id, so no score can land on another query.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from personaemp.aio import sync_twin
from personaemp.errors import InputError, RowError, UnitError, first_problem
from personaemp.io import ErrorPolicy, iter_jsonl, write_json_atomic
from personaemp.llm.reply import split_reasoning
from personaemp.llm.step import Step
from personaemp.prompts import Prompt, load_prompt
from personaemp.records import BIG_FIVE, DIMENSION_DEFINITIONS, DIMENSIONS, Response
from personaemp.runner import ENDPOINT_KINDS
from personaemp.stages.criteria import (
    CriterionReply,
    definitions_hash,
    numbered_memories,
    query_units,
    read_criteria,
)
from personaemp.stages.respond import split_file
from personaemp.stages.split import LEVELS

STAGE = "evaluate"
FLOOR = 1  # the score of a missing or empty response, on every dimension


class ScoreReply(BaseModel):
    analysis: str = Field(description="two or three sentences: criteria met and missed")
    score: int = Field(ge=1, le=5)


class DynamicScoreReply(BaseModel):
    criteria: list[CriterionReply] = Field(min_length=4, max_length=6)
    analysis: str = Field(description="two or three sentences: criteria met and missed")
    score: int = Field(ge=1, le=5)


class Aspect(BaseModel):
    name: str
    score: int = Field(ge=0, le=20)


class BystanderReply(BaseModel):
    aspects: list[Aspect] = Field(min_length=5, max_length=5)


# A judge must be repeatable: temperature 0 unless a run sets it (dynamic@k needs > 0).
JUDGE = Step("judge", ScoreReply, prompt="judge", temperature=0.0)
JUDGE_DYNAMIC = Step("judge_dynamic", DynamicScoreReply, prompt="judge_dynamic", temperature=0.0)
BYSTANDER = Step("bystander", BystanderReply, prompt="bystander", temperature=0.0)
STEPS = (JUDGE, JUDGE_DYNAMIC, BYSTANDER)


@dataclasses.dataclass(frozen=True)
class JudgeOptions:
    dynamic: bool = False
    samples: int = 1
    bystander: bool = False
    reward_lambda: float = 0.5


# --- inputs ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Responses:
    """A responses file: query id -> response (reasoning removed), and where each one is."""

    path: Path
    texts: dict[str, str | None]
    lines: dict[str, int]
    blank: list[int] = dataclasses.field(default_factory=list)  # line numbers of blank lines

    def unknown(self, query_ids: set[str]) -> list[str]:
        """`file:line query_id` of the responses to queries the split does not have."""
        return [f"{self.path}:{line} {qid}" for qid, line in self.lines.items() if qid not in query_ids]


def read_responses(path: Path) -> Responses:
    """A responses file (rows need `query_id` and `response`). A reasoning model's
    `<think>...</think>` is removed first: the judge reads what the user would."""
    hint = 'each line needs query_id and response (a string; null or "" for none)'
    found: dict[str, str | None] = {}
    lines: dict[str, int] = {}
    try:
        for lineno, _, row in iter_jsonl(path, ErrorPolicy("fail")):
            try:
                record = Response.model_validate(row)
            except ValidationError as exc:
                raise InputError(
                    f"{path}:{lineno}: not a response row ({first_problem(exc)})", hint
                ) from None
            if record.query_id in found:
                raise InputError(
                    f"{path}:{lineno}: a second response to {record.query_id} (first at line "
                    f"{lines[record.query_id]})",
                    "keep one response per query",
                )
            response = split_reasoning(record.response)[0] if record.response else record.response
            found[record.query_id], lines[record.query_id] = response, lineno
    except RowError as error:
        raise InputError(f"{error.location}: {error.reason}", hint) from None
    with path.open("rb") as handle:  # skipped by the reader; named, as a lost response may hide there
        blank = [number for number, line in enumerate(handle, 1) if line.isspace()]
    return Responses(path, found, lines, blank)


def check_systems_answer(systems: dict[str, Responses], query_ids: set[str], splits, split, part) -> None:
    """Stop when a responses file is empty or answers no query of the split: every query
    would score the floor, a table of nothing (typically another split's file)."""
    for file in systems.values():
        if not file.texts:
            raise InputError(f"{file.path}: no responses", "run `personaemp respond` for this split first")
        if query_ids.isdisjoint(file.texts):
            belongs = [
                f"{other} {other_part}"
                for other in ("random", "ood")
                for other_part in ("test", "train")
                if (other, other_part) != (split, part)
                and (path := Path(splits) / other / f"{other_part}.jsonl").exists()
                and not {q["query_id"] for q in query_units(path, "")}.isdisjoint(file.texts)
            ]
            where = f" (they answer the {' and '.join(belongs)} split)" if belongs else ""
            raise InputError(
                f"{file.path}: none of its {len(file.texts)} responses answers a query of the "
                f"{split} {part} split{where}",
                "pass the responses of this split, or choose the split they belong to with --split/--part",
            )


def system_names(paths: Sequence[Path]) -> list[str]:
    """A system is named by its responses file's stem; two files may not share one."""
    names = [Path(path).stem for path in paths]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InputError(f"two responses files are both named {repeated[0]!r}", "rename one of them")
    if not names:
        raise InputError("no responses file given", "pass --responses FILE (repeat it for several systems)")
    return names


def build_units(queries: list[dict], systems: dict[str, Responses], criteria, dynamic: bool):
    units = []
    for system, file in systems.items():
        responses = file.texts
        for query in queries:
            response = responses.get(query["query_id"])
            units.append(
                {
                    "unit_id": f"{system}/{query['query_id']}",
                    "system": system,
                    **query,
                    "response": response,
                    "status": "missing"
                    if query["query_id"] not in responses
                    else "empty"
                    if not (response or "").strip()
                    else "judged",
                    "criteria": None if dynamic else criteria[query["query_id"]],
                }
            )
    return units


# --- the judge calls ---------------------------------------------------------------------------


def criteria_text(criteria: list[dict]) -> str:
    return "\n".join(f"- ({c['weight']:g}) {c['name']}: {c['description']}" for c in criteria)


def judge_messages(unit: dict, dimension: str, prompt: Prompt) -> list[dict]:
    values = {
        "dimension": dimension,
        "definition": DIMENSION_DEFINITIONS[dimension],
        "profile": unit["profile"] or "(none)",
        "memories": numbered_memories(unit["memories"]),
        "situation": unit["situation"],
        "query": unit["query"],
        "response": unit["response"] or "",
    }
    if unit["criteria"] is not None:
        values["criteria"] = criteria_text(unit["criteria"][dimension])
    return prompt.render(**values)


async def score_unit(engine, unit: dict, options: JudgeOptions, prompts: dict[str, Prompt]) -> dict:
    row: dict[str, Any] = {
        key: unit[key]
        for key in ("unit_id", "system", "query_id", "user_id", "category", "big_five", "status")
    }
    if unit["status"] != "judged":
        row["scores"] = dict.fromkeys(DIMENSIONS, float(FLOOR))
        row["bystander"] = 0.0 if options.bystander else None
        return row
    step = JUDGE_DYNAMIC if options.dynamic else JUDGE
    scores, samples, analyses, unparsed_samples = {}, {}, {}, 0
    for dimension in DIMENSIONS:
        messages = judge_messages(unit, dimension, prompts[step.name])
        got, notes, last_error, dropped = [], [], None, 0
        for sample in range(options.samples if options.dynamic else 1):
            try:
                reply = await engine.call(step, messages, sample=sample)
            except UnitError as error:
                if error.kind in ENDPOINT_KINDS or not options.dynamic:
                    raise
                last_error, dropped = error, dropped + 1  # one unreadable sample of k: counted
                continue
            got.append(reply.value.score)
            notes.append(reply.value.analysis)
        if not got:
            raise last_error  # type: ignore[misc]  # every sample failed
        scores[dimension] = statistics.fmean(got)
        samples[dimension], analyses[dimension] = got, notes[0]
        unparsed_samples += dropped
    row.update(
        scores=scores, samples=samples, analyses=analyses, bystander=None, unparsed_samples=unparsed_samples
    )
    if options.bystander:
        reply = await engine.call(BYSTANDER, prompts[BYSTANDER.name].render(
            query=unit["query"], response=unit["response"]))  # fmt: skip
        row["bystander"] = sum(aspect.score for aspect in reply.value.aspects) / 100
        row["bystander_aspects"] = [aspect.model_dump() for aspect in reply.value.aspects]
    return row


# --- the stage ---------------------------------------------------------------------------------


async def aevaluate(
    splits: Path,
    responses: Sequence[Path],
    report_path: Path,
    settings,
    *,
    split: str = "random",
    part: str = "test",
    criteria_file: Path | None = None,
    judge_model: str | None = None,
    options: JudgeOptions | None = None,
    retry_failed: bool = False,
    console=None,
):
    """Score every system on every query of the split part; returns (stage report, evaluation)."""
    from personaemp.llm.run import arun_llm_stage

    options = options or JudgeOptions()
    if options.samples < 1:
        raise InputError("--samples must be at least 1")
    if options.samples > 1 and not options.dynamic:
        raise InputError("--samples applies to --dynamic judging", "add --dynamic, or leave --samples out")
    if judge_model:
        settings = dataclasses.replace(settings, model=judge_model)
    step = JUDGE_DYNAMIC if options.dynamic else JUDGE
    temperature = settings.steps.get(step.name, {}).get("temperature", step.temperature)
    if options.samples > 1 and settings.seed is not None:
        raise InputError(
            f"--samples {options.samples} with --seed would send {options.samples} identical requests",
            "leave --seed out when sampling several judgments",
        )
    if options.samples > 1 and temperature == 0:
        raise InputError(
            f"--samples {options.samples} at temperature 0 would give {options.samples} identical judgments",
            "set --step judge_dynamic.temperature=0.7 (or another value above 0)",
        )
    input_path = split_file(splits, split, part)
    queries = query_units(input_path, "pass a split file written by `personaemp split`")
    names = system_names(responses)
    systems = {name: read_responses(Path(path)) for name, path in zip(names, responses, strict=True)}
    check_systems_answer(systems, {q["query_id"] for q in queries}, splits, split, part)
    criteria = None
    if not options.dynamic:
        if criteria_file is None or not Path(criteria_file).exists():
            raise InputError(
                f"{criteria_file}: no criteria file",
                "run `personaemp criteria` first, or judge with --dynamic",
            )
        criteria = read_criteria(Path(criteria_file))
        lacking = [q["query_id"] for q in queries if q["query_id"] not in criteria]
        if lacking:
            raise InputError(
                f"{criteria_file}: no criteria for {len(lacking)} of the {len(queries)} queries "
                f"(e.g. {lacking[0]})",
                "run `personaemp criteria` on the queries this split was made from",
            )
    units = build_units(queries, systems, criteria, options.dynamic)
    used = [step, *([BYSTANDER] if options.bystander else [])]
    prompts = {s.name: load_prompt(s.prompt) for s in used}
    scores_path = scores_file(report_path)
    failures_path = report_path.with_name(f"{report_path.stem}.failures.jsonl")

    def make_work(engine):
        async def work(unit: dict) -> dict:
            return await score_unit(engine, unit, options, prompts)

        return work

    mode = f"dynamic@{options.samples}" if options.dynamic else "fixed"
    report = await arun_llm_stage(
        STAGE,
        units,
        make_work,
        settings=settings,
        key="unit_id",
        output=scores_path,
        fingerprint=lambda engine: "|".join(
            [
                *(engine.fingerprint(s, prompts[s.name].hash) for s in used),
                mode,
                definitions_hash(),
                f"floor{FLOOR}",
            ]
        ),
        input_path=input_path,
        retry_failed=retry_failed,
        console=console,
        failures=failures_path,
        chain=[
            (step, len(DIMENSIONS) * (options.samples if options.dynamic else 1)),
            *([(BYSTANDER, 1)] if options.bystander else []),
        ],  # fmt: skip
    )
    if report.estimate is not None or (report.batch and report.batch["files"]):
        return report, None  # nothing judged yet for some units: no report to write
    query_ids = {q["query_id"] for q in queries}
    unknown = {name: file.unknown(query_ids) for name, file in systems.items()}
    evaluation = summarise(
        scores_path,
        failures_path,
        units,
        names,
        options,
        header={
            "split": split,
            "part": part,
            "input": str(input_path),
            "responses": {name: str(path) for name, path in zip(names, responses, strict=True)},
            "criteria_file": None if options.dynamic else str(criteria_file),
            "judge_model": report.model,
            "mode": mode,
            "lambda": options.reward_lambda,
            "prompts": {name: prompt.hash for name, prompt in prompts.items()},
            "scores_file": str(scores_path),
        },
    )
    for name, found in unknown.items():
        # Not an error: a responses file may cover both splits. Named, so a typo shows.
        evaluation["systems"][name]["unknown_query_ids"] = len(found)
        evaluation["systems"][name]["unknown_examples"] = found[:20]
        evaluation["systems"][name]["blank_lines"] = [
            f"{systems[name].path}:{n}" for n in systems[name].blank
        ]
    write_json_atomic(report_path, evaluation)
    return report, evaluation


evaluate = sync_twin(aevaluate)


def scores_file(report_path: Path) -> Path:
    return report_path.with_name(f"{report_path.stem}.scores.jsonl")


# --- the numbers -------------------------------------------------------------------------------


def harmonic(scores: dict[str, float]) -> float:
    """Harmonic mean of the dimensions normalised to [0, 1] (score / 5)."""
    return len(DIMENSIONS) / sum(5 / scores[d] for d in DIMENSIONS)


def metrics(rows: list[dict], reward_lambda: float) -> dict[str, Any]:
    """Means over the scored rows (`n`: judged, missing and empty ones; not the unparsed):
    each dimension, Avg, H, and B and reward when judged."""
    if not rows:
        return {"n": 0}
    dims = {d: round(statistics.fmean(r["scores"][d] for r in rows), 3) for d in DIMENSIONS}
    result: dict[str, Any] = {"n": len(rows), "dimensions": dims}
    result["avg"] = round(statistics.fmean(dims.values()), 3)
    hs = [harmonic(r["scores"]) for r in rows]
    result["harmonic"] = round(statistics.fmean(hs), 4)
    if all(r.get("bystander") is not None for r in rows):
        result["bystander"] = round(statistics.fmean(r["bystander"] for r in rows), 4)
        rewards = [h + reward_lambda * (r["bystander"] - 1) for h, r in zip(hs, rows, strict=True)]
        result["reward"] = round(statistics.fmean(rewards), 4)
    return result


def summarise(scores_path, failures_path, units, systems, options, header) -> dict[str, Any]:
    """The report: per system, counts, metrics and their breakdowns (from the scores file)."""
    wanted = {unit["unit_id"] for unit in units}
    rows = defaultdict(list)
    if scores_path.exists():
        for _, _, row in iter_jsonl(scores_path, ErrorPolicy("fail")):
            if row["unit_id"] in wanted:
                rows[row["system"]].append(row)
    failed = defaultdict(Counter)
    if failures_path.exists():
        for _, _, row in iter_jsonl(failures_path, ErrorPolicy("fail")):
            if row["unit_id"] in wanted:
                failed[row["unit_id"].split("/", 1)[0]][row["kind"]] += 1
    per_system = Counter(unit["system"] for unit in units)
    result = {**header, "systems": {}}
    for system in systems:
        scored = rows[system]
        status = Counter(row["status"] for row in scored)
        entry = {
            "queries": per_system[system],
            "judged": status["judged"],
            "missing": status["missing"],
            "empty": status["empty"],
            # A judgment that could not be read; endpoint failures (retried by the next run) apart.
            "unparsed": sum(n for kind, n in failed[system].items() if kind not in ENDPOINT_KINDS),
            "endpoint_failures": sum(n for kind, n in failed[system].items() if kind in ENDPOINT_KINDS),
            "unparsed_samples": sum(row.get("unparsed_samples", 0) for row in scored),
            "failures_by_kind": dict(failed[system]),
            **metrics(scored, options.reward_lambda),
        }
        entry["by_category"] = {
            category: metrics([r for r in scored if r["category"] == category], options.reward_lambda)
            for category in sorted({r["category"] for r in scored})
        }
        entry["by_big_five"] = {
            trait: {
                level: metrics(
                    [r for r in scored if (r.get("big_five") or {}).get(trait) == level],
                    options.reward_lambda,
                )
                for level in LEVELS
            }
            for trait in BIG_FIVE
        }
        result["systems"][system] = entry
    return result
