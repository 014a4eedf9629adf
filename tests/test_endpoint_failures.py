"""Endpoints that cannot be used: the run stops with one line, records nothing for good, and
the next run against a working endpoint does every unit. The key is never printed or stored.

The CLI runs in a subprocess, so what a user would see on stderr (asyncio's "Task
exception was never retrieved" tracebacks included) is what the test sees.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, server_error
from rich.console import Console

from personaemp.stages.filter import filter_users

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "raw" / "alpsbench_sample" / "task1"
KEY = "sk-live-NEVER-PRINT-0123456789abcdef"
USERS = 3


@pytest.fixture
def filtered(tmp_path) -> Path:
    output = tmp_path / "filtered.jsonl"
    filter_users(str(SAMPLE), output, console=Console(quiet=True))
    lines = output.read_text().splitlines()[:USERS]
    output.write_text("\n".join(lines) + "\n")
    return output


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens there once the socket is closed


def infer(
    tmp_path: Path, filtered: Path, base_url: str, key: str = KEY, model: str = "fake"
) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPENAI_API_KEY": key, "NO_COLOR": "1", "COLUMNS": "200"}
    env.pop("OPENAI_BASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "personaemp", "infer-persona", "--input", str(filtered),
         "--output", str(tmp_path / "personas.jsonl"), "--work-dir", str(tmp_path / "work"),
         "--base-url", base_url, "--model", model],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )  # fmt: skip


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip() and "Error" in line]


def assert_one_clean_line(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "never retrieved" not in result.stderr
    [line] = error_lines(result)
    assert line.startswith("Error:")
    for word in words:
        assert word in line, line


def assert_key_nowhere(tmp_path: Path, *outputs: str) -> None:
    for text in outputs:
        assert KEY not in text
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def then_a_working_endpoint_does_every_unit(tmp_path: Path, filtered: Path) -> None:
    with FakeOpenAI() as good:
        result = infer(tmp_path, filtered, good.base_url)
    assert result.returncode == 0, result.stderr
    done = rows(tmp_path / "personas.jsonl") + rows(tmp_path / "infer-persona.failures.jsonl")
    assert len(done) == USERS and good.count >= USERS


def test_dead_endpoint_stops_with_one_line_and_records_nothing(tmp_path, filtered):
    result = infer(tmp_path, filtered, f"http://127.0.0.1:{closed_port()}/v1")
    assert_one_clean_line(result, "did not answer", "connection", "--base-url")
    assert rows(tmp_path / "infer-persona.failures.jsonl") == []
    assert_key_nowhere(tmp_path, result.stdout, result.stderr)
    then_a_working_endpoint_does_every_unit(tmp_path, filtered)


def test_a_run_stopped_before_any_unit_leaves_earlier_rows_alone(tmp_path, filtered):
    """Before: a mistyped --base-url with another --model emptied personas.jsonl (the final
    rewrite keeps only rows of the current recipe, and the stopped run made none)."""
    with FakeOpenAI() as good:
        assert infer(tmp_path, filtered, good.base_url).returncode == 0
    files = [tmp_path / "personas.jsonl", tmp_path / "infer-persona.failures.jsonl"]
    before = [path.read_bytes() for path in files]
    assert len(rows(files[0])) + len(rows(files[1])) == USERS
    result = infer(tmp_path, filtered, f"http://127.0.0.1:{closed_port()}/v1", model="another")
    assert_one_clean_line(result, "did not answer")
    assert [path.read_bytes() for path in files] == before


@pytest.mark.parametrize("status", [400, 501])
def test_endpoint_refusing_every_request_stops_the_run(tmp_path, filtered, status):
    with FakeOpenAI(responder=lambda body, n: server_error(status)) as server:
        result = infer(tmp_path, filtered, server.base_url)
    assert_one_clean_line(result, f"HTTP {status}", "refused the first 3 requests")
    assert server.count == 3
    # What was written down is retried by the next run without --retry-failed.
    then_a_working_endpoint_does_every_unit(tmp_path, filtered)


def test_unauthorized_is_one_line_and_the_echoed_key_is_scrubbed(tmp_path, filtered):
    with FakeOpenAI(require_key="sk-the-right-one") as server:
        result = infer(tmp_path, filtered, server.base_url)
        assert server.count == 1
    assert_one_clean_line(result, "refused the API key", "OPENAI_API_KEY", "[redacted]")
    assert_key_nowhere(tmp_path, result.stdout, result.stderr)


def test_wrong_path_is_one_line(tmp_path, filtered):
    with FakeOpenAI() as server:
        result = infer(tmp_path, filtered, server.base_url.replace("/v1", "/nothing-here"))
    assert_one_clean_line(result, "no such model or path", "HTTP 404")


def test_an_endpoint_that_echoes_the_key_in_replies_leaks_it_nowhere(tmp_path, filtered):
    with FakeOpenAI(echo_key=True) as server:
        result = infer(tmp_path, filtered, server.base_url)
        assert server.chat_requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert result.returncode == 0, result.stderr
    cache = (tmp_path / "work" / "cache.sqlite").read_bytes()
    assert b"[redacted]" in cache  # the echo was there, and was scrubbed before storing
    assert_key_nowhere(tmp_path, result.stdout, result.stderr)
