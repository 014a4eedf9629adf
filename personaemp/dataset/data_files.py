"""The dataset's data files: the split files read and checked row by row, the published
rows and their schema (`features`), and each (config, split) written as one Parquet file."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from personaemp.errors import InputError, RowError, first_problem
from personaemp.io import ErrorPolicy, file_sha256, iter_jsonl
from personaemp.manifest import resolved
from personaemp.records import BIG_FIVE, DIMENSIONS
from personaemp.splits import REPORT_FILE, SETTINGS_WRITTEN, check_queries_row, profile_of

SETTINGS = SETTINGS_WRITTEN  # the configs, one per split setting
COLUMNS = (
    "user_id", "query_id", "query", "category", "situation", "memory_ids", "language",
    "persona_profile", "persona_traits", "topics", "big_five", "memories", "user_turns", "criteria",
)  # fmt: skip
SPLITS = ("train", "test")
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
    report["input"] = resolved(report.get("input"), splits_dir)  # kept relative to its folder
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
