"""The Python API (`import personaemp as pe`): a notebook's use of it, under a running loop.

A Jupyter cell runs inside an event loop, where `asyncio.run` refuses to start; these
tests run the stages the way a notebook does (an `async def` body run by asyncio.run,
calling the sync API and awaiting the async one) against the fake OpenAI server.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_TASK1, clean_environment, order_free_responder, read_jsonl
from fake_openai import FakeOpenAI

import personaemp as pe
from personaemp.aio import run_sync
from personaemp.catalogue import COMMANDS
from personaemp.dataset.options import SplitOptions
from personaemp.options import specs


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    clean_environment(monkeypatch)


@pytest.fixture
def server():
    with FakeOpenAI(responder=order_free_responder()) as fake:
        yield fake
        assert fake.errors == []


def llm(server, processed: Path) -> dict:
    return {"base_url": [server.base_url], "model": "fake", "work_dir": processed / ".personaemp"}


# --- run_sync ----------------------------------------------------------------------------------


async def _answer(value):
    await asyncio.sleep(0)
    return value


def test_run_sync_without_a_loop_is_asyncio_run():
    assert run_sync(_answer(3)) == 3


def test_run_sync_inside_a_running_loop_runs_on_a_loop_of_its_own():
    async def cell():
        outer = asyncio.get_running_loop()
        inner = run_sync(_inner_loop())
        return outer, inner

    outer, inner = asyncio.run(cell())
    assert inner is not outer


async def _inner_loop():
    return asyncio.get_running_loop()


def test_run_sync_raises_the_coroutines_error_in_a_running_loop():
    async def failing():
        raise pe.InputError("x.jsonl: bad")

    async def cell():
        run_sync(failing())

    with pytest.raises(pe.InputError, match="x.jsonl: bad"):
        asyncio.run(cell())


CTRL_C_IN_A_CELL = """
import asyncio, os, signal, sys, threading
from personaemp.aio import run_sync
started, unwound = threading.Event(), threading.Event()
async def forever():
    started.set()
    try:
        await asyncio.Event().wait()
    finally:
        unwound.set()
def interrupt():
    started.wait()
    if sys.argv[1] == "process":
        os.kill(os.getpid(), signal.SIGINT)
    else:  # to this helper thread, not the main one
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
async def cell():
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a kernel's handler, not asyncio.run's
    threading.Thread(target=interrupt, daemon=True).start()
    run_sync(forever())
try:
    asyncio.run(cell())
except KeyboardInterrupt:
    print("interrupted", unwound.is_set())
"""


@pytest.mark.parametrize("target", ["process", "thread"])
def test_ctrl_c_in_a_running_loop_cancels_the_coroutine(target):
    """Ctrl-C (a real SIGINT, raised as KeyboardInterrupt as Jupyter's kernel does) while the
    caller waits cancels the coroutine in the worker thread, which unwinds first. The kernel
    may hand a process's SIGINT to any thread that does not block it; Python then runs the
    handler only when the main thread next runs bytecode, which an untimed wait never did (a
    test run hung here): "thread" forces that case. A subprocess, so a hang fails."""
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_IN_A_CELL, target], capture_output=True, text=True, timeout=20
    )
    assert done.stdout.strip() == "interrupted True", done.stderr[-2000:]


# --- the import surface --------------------------------------------------------------------------


def test_import_is_light_and_names_load_on_use():
    code = (
        "import sys, personaemp as pe\n"
        "assert 'personaemp.api' not in sys.modules and 'openai' not in sys.modules\n"
        "pe.filter_users; pe.LLMSettings; pe.StageResult; pe.InputError\n"
        "assert 'personaemp.api' in sys.modules\n"
        "print(sorted(n for n in dir(pe) if not n.startswith('_'))[:3])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        pe.nope  # noqa: B018


API = {
    "filter": ["filter_users"], "agreement": ["measure_agreement", "ameasure_agreement"],
    "infer-persona": ["infer_personas", "ainfer_personas"],
    "gen-queries": ["generate_queries", "agenerate_queries"], "split": ["split_users"],
    "stats": ["write_stats"], "push": ["publish"], "criteria": ["write_criteria", "awrite_criteria"],
    "respond": ["write_responses", "awrite_responses"], "evaluate": ["evaluate", "aevaluate"],
    "table": ["write_table"], "export": ["export_split"],
    "review": ["serve_review"], "extract-memories": ["extract_memories", "aextract_memories"],
    "gen-dialogues": ["generate_dialogues", "agenerate_dialogues"],
    "fidelity": ["measure_fidelity", "ameasure_fidelity"],
}  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_a_function_written_out_as_its_catalogue_line_says(command):
    """pe.<function> is written out in api.py (not made at import): its positional arguments
    are the line's, then settings (an LLM stage), config, progress (the line's default) and
    the stage's options as keywords, with the command's defaults (the options model)."""
    from personaemp import api
    from personaemp.apidocs import documented_parameters
    from personaemp.registry import STAGES

    stage = STAGES[command]
    for name in API[command]:
        function = getattr(pe, name)
        assert name in vars(api) and function.__module__ == "personaemp.api", name  # written out
        assert inspect.iscoroutinefunction(function) == name.startswith("a")
        own = inspect.signature(function).parameters
        keywords = [*(["settings"] if stage.llm else []), "config", "progress", "options"]
        assert list(own) == [*stage.positional, *keywords], name
        assert own["progress"].default is stage.progress and own["options"].kind is own["options"].VAR_KEYWORD
        assert all(own[p].kind is own[p].POSITIONAL_OR_KEYWORD for p in stage.positional), name
        parameters = {p.name: p for p in documented_parameters(function, stage)}
        for section in COMMANDS[command]:
            for option in specs(section):
                assert option.name in parameters, (name, option.name)
                default = parameters[option.name].default
                if default is None and option.opt.derive:  # a path: None follows the config as `run` does
                    continue
                assert default == option.default, (name, option.name)


def test_split_defaults_to_the_ood_split_as_the_command_does(tmp_path):
    assert SplitOptions().ood is True
    from personaemp.apidocs import documented_parameters
    from personaemp.registry import STAGES

    assert {p.name: p for p in documented_parameters(pe.split_users, STAGES["split"])}["ood"].default is True
    from personaemp.dataset.split import split_users

    assert inspect.signature(split_users).parameters["ood"].default is True


def test_an_unknown_option_names_the_known_ones(tmp_path):
    with pytest.raises(TypeError, match="unknown option 'od'.*ood"):
        pe.split_users(tmp_path / "q.jsonl", tmp_path / "s", od=True)


def test_a_bad_value_is_named_as_the_argument(tmp_path):
    with pytest.raises(pe.InputError, match="^test_size must be less than 1"):
        pe.split_users(tmp_path / "q.jsonl", tmp_path / "s", test_size=2)


def test_an_earlier_option_name_still_works_with_a_warning(tmp_path):
    with (
        pytest.warns(FutureWarning, match="out= is deprecated, use out_dir="),
        pytest.raises(pe.InputError, match="no such folder"),  # resolved as out_dir: push ran
    ):
        pe.publish(tmp_path / "nowhere", dry_run=True, out=tmp_path / "d")


def test_settings_or_llm_options_not_both(tmp_path):
    with pytest.raises(TypeError, match="not both"):
        pe.infer_personas(tmp_path / "f.jsonl", settings=pe.LLMSettings(model="m"), model="m")


# --- a notebook: the whole pipeline under a running loop ----------------------------------------


def test_notebook_runs_every_stage_inside_a_running_loop(tmp_path, server, capsys):
    processed = tmp_path / "processed"
    events = []

    async def notebook():
        asyncio.get_running_loop()  # a cell: the loop is running
        kept = pe.filter_users(SAMPLE_TASK1, processed / "filtered.jsonl")
        personas = pe.infer_personas(
            kept.output, processed / "personas.jsonl", limit=6, **llm(server, processed),
            progress=lambda stage, done, total: events.append((stage, done, total)),
        )  # fmt: skip
        queries = await pe.agenerate_queries(
            personas.output, processed / "queries.jsonl", **llm(server, processed)
        )
        splits = pe.split_users(queries.output, processed / "splits")
        dataset = pe.publish(splits.output, dry_run=True, out_dir=processed / "dataset")
        return kept, personas, queries, splits, dataset

    kept, personas, queries, splits, dataset = asyncio.run(notebook())

    assert capsys.readouterr() == ("", ""), "a library call prints nothing unless asked"
    assert kept.counts["kept"] == 16 and len(kept.rows()) == 16
    assert kept.files["report"].name == "filter_report.json"
    assert personas.counts["units"] == 6 and personas.counts["done"] == 6  # units: the users picked
    assert len(personas.rows()) == 6 and personas.report.outcome.done == 6
    assert personas.counts["eligible"] == personas.summary.eligible > 0
    assert events and events[-1] == ("infer-persona", 6, 6)
    assert queries.counts["done"] == personas.counts["eligible"] and queries.counts["queries"] > 0
    assert sum(len(row["queries"]) for row in queries.rows()) == queries.counts["queries"]
    assert set(splits.files) == {"random/train", "random/test", "ood/train", "ood/test", "report"}
    assert splits.counts["users_in"] == queries.counts["done"]
    split = len(splits.rows("random/train")) + len(splits.rows("random/test"))
    assert split == splits.counts["users_in"] - splits.counts["left_out"] > 0
    assert (processed / "dataset" / "README.md").is_file() and dataset.output == processed / "dataset"
    assert dataset.counts["random_test_rows"] > 0
    # results read as a notebook shows them, and as --json prints them
    assert repr(personas).startswith("<StageResult infer-persona: units 6, done 6,")
    assert json.loads(json.dumps(queries.as_dict()))["counts"] == queries.counts


def test_sync_and_async_give_the_same_outputs_and_report(tmp_path, server):
    def build(folder: Path, asynchronous: bool):
        kept = pe.filter_users(SAMPLE_TASK1, folder / "filtered.jsonl")
        options = {"limit": 5, "base_url": [server.base_url], "model": "fake", "work_dir": folder / ".w"}
        if asynchronous:
            return asyncio.run(pe.ainfer_personas(kept.output, folder / "personas.jsonl", **options))
        return pe.infer_personas(kept.output, folder / "personas.jsonl", **options)

    sync, asynchronous = build(tmp_path / "sync", False), build(tmp_path / "async", True)

    def comparable(rows):
        return [{k: v for k, v in row.items() if k != "provenance"} for row in rows]

    assert comparable(sync.rows()) == comparable(asynchronous.rows())
    assert sync.counts == asynchronous.counts
    assert sync.summary == asynchronous.summary
    assert sync.report.steps.keys() == asynchronous.report.steps.keys()
    for step, stats in sync.report.steps.items():
        assert stats["calls"] == asynchronous.report.steps[step]["calls"]


def test_run_pipeline_inside_a_running_loop(tmp_path, server):
    """`run` streams users from a filter child process and runs the LLM stages on a loop of
    its own (here, in a worker thread): from a notebook it finishes and returns results."""
    processed = tmp_path / "processed"

    async def cell():
        return pe.run_pipeline(
            paths={"input": str(SAMPLE_TASK1), "processed": processed},
            llm={"base_url": [server.base_url], "model": "fake"},
            persona={"limit": 8},
        )

    results = asyncio.run(cell())

    assert list(results) == ["filter", "infer-persona", "gen-queries", "split", "stats", "push"]
    assert results["filter"].counts["kept"] == 16
    assert results["infer-persona"].counts["done"] == 8
    assert len(read_jsonl(processed / "personas.jsonl")) == 8
    assert (processed / "dataset" / "README.md").is_file()


def test_settings_take_paths_as_text(tmp_path):
    """A notebook writes work_dir="runs/x": the engine joins it as a Path (it failed with a
    TypeError on str / str)."""
    settings = pe.LLMSettings(work_dir=str(tmp_path / "w"), batch="~/b", model="m")
    assert settings.work_dir == tmp_path / "w" and settings.batch == Path("~/b").expanduser()


# --- the key: one rule for every entry point -----------------------------------------------------


def test_settings_built_in_python_send_the_environments_key(tmp_path, monkeypatch):
    """LLMSettings(...) without api_key= sends $OPENAI_API_KEY, as the CLI does (it sent
    "Bearer none": a 401 from a real provider with the variable set)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    with FakeOpenAI(responder=order_free_responder(), require_key="sk-from-the-environment") as fake:
        kept = pe.filter_users(SAMPLE_TASK1, tmp_path / "filtered.jsonl")
        settings = pe.LLMSettings(base_urls=[fake.base_url], model="fake", work_dir=tmp_path / ".w")
        assert settings.key_source == "$OPENAI_API_KEY"
        result = pe.infer_personas(kept.output, tmp_path / "personas.jsonl", limit=2, settings=settings)
        assert result.counts["done"] == 2 and fake.errors == []
        assert "sk-from-the-environment" not in repr(settings) and "api_key" not in settings.public()


def test_an_api_key_argument_wins_and_a_refusal_names_where_the_key_came_from(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-right-one")
    with FakeOpenAI(responder=order_free_responder(), require_key="sk-the-right-one") as fake:
        kept = pe.filter_users(SAMPLE_TASK1, tmp_path / "filtered.jsonl")
        settings = pe.LLMSettings(
            base_urls=[fake.base_url], model="fake", api_key="sk-a-wrong-one", work_dir=tmp_path / ".w"
        )
        assert settings.key_source == "the api_key argument"
        with pytest.raises(pe.PersonaempError, match="the key came from the api_key argument") as raised:
            pe.infer_personas(kept.output, tmp_path / "personas.jsonl", limit=1, settings=settings)
        assert "sk-a-wrong-one" not in str(raised.value)
    monkeypatch.delenv("OPENAI_API_KEY")
    assert pe.LLMSettings(model="m").key_source == "$OPENAI_API_KEY (not set)"


def test_the_bar_counts_the_users_asked_for_not_the_input(tmp_path, server):
    """Issue 63: the demo's three configured users drew `infer-persona 3/16` (16 kept users)
    and ended at 3/16. The total is the units to do: 3/3."""
    processed = tmp_path / "processed"
    kept = pe.filter_users(SAMPLE_TASK1, processed / "filtered.jsonl")
    users = [row["user_id"] for row in kept.rows()[:3]]
    events = []
    pe.run_pipeline(
        paths={"input": str(SAMPLE_TASK1), "processed": processed},
        llm={"base_url": [server.base_url], "model": "fake"},
        persona={"users": users},
        progress=lambda stage, done, total: events.append((stage, done, total)),
    )
    persona = [(done, total) for stage, done, total in events if stage == "infer-persona"]
    assert persona and persona[-1] == (3, 3), persona
    assert {total for _, total in persona} == {3}, persona
