"""Glue every LLM stage shares: open the engine, run the units with a progress bar, report."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
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
from personaemp.llm.ray_vllm import rounds, uses_vllm
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
    """One LLM stage as run_llm_stage runs it (see there for what each field means)."""

    stage: str
    units: Iterable[dict[str, Any]]
    make_work: Callable[[Engine], Work]
    key: str
    output: Path
    fingerprint: Callable[[Engine], str]
    steps: Sequence[Step] = ()  # its LLM steps, in the order a unit makes them
    selected: set[str] | None = None
    full: bool | None = None
    input_path: Path | None = None
    retry_failed: bool = False
    failures: Path | None = None
    skipped: int = 0  # input rows that are not units (gen-queries: ineligible personas)
    calls: Sequence[int] | None = None  # per step, calls a unit makes (--estimate); default 1 each

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
    stage: str,
    units: Iterable[dict[str, Any]],
    make_work: Callable[[Engine], Work],
    *,
    settings: LLMSettings,
    key: str,
    output: Path,
    fingerprint: Callable[[Engine], str],
    selected: set[str] | None = None,
    full: bool | None = None,
    input_path: Path | None = None,
    retry_failed: bool = False,
    console: Console | None = None,
    failures: Path | None = None,
    chain: Sequence[tuple[Step, int]] = (),
    notes: dict[str, dict[str, Any]] | None = None,
) -> StageReport:
    """Run `make_work(engine)` over `units` (the stage's whole current input, re-iterable;
    `selected` ids only), resumably; write and return the stage report. The library's
    plain-argument form of `arun_stage`, which takes the stage as an LLMStage.

    `fingerprint(engine)` names what makes a finished unit reusable (see Engine.fingerprint).
    `full`: the report describes the build (default: nothing was selected); a quick look's
    report is kept apart so a dataset card never quotes it. `chain`: (step, calls per unit)
    in the order a unit makes them, for --estimate (which sends and writes nothing). `notes`:
    the stage's own figures, written in its report (StageReport.notes).
    """
    plan = LLMStage(
        stage, units, make_work, key, output, fingerprint, steps=[step for step, _ in chain],
        selected=selected, full=full, input_path=input_path, retry_failed=retry_failed, failures=failures,
        calls=[calls for _, calls in chain] or None,
    )  # fmt: skip
    return await arun_stage(plan, settings=settings, console=console, notes=notes)


async def arun_stage(
    plan: LLMStage,
    *,
    settings: LLMSettings,
    console: Console | None = None,
    notes: dict[str, dict[str, Any]] | None = None,
) -> StageReport:
    """Run the plan's units resumably; write and return its report. One pass on this
    engine, or (`--llm vllm`) passes over batch files with vLLM answering between them.
    `notes`: the stage's own figures, written in its report (StageReport.notes)."""
    console = console or Console(quiet=True)  # a library call prints only when given a console
    if uses_vllm(settings):
        return await _in_vllm_rounds(plan, settings, console, notes)
    return await _one_pass(plan, settings, console, notes)


async def _in_vllm_rounds(
    plan: LLMStage, settings: LLMSettings, console: Console, notes: dict[str, dict[str, Any]] | None
) -> StageReport:
    """Passes over batch files, vLLM on Ray answering between them (ray_vllm.rounds, which
    says what each round does); the stage's wall time covers its rounds."""
    began = time.perf_counter()

    async def one_pass(round_settings: LLMSettings, figures: dict) -> StageReport:
        extra = {**(notes or {}), **figures}
        return await _one_pass(plan, round_settings, console, extra, began, in_rounds=True)

    report = await rounds(one_pass, settings, plan.stage, plan.output, console)
    plan.record(report, settings)
    return report


async def _one_pass(
    plan: LLMStage,
    settings: LLMSettings,
    console: Console,
    notes: dict[str, dict[str, Any]] | None,
    started: float | None = None,
    in_rounds: bool = False,
) -> StageReport:
    """One pass over the plan's units: the engine sends (the units' work in this process or
    on a Ray pool: `executor`) or is offline (--estimate, --batch: `offline_mode`).
    `in_rounds`: a pass of vLLM rounds, which announce the stage and record its report."""
    started = started or time.perf_counter()
    mode = offline_mode(plan, settings)
    async with open_engine(settings, notify=_notifier(console), offline=mode.offline) as engine:
        if not in_rounds:
            _announce(console, plan, engine, settings)
        mode.opened(engine, settings)
        run_on = executor(settings, engine, console)
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
        report.notes = dict(notes or {})
        mode.closed(report, engine, settings)
    if mode.finished(report, settings) and not in_rounds:
        plan.record(report, settings)
    return report


# --- where each unit's work runs: one protocol ------------------------------------------------------


class Executor(Protocol):
    """Where a stage's units do their work, the bookkeeping staying here: an async context
    around the pass, and the work of a plan for `run_units`/`run_chain`."""

    async def __aenter__(self) -> Executor: ...

    async def __aexit__(self, *exc: object) -> None: ...

    def work(self, plan: LLMStage, fingerprint: str) -> Work: ...

    def structured(self) -> dict[str, Any] | None: ...


class InProcess:
    """Every unit's work on this process's engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def __aenter__(self) -> InProcess:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def work(self, plan: LLMStage, fingerprint: str) -> Work:
        return plan.make_work(self.engine)

    def structured(self) -> dict[str, Any] | None:
        return None  # the engine's own report says it


class RayPool:
    """Every unit's work on a pool of Ray workers (ray_executor.WorkerPool), each with its
    own engine; the structured mode is negotiated there."""

    def __init__(self, settings: LLMSettings, engine: Engine, console: Console) -> None:
        console.print(_on_ray(settings))
        self.pool = WorkerPool(settings, engine)

    async def __aenter__(self) -> RayPool:
        await self.pool.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pool.__aexit__(*exc)

    def work(self, plan: LLMStage, fingerprint: str) -> Work:
        return self.pool.work(plan.stage, plan.make_work, plan.fingerprint, fingerprint)

    def structured(self) -> dict[str, Any] | None:
        return self.pool.figures.structured()


def executor(settings: LLMSettings, engine: Engine, console: Console) -> Executor:
    """A Ray pool when the settings ask for Ray (`--executor ray`), else this process."""
    return RayPool(settings, engine, console) if uses_ray(settings) else InProcess(engine)


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
        calls = plan.calls or [1] * len(plan.steps)
        self.offline = Estimate(
            [(step.name, count) for step, count in zip(plan.steps, calls, strict=True)],
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


run_stage = sync_twin(arun_stage)


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
            run_on = executor(settings, engine, console)  # one for both stages
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
