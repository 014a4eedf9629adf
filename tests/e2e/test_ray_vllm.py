"""--llm vllm --executor ray (personaemp/llm/ray_vllm.py): a stage in rounds, each round's
requests answered by a ray.data.llm processor.

vLLM needs a GPU (and the [vllm] extra): here the processor is ray.data.llm's own HTTP
processor, given what vLLM would be given (ray_vllm.vllm_input) as a request to the test
server, and handing back what vLLM's processor hands back (generated_text, the token
counts). So the rounds, the Ray Data job, the answer lines, the resume and the files are
the real ones; vLLM's engine is the one part left out. tests/e2e/test_vllm_gpu.py runs it where
a GPU and vLLM are present."""

from __future__ import annotations

import json
import shutil
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import SAMPLE_TASK1, order_free_responder
from fake_openai import FakeOpenAI, reply
from rich.console import Console
from test_ray import rows

from personaemp.errors import InputError
from personaemp.llm import ray_vllm
from personaemp.llm import settings as settings_module
from personaemp.llm.batch import import_answers
from personaemp.llm.cache import ReplyCache
from personaemp.registry import RunOptions
from personaemp.shared_options import LLMOptions, PathsOptions

ray = pytest.importorskip("ray")
pytest.importorskip("aiohttp")  # ray.data.llm imports it

USAGE = {"prompt_tokens": 900, "completion_tokens": 5, "total_tokens": 905}  # as the server counts
NOT_COMPARED = {"created_at", "endpoint_kind", "input_hash"}  # timings; "vllm" for "remote"
# Users a stage in rounds runs on: the rounds, the jobs and the files are the same for 4 as for
# the sample's 16 (a round's job was one Ray Data task per request).
USERS_IN_ROUNDS = 4


@pytest.fixture
def local_ray(local_ray):
    """conftest's shared local Ray, and this module's functions sent to it by value."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the stand-in's maps, on Ray's workers
    return local_ray


def as_request(row: dict) -> dict:
    """What vLLM would be given (ray_vllm.vllm_input), as the chat request it stands for."""
    given = ray_vllm.vllm_input(row)
    sampling = given["sampling_params"]
    payload = {
        "model": "fake",
        "messages": given["messages"],
        "temperature": sampling["temperature"],
        "max_tokens": sampling["max_tokens"],
    }
    if sampling.get("structured_outputs"):
        schema = json.loads(sampling["structured_outputs"]["json"])
        payload["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "reply", "schema": schema},
        }
    return {"payload": payload}


def as_vllm_output(row: dict) -> dict:
    """The HTTP reply as vLLM's processor gives its output: the text and the token counts."""
    response = row["http_response"]
    return ray_vllm._keep_columns(
        {
            **row,
            "generated_text": response["choices"][0]["message"]["content"],
            "num_input_tokens": response["usage"]["prompt_tokens"],
            "num_generated_tokens": response["usage"]["completion_tokens"],
        }
    )


@pytest.fixture
def stand_in(monkeypatch):
    """ray_vllm's processor made ray.data.llm's HTTP processor against a test server."""

    def use(server: FakeOpenAI, postprocess=as_vllm_output) -> None:
        from ray.data.llm import HttpRequestProcessorConfig

        # One request per batch: the request carries its JSON schema as a nested object (vLLM's
        # rows carry it as text), and Arrow would merge the schemas of a batch's rows into one.
        config = HttpRequestProcessorConfig(
            url=f"{server.base_url}/chat/completions", concurrency=1, batch_size=1
        )
        processor = ray_vllm.Processor(config, as_request, postprocess)
        monkeypatch.setattr(ray_vllm, "build_processor_for", lambda settings: processor)
        settings_only(monkeypatch)  # the stand-in needs ray.data.llm, not vLLM

    return use


# --- one request, one answer ---------------------------------------------------------------------


def test_a_request_becomes_vllm_input_with_its_schema_as_structured_output():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    body = {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.3, "max_tokens": 64,
        "seed": 5, "response_format": response_format,
    }  # fmt: skip
    given = ray_vllm.vllm_input({"custom_id": "x", "body": json.dumps(body)})
    assert given["messages"] == body["messages"]
    sampling = given["sampling_params"]
    assert {key: sampling[key] for key in ("temperature", "max_tokens", "seed")} == {
        "temperature": 0.3, "max_tokens": 64, "seed": 5,
    }  # fmt: skip
    assert list(sampling["structured_outputs"]) == ["json"]  # one constraint, as vLLM requires
    assert json.loads(sampling["structured_outputs"]["json"]) == schema

    free = ray_vllm.vllm_input({"custom_id": "y", "body": json.dumps({**body, "response_format": None})})
    assert "structured_outputs" not in free["sampling_params"]
    plain = {**body, "response_format": {"type": "json_object"}}
    assert ray_vllm.vllm_input({"custom_id": "z", "body": json.dumps(plain)})["sampling_params"][
        "structured_outputs"
    ] == {"json_object": True}
    unseeded = {key: value for key, value in body.items() if key != "seed"}
    assert (
        "seed" not in ray_vllm.vllm_input({"custom_id": "w", "body": json.dumps(unseeded)})["sampling_params"]
    )


def test_answer_lines_are_imported_as_replies_cut_replies_and_failures(tmp_path):
    """A vLLM output row becomes an answer line batch.import_answers takes: a reply; a reply
    that used every token, cut (finish_reason length); an error row, a refusal stored as the
    request's error (its unit fails, it is not asked again)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": 0.0, "max_tokens": 8}
    requests, answers = [], []
    for number, (text, tokens, error) in enumerate(
        [('{"a": "x"}', 5, ""), ('{"a": "xx', 8, ""), ("", 0, "boom")]
    ):
        custom_id = f"step-key{number}"
        requests.append(
            {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
        )
        output = {"generated_text": text, "num_input_tokens": 11, "num_generated_tokens": tokens}
        row = {"custom_id": custom_id, "body": json.dumps(body), **output, "__inference_error__": error}
        answers.append(ray_vllm.answer_line(row, "m"))
    (tmp_path / "step-round-1-part-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in requests))
    (tmp_path / "vllm-answers-1.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    cache = ReplyCache(tmp_path / "cache.sqlite")
    counts, waiting = import_answers(tmp_path, cache)
    assert (counts["imported"], counts["refused"], waiting) == (2, 1, {})
    first, cut, failed = (cache.get(f"key{number}") for number in range(3))
    assert (first["content"], first["finish_reason"]) == ('{"a": "x"}', "stop")
    assert first["prompt_tokens"] == 11 and first["completion_tokens"] == 5
    assert cut["finish_reason"] == "length"
    assert "boom" in failed["error"] and failed["status"] == ray_vllm.REFUSED
    cache.close()


# --- options -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"model": "m"}, "add --executor ray"),
        ({"executor": "ray"}, "no --model is set"),
        ({"executor": "ray", "model": "m", "base_urls": ["http://x/v1"]}, "but --base-url is set"),
        ({"executor": "ray", "model": "m", "use_cache": False}, "leave out --no-cache and --refresh"),
    ],
)
def test_vllm_settings_that_cannot_work_are_one_line(given, said):
    from personaemp.llm.settings import LLMSettings

    with pytest.raises(InputError, match=said):
        LLMSettings(llm="vllm", **given)


def settings_only(monkeypatch) -> None:
    """The processor's settings are read, not run: no vLLM needed (settings.check_installed)."""
    monkeypatch.setitem(settings_module.NEEDS, "vllm", (("ray",), "pip install 'personaemp[ray]'"))


def test_the_vllm_processor_takes_the_engine_and_processor_settings(monkeypatch):
    """--vllm engine.KEY=VALUE and processor.KEY=VALUE (strings from the command line, typed
    as TOML would type them) reach ray.data.llm's vLLM processor config."""
    from personaemp.config import cli_flags, llm_settings

    settings_only(monkeypatch)

    flags = cli_flags("llm", {"vllm": [
        "engine.max_model_len=8192", "engine.enable_prefix_caching=true", "engine.dtype=bfloat16",
        "processor.batch_size=32",
    ]})  # fmt: skip
    options = LLMOptions(llm="vllm", executor="ray", model="Qwen/Qwen2.5-7B-Instruct", workers=3, **flags)
    settings = llm_settings(options)
    config = ray_vllm.vllm_processor(settings).config
    assert config.model_source == "Qwen/Qwen2.5-7B-Instruct"
    given = {"max_model_len": 8192, "enable_prefix_caching": True, "dtype": "bfloat16"}
    assert {key: config.engine_kwargs[key] for key in given} == given
    assert (config.batch_size, config.concurrency, config.should_continue_on_error) == (32, 3, True)


def test_the_documented_toml_vllm_tables_reach_the_vllm_processor(tmp_path, monkeypatch):
    """docs/past-one-machine.md's `[llm.vllm.engine]` / `[llm.vllm.processor]` example, in a
    copy of personaemp.toml in place of its [llm] section, and the page's two `run --config`
    commands (the second with a --set of one engine key): what `run` is given reaches
    ray.data.llm's vLLM processor config. The run itself needs GPUs: here the processor's
    settings are read, not run (the rounds on CPU: the tests below)."""
    import re
    import shlex

    from conftest import REPO, clean_environment
    from typer.testing import CliRunner

    from personaemp import pipeline
    from personaemp.cli import app
    from personaemp.config import llm_settings

    page = (REPO / "docs" / "past-one-machine.md").read_text(encoding="utf-8")
    [example] = re.findall(r"```toml\n(.*?)```", page, re.S)
    shipped = (REPO / "personaemp.toml").read_text(encoding="utf-8")
    start, end = shipped.index("\n[llm]"), shipped.index("\n[persona]")
    (tmp_path / "vllm.toml").write_text(shipped[:start] + "\n" + example + shipped[end:], encoding="utf-8")
    commands = re.search(r"```sh\n(personaemp run --config vllm.toml.*?)```", page, re.S)[1].splitlines()
    assert len(commands) == 2
    clean_environment(monkeypatch)
    settings_only(monkeypatch)
    monkeypatch.chdir(tmp_path)
    given = []
    monkeypatch.setattr(pipeline, "run_pipeline", lambda options, console: given.append(options))
    for line in commands:
        result = CliRunner().invoke(app, shlex.split(line, comments=True)[1:])
        assert result.exit_code == 0, (line, result.output)
    engines = [ray_vllm.vllm_processor(llm_settings(options.llm)).config for options in given]
    assert [config.engine_kwargs["max_model_len"] for config in engines] == [16384, 32768]
    for config in engines:
        assert config.model_source == "Qwen/Qwen2.5-7B-Instruct"
        assert config.engine_kwargs["tensor_parallel_size"] == 2
        assert (config.batch_size, config.concurrency) == (64, 4)  # [llm.vllm.processor], workers
    assert given[0].persona.users == tomllib.loads(shipped)["persona"]["users"]  # the rest of the file


# --- rounds on a local Ray -----------------------------------------------------------------------


def test_run_with_vllm_rounds_writes_what_one_process_writes(local_ray, stand_in, tmp_path):
    """`run --llm vllm --executor ray` on the shipped sample's first USERS_IN_ROUNDS users:
    each LLM stage in rounds, each round one ray.data.llm job; the personas, queries, failures
    and splits are the one-process run's (the same users and model), each request answered
    once, and the rounds folder is gone once the stage is done (the cache holds the answers).
    Run again: nothing is sent."""
    from personaemp.dataset.options import PersonaOptions
    from personaemp.pipeline import run_pipeline

    persona = PersonaOptions(limit=USERS_IN_ROUNDS)
    sample_build = tmp_path / "one-process"  # the same users in one process, as the reference
    with FakeOpenAI(responder=order_free_responder()) as one, open(tmp_path / "log0.txt", "w") as log:
        paths = PathsOptions(input=str(SAMPLE_TASK1), processed=sample_build)
        llm = LLMOptions(base_url=[one.base_url], model="fake")
        run_pipeline(RunOptions(paths=paths, llm=llm, persona=persona), Console(file=log, width=200))
    processed = tmp_path / "processed"
    with FakeOpenAI(responder=order_free_responder()) as fake:
        stand_in(fake)
        llm = LLMOptions(model="fake", llm="vllm", executor="ray", workers=1)
        paths = PathsOptions(input=str(SAMPLE_TASK1), processed=processed)
        options = RunOptions(paths=paths, llm=llm, persona=persona)

        with open(tmp_path / "log.txt", "w") as log:
            run_pipeline(options, Console(file=log, width=200))
        sent = fake.count
        with open(tmp_path / "log2.txt", "w") as log:
            run_pipeline(options, Console(file=log, width=200))
        assert fake.count == sent  # the second run is answered by the cache and the output scan
    log = (tmp_path / "log.txt").read_text()
    assert "round 1," in log and "round 2," in log

    for name in ("filtered.jsonl", "personas.jsonl", "queries.jsonl", "rejected.jsonl",
                 "infer-persona.failures.jsonl", "gen-queries.failures.jsonl",
                 "splits/random/train.jsonl", "splits/random/test.jsonl"):  # fmt: skip
        assert rows(processed / name, NOT_COMPARED) == rows(sample_build / name, NOT_COMPARED), name
    assert not (processed / ".personaemp" / "vllm").exists() or not any(
        (processed / ".personaemp" / "vllm").iterdir()
    )
    stages = json.loads((processed / ".personaemp" / "run_report.json").read_text())["stages"]
    theirs = json.loads((sample_build / ".personaemp" / "run_report.json").read_text())["stages"]
    asked = 0
    for stage in ("infer-persona", "gen-queries"):
        figures = stages[stage]["notes"]["vllm"]
        # infer-persona: one request a user (its levels in the reply); gen-queries: a chain
        assert figures["rounds"] >= {"infer-persona": 1, "gen-queries": 2}[stage] and figures["refused"] == 0
        assert figures["answered"] == theirs[stage]["totals"]["requests"], stage  # one process's requests
        assert stages[stage]["endpoint_kind"] == "vllm"
        assert (stages[stage]["done"], stages[stage]["failed"]) == (
            theirs[stage]["done"],
            theirs[stage]["failed"],
        )
        asked += figures["answered"]
    assert asked == sent


def test_an_unfinished_round_resumes_with_only_the_unanswered_requests(local_ray, stand_in, tmp_path):
    """A run killed mid-round leaves its answers file as `.partial`, maybe with half a line:
    the next round keeps its whole lines and sends only the requests without an answer."""
    folder = tmp_path / "round"
    folder.mkdir()
    body = lambda n: {"model": "fake", "messages": [{"role": "user", "content": f"say {n}"}],  # noqa: E731
                      "temperature": 0.0, "max_tokens": 50}  # fmt: skip
    requests = [{"custom_id": f"check-k{n}", "method": "POST", "url": "/v1/chat/completions", "body": body(n)}
                for n in range(6)]  # fmt: skip
    (folder / "gen-queries-round-1-part-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in requests))
    output = {"generated_text": "ok", "num_input_tokens": 3, "num_generated_tokens": 1}
    done = [
        ray_vllm.answer_line({"custom_id": r["custom_id"], "body": json.dumps(r["body"]), **output}, "fake")
        for r in requests[:2]
    ]
    half = json.dumps(ray_vllm.answer_line({"custom_id": "check-k2", "body": json.dumps(body(2))}, "fake"))
    partial = folder / f".{ray_vllm.ANSWERS}dead.jsonl.partial"
    partial.write_text("".join(json.dumps(a) + "\n" for a in done) + half[: len(half) // 2])

    assert ray_vllm.salvage(folder) == 2
    assert not partial.exists()
    left = ray_vllm.unanswered(folder)
    assert [custom_id for custom_id, _ in left] == [f"check-k{n}" for n in range(2, 6)]
    from personaemp.llm.settings import LLMSettings

    with FakeOpenAI(responder=lambda body, number: {"content": "fine"}) as fake:
        stand_in(fake)
        settings = LLMSettings(llm="vllm", executor="ray", model="fake", work_dir=tmp_path / "work")
        counts = ray_vllm.answer(folder, left, settings)
        assert fake.count == 4
    assert (counts["requests"], counts["answered"]) == (4, 4)
    assert ray_vllm.unanswered(folder) == []
    assert not list(folder.glob(".*.partial"))


def test_gen_dialogues_says_it_cannot_run_in_vllm_rounds(sample_build, tmp_path):
    from personaemp.dataset.dialogues import generate_dialogues
    from personaemp.llm.settings import LLMSettings

    settings = LLMSettings(llm="vllm", executor="ray", model="m", work_dir=tmp_path)
    with pytest.raises(InputError, match="in vLLM rounds"):
        generate_dialogues(sample_build / "queries.jsonl", tmp_path / "d.jsonl", settings)


def test_the_vllm_rounds_folder_is_per_stage_and_output(tmp_path):
    from personaemp.llm.settings import LLMSettings

    settings = LLMSettings(llm="vllm", executor="ray", model="m", work_dir=tmp_path)
    one = ray_vllm.folder_for(settings, "respond", tmp_path / "a.jsonl")
    assert one == ray_vllm.folder_for(settings, "respond", tmp_path / "a.jsonl")
    assert one != ray_vllm.folder_for(settings, "respond", tmp_path / "b.jsonl")
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_without_vllm_installed_the_command_says_what_to_install(local_ray, sample_build, tmp_path):
    """The [vllm] extra missing (as here: no transformers, no vLLM): `infer-persona --llm vllm`
    ends with one line naming the extra, exit 2, and writes no personas."""
    from typer.testing import CliRunner

    from personaemp.cli import app

    result = CliRunner().invoke(app, [
        "infer-persona", "-i", str(sample_build / "filtered.jsonl"), "-o", str(tmp_path / "personas.jsonl"),
        "--llm", "vllm", "--executor", "ray", "--model", "Qwen/Qwen2.5-7B-Instruct",
        "--work-dir", str(tmp_path / "work"),
    ])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--llm vllm needs transformers, which is not installed here" in result.output
    assert "pip install 'personaemp[vllm]'" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "personas.jsonl").exists() or not (tmp_path / "personas.jsonl").read_text()


def test_run_without_vllm_stops_before_any_stage(tmp_path):
    """Issue 63: `run --llm vllm` without the extra failed after 37-45 s of filter and Ray
    start-up. The packages are checked first: one line, exit 2, nothing filtered, no Ray."""
    from typer.testing import CliRunner

    from personaemp.cli import app

    processed = tmp_path / "processed"
    if ray.is_initialized():
        ray.shutdown()
    result = CliRunner().invoke(app, [
        "run", "--llm", "vllm", "--executor", "ray", "--model", "Qwen/Qwen2.5-7B-Instruct",
        "--set", f"paths.input={SAMPLE_TASK1}", "--set", f"paths.processed={processed}",
    ], env={"NO_COLOR": "1"})  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--llm vllm needs transformers, which is not installed here" in result.output
    assert "pip install 'personaemp[vllm]'" in result.output
    assert not (processed / "filtered.jsonl").exists() and not ray.is_initialized()


def test_a_round_whose_job_fails_stops_with_one_line_and_keeps_its_answers(local_ray, stand_in, tmp_path):
    """The Ray Data job dies mid-round (here the processor's last map raises for one row):
    one line with its reason and what to do; the answers written before stay in the
    `.partial` file, which the next round keeps (salvage)."""
    from personaemp.errors import PersonaempError
    from personaemp.llm.settings import LLMSettings

    folder = tmp_path / "round"
    folder.mkdir()
    requests = [(f"check-k{n}", {"model": "fake", "messages": [{"role": "user", "content": f"say {n}"}],
                                 "temperature": 0.0, "max_tokens": 50}) for n in range(40)]  # fmt: skip

    def dies_on_the_last(row: dict) -> dict:
        if row["custom_id"] == "check-k39":
            raise RuntimeError("the engine died")
        return as_vllm_output(row)

    with FakeOpenAI(responder=lambda body, number: {"content": "fine"}) as fake:
        stand_in(fake)
        parts = ray_vllm.build_processor_for(None)
        small = type(parts.config)(url=parts.config.url, concurrency=1, batch_size=4)
        processor = ray_vllm.Processor(small, as_request, dies_on_the_last)
        ray_vllm.build_processor_for = lambda settings: processor  # monkeypatched back by stand_in
        settings = LLMSettings(llm="vllm", executor="ray", model="fake", work_dir=tmp_path / "work")
        with pytest.raises(PersonaempError, match="a vLLM round stopped: .*the engine died") as caught:
            ray_vllm.answer(folder, requests, settings)
    assert "answers so far are kept" in caught.value.hint
    kept = ray_vllm.salvage(folder)
    assert 0 < kept < 40
    answered = {
        json.loads(line)["custom_id"]
        for path in folder.glob("*.jsonl")
        for line in path.read_text().splitlines()
    }
    assert "check-k39" not in answered and len(answered) == kept


@pytest.mark.parametrize(
    ("processor", "said"),
    [
        ({"batch_sise": 3}, "--vllm processor: "),
        ({"model_source": "other/model"}, "--vllm processor.model_source is set by personaemp"),
        (
            {"should_continue_on_error": False},
            "--vllm processor.should_continue_on_error is set by personaemp",
        ),
    ],
)
def test_a_wrong_vllm_processor_setting_is_one_line(processor, said):
    from personaemp.llm.settings import LLMSettings

    settings = LLMSettings(llm="vllm", executor="ray", model="m", vllm={"processor": processor})
    with pytest.raises(InputError, match=said.replace(".", r"\.")):
        ray_vllm.vllm_processor(settings)


def test_code_that_opens_an_engine_itself_is_told_vllm_has_no_endpoint(tmp_path):
    """The reward, the verl interaction, gen-dialogues' supporter open an engine and send:
    with --llm vllm there is nothing to send to (it used to post to a placeholder URL)."""
    import asyncio

    from personaemp.llm.session import open_engine
    from personaemp.llm.settings import LLMSettings

    async def opened():
        async with open_engine(LLMSettings(llm="vllm", executor="ray", model="m", work_dir=tmp_path)):
            pass

    with pytest.raises(InputError, match="--llm vllm has no endpoint to send to here"):
        asyncio.run(opened())


def infer_persona_in_rounds(folder: Path, sample_build: Path) -> tuple:
    """infer-persona on the sample's first USERS_IN_ROUNDS users with --llm vllm: (its result,
    its report's figures)."""
    from personaemp.dataset.options import PersonaOptions
    from personaemp.registry import STAGES

    folder.mkdir(exist_ok=True)
    shutil.copy(sample_build / "filtered.jsonl", folder / "filtered.jsonl")
    options = RunOptions(
        paths=PathsOptions(input=str(SAMPLE_TASK1), processed=folder),
        llm=LLMOptions(model="fake", llm="vllm", executor="ray", workers=1),
        persona=PersonaOptions(limit=USERS_IN_ROUNDS),
    )
    result = STAGES["infer-persona"].run(options, Console(quiet=True), full=True)
    return result, json.loads((folder / ".personaemp" / "run_report.json").read_text())["stages"][
        "infer-persona"
    ]


def test_an_invalid_reply_in_a_round_is_asked_again_in_the_next(local_ray, sample_build, stand_in, tmp_path):
    """BUG: an invalid answer was marked invalid in the cache, then not served on the next
    pass, so the same request was queued again instead of its re-ask: "still asking after 2
    vLLM rounds (0 requests unanswered)". (--batch had the same loop, for ever.) Now the
    re-ask goes out in the next round and the user ends as a persona, as in one process."""
    first_words = json.loads((sample_build / "filtered.jsonl").read_text().splitlines()[2])["memories"][0]
    base = order_free_responder()

    held = []  # the reply the first request would have had: the re-ask gets it

    def responder(body: dict, number: int):
        text = json.dumps(body, ensure_ascii=False)
        if "not json at all" in text:  # the re-ask, which quotes the bad reply
            return held[0]
        if first_words["value"] in text and '"traits"' in text:  # this user's persona request
            held.append(base(body, number))
            return reply("not json at all", usage=USAGE)
        return base(body, number)

    with FakeOpenAI(responder=responder) as fake:
        stand_in(fake)
        result, report = infer_persona_in_rounds(tmp_path / "run", sample_build)
    outcome = result.report.outcome
    assert (outcome.done, outcome.failed) == (USERS_IN_ROUNDS, 0)
    assert report["totals"]["reasks"] >= 1
    assert report["notes"]["vllm"]["rounds"] >= 2  # persona (with its levels), then its re-ask


def test_a_request_vllm_fails_on_is_one_failure_counted_once(local_ray, sample_build, stand_in, tmp_path):
    """BUG: a row vLLM refused made its unit fail on every later pass, and the summed passes
    counted it twice (failed 2, failed_before -1). Now: one failure row, failed 1."""
    first_words = json.loads((sample_build / "filtered.jsonl").read_text().splitlines()[2])["memories"][0]

    def refuses_one(row: dict) -> dict:
        out = as_vllm_output(row)
        if first_words["value"] in row["body"]:
            out["__inference_error__"] = "ValueError: the prompt is longer than max_model_len"
        return out

    # A killed run with other options left a request this run does not need: not sent.
    stale = tmp_path / "run" / ".personaemp" / "vllm"
    from personaemp.llm.settings import LLMSettings

    folder = ray_vllm.folder_for(
        LLMSettings(llm="vllm", executor="ray", model="fake", work_dir=stale.parent),
        "infer-persona", tmp_path / "run" / "personas.jsonl",
    )  # fmt: skip
    folder.mkdir(parents=True)
    old = {"model": "fake", "messages": [{"role": "user", "content": "OLD OPTIONS"}], "temperature": 1.0,
           "max_tokens": 9}  # fmt: skip
    line = {"custom_id": "persona-old", "method": "POST", "url": "/v1/chat/completions", "body": old}
    (folder / "infer-persona-round-1-part-1.jsonl").write_text(json.dumps(line) + "\n")
    with FakeOpenAI(responder=order_free_responder()) as fake:
        stand_in(fake, postprocess=refuses_one)
        result, report = infer_persona_in_rounds(tmp_path / "run", sample_build)
    assert not [r for r in fake.chat_requests if "OLD OPTIONS" in json.dumps(r.body)]
    assert not folder.exists()
    outcome = result.report.outcome
    assert (outcome.done, outcome.done_before, outcome.failed, outcome.failed_before) == (
        USERS_IN_ROUNDS - 1,
        0,
        1,
        0,
    )
    assert report["notes"]["vllm"]["refused"] == 1
    failures = rows(tmp_path / "run" / "infer-persona.failures.jsonl", NOT_COMPARED)
    assert len(failures) == 1 and "max_model_len" in json.dumps(failures)
