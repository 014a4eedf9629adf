"""Endpoints that cannot be used: the run stops with one line, records nothing for good, and
the next run against a working endpoint does every unit. The key is never printed or stored.

One run of each failure family (a dead endpoint, a status that refuses every request, a
timeout, a key in the URL) is the CLI in a child process, so what a user would see on stderr
(asyncio's "Task exception was never retrieved" tracebacks, what is printed at the
interpreter's exit) is what the test sees. Their variants (another status, the key echoed
in another form, an oversized reply...) run the same command in this process
(conftest.cli_here): the same files, exit code, stdout and stderr, without a launch each.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_here
from fake_openai import KEY_FORMS, FakeOpenAI, huge, invalid_json_content, reply, server_error, trickle
from rich.console import Console
from typer.testing import CliRunner

from personaemp import secrets
from personaemp.cli import app
from personaemp.dataset.filter import filter_users

REPO = Path(__file__).resolve().parents[2]
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
    tmp_path: Path,
    filtered: Path,
    base_url: str,
    *options: str,
    key: str = KEY,
    model: str = "fake",
    here: bool = False,
) -> subprocess.CompletedProcess:
    """infer-persona in a child process; `here`: in this process (conftest.cli_here), for the
    variants of a failure family whose child-process run is another test."""
    args = [
        "infer-persona", "--input", str(filtered), "--output", str(tmp_path / "personas.jsonl"),
        "--work-dir", str(tmp_path / "work"), "--base-url", base_url, "--model", model, *options,
    ]  # fmt: skip
    if here:
        env = {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": None, "NO_COLOR": "1", "COLUMNS": "200"}
        return cli_here(args, env, tmp_path)
    env = {**os.environ, "OPENAI_API_KEY": key, "NO_COLOR": "1", "COLUMNS": "200"}
    env.pop("OPENAI_BASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "personaemp", *args], capture_output=True, text=True, env=env, timeout=120,
        cwd=tmp_path,
    )  # fmt: skip


def infer_here(tmp_path: Path, filtered: Path, base_url: str) -> int:
    """`infer` with a working endpoint, in this process (Typer's runner): the exit code. The
    runs whose failures are checked stay child processes (their stderr, and what is printed
    at the interpreter's exit); a run that should just work need not pay a launch (~2 s)."""
    args = ["infer-persona", "--input", str(filtered), "--output", str(tmp_path / "personas.jsonl"),
            "--work-dir", str(tmp_path / "work"), "--base-url", base_url, "--model", "fake"]  # fmt: skip
    env = {"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": None, "NO_COLOR": "1", "COLUMNS": "200"}
    with contextlib.chdir(tmp_path):  # as the child runs, away from the checkout's personaemp.toml
        result = CliRunner().invoke(app, args, env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code


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
    """Not as is, in another letter case, or URL-encoded."""
    forms = {form(KEY).lower() for form in KEY_FORMS.values()}
    for text in outputs:
        assert not any(form in text.lower() for form in forms)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            content = path.read_bytes().lower()
            assert not any(form.encode() in content for form in forms), path


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def then_a_working_endpoint_does_every_unit(tmp_path: Path, filtered: Path) -> None:
    with FakeOpenAI() as good:
        assert infer_here(tmp_path, filtered, good.base_url) == 0
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
        assert infer_here(tmp_path, filtered, good.base_url) == 0
    files = [tmp_path / "personas.jsonl", tmp_path / "infer-persona.failures.jsonl"]
    before = [path.read_bytes() for path in files]
    assert len(rows(files[0])) + len(rows(files[1])) == USERS
    result = infer(tmp_path, filtered, f"http://127.0.0.1:{closed_port()}/v1", model="another", here=True)
    assert_one_clean_line(result, "did not answer")
    assert [path.read_bytes() for path in files] == before


@pytest.mark.parametrize("status", [400, 501])
def test_endpoint_refusing_every_request_stops_the_run(tmp_path, filtered, status):
    with FakeOpenAI(responder=lambda body, n: server_error(status)) as server:
        result = infer(tmp_path, filtered, server.base_url, here=status == 501)  # 400: the child's run
    assert_one_clean_line(result, f"HTTP {status}", "refused the first 3 requests")
    assert server.count == 3
    # What was written down is retried by the next run without --retry-failed.
    then_a_working_endpoint_does_every_unit(tmp_path, filtered)


def test_unauthorized_is_one_line_and_the_echoed_key_is_scrubbed(tmp_path, filtered):
    with FakeOpenAI(require_key="sk-the-right-one") as server:
        result = infer(tmp_path, filtered, server.base_url, here=True)
        assert server.count == 1
    assert_one_clean_line(result, "refused the API key", "OPENAI_API_KEY", "[redacted]")
    assert_key_nowhere(tmp_path, result.stdout, result.stderr)


def test_wrong_path_is_one_line(tmp_path, filtered):
    with FakeOpenAI() as server:
        result = infer(tmp_path, filtered, server.base_url.replace("/v1", "/nothing-here"), here=True)
    assert_one_clean_line(result, "no such model or path", "HTTP 404")


def test_an_endpoint_that_echoes_the_key_in_replies_leaks_it_nowhere(tmp_path, filtered):
    with FakeOpenAI(echo_key=True) as server:
        result = infer(tmp_path, filtered, server.base_url, here=True)
        assert server.chat_requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert result.returncode == 0, result.stderr
    cache = (tmp_path / "work" / "cache.sqlite").read_bytes()
    assert b"[redacted]" in cache  # the echo was there, and was scrubbed before storing
    assert_key_nowhere(tmp_path, result.stdout, result.stderr)


@pytest.mark.parametrize("form", ["upper", "swapcase", "percent"])
def test_a_key_echoed_altered_in_an_error_is_scrubbed(tmp_path, filtered, form):
    """Before: redaction matched the key only as is; a server that echoed it upper-cased or
    percent-encoded had it printed on the terminal."""
    with FakeOpenAI(require_key="sk-the-right-one", echo_key=form) as server:
        result = infer(tmp_path, filtered, server.base_url, here=True)
    assert "Incorrect API key provided: [redacted]." in result.stderr
    assert_one_clean_line(result, "refused the API key", "[redacted]")
    assert_key_nowhere(tmp_path, result.stdout, result.stderr)


@pytest.mark.parametrize("form", ["lower", "percent", "percent_lower"])
def test_a_key_echoed_altered_in_replies_leaks_it_nowhere(tmp_path, filtered, form):
    with FakeOpenAI(echo_key=form) as server:
        result = infer(tmp_path, filtered, server.base_url, here=True)
    assert result.returncode == 0, result.stderr
    assert b"[redacted]" in (tmp_path / "work" / "cache.sqlite").read_bytes()
    assert_key_nowhere(tmp_path, result.stdout, result.stderr)


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        (KEY, "[redacted]"),
        (f"key={KEY.upper()}.", "key=[redacted]."),
        (f"?k={KEY.swapcase()}&x", "?k=[redacted]&x"),
        ("".join(f"%{byte:02X}" for byte in KEY.encode()), "[redacted]"),
        ("".join(f"%{byte:02x}" for byte in KEY.encode()), "[redacted]"),
        ("".join(f"%25{byte:02X}" for byte in KEY.encode()), "[redacted]"),  # encoded twice
        ("sk-live-NEVER-PRINT", "sk-live-NEVER-PRINT"),  # a part is not the key
    ],
)
def test_redact_matches_the_key_in_any_case_and_url_encoded(monkeypatch, text, masked):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert secrets.redact(text) == masked


def test_redact_matches_a_space_encoded_as_plus_or_percent(monkeypatch):
    monkeypatch.setattr(secrets, "_registered", {"my secret token"})
    for text in ("my secret token", "MY+SECRET+TOKEN", "my%20secret%20token", "My%2bsecret+token"):
        assert secrets.redact(f"[{text}]") == "[[redacted]]", text


def test_a_placeholder_key_is_no_secret_and_later_lines_keep_the_word(tmp_path, monkeypatch):
    """Before: the README's `OPENAI_API_KEY=none` (a local stand-in) made "none" a secret of
    the process, registered by LLMSettings; every later line masked the word, and a test
    run after test_docs' README tour printed `[redacted].toml` for a missing none.toml
    (test_adversarial[config_that_is_not_there] and test_table_refuses_what_is_not_a_report...
    failed in one `-n 2` run, passed alone). The same two steps, in that order, here."""
    from personaemp.llm.settings import LLMSettings

    monkeypatch.setattr(secrets, "_registered", set())
    monkeypatch.setenv("OPENAI_API_KEY", "none")
    LLMSettings(base_urls=["http://127.0.0.1:9/v1"], model="fake", work_dir=tmp_path / "w")
    assert secrets.known() == [] and secrets.redact("context none") == "context none"
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["filter", "--config", "none.toml"])
    assert result.exit_code == 2 and "none.toml" in result.output, result.output
    secrets.register("EMPTY")  # vLLM's placeholder, in any case
    assert secrets.known() == []
    secrets.register("sk-live-1234")  # a real key still is one
    assert secrets.redact("key sk-live-1234, context none") == "key [redacted], context none"


# --------------------------------------------------------------------------- deadlines and sizes


def test_a_trickling_server_is_cut_off_by_the_timeout(tmp_path, filtered):
    """Before: --timeout was per read, and a server sending a byte every 200 ms held each
    request until the server itself gave up (here after 30 s: a connection error)."""
    with FakeOpenAI(responder=lambda body, n: trickle(0.2, bound=30)) as server:
        result = infer(tmp_path, filtered, server.base_url, "--timeout", "2", "--max-retries", "1")
    assert server.count == 2  # retried once, then the run stops
    assert_one_clean_line(result, "did not answer", "timed out", "within 2 s", "--timeout")
    assert rows(tmp_path / "infer-persona.failures.jsonl") == []
    then_a_working_endpoint_does_every_unit(tmp_path, filtered)


def test_a_reply_far_larger_than_max_tokens_is_cut_off_and_never_stored(tmp_path, filtered):
    """Before: a 1 MB reply was stored whole in the cache and the failures file (each user a
    content failure, exit 0); it is an endpoint fault now: retried, then the run stops."""
    with FakeOpenAI(responder=lambda body, n: huge(1_000_000)) as server:
        result = infer(tmp_path, filtered, server.base_url, "--max-retries", "1", here=True)
    assert server.count == 2
    assert_one_clean_line(result, "did not answer", "max_tokens 1024", "cut off")
    sizes = {path.name: path.stat().st_size for path in tmp_path.rglob("*") if path.is_file()}
    assert max(sizes.values()) < 100_000, sizes
    then_a_working_endpoint_does_every_unit(tmp_path, filtered)


def test_after_replies_an_oversized_one_fails_its_unit_as_an_endpoint_fault(tmp_path, filtered):
    # One request a user: the first answer is not JSON (re-asked), so the endpoint has replied
    # before the oversized replies, and every unit meets one.
    responder = lambda body, n: invalid_json_content() if n == 1 else huge(1_000_000)  # noqa: E731
    with FakeOpenAI(responder=responder) as server:
        result = infer(
            tmp_path, filtered, server.base_url, "--max-retries", "0", "--concurrency", "1", here=True
        )
    assert server.count == USERS + 1  # the first answer, then one oversized reply per user
    assert result.returncode == 1, result.stderr  # every unit failed: a failed run
    failed = rows(tmp_path / "infer-persona.failures.jsonl")
    assert [row["kind"] for row in failed] == ["server_error"] * USERS  # the next run tries them again
    assert all(len(row["raw"] or "") < 10_000 for row in failed)
    then_a_working_endpoint_does_every_unit(tmp_path, filtered)


def test_the_failures_file_keeps_an_excerpt_of_a_bad_reply(tmp_path, filtered):
    """Before: the whole reply was kept (here 60 kB a user)."""
    bad = "<" + "blah " * 12_000 + ">"
    with FakeOpenAI(responder=lambda body, n: reply(bad)) as server:
        result = infer(tmp_path, filtered, server.base_url, "--max-reasks", "0", here=True)
    # content failures are kept and the run goes on; as every unit failed, it exits 1
    assert result.returncode == 1, result.stderr
    failed = rows(tmp_path / "infer-persona.failures.jsonl")
    assert [row["kind"] for row in failed] == ["invalid"] * USERS
    for row in failed:
        head, marker, tail = row["raw"].split("\n")
        assert bad.startswith(head) and bad.endswith(tail) and len(head) == len(tail) == 2000
        assert marker == f"[... {len(bad) - 4000} characters cut ...]"


# --- a key written into the endpoint's URL ------------------------------------------------------


def test_a_key_in_the_url_is_in_no_file_and_not_on_the_terminal(tmp_path, filtered):
    """`--base-url http://tok:KEY@host/v1`: the key is masked in endpoints.json, the run
    report, the outputs and stderr, as the environment's key is."""
    with FakeOpenAI() as server:
        url = server.base_url.replace("http://", f"http://tok:{KEY}@")
        result = infer(tmp_path, filtered, url, key="sk-another-key-0000")
    assert result.returncode == 0, result.stderr
    decisions = json.loads((tmp_path / "work" / "endpoints.json").read_text())
    assert [key.split()[0] for key in decisions] == [server.base_url.replace("http://", "http://[redacted]@")]
    assert "[redacted]@" in (tmp_path / "work" / "run_report.json").read_text()
    assert_key_nowhere(tmp_path, result.stdout, result.stderr)


def test_a_dead_endpoint_with_a_key_in_its_url_names_it_masked(tmp_path, filtered):
    result = infer(
        tmp_path, filtered, f"http://{KEY}@127.0.0.1:{closed_port()}/v1", "--max-retries", "0", here=True
    )
    assert_one_clean_line(result, "[redacted]@127.0.0.1")
    assert_key_nowhere(tmp_path, result.stdout, result.stderr)


@pytest.mark.parametrize(
    ("url", "shown", "found"),
    [
        ("http://tok:s3cr3t-key@h:8000/v1", "http://[redacted]@h:8000/v1", ["s3cr3t-key"]),
        ("http://s3cr3t-key@h/v1", "http://[redacted]@h/v1", ["s3cr3t-key"]),
        ("https://h/v1?api-key=AZ-KEY-1&api-version=2024-10", "https://h/v1?api-key=[redacted]&api-version=2024-10",
         ["AZ-KEY-1"]),
        ("https://h/v1?key=G-KEY-22&x", "https://h/v1?key=[redacted]&x", ["G-KEY-22"]),
        ("https://h/v1?access_token=T0K3N&sig=S1G9", "https://h/v1?access_token=[redacted]&sig=[redacted]",
         ["T0K3N", "S1G9"]),
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1", []),
    ],
)  # fmt: skip
def test_the_credentials_of_a_url_are_found_and_masked(monkeypatch, url, shown, found):
    monkeypatch.setattr(secrets, "_registered", set())
    assert secrets.url_secrets(url) == found and secrets.redact_url(url) == shown
    from personaemp.llm.settings import LLMSettings

    settings = LLMSettings(base_urls=[url], model="m")
    assert settings.public()["endpoints"] == [shown]
    for secret in found:  # and anywhere else a message might carry it
        assert secrets.redact(f"GET {url} failed") == f"GET {secrets.redact(url)} failed"
        assert secret not in secrets.redact(f"GET {url} failed")
