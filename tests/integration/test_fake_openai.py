"""Tests of the fake OpenAI server itself, through the real `openai` client and raw HTTP."""

from __future__ import annotations

import enum
import http.client
import json
import math
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import openai
import pytest
from fake_openai import (
    FAULTS,
    HUGE_MAX,
    INVALID_JSON_TEXT,
    KEY_FORMS,
    FakeOpenAI,
    drop,
    empty,
    fault_responder,
    hang,
    huge,
    instance_from_schema,
    invalid_json_content,
    lognormal_latency,
    malformed_body,
    rate_limit,
    reply,
    schema_invalid,
    server_error,
    trickle,
    truncated,
)
from pydantic import BaseModel, Field

HERE = Path(__file__).resolve().parents[1]
MESSAGES = [
    {"role": "system", "content": "You are terse."},  # 14 chars
    {"role": "user", "content": "Describe this user."},  # 19 chars
]


# --------------------------------------------------------------------------- pydantic models


class Level(enum.StrEnum):
    low = "low"
    medium = "medium"
    high = "high"


class Trait(BaseModel):
    aspect: Literal["openness", "conscientiousness", "extraversion", "agreeableness", "neuroticism"]
    statement: str = Field(min_length=12)
    evidence: list[str] = Field(min_length=2)
    weight: float = Field(gt=0, lt=1)


class BigFive(BaseModel):
    openness: Level
    conscientiousness: Level
    extraversion: Level
    agreeableness: Level
    neuroticism: Level


class Persona(BaseModel):
    eligible: bool
    gate_reason: str | None = None
    topics: list[str]
    traits: list[Trait]
    big_five: BigFive
    best_trait: Trait | None = None
    score: int = Field(ge=3, le=5)
    tags: dict[str, int] = {}


class Query(BaseModel):
    type: Literal["ES", "HEQ", "SS"]
    situation: str
    text: str = Field(max_length=3)
    pair: tuple[int, str]


class Queries(BaseModel):
    queries: list[Query] = Field(min_length=3, max_length=3)
    note: Literal["ok"] = "ok"


class Node(BaseModel):  # recursive: the generator must find a way out
    name: str
    children: list[Node] = []
    parent: Node | None = None


def client_for(server: FakeOpenAI, **kw) -> openai.OpenAI:
    kw.setdefault("max_retries", 0)
    kw.setdefault("timeout", 5.0)
    return openai.OpenAI(base_url=server.base_url, api_key="test-key", **kw)


def json_schema_format(model: type[BaseModel]) -> dict:
    schema = model.model_json_schema()
    return {"type": "json_schema", "json_schema": {"name": model.__name__, "schema": schema}}


@pytest.fixture
def server():
    with FakeOpenAI() as s:
        yield s


# --------------------------------------------------------------------------- schema instances


@pytest.mark.parametrize("model", [Trait, BigFive, Persona, Query, Queries, Node])
def test_instance_from_pydantic_schema_validates(model):
    instance = instance_from_schema(model.model_json_schema())
    model.model_validate(instance)  # raises if the generator got the schema wrong
    assert json.loads(json.dumps(instance)) == instance


def test_instance_respects_constraints():
    p = Persona.model_validate(instance_from_schema(Persona.model_json_schema()))
    assert p.best_trait is not None and p.gate_reason is not None  # optional fields are filled
    assert len(p.traits) == 1 and len(p.traits[0].evidence) == 2
    assert p.score == 3
    q = Queries.model_validate(instance_from_schema(Queries.model_json_schema()))
    assert len(q.queries) == 3 and all(len(x.text) <= 3 for x in q.queries)


def test_instance_from_hand_written_schemas():
    schema = {
        "definitions": {"Kind": {"enum": ["b", "c"]}},
        "type": "object",
        "required": ["a"],
        "properties": {
            "a": {"type": ["string", "null"], "minLength": 6},
            "k": {"$ref": "#/definitions/Kind"},
            "c": {"const": 7},
            "o": {"oneOf": [{"type": "integer", "minimum": 10}, {"type": "string"}]},
            "arr": {"type": "array", "items": {"type": "boolean"}, "minItems": 3},
            "none": {"type": "null"},
            "n": {"type": "number", "minimum": 2.5},
        },
    }
    got = instance_from_schema(schema)
    assert got == {"a": "textxx", "k": "b", "c": 7, "o": 10, "arr": [True] * 3, "none": None, "n": 2.5}
    assert instance_from_schema({"type": "array", "items": {"type": "integer"}}) == [1]
    assert instance_from_schema({"type": "string", "enum": ["x", "y"]}) == "x"


# --------------------------------------------------------------------------- default replies


def test_default_reply_follows_json_schema_request(server):
    client = client_for(server)
    resp = client.chat.completions.create(
        model="gpt-test", messages=MESSAGES, response_format=json_schema_format(Persona)
    )
    Persona.model_validate_json(resp.choices[0].message.content)
    assert resp.model == "gpt-test"
    assert resp.choices[0].finish_reason == "stop"


def test_default_reply_follows_llama_cpp_json_object_schema(server):
    client = client_for(server)
    fmt = {"type": "json_object", "schema": Queries.model_json_schema()}
    resp = client.chat.completions.create(model="local", messages=MESSAGES, response_format=fmt)
    Queries.model_validate_json(resp.choices[0].message.content)
    assert server.requests[-1].body["response_format"]["type"] == "json_object"


def test_default_reply_works_with_client_parse_helper(server):
    # .parse() rewrites the schema for strict mode (additionalProperties false, all required).
    resp = client_for(server).chat.completions.parse(model="m", messages=MESSAGES, response_format=Persona)
    assert isinstance(resp.choices[0].message.parsed, Persona)
    assert server.requests[-1].body["response_format"]["json_schema"]["strict"] is True


def test_default_reply_writes_as_many_situations_as_asked_one_per_category(server, tmp_path):
    """gen-queries asks for at most per_category moments of each category; a capable model
    writes them all (it wrote one, so a cost per query measured here was off by up to 3x)."""
    from types import SimpleNamespace

    from personaemp.dataset.queries import SITUATIONS, QueryOptions, situations_schema

    persona = SimpleNamespace(memories=[SimpleNamespace(memory_id=f"m{i}") for i in (1, 2)])
    for options, expected in (
        (QueryOptions(), ["ES", "HEQ", "SS"]),
        (QueryOptions(per_category=2, categories=("ES", "SS")), ["ES", "SS", "ES", "SS"]),
    ):
        schema = situations_schema(persona, options)
        resp = client_for(server).chat.completions.create(
            model="m", messages=MESSAGES,
            response_format={"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}},
        )  # fmt: skip
        reply = SITUATIONS.reply.model_validate_json(resp.choices[0].message.content)
        assert [s.category for s in reply.situations] == expected


def test_default_reply_without_schema_is_empty_object(server):
    resp = client_for(server).chat.completions.create(model="m", messages=MESSAGES)
    assert resp.choices[0].message.content == "{}"
    resp = client_for(server).chat.completions.create(
        model="m", messages=MESSAGES, response_format={"type": "json_object"}
    )
    assert resp.choices[0].message.content == "{}"


def test_usage_counts_characters_over_four(server):
    server.queue(reply("x" * 9))
    resp = client_for(server).chat.completions.create(model="m", messages=MESSAGES)
    assert resp.usage.prompt_tokens == math.ceil((14 + 19) / 4) == 9
    assert resp.usage.completion_tokens == 3
    assert resp.usage.total_tokens == 12
    server.queue(reply("hi", usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}))
    resp = client_for(server).chat.completions.create(model="m", messages=MESSAGES)
    assert (resp.usage.prompt_tokens, resp.usage.total_tokens) == (1, 3)


def test_response_shape_on_the_wire(server):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    conn.request(
        "POST",
        "/v1/chat/completions",
        json.dumps({"model": "shape", "messages": MESSAGES, "n": 2}),
        {"Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    data = json.loads(resp.read())
    assert resp.status == 200 and resp.getheader("Content-Type") == "application/json"
    assert set(data) == {"id", "object", "created", "model", "choices", "usage"}
    assert data["object"] == "chat.completion" and data["model"] == "shape"
    assert isinstance(data["created"], int) and data["id"].startswith("chatcmpl-")
    assert data["choices"] == [
        {"index": i, "message": {"role": "assistant", "content": "{}"}, "finish_reason": "stop"}
        for i in range(2)
    ]
    conn.close()


# --------------------------------------------------------------------------- queue and responder


def test_queue_is_fifo_then_responder():
    seen = []

    def responder(body, number):
        seen.append(number)
        return {"n": number} if number % 2 else f"plain {number}"

    with FakeOpenAI(responder=responder) as server:
        server.queue(reply("first"), "second")
        server.queue(reply({"third": 3}))
        client = client_for(server)
        contents = [
            client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content
            for _ in range(5)
        ]
    assert contents == ["first", "second", '{"third": 3}', "plain 4", '{"n": 5}']
    assert seen == [4, 5]  # the responder is asked only once the queue is empty


def test_responder_may_return_actions():
    with FakeOpenAI(responder=lambda body, n: rate_limit(0.01) if n == 1 else "ok") as server:
        client = client_for(server)
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model="m", messages=MESSAGES)
        assert client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == "ok"


def test_responder_exception_is_a_500_and_recorded():
    def responder(body, number):
        raise KeyError("boom")

    with FakeOpenAI(responder=responder) as server:
        with pytest.raises(openai.InternalServerError, match="boom"):
            client_for(server).chat.completions.create(model="m", messages=MESSAGES)
        assert len(server.errors) == 1 and isinstance(server.errors[0], KeyError)


# --------------------------------------------------------------------------- faults


def test_rate_limit_is_rate_limit_error_with_retry_after(server):
    server.queue(rate_limit(0.25))
    with pytest.raises(openai.RateLimitError) as info:
        client_for(server).chat.completions.create(model="m", messages=MESSAGES)
    err = info.value
    assert err.status_code == 429
    assert err.response.headers["retry-after"] == "0.25"
    assert err.code == "rate_limit_exceeded"
    assert server.count == 1


def test_client_retries_rate_limits_by_default_honouring_retry_after(server):
    server.queue(rate_limit(0.01), rate_limit(0.01))
    client = openai.OpenAI(base_url=server.base_url, api_key="k")  # default max_retries=2
    started = time.monotonic()
    resp = client.chat.completions.create(model="m", messages=MESSAGES)
    assert resp.choices[0].message.content == "{}"
    assert time.monotonic() - started < 0.4  # Retry-After (0.01 s) replaced the 0.5 s backoff
    assert [r.headers["x-stainless-retry-count"] for r in server.requests] == ["0", "1", "2"]


@pytest.mark.parametrize("status", [500, 503])
def test_server_error_is_internal_server_error(server, status):
    server.queue(server_error(status))
    with pytest.raises(openai.InternalServerError) as info:
        client_for(server).chat.completions.create(model="m", messages=MESSAGES)
    assert info.value.status_code == status
    assert info.value.body["type"] == "server_error"


def test_drop_is_connection_error_and_the_client_recovers(server):
    server.queue(drop())
    client = client_for(server)
    with pytest.raises(openai.APIConnectionError) as info:
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert not isinstance(info.value, openai.APITimeoutError)
    assert client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == "{}"
    assert server.count == 2


def test_drop_sends_no_bytes(server):
    server.queue(drop())
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    conn.request("POST", "/v1/chat/completions", json.dumps({"messages": []}))
    with pytest.raises(http.client.RemoteDisconnected):
        conn.getresponse()


def test_hang_triggers_client_timeout(server):
    server.queue(hang(1.0))
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        client_for(server, timeout=0.2).chat.completions.create(model="m", messages=MESSAGES)
    assert 0.19 < time.monotonic() - started < 0.9


def test_hang_then_replies_normally(server):
    server.queue(hang(0.05, content="late"))
    resp = client_for(server).chat.completions.create(model="m", messages=MESSAGES)
    assert resp.choices[0].message.content == "late"


def test_trickle_sends_the_whole_reply_a_byte_at_a_time(server):
    server.queue(trickle(0.001, bound=30, content="slow"))
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    conn.request("POST", "/v1/chat/completions", json.dumps({"messages": MESSAGES}))
    response = conn.getresponse()
    first = response.read(1)
    rest = response.read()
    assert response.status == 200 and len(first) == 1
    assert json.loads(first + rest)["choices"][0]["message"]["content"] == "slow"
    assert server.trickles_abandoned == 0


def test_trickle_gives_up_at_its_bound_so_a_patient_client_never_hangs(server):
    server.queue(trickle(0.05, bound=0.3))
    with pytest.raises(openai.APIConnectionError) as info:
        client_for(server, timeout=5).chat.completions.create(model="m", messages=MESSAGES)
    assert not isinstance(info.value, openai.APITimeoutError)  # each read was quick
    assert server.trickles_abandoned == 1


def test_huge_sends_content_of_the_size_asked(server):
    server.queue(huge(200_000))
    answer = client_for(server).chat.completions.create(model="m", messages=MESSAGES)
    assert answer.choices[0].message.content == "x" * 200_000
    with pytest.raises(ValueError):
        huge(HUGE_MAX + 1)


@pytest.mark.parametrize("form", sorted(KEY_FORMS))
def test_echo_key_forms(form):
    key = "sk-Echo-0123"
    expected = {
        "as_is": key, "upper": "SK-ECHO-0123", "lower": "sk-echo-0123", "swapcase": "SK-eCHO-0123",
        "percent": "%73%6B%2D%45%63%68%6F%2D%30%31%32%33",
        "percent_lower": "%73%6b%2d%45%63%68%6f%2d%30%31%32%33",
    }[form]  # fmt: skip
    with (
        FakeOpenAI(echo_key=form, require_key="sk-other") as server,
        pytest.raises(openai.AuthenticationError) as info,
    ):
        openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0).models.list()
    assert info.value.body["message"] == f"Incorrect API key provided: {expected}."
    with FakeOpenAI(echo_key=form) as server:
        answer = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0).chat.completions.create(
            model="m", messages=MESSAGES
        )
    assert json.loads(answer.choices[0].message.content) == {"note": expected}
    with pytest.raises(ValueError):
        FakeOpenAI(echo_key="rot13")


def test_stop_wakes_a_hanging_handler():
    server = FakeOpenAI()
    server.queue(hang(30))
    errors = []

    def call():
        try:
            client_for(server, timeout=30).chat.completions.create(model="m", messages=MESSAGES)
        except Exception as exc:
            errors.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    while server.in_flight == 0:
        time.sleep(0.005)
    started = time.monotonic()
    server.stop()
    worker.join(5)
    assert not worker.is_alive() and time.monotonic() - started < 2
    # woken early, the handler answers normally (or the connection is already shut down)
    assert errors == [] or isinstance(errors[0], openai.APIConnectionError)


def test_malformed_body_raises_json_decode_error_not_an_openai_error(server):
    # What actually happens: the client trusts Content-Type: application/json, calls
    # response.json() and lets json.JSONDecodeError (a ValueError) escape unwrapped.
    server.queue(malformed_body(), malformed_body())
    with pytest.raises(json.JSONDecodeError):
        client_for(server).chat.completions.create(model="m", messages=MESSAGES)
    with urllib.request.urlopen(
        urllib.request.Request(
            server.base_url + "/chat/completions", data=json.dumps({"messages": []}).encode(), method="POST"
        ),
        timeout=5,
    ) as resp:
        assert resp.status == 200
        with pytest.raises(json.JSONDecodeError):
            json.loads(resp.read())


def test_content_faults_are_200_replies(server):
    server.queue(
        invalid_json_content(),
        truncated(),
        truncated("abc"),
        empty(),
        schema_invalid({"kind": "nope"}),
    )
    client = client_for(server)
    fmt = json_schema_format(BigFive)

    def ask():
        return client.chat.completions.create(model="m", messages=MESSAGES, response_format=fmt).choices[0]

    bad = ask()
    assert bad.message.content == INVALID_JSON_TEXT and bad.finish_reason == "stop"
    with pytest.raises(json.JSONDecodeError):
        json.loads(bad.message.content)
    cut = ask()
    full = json.dumps(instance_from_schema(BigFive.model_json_schema()))
    assert cut.finish_reason == "length" and cut.message.content == full[: len(full) // 2]
    assert ask().message.content == "abc"
    assert ask().message.content == ""
    wrong = ask()
    assert json.loads(wrong.message.content) == {"kind": "nope"}


def test_parse_helper_reactions_to_content_faults(server):
    client = client_for(server)
    server.queue(truncated())
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(model="m", messages=MESSAGES, response_format=BigFive)
    server.queue(empty())
    resp = client.chat.completions.parse(model="m", messages=MESSAGES, response_format=BigFive)
    assert resp.choices[0].message.parsed is None  # empty content: no error, just nothing parsed


# --------------------------------------------------------------------------- recording and concurrency


def test_count_and_recorded_requests(server):
    client = client_for(server)
    started = time.monotonic()
    client.chat.completions.create(model="m1", messages=MESSAGES, temperature=0.5)
    client.models.list()
    assert server.count == 1  # GET /v1/models is recorded but not counted
    assert [(r.method, r.path) for r in server.requests] == [
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
    ]
    chat = server.requests[0]
    assert chat.headers["authorization"] == "Bearer test-key"
    assert chat.body["model"] == "m1" and chat.body["temperature"] == 0.5
    assert chat.body["messages"] == MESSAGES
    assert json.loads(chat.raw) == chat.body
    assert started <= chat.received_at <= server.requests[1].received_at <= time.monotonic()
    assert server.chat_requests == [chat]


def test_models_endpoint():
    with FakeOpenAI() as server:
        with urllib.request.urlopen(server.base_url + "/models", timeout=5) as resp:
            data = json.loads(resp.read())
        model = {"id": "fake-model", "object": "model", "owned_by": "test"}
        assert data == {"object": "list", "data": [model]}
        assert [m.id for m in client_for(server).models.list()] == ["fake-model"]


def test_bad_requests_get_openai_style_errors(server):
    client = client_for(server)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="m", prompt="x")
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.post("/chat/completions", body={"model": "m"}, cast_to=object)


def test_max_in_flight_with_concurrent_requests():
    with FakeOpenAI(latency=lambda: 0.3) as server:
        client = client_for(server)
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(
                pool.map(lambda _: client.chat.completions.create(model="m", messages=MESSAGES), range(8))
            )
        elapsed = time.monotonic() - started
        assert len(results) == 8 and server.count == 8
        assert server.max_in_flight == 8
        assert server.in_flight == 0
        assert elapsed < 8 * 0.3 / 2  # answered concurrently, not one after another


def test_keep_alive_reuses_one_connection(server):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    body = json.dumps({"model": "m", "messages": MESSAGES})
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    first = conn.getresponse()
    assert first.status == 200 and first.getheader("Content-Length")
    first.read()
    sock = conn.sock
    server.queue(rate_limit())  # error responses keep the connection open too
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    second = conn.getresponse()
    second.read()
    assert second.status == 429 and conn.sock is sock
    conn.request("POST", "/v1/chat/completions", body, {"Connection": "close"})
    third = conn.getresponse()
    assert third.getheader("Connection") == "close"
    assert json.loads(third.read())["object"] == "chat.completion"
    conn.close()


# --------------------------------------------------------------------------- latency, faults, standalone


def test_lognormal_latency_median():
    draw = lognormal_latency(0.3, 0.8, random.Random(1))
    samples = [draw() for _ in range(4001)]
    assert all(s > 0 for s in samples)
    assert 0.27 < statistics.median(samples) < 0.33
    again = lognormal_latency(0.3, 0.8, random.Random(1))
    assert [again() for _ in range(5)] == samples[:5]


def test_fault_responder_rate_and_kinds():
    respond = fault_responder(0.3, seed=1)
    signatures = {name: make() for name, make in FAULTS.items()}
    assert len(set(signatures.values())) == 6  # the six faults are distinguishable actions
    by_action = {action: name for name, action in signatures.items()}
    drawn = [respond({}, n) for n in range(1, 3001)]
    names = [by_action.get(action, "ok") for action in drawn]
    assert 0.27 < 1 - names.count("ok") / len(names) < 0.33
    assert set(names) == {"ok", *FAULTS}
    assert set(FAULTS) == {"rate_limit", "server_error", "invalid_json_content", "truncated", "empty", "drop"}
    assert fault_responder(0.3, seed=1)({}, 17) == drawn[16]  # depends only on (seed, number)
    assert [fault_responder(0.3, seed=2)({}, n) for n in range(1, 3001)] != drawn


@contextmanager
def standalone(*flags: str) -> Iterator[str]:
    """`python tests/fake_openai.py --port 0 FLAGS` as a child process: its first line on stdout
    (READY <base url>). Killed at the end, or after 10 s: a stuck child never hangs the test run."""
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "fake_openai.py"), "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    killer = threading.Timer(10, proc.kill)
    killer.start()
    try:
        yield proc.stdout.readline().strip()
    finally:
        killer.cancel()
        proc.kill()
        proc.wait(5)
        proc.stdout.close()
        proc.stderr.close()


def test_standalone_prints_ready_and_serves():
    flags = ("--latency-median", "0.01", "--latency-sigma", "0.5", "--fault-rate", "0", "--seed", "1")
    with standalone(*flags) as line:
        assert line.startswith("READY http://127.0.0.1:") and line.endswith("/v1")
        base_url = line.split()[1]
        client = openai.OpenAI(base_url=base_url, api_key="k", max_retries=0, timeout=5)
        resp = client.chat.completions.create(
            model="bench", messages=MESSAGES, response_format=json_schema_format(BigFive)
        )
        BigFive.model_validate_json(resp.choices[0].message.content)
        assert resp.model == "bench"
