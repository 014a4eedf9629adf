"""End to end: the embedded gemma-3-270m server answers a schema-constrained chat completion."""

from __future__ import annotations

import json
import socket
import time
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from personaemp.errors import PersonaempError
from personaemp.llm.local import MODEL_NAME, LocalServer


class Mood(BaseModel):
    # Bounded fields keep the constrained reply well under max_tokens, so it always closes.
    mood: Literal["calm", "upset", "neutral"]
    needs_support: bool
    reason: str = Field(max_length=24)


def port_is_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_local_server_answers_a_schema_constrained_chat_completion(monkeypatch):
    for name in ("NO_PROXY", "no_proxy"):  # else the openai client sends loopback via HTTP(S)_PROXY
        monkeypatch.setenv(name, "127.0.0.1,localhost")
    with LocalServer() as server:
        assert server.model == MODEL_NAME
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
        client = openai.OpenAI(base_url=server.base_url, api_key="local", max_retries=0, timeout=120)
        instructions = "You read one message and classify the writer's mood. Answer with JSON only."
        message = "My sister and I argued again and I feel awful about it."
        reply = client.chat.completions.create(
            model=server.model,
            # chat_format gemma drops system messages, so the instructions ride in the user turn
            messages=[{"role": "user", "content": f"{instructions}\n\n{message}"}],
            max_tokens=64,
            temperature=0,
            response_format={"type": "json_object", "schema": Mood.model_json_schema()},
        )
        assert reply.choices[0].finish_reason == "stop", "the grammar closes the object before max_tokens"
        Mood.model_validate(json.loads(reply.choices[0].message.content))
        process, port, log_path = server.process, server.port, server.log_path

    assert process.poll() is not None
    assert not port_is_open(port)
    assert not log_path.exists(), "a temp log is removed after a clean run"


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
