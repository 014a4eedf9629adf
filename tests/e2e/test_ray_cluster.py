"""--executor ray on a simulated cluster (ray.cluster_utils.Cluster: a head without CPUs and
worker nodes of one CPU, all on this machine): a node lost mid-gen-queries, and the driver
killed and run again. gen-queries on the sample's 15 eligible personas (45 requests), each
request answered in 0.2 s."""

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
from conftest import REPO, order_free_responder
from fake_openai import FakeOpenAI
from rich.console import Console

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.requires_ray

LATENCY = 0.2


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    ray.shutdown()  # conftest's local Ray, when a test of this process started it before
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [made.add_node(num_cpus=1) for _ in range(2)]
    made.wait_for_nodes()
    yield made, nodes
    ray.shutdown()
    made.shutdown()


def written(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def wait_for(condition, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def strip(row: dict) -> dict:
    return {
        key: value for key, value in row.items() if key not in ("input_hash", "queries", "rejected_queries")
    }


def queries_of(path: Path) -> dict[str, list]:
    """user -> their queries without timings (created_at) or input hash."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    cut = lambda qs: [{k: v for k, v in q.items() if k != "provenance"} for q in qs]  # noqa: E731
    return {row["user_id"]: cut(row["queries"]) + cut(row["rejected_queries"]) for row in rows}


def test_a_node_lost_mid_gen_queries_has_its_units_redone_and_each_written_once(
    cluster, sample_build, tmp_path
):
    from personaemp.dataset.queries import generate_queries
    from personaemp.llm.settings import LLMSettings

    made, nodes = cluster
    ray.init(address=made.address, log_to_driver=False)
    output = tmp_path / "queries.jsonl"
    with FakeOpenAI(responder=order_free_responder(), latency=lambda: LATENCY) as fake:
        settings = LLMSettings(
            base_urls=[fake.base_url], model="fake", concurrency=2, executor="ray", workers=2,
            work_dir=tmp_path / "work",
        )  # fmt: skip

        def kill_a_node():  # each node holds one actor (the head has no CPU)
            wait_for(lambda: written(output) >= 3)
            made.remove_node(nodes[0], allow_graceful=False)
            killed.append(written(output))

        killed: list[int] = []
        killer = threading.Thread(target=kill_a_node)
        killer.start()
        report = generate_queries(
            sample_build / "personas.jsonl", output, settings, console=Console(quiet=True)
        ).report
        killer.join()
    ray.shutdown()
    nodes[0] = made.add_node(num_cpus=1)  # for the next test (here: Ray starts nodes from the main thread)
    personas = [json.loads(line) for line in (sample_build / "personas.jsonl").read_text().splitlines()]
    eligible = sum(bool(p["eligible"] and p["traits"]) for p in personas)
    assert eligible >= 10
    assert killed and killed[0] < eligible  # the node died mid-stage
    assert report.outcome.done == eligible and report.outcome.failed == 0
    users = [json.loads(line)["user_id"] for line in output.read_text().splitlines()]
    assert len(users) == len(set(users)) == eligible
    assert queries_of(output) == queries_of(sample_build / "queries.jsonl")
    print(f"node killed after {killed[0]} of {eligible} users; requests {fake.count}")


def test_the_driver_killed_then_run_again_sends_only_the_unfinished_units_requests(
    cluster, sample_build, tmp_path
):
    made, _ = cluster
    output, work = tmp_path / "queries.jsonl", tmp_path / "work"
    with FakeOpenAI(responder=order_free_responder(), latency=lambda: LATENCY) as fake:
        command = [
            sys.executable, "-m", "personaemp", "gen-queries",
            "--input", str(sample_build / "personas.jsonl"), "--output", str(output),
            "--base-url", fake.base_url, "--model", "fake", "--concurrency", "2",
            "--executor", "ray", "--workers", "2", "--work-dir", str(work), "--quiet",
        ]  # fmt: skip
        env = {**os.environ, "RAY_ADDRESS": made.address}
        driver = subprocess.Popen(command, env=env, cwd=REPO, stderr=subprocess.PIPE)
        wait_for(lambda: written(output) >= 4)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        first = fake.count
        done = {json.loads(line)["user_id"] for line in output.read_text().splitlines()}
        again = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr
        second = fake.chat_requests[first:]
    personas = [json.loads(line) for line in (sample_build / "personas.jsonl").read_text().splitlines()]
    eligible = sum(bool(p["eligible"] and p["traits"]) for p in personas)
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(rows) == len({row["user_id"] for row in rows}) == eligible >= 10
    assert queries_of(output) == queries_of(sample_build / "queries.jsonl")
    # No request of the re-run is about a user the killed run had written (named by a memory).
    marks = {
        row["user_id"]: json.dumps(row["memories"][0]["value"], ensure_ascii=False)[1:-1] for row in personas
    }
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
