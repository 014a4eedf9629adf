"""Rich terminal summaries printed by the CLI after each stage."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from personaemp.stages.filter import FilterReport


def print_filter_summary(report: FilterReport, console: Console) -> None:
    funnel = Table(title="filter funnel", title_justify="left")
    funnel.add_column("step")
    funnel.add_column("users", justify="right")
    funnel.add_row("users read", str(report.users_in))
    for gate, count in report.dropped.items():
        funnel.add_row(f"  dropped by {gate}", str(count))
    funnel.add_row("[bold]kept[/]", f"[bold]{report.kept}[/]")
    console.print(funnel)
    console.print(
        f"bad rows skipped: {report.bad_rows_skipped} · users without intents (passed the "
        f"intent gate): {report.users_without_intents} · flagged false memories dropped: "
        f"{report.flagged_memories_dropped} of {report.memories_in}"
    )
    if report.top_labels_kept:
        labels = Table(title="most frequent matched labels", title_justify="left")
        labels.add_column("label")
        labels.add_column("memories", justify="right")
        for label, count in report.top_labels_kept.items():
            labels.add_row(label, str(count))
        console.print(labels)
    console.print(f"wrote {report.output}")
