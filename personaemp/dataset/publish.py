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
found by following the split's input back through the stages' manifests (workspace.py).

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
import json
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec
from pydantic import BaseModel, ConfigDict, ValidationError

from personaemp import freshness
from personaemp.dataset.card import QUALITY_PLOT, render_card
from personaemp.dataset.stats import (
    FIGURE_DIR,
    FINAL_EMOTION_PLOT,
    STATS_FILE,
    final_emotion_plot,
    sources_of_split,
    stats_and_figures,
)
from personaemp.errors import InputError, PersonaempError, RowError, first_problem
from personaemp.io import ErrorPolicy, atomic_output, file_sha256, iter_jsonl, iter_records, write_json_atomic
from personaemp.records import BIG_FIVE, DIMENSIONS, REJECTED_KEYS
from personaemp.splits import REPORT_FILE, SETTINGS_WRITTEN, check_queries_row, profile_of
from personaemp.workspace import stage_chain

SETTINGS = SETTINGS_WRITTEN  # the configs, one per split setting
COLUMNS = (
    "user_id", "query_id", "query", "category", "situation", "memory_ids", "language",
    "persona_profile", "persona_traits", "topics", "big_five", "memories", "user_turns", "criteria",
)  # fmt: skip
SPLITS = ("train", "test")
EXPORT_MANIFEST = ".personaemp-export.json"
CARD_FILE = "README.md"
SPLIT_HINT = "re-run personaemp split (on the output of gen-queries)"


def features(include_dialogue: bool, with_criteria: bool = False):
    from datasets import Features, Sequence, Value

    string = Value("string")
    columns = {  # keep in COLUMNS order
        "user_id": string,
        "query_id": string,
        "query": string,
        "category": string,
        "situation": {"topic": string, "text": string},
        "memory_ids": Sequence(string),
        "language": string,
        "persona_profile": string,
        "persona_traits": [{"aspect": string, "statement": string, "evidence": Sequence(string)}],
        "topics": Sequence(string),
        "big_five": {trait: string for trait in BIG_FIVE},
        "memories": [{"memory_id": string, "label": string, "value": string}],
    }
    if include_dialogue:
        columns["user_turns"] = Sequence(string)
    if with_criteria:
        criterion = [{"name": string, "weight": Value("float64"), "description": string}]
        columns["criteria"] = {dimension: criterion for dimension in DIMENSIONS}
    return Features(columns)


def dataset_rows(
    user: dict[str, Any], include_dialogue: bool, criteria: dict[str, dict] | None = None
) -> list[dict[str, Any]]:
    """One published row per accepted query of a user row (with its evaluation criteria
    when `criteria` is given: query id -> dimension -> criteria; none: empty lists)."""
    shared = {
        "user_id": str(user["user_id"]),
        "language": user.get("language") or "",
        "persona_profile": user.get("profile", ""),
        "persona_traits": [
            {"aspect": t["aspect"], "statement": t["statement"], "evidence": t["evidence"]}
            for t in user.get("traits", [])
        ],
        "topics": user.get("topics", []),
        "big_five": {trait: user["big_five"][trait]["level"] for trait in BIG_FIVE},
        "memories": [
            {"memory_id": m["memory_id"], "label": m["label"], "value": m["value"]} for m in user["memories"]
        ],
    }
    if include_dialogue:
        shared["user_turns"] = [t["text"] for t in user.get("turns", []) if t.get("role") == "user"]
    rows = []
    for q in user.get("queries", []):
        row = {
            "query_id": q["query_id"],
            "query": q["query"],
            "category": q["category"],
            "situation": {"topic": q["situation"]["topic"], "text": q["situation"]["text"]},
            "memory_ids": q["memory_ids"],
            **shared,
        }
        if criteria is not None:
            given = criteria.get(q["query_id"], {})
            row["criteria"] = {
                d: [{k: c[k] for k in ("name", "weight", "description")} for c in given.get(d, [])]
                for d in DIMENSIONS
            }
        rows.append({name: row[name] for name in COLUMNS if name in row})  # the features' order
    return rows


@dataclass
class PublishResult:
    target: str
    rows: dict[str, dict[str, int]]  # setting -> split -> rows
    card: Path | None = None
    # Facts the card could not include (a report named by a manifest is gone, ...).
    warnings: list[str] = field(default_factory=list)
    unchanged_since: str | None = None  # a dry run skipped: its one line (freshness.py)


# --- reading the splits ------------------------------------------------------------------------


def iter_split_users(path: Path) -> Iterator[dict]:
    """The user rows of one split file, one at a time, each checked to hold everything a
    published row needs."""
    try:
        for lineno, _, row in iter_jsonl(path, ErrorPolicy("fail")):
            location = f"{path}:{lineno}"
            check_queries_row(row, location, SPLIT_HINT)
            if profile_of(row) is None:
                raise InputError(
                    f"{location}: not a split row (big_five: a level low, medium or high for each "
                    "of the five traits is required)",
                    SPLIT_HINT,
                )
            yield row
    except RowError as error:  # unreadable line: push has no --on-error, the split is redone
        raise InputError(f"{error.location}: {error.reason}", SPLIT_HINT) from None


def split_files(splits_dir: Path) -> dict[str, dict[str, Path]]:
    """setting -> split -> file, for the settings present; a half-present setting is an error."""
    if not splits_dir.exists():
        raise InputError(f"{splits_dir}: no such folder", "run personaemp split first, or pass --splits DIR")
    if not splits_dir.is_dir():
        raise InputError(f"{splits_dir}: not a folder", "pass the folder written by personaemp split")
    found = {}
    for setting in SETTINGS:
        paths = {split: splits_dir / setting / f"{split}.jsonl" for split in SPLITS}
        present = [p for p in paths.values() if p.is_file()]
        if not present:
            continue
        missing = [p for p in paths.values() if not p.is_file()]
        if missing:
            raise InputError(f"{missing[0]}: missing (the {setting} split needs train and test)", SPLIT_HINT)
        found[setting] = paths
    if not found:
        raise InputError(
            f"{splits_dir}: no random/ or ood/ train.jsonl + test.jsonl", "run personaemp split first"
        )
    return found


def _read_json(path: Path, what: str, hint: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file ({what})", hint) from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not valid UTF-8 ({what})", hint) from None
    except ValueError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})", hint) from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})", hint) from None


class _ClusterMode(BaseModel):
    openness: str
    conscientiousness: str
    extraversion: str
    agreeableness: str
    neuroticism: str


class _Cluster(BaseModel):
    id: int
    users: int
    mode: _ClusterMode


class _SettingReport(BaseModel):
    model_config = ConfigDict(extra="allow")
    cost_curve: dict[str, float] = {}
    clusters: list[_Cluster] = []


class _SplitReport(BaseModel):
    """The parts of split_report.json the card reads."""

    model_config = ConfigDict(extra="allow")
    input: str | None = None
    users_in: int
    left_out: dict[str, int]
    settings: dict[str, _SettingReport]


def read_split_report(splits_dir: Path, present: list[str]) -> dict[str, Any]:
    """split_report.json, checked to hold what the card reads and to describe the split
    files that are there."""
    path = splits_dir / REPORT_FILE
    report = _read_json(path, "the split's report, which the card quotes", SPLIT_HINT)
    if not isinstance(report, dict):
        raise InputError(f"{path}: not a split report (a JSON object is expected)", SPLIT_HINT)
    try:
        _SplitReport.model_validate(report)
    except ValidationError as exc:
        raise InputError(f"{path}: not a split report ({first_problem(exc)})", SPLIT_HINT) from None
    if sorted(report["settings"]) != sorted(present):
        raise InputError(
            f"{path}: describes the settings {', '.join(sorted(report['settings'])) or 'none'}, "
            f"but {splits_dir} holds {', '.join(sorted(present))}",
            SPLIT_HINT,
        )
    return report


ROW_BATCH = 1000  # published rows turned into Arrow at a time


@dataclass
class DataPart:
    """One split of one config, written to a staged Parquet file, and what the card says of it."""

    name: str  # its path in the repository, <config>/<split>-00000-of-00001-<digest>.parquet
    path: Path  # the staged file
    rows: int = 0
    users: set[str] = field(default_factory=set)
    categories: Counter = field(default_factory=Counter)
    big_five: dict[str, Counter] = field(default_factory=lambda: {trait: Counter() for trait in BIG_FIVE})
    languages: Counter = field(default_factory=Counter)
    query_ids: set[str] = field(default_factory=set)  # kept only to check the criteria file
    # per user: the Big Five profile, how many of its levels cite no memory, whether the
    # depth check said no and the user was kept anyway ([persona] require_depth = false)
    profiles: dict[str, tuple[str, ...]] = field(default_factory=dict)
    uncited_levels: dict[str, int] = field(default_factory=dict)
    depth_not_enforced: set[str] = field(default_factory=set)

    def summary(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "users": len(self.users),
            "categories": dict(self.categories),
            "big_five": {trait: dict(counts) for trait, counts in self.big_five.items()},
        }


def write_parts(
    files: dict[str, dict[str, Path]],
    staging: Path,
    include_dialogue: bool,
    criteria: dict | None = None,
) -> dict[str, dict[str, DataPart]]:
    """setting -> split -> its Parquet file, staged in `staging`, every split file checked.

    Streamed: a part's rows go to Arrow ROW_BATCH at a time and are spooled to an Arrow
    file, then written out in row groups of the size `datasets` gives the whole table
    (about 100 MB of Arrow). So memory holds one row group, never the split, and the bytes
    are those `Dataset.to_parquet` writes (the card lists files by the digest of their bytes).
    """
    parts: dict[str, dict[str, DataPart]] = {}
    for setting, paths in files.items():
        parts[setting] = {}
        for split, path in paths.items():
            part = DataPart(name="", path=staging / f"{setting}-{split}.parquet")
            spool = staging / f"{setting}-{split}.arrow"
            nbytes = _spool(path, spool, part, include_dialogue, criteria)
            _write_parquet(spool, part.path, part.rows, nbytes, include_dialogue, criteria is not None)
            spool.unlink()
            digest = file_sha256(part.path)[:16]
            part.name = f"{setting}/{split}-00000-of-00001-{digest}.parquet"
            parts[setting][split] = part
    return parts


def _spool(path: Path, spool: Path, part: DataPart, include_dialogue: bool, criteria: dict | None) -> int:
    """The published rows of a split file into an Arrow stream file; their Arrow size."""
    import pyarrow as pa

    schema = features(include_dialogue, criteria is not None).arrow_schema
    nbytes, pending = 0, []
    with pa.OSFile(str(spool), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:

        def flush() -> None:
            nonlocal nbytes
            batch = pa.RecordBatch.from_pylist(pending, schema=schema)
            writer.write_batch(batch)
            nbytes += batch.nbytes
            pending.clear()

        for user in iter_split_users(path):
            note_persona(part, user)
            for row in dataset_rows(user, include_dialogue, criteria):
                part.rows += 1
                part.users.add(row["user_id"])
                part.categories[row["category"]] += 1
                part.languages[row["language"]] += 1
                for trait, level in row["big_five"].items():
                    part.big_five[trait][level] += 1
                if criteria is not None:
                    part.query_ids.add(row["query_id"])
                pending.append(row)
            if len(pending) >= ROW_BATCH:
                flush()
        if pending:
            flush()
    return nbytes


# persona.parse_persona's gate_reason for a user the depth check turned down, kept because
# the gate was off; and the part persona_stage's fingerprint gives that setting.
DEPTH_NOT_ENFORCED, DEPTH_OFF = "depth check not enforced", "depth=False"


def note_persona(part: DataPart, user: dict) -> None:
    """What the card says of a user's persona: its profile, its levels citing no memory."""
    uid = str(user["user_id"])
    part.profiles[uid] = profile_of(user)
    part.uncited_levels[uid] = sum(not user["big_five"][trait].get("evidence") for trait in BIG_FIVE)
    if str(user.get("gate_reason") or "").startswith(DEPTH_NOT_ENFORCED):
        part.depth_not_enforced.add(uid)


def _write_parquet(
    spool: Path, target: Path, rows: int, nbytes: int, include_dialogue: bool, with_criteria: bool
) -> None:
    """The spooled rows as `datasets`' ParquetDatasetWriter writes a Dataset of them: its
    schema, column options, content-defined chunking and row group size."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import config
    from datasets.arrow_writer import (
        get_parquet_column_options,
        get_writer_batch_size_from_data_size,
        get_writer_batch_size_from_features,
    )

    columns = features(include_dialogue, with_criteria)
    schema = columns.arrow_schema
    group = get_writer_batch_size_from_features(columns) or get_writer_batch_size_from_data_size(rows, nbytes)
    cdc = config.DEFAULT_CDC_OPTIONS
    with (
        pa.OSFile(str(spool), "rb") as source,
        pa.ipc.open_stream(source) as reader,
        target.open("wb") as handle,
    ):
        writer = pq.ParquetWriter(
            handle, schema=schema, use_content_defined_chunking=cdc, write_page_index=True,
            **get_parquet_column_options(columns, schema),
        )  # fmt: skip
        held, size = [], 0  # batches of the row group being gathered
        for batch in reader:
            while batch.num_rows:
                taken = batch.slice(0, group - size)
                held.append(taken)
                size += taken.num_rows
                batch = batch.slice(taken.num_rows)
                if size == group:
                    writer.write_table(_one_chunk(held, schema))
                    held, size = [], 0
        if held:  # (no rows: no row group, as datasets writes an empty split)
            writer.write_table(_one_chunk(held, schema))
        writer.add_key_value_metadata({"content_defined_chunking": json.dumps(cdc)})
        writer.close()
        handle.flush()
        os.fsync(handle.fileno())


def _one_chunk(batches: list, schema):
    """The row group as one contiguous chunk, as `datasets` slices it from its table: with
    content-defined chunking, where the writer cuts pages depends on the Arrow chunks. The
    copy costs one row group of memory (at most about 100 MB), freed as it is written."""
    import pyarrow as pa

    table = pa.Table.from_batches(batches, schema=schema).combine_chunks()
    batches.clear()
    return table


# --- what the card reports ---------------------------------------------------------------------


def stage_reports(split_report: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The filter report and the LLM stages' run-report entries of this build, and warnings.

    Found by following the split's input (the queries file) back through the manifests
    the stages wrote beside their outputs; nothing is guessed from folder names. A run
    report entry is used only if it is a full run (not a `--limit`/`--users` quick look)
    that wrote the file the manifest names.
    """
    facts: dict[str, Any] = {}
    warnings: list[str] = []
    source = split_report.get("input")
    if not isinstance(source, str) or not source:
        warnings.append(
            "split_report.json does not name its input file (an older split): re-run personaemp "
            "split to have the filter and LLM stages in the card"
        )
        return facts, warnings
    chain = stage_chain(Path(source))
    hint = "re-run that stage, or delete the file and its entry in manifest.json"
    for stage in ("filter", "infer-persona", "gen-queries"):
        entry = chain.get(stage)
        report_path = entry and entry.get("report")
        if not report_path:
            warnings.append(f"no report of {stage} was recorded for {source}: it is left out of the card")
            continue
        path = Path(report_path)
        if not path.is_file():
            warnings.append(f"{path}: the report of {stage} is gone: it is left out of the card")
            continue
        report = _read_json(path, f"the report of {stage}", hint)
        if not isinstance(report, dict):
            raise InputError(f"{path}: not a report of {stage} (a JSON object is expected)", hint)
        if stage == "filter":
            facts["filter"] = report
            continue
        run = (report.get("stages") or {}).get(stage)
        if not isinstance(run, dict) or run.get("full") is False:
            warnings.append(f"{path}: no full run of {stage}: it is left out of the card")
            continue
        if run.get("output") and os.path.abspath(run["output"]) != os.path.abspath(entry["output"]):
            warnings.append(
                f"{path}: the last full run of {stage} wrote {run['output']}, not {entry['output']}: "
                "it is left out of the card"
            )
            continue
        facts.setdefault("run", {"stages": {}})["stages"][stage] = run
    persona = chain.get("infer-persona") or {}
    units = ((facts.get("run") or {}).get("stages", {}).get("infer-persona") or {}).get("units")
    if isinstance(units, int) and units < _count((facts.get("filter") or {}).get("kept")):
        facts["picked"] = picked_users(persona.get("input"), persona.get("output"), units)
    return facts, warnings


class _UserId(msgspec.Struct):
    user_id: str


def _user_ids(path: Any) -> list[str]:
    """The user ids of a stage's output in file order (only that field is decoded)."""
    decoder = msgspec.json.Decoder(_UserId)
    try:
        with open(path, "rb") as handle:
            return [decoder.decode(line).user_id for line in handle if line.strip()]
    except (OSError, TypeError, msgspec.DecodeError):
        return []


def picked_users(filtered: Any, personas: Any, units: int) -> str | None:
    """How infer-persona's users were picked from the filter's: "first" (the first `units`
    in the filter's order, as a `limit` picks them), "named" (others: `users` named them),
    None when the files do not tell."""
    written, kept = set(_user_ids(personas)), _user_ids(filtered)
    if len(written) != units or not kept:
        return None
    return "first" if written == set(kept[:units]) else "named"


def _count(value: Any) -> int:
    return value if isinstance(value, int) else 0


def memory_source(user_source: Any, warnings: list[str]) -> dict[str, Any]:
    """Where the memories came from: AlpsBench as read, or a conversation log through
    extract-memories, whose manifest entry names the file the filter read. Its rows tell
    the log and its format, their provenance (and its run report) the model."""
    path = user_source.get("path") if isinstance(user_source, dict) else None
    entry = stage_chain(Path(path)).get("extract-memories") if isinstance(path, str) and path else None
    if entry is None:
        return {"kind": "alpsbench", "format": (user_source or {}).get("format")}
    found: dict[str, Any] = {"kind": "log"}
    first = next(iter(_rows(entry["output"])), None)
    if first is None:
        warnings.append(
            f"{entry['output']}: the memories extract-memories wrote are gone: the card cannot name the log"
        )
    else:
        source, provenance = first.get("source") or {}, first.get("provenance") or {}
        log = source.get("path")
        found.update(
            log=Path(log).name if isinstance(log, str) else None, format=source.get("format"),
            model=provenance.get("model"), endpoint_kind=provenance.get("endpoint_kind"),
        )  # fmt: skip
    run = _full_run(entry, "extract-memories")
    if run:
        found["run"] = run
        found["model"] = found.get("model") or run.get("model")
        found["users_in_log"] = len(_user_ids(entry.get("input")))  # conversations.jsonl: the log's users
    return found


def _full_run(entry: dict[str, Any], stage: str) -> dict[str, Any]:
    """The run report's entry of `stage` when it is a full run that wrote the manifest's output."""
    path = Path(entry["report"]) if entry.get("report") else None
    if path is None or not path.is_file():
        return {}
    report = _read_json(path, f"the report of {stage}", "re-run that stage")
    run = ((report if isinstance(report, dict) else {}).get("stages") or {}).get(stage)
    if not isinstance(run, dict) or run.get("full") is False:
        return {}
    if run.get("output") and os.path.abspath(run["output"]) != os.path.abspath(entry["output"]):
        return {}
    return run


def _rows(path: Any) -> Iterator[dict]:
    try:
        for _, _, row in iter_jsonl(Path(path), ErrorPolicy("fail")):
            yield row
    except (OSError, TypeError, RowError, InputError):
        return


def card_facts(
    splits_dir: Path, parts: dict[str, dict[str, DataPart]], split_report: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What the card reports, read from this build's files (missing ones are left out)."""
    facts: dict[str, Any] = {"settings": {}, "provenance": Counter(), "languages": Counter(), "warnings": []}
    if split_report is not None:
        facts["split"] = split_report
        found, facts["warnings"] = stage_reports(split_report)
        facts.update(found)
    for setting, written in parts.items():
        facts["settings"][setting] = {split: part.summary() for split, part in written.items()}
        for part in written.values():
            facts["languages"].update(part.languages)
    facts["personas"] = persona_facts(parts)
    for setting in SETTINGS:
        path = splits_dir / setting / "train.jsonl"
        if path.exists():
            for _, _, user in iter_jsonl(path, ErrorPolicy("fail")):
                facts["source"] = memory_source(user.get("source"), facts["warnings"])
                # The persona's provenance (its prompts), then the queries'.
                sources = [("infer-persona", user.get("provenance"))]
                sources += [("gen-queries", q.get("provenance")) for q in user.get("queries", [])[:1]]
                for stage, prov in sources:
                    if isinstance(prov, dict) and prov:
                        prompts = prov.get("prompts") if isinstance(prov.get("prompts"), dict) else {}
                        entry = {"stage": stage, "model": prov.get("model"), **prompts}
                        facts["provenance"][json.dumps(entry)] += 1
                break
            break
    return facts


def persona_facts(parts: dict[str, dict[str, DataPart]]) -> dict[str, Any]:
    """Over the published users: their distinct Big Five profiles (all, and per split of each
    config), the levels citing no memory, the users kept although the depth check said no."""
    profiles: dict[str, tuple[str, ...]] = {}
    uncited: dict[str, int] = {}
    depth: set[str] = set()
    per_split: dict[str, dict[str, int]] = {}
    for setting, written in parts.items():
        for split, part in written.items():
            profiles.update(part.profiles)
            uncited.update(part.uncited_levels)
            depth |= part.depth_not_enforced
            per_split.setdefault(setting, {})[split] = len(set(part.profiles.values()))
    return {
        "users": len(profiles), "profiles": len(set(profiles.values())), "per_split": per_split,
        "uncited_levels": sum(uncited.values()), "levels": len(BIG_FIVE) * len(profiles),
        "depth_not_enforced": len(depth),
    }  # fmt: skip


# --- the dialogues config ------------------------------------------------------------------------

DIALOGUES = "dialogues"  # the config of gen-dialogues' output, when it exists
# A published turn: the simulated user's state (and inner thought) stays, its per-reply checks
# are the card's pass rates.
TURN_FIELDS = {"role", "text", "emotion", "change", "reason", "need_met", "thought"}
DIALOGUE_FAILURES = "gen-dialogues.failures.jsonl"  # beside the dialogues file (llm/stage.py names it)


def dialogue_parts(path: Path, files: dict[str, dict[str, Path]], staging: Path, warnings: list[str]):
    """(split -> (repository name, staged file), the card's facts) of the dialogues config:
    each dialogue in the split of the random setting (else the first) that holds its query;
    one whose query is in no split is left out, counted in a warning."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from personaemp.instruments import simulator_rules
    from personaemp.records import Dialogue

    setting = "random" if "random" in files else next(iter(files))
    split_of = {
        str(query["query_id"]): split
        for split, split_path in files[setting].items()
        for _, _, user in iter_jsonl(split_path, ErrorPolicy("fail"))
        for query in user.get("queries") or ()
    }
    rows: dict[str, list[dict]] = {split: [] for split in SPLITS}
    dialogues: list[Dialogue] = []
    seen: set[str] = set()
    outside, left_out = 0, []
    for lineno, dialogue in iter_records(path, Dialogue, "a dialogue", "pass gen-dialogues' output"):
        if dialogue.dialogue_id in seen:
            raise InputError(f"{path}:{lineno}: dialogue {dialogue.dialogue_id} appears twice")
        seen.add(dialogue.dialogue_id)
        split = split_of.get(dialogue.query_id)
        if split is None:
            outside += 1
            left_out.append(f"{dialogue.dialogue_id} (line {lineno})")
            continue
        published = dialogue.model_dump(mode="json", exclude={"provenance", "turns"})
        published["turns"] = [turn.model_dump(mode="json", include=TURN_FIELDS) for turn in dialogue.turns]
        rows[split].append(published)
        dialogues.append(dialogue)
    if outside:
        named = ", ".join(left_out[:5]) + (f" and {outside - 5} more" if outside > 5 else "")
        warnings.append(f"{path}: {outside} dialogues of queries in no split were left out: {named}")
    lost = _lost_dialogues(path.with_name(DIALOGUE_FAILURES), split_of)
    written = {}
    for split, found in rows.items():
        if not found:
            continue
        staged = staging / f"{DIALOGUES}-{split}.parquet"
        pq.write_table(pa.Table.from_pylist(found), staged)
        written[split] = (f"{DIALOGUES}/{split}-00000-of-00001-{file_sha256(staged)[:16]}.parquet", staged)
    facts = dialogue_facts(dialogues, {s: len(r) for s, r in rows.items() if r}, simulator_rules, lost)
    return written, facts


def _lost_dialogues(failures: Path, split_of: dict[str, str]) -> list[dict[str, Any]]:
    """The failures rows of gen-dialogues beside the dialogues file whose query is published
    (a dialogue the simulator could not finish); none without the file."""
    if not failures.is_file():
        return []
    lost = []
    for _, _, row in iter_jsonl(failures, ErrorPolicy("fail")):
        query = row.get("query_id") or re.sub(r"-d\d+$", "", str(row.get("dialogue_id", "")))
        if query in split_of:
            lost.append(row)
    return lost


def dialogue_facts(dialogues, rows: dict[str, int], simulator_rules, lost=()) -> dict[str, Any]:
    """What the card says of the dialogues: models, languages, turns, how they ended, per
    supporter the dialogues kept and lost (`lost`: the failures file's rows), and each check's
    pass rate over every simulated reply it judged, kept or asked again. A check ran on a reply
    when the kept reply's checks name it (a rejected reply: when it ran on the reply kept at
    that turn, or failed); one that never ran is "not checked" (None), never a pass."""
    judged: Counter = Counter()
    failed: Counter = Counter()
    replies = 0
    names: dict[str, None] = dict.fromkeys((*simulator_rules.RULES, *simulator_rules.JUDGED))
    for dialogue in dialogues:
        for turn in dialogue.turns[1:]:
            if turn.role != "user":
                continue
            ran = set(turn.checks or {})
            names.update(dict.fromkeys(sorted(ran)))
            replies += 1 + len(turn.rejected)
            for rule in ran:
                judged[rule] += 1 + len(turn.rejected)
                failed[rule] += not turn.checks[rule]
            for rejected in turn.rejected:
                for rule in set(rejected) - set(REJECTED_KEYS):
                    names.setdefault(rule)
                    failed[rule] += 1
                    judged[rule] += rule not in ran
    # the replies of a lost dialogue, where its failures row keeps them (each: rule -> why):
    # judged by every check the run made (those that ran on its kept replies) and failed
    run_checks = {rule for rule in names if judged[rule]}
    unkept = 0
    for row in lost:
        if not isinstance(row.get("rejected"), list):
            unkept += 1
            continue
        for rejected in row["rejected"]:
            if isinstance(rejected, dict):
                replies += 1
                broken = set(rejected) - set(REJECTED_KEYS)
                for rule in run_checks | broken:
                    names.setdefault(rule)
                    judged[rule] += 1
                    failed[rule] += rule in broken
    turns = [sum(t.role == "assistant" for t in d.turns) for d in dialogues]
    kept = Counter(d.supporter_model for d in dialogues)
    only = next(iter(kept)) if len(kept) == 1 else None  # one run's failures: its supporter's
    supporters = {model: {"kept": n, "lost": 0, "lost_by_kind": {}} for model, n in kept.items()}
    for row in lost:
        model = row.get("supporter_model") or only or "unknown"
        entry = supporters.setdefault(model, {"kept": 0, "lost": 0, "lost_by_kind": {}})
        entry["lost"] += 1
        # the simulator's failure (its rules on every try), or the supporter's (its reply failed)
        entry["by_simulator"] = entry.get("by_simulator", 0) + (
            row.get("lost_to", "simulator" if row.get("kind") == "simulator_rules" else "") == "simulator"
        )
        kind = str(row.get("kind") or "unknown")
        entry["lost_by_kind"][kind] = entry["lost_by_kind"].get(kind, 0) + 1
    finals: dict[str, list[int]] = {}
    for dialogue in dialogues:
        finals.setdefault(dialogue.supporter_model, []).append(dialogue.final_emotion)
    return {
        "rows": rows,
        "simulator_models": sorted({d.simulator_model for d in dialogues}),
        "supporter_models": sorted({d.supporter_model for d in dialogues}),
        "languages": dict(sorted(Counter(d.language or "unknown" for d in dialogues).items())),
        "turns": {"min": min(turns, default=0), "max": max(turns, default=0),
                  "mean": round(sum(turns) / len(turns), 2) if turns else 0},
        "ended_by": dict(Counter(d.ended_by for d in dialogues)),
        "need_met": sum(d.need_met_at_turn is not None for d in dialogues),
        "supporters": dict(sorted(supporters.items())),
        "final_emotions": finals,
        "initial_emotions": sorted({d.initial_emotion for d in dialogues}),
        "checked_replies": replies,
        "lost_replies_not_kept": unkept,  # lost dialogues whose failures row keeps no replies
        "judged": {rule: judged[rule] for rule in names},
        "pass_rates": {
            rule: round(1 - failed[rule] / judged[rule], 4) if judged[rule] else None for rule in names
        },
    }  # fmt: skip


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
    criteria_asked: bool = True,
    dialogues: Path | None = None,
    dialogues_asked: bool = False,
    force: bool = False,
    quality: Callable[[Path | None], tuple[dict[str, Any] | None, bytes | None]] | None = None,
) -> PublishResult:
    """Push both configs to `repo_id`, or write the same repository to `out` (dry run).

    `criteria`: a `personaemp criteria` file; when it exists, each row gets its query's
    criteria as a `criteria` column (queries it lacks get empty lists, and a warning).
    `criteria_asked`: False when `criteria` is only the default place: a file there that
    cannot serve these queries (a leftover, made for other queries) is left out with one
    warning instead of stopping the push.
    `quality`: queries file -> (agreement report, plot) of the people's labels beside it
    (the review product's `card_quality`); without it the card says nobody measured the judge.
    `dialogues`: a gen-dialogues file; when it exists, a `dialogues` config (its rows in the
    split of the random setting that holds their query) and a section of the card;
    `dialogues_asked`: it was named (not the default place), so it must exist."""
    if dialogues_asked and dialogues is not None and not Path(dialogues).is_file():
        raise InputError(
            f"{dialogues}: no such dialogues file", "pass gen-dialogues' output, or leave --dialogues out"
        )
    if dialogues_asked and dialogues is not None and not Path(dialogues).read_bytes().strip():
        # named, so meant to be published: an empty file would publish no dialogues config, silently
        raise InputError(
            f"{dialogues}: no dialogues in it", "pass gen-dialogues' output, or leave --dialogues out"
        )
    if (repo_id is None) == (out is None):
        raise InputError("give either --repo-id OWNER/NAME or --dry-run --out-dir DIR")
    if repo_id is not None and repo_id.count("/") != 1:
        raise InputError(f"--repo-id must look like OWNER/NAME, not {repo_id!r}")
    files = split_files(splits_dir)
    split_report = read_split_report(splits_dir, list(files))
    fingerprint = None
    if out is not None:  # a dry run can be skipped; a push always goes out (the Hub may have changed)
        options = {
            "out": out, "include_dialogue": include_dialogue, "criteria": criteria, "asked": criteria_asked,
            "dialogues": dialogues,
        }  # fmt: skip
        read = [*_read_by_push(splits_dir, split_report, criteria), *([Path(dialogues)] if dialogues else [])]
        fingerprint = freshness.fingerprint(read, options)
        last = freshness.current("push", out, fingerprint, force)
        if last is not None:
            result = last["result"]
            return PublishResult(
                target=result["target"], rows=result["rows"], card=Path(result["card"]),
                warnings=result["warnings"], unchanged_since=freshness.unchanged("push", last),
            )  # fmt: skip
    left_out: list[str] = []
    found = None
    if criteria is not None and Path(criteria).exists():
        found = _criteria(Path(criteria), files, criteria_asked, left_out)
    with _staging(out) as staging:
        parts = write_parts(files, staging, include_dialogue, found)
        facts = card_facts(splits_dir, parts, split_report)
        facts["warnings"] += left_out
        if found is not None:
            published = {
                qid for written in parts.values() for part in written.values() for qid in part.query_ids
            }
            lacking = len(published - found.keys())
            if lacking:
                facts["warnings"].append(
                    f"{criteria}: no criteria for {lacking} published queries (empty lists)"
                )
        facts["data_files"] = {
            s: {sp: part.name for sp, part in written.items()} for s, written in parts.items()
        }
        rows = {s: {split: part.rows for split, part in written.items()} for s, written in parts.items()}
        staged_dialogues: dict[str, tuple[str, Path]] = {}
        if dialogues is not None and Path(dialogues).is_file():
            staged_dialogues, facts["dialogues"] = dialogue_parts(
                Path(dialogues), files, staging, facts["warnings"]
            )
            facts["dialogue_files"] = {split: name for split, (name, _) in staged_dialogues.items()}
            rows[DIALOGUES] = facts["dialogues"]["rows"]
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
        if out is not None:
            write_repository(out, repository, card)
            result = PublishResult(
                target=str(out), rows=rows, card=out / CARD_FILE, warnings=facts["warnings"]
            )
            written = [out / name for name in [*repository, CARD_FILE, EXPORT_MANIFEST]]
            saved = {
                "target": result.target,
                "rows": rows,
                "card": str(result.card),
                "warnings": result.warnings,
            }
            freshness.record("push", out, fingerprint, written, saved)
            return result
        _push(
            repository,
            card,
            repo_id,
            private,
            revision,
            configs=list(parts) + list(facts.get("dialogue_files") and [DIALOGUES] or []),
        )
    target = f"https://huggingface.co/datasets/{repo_id}"
    return PublishResult(target=target, rows=rows, warnings=facts["warnings"])


def _criteria(path: Path, files: dict[str, dict[str, Path]], asked: bool, warnings: list[str]):
    """The criteria file's rows, checked to be made for the split's queries; a file nobody
    asked for that cannot serve them (a leftover at the default place, made for other
    queries) is left out, with one warning that says why."""
    from personaemp.instruments.criteria import fresh_criteria

    try:
        return fresh_criteria(path, [p for parts in files.values() for p in parts.values()])
    except InputError as error:
        if asked:
            raise
        warnings.append(f"{error.message}: left out of the dataset (pass --criteria to require it)")
        return None


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
    """`personaemp push` on its options; `quality` as publish's (wired by the registry)."""
    from personaemp.results import of_publish

    dry = options.is_dry_run
    made = of_publish(
        publish(
            options.splits, repo_id=None if dry else options.repo_id, out=options.out_dir if dry else None,
            private=options.private, revision=options.revision, include_dialogue=options.include_dialogue,
            criteria=options.criteria, criteria_asked=not options.derived("criteria"), quality=quality,
            dialogues=options.dialogues, dialogues_asked=not options.derived("dialogues"),
            force=options.force,
        )
    )  # fmt: skip
    if dry and not options.dry_run and not getattr(made.report, "unchanged_since", None):
        console.print("no repo_id: a dry run, the repository that would be pushed goes to a folder")
    return made
