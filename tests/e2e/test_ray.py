"""--executor ray (personaemp/llm/ray_executor.py) on a local Ray: the same files as one process.

On the local Ray of conftest's `local_ray` (2 CPUs, started once per test process and shared
with test_ray_stages and test_ray_vllm): the token test below starts it, through connect()."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import sqlite3
from pathlib import Path

import pytest
from conftest import SAMPLE_TASK1, order_free_responder
from fake_openai import FakeOpenAI, reply
from rich.console import Console

from personaemp.dataset.options import PersonaOptions
from personaemp.pipeline import run_pipeline
from personaemp.registry import RunOptions
from personaemp.shared_options import LLMOptions, PathsOptions

ray = pytest.importorskip("ray")

TIMINGS = {"created_at"}  # the only thing a row holds that a second run changes


def rows(path: Path, drop=TIMINGS) -> list:
    def strip(value):
        if isinstance(value, dict):
            return {key: strip(item) for key, item in value.items() if key not in drop}
        if isinstance(value, list):
            return [strip(item) for item in value]
        return value

    return [strip(json.loads(line)) for line in path.read_text().splitlines()]


def files(root: Path, folder: str) -> list[Path]:
    return sorted(path.relative_to(root) for path in (root / folder).rglob("*") if path.is_file())


def workers_started() -> list[int]:
    """The process ids of every UnitWorker actor this Ray has started, alive or not."""
    actors = ray._private.state.actors().values()
    return [actor["Pid"] for actor in actors if "UnitWorker" in actor["ActorClassName"]]


def persona_step(request) -> bool:
    """Whether a chat request is infer-persona's (its reply schema's fields say)."""
    schema = json.dumps(request.body["response_format"])
    return '"traits"' in schema or '"openness"' in schema


def test_a_local_ray_starts_without_the_token_warning(no_ray_yet, monkeypatch):
    """Issue 63: Ray 2.60 logged "Token authentication is enabled for this Ray cluster..." as a
    WARNING on every run. connect() asks for token authentication itself (what Ray does anyway)
    and says so on its own line. The Ray group's first test: its start is the local Ray of
    the tests after it (conftest's no_ray_yet and local_ray; 2 CPUs, as local_ray starts it),
    not a second whole Ray start in a process of its own (5-7 core-s)."""
    from personaemp.llm import ray_executor
    from personaemp.llm.settings import LLMSettings

    heard: list[logging.LogRecord] = []
    listener = logging.Handler()
    listener.emit = heard.append  # every record of Ray's loggers, whatever their handlers print
    monkeypatch.delenv(ray_executor.AUTH_MODE, raising=False)  # as in a new process: Ray sets it
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # connect()'s num_cpus: local_ray's 2
    logging.getLogger("ray").addHandler(listener)
    try:
        settings = LLMSettings(executor="ray", workers=1, base_urls=["http://127.0.0.1:9/v1"], model="m")
        said = ray_executor.connect(settings)
    finally:
        logging.getLogger("ray").removeHandler(listener)
    assert no_ray_yet.is_initialized() and no_ray_yet.cluster_resources()["CPU"] == 2
    warned = [record.getMessage() for record in heard if record.levelno >= logging.WARNING]
    assert not [line for line in warned if "Token authentication is enabled" in line], warned
    assert said.startswith("a local Ray (started in") and "token authentication on" in said, said
    # Ray's own default, kept: token mode, its token in ~/.ray/auth_token (made on a first start)
    assert os.environ[ray_executor.AUTH_MODE] == "token"
    assert (Path.home() / ".ray" / "auth_token").is_file()


def test_run_on_ray_writes_what_one_process_writes(local_ray, sample_build, tmp_path):
    """`run --executor ray` on the shipped sample, two workers sharing two endpoints at
    --concurrency 4: the personas, queries, splits, stats and dataset of the one-process
    run (sample_build, the same order-free model), the same requests counted, and never
    more than 4 requests in flight at either endpoint. As in one process, the two LLM
    stages run on the same two workers (started once for the run, not once per stage)."""
    processed = tmp_path / "processed"
    responder = order_free_responder()
    before = workers_started()
    slow = {"responder": responder, "latency": lambda: 0.05}  # each stage's requests spread out in time
    with FakeOpenAI(**slow) as first, FakeOpenAI(**slow) as second:
        llm = LLMOptions(
            base_url=[first.base_url, second.base_url], model="fake", concurrency=4, executor="ray", workers=2
        )
        options = RunOptions(paths=PathsOptions(input=str(SAMPLE_TASK1), processed=processed), llm=llm)
        with open(tmp_path / "log.txt", "w") as log:
            run_pipeline(options, Console(file=log))
    assert first.count and second.count  # the list is every worker's
    assert first.max_in_flight <= 4 and second.max_in_flight <= 4
    assert len(workers_started()) - len(before) == 2
    requests = first.chat_requests + second.chat_requests
    # Both stages asked through the same two workers. Whether gen-queries' first request comes
    # before infer-persona's last depends on the machine's speed (a fresh-clone run on a slow
    # hour saw it 0.6 s after): a timing, not a behaviour to assert.
    assert any(persona_step(r) for r in requests) and not all(persona_step(r) for r in requests)

    for name in ("personas.jsonl", "filtered.jsonl"):  # no timings in their input: the hashes too
        assert rows(processed / name) == rows(sample_build / name), name
    # A queries row's input_hash covers its persona row, whose created_at is a timing.
    no_hash = TIMINGS | {"input_hash"}
    for name in (
        "queries.jsonl",
        "rejected.jsonl",
        "infer-persona.failures.jsonl",
        "gen-queries.failures.jsonl",
    ):
        assert rows(processed / name, no_hash) == rows(sample_build / name, no_hash), name
    for setting in ("random", "ood"):
        for split in ("train", "test"):
            name = f"splits/{setting}/{split}.jsonl"
            assert rows(processed / name, no_hash) == rows(sample_build / name, no_hash), name
    for folder in ("dataset", "stats"):
        made = sorted(p.relative_to(processed) for p in (processed / folder).rglob("*") if p.is_file())
        assert made == sorted(
            p.relative_to(sample_build) for p in (sample_build / folder).rglob("*") if p.is_file()
        )
        for path in made:
            here, there = (processed / path).read_bytes(), (sample_build / path).read_bytes()
            assert here.replace(bytes(processed), b"@") == there.replace(bytes(sample_build), b"@"), path

    ours = json.loads((processed / ".personaemp" / "run_report.json").read_text())["stages"]
    theirs = json.loads((sample_build / ".personaemp" / "run_report.json").read_text())["stages"]
    for stage in ("infer-persona", "gen-queries"):
        for figure in ("units", "done", "failed"):
            assert ours[stage][figure] == theirs[stage][figure], (stage, figure)
        for figure in ("calls", "requests", "cache_hits", "prompt_tokens", "completion_tokens"):
            assert ours[stage]["totals"][figure] == theirs[stage]["totals"][figure], (stage, figure)
    assert ours["infer-persona"]["totals"]["requests"] + ours["gen-queries"]["totals"]["requests"] == (
        first.count + second.count
    )


def test_a_unit_that_fails_is_a_failure_row_on_ray_as_in_one_process(local_ray, sample_build, tmp_path):
    """One user's every reply is not JSON: on Ray, as in one process, that user ends as a
    failure row (the same row) and every other user as a persona; the job does not fail."""
    filtered = sample_build / "filtered.jsonl"
    broken = json.loads(filtered.read_text().splitlines()[3])["memories"][0]["value"]
    base = order_free_responder()

    def responder(body: dict, number: int):
        if broken in json.dumps(body["messages"], ensure_ascii=False):
            return reply("this is not JSON")
        return base(body, number)

    made = {}
    for executor in ("local", "ray"):
        folder = tmp_path / executor
        folder.mkdir()
        shutil.copy(filtered, folder / "filtered.jsonl")
        with FakeOpenAI(responder=responder) as fake:
            options = RunOptions(
                paths=PathsOptions(input=str(SAMPLE_TASK1), processed=folder),
                # one worker: where the failing unit runs is not the point (2 before: 1 core-s)
                llm=LLMOptions(
                    base_url=[fake.base_url], model="fake", executor=executor, workers=1, max_reasks=0
                ),
                persona=PersonaOptions(),
            )
            from personaemp.registry import STAGES

            result = STAGES["infer-persona"].run(options, Console(quiet=True), full=True)
        made[executor] = folder, result
    (local, _), (on_ray, result) = made["local"], made["ray"]
    failures = rows(on_ray / "infer-persona.failures.jsonl")
    assert [row["kind"] for row in failures] == ["invalid"]
    assert failures == rows(local / "infer-persona.failures.jsonl")
    assert rows(on_ray / "personas.jsonl") == rows(local / "personas.jsonl")
    assert len(rows(on_ray / "personas.jsonl")) == 15
    assert result.report.outcome.failed == 1 and result.report.outcome.done == 15


def test_the_documented_ray_commands_run_as_written(local_ray, tmp_path, monkeypatch):
    """docs/past-one-machine.md's `personaemp run` commands on Ray (the local one, then the
    `ray job submit` entrypoint), word for word but for the endpoints (each of the page's
    URLs a test server), from a folder as a fresh clone has it, shipped personaemp.toml
    included (its three demo users: a small run). Before (issue 51), each stopped at "No such
    option: --executor". Here they join this module's Ray (num_cpus=2: two of their workers
    start, the others wait for a CPU and are let go at the end)."""
    from conftest import REPO, clean_environment
    from test_docs import shell_commands
    from typer.testing import CliRunner

    from personaemp.cli import app

    text = (REPO / "docs" / "past-one-machine.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    commands = [words for block in blocks for _, words in shell_commands(block) if words[1] == "run"]
    # --llm vllm (flag or file) needs GPUs: tests/e2e/test_ray_vllm.py reads what it is given
    on_endpoints = [words for words in commands if "--executor" in words and "--llm" not in words]
    assert len(on_endpoints) == 2 and all("--base-url" in words for words in on_endpoints)
    (tmp_path / "data" / "raw").mkdir(parents=True)
    (tmp_path / "data" / "raw" / "alpsbench_sample").symlink_to(SAMPLE_TASK1.parent)
    shutil.copy(REPO / "personaemp.toml", tmp_path / "personaemp.toml")
    clean_environment(monkeypatch)
    monkeypatch.chdir(tmp_path)
    responder = order_free_responder()
    with FakeOpenAI(responder=responder) as first, FakeOpenAI(responder=responder) as second:
        servers, urls = iter([first, second]), {}  # the page's URLs, a test server each

        def endpoint(url: str) -> str:
            if url not in urls:
                urls[url] = next(servers).base_url
            return urls[url]

        for words in on_endpoints:
            args = [endpoint(word) if word.startswith("http") else word for word in words]
            env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": first.base_url, "NO_COLOR": "1"}
            result = CliRunner().invoke(app, args[1:], env=env)
            assert result.exit_code == 0, (shlex.join(words), result.output)
            assert "Ray (connected before)" in result.output
        assert first.count and second.count  # the first command's two endpoints
    processed = tmp_path / "data" / "processed"
    # The workers' replies are in this folder's cache (the relative --work-dir is the driver's,
    # not the folder this module's Ray was started in: before, the repository's).
    with sqlite3.connect(processed / ".personaemp" / "cache.sqlite") as cache:
        assert cache.execute("select count(*) from replies").fetchone()[0] >= first.count
    personas = rows(processed / "personas.jsonl")
    assert len(personas) == 3  # personaemp.toml's [persona] users
    assert rows(processed / "queries.jsonl") and (processed / "dataset" / "README.md").exists()
