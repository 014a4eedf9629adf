"""Shared fixtures: builders for AlpsBench-shaped files written under tmp_path.

Every fixture is real data on disk (task1 JSONL pairs, raw-export JSON/JSONL), built from
the small helpers below so a test states only what it cares about.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_openai import order_free_responder  # noqa: F401 - the tests import it from here

REPO = Path(__file__).resolve().parent.parent
SAMPLE_TASK1 = REPO / "data" / "raw" / "alpsbench_sample" / "task1"
SAMPLE_USERS = 48
SAMPLE_KEPT = 16


def copy_sample(source: Path, target: Path, copies: int, *, mark: bool = False) -> Path:
    """An AlpsBench task1 folder `copies` times under new ids (bench/scale/run_bench.py, the scale
    tests). `mark`: each later copy's first memory changed too, so the reply cache cannot
    answer a copy with the first one's replies."""
    target.mkdir(parents=True)
    for name in ("model_input.jsonl", "reference_output.jsonl"):
        with (target / name).open("w", encoding="utf-8") as out:
            for copy in range(copies):
                for line in (source / name).read_text(encoding="utf-8").splitlines():
                    row = json.loads(line)
                    row["benchmark_id"] = f"{row['benchmark_id']}-c{copy}"
                    if mark and copy and row.get("gold", {}).get("memory_items"):
                        row["gold"]["memory_items"][0]["value"] += f" (copy {copy})"
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
    return target


# --- the order `make test` runs the tests in -------------------------------------------------

DURATIONS = "personaemp/durations"  # pytest's cache: each test's seconds in the last run
HEAVY = 5.0  # seconds: a test (or a module sharing a module fixture) this long starts its worker's queue
GUESS = {"embedded": 60.0, "slow": 10.0, "local_ray": 10.0}  # seconds, for a test the cache does not know


class _Seconds:
    """Each test's seconds (setup + call + teardown), heard where the results come in (the
    xdist controller, or the one process without xdist), kept in pytest's cache
    (.pytest_cache/) for the next run's order; a test not run this time keeps its figure."""

    def __init__(self, config) -> None:
        self.config, self.seconds = config, {}

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        if getattr(self.config, "cache", None) is not None and self.seconds:
            known = self.config.cache.get(DURATIONS, {})
            known.update({nodeid: round(seconds, 2) for nodeid, seconds in self.seconds.items()})
            self.config.cache.set(DURATIONS, known)


# --- the shell's environment never reaches a test -----------------------------------------

# Variables a developer's shell may carry that would send a test's requests (and a key) to a
# real endpoint, or change what an option means: cleared in every pytest process (the xdist
# controller, each worker, and through them every CLI subprocess a test starts) before any
# test, fixture or collection runs. A test that needs one sets it with monkeypatch.
FOREIGN_NAMES = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_ORG_ID",
    "OPENAI_PROJECT_ID",
    "OPENAI_LOG",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_ENDPOINT",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "RAY_ADDRESS",
    # a proxy would carry the tests' 127.0.0.1 requests to another machine
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
)
FOREIGN_PREFIXES = ("PERSONAEMP_", "_PERSONAEMP_")
# PERSONAEMP_* variables that name this machine's things, not the run's: where the joined model
# files are kept (llm/models.py; clearing it would fetch the embedded model again) and the
# browser of the review tests (tests/browser.py). Neither changes an option or an address.
MACHINE_NAMES = ("PERSONAEMP_MODEL_CACHE", "PERSONAEMP_CHROMIUM")
# Pinned for every test: one llama.cpp thread (`make test` runs three workers on two cores: a
# two-thread llama.cpp server next to another worker waits on its slower thread every token;
# measured: the suite 188 s vs 97 s on two workers), and no proxy for the test servers.
LOOPBACK = "127.0.0.1,localhost"
PINNED = {"PERSONAEMP_LOCAL_THREADS": "1", "NO_PROXY": LOOPBACK, "no_proxy": LOOPBACK}


def foreign_environment(environ=os.environ) -> list[str]:
    """The names of `environ` a test must not inherit (see FOREIGN_NAMES); the PINNED ones are
    set instead."""
    return sorted(
        name
        for name in environ
        if name in FOREIGN_NAMES
        or (name.startswith(FOREIGN_PREFIXES) and name not in MACHINE_NAMES and name not in PINNED)
    )


def isolate_environment(environ=os.environ) -> None:
    for name in foreign_environment(environ):
        del environ[name]
    environ.update(PINNED)


def pytest_configure(config):
    isolate_environment()
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Seconds(config), "personaemp-seconds")


def _unit(item) -> str:
    """The tests that move together: those sharing the same module fixtures (test_ray_cluster's
    cluster: built once, not on two workers at once), else each test alone."""
    info = getattr(item, "_fixtureinfo", None)
    chains = info.name2fixturedefs.items() if info is not None else ()
    shared = sorted(name for name, chain in chains if chain and chain[-1].scope == "module")
    return f"{item.nodeid.split('::')[0]}::{shared}" if shared else item.nodeid


@pytest.hookimpl(trylast=True)  # after -m / -k deselect: the thirds are of what runs
def pytest_collection_modifyitems(config, items):
    """`make test` runs pytest -n 3 --dist worksteal on 2 cores. worksteal hands each worker a
    contiguous third of this list, then an idle worker takes the back half of a busy one's
    queue. The long tests (their seconds in the last run, pytest's cache; else a guess from
    their marks) are spread over the three thirds, longest first (LPT), each at the head of
    its third, so no worker is left with a long test at the end; the rest keep their order
    and fill the thirds. The tests on the local Ray count as long (each worker starts its own
    Ray: its Ray tests run one after the other, first). Before: all 8 embedded tests headed
    the first third and ran one after the other on one worker (about 300 of the run's 454 s)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers < 2 or config.getoption("dist", None) != "worksteal":
        return
    known = config.cache.get(DURATIONS, {}) if getattr(config, "cache", None) is not None else {}

    def seconds(item) -> float:
        if item.nodeid in known:
            return known[item.nodeid]
        marks = [GUESS[m.name] for m in item.iter_markers() if m.name in GUESS]
        return max([*marks, GUESS["local_ray"] if _on_local_ray(item) else 0.1])

    units: dict[str, list] = {}
    for item in items:
        units.setdefault(_unit(item), []).append(item)
    heavy = sorted(
        (unit for unit in units.values() if sum(map(seconds, unit)) >= HEAVY or _on_local_ray(unit[0])),
        key=lambda unit: -sum(map(seconds, unit)),
    )
    sizes, left = [], len(items)
    for worker in range(workers):  # worksteal's first split: len(pending) // nodes remaining
        sizes.append(left // (workers - worker))
        left -= sizes[-1]
    queues: list[list] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for unit in heavy:
        roomy = [w for w in range(workers) if len(queues[w]) + len(unit) <= sizes[w]]
        if not roomy:  # more tests than a third holds (a small selection): they keep their order
            continue
        worker = min(roomy, key=lambda w: loads[w])
        queues[worker].extend(unit)
        loads[worker] += sum(map(seconds, unit))
    for queue in queues:  # a worker's tests on the local Ray one after the other, then Ray shut down
        queue.sort(key=lambda item: not _on_local_ray(item))
        ray_tests = [item for item in queue if _on_local_ray(item)]
        if ray_tests:
            ray_tests[-1].stash[_LAST_ON_RAY] = True
    placed = {id(item) for queue in queues for item in queue}
    rest = iter([item for item in items if id(item) not in placed])
    for worker, queue in enumerate(queues):
        queue.extend(next(rest) for _ in range(sizes[worker] - len(queue)))
    items[:] = [item for queue in queues for item in queue]


_LAST_ON_RAY = pytest.StashKey[bool]()


def _on_local_ray(item) -> bool:
    return "local_ray" in item.fixturenames


def pytest_runtest_teardown(item, nextitem):
    """The local Ray of `local_ray` is shut down after the last test of this worker's queue
    that needs it (see pytest_collection_modifyitems), not kept to the session's end: an idle
    Ray costs about 6 % of a core after a Ray Data job (1.9 s of CPU in 30 s, measured), and
    the worker has minutes of other tests left. A later test that needs it starts it again."""
    if item.stash.get(_LAST_ON_RAY, False) and (nextitem is None or not _on_local_ray(nextitem)):
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()


@pytest.fixture(scope="session", autouse=True)
def _isolated_hf_cache(tmp_path_factory):
    """Keep `datasets` (imported lazily by the hf reader) out of the user's ~/.cache."""
    home = tmp_path_factory.mktemp("hf_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(home))
        patch.setenv("HF_DATASETS_CACHE", str(home / "datasets"))
        patch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        yield


@pytest.fixture(autouse=True)
def _plain_console(monkeypatch):
    """Rich must print plain text so CLI output can be compared."""
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("COLUMNS", "200")


# --- generic file helpers ---------------------------------------------------------------


def personaemp_environment() -> tuple[str, ...]:
    """The variables a test must not inherit from the shell: every option's (options.py), the
    endpoint's and the key. (pytest_configure has cleared them from the process already; this
    clears what an earlier step of the same test set.)"""
    from personaemp.options import SECTIONS, specs

    declared = {option.opt.env for section in SECTIONS for option in specs(section) if option.opt.env}
    return ("OPENAI_BASE_URL", "OPENAI_API_KEY", "HF_TOKEN", *sorted(declared))


def clean_environment(monkeypatch) -> None:
    for name in personaemp_environment():
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _no_foreign_environment(monkeypatch):
    """Each test starts from the isolated environment, whatever a session or module fixture
    or an earlier test in this process left in os.environ without monkeypatch."""
    for name in foreign_environment():
        monkeypatch.delenv(name)
    for name, value in PINNED.items():
        monkeypatch.setenv(name, value)


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """One JSON value per line; a `str` or `bytes` row is written verbatim (for broken lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        for row in rows:
            if isinstance(row, bytes):
                handle.write(row.rstrip(b"\n") + b"\n")
            elif isinstance(row, str):
                handle.write(row.rstrip("\n").encode("utf-8") + b"\n")
            else:
                handle.write(json.dumps(row, ensure_ascii=False).encode("utf-8") + b"\n")
    return path


JSON_STYLES = {
    "compact": {"separators": (",", ":")},
    "default": {},  # json.dumps default: ", " and ": "
    "indented": {"indent": 2},
}


def write_json(path: Path, value: Any, style: str = "compact") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, ensure_ascii=False, **JSON_STYLES[style]), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# --- AlpsBench shapes -------------------------------------------------------------------


def turn(role: str, text: str, index: int | None = None) -> dict:
    row = {"role": role, "text": text}
    if index is not None:
        row["utterance_index"] = index
    return row


def session(session_id: str, *texts: str) -> dict:
    """A session whose turns alternate user / assistant, starting with the user."""
    roles = ("user", "assistant")
    return {
        "session_id": session_id,
        "turns": [turn(roles[i % 2], text, i) for i, text in enumerate(texts)],
    }


def memory_item(
    memory_id: str | None = "m1",
    label: str = "Social_Relationships/Family",
    value: str = "Has a difficult relationship with their sister",
    *,
    label_suggestion: str | None = None,
    evidence: Any = "My sister and I argued again",
    confidence: float = 0.9,
    **extra: Any,
) -> dict:
    item = {
        "type": "direct",
        "label": label,
        "label_suggestion": label_suggestion,
        "value": value,
        "reasoning": "stated by the user",
        "evidence": {"session_id": "s1", "utterance_index": 0, "text": evidence},
        "confidence": confidence,
        "time_scope": "long_term",
        "emotion": None,
        "preference_attitude": None,
        "updated_at": "2023-11-17T23:28:24+00:00",
    }
    if memory_id is not None:
        item["memory_id"] = memory_id
    item.update(extra)
    return item


FLAG = " [ERROR: Unsupported by evidence]"
EMOTIONAL_TEXT = "My sister and I argued again and I feel awful about it, I do not know what to do."


def task1_input(
    benchmark_id: str,
    *,
    user_id: str | None = None,
    sessions: Any = None,
    dialogue: Any = None,
    **extra: Any,
) -> dict:
    if sessions is None and dialogue is None:
        sessions = [session("s1", EMOTIONAL_TEXT, "That sounds hard.")]
    row = {
        "benchmark_id": benchmark_id,
        "task": "task1",
        "session_id": benchmark_id.split("__")[0],
        "canonical_id": benchmark_id.split("__")[-1],
        "stratum": "Social_Relationships/Family",
        "input": {"user_id": user_id, "line_index": 7, "sessions": sessions, "dialogue": dialogue},
    }
    row.update(extra)
    return row


def task1_reference(benchmark_id: str, memory_items: Any = None) -> dict:
    if memory_items is None:
        memory_items = [memory_item()]
    return {
        "benchmark_id": benchmark_id,
        "task": "task1",
        "session_id": benchmark_id.split("__")[0],
        "canonical_id": benchmark_id.split("__")[-1],
        "gold": {"memory_items": memory_items},
    }


def write_task1(folder: Path, inputs: list[Any], references: list[Any]) -> Path:
    write_jsonl(folder / "model_input.jsonl", inputs)
    write_jsonl(folder / "reference_output.jsonl", references)
    return folder


def simple_task1(folder: Path, ids: list[str]) -> Path:
    """A valid task1 folder with one emotional memory per session."""
    return write_task1(folder, [task1_input(i) for i in ids], [task1_reference(i) for i in ids])


def raw_record(
    user_id: str | None = "u1",
    *,
    memory_items: Any = None,
    intents: Any = None,
    language: str | None = None,
    sessions: Any = None,
    **extra: Any,
) -> dict:
    record = {
        "sessions": sessions if sessions is not None else [session("s1", EMOTIONAL_TEXT, "I hear you.")],
        "memory_items": memory_items if memory_items is not None else [memory_item()],
    }
    if user_id is not None:
        record["user_id"] = user_id
    if intents is not None:
        record["intents_ranked"] = [
            {"intent_category": category, "intent_subtype": subtype} for category, subtype in intents
        ]
    if language is not None:
        record["language"] = language
    record.update(extra)
    return record


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def sample_task1() -> Path:
    assert (SAMPLE_TASK1 / "model_input.jsonl").is_file(), "the shipped sample is missing"
    return SAMPLE_TASK1


@pytest.fixture
def sample_copy(tmp_path) -> Path:
    """A writable copy of the shipped sample (for tests that break a line)."""
    target = tmp_path / "sample" / "task1"
    shutil.copytree(SAMPLE_TASK1, target)
    return target


@pytest.fixture
def no_network_hub(monkeypatch):
    """Point the Hub client at a name that cannot resolve, so a Hub lookup fails fast anywhere."""
    monkeypatch.setenv("HF_ENDPOINT", "https://nonexistent.invalid")
    for name in (
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
        "HF_DATASETS_OFFLINE",
        "HF_HUB_OFFLINE",
    ):
        monkeypatch.delenv(name, raising=False)


def files_in(folder: Path) -> list[str]:
    """The files of a folder, less the lock files of personaemp.locks (left behind by design:
    an flock dies with its process, the empty file means nothing). Temp files still show."""
    return sorted(
        p.name for p in folder.iterdir() if not (p.name.startswith(".") and p.name.endswith(".lock"))
    )


def built_once(tmp_path_factory, name: str, build) -> Path:
    """A session fixture's `processed/` folder, built by the first xdist worker that asks
    for it (`build(folder)`) and read by the others: each worker built its own, and the
    sample's pipeline is about 10 s of CPU (sample_build was built three times per `make
    test`). Under the run's folder, which its workers share (each has its own below it)."""
    from personaemp.locks import exclusive

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder = root / f"built-{name}"
    with exclusive(folder, wait=True):  # the others wait while the first builds
        if not (folder / ".whole").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            build(folder / "processed")
            (folder / ".whole").touch()
    return folder / "processed"


@pytest.fixture(scope="session")
def sample_build(tmp_path_factory) -> Path:
    """The shipped sample built end to end (filter -> ... -> push --dry-run) against the fake
    endpoint's capable model: its processed folder. Shared by every test of the run (all
    workers): tests copy what they change."""

    def build(processed: Path) -> None:
        from fake_openai import FakeOpenAI
        from rich.console import Console

        from personaemp.options import LLMOptions, PathsOptions
        from personaemp.pipeline import run_pipeline
        from personaemp.registry import RunOptions

        with (
            FakeOpenAI(responder=order_free_responder()) as fake,
            open(processed.parent / "log.txt", "w") as log,
        ):
            options = RunOptions(
                paths=PathsOptions(input=str(SAMPLE_TASK1), processed=processed),
                llm=LLMOptions(base_url=[fake.base_url], model="fake"),
            )
            run_pipeline(options, Console(file=log))

    return built_once(tmp_path_factory, "sample_build", build)


@pytest.fixture(scope="session")
def _ray_of_the_session():
    """Shuts down at the session's end the local Ray `local_ray` started."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def local_ray(_ray_of_the_session):
    """A local Ray (2 CPUs), started by the first test of this process that needs it and kept
    to the session's end: test_ray, test_ray_stages and test_ray_vllm each started and shut
    down their own, and a start costs about 10 s of CPU over Ray's processes (3 to 9 starts
    in `make test`, as its workers took tests of the three files; now one per worker at
    most). test_ray_cluster's fixture shuts it down to connect to its own cluster; the next
    test that needs it starts it again."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        # address="local": a new Ray of this process, never test_ray_cluster's cluster (which
        # another worker may have up on this machine: "connecting to an existing cluster").
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    return ray
