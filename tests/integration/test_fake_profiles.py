"""Provider profiles, the prompt-schema fallback and the key-safety options of the fake server.

Every profile is checked through the real `openai` client (or raw HTTP where the wire matters)
against the behaviour documented in tests/fake_openai.py.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Literal

import openai
import pytest
from fake_openai import (
    LLAMACPP_JSON_SCHEMA,
    PROFILES,
    REASONING,
    FakeOpenAI,
    empty,
    hang,
    instance_from_schema,
    rate_limit,
    reply,
    schema_from_messages,
    server_error,
    truncated,
)
from pydantic import BaseModel, Field
from test_fake_openai import standalone

HERE = Path(__file__).resolve().parents[1]


class Step(BaseModel):
    kind: Literal["walk", "run"]
    minutes: int = Field(ge=5)


class Plan(BaseModel):  # nested: its schema has "$defs"
    title: str = Field(min_length=3)
    steps: list[Step] = Field(min_length=2)
    done: bool


class Mood(BaseModel):
    mood: Literal["calm", "tense"]
    score: int = Field(ge=1, le=9)


PLAN_SCHEMA = Plan.model_json_schema()
MOOD_SCHEMA = Mood.model_json_schema()
PLAN = instance_from_schema(PLAN_SCHEMA)
PLAN_TEXT = json.dumps(PLAN)
MOOD_TEXT = json.dumps(instance_from_schema(MOOD_SCHEMA))
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "Plan", "schema": PLAN_SCHEMA}}
OBJECT_FORMAT = {"type": "json_object"}
LLAMA_FORMAT = {"type": "json_object", "schema": MOOD_SCHEMA}
# The schema only in the prompt, as clients do for endpoints that cannot take one.
PROMPT = [
    {"role": "system", "content": "Answer in JSON following this schema: " + json.dumps(PLAN_SCHEMA)},
    {"role": "user", "content": "Plan my morning."},
]
NO_JSON_WORD = [{"role": "user", "content": "Plan my morning."}]
THINK = f"<think>\n{REASONING}\n</think>\n\n"


def client_for(server: FakeOpenAI, key: str = "k") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=5)


def chat(server: FakeOpenAI, messages=PROMPT, response_format=None, key: str = "k", **extra) -> dict:
    """POST a chat request through the openai client; the raw JSON reply as a dict."""
    body = {"model": "m", "messages": messages, **extra}
    if response_format is not None:
        body["response_format"] = response_format
    return client_for(server, key).post("/chat/completions", body=body, cast_to=dict)


def message(data: dict) -> dict:
    return data["choices"][0]["message"]


def raw_post(server: FakeOpenAI, body: dict, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        server.base_url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


# --------------------------------------------------------------------------- profile names


def test_profile_names_and_unknown_profile():
    assert PROFILES == ("openai", "deepseek", "minimax", "minimax_open_dropped", "vllm", "fenced", "llamacpp")
    with pytest.raises(ValueError, match="unknown profile 'anthropic'"):
        FakeOpenAI(profile="anthropic")


def test_no_profile_keeps_the_plain_wire_shape():
    with FakeOpenAI() as server:
        data = chat(server, response_format=SCHEMA_FORMAT)
    assert message(data) == {"role": "assistant", "content": PLAN_TEXT}
    assert set(data["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert data["usage"]["completion_tokens"] == math.ceil(len(PLAN_TEXT) / 4)


# --------------------------------------------------------------------------- schema stated in the prompt


@pytest.mark.parametrize("profile", [None, *PROFILES])
@pytest.mark.parametrize("response_format", [OBJECT_FORMAT, None], ids=["json_object", "none"])
def test_prompt_schema_fallback_gives_a_valid_instance(profile, response_format):
    with FakeOpenAI(profile=profile) as server:
        data = chat(server, response_format=response_format)
    content = message(data)["content"]
    answer = content.split("</think>\n\n")[-1]
    if profile == "fenced":
        answer = answer.split("```json\n")[1].split("\n```")[0]
    Plan.model_validate_json(answer)
    assert json.loads(answer) == PLAN


def test_prompt_schema_picks_the_largest_schema_like_object():
    data_blob = {"rows": [{"id": i, "text": "x" * 40} for i in range(20)]}  # larger, but no schema
    wrapped = {"type": "json_schema", "json_schema": {"name": "Mood", "schema": MOOD_SCHEMA}}
    messages = [
        {"role": "system", "content": f"Small schema first: {json.dumps(MOOD_SCHEMA)} then {{not json}}."},
        {"role": "user", "content": [{"type": "text", "text": "Data: " + json.dumps(data_blob)}]},
        {"role": "user", "content": "Use {this}: " + json.dumps(PLAN_SCHEMA, indent=2) + " {"},
    ]
    assert schema_from_messages(messages) == PLAN_SCHEMA
    assert schema_from_messages(messages[:2]) == MOOD_SCHEMA
    # a schema nested inside a bigger non-schema object is still found
    assert schema_from_messages([{"role": "user", "content": json.dumps(wrapped)}]) == MOOD_SCHEMA
    assert schema_from_messages([{"role": "user", "content": json.dumps(data_blob)}]) is None
    assert schema_from_messages(None) is None
    with FakeOpenAI() as server:
        Plan.model_validate_json(message(chat(server, messages=messages))["content"])
        Mood.model_validate_json(message(chat(server, messages=messages[:2]))["content"])


def test_prompt_schema_the_generator_cannot_follow_is_skipped():
    broken = {"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}, "padding": "x" * 500}
    messages = [{"role": "user", "content": f"{json.dumps(broken)} or {json.dumps(MOOD_SCHEMA)}"}]
    with FakeOpenAI() as server:
        Mood.model_validate_json(message(chat(server, messages=messages))["content"])
        only_broken = [{"role": "user", "content": json.dumps(broken)}]
        assert message(chat(server, messages=only_broken))["content"] == "{}"


def test_request_schema_wins_over_prompt_schema():
    with FakeOpenAI() as server:
        Mood.model_validate_json(message(chat(server, response_format=LLAMA_FORMAT))["content"])
        schema_format = {"type": "json_schema", "json_schema": {"name": "Mood", "schema": MOOD_SCHEMA}}
        Mood.model_validate_json(message(chat(server, response_format=schema_format))["content"])


# --------------------------------------------------------------------------- openai


def test_openai_profile():
    with FakeOpenAI(profile="openai") as server:
        assert message(chat(server, response_format=SCHEMA_FORMAT)) == {
            "role": "assistant",
            "content": PLAN_TEXT,
        }
        assert message(chat(server, response_format=OBJECT_FORMAT))["content"] == PLAN_TEXT
        assert message(chat(server, messages=NO_JSON_WORD))["content"] == "{}"
        shouting = [{"role": "user", "content": "Reply in JSON."}]
        assert message(chat(server, messages=shouting, response_format=OBJECT_FORMAT))["content"] == "{}"
        with pytest.raises(openai.BadRequestError) as info:
            chat(server, messages=NO_JSON_WORD, response_format=OBJECT_FORMAT)
        assert server.count == 5
    err = info.value
    assert err.status_code == 400
    assert err.body["message"] == (
        "'messages' must contain the word 'json' in some form, "
        "to use 'response_format' of type 'json_object'."
    )
    assert err.body["type"] == "invalid_request_error" and err.body["param"] == "messages"


# --------------------------------------------------------------------------- deepseek


def test_deepseek_rejects_json_schema():
    with FakeOpenAI(profile="deepseek") as server, pytest.raises(openai.BadRequestError) as info:
        chat(server, response_format=SCHEMA_FORMAT)
    assert info.value.status_code == 400
    assert info.value.body["message"] == "This response_format type is unavailable now"
    assert info.value.body["type"] == "invalid_request_error"


def test_deepseek_json_object_needs_the_word_json():
    with FakeOpenAI(profile="deepseek") as server:
        status, data = raw_post(server, {"messages": NO_JSON_WORD, "response_format": OBJECT_FORMAT})
        assert status == 400
        assert data["error"]["message"] == (
            "Prompt must contain the word 'json' in some form to use 'response_format' of type 'json_object'."
        )
        assert data["error"]["type"] == "invalid_request_error"
        upper = [{"role": "user", "content": "Answer as JSON, please."}]
        assert raw_post(server, {"messages": upper, "response_format": OBJECT_FORMAT})[0] == 200
        assert raw_post(server, {"messages": NO_JSON_WORD})[0] == 200  # no response_format: no check


def test_deepseek_requires_reasoning_content_on_assistant_turns():
    earlier = {"role": "assistant", "content": '{"title": "no"}'}
    follow_up = {"role": "user", "content": "Fix it."}
    with FakeOpenAI(profile="deepseek") as server:
        with pytest.raises(openai.BadRequestError) as info:
            chat(server, messages=[*PROMPT, earlier, follow_up], response_format=OBJECT_FORMAT)
        assert (
            info.value.body["message"]
            == "The reasoning_content in the thinking mode must be passed back to the API."
        )
        passed_back = {**earlier, "reasoning_content": REASONING}
        data = chat(server, messages=[*PROMPT, passed_back, follow_up], response_format=OBJECT_FORMAT)
        assert message(data)["content"] == PLAN_TEXT


def test_deepseek_reply_carries_reasoning_content_and_reasoning_tokens():
    with FakeOpenAI(profile="deepseek") as server:
        data = chat(server, response_format=OBJECT_FORMAT)
        typed = client_for(server).chat.completions.create(
            model="m", messages=PROMPT, response_format=OBJECT_FORMAT
        )
    assert message(data) == {"role": "assistant", "content": PLAN_TEXT, "reasoning_content": REASONING}
    reasoning_tokens = math.ceil(len(REASONING) / 4)
    assert data["usage"]["completion_tokens_details"] == {"reasoning_tokens": reasoning_tokens}
    assert data["usage"]["completion_tokens"] == math.ceil(len(PLAN_TEXT) / 4) + reasoning_tokens
    usage = data["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert len([s for s in REASONING.split(". ") if s]) >= 3  # a few sentences
    assert typed.choices[0].message.reasoning_content == REASONING  # extra field kept by the client
    assert typed.usage.completion_tokens_details.reasoning_tokens == reasoning_tokens


def test_rejected_requests_use_up_no_queued_action_but_are_recorded():
    with FakeOpenAI(profile="deepseek") as server:
        server.queue(reply({"title": "queued"}))
        with pytest.raises(openai.BadRequestError):
            chat(server, response_format=SCHEMA_FORMAT)
        assert message(chat(server, response_format=OBJECT_FORMAT))["content"] == '{"title": "queued"}'
        assert server.count == 2
        assert [r.body["response_format"]["type"] for r in server.chat_requests] == [
            "json_schema",
            "json_object",
        ]


# --------------------------------------------------------------------------- minimax


@pytest.mark.parametrize(
    "response_format", [SCHEMA_FORMAT, OBJECT_FORMAT, None], ids=["schema", "object", "none"]
)
def test_minimax_wraps_every_answer_in_think_tags(response_format):
    with FakeOpenAI(profile="minimax") as server:
        data = chat(server, response_format=response_format)
    assert message(data) == {"role": "assistant", "content": THINK + PLAN_TEXT}
    assert data["usage"]["completion_tokens"] == math.ceil(len(THINK + PLAN_TEXT) / 4)
    assert "completion_tokens_details" not in data["usage"]


def test_minimax_wraps_queued_and_responded_replies():
    with FakeOpenAI(profile="minimax", responder=lambda body, n: {"n": n}) as server:
        server.queue(reply("plain text"), reply({"a": 1}), truncated('{"title": "cut'), truncated(), empty())
        server.queue(hang(0.01, content="late"))
        replies = [chat(server, response_format=SCHEMA_FORMAT)["choices"][0] for _ in range(7)]
    contents = [r["message"]["content"] for r in replies]
    assert contents[:3] == [THINK + "plain text", THINK + '{"a": 1}', THINK + '{"title": "cut']
    assert contents[3] == THINK + PLAN_TEXT[: len(PLAN_TEXT) // 2]  # the answer is cut, not the thinking
    assert contents[4:] == [THINK, THINK + "late", THINK + '{"n": 7}']
    assert [r["finish_reason"] for r in replies] == [
        "stop",
        "stop",
        "length",
        "length",
        "stop",
        "stop",
        "stop",
    ]


def test_minimax_open_dropped_lacks_the_opening_tag():
    with FakeOpenAI(profile="minimax_open_dropped") as server:
        server.queue(truncated("abc"))
        cut = chat(server)["choices"][0]
        data = chat(server, response_format=OBJECT_FORMAT)
    assert cut["message"]["content"] == f"{REASONING}\n</think>\n\nabc" and cut["finish_reason"] == "length"
    content = message(data)["content"]
    assert content == f"{REASONING}\n</think>\n\n{PLAN_TEXT}"
    assert "<think>" not in content


def test_custom_reasoning_text():
    thought = 'Maybe {"title": "draft"} first? No.'
    with FakeOpenAI(profile="minimax", reasoning=thought) as server:
        assert message(chat(server))["content"] == f"<think>\n{thought}\n</think>\n\n{PLAN_TEXT}"
    with FakeOpenAI(profile="vllm", reasoning=thought) as server:
        assert message(chat(server))["reasoning"] == thought


# --------------------------------------------------------------------------- vllm


@pytest.mark.parametrize(
    "response_format", [SCHEMA_FORMAT, OBJECT_FORMAT, None], ids=["schema", "object", "none"]
)
def test_vllm_reasoning_fields(response_format):
    with FakeOpenAI(profile="vllm") as server:
        data = chat(server, response_format=response_format)
    assert message(data) == {
        "role": "assistant",
        "content": PLAN_TEXT,
        "reasoning_content": REASONING,
        "reasoning": REASONING,
    }
    assert data["usage"]["completion_tokens_details"]["reasoning_tokens"] == math.ceil(len(REASONING) / 4)


# --------------------------------------------------------------------------- fenced


def test_fenced_rejects_json_schema():
    with FakeOpenAI(profile="fenced") as server, pytest.raises(openai.BadRequestError) as info:
        chat(server, response_format=SCHEMA_FORMAT)
    assert (
        info.value.body["message"] == "response_format of type 'json_schema' is not supported by this model"
    )


@pytest.mark.parametrize("response_format", [OBJECT_FORMAT, None], ids=["object", "none"])
def test_fenced_wraps_the_pretty_printed_answer(response_format):
    with FakeOpenAI(profile="fenced") as server:
        content = message(chat(server, response_format=response_format))["content"]
    assert content == (
        "Sure! Here is the JSON you asked for:\n\n```json\n"
        + json.dumps(PLAN, indent=2)
        + "\n```\n\nLet me know if you need anything else."
    )


def test_fenced_wraps_queued_replies_and_leaves_cut_replies_open():
    with FakeOpenAI(profile="fenced") as server:
        server.queue(reply({"a": [1]}), reply("not json"), truncated('{"a": '), truncated())
        contents = [message(chat(server))["content"] for _ in range(4)]
    preamble = "Sure! Here is the JSON you asked for:\n\n```json\n"
    closing = "\n```\n\nLet me know if you need anything else."
    assert contents[0] == preamble + '{\n  "a": [\n    1\n  ]\n}' + closing
    assert contents[1] == preamble + "not json" + closing
    assert contents[2] == preamble + '{"a": '  # ran out of tokens inside the block
    assert contents[3] == preamble + PLAN_TEXT[: len(PLAN_TEXT) // 2]


# --------------------------------------------------------------------------- llamacpp


def test_llamacpp_500s_on_json_schema():
    with FakeOpenAI(profile="llamacpp") as server:
        server.queue(reply("unused"))
        status, data = raw_post(server, {"messages": PROMPT, "response_format": SCHEMA_FORMAT})
        with pytest.raises(openai.InternalServerError) as info:
            chat(server, response_format=SCHEMA_FORMAT)
        assert message(chat(server))["content"] == "unused"
    assert status == 500
    assert data["error"]["message"] == LLAMACPP_JSON_SCHEMA
    assert data["error"]["type"] == "internal_server_error" and "response_format" in LLAMACPP_JSON_SCHEMA
    assert info.value.status_code == 500


def test_llamacpp_json_object_with_and_without_schema():
    with FakeOpenAI(profile="llamacpp") as server:
        with_schema = message(chat(server, response_format=LLAMA_FORMAT))
        plain = message(chat(server, response_format=OBJECT_FORMAT))
    assert with_schema == {"role": "assistant", "content": MOOD_TEXT}
    Mood.model_validate_json(with_schema["content"])
    assert plain == {"role": "assistant", "content": PLAN_TEXT}  # schema from the prompt


# --------------------------------------------------------------------------- errors and n


@pytest.mark.parametrize("profile", PROFILES)
def test_error_actions_pass_through_unchanged(profile):
    with FakeOpenAI(profile=profile) as server:
        server.queue(rate_limit(0.01), server_error(503))
        with pytest.raises(openai.RateLimitError) as limited:
            chat(server)
        with pytest.raises(openai.InternalServerError) as failed:
            chat(server)
    assert limited.value.response.headers["retry-after"] == "0.01"
    assert failed.value.status_code == 503
    assert failed.value.body["message"] == "The server had an error while processing your request."


def test_every_choice_is_shaped():
    with FakeOpenAI(profile="vllm") as server:
        data = chat(server, n=2)
    assert [c["message"]["reasoning"] for c in data["choices"]] == [REASONING, REASONING]


# --------------------------------------------------------------------------- require_key and echo_key


def test_require_key_rejects_and_echoes_the_wrong_key():
    secret = "sk-right-0123456789"
    wrong = "sk-wrong-abcdefghijklmnopqrstuvwxyz"
    with FakeOpenAI(require_key=secret) as server:
        server.queue(reply("queued"))
        with pytest.raises(openai.AuthenticationError) as info:
            chat(server, key=wrong)
        assert message(chat(server, key=secret))["content"] == "queued"
        status, missing = raw_post(server, {"messages": PROMPT})
        with pytest.raises(openai.AuthenticationError):
            client_for(server, wrong).models.list()
        assert [m.id for m in client_for(server, secret).models.list()] == ["fake-model"]
        assert server.count == 3
        assert [r.headers.get("authorization") for r in server.chat_requests] == [
            f"Bearer {wrong}",
            f"Bearer {secret}",
            None,
        ]
    assert info.value.status_code == 401
    assert info.value.body["message"] == f"Incorrect API key provided: {wrong}."
    assert info.value.body["code"] == "invalid_api_key"
    assert status == 401 and "didn't provide an API key" in missing["error"]["message"]


def test_require_key_comes_before_profile_checks():
    with FakeOpenAI(profile="deepseek", require_key="good") as server:
        with pytest.raises(openai.AuthenticationError):
            chat(server, key="bad", response_format=SCHEMA_FORMAT)
        with pytest.raises(openai.BadRequestError):
            chat(server, key="good", response_format=SCHEMA_FORMAT)


def test_echo_key_puts_the_key_into_answers():
    key = "sk-echo-0123456789"
    with FakeOpenAI(echo_key=True) as server:
        server.queue(reply({"a": 1}), reply("plain"), reply([1, 2]), empty(), reply({"note": "mine"}))
        contents = [message(chat(server, key=key))["content"] for _ in range(5)]
        generated = json.loads(message(chat(server, key=key, response_format=SCHEMA_FORMAT))["content"])
    assert json.loads(contents[0]) == {"a": 1, "note": key}
    assert contents[1:4] == [f"plain {key}", "[1, 2]", ""]
    assert json.loads(contents[4]) == {"note": "mine", "_note": key}
    assert generated == {**PLAN, "note": key}
    Plan.model_validate(generated)  # extra fields are ignored by the models


@pytest.mark.parametrize("profile", ["minimax", "fenced", "deepseek"])
def test_echo_key_goes_inside_the_answer_of_wrapped_profiles(profile):
    with FakeOpenAI(profile=profile, echo_key=True) as server:
        data = chat(server, key="sk-inner", response_format=OBJECT_FORMAT)
    content = message(data)["content"]
    answer = content.split("</think>\n\n")[-1]
    if profile == "fenced":
        answer = answer.split("```json\n")[1].split("\n```")[0]
    assert json.loads(answer) == {**PLAN, "note": "sk-inner"}
    assert "sk-inner" not in message(data).get("reasoning_content", "")


# --------------------------------------------------------------------------- standalone


def test_standalone_profile_and_key_flags():
    with standalone("--profile", "deepseek", "--require-key", "sk-bench", "--echo-key") as line:
        assert line.startswith("READY http://127.0.0.1:")
        base_url = line.split()[1]
        client = openai.OpenAI(base_url=base_url, api_key="sk-bench", max_retries=0, timeout=5)
        body = {"model": "m", "messages": PROMPT, "response_format": OBJECT_FORMAT}
        data = client.post("/chat/completions", body=body, cast_to=dict)
        assert message(data)["reasoning_content"] == REASONING
        assert json.loads(message(data)["content"]) == {**PLAN, "note": "sk-bench"}
        with pytest.raises(openai.BadRequestError):
            client.post("/chat/completions", body={**body, "response_format": SCHEMA_FORMAT}, cast_to=dict)
        stranger = openai.OpenAI(base_url=base_url, api_key="sk-other", max_retries=0, timeout=5)
        with pytest.raises(openai.AuthenticationError, match="sk-other"):
            stranger.post("/chat/completions", body=body, cast_to=dict)
    bad = subprocess.run(
        [sys.executable, str(HERE / "fake_openai.py"), "--profile", "nope"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
