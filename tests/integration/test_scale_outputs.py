"""split, stats and push stream their rows (issue 35): they must write what they wrote when
they held every row in memory. tests/data/sample_build is a build of the shipped sample
(filter → gen-queries, against the capable fake model); outputs.json holds the digests of what
split, stats and push --dry-run wrote from it before the change (a8a9cb6), regenerated with
`python tests/integration/test_scale_outputs.py` (only when a change of the outputs is intended)."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

FIXTURE = Path(__file__).parents[1] / "data" / "sample_build"
GOLDEN = Path(__file__).parents[1] / "data" / "sample_build_outputs.json"
PLACEHOLDER = "@FOLDER@"


def sample_build_copy(folder: Path) -> Path:
    """The fixture build in `folder` (its run report names the files it wrote there)."""
    shutil.copytree(FIXTURE, folder)
    report = folder / ".personaemp" / "run_report.json"
    report.write_text(report.read_text().replace(PLACEHOLDER, str(folder)))
    return folder


def build_outputs(folder: Path) -> dict[str, str]:
    """split, stats and push --dry-run on the build in `folder`: file -> sha256, with the
    folder's path in text files replaced by a placeholder (the report names its input)."""
    from personaemp.dataset.publish import publish
    from personaemp.dataset.split import split_users
    from personaemp.dataset.stats import write_stats

    split_users(folder / "queries.jsonl", folder / "splits", ood=True)
    write_stats(folder, folder / "stats")
    publish(folder / "splits", out=folder / "dataset")
    digests = {}
    for name in ("splits", "stats", "dataset"):
        for path in sorted((folder / name).rglob("*")):
            if path.is_file() and not path.name.endswith(".lock"):
                data = path.read_bytes()
                if path.suffix in (".json", ".jsonl", ".md"):
                    data = data.replace(str(folder).encode(), PLACEHOLDER.encode())
                digests[path.relative_to(folder).as_posix()] = hashlib.sha256(data).hexdigest()
    return digests


def test_split_stats_and_push_write_the_same_bytes_as_before_streaming(tmp_path):
    found = build_outputs(sample_build_copy(tmp_path / "build"))
    expected = json.loads(GOLDEN.read_text())
    assert sorted(found) == sorted(expected)
    assert {name for name in found if found[name] != expected[name]} == set()


def test_parquet_written_in_row_groups_is_what_datasets_writes_from_the_whole_table(tmp_path, monkeypatch):
    """push spools rows to Arrow ROW_BATCH at a time and writes row groups of the size
    `datasets` gives the whole table: with groups of a few KB (many per file), pages of a
    few hundred bytes and batches of 3 rows, the bytes are still those of Dataset.to_parquet
    on every row at once."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset, DatasetInfo, config

    from personaemp.dataset import data_files
    from personaemp.dataset import publish as push
    from personaemp.dataset.split import split_users

    folder = sample_build_copy(tmp_path / "build")
    split_users(folder / "queries.jsonl", folder / "splits", ood=True)
    monkeypatch.setattr(config, "MAX_ROW_GROUP_SIZE", "6KB")
    # Pages cut by content every few hundred bytes, as every 256 KB-1 MB at full size: where
    # they fall must not depend on the batches the rows were spooled in.
    monkeypatch.setattr(
        config, "DEFAULT_CDC_OPTIONS", {"min_chunk_size": 256, "max_chunk_size": 1024, "norm_level": 0}
    )
    monkeypatch.setattr(data_files, "ROW_BATCH", 3)  # where the rows are turned into Arrow
    result = push.publish(folder / "splits", out=folder / "dataset")
    columns = push.features(False)
    for setting, parts in result.report.rows.items():
        for split, count in parts.items():
            users = list(push.iter_split_users(folder / "splits" / setting / f"{split}.jsonl"))
            rows = [row for user in users for row in push.dataset_rows(user, False)]
            table = pa.Table.from_pylist(rows, schema=columns.arrow_schema)
            expected = io.BytesIO()
            Dataset(table, info=DatasetInfo(features=columns)).to_parquet(expected)
            [written] = (folder / "dataset" / setting).glob(f"{split}-*.parquet")
            assert len(rows) == count
            if count > 3:
                assert pq.ParquetFile(written).num_row_groups > 1
            assert written.read_bytes() == expected.getvalue(), f"{setting}/{split}"


if __name__ == "__main__":  # regenerate the digests
    import tempfile

    sys.path.insert(0, str(Path(__file__).parents[2]))
    with tempfile.TemporaryDirectory() as name:
        digests = build_outputs(sample_build_copy(Path(name) / "build"))
    GOLDEN.write_text(json.dumps(digests, indent=2, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}: {len(digests)} files")
