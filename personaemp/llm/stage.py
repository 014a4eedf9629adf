"""Glue every LLM stage shares: open the engine, run the units with a progress bar, report."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text

from personaemp import locks
from personaemp.aio import sync_twin
from personaemp.io import read_json_object, write_json_atomic
from personaemp.llm.alive import FieldColumn, WaitingColumn, fixed, heartbeat, waiting_text
from personaemp.llm.batch import BatchQueue, import_answers, write_requests
from personaemp.llm.engine import Engine
from personaemp.llm.estimate import Estimate, cache_history, cache_rule, first_mode
from personaemp.llm.ray_executor import WorkerPool, connect, pool_size, uses_ray
from personaemp.llm.ray_vllm import Rounds, uses_vllm
from personaemp.llm.session import open_engine
from personaemp.llm.settings import LLMSettings
from personaemp.llm.step import Step
from personaemp.manifest import locked, record_stage, report_entry
from personaemp.progress import emit
from personaemp.units import Link, StageOutcome, StageRun, Work, run_chain, run_units

REPORT_FILE = "run_report.json"
logger = logging.getLogger("personaemp")


@dataclass
class StageReport:
    stage: str
    outcome: StageOutcome
    wall_seconds: float
    model: str
    endpoint_kind: str
    steps: dict[str, dict] = field(default_factory=dict)
    totals: dict[str, Any] = field(default_factory=dict)
    structured: dict[str, Any] = field(default_factory=dict)
    full: bool = True  # the whole input, not a quick look (--limit, --users)
    cost: float | None = None
    calls: list[dict] = field(default_factory=list)  # per-request timings (the slowest, on big runs)
    estimate: dict[str, Any] | None = None  # --estimate: what would be sent (llm/estimate.py)
    batch: dict[str, Any] | None = None  # --batch: answers imported, requests written (llm/batch.py)
    output: str = ""
    failures: str = ""
    fingerprint: str = ""  # what the rows' input_hash was made with (merge checks shards by it)
    temperatures: dict[str, float] = field(default_factory=dict)  # per step, as sent
    # A stage's own figures, for the summary: {"name": {"text": line to print, ...numbers}}.
    notes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        outcome = self.outcome
        return {
            "stage": self.stage,
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "wall_seconds": round(self.wall_seconds, 3),
            "model": self.model,
            "endpoint_kind": self.endpoint_kind,
            "structured": self.structured,
            "full": self.full,
            "units": outcome.units,
            "done": outcome.done,
            "done_before": outcome.done_before,
            "failed": outcome.failed,
            "failed_before": outcome.failed_before,
            "failures_by_kind": dict(outcome.failures_by_kind),
            "steps": self.steps,
            "totals": self.totals,
            "cost": self.cost,
            "calls": self.calls,
            "output": self.output,
            "failures_file": self.failures,
            "fingerprint": self.fingerprint,
            "temperatures": self.temperatures,
            "notes": self.notes,
        }


@dataclass
class LLMStage:
    """One LLM stage, as `arun_llm_stage` runs it: `make_work(engine)` over `units` (the
    stage's whole current input, re-iterable; `selected` ids only), resumably, each unit's
    row keyed by `key` in `output`.

    `fingerprint(engine)` names what makes a finished unit reusable (see Engine.fingerprint).
    `steps`: its LLM steps, in the order a unit makes them; `calls`: how many calls a unit
    makes of each (by step name; 1 when not named), which --estimate counts (it sends and
    writes nothing). `full`: the report describes the build (default: nothing was
    selected); a quick look's report is kept apart so a dataset card never quotes it.
    `notes`: the stage's own figures, written in its report (StageReport.notes).
    """

    stage: str
    units: Iterable[dict[str, Any]]
    make_work: Callable[[Engine], Work]
    key: str
    output: Path
    fingerprint: Callable[[Engine], str]
    steps: Sequence[Step] = ()
    calls: Mapping[str, int] = field(default_factory=dict)
    selected: set[str] | None = None
    full: bool | None = None
    input_path: Path | None = None
    retry_failed: bool = False
    failures: Path | None = None
    skipped: int = 0  # input rows that are not units (gen-queries: ineligible personas)
    notes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.full = self.selected is None if self.full is None else self.full
        # Default: one per stage and folder. Commands that write many outputs into one folder
        # (respond, evaluate: one per system) pass their own, so one run never drops another's.
        self.failures = self.failures or self.output.with_name(f"{self.stage}.failures.jsonl")

    def picked(self) -> set[str]:
        """The ids of the units this run is about (a lazily read input: io.StageRows)."""
        return set(self.units.ids) if self.selected is None else set(self.selected)

    def bookkeeping(self, engine: Engine, settings: LLMSettings) -> StageRun:
        return StageRun(
            key=self.key, output=self.output, failures=self.failures, fingerprint=self.fingerprint(engine),
            selected=self.selected, retry_failed=self.retry_failed, dry=settings.estimate,
        )  # fmt: skip

    def report(
        self, engine: Engine, settings: LLMSettings, outcome, started: float, part=None
    ) -> StageReport:
        """The stage's report; `part`: its steps' share of an engine two stages shared."""
        accounting = part or engine.accounting
        totals = accounting.totals()
        return StageReport(
            stage=self.stage,
            outcome=outcome,
            wall_seconds=time.perf_counter() - started,
            model=engine.model,
            endpoint_kind=engine.endpoint_kind,
            steps=accounting.as_dict(),
            totals={**totals.__dict__, "failures": dict(totals.failures)},
            structured=engine.structured_report(),
            full=self.full,
            cost=accounting.cost(settings.price_in, settings.price_out, settings.price_cached),
            calls=accounting.slowest_calls(),
            output=str(self.output),
            failures=str(self.failures),
            fingerprint=self.fingerprint(engine),
            temperatures={step.name: engine.sampling(step).temperature for step in self.steps},
        )

    def record(self, report: StageReport, settings: LLMSettings) -> None:
        append_report(settings.work_dir / REPORT_FILE, report.as_dict(), settings)
        record_stage(
            self.output, self.stage, report=settings.work_dir / REPORT_FILE, failures=self.failures,
            full=self.full, input=self.input_path,
        )  # fmt: skip


async def arun_llm_stage(
    plan: LLMStage, *, settings: LLMSettings, console: Console | None = None
) -> StageReport:
    """Run the plan's units resumably; write and return its report.

    Passes over the units, each on a freshly opened engine: where each unit's work runs, and
    whether another pass follows, is the executor's (`executor`: this process, a Ray pool,
    vLLM rounds); what the engine does with a request, the mode's (`offline_mode`: send it,
    estimate it, queue it in a batch file). The bookkeeping is the same whichever they are."""
    console = console or Console(quiet=True)  # a library call prints only when given a console
    started = time.perf_counter()  # the stage's wall time covers all its passes
    run_on = executor(settings, console)
    pass_settings = run_on.begin(plan, settings)
    while True:
        report, finished = await _one_pass(plan, pass_settings, console, run_on, started)
        if not run_on.again(report):
            break
    if finished:
        plan.record(report, settings)
    return report


async def _one_pass(
    plan: LLMStage, settings: LLMSettings, console: Console, run_on: Executor, started: float
) -> tuple[StageReport, bool]:
    """One pass over the plan's units: the engine sends, or is offline (`offline_mode`); the
    units' work runs where `run_on` says. Returns its report, and whether the pass is the
    stage's run, to be recorded (not an estimate, nor a pass waiting for batch answers)."""
    mode = offline_mode(plan, settings)
    async with open_engine(settings, notify=_notifier(console), offline=mode.offline) as engine:
        run_on.announce(console, plan, engine, settings)
        mode.opened(engine, settings)
        run_on.attach(engine)
        with _progress(console) as progress:
            # of the units picked (--limit, --users), not of the whole input
            bar = _progress_bar(progress, plan.stage, _to_do(plan.units, plan.selected), engine)
            async with run_on:  # the same bookkeeping here wherever each unit's work runs
                stamp = plan.fingerprint(engine)
                outcome = await run_units(
                    plan.units, run_on.work(plan, stamp), key=plan.key, output=plan.output,
                    failures=plan.failures, fingerprint=stamp, window=_window(engine),
                    selected=plan.selected, retry_failed=plan.retry_failed, on_progress=bar,
                    dry=mode.dry,
                )  # fmt: skip
        report = plan.report(engine, settings, outcome, started)
        if run_on.structured() is not None:
            report.structured = run_on.structured()  # negotiated there, not here
        report.notes = {**plan.notes, **run_on.notes()}
        mode.closed(report, engine, settings)
    return report, mode.finished(report, settings)


# --- where each unit's work runs: one protocol ------------------------------------------------------


class Executor(Protocol):
    """Where a stage's units do their work, and in how many passes; the bookkeeping stays in
    the pass (`_one_pass`, `arun_llm_chain`). One per stage (a chain's two stages share one
    pass). `begin`: the stage starts, and the settings each pass opens its engine with;
    `announce`: the stage's first line; `attach`: a pass's engine is open; an async
    context around the pass's units; `work`: a plan's work for `run_units`/`run_chain`;
    `structured`, `notes`: figures for the pass's report; `again`: after a pass, whether
    another follows."""

    def begin(self, plan: LLMStage, settings: LLMSettings) -> LLMSettings: ...

    def announce(self, console: Console, plan: LLMStage, engine: Engine, settings: LLMSettings) -> None: ...

    def attach(self, engine: Engine) -> None: ...

    async def __aenter__(self) -> Executor: ...

    async def __aexit__(self, *exc: object) -> None: ...

    def work(self, plan: LLMStage, fingerprint: str) -> Work: ...

    def structured(self) -> dict[str, Any] | None: ...

    def notes(self) -> dict[str, dict[str, Any]]: ...

    def again(self, report: StageReport) -> bool: ...


class InProcess:
    """Every unit's work on this process's engine, in one pass."""

    engine: Engine

    def begin(self, plan: LLMStage, settings: LLMSettings) -> LLMSettings:
        return settings

    def announce(self, console: Console, plan: LLMStage, engine: Engine, settings: LLMSettings) -> None:
        _announce(console, plan, engine, settings)

    def attach(self, engine: Engine) -> None:
        self.engine = engine

    async def __aenter__(self) -> InProcess:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def work(self, plan: LLMStage, fingerprint: str) -> Work:
        return plan.make_work(self.engine)

    def structured(self) -> dict[str, Any] | None:
        return None  # the engine's own report says it

    def notes(self) -> dict[str, dict[str, Any]]:
        return {}

    def again(self, report: StageReport) -> bool:
        return False


class RayPool(InProcess):
    """Every unit's work on a pool of Ray workers (ray_executor.WorkerPool), each with its
    own engine; the structured mode is negotiated there."""

    def __init__(self, settings: LLMSettings, console: Console) -> None:
        self.settings, self.console = settings, console

    def attach(self, engine: Engine) -> None:
        self.console.print(_on_ray(self.settings))
        self.pool = WorkerPool(self.settings, engine)

    async def __aenter__(self) -> RayPool:
        await self.pool.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pool.__aexit__(*exc)

    def work(self, plan: LLMStage, fingerprint: str) -> Work:
        return self.pool.work(plan.stage, plan.make_work, plan.fingerprint, fingerprint)

    def structured(self) -> dict[str, Any] | None:
        return self.pool.figures.structured()


class VllmRounds(InProcess):
    """`--llm vllm`: every unit's work in this process, on an engine that writes its requests
    to batch files; vLLM on Ray answers them between passes (ray_vllm.Rounds, which says
    how), until a pass asks for nothing more. Not for a chain (pipeline.chains)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def begin(self, plan: LLMStage, settings: LLMSettings) -> LLMSettings:
        self.rounds = Rounds(settings, plan.stage, plan.output, self.console)  # says the stage
        return self.rounds.settings

    def announce(self, console: Console, plan: LLMStage, engine: Engine, settings: LLMSettings) -> None:
        pass  # said once, as the rounds began (a pass's own line would name their batch folder)

    def notes(self) -> dict[str, dict[str, Any]]:
        return self.rounds.notes()

    def again(self, report: StageReport) -> bool:
        return self.rounds.after(report)


def executor(settings: LLMSettings, console: Console) -> Executor:
    """vLLM rounds for `--llm vllm`; a Ray pool when the settings ask for Ray (`--executor
    ray`); else this process."""
    if uses_vllm(settings):
        return VllmRounds(console)
    return RayPool(settings, console) if uses_ray(settings) else InProcess()


# --- what the engine does with a request: send it, or not (offline engines) -------------------------


class Sending:
    """The plain run: requests are sent, rows written, the run recorded."""

    offline = None  # open_engine's `offline`
    dry = False  # run_units writes nothing

    def opened(self, engine: Engine, settings: LLMSettings) -> None:
        pass

    def closed(self, report: StageReport, engine: Engine, settings: LLMSettings) -> None:
        pass

    def finished(self, report: StageReport, settings: LLMSettings) -> bool:
        """Whether the pass is the stage's run, to be recorded."""
        return True


class Estimating(Sending):
    """--estimate: nothing is sent or written; the report says what would be sent, and what
    it would cost (llm/estimate.py)."""

    dry = True

    def __init__(self, plan: LLMStage, settings: LLMSettings) -> None:
        self.offline = Estimate(
            [(step.name, plan.calls.get(step.name, 1)) for step in plan.steps],
            rule=cache_rule(settings),
            first_mode=first_mode(settings),
        )

    def opened(self, engine: Engine, settings: LLMSettings) -> None:
        self.offline.remember(engine.cache)

    def closed(self, report: StageReport, engine: Engine, settings: LLMSettings) -> None:
        estimate, prices = self.offline, (settings.price_in, settings.price_out, settings.price_cached)
        report.estimate = estimate.report(cache_history(engine.cache, estimate.rule), *prices)

    def finished(self, report: StageReport, settings: LLMSettings) -> bool:
        return False  # nothing was sent or written: no run to record


class Batching(Sending):
    """--batch DIR: answers found in DIR's batch files are imported into the cache; what is
    still missing is written there as requests (llm/batch.py), and the stage goes on next
    round."""

    def __init__(self) -> None:
        self.offline = BatchQueue()
        self.imported: dict[str, int] = {}
        self.awaiting: dict[str, Path] = {}

    def opened(self, engine: Engine, settings: LLMSettings) -> None:
        settings.batch.mkdir(parents=True, exist_ok=True)
        counts, waiting = import_answers(settings.batch, engine.cache)
        self.imported.update(counts)
        self.awaiting.update(waiting)

    def finished(self, report: StageReport, settings: LLMSettings) -> bool:
        queue, awaiting = self.offline, self.awaiting
        new = write_requests(settings.batch, report.stage, queue, awaiting) if queue.requests else []
        waiting = sorted({str(awaiting[cid]) for cid in queue.requests if cid in awaiting})
        report.batch = {
            **self.imported, "requests": len(queue.requests), "new_files": [str(f) for f in new],
            "files": [str(f) for f in new] + waiting, "queued": sorted(queue.requests),
        }  # fmt: skip
        return not report.batch["files"]  # files to answer: the stage goes on next round


def offline_mode(plan: LLMStage, settings: LLMSettings) -> Sending:
    """What the engine does with a request in this pass: send it, estimate it, or queue it."""
    if settings.estimate:
        return Estimating(plan, settings)
    if settings.batch is not None:
        return Batching()
    return Sending()


def _announce(console: Console, plan: LLMStage, engine: Engine, settings: LLMSettings) -> None:
    """The stage's first line: what it asks, and where (an endpoint, batch files, nowhere)."""
    if settings.batch is not None:
        console.print(f"[bold]{plan.stage}[/]: model {engine.model} · batch files in {settings.batch}")
    elif settings.estimate:
        console.print(f"[bold]{plan.stage}[/]: model {engine.model} · estimate (nothing is sent)")
    else:
        console.print(_header(plan.stage, engine, plan.steps))
        work = Path(os.path.abspath(settings.work_dir))
        if not work.is_relative_to(os.path.abspath(Path(plan.output).parent)):  # not beside it
            console.print(f"cache and run report: {settings.work_dir} (--work-dir moves them)")


run_llm_stage = sync_twin(arun_llm_stage)


async def arun_llm_chain(
    first: LLMStage,
    second: LLMStage,
    handoff: Callable[[dict[str, Any]], dict[str, Any] | None],
    final_input: Callable[[], Iterable[dict[str, Any]]],
    *,
    settings: LLMSettings,
    console: Console | None = None,
    meanwhile: Callable[[], object] | None = None,
) -> tuple[StageReport, StageReport]:
    """Two stages on one engine with no barrier between them (runner.run_chain): a unit
    of `second` starts as soon as `first` writes the row it comes from, so the endpoint is
    kept busy to the end. Each stage writes, resumes and reports as if it had run alone.
    `second.units` is not read (its input is what `first` writes); `first.units` may be a
    stream (runner.run_chain). `meanwhile` is called
    as the first requests go out (e.g. to start a thread with work for later)."""
    console = console or Console(quiet=True)
    started = time.perf_counter()

    async def main() -> tuple[StageReport, StageReport]:
        notify = _notifier(console)
        async with open_engine(settings, notify=notify) as engine:
            console.print(_header(f"{first.stage} → {second.stage}", engine))
            run_on = executor(settings, console)  # one for both stages
            run_on.attach(engine)
            ended = [0.0]
            with (
                locks.exclusive(first.output),
                locks.exclusive(second.output),
                _progress(console) as progress,
            ):
                # Inside the locks: the bookkeeping repairs and reads the files.
                runs = first.bookkeeping(engine, settings), second.bookkeeping(engine, settings)
                total = _to_do(first.units, first.selected)  # None for a stream: it grows
                # While a total still grows, an ETA from it means nothing: the bar shows a rate.
                first_grows = lambda: total is None and getattr(first.units, "growing", True)  # noqa: E731
                first_over = [False]
                bars = [
                    # A long request is shown on the first bar, then (once it is over) the second.
                    _progress_bar(
                        progress,
                        first.stage,
                        total,
                        engine,
                        grows=first_grows,
                        shows_waiting=lambda: not first_over[0],
                    ),
                    _progress_bar(
                        progress,
                        second.stage,
                        None,
                        engine,
                        grows=lambda: not first_over[0],
                        shows_waiting=lambda: first_over[0],
                    ),
                ]

                def first_progress(outcome):
                    bars[0](outcome)
                    first_over[0] = not first_grows() and _finished(outcome) >= outcome.units
                    ended[0] = time.perf_counter()

                if meanwhile is not None:
                    asyncio.get_running_loop().call_soon(meanwhile)  # once run_chain is under way

                async with contextlib.AsyncExitStack() as stack:
                    if hasattr(first.units, "__aenter__"):  # a stream (streaming.py) reads on this loop
                        await stack.enter_async_context(first.units)
                    await stack.enter_async_context(run_on)
                    works = [
                        run_on.work(first, runs[0].fingerprint),
                        run_on.work(second, runs[1].fingerprint),
                    ]
                    await run_chain(
                        Link(runs[0], works[0], first_progress),
                        first.units,
                        Link(runs[1], works[1], bars[1]),
                        handoff,
                        final_input,
                        window=_window(engine),
                    )
            reports = []
            for plan, run in zip((first, second), runs, strict=True):
                part = engine.accounting.only({step.name for step in plan.steps})
                reports.append(plan.report(engine, settings, run.outcome, started, part))
                if run_on.structured() is not None:
                    reports[-1].structured = run_on.structured()  # negotiated there, not here
            reports[0].wall_seconds = (ended[0] or time.perf_counter()) - started
            return reports[0], reports[1]

    reports = await main()
    for plan, report in zip((first, second), reports, strict=True):
        plan.record(report, settings)
    return reports


run_llm_chain = sync_twin(arun_llm_chain)


def _on_ray(settings: LLMSettings) -> str:
    where = connect(settings)
    workers, share = pool_size(settings)
    return f"on {where}: {workers} workers × {share} requests in flight per endpoint"


def _window(engine: Engine) -> int:
    """Units in flight: twice the requests the endpoints take, so none waits for a unit."""
    return max(4, 2 * sum(endpoint.concurrency for endpoint in engine.pool.endpoints))


def _to_do(units: Any, selected: set[str] | None) -> int | None:
    """The bar's total: the units this run is asked for (--limit, --users: the demo's 3 users
    of 16 drew 3/16), not the whole input; None for a stream (its total grows)."""
    if not isinstance(units, Sized):
        return None
    if selected is None:
        return len(units)
    ids = getattr(units, "ids", None)
    return len(set(ids) & set(selected)) if ids is not None else len(selected)


def _finished(outcome: StageOutcome) -> int:
    return outcome.done + outcome.done_before + outcome.failed + outcome.failed_before


def _progress_bar(
    progress: Progress,
    stage: str,
    total: int | None,
    engine: Engine,
    grows: Callable[[], bool] = lambda: False,
    shows_waiting: Callable[[], bool] = lambda: True,
):
    """A bar over the stage's units; `grows()`: its total is still growing (no ETA then);
    `shows_waiting()`: this bar says so when a request is long (alive.py)."""
    waiting = lambda: waiting_text(engine) if shows_waiting() else ""  # noqa: E731
    task = progress.add_task(stage, total=total, stats="", grows=grows(), waiting=waiting)

    def on_progress(outcome: StageOutcome) -> None:
        totals = engine.accounting.totals()
        finished = _finished(outcome)
        growing = grows()
        progress.update(
            task,
            completed=finished,
            total=total if total is not None else outcome.units,
            grows=growing,
            stats=f"done {outcome.done + outcome.done_before} · failed "
            f"{outcome.failed + outcome.failed_before} · requests {totals.requests} · "
            f"cached {totals.cache_hits}",
        )
        emit(stage, finished, None if growing else (total if total is not None else outcome.units))

    return on_progress


class TimeLeftOrRate(ProgressColumn):
    """The time left when the total is known; while it grows (users streaming in from the
    filter), an ETA from it would be wrong, so the rate of units instead."""

    def __init__(self, table_column: Column | None = None) -> None:
        super().__init__(table_column)
        self.eta = TimeRemainingColumn()

    def render(self, task: Task) -> Text:
        if task.fields.get("grows"):
            speed = task.speed
            return Text(f"{speed:.1f} units/s" if speed else "… units/s", style="progress.data.speed")
        return self.eta.render(task)


def append_report(path: Path, entry: dict[str, Any], settings: LLMSettings, full: bool | None = None) -> None:
    """Record a stage's run in the run report, with the (key-free) settings.

    `stages` keeps, per stage, the latest FULL run (the whole input): what the dataset card
    quotes. A quick look (`--limit`, `--users`; `full=False`) goes to `quick_looks`, latest
    per stage, so it is visible without replacing the full run's figures. Each entry
    carries `full`; when `full` is not given, the entry's own `full` decides (default True).
    The read-modify-write holds a lock, so stages finishing at the same time in two
    processes keep both entries; a report that cannot be parsed is set aside and replaced.
    """
    full = bool(entry.get("full", True)) if full is None else full
    section = "stages" if full else "quick_looks"
    with locked(path):
        report = read_json_object(path)
        entries = report.get(section)
        if not isinstance(entries, dict):
            entries = report[section] = {}
        entries[entry["stage"]] = {**report_entry(entry, path), "full": full, "settings": settings.public()}
        write_json_atomic(path, report)


def _notifier(console: Console) -> Callable[[str], None]:
    """The engine's notices (a structured mode stepped down, ...): on the console, and on the
    `personaemp` logger for a library caller whose console is quiet."""

    def notify(line: str) -> None:
        logger.info(line)
        console.print(f"[yellow]{line}[/]")

    return notify


def _header(stage: str, engine: Engine, steps: Sequence[Step] = ()) -> str:
    endpoints = ", ".join(endpoint.base_url for endpoint in engine.pool.endpoints)
    if steps and all(step.reply is None for step in steps):  # respond: free text, no mode is used
        return f"[bold]{stage}[/]: model {engine.model} at {endpoints} · free text"
    mode = engine.mode
    if engine.configured == "auto":
        mode = f"auto: {mode}" + (" (remembered)" if engine.mode_source == "remembered" else " (first try)")
    return f"[bold]{stage}[/]: model {engine.model} at {endpoints} · structured output {mode}"


@contextlib.contextmanager
def _progress(console: Console) -> Iterator[Progress]:
    with (
        Progress(
            TextColumn("[bold]{task.description}", table_column=fixed()),
            BarColumn(bar_width=40 if console.width >= 140 else 10, table_column=fixed()),
            MofNCompleteColumn(table_column=fixed()),
            FieldColumn("stats"),
            TimeLeftOrRate(table_column=fixed()),
            WaitingColumn(),
            console=console,
            transient=True,
        ) as progress,
        heartbeat(progress, console),
    ):
        yield progress
