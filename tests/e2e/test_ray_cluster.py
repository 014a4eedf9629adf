"""--executor ray on a simulated cluster (ray.cluster_utils.Cluster: a head of one CPU and a
worker node of one CPU, all on this machine; each holds one of the two workers): the driver
killed and run again, then a node lost mid-gen-queries (last: the node is not started again).
gen-queries on the sample's first 8 eligible personas (16 requests), each answered in 0.2 s;
once the loss is due, the endpoint holds its answers until it has happened, so it lands
mid-stage on any machine (on the 14 eligible personas before, it was a race the stage could win)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, cli_here, order_free_responder
from fake_openai import FakeOpenAI
from rich.console import Console

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.requires_ray

LATENCY = 0.2
LEAN = {"include_log_monitor": False}
USERS = 8  # eligible personas: the loss after 3 or 4 written, at most 2 more in flight


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    ray.shutdown()  # conftest's local Ray, when a test of this process started it before
    # Two CPUs for the two workers: the head's and one node's (a head without CPUs and two
    # nodes before: a raylet more, about 1 core-s). The node is the one a test may lose. No
    # autoscaler monitor and no log monitors (about 1 core-s): nothing here scales, and no
    # driver here reads the workers' logs (log_to_driver=False, as connect() asks).
    head = {"num_cpus": 1, "include_dashboard": False, "no_monitor": True, **LEAN}
    made = Cluster(initialize_head=True, head_node_args=head)
    nodes = [made.add_node(num_cpus=1, **LEAN)]
    made.wait_for_nodes()
    yield made, nodes
    ray.shutdown()
    made.shutdown()


def with_its_node(cluster) -> tuple:
    """The cluster with its worker node: started again if a test before this one lost it (the
    node test runs last, so `make test` starts it once)."""
    made, nodes = cluster
    if not nodes:
        nodes.append(made.add_node(num_cpus=1, **LEAN))  # from the main thread, as Ray wants
        made.wait_for_nodes()
    return made, nodes


def written(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_for(condition, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def some_users(sample_build: Path, folder: Path) -> tuple[Path, list[dict]]:
    """The sample's personas up to its USERS-th eligible one (the ineligible ones among them
    kept: skipped as in the whole file), as a file of their own; and those rows."""
    rows, eligible = [], 0
    for line in (sample_build / "personas.jsonl").read_text().splitlines():
        if eligible == USERS:
            break
        rows.append(json.loads(line))
        eligible += bool(rows[-1]["eligible"] and rows[-1]["traits"])
    assert eligible == USERS
    path = folder / "personas.jsonl"
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path, rows


def held_after(users: int, output: Path, gone: threading.Event):
    """The endpoint's latency: LATENCY, and once `users` rows are written, each answer waits
    until `gone` is set (the loss has happened): the stage cannot end before it."""

    def latency() -> float:
        if written(output) >= users:
            assert gone.wait(120), "the loss did not happen"
        return LATENCY

    return latency


def running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def marks_of(personas: list[dict]) -> dict[str, str]:
    """user -> their first memory, as it reads in a request's JSON (names the user)."""
    return {
        row["user_id"]: json.dumps(row["memories"][0]["value"], ensure_ascii=False)[1:-1] for row in personas
    }


def sample_queries(sample_build: Path, personas: list[dict]) -> dict[str, list]:
    """queries_of the sample's one-process run, for these personas' users."""
    ids = {row["user_id"] for row in personas}
    made = {
        user: queries for user, queries in queries_of(sample_build / "queries.jsonl").items() if user in ids
    }
    assert len(made) == USERS
    return made


def strip(row: dict) -> dict:
    return {
        key: value for key, value in row.items() if key not in ("input_hash", "queries", "rejected_queries")
    }


def queries_of(path: Path) -> dict[str, list]:
    """user -> their queries without timings (created_at) or input hash."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    cut = lambda qs: [{k: v for k, v in q.items() if k != "provenance"} for q in qs]  # noqa: E731
    return {row["user_id"]: cut(row["queries"]) + cut(row["rejected_queries"]) for row in rows}


def test_the_driver_killed_then_run_again_sends_only_the_unfinished_units_requests(
    cluster, sample_build, tmp_path
):
    """The killed driver is a process of its own (SIGKILL); the run again is this process's
    (the same command: the state it resumes from is the output and work folder on disk)."""
    made, _ = with_its_node(cluster)
    personas_path, personas = some_users(sample_build, tmp_path)
    output, work, killed = tmp_path / "queries.jsonl", tmp_path / "work", threading.Event()
    with FakeOpenAI(responder=order_free_responder(), latency=held_after(4, output, killed)) as fake:
        command = [
            sys.executable, "-m", "personaemp", "gen-queries",
            "--input", str(personas_path), "--output", str(output),
            "--base-url", fake.base_url, "--model", "fake", "--concurrency", "2",
            "--executor", "ray", "--workers", "2", "--work-dir", str(work), "--quiet",
        ]  # fmt: skip
        env = {**os.environ, "RAY_ADDRESS": made.address}
        driver = subprocess.Popen(command, env=env, cwd=REPO, stderr=subprocess.PIPE)
        try:
            wait_for(lambda: written(output) >= 4 and fake.in_flight == 2)  # a request in each worker
        finally:
            driver.send_signal(signal.SIGKILL)
            driver.wait()
            killed.set()
        first = fake.count
        done = {json.loads(line)["user_id"] for line in output.read_text().splitlines()}
        try:
            again = cli_here(command[3:], {"RAY_ADDRESS": made.address}, REPO)
        finally:
            ray.shutdown()
        assert again.returncode == 0, again.stderr
        second = fake.chat_requests[first:]
    eligible = sum(bool(p["eligible"] and p["traits"]) for p in personas)
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(rows) == len({row["user_id"] for row in rows}) == eligible == USERS
    assert len(done) < eligible  # the driver died mid-stage
    assert queries_of(output) == sample_queries(sample_build, personas)
    # No request of the re-run is about a user the killed run had written (named by a memory).
    marks = marks_of(personas)
    assert len(set(marks.values())) == len(marks)
    for request in second:
        if request.body is None:  # cut off mid-body by the killed driver's dying workers: never sent whole
            continue
        text = json.dumps(request.body["messages"], ensure_ascii=False)
        assert not {uid for uid in done if marks[uid] in text}
    # At most the requests in flight at the kill (2) are sent twice: the cache answers the rest.
    # Two requests a user (situations with their messages, then the check), and no re-ask here.
    whole = 2 * eligible
    assert first + len(second) <= whole + 2
    print(
        f"killed after {len(done)} of {eligible} users and {first} requests; "
        f"the re-run sent {len(second)} of {whole}"
    )


def test_a_node_lost_mid_gen_queries_has_its_units_redone_and_each_written_once(
    cluster, sample_build, tmp_path
):
    from personaemp.dataset.queries import generate_queries
    from personaemp.llm.settings import LLMSettings

    made, nodes = with_its_node(cluster)
    personas_path, personas = some_users(sample_build, tmp_path)
    ray.init(address=made.address, log_to_driver=False)
    job = ray.get_runtime_context().get_job_id()
    output, lost = tmp_path / "queries.jsonl", threading.Event()
    with FakeOpenAI(responder=order_free_responder(), latency=held_after(3, output, lost)) as fake:
        settings = LLMSettings(
            base_urls=[fake.base_url], model="fake", concurrency=2, executor="ray", workers=2,
            work_dir=tmp_path / "work",
        )  # fmt: skip

        def kill_a_node():  # the head and the node hold one worker each
            try:
                wait_for(lambda: written(output) >= 3 and fake.in_flight == 2)  # one request each
                (pid,) = [  # this run's worker on the node (an earlier test's may not be DEAD yet)
                    actor["Pid"]
                    for actor in ray._private.state.actors().values()
                    if (actor["JobID"], actor["Address"]["NodeID"], actor["State"])
                    == (job, nodes[-1].node_id, "ALIVE")
                ]
                made.remove_node(nodes.pop(), allow_graceful=False)
                killed.append(written(output))
                wait_for(lambda: not running(pid))  # the answer to its request never reaches it
            finally:
                lost.set()

        killed: list[int] = []
        killer = threading.Thread(target=kill_a_node)
        killer.start()
        report = generate_queries(personas_path, output, settings, console=Console(quiet=True)).report
        killer.join()
    ray.shutdown()
    eligible = sum(bool(p["eligible"] and p["traits"]) for p in personas)
    assert eligible == USERS
    assert killed and killed[0] < eligible  # the node died mid-stage
    assert fake.count > 2 * eligible  # with a request in flight: sent again for its unit
    assert report.outcome.done == eligible and report.outcome.failed == 0
    users = [json.loads(line)["user_id"] for line in output.read_text().splitlines()]
    assert len(users) == len(set(users)) == eligible
    assert queries_of(output) == sample_queries(sample_build, personas)
    print(f"node killed after {killed[0]} of {eligible} users; requests {fake.count}")
