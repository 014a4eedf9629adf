"""`personaemp merge`: join the parts of an LLM stage run as shards on many machines.

`infer-persona --shard I/N` (or gen-queries) works on part I of N of the users, chosen by
a hash of the user id (the same partition on every machine), and writes
`<output stem>.shard-I-of-N.jsonl` and its own failures file beside the output: shards
never share a file or a lock. They can share a work dir (the SQLite cache takes several
writers). `merge` checks that every unit of the stage's current input is in exactly one
part, finished or failed, and in the part the hash gives it, then writes the stage's
normal output and failures files (input order), its manifest entry and a run-report
entry that adds up the parts'. The result is what one run over the whole input writes.
Shards of a quick look (`--limit N` picks the first N units of the whole input, and each
shard works on its own of them) merge into what one `--limit N` run writes: the picked
units, beside the rows the output already held.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from personaemp import locks
from personaemp.errors import InputError
from personaemp.io import atomic_output, read_stage_rows
from personaemp.shards import failures_path, shard_name, shard_of

STAGES = ("extract-memories", "infer-persona", "gen-queries")


@dataclass
class MergeReport:
    stage: str
    shards: int
    units: int
    done: int = 0
    failed: int = 0
    failures_by_kind: Counter = field(default_factory=Counter)
    output: str = ""
    failures: str = ""


def merge_shards(stage: str, input_path: Path, output_path: Path, work_dir: Path) -> MergeReport:
    """Join the shard files of `stage` beside `output_path` into `output_path` (see the
    module's docstring). Nothing is written unless every unit is accounted for. The
    summed report goes where the parts' reports are (`work_dir`'s if none was recorded)."""
    from personaemp.llm.stage import REPORT_FILE
    from personaemp.manifest import locked, read_manifest, record_stage
    from personaemp.units import _scan

    if stage not in STAGES:
        raise InputError(f"merge: no shards for stage {stage!r}", f"use one of {', '.join(STAGES)}")
    parts = _find_parts(output_path)
    count = len(parts)
    units = _input_rows(stage, input_path)
    ids = units.ids
    wanted = set(ids)
    manifest = read_manifest(output_path.parent)
    entries = [manifest.get(shard_name(stage, (i, count))) or {} for i in parts]
    recorded = [entry.get("report") for entry in entries]
    quick = any(entry.get("full") is False for entry in entries)  # shards of a --limit/--users run
    failures = failures_path(output_path, stage)
    report = MergeReport(stage, count, len(ids), output=str(output_path), failures=str(failures))
    rows: dict[str, tuple[Path, int]] = {}
    failed: dict[str, tuple[Path, int]] = {}
    kinds: Counter = Counter()
    with contextlib.ExitStack() as held:
        for path in [*parts.values(), output_path]:  # a shard still running holds its lock
            held.enter_context(locks.exclusive(path))
        for number, part in parts.items():
            part_failures = failures_path(part, stage)
            done = _scan(part, "user_id")
            bad = _scan(part_failures, "user_id")
            bad_kinds = _scan(part_failures, "user_id", "kind")
            for uid, (offset, _) in [*done.items(), *bad.items()]:
                if uid not in wanted:
                    raise InputError(
                        f"{part}: user {uid} is not in {input_path} (the input changed since)",
                        f"run shard {number}/{count} again, then merge",
                    )
                if shard_of(uid, count) != number:
                    raise InputError(f"{part}: user {uid} belongs to shard {shard_of(uid, count)}/{count}")
                if uid in rows or uid in failed:
                    raise InputError(f"{part}: user {uid} is in two shards")
                if uid in done:
                    rows[uid] = (part, offset)
                else:
                    failed[uid] = (part_failures, offset)
                    kinds[bad_kinds[uid][1]] += 1
        _check_fresh(units, parts, recorded, stage, input_path)
        missing = [uid for uid in ids if uid not in rows and uid not in failed]
        if quick:  # the units the quick look did not pick keep the rows the output held
            held_before = _scan(output_path, "user_id", repair=False)
            rows.update({uid: (output_path, held_before[uid][0]) for uid in missing if uid in held_before})
            missing = []
        if missing:
            shards = sorted({shard_of(uid, count) for uid in missing})
            raise InputError(
                f"{len(missing)} of {len(ids)} users are in no shard (e.g. {missing[0]})",
                f"run shard{'s' if len(shards) > 1 else ''} {', '.join(f'{i}/{count}' for i in shards)} "
                "again (it resumes), then merge",
            )
        _write(output_path, [rows[uid] for uid in ids if uid in rows])
        _write(failures, [failed[uid] for uid in ids if uid in failed])
    report.done, report.failed, report.failures_by_kind = len(rows), len(failed), kinds
    if quick:
        report.units = len(rows) + len(failed)
    # The parts' reports are where their manifest entries say (their --work-dir).
    report_file = Path(next((path for path in recorded if path), Path(work_dir) / REPORT_FILE))
    with locked(report_file):
        _add_up_reports(report_file, stage, count, report, "quick_looks" if quick else "stages")
    record_stage(output_path, stage, report=report_file, failures=failures, full=not quick, input=input_path)
    return report


def _find_parts(output: Path) -> dict[int, Path]:
    pattern = re.compile(rf"^{re.escape(output.stem)}\.shard-(\d+)-of-(\d+){re.escape(output.suffix)}$")
    found: dict[int, dict[int, Path]] = {}
    for path in output.parent.glob(f"{output.stem}.shard-*"):
        match = pattern.match(path.name)
        if match:
            found.setdefault(int(match[2]), {})[int(match[1])] = path
    if not found:
        raise InputError(
            f"no shards of {output} (files named {output.stem}.shard-I-of-N{output.suffix})",
            "run the stage with --shard I/N on each machine first, or pass its --output",
        )
    if len(found) > 1:
        raise InputError(
            f"shards of {output} from runs cut {' and '.join(map(str, sorted(found)))} ways",
            "delete the shard files of the partition you do not want",
        )
    [(count, parts)] = found.items()
    absent = [str(i) for i in range(1, count + 1) if i not in parts]
    if absent:
        raise InputError(
            f"shard{'s' if len(absent) > 1 else ''} {', '.join(absent)} of {count} not found beside {output}",
            "run it, then merge",
        )
    return dict(sorted(parts.items()))


def _input_rows(stage: str, input_path: Path):
    """The stage's units as its run reads them (io.StageRows)."""
    if stage == "extract-memories":  # its units: the users read from the log, beside the output
        from personaemp.dataset.memories import Conversations

        return read_stage_rows(input_path, Conversations, kind="conversations")[0]
    if stage == "infer-persona":
        from personaemp.dataset.persona import read_rows

        return read_rows(input_path)
    from personaemp.dataset.queries import read_personas

    return read_personas(input_path)[0]


def _check_fresh(units, parts: dict[int, Path], reports: list, stage: str, input_path: Path) -> None:
    """Stop on a shard made from another version of the input: each row's input_hash must be
    the hash of today's input row with the fingerprint its run recorded (its run report)."""
    from personaemp.units import _scan, unit_hash

    count = len(parts)
    fingerprints: dict[int, str] = {}
    for (number, _), report in zip(parts.items(), reports, strict=True):
        try:
            entry = json.loads(Path(report).read_text(encoding="utf-8"))["stages"][
                shard_name(stage, (number, count))
            ]
            fingerprints[number] = entry["fingerprint"]
        except (OSError, ValueError, TypeError, KeyError):
            continue  # no report of that shard's run (or an older one): nothing to check against
    made = {
        number: {
            uid: digest
            for path in (part, failures_path(part, stage))
            for uid, (_, digest) in _scan(path, "user_id").items()
        }
        for number, part in parts.items()
        if number in fingerprints
    }
    for unit in units:
        uid = str(unit["user_id"])
        number = shard_of(uid, count)
        digest = made.get(number, {}).get(uid)
        if digest is not None and digest != unit_hash(unit, fingerprints[number]):
            raise InputError(
                f"{parts[number]}: user {uid} was worked on from an earlier version of {input_path} "
                f"(it changed after shard {number}/{count} ran)",
                f"run shard {number}/{count} again (it resumes), then merge",
            )


def _write(path: Path, lines: list[tuple[Path, int]]) -> None:
    handles: dict[Path, Any] = {}
    try:
        with atomic_output(path) as target:
            for source, offset in lines:
                handle = handles.get(source) or handles.setdefault(source, source.open("rb"))
                handle.seek(offset)
                target.write(handle.readline())
    finally:
        for handle in handles.values():
            handle.close()


def _add_up_reports(path: Path, stage: str, count: int, merged: MergeReport, section: str = "stages") -> None:
    """The stage's run-report entry: the parts' entries added up (tokens, requests, steps);
    a quick look's parts and sum are in `quick_looks`."""
    from personaemp.io import read_json_object, write_json_atomic
    from personaemp.llm.accounting import CALLS_KEPT
    from personaemp.manifest import report_entry

    report = read_json_object(path)  # a damaged one is kept aside, as append_report does
    stages = report.setdefault(section, {})
    parts = [stages.get(shard_name(stage, (i, count))) for i in range(1, count + 1)]
    parts = [part for part in parts if isinstance(part, dict)]
    entry: dict[str, Any] = dict(parts[0]) if parts else {"stage": stage}
    entry.update(stage=stage, full=section == "stages", units=merged.units)
    entry.update(done=merged.done, failed=merged.failed)
    entry.update(done_before=0, failed_before=0, failures_by_kind=dict(merged.failures_by_kind))
    entry.update(output=merged.output, failures_file=merged.failures, shards=count)
    if parts:
        entry["wall_seconds"] = max(part.get("wall_seconds", 0) for part in parts)
        entry["totals"] = _add(part.get("totals", {}) for part in parts)
        steps = {name for part in parts for name in part.get("steps", {})}
        entry["steps"] = {name: _add(part.get("steps", {}).get(name, {}) for part in parts) for name in steps}
        costs = [part.get("cost") for part in parts if part.get("cost") is not None]
        entry["cost"] = sum(costs) if costs else None
        entry["calls"] = sorted(
            (call for part in parts for call in part.get("calls", [])), key=lambda c: -c["seconds"]
        )[:CALLS_KEPT]
    stages[stage] = report_entry(entry, path)
    write_json_atomic(path, report)


def _add(dicts) -> dict[str, Any]:
    """Numbers added, `slowest` the largest, nested counters (failures) added per key."""
    total: dict[str, Any] = {}
    for part in dicts:
        for key, value in part.items():
            if isinstance(value, dict):
                inner = total.setdefault(key, {})
                for name, number in value.items():
                    inner[name] = inner.get(name, 0) + number
            elif key == "slowest":
                total[key] = max(total.get(key, 0), value)
            elif isinstance(value, int | float) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
    return total


# --- from options (personaemp merge and pe.merge_shards) ------------------------------------------


def from_options(stage: str, options, console, input_path: Path | None = None, output: Path | None = None):
    """`personaemp merge STAGE` on `run`'s options (RunOptions): the stage's shard files into its output."""
    from personaemp.paths import check_paths
    from personaemp.results import of_merge

    name = {"extract-memories": "extract", "infer-persona": "persona", "gen-queries": "queries"}.get(stage)
    if name is None:
        raise InputError(f"merge takes {', '.join(STAGES)}, not {stage!r}")
    given = {"input": input_path, "output": output}
    section = getattr(options, name).model_copy(update={k: v for k, v in given.items() if v is not None})
    check_paths([(name, section), ("llm", options.llm)])
    units = section.input
    if stage == "extract-memories":  # its units: the users read from the log, beside its output
        from personaemp.dataset.memories import conversations_path, extract_args, write_conversations

        units = conversations_path(section.output)
        # Read from the log as it is now (left alone when unchanged), so a shard made from
        # an earlier version of the log is found stale as for the other stages.
        reading = ("fmt", "bounds", "on_error", "user_field", "columns", "time_format")
        args = extract_args(section)
        write_conversations(Path(section.input), units, **{key: args[key] for key in reading})
    report = merge_shards(stage, units, section.output, options.llm.work_dir)
    result = of_merge(report)
    kinds = ", ".join(f"{kind} {n}" for kind, n in report.failures_by_kind.most_common())
    console.print(
        f"[bold]{stage}[/]: {report.shards} shards merged: {report.units} units, {report.done} done, "
        f"{report.failed} failed{f' ({kinds})' if kinds else ''}"
    )
    console.print(f"wrote {report.output}" + (f" and {report.failures}" if report.failed else ""))
    return result
