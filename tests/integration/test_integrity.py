"""Integrity: failures can be retried, outputs hold exactly the current input, one writer per
output, and a finished row counts only if it was made by the same recipe.

Each test reproduces a case users measured on the code before these fixes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI, reply
from rich.console import Console

from personaemp.dataset.filter import filter_users
from personaemp.dataset.persona import infer_personas
from personaemp.dataset.publish import publish
from personaemp.dataset.queries import QueryOptions, generate_queries
from personaemp.dataset.split import split_users
from personaemp.errors import InputError
from personaemp.llm.settings import LLMSettings

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "raw" / "alpsbench_sample" / "task1"
QUIET = Console(quiet=True)


@pytest.fixture(scope="module")
def sample_rows(tmp_path_factory) -> list[str]:
    """The filtered sample's 16 user rows, as JSONL lines."""
    output = tmp_path_factory.mktemp("sample") / "filtered.jsonl"
    filter_users(str(SAMPLE), output, console=QUIET)
    return output.read_text().splitlines()


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def ids(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["user_id"] for line in path.read_text().splitlines()]


def settings_for(server: FakeOpenAI, work: Path, **overrides) -> LLMSettings:
    return LLMSettings(base_urls=[server.base_url], model="fake", work_dir=work, **overrides)


# --- retries that retry ---------------------------------------------------------------------


def test_retry_failed_sends_fresh_requests_and_fixes_every_content_failure(tmp_path, sample_rows):
    """Before: replies were cached before validation and served again, so after the endpoint
    was fixed --retry-failed sent 0 requests and fixed 0 units."""
    filtered = write_lines(tmp_path / "filtered.jsonl", sample_rows[:6])
    output = tmp_path / "personas.jsonl"
    broken = True

    def endpoint(body, number):
        return reply({"not": "a persona"}) if broken else None  # None: a schema-valid reply

    with FakeOpenAI(responder=endpoint) as server:
        settings = settings_for(server, tmp_path / "work")
        first = infer_personas(filtered, output, settings, users=None, console=QUIET).report
        assert (first.outcome.done, first.outcome.failed) == (0, 6)
        assert dict(first.outcome.failures_by_kind) == {"invalid": 6}

        broken = False  # the endpoint is fixed
        again = infer_personas(filtered, output, settings, console=QUIET).report
        assert again.outcome.failed_before == 6 and server.count == 18  # content failures wait
        retried = infer_personas(filtered, output, settings, retry_failed=True, console=QUIET).report
        assert (retried.outcome.done, retried.outcome.failed) == (6, 0)
        assert retried.totals["requests"] == 6  # one persona request per user (levels in it), all fresh
        assert retried.totals["cache_hits"] == 0

        before = server.count
        done = infer_personas(filtered, output, settings, retry_failed=True, console=QUIET).report
        assert done.outcome.done_before == 6 and server.count == before  # done units send none
    assert (tmp_path / "infer-persona.failures.jsonl").read_text() == ""
    assert ids(output) == [json.loads(line)["user_id"] for line in sample_rows[:6]]


# --- outputs hold exactly the current input ---------------------------------------------------


def test_no_stale_user_reaches_the_published_dataset(tmp_path, sample_rows):
    """Before: after the input changed, `--limit`/`--users` kept the rows of users no longer in
    the input (and the old row of a user whose input changed), down to the pushed dataset."""
    filtered = tmp_path / "filtered.jsonl"
    personas, queries, splits = tmp_path / "personas.jsonl", tmp_path / "queries.jsonl", tmp_path / "splits"
    options = QueryOptions(enforce=("memory_ids_valid",))
    with FakeOpenAI() as server:
        settings = settings_for(server, tmp_path / "work")
        write_lines(filtered, sample_rows[:10])
        infer_personas(filtered, personas, settings, console=QUIET)
        generate_queries(personas, queries, settings, options=options, console=QUIET)
        assert len(ids(queries)) == 10

        # The input changes: users 5-9 leave, user 2's row changes, two new users arrive.
        changed = json.loads(sample_rows[2])
        changed["memories"] = changed["memories"][:1]
        current = [*sample_rows[:2], json.dumps(changed), *sample_rows[3:5], *sample_rows[10:12]]
        write_lines(filtered, current)
        current_ids = [json.loads(line)["user_id"] for line in current]

        infer_personas(filtered, personas, settings, limit=2, console=QUIET)
        assert ids(personas) == current_ids[:2] + current_ids[3:5]  # user 2's old row is gone too
        infer_personas(filtered, personas, settings, users=[current_ids[6]], console=QUIET)
        assert ids(personas) == current_ids[:2] + current_ids[3:5] + current_ids[6:]
        generate_queries(personas, queries, settings, options=options, limit=1, console=QUIET)
        assert set(ids(queries)) <= set(ids(personas))

    split_users(queries, splits, test_size=0.25, ood=False)
    result = publish(splits, out=tmp_path / "dataset").report
    published = set()
    for parquet in (tmp_path / "dataset").rglob("*.parquet"):
        import pyarrow.parquet as pq  # datasets' own dependency

        published |= set(pq.read_table(parquet, columns=["user_id"])["user_id"].to_pylist())
    assert published and published <= set(current_ids)
    assert result.rows


def test_limit_must_be_at_least_one(tmp_path, sample_rows):
    """Before: --limit 0 deleted every other finished row; --limit -1 processed one user."""
    filtered = write_lines(tmp_path / "filtered.jsonl", sample_rows[:3])
    with FakeOpenAI() as server:
        for limit in (0, -1):
            with pytest.raises(InputError, match="--limit must be at least 1"):
                infer_personas(filtered, tmp_path / "p.jsonl", settings_for(server, tmp_path), limit=limit)
        assert server.count == 0


def test_an_eligible_persona_row_missing_its_profile_is_refused_by_name(tmp_path, sample_rows):
    """Before: gen-queries took such rows (skipping them as ineligible), and errors said
    "1 validation error for Persona" without naming the field."""
    filtered = write_lines(tmp_path / "filtered.jsonl", sample_rows[:2])
    personas = tmp_path / "personas.jsonl"
    with FakeOpenAI() as server:
        settings = settings_for(server, tmp_path / "work")
        infer_personas(filtered, personas, settings, console=QUIET)
        rows = [json.loads(line) for line in personas.read_text().splitlines()]
        del rows[1]["profile"]
        write_lines(personas, [json.dumps(row) for row in rows])
        with pytest.raises(InputError) as caught:
            generate_queries(personas, tmp_path / "queries.jsonl", settings, console=QUIET)
    assert f"{personas}:2: not a persona row (an eligible persona needs profile)" in str(caught.value)
    assert "--on-error" not in str(caught.value)


# --- one writer per output --------------------------------------------------------------------

WRITER = """
import sys
from pathlib import Path
from rich.console import Console
from personaemp.llm.settings import LLMSettings
from personaemp.dataset.persona import infer_personas

base_url, filtered, output, users = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
settings = LLMSettings(base_urls=[base_url], model="fake", work_dir=output.parent / "work", concurrency=2)
report = infer_personas(filtered, output, settings, users=users, console=Console(quiet=True)).report
print(report.outcome.done, flush=True)
"""


def test_a_second_writer_stops_at_once_and_no_row_is_lost(tmp_path, sample_rows):
    """Before: two processes on one output both reported their users done and the file ended
    with none of them (each final rewrite kept only the rows it knew at its start)."""
    filtered = write_lines(tmp_path / "filtered.jsonl", sample_rows[:10])
    everyone = [json.loads(line)["user_id"] for line in sample_rows[:10]]
    output = tmp_path / "personas.jsonl"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "NO_COLOR": "1"}
    # Replies are held until the second writer has been turned away: the first is still
    # writing then, however slow the machine.
    release = threading.Event()

    def held() -> float:
        release.wait(60)
        return 0.0

    with FakeOpenAI(latency=held) as server:

        def writer(users):
            command = [sys.executable, str(script), server.base_url, str(filtered), str(output), *users]
            return subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )

        first = writer(everyone[:5])
        while server.count == 0:  # the first writer holds the lock once it sends
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        second = writer(everyone[5:])
        out, err = second.communicate(timeout=60)
        release.set()
        assert second.returncode == 1, (out, err)  # InputError, exit 2 on the CLI
        assert f"is being written by process {first.pid}" in err
        out, err = first.communicate(timeout=60)
        assert first.returncode == 0 and out.strip() == "5", err
        # The second half, run after the first: every row is there.
        again = writer(everyone[5:])
        out, err = again.communicate(timeout=60)
        assert again.returncode == 0 and out.strip() == "5", err
    assert ids(output) == everyone


# --- a finished row is one made by the same recipe --------------------------------------------


@pytest.mark.parametrize(
    "change",
    [{"temperature": 0.2}, {"max_tokens": 512}, {"seed": 7}, {"steps": {"persona": {"temperature": 0.0}}}],
    ids=["temperature", "max_tokens", "seed", "per-step"],
)
def test_changing_a_sampling_parameter_reruns_the_units(tmp_path, sample_rows, change):
    """Before: the fingerprint left out temperature, max_tokens and the structured mode, so
    changing them kept the old rows as done."""
    filtered = write_lines(tmp_path / "filtered.jsonl", sample_rows[:3])
    output = tmp_path / "personas.jsonl"
    with FakeOpenAI() as server:
        infer_personas(filtered, output, settings_for(server, tmp_path / "work"), console=QUIET)
        same = infer_personas(filtered, output, settings_for(server, tmp_path / "work"), console=QUIET).report
        assert same.outcome.done_before == 3
        rerun = infer_personas(
            filtered, output, settings_for(server, tmp_path / "work", **change), console=QUIET
        ).report
    assert (rerun.outcome.done, rerun.outcome.done_before) == (3, 0)
    assert rerun.totals["requests"] > 0


def test_the_fingerprint_follows_the_step_declaration(tmp_path):
    from pydantic import BaseModel

    from personaemp.llm.session import open_engine
    from personaemp.llm.step import Step

    class One(BaseModel):
        text: str

    class Two(BaseModel):
        text: str
        mood: int

    async def prints(settings):
        async with open_engine(settings) as engine:
            return {
                "base": engine.fingerprint(Step("s", One), "p1"),
                "prompt": engine.fingerprint(Step("s", One), "p2"),
                "schema": engine.fingerprint(Step("s", Two), "p1"),
                "version": engine.fingerprint(Step("s", One, version=2), "p1"),
                "default": engine.fingerprint(Step("s", One, temperature=0.0), "p1"),
            }

    import asyncio

    with FakeOpenAI() as server:
        auto = asyncio.run(prints(settings_for(server, tmp_path)))
        forced = asyncio.run(prints(settings_for(server, tmp_path, structured="json_object")))
    assert len(set(auto.values())) == len(auto)  # prompt, schema, version, sampling: all count
    assert forced["base"] != auto["base"]  # so does the structured mode asked for
