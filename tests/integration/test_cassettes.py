"""The embedded model's recorded replies (tests/cassettes.py): each cassette names what made
its replies, and a cassette the installed model or llama-cpp-python would not answer the same
fails here with the command that records them again."""

from __future__ import annotations

import json
import urllib.request

import pytest
from cassettes import CASSETTES, RERECORD, StandIn, installed, mismatch, read

CASSETTE_FILES = sorted(CASSETTES.glob("*.jsonl"))


def test_there_are_cassettes_for_the_embedded_stage_tests():
    names = {path.name.split(".")[0] for path in CASSETTE_FILES}
    assert {"test_local_pipeline", "test_dialogues_local"} <= names
    for path in CASSETTE_FILES:
        header, replies = read(path)
        assert replies, f"{path.name}: no reply recorded"
        assert all(entry["status"] == 200 for entry in replies.values()), path.name


@pytest.mark.parametrize("path", CASSETTE_FILES, ids=lambda path: path.stem.split(".", 1)[1])
def test_the_recorded_replies_are_those_of_the_installed_model_and_llama_cpp(path):
    here = installed()
    if here["llama_cpp_python"] is None:
        pytest.skip("llama-cpp-python is not installed: the recordings cannot be checked against it")
    header, _ = read(path)
    problem = mismatch(path, header, here)
    assert problem is None, problem


@pytest.mark.parametrize(
    ("field", "recorded"),
    [("llama_cpp_python", "0.2.90"), ("model_sha256", "0" * 64), ("threads", 2), ("model", "another")],
)
def test_the_guard_names_what_changed_and_the_command_that_records_again(tmp_path, field, recorded):
    here = {"model": "m", "model_sha256": "a" * 64, "llama_cpp_python": "0.3.36", "threads": 1}
    path = tmp_path / "test_x.test_y.jsonl"
    assert mismatch(path, dict(here), here) is None
    problem = mismatch(path, {**here, field: recorded}, here)
    assert problem is not None and f"`{RERECORD}`" in problem
    assert f"{field} {recorded!r} (here: {here[field]!r})" in problem and path.name in problem


def test_a_request_not_in_the_cassette_is_refused_naming_the_command(tmp_path):
    path = tmp_path / "test_x.test_y.jsonl"
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "temperature": 0.0}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with StandIn(path) as server:
        request = urllib.request.Request(
            f"{server.base_url}/chat/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            opener.open(request, timeout=10)
    assert refused.value.code == 500
    assert RERECORD in json.loads(refused.value.read())["error"]["message"]
    assert server.misses == [body]
