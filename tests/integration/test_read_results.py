"""The API reference is the API, and results read as tables (issue 39)."""

from __future__ import annotations

import inspect

from conftest import REPO

import personaemp as pe
from personaemp import apidocs as api
from personaemp.results import StageResult


def test_the_reference_page_is_generated_from_the_functions_it_documents():
    text = (REPO / "docs" / "python-api.md").read_text(encoding="utf-8")
    start, end = text.index(api.BEGIN) + len(api.BEGIN), text.index(api.END)
    assert text[start:end].removeprefix("\n") == api.reference_markdown(), (
        "run: python -m personaemp.apidocs docs/python-api.md"
    )
    assert "personaemp.dataset." not in text and "personaemp.stages" not in text, "internals are not the API"
    for name in ("merge_shards", "run_pipeline", "StageResult", "infer_personas", "split_users"):
        assert f"pe.{name}" in text or f"api.{name}" in text or f"results.{name}" in text, name
    assert "merge_shards" in dir(pe) and list(inspect.signature(pe.merge_shards).parameters)[:3] == [
        "stage", "input", "output"
    ]  # fmt: skip


def test_results_read_as_polars_frames_and_a_dataset(sample_build):
    personas = StageResult("infer-persona", sample_build / "personas.jsonl")
    frame = personas.to_polars()
    rows = personas.rows()
    assert frame.height == len(rows)
    assert {"user_id", "big_five", "openness", "neuroticism"} <= set(frame.columns)
    levels = {row["user_id"]: row["big_five"]["openness"]["level"] for row in rows if row.get("big_five")}
    assert dict(zip(frame["user_id"], frame["openness"], strict=True)) | levels == dict(
        zip(frame["user_id"], frame["openness"], strict=True)
    )
    queries = StageResult("gen-queries", sample_build / "queries.jsonl")
    flat = queries.queries()
    expected = [(row["user_id"], q["query_id"]) for row in queries.rows() for q in row["queries"]]
    assert list(zip(flat["user_id"], flat["query_id"], strict=True)) == expected and expected
    assert {"profile", "category", "query", "situation", "agreeableness"} <= set(flat.columns)
    dataset = queries.to_dataset()
    assert dataset.num_rows == len(queries.rows()) and "queries" in dataset.column_names


def test_merge_shards_is_there_the_registry_way(tmp_path):
    import pytest

    with pytest.raises(pe.InputError, match="no shards of"):
        pe.merge_shards("infer-persona", tmp_path / "filtered.jsonl", tmp_path / "personas.jsonl")
