"""Glue every LLM stage shares: open the engine, run the units with a progress bar, report."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from personaemp.io import write_json_atomic
from personaemp.llm.engine import Engine
from personaemp.llm.session import open_engine
from personaemp.llm.settings import LLMSettings
from personaemp.runner import StageOutcome, Work, run_units

REPORT_FILE = "run_report.json"


@dataclass
class StageReport:
    stage: str
    outcome: StageOutcome
    wall_seconds: float
    model: str
    endpoint_kind: str
    steps: dict[str, dict] = field(default_factory=dict)
    totals: dict[str, Any] = field(default_factory=dict)
    cost: float | None = None
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
            "units": outcome.units,
            "done": outcome.done,
            "done_before": outcome.done_before,
            "failed": outcome.failed,
            "failed_before": outcome.failed_before,
            "failures_by_kind": dict(outcome.failures_by_kind),
            "steps": self.steps,
            "totals": self.totals,
            "cost": self.cost,
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
    retry_failed: bool = False,
    keep_others: bool = False,
    console: Console | None = None,
) -> StageReport:
    """Run `make_work(engine)` over `units`, resumably; write and return the stage report.

    `fingerprint(engine)` names what makes a finished unit reusable (model, prompts, ...).
    """
    console = console or Console(stderr=True)
    failures = output.with_name(f"{stage}.failures.jsonl")
    secrets = [s for s in (settings.api_key, os.environ.get("HF_TOKEN")) if s]
    started = time.perf_counter()

    async def main() -> StageReport:
        async with open_engine(settings) as engine:
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
                    retry_failed=retry_failed,
                    keep_others=keep_others,
                    secrets=secrets,
                    on_progress=on_progress,
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
                cost=engine.accounting.cost(settings.price_in, settings.price_out),
                output=str(output),
                failures=str(failures),
            )

    report = asyncio.run(main())
    append_report(settings.work_dir / REPORT_FILE, report.as_dict(), settings)
    return report


def append_report(path: Path, entry: dict[str, Any], settings: LLMSettings) -> None:
    """The run report keeps the latest entry of each stage, plus the (key-free) settings."""
    report: dict[str, Any] = {}
    if path.exists():
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            report = {}
    report.setdefault("stages", {})[entry["stage"]] = {**entry, "settings": settings.public()}
    write_json_atomic(path, report)


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
