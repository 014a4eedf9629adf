"""Shared fixtures: builders for AlpsBench-shaped files written under tmp_path.

Every fixture is real data on disk (task1 JSONL pairs, raw-export JSON/JSONL), built from
the small helpers below so a test states only what it cares about.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import traceback
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

HEAVY_RESOURCES = ("requires_model", "requires_browser", "requires_wheel")


def pytest_itemcollected(item):
    """A test on a real Ray (the local_ray fixture, or marked requires_ray as test_ray_cluster's
    are) is marked requires_ray and joins the xdist group "ray": `make test` (--dist
    loadgroup) runs the group on one worker, one test after the other, so one local Ray
    serves the run (a start costs about 10 core-s over Ray's processes; one per worker
    before), and `-m "not requires_ray"` leaves Ray unstarted."""
    if _on_local_ray(item) or item.get_closest_marker("requires_ray"):
        item.add_marker(pytest.mark.requires_ray)
        item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.hookimpl(trylast=True)  # after -m / -k deselect
def pytest_collection_modifyitems(config, items):
    """The tests that need a heavy resource first (the Ray group: the test that starts the
    local Ray itself first, its simulated cluster last: that fixture stops the local Ray; then
    the model, the browser, the wheel), each kind in
    collection order, then the rest. `--dist loadgroup` hands the work out in this order,
    the largest group first, a few tests at a time to whichever worker is free: no long test
    is left to start at the end, and the quick ones fill the other workers meanwhile."""

    def rank(item) -> tuple[int, bool, bool]:
        if item.get_closest_marker("requires_ray"):
            return 0, not _on_local_ray(item), "no_ray_yet" not in item.fixturenames
        return (1 if any(item.get_closest_marker(name) for name in HEAVY_RESOURCES) else 2), False, False

    items.sort(key=rank)
    _group_suffix_read(items)


def _group_suffix_read(items) -> None:
    """`--dist loadgroup` sends the tests of one xdist_group to one worker by a suffix
    (`test_x@ray`) pytest-xdist 3.8 writes to `item._nodeid`, on each worker. pytest 9.2 reads
    a node's id from `item._id` (a NodeId) instead, so the suffix was lost and every group
    spread over the workers, one local Ray on each (pytest-xdist issue 1386). The suffix is
    written where pytest reads it; a pytest that still reads `_nodeid` needs nothing."""
    for item in items:
        written = item.__dict__.get("_nodeid")
        if written and written != item.nodeid and hasattr(item, "_id"):
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(written)


def _on_local_ray(item) -> bool:
    return "local_ray" in item.fixturenames or "no_ray_yet" in item.fixturenames


def pytest_runtest_teardown(item, nextitem):
    """The local Ray of `local_ray` is shut down after the last test of this process that
    needs it (the group's tests run one after the other), not kept to the session's end: an
    idle Ray costs about 6 % of a core after a Ray Data job (1.9 s of CPU in 30 s, measured).
    A later test that needs it starts it again."""
    if _on_local_ray(item) and (nextitem is None or not _on_local_ray(nextitem)):
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()


@pytest.fixture(scope="session", autouse=True)
def _one_thread_for_the_embedded_model():
    """`make test` runs three workers on two cores: a two-thread llama.cpp server next to
    another worker waits on its slower thread every token (measured: the suite 188 s vs 97 s
    on two workers)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PERSONAEMP_LOCAL_THREADS", "1")
        yield


@pytest.fixture
def pool_double(monkeypatch):
    """`--executor ray`'s WorkerPool on two in-process UnitWorkers, everything they are sent
    and answer going through cloudpickle (tests/ray_double.py): no Ray started."""
    pytest.importorskip("ray")
    from ray_double import PoolDouble

    return PoolDouble().install(monkeypatch)


@pytest.fixture
def embedded_replies(request, monkeypatch):
    """`--llm local` answered from this test's cassette (tests/cassettes.py): the engine path
    whole, the model's decoding not repeated. PERSONAEMP_RECORD_EMBEDDED=1 (`make
    record-embedded`): the real embedded server answers, and the cassette is written anew.
    A request the cassette does not hold fails the test, naming that command."""
    from cassettes import CASSETTES, RERECORD, StandIn, recording, write

    import personaemp.llm.local as local

    path = CASSETTES / f"{Path(str(request.node.fspath)).stem}.{request.node.name}.jsonl"
    servers: list[StandIn] = []

    def stand_in(**options):
        servers.append(StandIn(path, record=recording(), **options))
        return servers[-1]

    monkeypatch.setattr(local, "LocalServer", stand_in)
    yield servers
    if recording():
        write(path, {key: entry for server in servers for key, entry in server.seen.items()})
    misses = [body for server in servers for body in server.misses]
    assert not misses, f"{len(misses)} request(s) not in {path.name}: record again with `{RERECORD}`"


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


def cli_here(args: list[str], env: dict[str, str | None], cwd: Path) -> subprocess.CompletedProcess:
    """`python -m personaemp ARGS` in this process (Typer's runner), read as the child's
    CompletedProcess: the exit code, stdout and stderr. For the variants of a failure whose
    family keeps one real child process (what is printed at the interpreter's exit, asyncio's
    "never retrieved" lines): a launch costs 1.2-1.5 core-s. An exception the CLI did not turn
    into its exit (a child's traceback) fails here. The keys registered for redaction are
    this run's alone, as in a new process."""
    from typer.testing import CliRunner

    from personaemp import secrets
    from personaemp.cli import app

    with pytest.MonkeyPatch.context() as patch, contextlib.chdir(cwd):
        patch.setattr(secrets, "_registered", set())
        result = CliRunner().invoke(app, args, env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        "".join(traceback.format_exception(result.exception)) + result.output
    )
    return subprocess.CompletedProcess(["personaemp", *args], result.exit_code, result.stdout, result.stderr)


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
# files are kept (llm/models.py; clearing it would fetch the embedded model again), the
# browser of the review tests (tests/browser.py), and `make record-embedded`'s switch
# (tests/cassettes.py). None changes an option or an address.
MACHINE_NAMES = ("PERSONAEMP_MODEL_CACHE", "PERSONAEMP_CHROMIUM", "PERSONAEMP_RECORD_EMBEDDED")
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


# --- generic file helpers ---------------------------------------------------------------


def personaemp_environment() -> tuple[str, ...]:
    """The variables a test must not inherit from the shell: every option's (options.py), the
    endpoint's and the key."""
    from personaemp.options import sections, specs

    declared = {option.opt.env for section in sections() for option in specs(section) if option.opt.env}
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


@pytest.fixture
def plots_undrawn(monkeypatch):
    """stats' and push's plots as placeholder bytes, one per figure `render_figures` would
    draw, a function of the stats alone (a rerun writes the same bytes): for a test whose point
    is which stage runs or what it writes, not the drawing (1.5-2 core-s a changed build, over
    forked workers). The drawing itself: tests/integration/test_stats.py."""
    import hashlib

    from personaemp.dataset import figures, stats

    def placeholders(data: dict[str, Any]) -> dict[str, bytes]:
        key = json.dumps(data, sort_keys=True)
        return {
            name: b"\x89PNG placeholder " + hashlib.sha256(f"{name}{key}".encode()).digest()
            for name in figures.figure_names(data)
        }

    monkeypatch.setattr(stats, "render_figures", placeholders)


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

        from personaemp.pipeline import run_pipeline
        from personaemp.registry import RunOptions
        from personaemp.shared_options import LLMOptions, PathsOptions

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
def no_ray_yet(_ray_of_the_session):
    """No Ray in this process: for the test that starts the local Ray itself through
    personaemp's connect() (test_ray.py's token test) and leaves it to the tests after it, which
    `local_ray` hands it to (the order above runs that test first in the Ray group: one start
    for both, not two). A Ray started before it (an order -k or -p made) is shut down."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    return ray


@pytest.fixture
def local_ray(_ray_of_the_session):
    """A local Ray (2 CPUs), started by the first test of this process that needs it (in
    `make test`, test_ray.py's token test, through connect(): see no_ray_yet) and shut down
    after the last one (pytest_runtest_teardown). The Ray tests are one xdist group, so
    `make test` starts one local Ray (a start costs a few core-s over Ray's processes).
    test_ray_cluster's fixture shuts it down to connect to its own cluster; it runs last in
    the group."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        # address="local": a new Ray of this process, never test_ray_cluster's cluster (which
        # another worker may have up on this machine: "connecting to an existing cluster").
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    return ray


# --- tiers:begin (written by issue 62's tiers script) ---------------------------------------


@pytest.fixture(autouse=True)
def _unit_tier_stays_in_process(request, monkeypatch):
    """A test under tests/unit/ opens no network socket and starts no child process: it
    fails here, naming what it did, and belongs in tests/integration/ (docs/development.md:
    the tiers). Local socket pairs (asyncio's loop) are left alone."""
    if Path(str(request.node.fspath)).parent.name != "unit":
        yield
        return
    import multiprocessing.process
    import socket

    def refuse(what):
        def refused(*args, **kwargs):
            raise AssertionError(f"a unit test {what}: move its file to tests/integration/")

        return refused

    for name in ("connect", "connect_ex", "bind"):
        real = getattr(socket.socket, name)

        def guarded(self, address, *args, _real=real, _name=name):
            if self.family in (socket.AF_INET, socket.AF_INET6):
                said = f"opened a socket ({_name} {address})"
                raise AssertionError(f"a unit test {said}: move its file to tests/integration/")
            return _real(self, address, *args)

        monkeypatch.setattr(socket.socket, name, guarded)
    monkeypatch.setattr(socket, "getaddrinfo", refuse("looked a host name up"))
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("started a child process (subprocess)"))
    monkeypatch.setattr(os, "fork", refuse("forked"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse("started a child process"))
    yield


# --- tiers:end ---------------------------------------------------------------------------
