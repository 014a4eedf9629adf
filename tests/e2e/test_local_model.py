"""End to end: the embedded model's server answers a schema-constrained chat completion."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from personaemp.errors import PersonaempError
from personaemp.llm.local import (
    MODEL_NAME,
    GrammarLastSampler,
    LocalServer,
    _patch_llama_cpp,
    local_model_path,
)
from personaemp.llm.models import EMBEDDED
from personaemp.llm.session import open_engine
from personaemp.llm.settings import LLMSettings
from personaemp.llm.step import Step

pytestmark = pytest.mark.requires_model
REPO = Path(__file__).resolve().parents[2]


class Mood(BaseModel):
    # Bounded fields keep the constrained reply well under max_tokens, so it always closes.
    mood: Literal["calm", "upset", "neutral"]
    needs_support: bool
    reason: str = Field(max_length=24)


def port_is_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def answering_server():
    """One real server for the tests that need it only to answer (its start is 1.5 core-s, a
    load of the model, on each): started once, stopped after the module's last such test,
    and then checked stopped (the process ended, its port closed, its temp log removed)."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("NO_PROXY", "no_proxy"):  # else the openai client sends loopback via HTTP(S)_PROXY
            patch.setenv(name, "127.0.0.1,localhost")
        with LocalServer() as server:
            yield server
    assert server.process.poll() is not None
    assert not port_is_open(server.port)
    assert not server.log_path.exists(), "a temp log is removed after a clean run"


# `make test` (--dist loadgroup) hands a group to one worker: one server for both.
@pytest.mark.xdist_group("embedded-server")
def test_local_server_answers_a_schema_constrained_chat_completion(answering_server):
    """The server's own contract, through the openai client; its stop after a clean run is
    checked when the module's server stops (answering_server)."""
    server = answering_server
    assert server.model == MODEL_NAME
    assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
    client = openai.OpenAI(base_url=server.base_url, api_key="local", max_retries=0, timeout=120)
    instructions = "You read one message and classify the writer's mood. Answer with JSON only."
    message = "My sister and I argued again and I feel awful about it."
    reply = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "system", "content": instructions}, {"role": "user", "content": message}],
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_object", "schema": Mood.model_json_schema()},
    )
    assert reply.choices[0].finish_reason == "stop", "the grammar closes the object before max_tokens"
    Mood.model_validate(json.loads(reply.choices[0].message.content))
    assert server.process.poll() is None


class _Started:
    """open_engine's `LocalServer(log_path=...)`, answered by the module's running server: the
    engine path is the point here, not a second load of the model."""

    def __init__(self, server: LocalServer, calls: list[dict], **options) -> None:
        self.server = server
        calls.append(options)

    def __enter__(self) -> LocalServer:
        return self.server

    def __exit__(self, *exc_info) -> None:
        pass


@pytest.mark.xdist_group("embedded-server")
def test_the_engine_sends_a_schema_constrained_request_to_the_embedded_model(
    answering_server, tmp_path, monkeypatch
):
    """`--llm local` through the stages' own path (open_engine, the endpoint pool, Engine.call)
    on the real server: the request in json_object_schema mode with the local sampler's
    extras, and the model's reply valid under the schema. The stage tests replay recorded
    replies of this path (tests/cassettes.py); this one decodes."""
    import personaemp.llm.local as local

    calls: list[dict] = []
    monkeypatch.setattr(local, "LocalServer", lambda **options: _Started(answering_server, calls, **options))
    settings = LLMSettings(llm="local", work_dir=tmp_path / "work", temperature=0.0, max_tokens=64)
    messages = [
        {
            "role": "system",
            "content": "You read one message and classify the writer's mood. Answer with JSON only.",
        },
        {"role": "user", "content": "My sister and I argued again and I feel awful about it."},
    ]

    async def ask():
        async with open_engine(settings) as engine:
            return await engine.call(Step("mood", Mood), messages), engine.structured_report(), engine

    result, structured, engine = asyncio.run(ask())
    assert calls == [{"log_path": settings.local_log}], "open_engine starts the one local server"
    assert isinstance(result.value, Mood) and not result.cached
    assert structured["used"] == "json_object_schema"
    assert engine.model == MODEL_NAME and engine.endpoint_kind == "local"
    assert engine.accounting.step("mood").requests == 1


def test_a_server_that_cannot_load_its_model_fails_with_the_log_tail(tmp_path):
    log_path = tmp_path / "server.log"
    server = LocalServer(model_path=tmp_path / "missing.gguf", log_path=log_path, startup_timeout=60)
    started = time.monotonic()
    with pytest.raises(PersonaempError) as caught, server:
        pass
    assert time.monotonic() - started < 60, "an early exit is reported at once, not after the timeout"
    message = str(caught.value)
    assert "exited with code" in message
    assert str(log_path) in message
    assert "missing.gguf" in message  # the log tail names the cause
    assert server.process.poll() is not None


def test_startup_timeout_stops_the_half_started_server(tmp_path):
    server = LocalServer(log_path=tmp_path / "server.log", startup_timeout=0.01)
    with pytest.raises(PersonaempError, match="did not start within"), server:
        pass
    assert server.process.poll() is not None
    assert not port_is_open(server.port)


def test_grammar_checked_last_writes_what_upstream_writes(monkeypatch):
    """llama-cpp-python masks the whole vocabulary before every token; the patched sampler
    checks only the token it picked and masks only when that one breaks the grammar."""
    import llama_cpp.llama_cpp as llama_lib
    from llama_cpp import Llama

    # Undone after the test: _patch_llama_cpp replaces both on the class and the module.
    monkeypatch.setattr(Llama, "_init_sampler", Llama._init_sampler)
    monkeypatch.setattr(llama_lib, "llama_model_default_params", llama_lib.llama_model_default_params)
    upstream = Llama._init_sampler
    _patch_llama_cpp()
    llm = Llama(
        model_path=str(local_model_path()),
        n_ctx=1024,
        # One thread for the prompt too, as the server has (_server_command): llama-cpp-python's
        # default is every core, whose threads spin between batches (7-15 core-s against 3.5).
        n_threads=1,
        n_threads_batch=1,
        verbose=False,
        chat_format=EMBEDDED.chat_format,
    )
    schema = {
        "type": "object",
        "properties": {
            "mood": {"type": "string", "maxLength": 24},
            "words": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
        },
        "required": ["mood", "words"],
    }
    request = {
        "messages": [
            {
                "role": "user",
                "content": "A student who loves music had a hard week. Her mood and some words, as JSON.",
            }
        ],
        "response_format": {"type": "json_object", "schema": schema},
        "max_tokens": 200,
        "temperature": 0.0,
    }
    patched = llm.create_chat_completion(**request)
    sampler = llm._sampler
    assert isinstance(sampler, GrammarLastSampler)
    tokens = patched["usage"]["completion_tokens"]
    # Before the FEW best logits were tried first, 30 of 59 tokens of a reply like this one
    # masked all 262,144 tokens.
    assert sampler.full_scans < tokens / 8, (sampler.full_scans, tokens)

    monkeypatch.setattr(Llama, "_init_sampler", upstream)
    llm.reset()  # the prompt evaluated afresh, as for the first reply: a cached prefix shifts the logits
    reference = llm.create_chat_completion(**request)
    assert patched["choices"][0]["message"]["content"] == reference["choices"][0]["message"]["content"]
    json.loads(patched["choices"][0]["message"]["content"])


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_serve_local_stops_its_server_mid_reply(tmp_path):
    """Before: serve-local exec'd the server, and SIGTERM let it finish its reply (minutes)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cli = subprocess.Popen(
        [sys.executable, "-m", "personaemp", "serve-local", "--port", str(port), "--n-ctx", "2048"],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "serve.log", "wb"),  # noqa: SIM115
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 120
        while not port_is_open(port):
            assert cli.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        (server,) = _children(cli.pid)
        body = json.dumps(
            {"messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 4000}
        )
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            body.encode(),
            {"Content-Type": "application/json"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        threading.Thread(target=lambda: _ignore_errors(opener.open, request), daemon=True).start()
        time.sleep(0.5)  # the reply is being generated (4000 tokens: over a minute)
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=60) == 0
        with pytest.raises(ProcessLookupError):
            os.kill(server, 0)  # reaped by serve-local, not left running
        assert not port_is_open(port)
    finally:
        if cli.poll() is None:
            cli.kill()


def _ignore_errors(function, *args) -> None:
    with contextlib.suppress(OSError):
        function(*args, timeout=120).read()
