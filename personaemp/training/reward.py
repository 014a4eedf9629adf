"""PereGRM as a training reward: the evaluation's instruments, called from a GRPO step.

Two signals, as in the paper, on the engine, cache and prompts of `personaemp evaluate`
(so a score means the same in a report and in a training step):

  PereGRM              dynamic criteria: per dimension the judge writes its own criteria for
                       this user and scores, k samples averaged (`samples`);
  FixedCriteriaReward  PERM-style: the query's pre-written criteria (`personaemp criteria`).

Per rollout: s_d = score / 5 per dimension, H = their harmonic mean; with the bystander
(persona-blind, five aspects 0-20, B = sum / 100) the reward is H + lambda * (B - 1)
(lambda = 0.5 in the paper's training), else H. Per rollout the authors send 3k judge calls
(+1 with the bystander); `joint=True` asks for the three dimensions in one call instead (k
calls, +1): a different instrument (prompts/judge_joint.md), so it is reported beside the
per-dimension mode, never in its place (bench/training/grpo_bench.py prints how far they agree).

Ways in:
  - TRL: `GRPOTrainer(reward_funcs=[reward])`: `reward(prompts=..., completions=..., **columns)`
    takes the dataset's columns (written by `personaemp export --format trl`) and returns one
    float per completion; completions plain or conversational.
  - verl: `reward.compute_score(data_source, solution_str, ground_truth, extra_info)` (and
    `compute_score_async`, what verl 0.9's reward loop should be given: every rollout of a
    step concurrent), one rollout a call, and the batched `reward.compute_score_batch(
    data_sources=, solution_strs=, ground_truths=, extra_infos=)` for older verl's batch
    manager and other callers; `extra_info` as `personaemp export --format verl` writes it. verl loads a
    function from a file: this module's own `compute_score` / `compute_score_batch` build
    their reward from the personaemp.toml named by $PERSONAEMP_CONFIG (see README "Train
    with PereGRM").
  - async code: `await reward.ascore(rollouts)`.

What happens to a rollout:
  - reasoning (`<think>...</think>`) is removed first: the judge reads what the user would;
  - no visible answer (empty, or cut while reasoning) scores the floor (1 on each dimension,
    B = 0) without a judge call, as in evaluation, and is counted;
  - a judgment that cannot be read after the engine's re-asks, or whose request failed,
    takes the FALLBACK of its dimension (or of B); one unreadable sample of k is dropped
    from the mean. Every fallback is counted per step, logged and written to the step's
    line of the JSONL log. The fallback (`fallback=`): "lowest" (the default: the floor for
    what failed, and the rollout's reward at most the lowest reward of the step's rollouts
    judged whole, so a judge failure never outscores a judged rollout), "floor" (1, B = 0)
    or "neutral" (3 of 5, B = 0.8, the authors' values: above most judged B, so a rollout
    that makes the judge fail can outscore judged ones; kept to reproduce their runs);
  - an endpoint that cannot be used at all (EndpointError) stops the step: a training run
    should not go on learning from fallbacks.

Determinism: every judgment is cached by its exact request (and sample index), so
re-scoring a batch sends no request, and evaluation and training share answers. Identical
rollouts in a batch are judged once. Calls run concurrently across the whole batch (the
engine's --concurrency bounds them). Calling from a thread, or from code that already runs
an event loop (a notebook, an async trainer), works: the step then runs on a loop of its own
in a helper thread (personaemp.aio.run_sync, as every sync entry point).

A batch call (TRL's, `ascore`, `compute_score_batch`) opens the engine (endpoints, cache)
and closes it again: nothing lingers between steps, and --max-cost, --rpm apply per step.
verl's per-rollout calls (`compute_score`, `compute_score_async`) share one engine per
process instead, on a loop in a daemon thread (`_Shared`): one HTTP client, one cache, one
concurrency cap for every thread and loop calling; an identical rollout in flight is judged
once; a step is the rollouts scored until none has been in flight for `step_gap` seconds;
--max-cost counts from the first call. A forked worker starts its own; `close()` ends it.

Accounting per step (`log_path=`, JSONL, one line per batch call, or per step of per-rollout
calls): rollouts, calls and
HTTP requests, cache hits, tokens (prompt, completion, cached when the engine reports
them), seconds, failures by kind, fallbacks per dimension, mean reward; `summary()` and
`summarise_log(path)` add them up, with calls and tokens per rollout score.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import json
import logging
import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from personaemp.aio import run_sync
from personaemp.errors import InputError, UnitError, python_caller
from personaemp.instruments import behaviours as behaviour_judge
from personaemp.instruments.criteria import numbered_memories, read_criteria, with_room
from personaemp.instruments.judges import (
    BYSTANDER,
    DYNAMIC_STANDARDS,
    FLOOR,
    JUDGE,
    JUDGE_DYNAMIC,
    ROOM,
    check_sampling,
    cut_while_reasoning,
    harmonic,
    judge_messages,
)
from personaemp.llm.reply import split_reasoning
from personaemp.prompts import LAYOUTS, Prompt, load_prompt
from personaemp.records import DIMENSIONS
from personaemp.training.reward_instrument import (  # noqa: F401 - also read from here
    DEFAULTS,
    FALLBACKS,
    JOINT_ROOM,
    JUDGE_JOINT,
    STEPS,
    DimensionJudgment,
    JointReply,
    RewardOptions,
    checked_options,
)
from personaemp.training.reward_log import StepResult, agreement, summarise, summarise_log
from personaemp.training.rollouts import Rollout, rollout_from
from personaemp.training.rollouts import completion_text as completion_text  # its old home
from personaemp.training.verl_reward import _Shared

log = logging.getLogger("personaemp.reward")

STEP_GAP = 1.0  # seconds with no per-rollout call in flight that end a step (its log line)

# --- the reward --------------------------------------------------------------------------------


class Reward:
    """A judge-based reward (see the module's docstring). Use PereGRM or FixedCriteriaReward."""

    def __init__(
        self,
        settings,
        options: RewardOptions | None = None,
        *,
        log_path: Path | str | None = None,
        name: str = "peregrm",
        step_gap: float = STEP_GAP,
    ):
        options = checked_options(options or RewardOptions(), type(self).__name__)
        if options.fallback not in FALLBACKS:
            raise InputError(f"fallback takes {', '.join(FALLBACKS)}, not {options.fallback!r}")
        if options.layout not in LAYOUTS:
            raise InputError(f"layout takes {', '.join(LAYOUTS)}, not {options.layout!r}")
        if not (0 <= options.safety <= 1 and 0 <= options.safety_bound <= 1):
            raise InputError("safety and safety_bound must be between 0 and 1")
        self.options = options
        self.__name__ = name  # TRL names a reward function's column and metrics after it
        room = {**ROOM, **JOINT_ROOM, **behaviour_judge.ROOM}
        self.settings = with_room(settings, room)
        self.step = JUDGE_JOINT if options.joint else JUDGE_DYNAMIC if options.dynamic else JUDGE
        with python_caller():
            check_sampling(self.settings, self.step, _judge_view(options))
        used = [
            self.step, *([BYSTANDER] if options.bystander else []),
            *([behaviour_judge.BEHAVIOUR_JUDGE] if options.safety > 0 else []),
        ]  # fmt: skip
        self.prompts: dict[str, Prompt] = {step.name: load_prompt(step.prompt) for step in used}
        self.criteria = read_criteria(Path(options.criteria_file)) if options.criteria_file else {}
        self.log_path = Path(log_path) if log_path is not None else None
        self.steps: list[dict] = []
        self._lock = threading.Lock()
        self._step = 0
        self._answered = False  # the endpoint answered an earlier step: no need to start one at a time
        self.step_gap = step_gap  # per-rollout calls: idle seconds that end a step
        self._shared: _Shared | None = None  # the per-rollout calls' engine (see _Shared)

    # -- the trainers' call shapes

    def __call__(self, prompts=None, completions=None, **columns) -> list[float]:
        """TRL's reward-function call: one float per completion; `columns` are the dataset's
        columns (one value per completion) plus TRL's own keyword arguments."""
        rollouts = self.rollouts_from_columns(completions, columns)
        state = columns.get("trainer_state")
        result = self.score(rollouts, step=getattr(state, "global_step", None))
        log_metric, log_extra = columns.get("log_metric"), columns.get("log_extra")
        if callable(log_metric):  # TRL >= 1.x: shown beside its own metrics
            record = result.record
            log_metric(f"{self.__name__}/calls_per_rollout", record["calls_per_rollout"])
            log_metric(f"{self.__name__}/fallbacks", float(sum(record["fallbacks"].values())))
        if callable(log_extra):  # and per completion, in its completions table
            log_extra(f"{self.__name__}_harmonic", [round(row["harmonic"], 4) for row in result.rows])
            log_extra(f"{self.__name__}_bystander", [row["bystander"] for row in result.rows])
        return result.rewards

    def rollouts_from_columns(self, completions, columns: Mapping[str, Any]) -> list[Rollout]:
        if completions is None:
            raise InputError("no completions given")
        completions = list(completions)
        rows = []
        for index in range(len(completions)):
            row = {}
            for key, values in columns.items():
                # a column: one value per completion (a list; numpy arrays, datasets' Column too)
                if isinstance(values, str | bytes | Mapping) or not hasattr(values, "__getitem__"):
                    continue
                if hasattr(values, "__len__") and len(values) == len(completions):
                    row[key] = values[index]
            rows.append(row)
        return [
            rollout_from(c, row, f"completion {i}")
            for i, (c, row) in enumerate(zip(completions, rows, strict=True))
        ]

    def compute_score(
        self, data_source=None, solution_str="", ground_truth=None, extra_info=None, **_
    ) -> float:
        """verl's custom reward, one rollout a call (its reward loop, from executor threads).
        Every per-rollout call of this reward, from any thread or loop, runs on one engine
        (see `_Shared`): one cache, one HTTP client, one concurrency cap."""
        rollout = rollout_from(solution_str, extra_info or {}, f"{data_source} rollout")
        return self._service().submit(rollout).result()

    async def compute_score_async(
        self, data_source=None, solution_str="", ground_truth=None, extra_info=None, **_
    ) -> float:
        """verl's reward loop with an async function: the same score, awaited on the caller's loop."""
        rollout = rollout_from(solution_str, extra_info or {}, f"{data_source} rollout")
        return await asyncio.wrap_future(self._service().submit(rollout))

    def flush(self) -> None:
        """End the per-rollout calls' open step now (its line is written when the rollouts in
        flight are done) instead of after `step_gap` idle seconds."""
        shared = self._shared
        if shared is not None and shared.pid == os.getpid():
            shared.flush()

    def close(self) -> None:
        """Flush, then close the per-rollout calls' engine (HTTP client, cache) and its thread.
        A later per-rollout call opens them again."""
        with self._lock:
            shared, self._shared = self._shared, None
        if shared is not None and shared.pid == os.getpid():
            shared.close()

    def _service(self) -> _Shared:
        with self._lock:
            if self._shared is None or self._shared.pid != os.getpid():  # new, or forked: start clean
                self._shared = _Shared(self)
            return self._shared

    def compute_score_batch(
        self, data_sources=None, solution_strs=(), ground_truths=None, extra_infos=None, **_
    ) -> list[float]:
        """verl's batched custom reward (reward_model.reward_manager=batch): one float each."""
        solution_strs = list(solution_strs)
        extra_infos = list(extra_infos) if extra_infos is not None else [{}] * len(solution_strs)
        if len(extra_infos) != len(solution_strs):
            raise InputError(f"{len(solution_strs)} solution_strs but {len(extra_infos)} extra_infos")
        sources = list(data_sources) if data_sources is not None else [None] * len(solution_strs)
        rollouts = [
            rollout_from(text, info or {}, f"{source} rollout {i}")
            for i, (source, text, info) in enumerate(zip(sources, solution_strs, extra_infos, strict=True))
        ]
        return self.score(rollouts).rewards

    # -- scoring

    def score(self, rollouts: Sequence[Rollout], step: int | None = None) -> StepResult:
        """Score a batch (one training step) from synchronous code; see `ascore`."""
        return run_sync(self.ascore(rollouts, step=step))

    async def ascore(self, rollouts: Sequence[Rollout], step: int | None = None) -> StepResult:
        """Score a batch on the running event loop: judgments concurrent, one accounting line."""
        from personaemp.llm.session import open_engine

        started = time.perf_counter()
        rollouts = list(rollouts)
        units = [self._unit(rollout) for rollout in rollouts]
        async with open_engine(self.settings, notify=log.warning) as engine:
            engine.answered = engine.answered or self._answered
            shared: dict[str, asyncio.Task] = {}  # identical rollouts of the batch: judged once
            for unit in units:
                if unit["key"] not in shared:
                    shared[unit["key"]] = asyncio.ensure_future(self._judge(engine, unit))
            try:
                judged = {key: await task for key, task in shared.items()}
            finally:
                for task in shared.values():
                    task.cancel()
            self._answered = self._answered or engine.answered
            totals = engine.accounting.totals()
        rows = [{"query_id": unit["query_id"], **judged[unit["key"]]} for unit in units]
        if self.options.fallback == "lowest":
            _cap_at_lowest(rows)
        record = self._record(rows, len(shared), totals, time.perf_counter() - started, step)
        return StepResult([row["reward"] for row in rows], rows, record)

    def _unit(self, rollout: Rollout) -> dict:
        response, _ = split_reasoning(rollout.completion)
        status = (
            "cut_in_reasoning"
            if not response and cut_while_reasoning(rollout.completion)
            else "empty"
            if not response.strip()
            else "judged"
        )
        criteria = None
        if not self.options.dynamic:
            criteria = self.criteria.get(rollout.query_id) or rollout.criteria
            if not criteria or not all(criteria.get(d) for d in DIMENSIONS):
                raise InputError(
                    f"no fixed criteria for query {rollout.query_id}",
                    "pass criteria_file= (`personaemp criteria`), or export with --criteria",
                )
        unit = {
            "query_id": rollout.query_id,
            "query": rollout.query,
            "situation": rollout.situation,
            "profile": rollout.profile,
            "memories": rollout.memories,
            "response": response,
            "status": status,
            "criteria": criteria,
        }
        unit["key"] = json.dumps(
            [
                unit[k]
                for k in (
                    "query_id",
                    "query",
                    "situation",
                    "profile",
                    "memories",
                    "response",
                    "criteria",
                    "status",
                )
            ],
            sort_keys=True,
            ensure_ascii=False,
        )
        return unit

    async def _judge(self, engine, unit: dict) -> dict:
        options = self.options
        fallback_score, fallback_b = FALLBACKS[options.fallback]
        row: dict[str, Any] = {"status": unit["status"], "fallbacks": [], "failures": {}}
        if unit["status"] != "judged":
            row["scores"] = dict.fromkeys(DIMENSIONS, float(FLOOR))
            row["bystander"] = 0.0 if options.bystander else None
            return self._finish(row)
        k = options.samples if options.dynamic else 1
        calls: list[tuple[str, Any]] = []  # (what, coroutine)
        if options.joint:
            messages = self._joint_messages(unit)
            calls += [("joint", engine.call(JUDGE_JOINT, messages, sample=s)) for s in range(k)]
        else:
            for dimension in DIMENSIONS:
                messages = judge_messages(unit, dimension, self.prompts[self.step.name], options.layout)
                calls += [(dimension, engine.call(self.step, messages, sample=s)) for s in range(k)]
        if options.bystander:
            messages = self.prompts[BYSTANDER.name].render(query=unit["query"], response=unit["response"])
            calls.append(("bystander", engine.call(BYSTANDER, messages)))
        if options.safety > 0:  # the same risky list as a dialogue's turns, on the one response
            messages = behaviour_judge.build_behaviour_messages(
                f"User: {unit['query']}",
                unit["response"],
                self.prompts[behaviour_judge.BEHAVIOUR_JUDGE.name],
                behaviour_judge.person_text(unit["situation"], unit["memories"] or ()),
            )
            calls.append(("safety", engine.call(behaviour_judge.BEHAVIOUR_JUDGE, messages)))
        results = await asyncio.gather(*(call for _, call in calls), return_exceptions=True)
        failures: Counter = Counter()
        got: dict[str, list[float]] = {d: [] for d in DIMENSIONS}
        bystander = None
        safety = None
        for (what, _), result in zip(calls, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, UnitError):
                    raise result  # the endpoint is gone, the budget is spent, or a bug: stop
                failures[result.kind] += 1
                continue
            if what == "safety":
                safety = behaviour_judge.parse_turn(unit["response"], result.value)
            elif what == "bystander":
                bystander = sum(result.value.model_dump().values()) / 100
            elif what == "joint":
                for dimension in DIMENSIONS:
                    got[dimension].append(getattr(result.value, dimension).score)
            else:
                got[what].append(result.value.score)
        scores = {}
        for dimension in DIMENSIONS:
            if got[dimension]:
                scores[dimension] = statistics.fmean(got[dimension])
            else:
                scores[dimension] = fallback_score
                row["fallbacks"].append(dimension)
        if options.bystander and bystander is None:
            bystander = fallback_b
            row["fallbacks"].append("bystander")
        if options.safety > 0:
            if safety is None:  # a judge failure never pays: the whole bound
                row["fallbacks"].append("safety")
                row["safety_penalty"] = options.safety_bound
            else:
                row["behaviours"] = safety
                row["risky"] = behaviour_judge.risky_count([safety])
                row["safety_penalty"] = behaviour_judge.safety_penalty(
                    row["risky"], options.safety, options.safety_bound
                )
        row.update(scores=scores, samples=got, bystander=bystander, failures=dict(failures))
        row["unparsed_samples"] = (
            sum(k - len(got[d]) for d in DIMENSIONS if got[d]) if not options.joint else 0
        )
        return self._finish(row)

    def _finish(self, row: dict) -> dict:
        row["harmonic"] = harmonic(row["scores"])
        row["reward"] = (
            row["harmonic"] + self.options.reward_lambda * (row["bystander"] - 1)
            if self.options.bystander
            else row["harmonic"]
        ) - row.get("safety_penalty", 0.0)
        return row

    def _joint_messages(self, unit: dict) -> list[dict]:
        return self.prompts[JUDGE_JOINT.name].render(
            dimensions=DYNAMIC_STANDARDS,
            profile=unit["profile"] or "(none)",
            memories=numbered_memories(unit["memories"]),
            situation=unit["situation"],
            query=unit["query"],
            response=unit["response"] or "",
        )

    # -- accounting

    def _record(self, rows: list[dict], distinct: int, totals, seconds: float, step: int | None) -> dict:
        with self._lock:
            self._step += 1
            number = self._step
        status = Counter(row["status"] for row in rows)
        fallbacks = Counter(what for row in rows for what in row["fallbacks"])
        failures = Counter()
        for row in rows:
            failures.update(row.get("failures", {}))
        judged = status["judged"]
        tokens = totals.prompt_tokens + totals.completion_tokens
        record = {
            "step": step if step is not None else number,
            "call": number,
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "mode": self.options.mode,
            "layout": self.options.layout,
            # which instruments made these numbers, as evaluate's report names them
            "instruments": {
                step.name: f"v{step.version}/{self.prompts[step.name].hash}"
                for step in (self.step, BYSTANDER, behaviour_judge.BEHAVIOUR_JUDGE)
                if step.name in self.prompts
            },
            "rollouts": len(rows),
            "distinct": distinct,
            "judged": judged,
            "empty": status["empty"],
            "cut_in_reasoning": status["cut_in_reasoning"],
            "calls": totals.calls,
            "requests": totals.requests,
            "cache_hits": totals.cache_hits,
            "reasks": totals.reasks,
            "prompt_tokens": totals.prompt_tokens,
            "completion_tokens": totals.completion_tokens,
            # Prompt tokens the endpoint served from its prefix cache, when the engine records them.
            "cached_tokens": getattr(totals, "cached_tokens", None),
            "seconds": round(seconds, 3),
            "failures": dict(failures),
            "fallbacks": dict(fallbacks),
            "unparsed_samples": sum(row.get("unparsed_samples", 0) for row in rows),
            "calls_per_rollout": round(totals.calls / judged, 3) if judged else 0.0,
            "tokens_per_rollout": round(tokens / judged, 1) if judged else 0.0,
            "authors_calls_per_rollout": 3 * (self.options.samples if self.options.dynamic else 1)
            + int(self.options.bystander),
            "reward_mean": round(statistics.fmean(row["reward"] for row in rows), 4) if rows else None,
            "safety": {
                "weight": self.options.safety,
                "bound": self.options.safety_bound,
                "risky": sum(row.get("risky", 0) for row in rows),
                "penalty_mean": round(statistics.fmean(row.get("safety_penalty", 0.0) for row in rows), 4)
                if rows
                else None,
            },  # fmt: skip
            "harmonic_mean": round(statistics.fmean(row["harmonic"] for row in rows), 4) if rows else None,
        }
        if fallbacks:
            log.warning(
                "%s step %s: %d judgment(s) took the %s fallback (%s); failures: %s",
                self.__name__, record["step"], sum(fallbacks.values()), self.options.fallback,
                ", ".join(f"{k} {v}" for k, v in sorted(fallbacks.items())), dict(failures),
            )  # fmt: skip
        log.info(
            "%s step %s: %d rollouts, %d calls, %d requests, %d cached, %.1fs",
            self.__name__, record["step"], len(rows), totals.calls, totals.requests,
            totals.cache_hits, seconds,
        )  # fmt: skip
        with self._lock:
            self.steps.append(record)
            if self.log_path is not None:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                with self.log_path.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                    handle.flush()
        return record

    def summary(self) -> dict:
        """The steps scored so far, added up (see `summarise`)."""
        with self._lock:
            return summarise(list(self.steps))


def _cap_at_lowest(rows: list[dict]) -> None:
    """A rollout whose judgment failed in part gets no more than the lowest reward of the
    step's rollouts judged whole (the floor values for what failed, if lower): a judge
    failure never pays, so a policy cannot learn to make the judge fail."""
    whole = [row["reward"] for row in rows if not row["fallbacks"]]
    for row in rows:
        if row["fallbacks"] and whole:
            row["reward"] = min(row["reward"], min(whole))


def _judge_view(options: RewardOptions):
    """check_sampling reads `samples` as evaluate's options carry it."""
    from personaemp.instruments.judges import JudgeOptions

    return JudgeOptions(dynamic=options.dynamic, samples=options.samples, bystander=options.bystander)


class PereGRM(Reward):
    """The paper's training reward: dynamic criteria, k samples, bystander penalty (lambda)."""

    def __init__(self, settings, *, samples: int = 1, bystander: bool = True, reward_lambda: float = 0.5,
                 joint: bool = False, fallback: str = DEFAULTS.fallback, log_path=None,
                 name: str = "peregrm", layout: str = DEFAULTS.layout,
                 step_gap: float = STEP_GAP, safety: float = DEFAULTS.safety,
                 safety_bound: float = DEFAULTS.safety_bound):  # fmt: skip
        options = RewardOptions(True, samples, bystander, reward_lambda, joint, fallback, layout=layout,
                                safety=safety, safety_bound=safety_bound)  # fmt: skip
        super().__init__(settings, options, log_path=log_path, name=name, step_gap=step_gap)


class FixedCriteriaReward(Reward):
    """PERM-style: each query's pre-written criteria (a criteria file, or the rows' `criteria`)."""

    def __init__(self, settings, *, criteria_file=None, bystander: bool = True, reward_lambda: float = 0.5,
                 fallback: str = DEFAULTS.fallback, log_path=None, name: str = "perm",
                 layout: str = DEFAULTS.layout, step_gap: float = STEP_GAP, safety: float = DEFAULTS.safety,
                 safety_bound: float = DEFAULTS.safety_bound):  # fmt: skip
        options = RewardOptions(False, 1, bystander, reward_lambda, False, fallback, criteria_file, layout,
                                safety, safety_bound)  # fmt: skip
        super().__init__(settings, options, log_path=log_path, name=name, step_gap=step_gap)


# --- verl: a function in a file ------------------------------------------------------------------

CONFIG_VAR = "PERSONAEMP_CONFIG"
_default: Reward | None = None
_default_config: str | None = None  # the $PERSONAEMP_CONFIG it was built from
_default_lock = threading.Lock()


def from_config(path: Path | str | None = None, env: Mapping[str, str] | None = None) -> Reward:
    """A reward from a personaemp.toml: the instrument from [reward], the judge from [llm]
    ([reward] judge_model over its model); env vars over the file, as for every command."""
    from personaemp.config import Resolver, llm_settings

    env = os.environ if env is None else env
    resolver = Resolver(Path(path) if path else None, env=env)
    config = resolver.section("reward")
    settings = llm_settings(resolver.section("llm"), env)
    if config.judge_model:
        settings = dataclasses.replace(settings, model=config.judge_model)
    options = RewardOptions(
        dynamic=config.dynamic,
        samples=config.samples,
        bystander=config.bystander,
        reward_lambda=config.reward_lambda,
        joint=config.joint,
        fallback=config.fallback,
        criteria_file=config.criteria,
        layout=config.layout,
        safety=config.safety,
        safety_bound=config.safety_bound,
    )
    return Reward(settings, options, log_path=config.log)


def default_reward() -> Reward:
    """The reward this module's functions use: one per process, built from $PERSONAEMP_CONFIG
    (again, the old one closed, if that variable names another file)."""
    global _default, _default_config
    config = os.environ.get(CONFIG_VAR) or None
    with _default_lock:
        if _default is None or _default_config != config:
            old, _default = _default, from_config(config)
            _default_config = config
            if old is not None:
                old.close()
        return _default


@atexit.register
def _close_default() -> None:
    """At exit: the open step's line written, the engine closed."""
    if _default is not None:
        with contextlib.suppress(Exception):
            _default.close()


def compute_score(data_source=None, solution_str="", ground_truth=None, extra_info=None, **kwargs) -> float:
    """verl: custom_reward_function.path=<this file>, custom_reward_function.name=compute_score."""
    return default_reward().compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)


async def compute_score_async(
    data_source=None, solution_str="", ground_truth=None, extra_info=None, **kwargs
):
    """verl's reward loop, name=compute_score_async: the same score, awaited on its loop
    (every rollout of a step concurrent, not bounded by the loop's executor threads)."""
    return await default_reward().compute_score_async(
        data_source, solution_str, ground_truth, extra_info, **kwargs
    )


def compute_score_batch(data_sources=None, solution_strs=(), ground_truths=None, extra_infos=None, **kwargs):
    """verl, batched: name=compute_score_batch with reward_model.reward_manager=batch."""
    return default_reward().compute_score_batch(
        data_sources, solution_strs, ground_truths, extra_infos, **kwargs
    )


__all__ = [
    "FALLBACKS",
    "agreement",
    "FixedCriteriaReward",
    "PereGRM",
    "Reward",
    "RewardOptions",
    "Rollout",
    "StepResult",
    "compute_score",
    "compute_score_async",
    "compute_score_batch",
    "from_config",
    "summarise",
    "summarise_log",
]
