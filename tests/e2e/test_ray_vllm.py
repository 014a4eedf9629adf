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
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import SAMPLE_TASK1, order_free_responder
from fake_openai import FakeOpenAI, reply, server_error
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


def use_stand_in(monkeypatch, server: FakeOpenAI, postprocess=as_vllm_output) -> None:
    """ray_vllm's processor made ray.data.llm's HTTP processor against `server`."""
    from ray.data.llm import HttpRequestProcessorConfig

    # One request per batch: the request carries its JSON schema as a nested object (vLLM's
    # rows carry it as text), and Arrow would merge the schemas of a batch's rows into one.
    config = HttpRequestProcessorConfig(
        url=f"{server.base_url}/chat/completions", concurrency=1, batch_size=1
    )
    processor = ray_vllm.Processor(config, as_request, postprocess)
    monkeypatch.setattr(ray_vllm, "build_processor_for", lambda settings: processor)
    settings_only(monkeypatch)  # the stand-in needs ray.data.llm, not vLLM


@pytest.fixture
def stand_in(monkeypatch):
    """ray_vllm's processor made ray.data.llm's HTTP processor against a test server."""
    return lambda server, postprocess=as_vllm_output: use_stand_in(monkeypatch, server, postprocess)


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


# One `run` checks the rounds' properties: a Ray Data job costs the same whatever its requests (a
# new actor process importing ray.data.llm; the session's first pays Ray Data's warm-up), so
# the run of the sample's first USERS_IN_ROUNDS users (`shared`, once per module) is planted
# with what each test below is about: a killed round's answers, a request a killed run with
# other options left, an invalid reply and a request vLLM fails on. Each test asserts its own
# property on it. A round whose job fails has a run of its own (it stops the run).

ASKED_AGAIN = 2  # the user (a line of filtered.jsonl) whose persona reply is not JSON at first
REFUSED = 1  # the user whose persona request vLLM fails on
REFUSAL = "ValueError: the prompt is longer than max_model_len"
KEPT = 2  # the whole answer lines a killed round left: the other two users' persona replies
STALE = "OLD OPTIONS"  # the request a killed run with other options left


def memory_of(filtered: Path, line: int) -> str:
    """A user's first memory: in their persona request, in no other user's."""
    return json.loads(filtered.read_text().splitlines()[line])["memories"][0]["value"]


def persona_request(text: str, memory: str) -> bool:
    return memory in text and '"traits"' in text


def scripted(filtered: Path, refuse: bool):
    """The order-free model, but ASKED_AGAIN's persona reply is not JSON (its re-ask, which
    quotes it, gets the reply it would have had); with `refuse`, REFUSED's persona request is
    answered HTTP 422: in one process, what a request vLLM fails on is in rounds (`refusing`)."""
    base, held = order_free_responder(), []
    again, refused = memory_of(filtered, ASKED_AGAIN), memory_of(filtered, REFUSED)

    def responder(body: dict, number: int):
        text = json.dumps(body, ensure_ascii=False)
        if "not json at all" in text:  # the re-ask
            return held[0]
        if persona_request(text, again):
            held.append(base(body, number))
            return reply("not json at all", usage=USAGE)
        if refuse and persona_request(text, refused):
            return server_error(422)
        return base(body, number)

    return responder


def refusing(memory: str):
    """The stand-in's output, with vLLM's error row for the persona request naming `memory`."""

    def postprocess(row: dict) -> dict:
        out = as_vllm_output(row)
        if persona_request(row["body"], memory):
            out["__inference_error__"] = REFUSAL
        return out

    return postprocess


def asked(server: FakeOpenAI, body: dict) -> dict:
    """`server`'s reply to a request, as the stand-in sends it."""
    import urllib.request

    payload = as_request({"body": json.dumps(body, ensure_ascii=False)})["payload"]
    sent = urllib.request.Request(
        f"{server.base_url}/chat/completions",
        json.dumps(payload).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(sent, timeout=30) as response:
        return json.load(response)


def plant_a_killed_round(root: Path, filtered: Path, processed: Path) -> list[str]:
    """What killed runs leave in infer-persona's rounds folder: a request of a run with other
    options; this run's round-1 requests, with their answers file cut mid-line (KEPT whole
    lines, then half of ASKED_AGAIN's). The requests are infer-persona's first pass with
    --batch (no Ray), which writes what the rounds' first pass writes. Returns the kept
    answers' custom_ids."""
    from personaemp.dataset.options import PersonaOptions
    from personaemp.llm.settings import LLMSettings
    from personaemp.registry import STAGES

    scratch = root / "first-pass"
    scratch.mkdir()
    shutil.copy(filtered, scratch / "filtered.jsonl")
    llm = LLMOptions(model="fake", llm="vllm", executor="ray", workers=1, batch=scratch / "batch")
    paths = PathsOptions(input=str(SAMPLE_TASK1), processed=scratch)
    options = RunOptions(paths=paths, llm=llm, persona=PersonaOptions(limit=USERS_IN_ROUNDS))
    STAGES["infer-persona"].run(options, Console(quiet=True), full=True)
    [requests] = (scratch / "batch").glob("infer-persona-round-*.jsonl")
    lines = [json.loads(line) for line in requests.read_text().splitlines()]
    assert len(lines) == USERS_IN_ROUNDS

    settings = LLMSettings(llm="vllm", executor="ray", model="fake", work_dir=processed / ".personaemp")
    folder = ray_vllm.folder_for(settings, "infer-persona", processed / "personas.jsonl")
    folder.mkdir(parents=True)
    old = {
        "model": "fake",
        "messages": [{"role": "user", "content": STALE}],
        "temperature": 1.0,
        "max_tokens": 9,
    }
    line = {"custom_id": "persona-old", "method": "POST", "url": "/v1/chat/completions", "body": old}
    (folder / "infer-persona-round-1-part-1.jsonl").write_text(json.dumps(line) + "\n")
    shutil.copy(requests, folder / "infer-persona-round-2-part-1.jsonl")

    again, refused = memory_of(filtered, ASKED_AGAIN), memory_of(filtered, REFUSED)

    def of(memory: str) -> dict:
        return next(r for r in lines if persona_request(json.dumps(r["body"], ensure_ascii=False), memory))

    kept = [r for r in lines if r not in (of(again), of(refused))]
    written = []
    with FakeOpenAI(responder=scripted(filtered, refuse=False)) as server:
        for request in [*kept, of(again)]:
            row = {"custom_id": request["custom_id"], "body": json.dumps(request["body"], ensure_ascii=False),
                   "http_response": asked(server, request["body"])}  # fmt: skip
            written.append(json.dumps(ray_vllm.answer_line(as_vllm_output(row), "fake")))
    half = written[-1][: len(written[-1]) // 2]
    partial = folder / f".{ray_vllm.ANSWERS}killed.jsonl.partial"
    partial.write_text("".join(line + "\n" for line in written[:-1]) + half)
    return [r["custom_id"] for r in kept]


@dataclass
class Shared:
    processed: Path  # the rounds run's folder
    reference: Path  # one process's: the same users, the same model
    log: str  # the rounds run's console
    sent: list  # the chat requests the stand-in's server was sent
    sent_again: int  # ... and how many by the same command run again
    kept: list[str]  # the custom_ids of the killed round's whole answer lines
    root: Path

    def stages(self, folder: Path | None = None) -> dict:
        """The run report's stages: the rounds run's (not its second run's), or `folder`'s."""
        report = folder / ".personaemp" / "run_report.json" if folder else self.root / "run_report.json"
        return json.loads(report.read_text())["stages"]


@pytest.fixture(scope="module")
def shared(tmp_path_factory, sample_build, _ray_of_the_session) -> Shared:
    """`run --llm vllm --executor ray` on the shipped sample's first USERS_IN_ROUNDS users:
    each LLM stage in rounds, each round one ray.data.llm job on the local Ray; before it, a
    one-process run of those users on the same model (`scripted`), and after it, the same
    command again. Its rounds folder planted with a killed round (`plant_a_killed_round`);
    REFUSED's persona request failed in vLLM (`refusing`)."""
    from ray import cloudpickle

    from personaemp.dataset.options import PersonaOptions
    from personaemp.pipeline import run_pipeline

    if not ray.is_initialized():  # conftest's local_ray, for a module's fixture
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the stand-in's maps, on Ray's workers
    root = tmp_path_factory.mktemp("vllm_rounds")
    filtered = sample_build / "filtered.jsonl"
    persona = PersonaOptions(limit=USERS_IN_ROUNDS)

    reference = root / "one-process"
    with (
        FakeOpenAI(responder=scripted(filtered, refuse=True)) as one,
        open(root / "one-process.txt", "w") as log,
    ):
        paths = PathsOptions(input=str(SAMPLE_TASK1), processed=reference)
        llm = LLMOptions(base_url=[one.base_url], model="fake")
        run_pipeline(RunOptions(paths=paths, llm=llm, persona=persona), Console(file=log, width=200))

    processed = root / "processed"
    kept = plant_a_killed_round(root, reference / "filtered.jsonl", processed)
    llm = LLMOptions(model="fake", llm="vllm", executor="ray", workers=1)
    options = RunOptions(
        paths=PathsOptions(input=str(SAMPLE_TASK1), processed=processed), llm=llm, persona=persona
    )
    with (
        pytest.MonkeyPatch.context() as patch,
        FakeOpenAI(responder=scripted(filtered, refuse=False)) as fake,
    ):
        use_stand_in(patch, fake, refusing(memory_of(filtered, REFUSED)))
        with open(root / "log.txt", "w") as log:
            run_pipeline(options, Console(file=log, width=200))
        sent = list(fake.chat_requests)
        shutil.copy(processed / ".personaemp" / "run_report.json", root / "run_report.json")
        with open(root / "log2.txt", "w") as log:
            run_pipeline(options, Console(file=log, width=200))
        sent_again = fake.count - len(sent)
    return Shared(processed, reference, (root / "log.txt").read_text(), sent, sent_again, kept, root)


def test_run_with_vllm_rounds_writes_what_one_process_writes(local_ray, shared):
    """The personas, queries, failures and splits are the one-process run's (the same users
    and model), each request answered once, and the rounds folder is gone once the stage is
    done (the cache holds the answers). Run again: nothing is sent."""
    processed, reference = shared.processed, shared.reference
    assert shared.sent_again == 0  # the second run is answered by the cache and the output scan
    assert "round 1," in shared.log and "round 2," in shared.log

    splits = ("splits/random/train.jsonl", "splits/random/test.jsonl")
    same = (
        "filtered.jsonl",
        "personas.jsonl",
        "queries.jsonl",
        "rejected.jsonl",
        "gen-queries.failures.jsonl",
        *splits,
    )
    for name in same:
        assert rows(processed / name, NOT_COMPARED) == rows(reference / name, NOT_COMPARED), name
    assert rows(processed / "personas.jsonl")  # not two empty files
    # REFUSED's failure row, but for the error's words and `attempts` (one process sent the
    # request and was answered HTTP 422; in rounds, the stage found vLLM's refusal in the cache)
    failures, refusal = "infer-persona.failures.jsonl", NOT_COMPARED | {"error", "attempts"}
    assert rows(processed / failures, refusal) == rows(reference / failures, refusal)
    assert len(rows(reference / failures)) == 1
    assert not (processed / ".personaemp" / "vllm").exists() or not any(
        (processed / ".personaemp" / "vllm").iterdir()
    )
    stages, theirs = shared.stages(), shared.stages(reference)
    asked = 0
    for stage in ("infer-persona", "gen-queries"):
        figures = stages[stage]["notes"]["vllm"]
        # infer-persona: one request a user (its levels in the reply), a re-ask; gen-queries: a chain
        assert figures["rounds"] >= 2, stage
        # one process's requests: those the killed round had answered were not asked again
        before = len(shared.kept) if stage == "infer-persona" else 0
        assert figures["answered"] + figures["refused"] + before == theirs[stage]["totals"]["requests"], stage
        assert stages[stage]["endpoint_kind"] == "vllm"
        for figure in ("done", "done_before", "failed", "failed_before"):
            assert stages[stage][figure] == theirs[stage][figure], (stage, figure)
        asked += figures["answered"] + figures["refused"]
    assert asked == len(shared.sent)


def test_an_unfinished_round_resumes_with_only_the_unanswered_requests(local_ray, shared, tmp_path):
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

    # The shared run, its infer-persona folder planted with such a round: KEPT answers kept,
    # their requests not sent; the half line's request (ASKED_AGAIN's) sent again.
    assert f"infer-persona: {KEPT} answers of an unfinished round kept" in shared.log
    assert len(shared.kept) == KEPT
    sent = [json.dumps(r.body, ensure_ascii=False) for r in shared.sent]
    filtered = shared.processed / "filtered.jsonl"
    persona_requests = [text for text in sent if '"traits"' in text]
    assert len(persona_requests) == USERS_IN_ROUNDS - KEPT + 1  # ASKED_AGAIN's, REFUSED's, a re-ask
    for line in (ASKED_AGAIN, REFUSED):
        assert any(persona_request(text, memory_of(filtered, line)) for text in persona_requests)
    personas = {row["user_id"] for row in rows(shared.processed / "personas.jsonl")}
    assert len(personas) == USERS_IN_ROUNDS - 1  # the kept answers' users are personas: all but REFUSED
    assert shared.stages()["infer-persona"]["notes"]["vllm"]["rounds"] == 2  # the unanswered, the re-ask


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


def test_run_without_vllm_stops_before_any_stage(tmp_path, monkeypatch):
    """Issue 63: `run --llm vllm` without the extra failed after 37-45 s of filter and Ray
    start-up. The packages are checked first: one line, exit 2, nothing filtered, no Ray:
    personaemp's way to Ray (ray_executor.connect) not taken, and no Ray started where none
    was up. (A Ray this process had up is left up: shutting it down cost the next Ray test
    a new start, about 4 core-s.)"""
    from typer.testing import CliRunner

    from personaemp.cli import app
    from personaemp.llm import ray_executor, stage

    connected = []
    for module in (ray_executor, stage):
        monkeypatch.setattr(module, "connect", lambda settings: connected.append(settings) or "a Ray")
    up = ray.is_initialized()
    processed = tmp_path / "processed"
    result = CliRunner().invoke(app, [
        "run", "--llm", "vllm", "--executor", "ray", "--model", "Qwen/Qwen2.5-7B-Instruct",
        "--set", f"paths.input={SAMPLE_TASK1}", "--set", f"paths.processed={processed}",
    ], env={"NO_COLOR": "1"})  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--llm vllm needs transformers, which is not installed here" in result.output
    assert "pip install 'personaemp[vllm]'" in result.output
    assert not (processed / "filtered.jsonl").exists()
    assert connected == [] and ray.is_initialized() == up


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


def test_an_invalid_reply_in_a_round_is_asked_again_in_the_next(local_ray, shared):
    """BUG: an invalid answer was marked invalid in the cache, then not served on the next
    pass, so the same request was queued again instead of its re-ask: "still asking after 2
    vLLM rounds (0 requests unanswered)". (--batch had the same loop, for ever.) Now the
    re-ask goes out in the next round and the user ends as a persona, as in one process."""
    filtered = shared.processed / "filtered.jsonl"
    user = json.loads(filtered.read_text().splitlines()[ASKED_AGAIN])["user_id"]
    assert user in {row["user_id"] for row in rows(shared.processed / "personas.jsonl")}
    failed = {row.get("user_id") for row in rows(shared.processed / "infer-persona.failures.jsonl")}
    assert user not in failed
    report = shared.stages()["infer-persona"]
    assert report["totals"]["reasks"] >= 1
    assert report["notes"]["vllm"]["rounds"] >= 2  # persona (with its levels), then its re-ask
    reasks = [r for r in shared.sent if "not json at all" in json.dumps(r.body)]
    assert len(reasks) == 1


def test_a_request_vllm_fails_on_is_one_failure_counted_once(local_ray, shared):
    """BUG: a row vLLM refused made its unit fail on every later pass, and the summed passes
    counted it twice (failed 2, failed_before -1). Now: one failure row, failed 1. And a
    request a killed run with other options left is not sent; its folder goes."""
    assert not [r for r in shared.sent if STALE in json.dumps(r.body)]
    assert not (shared.processed / ".personaemp" / "vllm").exists() or not any(
        (shared.processed / ".personaemp" / "vllm").iterdir()
    )
    report = shared.stages()["infer-persona"]
    assert report["notes"]["vllm"]["rounds"] >= 2  # the refused unit was in a pass after its refusal
    assert (report["done"], report["done_before"], report["failed"], report["failed_before"]) == (
        USERS_IN_ROUNDS - 1,
        0,
        1,
        0,
    )
    assert report["notes"]["vllm"]["refused"] == 1
    failures = rows(shared.processed / "infer-persona.failures.jsonl", NOT_COMPARED)
    assert len(failures) == 1 and "max_model_len" in json.dumps(failures)
    user = json.loads((shared.processed / "filtered.jsonl").read_text().splitlines()[REFUSED])["user_id"]
    assert failures[0].get("user_id") == user
