"""Re-runs that skip finished work: a stage whose inputs, options and code are those of its
last finished run, and whose outputs are still as it left them, is not run again.

A stage computes `fingerprint(inputs, options)` before it reads anything, asks
`current(stage, output, fingerprint)`, and when that gives the last run's record it
returns that run's result with one line ("split: unchanged since …"); otherwise it runs
and calls `record(...)` once its outputs are in place. The record is the `fresh` key of the
stage's entry in the manifest beside its output (workspace.py), written under its lock.

What a fingerprint covers, cheaply (nothing is read but file metadata):
- each input file's size, modification time and change time (the system sets the ctime
  on every write: an edit that puts the old mtime back is seen); a folder: every file under
  it, hidden ones aside (locks and temporary files); an input that is not a local path (a Hub
  dataset) makes the stage never current;
- the stage's options, as canonical JSON;
- the code: a digest of the package's source and data files (computed once a process), so
  a new version, or any edit, redoes every stage.
A record also holds the size and time of every output it wrote: an output deleted or
edited since makes the stage run again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from personaemp.errors import InputError
from personaemp.workspace import note_stage, read_manifest

KEY = "fresh"  # of a stage's manifest entry
PACKAGE = Path(__file__).resolve().parent


@functools.cache
def code_version() -> str:
    """A digest of the package's source and data files (not its caches)."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".toml", ".txt", ".json", ".md", ".html", ".js", ".css"):
            digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
    return [path]


def stamps(paths: Iterable[Path | str]) -> dict[str, list[int] | None]:
    """path -> [size, mtime_ns, ctime_ns] of every file of `paths` (folders walked), None if missing."""
    found: dict[str, list[int] | None] = {}
    for given in paths:
        for path in _files(Path(given)):
            try:
                status = path.stat()
            except FileNotFoundError:
                found[os.path.abspath(path)] = None
                continue
            found[os.path.abspath(path)] = [status.st_size, status.st_mtime_ns, status.st_ctime_ns]
    return found


def fingerprint(inputs: Iterable[Path | str | None], options: Mapping[str, Any]) -> str | None:
    """The digest of the inputs' metadata, the options and the code; None when an input is
    not a local file or folder (then the stage always runs)."""
    paths = []
    for given in inputs:
        if given is None:
            continue
        if not Path(given).exists() and ":" in str(given):  # hf:OWNER/NAME and the like
            return None
        paths.append(given)
    payload = {"inputs": stamps(paths), "options": options, "code": code_version()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _entry(stage: str, output: Path) -> Any:
    try:
        return (read_manifest(Path(output).parent).get(stage) or {}).get(KEY)
    except InputError:  # an unreadable manifest: nothing is current (the stage writes it anew)
        return None


def current(stage: str, output: Path, fingerprint_: str | None, force: bool = False) -> dict[str, Any] | None:
    """The record of `stage`'s last finished run into `output` when it is still current
    (same fingerprint, outputs as it left them), else None. `force`: always None."""
    if force or fingerprint_ is None:
        return None
    entry = _entry(stage, output)
    if not isinstance(entry, dict) or entry.get("output") != os.path.abspath(output):
        return None
    if entry.get("fingerprint") != fingerprint_:
        return None
    outputs = entry.get("outputs")
    if not isinstance(outputs, dict) or stamps(outputs) != outputs:
        return None
    return entry


def record(
    stage: str,
    output: Path,
    fingerprint_: str | None,
    outputs: Iterable[Path | str],
    result: Any = None,
) -> None:
    """Note that `stage` finished writing `outputs` (files or folders) for `fingerprint_`;
    `result`: what `current` hands back to a skipped run (JSON)."""
    if fingerprint_ is None:
        return
    entry = {
        "output": os.path.abspath(output),
        "fingerprint": fingerprint_,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "outputs": stamps(outputs),
        "result": result,
    }
    note_stage(output, stage, KEY, entry)


def unchanged(stage: str, entry: Mapping[str, Any]) -> str:
    """The one line a skipped stage shows."""
    return f"{stage}: unchanged since {entry['finished_at']} (inputs, options and code); --force redoes it"


# --- LLM stages: skipped when current --------------------------------------------------------------

# [llm] options that change no reply: a stage run with other values is still current.
RUNTIME = ("concurrency", "rpm", "timeout", "max_retries", "work_dir", "price_in", "price_out",
           "price_cached", "max_cost")  # fmt: skip


def reply_shape(llm) -> dict[str, Any] | None:
    """The [llm] options an LLM stage's fingerprint covers; None when the run must not be
    skipped (asked to retry, refresh, estimate, batch, or no cache)."""
    if llm.retry_failed or llm.refresh or llm.no_cache or llm.estimate or llm.batch is not None:
        return None
    return llm.model_dump(mode="json", exclude=set(RUNTIME))


def llm_stamp(sections: list[tuple[str, Any]], llm) -> str | None:
    """What LLM stages' outputs depend on, given their (section name, options): the files
    they read (not those one of them writes), their options, the [llm] options that shape
    a reply, the code. None: never skipped (a shard, or no reply shape)."""
    from personaemp.paths import touched

    shape = reply_shape(llm)
    if shape is None or any(section.shard for _, section in sections):
        return None
    reads, writes = touched(sections)
    written = {touch.path for touch in writes}
    used = {name: section.model_dump(mode="json", exclude={"force"}) for name, section in sections}
    return fingerprint([touch.path for touch in reads if touch.path not in written], {**used, "llm": shape})


def llm_finished(stage: str, sections: list[tuple[str, Any]], stamp: str | None, outcomes, counts) -> None:
    """LLM stages (`outcomes`: their StageResults) that failed no unit and wrote their
    output: recorded, so that the next run may skip them; `counts` is what it hands back then."""
    from personaemp.paths import touched

    output = sections[-1][1].output
    failed = any(done.counts.get("failed") or done.counts.get("failed_before") for done in outcomes)
    if stamp is None or failed or not output.exists():
        return
    written = [touch.path for touch in touched(sections)[1] if touch.path.exists()]
    record(stage, output, stamp, written, counts)
