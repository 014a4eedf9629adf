"""What every stage returns to a Python caller (and `--json` prints): one `StageResult`.

A stage's own report stays as it was (StageReport of an LLM stage, FilterReport,
SplitReport, ...) under `.report`; the result puts in front what any stage has: the files
it wrote, its counts and its cost, the rows of its output on demand, and a plain dict.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(repr=False)
class StageResult:
    stage: str
    output: Path | str | None  # the main output: a file, a folder, or a Hub URL
    report: Any = None  # the stage's own report
    summary: Any = None  # what the CLI summarises besides (persona counts, query funnel, evaluation)
    failures: Path | None = None  # the units that failed for good, one line each
    counts: dict[str, int] = field(default_factory=dict)
    cost: float | None = None  # dollars, when prices were given
    files: dict[str, Path] = field(default_factory=dict)  # other files written, by name
    judges: list[Any] = field(default_factory=list)  # evaluate with a panel: a report per judge

    def rows(self, name: str | None = None) -> list[dict[str, Any]]:
        """The rows of the output file (or of `files[name]`, e.g. "random/test" of a split)."""
        from personaemp.io import ErrorPolicy, iter_jsonl

        if name is not None:
            if name not in self.files:
                wrote = ", ".join(self.files) or "no other file"
                raise KeyError(f"{self.stage} wrote no {name!r}; it wrote {wrote}")
            path = self.files[name]
        else:
            path = self.output
            if not isinstance(path, Path) or path.suffix != ".jsonl":
                jsonl = [key for key, value in self.files.items() if value.suffix == ".jsonl"]
                raise ValueError(
                    f"{self.stage}'s output {path} is not a JSONL file"
                    + (f"; name one of {', '.join(jsonl)}" if jsonl else "")
                )
        if not path.exists():  # gone since (a stage that made nothing still writes an empty file)
            raise FileNotFoundError(
                f"{path}: {self.stage}'s output is not there (moved or deleted since it ran)"
            )
        return [row for _, _, row in iter_jsonl(path, ErrorPolicy("fail"))]

    def to_polars(self, name: str | None = None):
        """The rows of the output (or of `files[name]`) as a polars DataFrame, one row per
        row of the file: nested fields stay structs and lists; a Big Five adds its five
        levels as columns of their own (`openness`, ..., `neuroticism`)."""
        from personaemp.frames import RECORD_COLUMNS, with_levels

        stage = "split" if name and "/" in name else self.stage
        return _frame(list(with_levels(self.rows(name))), RECORD_COLUMNS.get(stage))

    def queries(self, name: str | None = None):
        """One row per accepted query (of gen-queries' output, a split file, a published
        dataset), the user's columns beside it (user id, language, profile, Big Five levels)."""
        from personaemp.frames import QUERY_COLUMNS, query_rows

        return _frame(list(query_rows(self.rows(name))), QUERY_COLUMNS)

    def scores(self, name: str | None = None):
        """evaluate: one row per system and query (each dimension, H, B, status, the user's
        Big Five levels), from its scores file (`name`: "scores 2" for a panel's second judge)."""
        from personaemp.frames import SCORE_COLUMNS, score_rows

        if name is None:
            name = next((key for key in self.files if key.startswith("scores")), "scores")
        return _frame(list(score_rows(self.rows(name))), SCORE_COLUMNS)

    def to_dataset(self, name: str | None = None):
        """The rows of the output (or of `files[name]`) as a `datasets.Dataset`."""
        import datasets

        return datasets.Dataset.from_polars(self.to_polars(name))

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON types only (what `--json` prints)."""
        return {
            "stage": self.stage,
            "output": plain(self.output),
            "failures": plain(self.failures),
            "counts": dict(self.counts),
            "cost": self.cost,
            "files": plain(self.files),
            "report": plain(self.report),
            **({"judges": [plain(report) for report in self.judges]} if self.judges else {}),
            "summary": plain(self.summary),
            # an LLM stage's --estimate (what would be sent) and --batch round, which its
            # run report leaves out
            **{
                key: plain(getattr(self.report, key))
                for key in ("estimate", "batch")
                if getattr(self.report, key, None) is not None
            },
        }

    def failed_entirely(self) -> str | None:
        """One line when the stage had units and finished none (every one failed, now or in an
        earlier run): a failed run, whatever the process did besides. None otherwise."""
        counts = self.counts
        finished = counts.get("done", 0) + counts.get("done_before", 0)
        failed = counts.get("failed", 0) + counts.get("failed_before", 0)
        if "units" not in counts or finished or not failed:
            return None
        where = f" ({self.failures} says why)" if self.failures else ""
        return f"{self.stage}: all {failed} of its units failed{where}"

    def __repr__(self) -> str:
        counts = ", ".join(f"{name} {value}" for name, value in self.counts.items())
        cost = f", ${self.cost:.4f}" if self.cost is not None else ""
        return f"<StageResult {self.stage}: {counts}{cost} -> {self.output}>"


def stop_if_failed(result) -> None:
    """Raise StageFailedError (exit 1) when a stage's result, or one of `run`'s, had units and
    finished none; its files and report are written by then."""
    from personaemp.errors import StageFailedError

    for one in [result] if isinstance(result, StageResult) else list(getattr(result, "results", {}).values()):
        line = one.failed_entirely() if isinstance(one, StageResult) else None
        if line:
            raise StageFailedError(line, "fix the cause, then run it again with --retry-failed")


def _frame(rows: list[dict[str, Any]], columns: dict[str, Any] | None = None):
    """A polars DataFrame of JSON rows, every row read for the schema (rows differ); with no
    rows, the `columns` the rows would have had (0 rows, not 0 columns)."""
    import polars as pl

    if not rows and columns:
        from personaemp.frames import polars_schema

        return pl.DataFrame(schema=polars_schema(columns))
    return pl.DataFrame(rows, infer_schema_length=None)


def plain(value: Any) -> Any:
    """JSON-ready: reports that have `as_dict()` give it; dataclasses, paths and counters follow."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "as_dict"):
        return plain(value.as_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Counter | dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(item) for item in value]
    if hasattr(value, "__dict__"):  # e.g. the projected estimate of `run --estimate`
        return {key: plain(item) for key, item in vars(value).items() if not key.startswith("_")}
    return str(value)


# --- one builder per kind of stage ---------------------------------------------------------------


def of_filter(report, report_path: Path | None) -> StageResult:
    return StageResult(
        "filter",
        Path(report.output),
        report,
        counts={
            "users_in": report.users_in,
            "kept": report.kept,
            "dropped": sum(report.dropped.values()),
            "bad_rows_skipped": report.bad_rows_skipped,
        },  # fmt: skip
        files={"report": Path(report_path)} if report_path else {},
    )


def of_llm_stage(report, summary=None) -> StageResult:
    """An LLM stage (infer-persona, gen-queries, criteria, respond, evaluate's scores)."""
    outcome = report.outcome
    counts = {
        "units": outcome.units, "done": outcome.done, "done_before": outcome.done_before,
        "failed": outcome.failed, "failed_before": outcome.failed_before,
    }  # fmt: skip
    if hasattr(summary, "eligible"):  # infer-persona
        counts["eligible"] = summary.eligible
    if hasattr(summary, "accepted"):  # gen-queries
        counts["queries"] = sum(summary.accepted.values())
        counts["rejected"] = sum(summary.rejected.values())
    if getattr(report, "estimate", None) is not None:
        counts["requests_estimated"] = report.estimate.get("requests", 0)
    if getattr(report, "batch", None) is not None:
        counts["batch_requests"] = report.batch.get("requests", 0)
    output, failures = getattr(report, "output", ""), getattr(report, "failures", "")
    return StageResult(
        report.stage,
        Path(output) if output else None,
        report,
        summary,
        failures=Path(failures) if failures else None,
        counts=counts,
        cost=getattr(report, "cost", None),
    )


def of_split(report, out_dir: Path) -> StageResult:
    out_dir = Path(out_dir)
    counts = {"users_in": report.users_in, "left_out": sum(report.left_out.values())}
    files = {}
    for setting, figures in report.settings.items():
        for part in ("train", "test"):
            counts[f"{setting}_{part}_users"] = figures[f"{part}_users"]
            files[f"{setting}/{part}"] = out_dir / setting / f"{part}.jsonl"
    files["report"] = out_dir / "split_report.json"
    return StageResult("split", out_dir, report, counts=counts, files=files)


def of_stats(result) -> StageResult:
    out = Path(result.out)
    funnel = result.stats.get("funnel", {})
    counts = {step["stage"] + "_users": step["count"] for step in funnel.get("users", [])}
    return StageResult("stats", out, result, counts=counts, files={name: out / name for name in result.files})


def of_publish(result) -> StageResult:
    target = result.target
    output: Path | str = target if target.startswith("https://") else Path(target)
    counts = {
        f"{setting}_{split}_rows": n for setting, parts in result.rows.items() for split, n in parts.items()
    }
    files = {"card": Path(result.card)} if result.card else {}
    return StageResult("push", output, result, counts=counts, files=files)


def of_evaluate(report, evaluation, report_path: Path) -> StageResult:
    """`report`: the judge's stage report, or a panel's list of them (the first one leads)."""
    panel = report if isinstance(report, list) else [report]
    result = of_llm_stage(panel[0], evaluation)
    result.stage = "evaluate"
    result.judges = panel if len(panel) > 1 else []
    names = [f"scores {number}" for number in range(1, len(panel) + 1)] if len(panel) > 1 else ["scores"]
    result.files = {name: Path(one.output) for name, one in zip(names, panel, strict=True)}
    if evaluation is not None:  # not after --estimate or a batch round still out
        result.output = Path(report_path)
        result.counts["systems"] = len(evaluation.get("systems", {}))
    return result


def of_merge(report) -> StageResult:
    return StageResult(
        report.stage,
        Path(report.output),
        report,
        failures=Path(report.failures) if report.failures else None,
        counts={"shards": report.shards, "units": report.units, "done": report.done, "failed": report.failed},
    )
