"""A stage's bookkeeping, in the `manifest.json` beside its output: what it read and wrote,
its stamp, whether it is current, and the chain of stages behind a file.

The manifest, keyed by stage name, one entry per stage (`record_stage`):

    {"gen-queries": {"output": "queries.jsonl", "input": "personas.jsonl",
                     "report": ".personaemp/run_report.json",
                     "failures": "gen-queries.failures.jsonl",
                     "finished_at": "2026-01-01T00:00:00+00:00", "full": true,
                     "fresh": {...}}}

Paths in a build are relative to the file that names them, so a copied or moved build
reads its own folder: the manifest's paths are relative to its folder when they lie inside
it, and a report's (the LLM run report, the split's report) relative to the report's folder
when they lie in the build it belongs to (`stored`); anything elsewhere stays absolute.
`read_manifest` and `resolved` hand them back absolute. `push` follows the chain from the
split report's input file back through these entries (`stage_chain`), instead of guessing
where the reports of an earlier stage are.

Re-runs skip finished work: a stage computes `fingerprint(inputs, options)` before it reads
anything and asks `current(stage, output, fingerprint)`; when that gives the last run's
record it returns that run's result with one line (`unchanged`), otherwise it runs and
calls `record(...)` once its outputs are in place. The record is the `fresh` key of the
stage's entry. What a fingerprint covers, cheaply (nothing is read but file metadata):
- each input file's size, modification time and change time (the system sets the ctime
  on every write: an edit that puts the old mtime back is seen); a folder: every file under
  it, hidden ones aside (locks and temporary files); an input that is not a local path (a Hub
  dataset) makes the stage never current;
- the stage's options, as canonical JSON;
- the code: a digest of the package's source and data files (computed once a process), so
  a new version, or any edit, redoes every stage.
A record also holds the size and time of every output it wrote: an output deleted or
edited since makes the stage run again. An LLM stage keeps its books through `LLMBooks`.

A read-modify-write of a shared JSON file (the manifest, the LLM run report) holds an
exclusive `fcntl.flock` on a sibling lock file (`locked`), so two processes finishing at
the same time do not lose each other's entries.
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


def stored(path: Path | str | None, folder: Path, build: Path | None = None) -> str | None:
    """`path` as a file in `folder` keeps it: relative to `folder` when it lies inside `build`
    (default: `folder` itself), so that a copied or moved build reads its own files; else
    absolute."""
    if path is None:
        return None
    absolute = os.path.abspath(path)
    base = os.path.abspath(folder)
    root = os.path.abspath(build if build is not None else folder)
    if absolute != root and not absolute.startswith(root.rstrip(os.sep) + os.sep):
        return absolute
    return Path(os.path.relpath(absolute, base)).as_posix()


def resolved(value: Any, folder: Path) -> Any:
    """A path `stored` in a file of `folder`, absolute again (other values as they are)."""
    if not isinstance(value, str) or not value:
        return value
    return os.path.normpath(os.path.abspath(Path(folder) / value))


def names(value: Any, folder: Path, path: Path | str) -> bool:
    """Whether `value`, a path kept in a file of `folder`, is `path`. A report written before
    paths were kept relative holds one as given on the command line (relative to where
    the command ran): it is read that way too."""
    if not isinstance(value, str) or not value:
        return False
    target = os.path.normpath(os.path.abspath(path))
    return target in (resolved(value, folder), os.path.normpath(os.path.abspath(value)))


REPORT_PATHS = ("output", "failures_file")  # the paths of an LLM stage's run-report entry


def report_entry(entry: Mapping[str, Any], report: Path) -> dict[str, Any]:
    """An LLM stage's entry as the run report at `report` keeps it: its paths relative to the
    report's folder when they lie in the build the report belongs to (the folder above the
    work folder: processed/ for processed/.personaemp/run_report.json)."""
    folder = Path(report).parent
    return {
        key: stored(value, folder, folder.parent) if key in REPORT_PATHS and value else value
        for key, value in entry.items()
    }


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
        stage: {key: resolved(value, folder) if key in PATH_KEYS else value for key, value in entry.items()}
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
        "output": stored(output, folder),
        "input": stored(input, folder),
        "report": stored(report, folder),
        "failures": stored(failures, folder),
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
    the record `record` keeps of a finished run."""
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


# --- whether a stage is current -------------------------------------------------------------------

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
    entry, folder = _entry(stage, output), Path(output).parent
    if not isinstance(entry, dict) or resolved(entry.get("output"), folder) != os.path.abspath(output):
        return None
    if entry.get("fingerprint") != fingerprint_:
        return None
    outputs = entry.get("outputs")
    if not isinstance(outputs, dict):
        return None
    outputs = {resolved(path, folder): stamp for path, stamp in outputs.items()}
    return entry if stamps(outputs) == outputs else None


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
    folder = Path(output).parent
    entry = {
        "output": stored(output, folder),
        "fingerprint": fingerprint_,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "outputs": {stored(path, folder): stamp for path, stamp in stamps(outputs).items()},
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


class LLMBooks:
    """The books of LLM stages run as one (a stage alone, or `run`'s chain of two), recorded
    under `stage` beside the last one's output: their stamp, taken when made; whether their
    last run is current; the record of a run that finished every unit."""

    def __init__(self, stage: str, sections: list[tuple[str, Any]], llm):
        """`sections`: the stages' (section name, resolved options, with `output`, `force` and
        `shard`); `llm`: the [llm] options."""
        self.stage, self.sections = stage, list(sections)
        self.output = Path(self.sections[-1][1].output)
        self.stamp = llm_stamp(self.sections, llm)

    def current(self, force: bool = False) -> dict[str, Any] | None:
        """The last run's record when it is current (see `current`)."""
        return current(self.stage, self.output, self.stamp, force)

    def unchanged(self, entry: Mapping[str, Any]) -> str:
        return unchanged(self.stage, entry)

    def record(self, outcomes, counts) -> None:
        """The stages (`outcomes`: their StageResults) failed no unit and wrote their output:
        recorded, so that the next run may skip them; `counts` is what it hands back then."""
        from personaemp.paths import touched

        failed = any(done.counts.get("failed") or done.counts.get("failed_before") for done in outcomes)
        if self.stamp is None or failed or not self.output.exists():
            return
        written = [touch.path for touch in touched(self.sections)[1] if touch.path.exists()]
        record(self.stage, self.output, self.stamp, written, counts)
