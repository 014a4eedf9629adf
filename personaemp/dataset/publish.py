"""`personaemp push`: the splits as a Hugging Face dataset with two configs, and its card.

One row per accepted query, carrying its user's persona, Big Five levels and memories
(value and label): the natural unit for training and evaluating responses. No dialogue
text unless asked for (`include_dialogue`). Configs `random` and `ood`, each with train
and test. `--dry-run` writes exactly the repository that would be uploaded.

The card's statistics (personaemp.dataset.stats) are computed once from the same build and
published three ways: the card's tables, its plots (`figures/*.png`, linked relatively)
and `stats.json`.

Every input is checked before anything is written or sent: the split files row by row
(file:line and the field), split_report.json, and the reports the card quotes, which are
found by following the split's input back through the stages' manifests (manifest.py).

A dry run lists what it wrote in `<out>/.personaemp-export.json`; the next export into
the same folder removes only files of that list it no longer writes, never other files.
The real push is one Hub commit: every data file and the card, plus deletions of the
`<config>/<split>-*` parquet files under the data folders this tool writes (`random/`,
`ood/`) that this build no longer produces.

Each data file's name ends in a digest of its bytes and the card lists the exact names.
`datasets` caches a local folder under the folder's name and a hash of the card's
`configs` block (not the files' contents or times), so a build with other rows gets
another cache entry, and an unchanged rebuild keeps its entry.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec
from rich.markup import escape

from personaemp import manifest
from personaemp.dataset.card import QUALITY_PLOT, render_card
from personaemp.dataset.card_facts import card_facts
from personaemp.dataset.data_files import (  # noqa: F401  (the rows and their schema: importable from here too)
    COLUMNS,
    SETTINGS,
    SPLITS,
    _read_json,
    dataset_rows,
    features,
    iter_split_users,
    read_split_report,
    split_files,
    write_parts,
)
from personaemp.dataset.dialogue_config import DIALOGUES, behaviour_facts, dialogue_parts
from personaemp.dataset.stats import (
    FIGURE_DIR,
    FINAL_EMOTION_PLOT,
    STATS_FILE,
    final_emotion_plot,
    sources_of_split,
    stats_and_figures,
)
from personaemp.errors import InputError, PersonaempError
from personaemp.io import atomic_output, write_json_atomic
from personaemp.manifest import stage_chain
from personaemp.results import StageResult, of_publish

EXPORT_MANIFEST = ".personaemp-export.json"
CARD_FILE = "README.md"


@dataclass
class PublishResult:
    target: str
    rows: dict[str, dict[str, int]]  # setting -> split -> rows
    card: Path | None = None
    # Facts the card could not include (a report named by a manifest is gone, ...).
    warnings: list[str] = field(default_factory=list)
    unchanged_since: str | None = None  # a dry run skipped: its one line (manifest.py)


# --- the repository ------------------------------------------------------------------------------


def write_files(folder: Path, files: dict[str, bytes | Path], card: str) -> list[str]:
    """Write `files` (relative path -> bytes, or a staged file moved into place) and the card
    under `folder`, each atomically; return the relative paths written."""
    for relative, data in files.items():
        if isinstance(data, Path):
            _move(data, folder / relative)
            continue
        with atomic_output(folder / relative) as handle:
            handle.write(data)
    with atomic_output(folder / CARD_FILE) as handle:
        handle.write(card.encode("utf-8"))
    return [*files, CARD_FILE]


def _move(source: Path, target: Path) -> None:
    """A finished (synced) file renamed into place; copied atomically across file systems."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(source, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        with source.open("rb") as data, atomic_output(target) as handle:
            shutil.copyfileobj(data, handle, 1 << 20)


def read_export_manifest(out: Path) -> list[str]:
    """The files an earlier export wrote into `out` (relative paths); none without a manifest."""
    path = out / EXPORT_MANIFEST
    if not path.exists():
        return []
    hint = f"delete {path} (files it listed are then left in place) or choose another --out-dir"
    manifest = _read_json(path, "the list of files an earlier export wrote", hint)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) and _inside(f) for f in files):
        raise InputError(f"{path}: not an export manifest (files: a list of relative paths)", hint)
    return files


def _inside(relative: str) -> bool:
    """A relative path that stays inside the folder it is relative to."""
    path = PurePosixPath(relative)
    return bool(relative) and not path.is_absolute() and ".." not in path.parts and "\\" not in relative


def write_repository(out: Path, files: dict[str, bytes | Path], card: str) -> None:
    """The Hub repository layout under `out`: `files` (<config>/<split>-00000-of-00001-<digest>.parquet,
    the plots, stats.json) and README.md.

    Files that an earlier export listed in `out`'s manifest and this one no longer writes
    are removed; files it did not write are never touched.
    """
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: not a folder", "pass a folder for --out-dir")
    previous = read_export_manifest(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = out / EXPORT_MANIFEST
    planned = [*files, CARD_FILE]
    # Listed before they are written: a run that stops half-way leaves nothing unlisted.
    write_json_atomic(manifest, {"tool": "personaemp", "files": sorted(set(previous) | set(planned))})
    written = write_files(out, files, card)
    for relative in sorted(set(previous) - set(written)):
        stale = out / relative
        stale.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the folder of a config no longer built, if now empty
            if stale.parent != out:
                stale.parent.rmdir()
    write_json_atomic(manifest, {"tool": "personaemp", "files": sorted(written)})


def stale_repo_files(repo_files: list[str], kept: list[str]) -> list[str]:
    """Files of the Hub repository to delete: parquet files `<config>/<split>-*` in the data
    folders this tool writes (earlier builds', whose names carry other digests), and plots in
    its figures folder, that this build does not write."""
    stale = []
    for name in repo_files:
        parts = name.split("/")
        ours = (
            len(parts) == 2
            and parts[0] in (*SETTINGS, DIALOGUES)
            and parts[1].endswith(".parquet")
            and any(parts[1].startswith(f"{split}-") for split in SPLITS)
        ) or (len(parts) == 2 and parts[0] == FIGURE_DIR and parts[1].endswith(".png"))
        if ours and name not in kept:
            stale.append(name)
    return sorted(stale)


def publish(
    splits_dir: Path,
    *,
    repo_id: str | None = None,
    out: Path | None = None,
    private: bool = False,
    revision: str | None = None,
    include_dialogue: bool = False,
    criteria: Path | None = None,
    dialogues: Path | list[Path] | None = None,
    dialogues_report: Path | None = None,
    force: bool = False,
    quality: Callable[[Path | None], tuple[dict[str, Any] | None, bytes | None]] | None = None,
    notes: Sequence[str] = (),
) -> StageResult:
    """Push both configs to `repo_id`, or write the same repository to `out` (dry run);
    returns the StageResult (`.report`: the PublishResult), as `pe.publish` does.

    `criteria`: a `personaemp criteria` file; when it exists, each row gets its query's
    criteria as a `criteria` column (queries it lacks get empty lists, and a warning). A file
    that cannot serve these queries (made for other queries) stops the push: UnusableCriteria.
    `dialogues`: gen-dialogues files (one per run, e.g. per supporter); those that exist make
    one `dialogues` config (its rows in the split of the random setting that holds their
    query, the `supporter_model` column telling the runs apart) and a section of the card.
    `dialogues_report`: an `evaluate --dialogues` report of them; the card quotes its behaviour
    counts, tracking rate and session reward per supporter and seeker style.
    `quality`: queries file -> (agreement report, plot) of the people's labels beside it
    (the review product's `card_quality`); without it the card says nobody measured the judge.
    `notes`: what the caller says of its inputs (a file it left out), among the warnings."""
    files, split_report = _checked(splits_dir, repo_id, out)
    named = [Path(dialogues)] if isinstance(dialogues, str | Path) else [Path(p) for p in dialogues or ()]
    if len(set(named)) < len(named):
        twice = next(p for p in named if named.count(p) > 1)
        raise InputError(f"--dialogues {twice} is given twice", "name each dialogues file once")
    dialogues = [p for p in named if p.is_file()]
    behaviours = behaviour_facts(Path(dialogues_report)) if dialogues_report is not None else None
    fingerprint = None
    if out is not None:  # a dry run can be skipped; a push always goes out (the Hub may have changed)
        options = {
            "out": out, "include_dialogue": include_dialogue, "criteria": criteria,
            "dialogues": [str(p) for p in dialogues],
            "notes": list(notes), "dialogues_report": dialogues_report,
        }  # fmt: skip
        read = [*_read_by_push(splits_dir, split_report, criteria), *dialogues,
                *([Path(dialogues_report)] if dialogues_report else [])]  # fmt: skip
        fingerprint = manifest.fingerprint(read, options)
        last = manifest.current("push", out, fingerprint, force)
        if last is not None:
            result = last["result"]
            return of_publish(PublishResult(
                target=result["target"], rows=result["rows"], card=Path(result["card"]),
                warnings=result["warnings"], unchanged_since=manifest.unchanged("push", last),
            ))  # fmt: skip
    found = _criteria(Path(criteria), files) if criteria is not None and Path(criteria).exists() else None
    with _staging(out) as staging:
        built = _assemble(
            splits_dir, files, split_report, staging, include_dialogue=include_dialogue,
            criteria=criteria, found=found, dialogues=dialogues, quality=quality, notes=notes,
            behaviours=behaviours,
        )  # fmt: skip
        if out is not None:
            return of_publish(_write_locally(out, built, fingerprint))
        _push(built.files, built.card, repo_id, private, revision, configs=built.configs)
    target = f"https://huggingface.co/datasets/{repo_id}"
    return of_publish(PublishResult(target=target, rows=built.rows, warnings=built.warnings))


class UnusableCriteria(InputError):
    """The criteria file cannot serve the split's queries (made for other queries, or a bad
    row): the message and hint of what `personaemp criteria`'s check found."""


@dataclass
class _Built:
    """The repository as assembled: its files (name -> bytes or a staged file), the card, the
    rows per config and split, the warnings and the configs it holds."""

    files: dict[str, bytes | Path]
    card: str
    rows: dict[str, dict[str, int]]
    warnings: list[str]
    configs: list[str]


def _checked(splits_dir: Path, repo_id: str | None, out: Path | None):
    """The target checked, then the splits read: (split files, split report)."""
    if (repo_id is None) == (out is None):
        raise InputError("give either --repo-id OWNER/NAME or --dry-run --out-dir DIR")
    if repo_id is not None and repo_id.count("/") != 1:
        raise InputError(f"--repo-id must look like OWNER/NAME, not {repo_id!r}")
    files = split_files(splits_dir)
    return files, read_split_report(splits_dir, list(files))


def _assemble(
    splits_dir,
    files,
    split_report,
    staging,
    *,
    include_dialogue,
    criteria,
    found,
    dialogues,
    quality,
    notes,
    behaviours=None,
) -> _Built:
    """The repository: the data files staged, the statistics and figures, the card
    (`found`: the criteria file's rows, None when it is not published)."""
    parts = write_parts(files, staging, include_dialogue, found)
    facts = card_facts(splits_dir, parts, split_report)
    facts["warnings"] += notes
    if found is not None:
        published = {qid for written in parts.values() for part in written.values() for qid in part.query_ids}
        lacking = len(published - found.keys())
        if lacking:
            facts["warnings"].append(f"{criteria}: no criteria for {lacking} published queries (empty lists)")
    facts["data_files"] = {s: {sp: part.name for sp, part in written.items()} for s, written in parts.items()}
    rows = {s: {split: part.rows for split, part in written.items()} for s, written in parts.items()}
    staged_dialogues: dict[str, tuple[str, Path]] = {}
    if dialogues:
        staged_dialogues, facts["dialogues"] = dialogue_parts(dialogues, files, staging, facts["warnings"])
        facts["dialogue_files"] = {split: name for split, (name, _) in staged_dialogues.items()}
        rows[DIALOGUES] = facts["dialogues"]["rows"]
        if behaviours is not None:  # the supporters' behaviours, from an evaluate --dialogues report
            facts["dialogues"]["behaviours"] = behaviours
    # The build's statistics, computed once: the card's tables, its plots and stats.json.
    stats, figures = stats_and_figures(sources_of_split(splits_dir, split_report))
    repository: dict[str, bytes | Path] = {f"{FIGURE_DIR}/{name}": png for name, png in figures.items()}
    if facts.get("dialogues") and facts["dialogues"]["final_emotions"]:
        starts = facts["dialogues"]["initial_emotions"]
        finals = facts["dialogues"]["final_emotions"]
        plot = final_emotion_plot(finals, starts[0] if len(starts) == 1 else None)
        repository[f"{FIGURE_DIR}/{FINAL_EMOTION_PLOT}"] = plot
    queries = sources_of_split(splits_dir, split_report).queries
    report, plot = quality(queries) if quality else (None, None)
    if plot is not None:
        repository[f"{FIGURE_DIR}/{QUALITY_PLOT}"] = plot
    card = render_card(facts, include_dialogue, stats, list(repository), quality=report)
    repository[STATS_FILE] = msgspec.json.format(msgspec.json.encode(stats), indent=2) + b"\n"
    repository.update({part.name: part.path for written in parts.values() for part in written.values()})
    repository.update(dict(staged_dialogues.values()))
    configs = list(parts) + list(facts.get("dialogue_files") and [DIALOGUES] or [])
    return _Built(repository, card, rows, facts["warnings"], configs)


def _write_locally(out: Path, built: _Built, fingerprint) -> PublishResult:
    """The dry run: the repository written to `out`, and its stamp for the next run."""
    write_repository(out, built.files, built.card)
    result = PublishResult(target=str(out), rows=built.rows, card=out / CARD_FILE, warnings=built.warnings)
    written = [out / name for name in [*built.files, CARD_FILE, EXPORT_MANIFEST]]
    saved = {
        "target": result.target,
        "rows": built.rows,
        "card": str(result.card),
        "warnings": result.warnings,
    }
    manifest.record("push", out, fingerprint, written, saved)
    return result


def _criteria(path: Path, files: dict[str, dict[str, Path]]):
    """The criteria file's rows, checked to be made for the split's queries (UnusableCriteria
    when they cannot serve them, with the check's own message and hint)."""
    from personaemp.instruments.criteria import fresh_criteria

    try:
        return fresh_criteria(path, [p for parts in files.values() for p in parts.values()])
    except InputError as error:
        raise UnusableCriteria(error.message, error.hint) from error


def _read_by_push(splits_dir: Path, split_report: dict[str, Any], criteria: Path | None) -> list[Path]:
    """Every file push reads: the splits, the build behind them (the card's reports and
    statistics, failures files, labels) and the criteria."""
    sources = sources_of_split(splits_dir, split_report)
    chain = stage_chain(Path(split_report["input"])) if split_report.get("input") else {}
    found = [splits_dir, *vars(sources).values(), criteria]
    # Not the LLM stages' run report: rewritten by every run, even one with nothing to do;
    # what the card quotes of it follows their output and failures files.
    found += [entry.get("failures") for entry in chain.values()]
    if sources.queries is not None:
        found += [sources.queries.with_name("labels.jsonl"), sources.queries.with_name("second_judge.jsonl")]
    return [Path(path) for path in found if path]


@contextlib.contextmanager
def _staging(out: Path | None) -> Iterator[Path]:
    """A folder for the Parquet files while they are written: beside the dry run's folder
    (so they are renamed into it), else a temporary one; removed afterwards."""
    if out is not None and out.exists() and not out.is_dir():
        raise InputError(f"{out}: not a folder", "pass a folder for --out-dir")
    parent = None
    if out is not None:
        parent = Path(os.path.abspath(out)).parent
        parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".personaemp-push-", dir=parent) as name:
        yield Path(name)


def _push(
    files: dict[str, bytes | Path],
    card: str,
    repo_id: str,
    private: bool,
    revision: str | None,
    configs: list[str],
) -> None:
    """One commit: every data file and the card, and deletions of stale data files."""
    from personaemp.hub import check_hub_reachable

    check_hub_reachable(repo_id, "check your network; --dry-run --out-dir DIR writes the same files locally")
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    token = os.environ.get("HF_TOKEN")  # else the user's `huggingface-cli login`
    with tempfile.TemporaryDirectory(prefix="personaemp-push-") as staging:
        written = write_files(Path(staging), files, card)
        try:
            api = HfApi(token=token)
            api.create_repo(repo_id, repo_type="dataset", private=private or None, exist_ok=True)
            if revision:
                api.create_branch(repo_id, branch=revision, repo_type="dataset", exist_ok=True)
            existing = api.list_repo_files(repo_id, repo_type="dataset", revision=revision)
            operations = [
                CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(Path(staging) / name))
                for name in written
            ]
            operations += [
                CommitOperationDelete(path_in_repo=name) for name in stale_repo_files(existing, written)
            ]
            api.create_commit(
                repo_id,
                operations=operations,
                commit_message=f"personaemp push: configs {', '.join(configs)} and the dataset card",
                repo_type="dataset",
                revision=revision,
            )
        except Exception as exc:  # the Hub client raises many kinds; the user needs one line
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            text = text.replace(token, "[redacted]") if token else text
            raise PersonaempError(
                f"{repo_id}: the push failed ({text})", "check HF_TOKEN and the repo id"
            ) from None


# --- from options (the command, pe.* and `run`) ---------------------------------------------------


def from_options(options, console, quality=None):
    """`personaemp push` on its options; `quality` as publish's (wired by the registry).

    A file named (by a flag, env var or TOML key) must serve: dialogues must exist, criteria
    must be made for these queries (publish checks them). At its default place, a file is
    published only when it serves: criteria made for other queries (a leftover) are left out,
    and the push goes on and says so."""
    dry = options.is_dry_run
    dialogues = [Path(p) for p in options.dialogues]
    for named in [] if options.derived("dialogues") else dialogues:
        if not named.is_file():
            raise InputError(
                f"{named}: no such dialogues file", "pass gen-dialogues' output, or leave --dialogues out"
            )
        if not named.read_bytes().strip():
            # named, so meant to be published: an empty file would publish no dialogues config, silently
            raise InputError(
                f"{named}: no dialogues in it", "pass gen-dialogues' output, or leave --dialogues out"
            )
    push = functools.partial(
        publish, options.splits,
        repo_id=None if dry else options.repo_id, out=options.out_dir if dry else None,
        private=options.private, revision=options.revision, include_dialogue=options.include_dialogue,
        quality=quality, dialogues=dialogues, dialogues_report=options.dialogues_report, force=options.force,
    )  # fmt: skip
    try:
        made = push(criteria=options.criteria)
    except UnusableCriteria as error:
        if not options.derived("criteria"):
            raise
        left_out = f"{error.message}: left out of the dataset (pass --criteria to require it)"
        made = push(criteria=None, notes=[left_out])
    if dry and not options.dry_run and not getattr(made.report, "unchanged_since", None):
        console.print("no repo_id: a dry run, the repository that would be pushed goes to a folder")
    return made


def print_summary(made, console) -> None:
    """`personaemp push`'s summary: rows per setting and split, warnings, where it wrote."""
    result = made.report
    if getattr(result, "unchanged_since", None):  # a dry run skipped (manifest.py): its one line
        return console.print(result.unchanged_since)
    for setting, parts in result.rows.items():
        console.print(f"[bold]{setting}[/]: " + ", ".join(f"{split} {n} rows" for split, n in parts.items()))
    for warning in result.warnings:  # e.g. a stage report the card could not find
        console.print(f"[yellow]warning:[/] {escape(warning)}")
    console.print(f"wrote {result.target}")
