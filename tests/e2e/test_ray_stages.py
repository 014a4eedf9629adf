"""Every LLM stage under `--executor ray` writes what one process writes (`run`,
infer-persona and gen-queries: test_ray.py).

Each stage runs twice against the test server, once in this process (executor local) and
once on two workers, each run in its own folder with its own reply cache: the rows, the
failures file (one unit of each stage is made to fail) and the run report's counts must be
the same, and the Ray run must have started its two UnitWorker actors. The workers are the
pool double's (tests/ray_double.py: the stage's work and every call through cloudpickle to
two in-process UnitWorkers, the routing WorkerPool's own), except for the supporter test,
which runs on the local Ray (as test_ray.py): a second engine opened on a real worker.
The models are the scripted responders of the stages' own tests, order-free: a reply
depends on the request alone, never on the order the workers send them in.

These inputs are small: a worker starts in about a second, by which time the first one up
would hold every unit. So the runs go at --concurrency 2 (four units in flight) and the Ray
run's first answer waits until both workers are up: the later units go to the second one,
and a user's units can land on two workers (what `shared_per` is for)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SAMPLE_TASK1, order_free_responder, write_jsonl
from fake_openai import FakeOpenAI, empty, invalid_json_content, reply
from ray_double import PoolDouble
from rich.console import Console
from test_dialogues import NEED, SUPPORTER, Script, good_turn, user_row, write_queries
from test_evaluation import query_id_in, schema_properties
from test_ray import rows, workers_started
from test_sessions import Judged
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.dialogues import DialogueOptions, generate_dialogues
from personaemp.dataset.memories import extract_memories
from personaemp.evaluation.criteria import write_criteria
from personaemp.evaluation.evaluate import evaluate
from personaemp.evaluation.respond import write_responses
from personaemp.instruments.judges import BYSTANDER_ASPECTS, JudgeOptions
from personaemp.llm.settings import LLMSettings
from personaemp.records import DIMENSIONS

ray = pytest.importorskip("ray")

QUIET = Console(quiet=True)
EXECUTORS = ("local", "ray")
COUNTS = ("units", "done", "failed", "failures_by_kind")
TOTALS = ("calls", "requests", "cache_hits", "prompt_tokens", "completion_tokens", "reasks")
CONCURRENCY = 2  # two workers of one request each; four units in flight (llm.stage._window)


def workers_up() -> int:
    actors = ray._private.state.actors().values()
    return sum(1 for a in actors if "UnitWorker" in a["ActorClassName"] and a["State"] == "ALIVE")


def once_both_workers_are_up(responder: Callable, pool: PoolDouble | None = None) -> Callable:
    """`responder`, its first answer held until the Ray run's two workers are up."""
    lock, up = threading.Lock(), threading.Event()
    count = pool.up if pool is not None else workers_up

    def answer(body: dict, number: int):
        with lock:
            deadline = time.monotonic() + 60
            while not up.is_set() and count() < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            if not up.is_set():
                time.sleep(0.3)  # the second worker's ready call back at the driver
                up.set()
        return responder(body, number)

    return answer


def settings(url: str, work: Path, executor: str) -> LLMSettings:
    return LLMSettings(
        base_urls=[url], model="fake", work_dir=work, api_key="sk-test", executor=executor, workers=2,
        concurrency=CONCURRENCY,
    )  # fmt: skip


def run_twice(
    tmp_path: Path,
    responder: Callable,
    stage: Callable[[Path, LLMSettings], None],
    pool: PoolDouble | None = None,
) -> dict:
    """`stage(folder, settings)` once per executor, each in its own folder (its own reply
    cache); per executor: (folder, the server, UnitWorker actors started). `pool`: the Ray
    run's workers are the pool double's (tests/ray_double.py), else the local Ray's."""
    started = pool.started if pool is not None else lambda: len(workers_started())
    made = {}
    for executor in EXECUTORS:
        folder = tmp_path / executor
        folder.mkdir()
        before = started()
        answer = once_both_workers_are_up(responder, pool) if executor == "ray" else responder
        with FakeOpenAI(responder=answer) as server:
            stage(folder, settings(server.base_url, folder / "work", executor))
        assert server.errors == []
        made[executor] = folder, server, started() - before
    return made


def assert_same(made: dict, stage: str, outputs: list[str], failures: str, failed: int = 1) -> dict:
    """The two runs wrote the same rows and the same `failed` failure rows, and report the
    same counts; the Ray run started its two workers. Returns the Ray run's report entry."""
    (local, first, none), (on_ray, second, started) = made["local"], made["ray"]
    assert none == 0 and started == 2, "the local run started no worker, the Ray run its two"
    for name in outputs:
        assert rows(on_ray / name) == rows(local / name), name
        assert rows(on_ray / name), f"{name}: nothing written"
    assert rows(on_ray / failures) == rows(local / failures)
    assert len(rows(on_ray / failures)) == failed

    def entry(folder: Path) -> dict:
        return json.loads((folder / "work" / "run_report.json").read_text())["stages"][stage]

    ours, theirs = entry(on_ray), entry(local)
    for figure in COUNTS:
        assert ours[figure] == theirs[figure], figure
    for figure in TOTALS:
        assert ours["totals"][figure] == theirs["totals"][figure], figure
    assert ours["totals"]["requests"] == second.count == first.count
    assert ours["failed"] == failed
    return ours


# --- extract-memories ----------------------------------------------------------------------------


def test_extract_memories_on_ray_writes_what_one_process_writes(pool_double, tmp_path):
    """The shipped sample's 48 users, one of whose every reply is not JSON."""
    broken = json.loads((SAMPLE_TASK1 / "model_input.jsonl").read_text().splitlines()[5])
    marker = broken["input"]["sessions"][0]["turns"][0]["text"][:60]
    base = order_free_responder()

    def responder(body: dict, number: int):
        if marker in json.dumps(body["messages"], ensure_ascii=False):
            return reply("this is not JSON")
        return base(body, number)

    def stage(folder: Path, llm: LLMSettings) -> None:
        extract_memories(SAMPLE_TASK1, folder / "memories.jsonl", llm, console=QUIET)

    made = run_twice(tmp_path, responder, stage, pool_double)
    outputs = ["memories.jsonl", "conversations.jsonl"]
    assert assert_same(made, "extract-memories", outputs, "extract-memories.failures.jsonl")["units"] == 48


# --- gen-dialogues and evaluate --dialogues --------------------------------------------------------


def leaking(step: str, body: dict, seen: int):
    """u2's simulated user states its hidden need every turn: its dialogues fail."""
    if step == "simulate" and "ward u2" in json.dumps(body["messages"]):
        return {**good_turn(body), "text": f"I need {NEED}"}
    return None


def dialogue_model(script: Script) -> Callable:
    """`script`, with a summary of its own for each user: test_dialogues' supporter answers
    every user's summary alike, which makes the users' supporter requests the same, and
    whether the second is sent or answered by the cache depends on timing, not on Ray."""

    def answer(body: dict, number: int):
        text = json.dumps(body["messages"])
        if "write a short summary of who this user is" in text:
            return reply(f"A nurse at ward {re.search(r'ward (u[0-9]+)', text).group(1)}, tired.")
        return script(body, number)

    return answer


@pytest.fixture(scope="module")
def dialogue_splits(tmp_path_factory) -> Path:
    """A split folder whose random/test part holds six users, two of them with two queries."""
    splits = tmp_path_factory.mktemp("dialogue_splits") / "splits"
    (splits / "random").mkdir(parents=True)
    users = [user_row(f"u{n}", queries=2 if n in (1, 4) else 1) for n in range(6)]
    write_queries(splits / "random" / "test.jsonl", users)
    return splits


@pytest.mark.parametrize("context", ["memory", "memory-summary"])
def test_gen_dialogues_on_ray_writes_what_one_process_writes(pool_double, tmp_path, dialogue_splits, context):
    """memory-summary: one summary per user, for both of u1's and u4's dialogues, on Ray too."""
    queries = dialogue_splits / "random" / "test.jsonl"
    options = DialogueOptions(turn_attempts=2, context=context)

    def stage(folder: Path, llm: LLMSettings) -> None:
        generate_dialogues(queries, folder / "dialogues.jsonl", llm, options=options)

    made = run_twice(tmp_path, dialogue_model(Script(bad=leaking)), stage, pool_double)
    report = assert_same(made, "gen-dialogues", ["dialogues.jsonl"], "gen-dialogues.failures.jsonl")
    assert report["units"] == 8
    assert rows(made["ray"][0] / "gen-dialogues.failures.jsonl")[0]["kind"] == "simulator_rules"


def test_gen_dialogues_with_its_own_supporter_endpoint_on_ray(local_ray, tmp_path, dialogue_splits):
    """--supporter-model/--supporter-base-url: each Ray worker opens its own supporter engine
    (the one this process opened does not travel), and asks what one process asks; the run
    report's supporter note counts the workers' requests and tokens, as one process's does."""
    queries = dialogue_splits / "random" / "test.jsonl"
    supporters = {}

    def stage(folder: Path, llm: LLMSettings) -> None:
        with FakeOpenAI(responder=Script()) as supporter:
            generate_dialogues(
                queries, folder / "dialogues.jsonl", llm, options=DialogueOptions(turn_attempts=2),
                supporter_model="policy-7b", supporter_base_url=[supporter.base_url],
            )  # fmt: skip
        supporters[llm.executor] = supporter

    made = run_twice(tmp_path, Script(bad=leaking), stage)
    report = assert_same(made, "gen-dialogues", ["dialogues.jsonl"], "gen-dialogues.failures.jsonl")
    assert supporters["ray"].count == supporters["local"].count > 0
    local = json.loads((made["local"][0] / "work" / "run_report.json").read_text())["stages"]
    note = report["notes"]["supporter"]
    assert note == local["gen-dialogues"]["notes"]["supporter"]
    assert note["requests"] == supporters["ray"].count and note["completion_tokens"] > 0
    assert note["text"] == (
        f"supporter policy-7b: {note['requests']} requests, "
        f"{note['prompt_tokens']} prompt and {note['completion_tokens']} completion tokens"
    )
    assert {r.body["model"] for r in supporters["ray"].chat_requests} == {"policy-7b"}
    assert {row["supporter_model"] for row in rows(made["ray"][0] / "dialogues.jsonl")} == {"policy-7b"}


def test_the_supporter_note_counts_what_failed_dialogues_sent(tmp_path, dialogue_splits):
    """BUG: the note was filled after a dialogue that ended well, so what a failed dialogue
    had asked its own supporter endpoint went uncounted (every dialogue failing here: the
    note said no more than "(its own endpoint)")."""

    def leaks_after_the_supporter(step: str, body: dict, seen: int):
        if step == "simulate" and SUPPORTER in json.dumps(body["messages"], ensure_ascii=False):
            return {**good_turn(body), "text": f"I need {NEED}"}
        return None

    simulator = Script(bad=leaks_after_the_supporter)
    with FakeOpenAI(responder=simulator) as server, FakeOpenAI(responder=Script()) as supporter:
        generate_dialogues(
            dialogue_splits / "random" / "test.jsonl", tmp_path / "dialogues.jsonl",
            settings(server.base_url, tmp_path / "work", "local"), options=DialogueOptions(turn_attempts=2),
            supporter_model="policy-7b", supporter_base_url=[supporter.base_url],
        )  # fmt: skip
    report = json.loads((tmp_path / "work" / "run_report.json").read_text())["stages"]["gen-dialogues"]
    assert (report["done"], report["failed"]) == (0, 8)
    assert report["notes"]["supporter"]["requests"] == supporter.count > 0


@pytest.fixture(scope="module")
def dialogues(tmp_path_factory, dialogue_splits) -> Path:
    """gen-dialogues' output for the six users (one process)."""
    folder = tmp_path_factory.mktemp("dialogues")
    with FakeOpenAI(responder=Script()) as server:
        generate_dialogues(
            dialogue_splits / "random" / "test.jsonl", folder / "policy-a.jsonl",
            settings(server.base_url, folder / "work", "local"),
        )  # fmt: skip
    return folder / "policy-a.jsonl"


def test_evaluate_dialogues_from_the_cli_on_ray_scores_what_one_process_scores(
    pool_double, tmp_path, dialogue_splits, dialogues
):
    """`evaluate --dialogues ... --executor ray --workers 2` (the command and its flags); the
    judge never answers u1's two sessions in JSON (--unreadable fail: they fail)."""
    judged = Judged(score=4.0)

    def responder(body: dict, number: int):
        if "side of a conversation" in json.dumps(body["messages"]) and "ward u1" in json.dumps(body):
            return invalid_json_content()
        return judged(body, number)

    def stage(folder: Path, llm: LLMSettings) -> None:
        result = CliRunner().invoke(app, [
            "evaluate", "--splits", str(dialogue_splits), "--dialogues", str(dialogues),
            "-o", str(folder / "sessions.json"), "--base-url", llm.base_urls[0], "--model", "judge-x",
            "--work-dir", str(llm.work_dir), "--unreadable", "fail", "--concurrency", str(CONCURRENCY),
            "--executor", llm.executor, "--workers", "2",
        ], env={"OPENAI_API_KEY": "sk-test"})  # fmt: skip
        assert result.exit_code == 0, result.output

    made = run_twice(tmp_path, responder, stage, pool_double)
    report = assert_same(
        made, "evaluate-dialogues", ["sessions.scores.jsonl"], "sessions.failures.jsonl", failed=2
    )
    assert report["units"] == 8
    evaluations = [json.loads((made[e][0] / "sessions.json").read_text()) for e in EXECUTORS]
    for evaluation in evaluations:
        evaluation.pop("scores_file")
    assert evaluations[0] == evaluations[1]


# --- criteria, respond, evaluate ---------------------------------------------------------------------

QUERIES = {"u1": 3, "u2": 1, "u3": 2, "u4": 1, "u5": 2, "u6": 1}  # ten queries of six users
TRAITS = ("openness", "conscientiousness", "extraversion", "agreeableness", "neuroticism")


def split_user(user: str, queries: int) -> dict:
    """test_evaluation's user row: memories, Big Five levels and queries tagged [u1-q1]."""
    level = {"level": "medium", "evidence": ["m1"], "rationale": "r", "thin_evidence": False}
    return {
        "user_id": user, "eligible": True, "language": "en",
        "profile": f"Profile of {user}: cares about family, anxious before exams.",
        "memories": [
            {"memory_id": "m1", "label": "States_Experiences", "value": f"{user} failed a driving test"},
            {"memory_id": "m2", "label": "Social_Relationships", "value": f"{user} has a younger sister"},
        ],
        "big_five": dict.fromkeys(TRAITS, level),
        "queries": [
            {"query_id": f"{user}-q{n}", "category": "ES",
             "query": f"[{user}-q{n}] I failed my driving test again and feel awful.",
             "situation": {"topic": "exam", "text": "They just failed a test.", "memory_ids": ["m1"]},
             "memory_ids": ["m1"]}
            for n in range(1, queries + 1)
        ],
    }  # fmt: skip


def judge(body: dict, number: int):
    """test_evaluation.judge's models, a score drawn from the request: the policy answers in
    text (a summary too), the criteria writer gives four criteria, the judges score."""
    text = json.dumps(body["messages"])
    if "response_format" not in body and "Answer in json" not in text:
        return f"I'm sorry to hear that ({query_id_in(body)}). You will pass next time."
    properties = schema_properties(body)
    if "score" in properties:
        return {"analysis": "read it", "score": 1 + int(hashlib.sha256(text.encode()).hexdigest(), 16) % 5}
    if "criteria" in properties:
        return {"criteria": [{"name": f"c{i}", "weight": i + 1, "description": "d"} for i in range(4)]}
    if "content_effectiveness" in properties:
        return dict.fromkeys(BYSTANDER_ASPECTS, 16)
    raise AssertionError(f"unexpected request: {text[:200]}")


def breaking(query_id: str, answer: Callable[[], object]) -> Callable:
    """`judge`, with `answer()` for every request about `query_id`."""
    return lambda body, number: answer() if query_id_in(body) == query_id else judge(body, number)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The queries, their split, a criteria file and one system's responses."""
    folder = tmp_path_factory.mktemp("workspace")
    users = [split_user(user, count) for user, count in QUERIES.items()]
    write_jsonl(folder / "queries.jsonl", users)
    write_jsonl(folder / "splits" / "random" / "test.jsonl", users)
    ids = [query["query_id"] for user in users for query in user["queries"]]
    item = {"name": "n", "weight": 25.0, "description": "d"}
    write_jsonl(
        folder / "criteria.jsonl",
        [{"query_id": q, "criteria": {d: [item] * 4 for d in DIMENSIONS}} for q in ids],
    )
    write_jsonl(folder / "full.jsonl", [{"query_id": q, "response": f"reply {q}"} for q in ids])
    return folder


def test_criteria_on_ray_writes_what_one_process_writes(pool_double, tmp_path, workspace):
    def stage(folder: Path, llm: LLMSettings) -> None:
        write_criteria(workspace / "queries.jsonl", folder / "criteria.jsonl", llm, console=QUIET)

    made = run_twice(tmp_path, breaking("u2-q1", invalid_json_content), stage, pool_double)
    assert assert_same(made, "criteria", ["criteria.jsonl"], "criteria.failures.jsonl")["units"] == 10


@pytest.mark.parametrize("context", ["memory", "memory-summary"])
def test_respond_on_ray_writes_what_one_process_writes(pool_double, tmp_path, workspace, context):
    """memory-summary: one summary per user for all their queries, on Ray too (shared_per)."""

    def stage(folder: Path, llm: LLMSettings) -> None:
        write_responses(workspace / "splits", folder / "responses.jsonl", llm, context=context, console=QUIET)

    made = run_twice(tmp_path, breaking("u3-q1", empty), stage, pool_double)
    report = assert_same(made, "respond", ["responses.jsonl"], "responses.failures.jsonl")
    assert report["units"] == 10
    assert report["totals"]["requests"] == (10 + 2 + (6 if context == "memory-summary" else 0))  # + re-asks


def test_evaluate_on_ray_scores_what_one_process_scores(pool_double, tmp_path, workspace):
    """Two systems (one with a query missing and one empty) and the bystander."""
    gaps = write_jsonl(tmp_path / "gaps.jsonl", [
        {"query_id": "u1-q2", "response": "  "}, {"query_id": "u2-q1", "response": "fine"},
        {"query_id": "u3-q1", "response": "ok"}, {"query_id": "u5-q2", "response": "I see."},
    ])  # fmt: skip

    def stage(folder: Path, llm: LLMSettings) -> None:
        evaluate(
            workspace / "splits", [workspace / "full.jsonl", gaps], folder / "report.json", llm,
            criteria_file=workspace / "criteria.jsonl", options=JudgeOptions(bystander=True, missing="floor"),
            console=QUIET,
        )  # fmt: skip

    made = run_twice(tmp_path, breaking("u3-q1", invalid_json_content), stage, pool_double)
    report = assert_same(made, "evaluate", ["report.scores.jsonl"], "report.failures.jsonl", failed=2)
    assert report["units"] == 20
    evaluations = [json.loads((made[e][0] / "report.json").read_text()) for e in EXECUTORS]
    for evaluation in evaluations:
        evaluation.pop("scores_file")
    assert evaluations[0] == evaluations[1]
