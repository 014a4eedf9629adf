"""`personaemp evaluate`: score systems' responses on a split, the paper's way (LLM judge).

The instruments ask for what the authors' do (`evaluation/eval.py` and the reward judge of
`train/verl/utils/reward_score/peregrm_reward.py`, ZhengWwwq/PersonalizedEmpathy), in our
words. Per system (a responses file) and query, for each PERM dimension (resonation,
expression, reception) the judge returns an analysis and a score 1-5 (one decimal allowed):
  fixed    (default) holistic, against the query's pre-written criteria (`personaemp
           criteria`); anchors 1 (fails them, or a serious lapse of emotional
           intelligence), 3 (partly), 5 (all of them, high-weight and persona-informed too);
  dynamic  (PereGRM) step by step, as strictly as it can, writing its own criteria for this
           user first; k samples averaged.
With `bystander`, a persona-blind judge scores the authors' five aspects 0-20 (content
effectiveness, logical structure and clarity, communication efficiency, objectivity and
neutrality, accuracy and verifiability; B = sum / 100): the penalty on padded,
over-emotional replies. Every text from a user or a policy reaches a judge inside a data
block it cannot close (personaemp.prompts.fence).

Per query: H = harmonic mean of the three scores / 5; reward = H + lambda * (B - 1).
The report gives per system the mean of each dimension, Avg (the mean of the unrounded
dimension means, as the paper's tables), mean H, B and reward, also by query category and
by each Big Five level; with a panel of judges (`judges`), each judge's numbers side by
side and how far the judges agree.

By default each request is laid out as the authors' (its dimension's standard, then the
context, then the reply: `layout="paper"`); `layout="shared"` puts the three standards in a
task every request shares, for a provider's prefix cache. The report names the layout.

Missing responses (`missing`): "skip", the authors' rule, judges what their eval.py judges
(any non-empty response, the text after `</think>` when it holds a `<think>`; blank and cut
ones included) and leaves the rest out of the means; "floor" gives a query without a visible
response ("missing": no row, or a reply cut while reasoning) or with a blank one ("empty")
1 on every dimension (B = 0) without a judge call. Unreadable judgments (`unreadable`): with
"authors", a fixed judgment that cannot be read after the re-asks leaves that dimension of
that query out of its mean (eval.py), a dynamic one counts 3 of 5 (their reward); with
"fail" the unit fails (counted "unparsed", written to the failures file, retried with
--retry-failed) and an unreadable sample of k is left out. The report names both rules and
counts the queries each touched. Scores are keyed by query id, so no score can land on
another query.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from personaemp.aio import sync_twin
from personaemp.errors import InputError, RowError, first_problem
from personaemp.evaluation.scoring import failures_file, metrics, score_unit, scores_file, temperatures
from personaemp.instruments.criteria import (
    check_made_for,
    definitions_hash,
    made_for,
    query_hash,
    query_units,
    read_criteria,
    remake_criteria,
    with_room,
)
from personaemp.instruments.judges import (
    BYSTANDER,
    DYNAMIC_ASPECTS,
    FLOOR,
    JUDGE,
    JUDGE_DYNAMIC,
    MISSING_RULES,
    ROOM,
    UNREADABLE_RULES,
    JudgeOptions,
    authors_view,
    check_sampling,
    cut_while_reasoning,
    kendall_tau,
    spearman,
)
from personaemp.instruments.judges import STEPS as STEPS  # the stage's steps
from personaemp.io import ErrorPolicy, iter_jsonl, write_json_atomic
from personaemp.llm.reply import split_reasoning
from personaemp.prompts import LAYOUTS, load_prompt
from personaemp.records import BIG_FIVE, DIMENSIONS, Response
from personaemp.results import of_evaluate
from personaemp.splits import LEVELS, split_file
from personaemp.summaries import print_stage_report
from personaemp.units import ENDPOINT_KINDS

STAGE = "evaluate"


# --- inputs ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Responses:
    """A responses file: query id -> response (reasoning removed), and where each one is."""

    path: Path
    texts: dict[str, str | None]
    lines: dict[str, int]
    blank: list[int] = dataclasses.field(default_factory=list)  # line numbers of blank lines
    # query id -> {"truncated", "cut_in_reasoning"}: a reply cut by the token limit is judged on
    # its visible text; one cut while reasoning has none (missing). Both are counted.
    flags: dict[str, dict[str, bool]] = dataclasses.field(default_factory=dict)
    raw: dict[str, str | None] = dataclasses.field(default_factory=dict)  # as written, reasoning kept

    def unknown(self, query_ids: set[str]) -> list[str]:
        """`file:line query_id` of the responses to queries the split does not have."""
        return [f"{self.path}:{line} {qid}" for qid, line in self.lines.items() if qid not in query_ids]


def read_responses(path: Path) -> Responses:
    """A responses file (rows need `query_id` and `response`). A reasoning model's
    `<think>...</think>` is removed first: the judge reads what the user would."""
    hint = 'each line needs query_id and response (a string; null or "" for none)'
    found: dict[str, str | None] = {}
    lines: dict[str, int] = {}
    flags: dict[str, dict[str, bool]] = {}
    raw: dict[str, str | None] = {}
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
            raw[record.query_id] = record.response
            flags[record.query_id] = {
                "truncated": row.get("truncated") is True,
                "cut_in_reasoning": row.get("cut_in_reasoning") is True
                or (not response and bool(record.response) and cut_while_reasoning(record.response)),
            }
    except RowError as error:
        raise InputError(f"{error.location}: {error.reason}", hint) from None
    with path.open("rb") as handle:  # skipped by the reader; named, as a lost response may hide there
        blank = [number for number, line in enumerate(handle, 1) if line.isspace()]
    return Responses(path, found, lines, blank, flags, raw)


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


def build_units(queries: list[dict], systems: dict[str, Responses], criteria, dynamic: bool, missing: str):
    """One unit per system and query. Its `status`: judged, or (not judged) missing / empty:
    under "skip" what the authors' eval.py would not send (no response, or an empty one),
    under "floor" what the user would not see (no response, a blank one, cut while reasoning)."""
    units = []
    for system, file in systems.items():
        responses = file.texts
        for query in queries:
            qid = query["query_id"]
            response = responses.get(qid)
            flags = file.flags.get(qid, {"truncated": False, "cut_in_reasoning": False})
            if missing == "skip":
                response = authors_view(file.raw.get(qid))
                status = "missing" if qid not in responses else "empty" if response is None else "judged"
            else:
                status = (
                    "missing"
                    if qid not in responses or flags["cut_in_reasoning"]
                    else "empty"
                    if not (response or "").strip()
                    else "judged"
                )
            units.append(
                {
                    "unit_id": f"{system}/{qid}",
                    "system": system,
                    **query,
                    "response": response,
                    **flags,
                    "status": status,
                    "criteria": None if dynamic else criteria[qid],
                }
            )
    return units


# --- the judge calls ---------------------------------------------------------------------------


# --- the stage ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Judge:
    """One judge of a panel: a name (for files and tables) and the engine settings to ask it with."""

    name: str
    settings: Any  # LLMSettings


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
    judges: Sequence[Judge] = (),
    options: JudgeOptions | None = None,
    retry_failed: bool = False,
    console=None,
):
    """Score every system on every query of the split part, by one judge (`settings`, with
    `judge_model`) or by each judge of a panel; returns the StageResult, as `pe.evaluate`
    does: `.report` the (first) judge's run report, `.judges` a panel's, one per judge, and
    `.summary` the evaluation (None while an estimate or a batch round leaves judgments to come)."""
    options = options or JudgeOptions()
    if options.samples < 1:
        raise InputError("--samples must be at least 1")
    if options.samples > 1 and not options.dynamic:
        raise InputError("--samples applies to --dynamic judging", "add --dynamic, or leave --samples out")
    if options.missing not in MISSING_RULES:
        raise InputError(f"--missing takes {', '.join(MISSING_RULES)}, not {options.missing!r}")
    if options.unreadable not in UNREADABLE_RULES:
        raise InputError(f"--unreadable takes {', '.join(UNREADABLE_RULES)}, not {options.unreadable!r}")
    if options.layout not in LAYOUTS:
        raise InputError(f"--layout takes {', '.join(LAYOUTS)}, not {options.layout!r}")
    panel = list(judges)
    if not panel:
        model = judge_model or settings.model
        panel = [
            Judge(
                str(model or "judge"), dataclasses.replace(settings, model=model) if judge_model else settings
            )
        ]
    names = [judge.name for judge in panel]
    if len(set(names)) < len(names):
        raise InputError(f"two judges are both named {next(n for n in names if names.count(n) > 1)!r}")
    panel = [Judge(judge.name, with_room(judge.settings, ROOM)) for judge in panel]
    step = JUDGE_DYNAMIC if options.dynamic else JUDGE
    for judge in panel:
        check_sampling(judge.settings, step, options)
    input_path = split_file(splits, split, part)
    queries = query_units(input_path, "pass a split file written by `personaemp split`")
    systems_names = system_names(responses)
    systems = {name: read_responses(Path(path)) for name, path in zip(systems_names, responses, strict=True)}
    check_systems_answer(systems, {q["query_id"] for q in queries}, splits, split, part)
    for file in systems.values():
        check_made_for(
            file.path, made_for(file.path), queries, "responses",
            f"personaemp respond --splits {splits} --split {split} --part {part} --output {file.path}",
        )  # fmt: skip
    criteria = None
    if not options.dynamic:
        criteria = checked_criteria(criteria_file, queries, input_path)
    units = build_units(queries, systems, criteria, options.dynamic, options.missing)
    used = [step, *([BYSTANDER] if options.bystander else [])]
    prompts = {s.name: load_prompt(s.prompt) for s in used}
    mode = f"dynamic@{options.samples}" if options.dynamic else "fixed"
    single = len(panel) == 1 and not judges
    reports, results = [], {}
    for judge in panel:
        base = report_path if single else report_path.with_name(f"{report_path.stem}.{judge.name}.json")
        report = await ajudge_all(judge.settings, units, options, prompts, used, mode, input_path, base,
                                  retry_failed, console)  # fmt: skip
        reports.append(report)
        results[judge.name] = (report, base)
    if any(r.estimate is not None or (r.batch and r.batch["files"]) for r in reports):
        # nothing judged yet for some units: no evaluation
        return of_evaluate(reports[0] if single else reports, None, report_path)
    query_ids = {q["query_id"] for q in queries}
    header = {
        "split": split,
        "part": part,
        "input": str(input_path),
        "responses": {name: str(path) for name, path in zip(systems_names, responses, strict=True)},
        "criteria_file": None if options.dynamic else str(criteria_file),
        "mode": mode,
        "lambda": options.reward_lambda,
        "missing_rule": options.missing,
        "unreadable_rule": options.unreadable,
        "layout": options.layout,
        "avg": "mean of the unrounded dimension means (1-5); H: mean per-query harmonic mean (0-1)",
        # Which instruments made these numbers: the prompts' hashes and the steps' versions.
        "prompts": {name: prompt.hash for name, prompt in prompts.items()},
        "instruments": {s.name: f"v{s.version}/{prompts[s.name].hash}" for s in used},
        "temperatures": temperatures(panel[0].settings, used),
        # What each query was when it was scored: `table` refuses a report whose split changed.
        "query_hashes": {q["query_id"]: query_hash(q) for q in queries},
    }
    per_judge = {}
    for judge in panel:
        report, base = results[judge.name]
        entry = summarise(scores_file(base), failures_file(base), units, systems_names, options)
        for name, file in systems.items():
            # Not an error: a responses file may cover both splits. Named, so a typo shows.
            found = file.unknown(query_ids)
            entry[name]["unknown_query_ids"] = len(found)
            entry[name]["unknown_examples"] = found[:20]
            entry[name]["blank_lines"] = [f"{file.path}:{n}" for n in file.blank]
        per_judge[judge.name] = {
            "judge_model": report.model,
            "temperatures": temperatures(judge.settings, used),
            "scores_file": str(scores_file(base)),
            "systems": entry,
        }
    first = per_judge[panel[0].name]
    evaluation = {
        **header,
        "judge_model": first["judge_model"],
        "scores_file": first["scores_file"],
        "systems": first["systems"],
    }
    if not single:
        evaluation["judges"] = per_judge
        evaluation["agreement"] = agreement(per_judge, {unit["unit_id"] for unit in units})
    write_json_atomic(report_path, evaluation)
    return of_evaluate(reports[0] if single else reports, evaluation, report_path)


def checked_criteria(criteria_file: Path | None, queries: list[dict], input_path: Path) -> dict:
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
    check_made_for(
        Path(criteria_file), made_for(Path(criteria_file)), queries, "criteria",
        remake_criteria(input_path, criteria_file),
    )  # fmt: skip
    return criteria


async def ajudge_all(settings, units, options, prompts, used, mode, input_path, base, retry_failed, console):
    """One judge over every unit, into `<base>.scores.jsonl`; returns the stage report."""
    from personaemp.llm.stage import LLMStage, arun_llm_stage

    step = used[0]

    def make_work(engine):
        async def work(unit: dict) -> dict:
            return await score_unit(engine, unit, options, prompts)

        return work

    plan = LLMStage(
        STAGE,
        units,
        make_work,
        key="unit_id",
        output=scores_file(base),
        fingerprint=lambda engine: "|".join(
            [
                *(engine.fingerprint(s, prompts[s.name].hash) for s in used),
                mode,
                definitions_hash(DYNAMIC_ASPECTS),
                f"floor{FLOOR}",
                f"layout={options.layout}",
                f"unreadable={options.unreadable}",
            ]
        ),
        input_path=input_path,
        retry_failed=retry_failed,
        failures=failures_file(base),
        steps=[step, *([BYSTANDER] if options.bystander else [])],
        calls={step.name: len(DIMENSIONS) * (options.samples if options.dynamic else 1)},
    )
    return await arun_llm_stage(plan, settings=settings, console=console)


evaluate = sync_twin(aevaluate)


# --- the numbers -------------------------------------------------------------------------------


def read_scores(scores_path: Path, wanted: set[str]) -> dict[str, list[dict]]:
    rows = defaultdict(list)
    if scores_path.exists():
        for _, _, row in iter_jsonl(scores_path, ErrorPolicy("fail")):
            if row["unit_id"] in wanted:
                rows[row["system"]].append(row)
    return rows


def summarise(scores_path, failures_path, units, systems, options) -> dict[str, Any]:
    """Per system: counts, metrics and their breakdowns (from the scores file)."""
    wanted = {unit["unit_id"] for unit in units}
    rows = read_scores(scores_path, wanted)
    failed = defaultdict(Counter)
    if failures_path.exists():
        for _, _, row in iter_jsonl(failures_path, ErrorPolicy("fail")):
            if row["unit_id"] in wanted:
                failed[row["unit_id"].split("/", 1)[0]][row["kind"]] += 1
    per_system = Counter(unit["system"] for unit in units)
    flagged = {
        key: Counter(u["system"] for u in units if u[key]) for key in ("truncated", "cut_in_reasoning")
    }
    result = {}
    rule = options.missing
    for system in systems:
        scored = rows[system]
        status = Counter(row["status"] for row in scored)
        entry = {
            "queries": per_system[system],
            "judged": status["judged"],
            "missing": status["missing"],
            "empty": status["empty"],
            # Replies cut by the token limit (judged on their visible text), and replies cut
            # while reasoning (nothing visible: missing).
            "truncated": flagged["truncated"][system],
            "cut_in_reasoning": flagged["cut_in_reasoning"][system],
            # A judgment that could not be read; endpoint failures (retried by the next run) apart.
            "unparsed": sum(n for kind, n in failed[system].items() if kind not in ENDPOINT_KINDS),
            "endpoint_failures": sum(n for kind, n in failed[system].items() if kind in ENDPOINT_KINDS),
            "unparsed_samples": sum(row.get("unparsed_samples", 0) for row in scored),
            # The unreadable rule "authors": dimensions left out (fixed), samples counted 3 (dynamic).
            "unreadable_dimensions": sum(len(row.get("unreadable", ())) for row in scored),
            "neutral_samples": sum(row.get("neutral_samples", 0) for row in scored),
            "unreadable_queries": sum(
                bool(row.get("unreadable") or row.get("neutral_samples")) for row in scored
            ),
            # Queries the missing rule touched: left out ("skip") or scored the floor ("floor").
            "missing_rule_queries": status["missing"] + status["empty"],
            "failures_by_kind": dict(failed[system]),
            **metrics(scored, options.reward_lambda, rule),
        }
        entry["by_category"] = {
            category: metrics([r for r in scored if r["category"] == category], options.reward_lambda, rule)
            for category in sorted({r["category"] for r in scored})
        }
        entry["by_big_five"] = {
            trait: {
                level: metrics(
                    [r for r in scored if (r.get("big_five") or {}).get(trait) == level],
                    options.reward_lambda,
                    rule,
                )
                for level in LEVELS
            }
            for trait in BIG_FIVE
        }
        result[system] = entry
    return result


# --- how far the judges agree ------------------------------------------------------------------


def agreement(per_judge: dict[str, dict], wanted: set[str]) -> dict[str, dict]:
    """Per pair of judges: Kendall's tau between their rankings of the systems (by Avg, H and
    each dimension), and the rank correlation of their per-query scores, per dimension, over
    the responses both judged."""
    names = list(per_judge)
    found = {}
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            a, b = per_judge[first]["systems"], per_judge[second]["systems"]
            systems = [s for s in a if a[s].get("n") and b[s].get("n")]
            tau = {
                key: kendall_tau([pick(a[s]) for s in systems], [pick(b[s]) for s in systems])
                for key, pick in (
                    ("avg", lambda e: e["avg"]),
                    ("harmonic", lambda e: e["harmonic"]),
                    *((d, lambda e, d=d: e["dimensions"][d]) for d in DIMENSIONS),
                )
            }
            rows_a, rows_b = (
                {
                    r["unit_id"]: r
                    for rs in read_scores(Path(per_judge[n]["scores_file"]), wanted).values()
                    for r in rs
                }
                for n in (first, second)
            )
            both = sorted(u for u in rows_a.keys() & rows_b.keys() if rows_a[u]["status"] == "judged")
            per_query = {}
            for d in DIMENSIONS:
                pairs = [u for u in both if d in rows_a[u]["scores"] and d in rows_b[u]["scores"]]
                per_query[d] = spearman(
                    [rows_a[u]["scores"][d] for u in pairs], [rows_b[u]["scores"][d] for u in pairs]
                )
            found[f"{first}~{second}"] = {
                "systems": len(systems),
                "kendall_tau_systems": {k: None if v is None else round(v, 4) for k, v in tau.items()},
                "responses": len(both),
                "spearman_per_query": {k: None if v is None else round(v, 4) for k, v in per_query.items()},
            }
    return found


def judge_panel(options, settings, env: Mapping[str, str] | None = None) -> list:
    """The engine settings of each judge of `--judge`/[[evaluate.judges]]: its endpoint, model
    and key over the run's; the key read from its variable only."""
    import os

    from personaemp.errors import PersonaempError

    env = os.environ if env is None else env
    panel = []
    for spec in options.judges:
        key = settings.api_key
        if spec.key_env is not None:
            key = env.get(spec.key_env) or None
            if key is None:
                raise PersonaempError(  # the environment, not the input: exit 1
                    f"judge {spec.name}: ${spec.key_env} is not set", f"export {spec.key_env}=... first"
                )
        changes: dict = {"model": spec.model or options.judge_model or settings.model, "api_key": key}
        if spec.base_url:
            changes["base_urls"] = [spec.base_url]
        panel.append(Judge(spec.name, dataclasses.replace(settings, **changes)))
    return panel


# --- from options (the command and pe.*) ----------------------------------------------------------


async def from_options(options, console, settings, retry=False, env=None):
    """`personaemp evaluate` on its options (`--dialogues`: evaluation/dialogues.py)."""
    if options.dialogues:
        from personaemp.evaluation.dialogues import from_options as dialogues_from_options

        return await dialogues_from_options(options, console, settings, retry)

    return await aevaluate(
        options.splits, [Path(path) for path in options.responses], options.output, settings,
        split=options.split, part=options.part, criteria_file=options.criteria,
        judge_model=options.judge_model, judges=judge_panel(options, settings, env),
        options=JudgeOptions(
            dynamic=options.dynamic, samples=options.samples, bystander=options.bystander,
            reward_lambda=options.reward_lambda, missing=options.missing,
            unreadable=options.unreadable, layout=options.layout,
        ),
        retry_failed=retry, console=console,
    )  # fmt: skip


def print_summary(result, console) -> None:
    """`personaemp evaluate`'s run report, one per judge of a panel (the command prints the
    tables themselves: personaemp.evaluation.scoreboard)."""
    for report in result.judges or [result.report]:
        print_stage_report(report, console)
