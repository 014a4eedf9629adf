"""A workspace that knows its files: each stage notes where it wrote its output and reports.

Every stage calls `record_stage` when it finishes. The entry goes into `manifest.json` in
the folder of the stage's output, keyed by stage name:

    {"gen-queries": {"output": "queries.jsonl", "input": "personas.jsonl",
                     "report": "/elsewhere/.personaemp/run_report.json",
                     "failures": "gen-queries.failures.jsonl",
                     "finished_at": "2026-01-01T00:00:00+00:00", "full": true}}

Paths inside the manifest's folder are stored relative to it (the folder can be moved),
others absolute; `read_manifest` hands them back resolved. `push` follows the chain from
the split report's input file back through these entries (`stage_chain`), instead of
guessing where the reports of an earlier stage are.

A read-modify-write of a shared JSON file (the manifest, the LLM run report) holds an
exclusive `fcntl.flock` on a sibling lock file (`locked`), so two processes finishing at
the same time do not lose each other's entries.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from personaemp import locks
from personaemp.errors import InputError
from personaemp.io import set_aside, write_json_atomic

MANIFEST_FILE = "manifest.json"
PATH_KEYS = ("output", "input", "report", "failures")
# The stages in pipeline order (a stage's input is the previous one's output).
STAGES = ("filter", "infer-persona", "gen-queries", "split")


def locked(path: Path):
    """Hold the lock of `path` for a short read-modify-write (waiting for another holder)."""
    return locks.exclusive(path, wait=True)


def _stored(path: Path | str | None, folder: Path) -> str | None:
    """`path` relative to `folder` when it lies inside it, else absolute."""
    if path is None:
        return None
    absolute = Path(os.path.abspath(path))
    base = Path(os.path.abspath(folder))
    try:
        return absolute.relative_to(base).as_posix()
    except ValueError:
        return str(absolute)


def _resolved(value: Any, folder: Path) -> Any:
    if not isinstance(value, str) or not value:
        return value
    return os.path.normpath(os.path.abspath(folder / value))


def _load(path: Path) -> dict[str, Any]:
    """The manifest's raw entries; a missing file is an empty manifest."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InputError(
            f"{path}: not valid JSON ({exc})", "delete it; the next run of each stage writes it again"
        ) from None
    if not isinstance(value, dict) or not all(isinstance(entry, dict) for entry in value.values()):
        raise InputError(
            f"{path}: not a stage manifest (an object of stage entries is expected)",
            "delete it; the next run of each stage writes it again",
        )
    return value


def read_manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """Stage name -> entry of `folder/manifest.json`, with every path resolved (absolute).

    A folder without a manifest gives {}; a manifest that is not valid JSON is an InputError.
    """
    folder = Path(folder)
    return {
        stage: {key: _resolved(value, folder) if key in PATH_KEYS else value for key, value in entry.items()}
        for stage, entry in _load(folder / MANIFEST_FILE).items()
    }


def record_stage(
    output: Path,
    stage: str,
    *,
    report: Path | None,
    failures: Path | None,
    full: bool,
    input: Path | None = None,  # noqa: A002 - the stage's --input, named as the option is
) -> Path:
    """Note in `<output's folder>/manifest.json` that `stage` wrote `output`; return the manifest.

    `report`: where the stage's report is (the filter's filter_report.json, an LLM stage's
    run_report.json, the split's split_report.json); `failures`: its failures file, if it
    has one; `full`: False for a quick look (`--limit`, `--users`) that did not process
    the whole input; `input`: the file it read, so the chain can be followed back across
    folders (without it, earlier stages are looked up in the same manifest). The entry
    replaces the stage's previous one; other stages' entries are kept. A manifest that
    cannot be parsed is set aside (NAME.corrupt-<time>) and replaced.
    """
    output = Path(output)
    folder = output.parent
    path = folder / MANIFEST_FILE
    entry = {
        "output": _stored(output, folder),
        "input": _stored(input, folder),
        "report": _stored(report, folder),
        "failures": _stored(failures, folder),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "full": bool(full),
    }
    if input is None:
        del entry["input"]
    with locked(path):
        try:
            manifest = _load(path)
        except InputError as error:  # kept aside for the user, then replaced
            set_aside(path, error.message.removeprefix(f"{path}: "))
            manifest = {}
        manifest[stage] = entry
        write_json_atomic(path, manifest)
    return path


def note_stage(output: Path, stage: str, key: str, value: Any) -> None:
    """Set `key` of `stage`'s entry in the manifest beside `output` (made if missing), e.g.
    the record freshness.py keeps of a finished run."""
    path = Path(output).parent / MANIFEST_FILE
    with locked(path):
        try:
            manifest = _load(path)
        except InputError as error:
            set_aside(path, error.message.removeprefix(f"{path}: "))
            manifest = {}
        manifest.setdefault(stage, {})[key] = value
        write_json_atomic(path, manifest)


def _same_file(a: str | Path | None, b: str | Path | None) -> bool:
    if not a or not b:
        return False
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def stage_chain(path: Path) -> dict[str, dict[str, Any]]:
    """The manifest entries of the stages that produced `path` and its inputs, by stage name.

    Starts with the entry whose `output` is `path` (in the manifest beside it). From each
    entry it steps to the one that wrote its `input` (in the manifest beside that file);
    an entry that does not name its input steps to the previous stage of STAGES in the
    same manifest. Entries that name another output than the file read are not used: their
    reports describe other data.
    """
    chain: dict[str, dict[str, Any]] = {}
    wanted: str | None = os.path.abspath(path)
    folder = Path(wanted).parent
    while True:
        manifest = read_manifest(folder)
        found = next(
            (
                (name, entry)
                for name, entry in manifest.items()
                if name not in chain and _same_file(entry.get("output"), wanted)
            ),
            None,
        )
        if found is None:
            return chain
        name, entry = found
        chain[name] = entry
        if entry.get("input"):
            wanted = entry["input"]
            folder = Path(wanted).parent
            continue
        if name not in STAGES or STAGES.index(name) == 0:
            return chain
        previous = manifest.get(STAGES[STAGES.index(name) - 1])
        if previous is None or not previous.get("output"):
            return chain
        wanted = previous["output"]
