"""personaemp.io: streaming readers that name file:line, the error policy, atomic writes."""

from __future__ import annotations

import json

import pytest
from conftest import files_in, write_json, write_jsonl

from personaemp.errors import InputError, RowError
from personaemp.io import (
    ErrorPolicy,
    atomic_output,
    iter_json_array,
    iter_jsonl,
    read_jsonl_at,
    write_json_atomic,
)


def test_error_policy_rejects_unknown_mode():
    with pytest.raises(InputError, match="'fail' or 'skip'"):
        ErrorPolicy("ignore")


def test_error_policy_fail_raises_and_skip_counts():
    error = RowError("x.jsonl:3", "not valid JSON")
    with pytest.raises(RowError) as caught:
        ErrorPolicy("fail").handle(error)
    assert str(caught.value).startswith("x.jsonl:3: not valid JSON")
    assert "--on-error skip" in str(caught.value)

    policy = ErrorPolicy("skip")
    policy.handle(error)
    policy.handle(RowError("x.jsonl:9", "missing required field 'input'"))
    assert policy.skipped == ["x.jsonl:3: not valid JSON", "x.jsonl:9: missing required field 'input'"]


def test_iter_jsonl_yields_line_numbers_and_offsets_and_skips_blank_lines(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"a": 1}, "", "   ", {"b": "ü"}])
    rows = list(iter_jsonl(path, ErrorPolicy()))
    assert [(line, value) for line, _, value in rows] == [(1, {"a": 1}), (4, {"b": "ü"})]
    with path.open("rb") as handle:
        assert [read_jsonl_at(handle, offset) for _, offset, _ in rows] == [{"a": 1}, {"b": "ü"}]


def test_iter_jsonl_invalid_json_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"a": 1}, {"a": 2}, '{"a": 3,'])
    seen = []
    with pytest.raises(RowError) as caught:
        for _, _, value in iter_jsonl(path, ErrorPolicy()):
            seen.append(value)
    assert seen == [{"a": 1}, {"a": 2}]
    assert f"{path}:3: not valid JSON" in str(caught.value)


def test_iter_jsonl_invalid_utf8_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"a": 1}, b'{"a": "\xff\xfe"}'])
    with pytest.raises(RowError, match=r"rows\.jsonl:2: not valid UTF-8"):
        list(iter_jsonl(path, ErrorPolicy()))


def test_iter_jsonl_skip_policy_counts_bad_lines(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", ["nope", {"a": 1}, b"\xff", {"a": 2}])
    policy = ErrorPolicy("skip")
    assert [value for _, _, value in iter_jsonl(path, policy)] == [{"a": 1}, {"a": 2}]
    assert len(policy.skipped) == 2
    assert policy.skipped[0].startswith(f"{path}:1: not valid JSON")
    assert policy.skipped[1] == f"{path}:3: not valid UTF-8"


def test_iter_jsonl_missing_file_and_folder(tmp_path):
    with pytest.raises(InputError, match="nothing.jsonl: no such file"):
        list(iter_jsonl(tmp_path / "nothing.jsonl", ErrorPolicy()))
    with pytest.raises(InputError, match="not a file"):
        list(iter_jsonl(tmp_path, ErrorPolicy()))


@pytest.mark.parametrize("shape", ["list", "data_object", "data_not_first"])
def test_iter_json_array_shapes(tmp_path, shape):
    records = [{"id": 1}, {"id": 2, "nested": {"x": [1, 2, 3]}}, {"id": 3}]
    value = {
        "list": records,
        "data_object": {"data": records},
        "data_not_first": {"meta": {"version": 2, "note": "x]y}"}, "count": 3, "data": records},
    }[shape]
    path = write_json(tmp_path / "part.json", value)
    assert list(iter_json_array(path, ErrorPolicy())) == [
        (f"{path}: record {n}", record) for n, record in enumerate(records, 1)
    ]


@pytest.mark.parametrize("style", ["compact", "default", "indented"])
def test_iter_json_array_allows_whitespace_between_records(tmp_path, style):
    """JSON written by json.dump (", " separators) or pretty-printed must read like compact JSON."""
    records = [{"id": 1, "text": "a"}, {"id": 2, "text": "b"}, {"id": 3, "text": "c"}]
    for name, value in (("list.json", records), ("object.json", {"meta": {"n": 3}, "data": records})):
        path = write_json(tmp_path / name, value, style=style)
        assert [record for _, record in iter_json_array(path, ErrorPolicy())] == records, name


def test_iter_json_array_record_bigger_than_the_read_buffer(tmp_path):
    big_text = "é" * (3 * 1024 * 1024)  # 3 Mi characters, 6 MiB of UTF-8: several buffer refills
    records = [{"id": 1}, {"id": 2, "text": big_text}, {"id": 3, "n": 1234567890}]
    path = write_json(tmp_path / "big.json", {"meta": {"n": 3}, "data": records})
    read = [record for _, record in iter_json_array(path, ErrorPolicy())]
    assert [r["id"] for r in read] == [1, 2, 3]
    assert read[1]["text"] == big_text
    assert read[2]["n"] == 1234567890


def test_iter_json_array_empty_list_and_empty_file(tmp_path):
    assert list(iter_json_array(write_json(tmp_path / "a.json", []), ErrorPolicy())) == []
    assert list(iter_json_array(write_json(tmp_path / "b.json", {"data": []}), ErrorPolicy())) == []
    empty = tmp_path / "empty.json"
    empty.write_text("")
    with pytest.raises(InputError, match="empty.json: the JSON ends too early"):
        list(iter_json_array(empty, ErrorPolicy()))


def test_iter_json_array_errors_name_the_file(tmp_path):
    path = write_json(tmp_path / "x.json", {"meta": 1})
    with pytest.raises(InputError, match=r"x\.json: the top-level object has no 'data' list"):
        list(iter_json_array(path, ErrorPolicy()))

    path = write_json(tmp_path / "y.json", {"data": {"not": "a list"}})
    with pytest.raises(InputError, match=r"y\.json: 'data' is not a list"):
        list(iter_json_array(path, ErrorPolicy()))

    path = write_json(tmp_path / "z.json", "just a string")
    with pytest.raises(InputError, match=r"z\.json: expected a JSON list"):
        list(iter_json_array(path, ErrorPolicy()))

    path = tmp_path / "broken.json"
    path.write_text('[{"id":1},{"id":2,}]')
    with pytest.raises(InputError, match=r"broken\.json: record 2: not valid JSON"):
        list(iter_json_array(path, ErrorPolicy()))

    path = tmp_path / "latin1.json"
    path.write_bytes(b'[{"id":"caf\xe9"}]')
    with pytest.raises(InputError, match=r"latin1\.json: not valid UTF-8"):
        list(iter_json_array(path, ErrorPolicy()))


def test_atomic_output_replaces_only_on_success(tmp_path):
    target = tmp_path / "out" / "rows.jsonl"
    with atomic_output(target) as handle:
        handle.write(b"first\n")
    assert target.read_bytes() == b"first\n"

    with pytest.raises(RuntimeError), atomic_output(target) as handle:
        handle.write(b"second, half written\n")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"first\n"
    assert files_in(target.parent) == ["rows.jsonl"]


def test_atomic_output_file_mode_follows_umask(tmp_path):
    target = tmp_path / "rows.jsonl"
    with atomic_output(target) as handle:
        handle.write(b"x\n")
    assert target.stat().st_mode & 0o777 == 0o666 & ~_current_umask()


def _current_umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_write_json_atomic(tmp_path):
    path = tmp_path / "report.json"
    write_json_atomic(path, {"b": 1, "a": [1, 2]})
    assert json.loads(path.read_text()) == {"b": 1, "a": [1, 2]}
    assert path.read_text().endswith("\n")
