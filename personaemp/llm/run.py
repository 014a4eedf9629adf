"""Glue every LLM stage shares: open the engine, run the units with a progress bar, report."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from personaemp.io import write_json_atomic
from personaemp.llm.batch import BatchQueue, import_answers, write_requests
from personaemp.llm.engine import Engine
from personaemp.llm.estimate import Estimate, cache_history
from personaemp.llm.session import open_engine
from personaemp.llm.settings import LLMSettings
from personaemp.llm.step import Step
from personaemp.runner import StageOutcome, Work, run_units
from personaemp.workspace import locked, record_stage

REPORT_FILE = "run_report.json"
CALLS_KEPT = 200  # per-request timings in the report: all of a small run, the slowest of a big one


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
        }


def run_llm_stage(
    stage: str,
    units: Sequence[dict[str, Any]],
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
) -> StageReport:
    """Run `make_work(engine)` over `units` (the stage's whole current input; `selected`
    ids only), resumably; write and return the stage report.

    `fingerprint(engine)` names what makes a finished unit reusable (see Engine.fingerprint).
    `full`: the report describes the build (default: nothing was selected); a quick look's
    report is kept apart so a dataset card never quotes it. `chain`: (step, calls per unit)
    in the order a unit makes them, for --estimate (which sends and writes nothing).
    """
    full = selected is None if full is None else full
    console = console or Console(stderr=True)
    # Default: one per stage and folder. Commands that write many outputs into one folder
    # (respond, evaluate: one per system) pass their own, so one run never drops another's.
    failures = failures or output.with_name(f"{stage}.failures.jsonl")
    started = time.perf_counter()
    estimate = Estimate([(step.name, calls) for step, calls in chain]) if settings.estimate else None
    queue = BatchQueue() if settings.batch is not None else None
    imported: dict[str, int] = {}
    awaiting: dict[str, Path] = {}

    async def main() -> StageReport:
        notify = lambda line: console.print(f"[yellow]{line}[/]")  # noqa: E731
        async with open_engine(settings, notify=notify, offline=estimate or queue) as engine:
            if queue is not None:
                console.print(f"[bold]{stage}[/]: model {engine.model} · batch files in {settings.batch}")
            elif estimate is not None:
                console.print(f"[bold]{stage}[/]: model {engine.model} · estimate (nothing is sent)")
            else:
                console.print(_header(stage, engine))
            if queue is not None:
                settings.batch.mkdir(parents=True, exist_ok=True)
                counts, waiting = import_answers(settings.batch, engine.cache)
                imported.update(counts)
                awaiting.update(waiting)
            with _progress(console) as progress:
                task = progress.add_task(stage, total=len(units), stats="")

                def on_progress(outcome: StageOutcome) -> None:
                    totals = engine.accounting.totals()
                    finished = outcome.done + outcome.done_before + outcome.failed + outcome.failed_before
                    progress.update(
                        task,
                        completed=finished,
                        stats=f"done {outcome.done + outcome.done_before} · failed "
                        f"{outcome.failed + outcome.failed_before} · requests {totals.requests} · "
                        f"cached {totals.cache_hits}",
                    )

                outcome = await run_units(
                    units,
                    make_work(engine),
                    key=key,
                    output=output,
                    failures=failures,
                    fingerprint=fingerprint(engine),
                    window=max(4, 2 * sum(e.concurrency for e in engine.pool.endpoints)),
                    selected=selected,
                    retry_failed=retry_failed,
                    on_progress=on_progress,
                    dry=estimate is not None,
                )
            totals = engine.accounting.totals()
            return StageReport(
                stage=stage,
                outcome=outcome,
                wall_seconds=time.perf_counter() - started,
                model=engine.model,
                endpoint_kind=engine.endpoint_kind,
                steps=engine.accounting.as_dict(),
                totals={**totals.__dict__, "failures": dict(totals.failures)},
                structured=engine.structured_report(),
                full=full,
                cost=engine.accounting.cost(settings.price_in, settings.price_out),
                calls=engine.accounting.slowest_calls(CALLS_KEPT),
                output=str(output),
                failures=str(failures),
                estimate=estimate.report(cache_history(engine.cache), settings.price_in, settings.price_out)
                if estimate is not None
                else None,
            )

    report = asyncio.run(main())
    if estimate is not None:
        return report  # nothing was sent or written: no run to record
    if queue is not None:
        new = write_requests(settings.batch, stage, queue, awaiting) if queue.requests else []
        waiting = sorted({str(awaiting[cid]) for cid in queue.requests if cid in awaiting})
        report.batch = {
            **imported, "requests": len(queue.requests), "new_files": [str(f) for f in new],
            "files": [str(f) for f in new] + waiting,
        }  # fmt: skip
        if report.batch["files"]:
            return report  # the stage goes on next round: nothing to record yet
    append_report(settings.work_dir / REPORT_FILE, report.as_dict(), settings)
    record_stage(
        output, stage, report=settings.work_dir / REPORT_FILE, failures=failures, full=full, input=input_path
    )
    return report


def append_report(path: Path, entry: dict[str, Any], settings: LLMSettings, full: bool | None = None) -> None:
    """Record a stage's run in the run report, with the (key-free) settings.

    `stages` keeps, per stage, the latest FULL run (the whole input): what the dataset card
    quotes. A quick look (`--limit`, `--users`; `full=False`) goes to `quick_looks`, latest
    per stage, so it is visible without replacing the full run's figures. Each entry
    carries `full`; when `full` is not given, the entry's own `full` decides (default True).
    The read-modify-write holds a lock, so stages finishing at the same time in two
    processes keep both entries; a report that cannot be parsed is replaced.
    """
    full = bool(entry.get("full", True)) if full is None else full
    section = "stages" if full else "quick_looks"
    with locked(path):
        report: dict[str, Any] = {}
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            report = {}
        if not isinstance(report, dict):
            report = {}
        entries = report.get(section)
        if not isinstance(entries, dict):
            entries = report[section] = {}
        entries[entry["stage"]] = {**entry, "full": full, "settings": settings.public()}
        write_json_atomic(path, report)


def _header(stage: str, engine: Engine) -> str:
    endpoints = ", ".join(endpoint.base_url for endpoint in engine.pool.endpoints)
    mode = engine.mode
    if engine.configured == "auto":
        mode = f"auto: {mode}" + (" (remembered)" if engine.mode_source == "remembered" else " (first try)")
    return f"[bold]{stage}[/]: model {engine.model} at {endpoints} · structured output {mode}"


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
