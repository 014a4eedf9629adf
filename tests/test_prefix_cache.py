"""The provider's prefix cache: the test server emulates DeepSeek's and OpenAI's, the run
report counts the cached prompt tokens the endpoint reports and prices them at
--price-cached, and the prompts are laid out so that a user's requests share their context."""

from __future__ import annotations

import json

import pytest
from fake_openai import FakeOpenAI, reply, schema_for_request, schema_from_messages
from test_persona import Script, filtered_users, quiet, settings_for

from personaemp.llm.accounting import Accounting, dollars
from personaemp.llm.endpoints import cached_tokens
from personaemp.llm.run import REPORT_FILE
from personaemp.stages.persona import infer_personas


def ask(server: FakeOpenAI, text: str, schema: dict | None = None) -> dict:
    import urllib.request

    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    request = urllib.request.Request(
        f"{server.base_url}/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request) as answer:
        return json.loads(answer.read())["usage"]


def test_the_test_server_serves_the_longest_shared_prefix_in_whole_deepseek_blocks():
    with FakeOpenAI(responder=lambda body, n: reply("ok"), prefix_cache="deepseek") as server:
        shared = "s" * (64 * 4 * 3 + 10)  # three whole blocks and a bit, counted with "<|user|>"
        first = ask(server, shared + "a" * 500)
        second = ask(server, shared + "b" * 500)
        third = ask(server, "x" + shared)  # one character first: nothing is shared
    assert first["prompt_cache_hit_tokens"] == 0
    assert first["prompt_cache_miss_tokens"] == first["prompt_tokens"]
    assert second["prompt_cache_hit_tokens"] == 3 * 64  # the partial fourth block is not served
    assert second["prompt_cache_hit_tokens"] + second["prompt_cache_miss_tokens"] == second["prompt_tokens"]
    assert third["prompt_cache_hit_tokens"] == 0
    assert server.cached_tokens == 3 * 64
    assert server.prompt_tokens == first["prompt_tokens"] + second["prompt_tokens"] + third["prompt_tokens"]


def test_the_openai_rule_serves_nothing_under_1024_tokens_then_128_token_steps():
    with FakeOpenAI(responder=lambda body, n: reply("ok"), prefix_cache="openai") as server:
        short = "s" * (900 * 4)
        ask(server, short + "a")
        assert ask(server, short + "b")["prompt_tokens_details"]["cached_tokens"] == 0  # 896 < 1,024
        long = "l" * (1100 * 4)
        ask(server, long + "a")
        assert ask(server, long + "b")["prompt_tokens_details"]["cached_tokens"] == 1024
        # The schema (json_schema mode) comes before the messages: a new schema, a new prefix.
        ask(server, long, schema={"type": "object"})
        assert (
            ask(server, long, schema={"type": "object", "title": "x"})["prompt_tokens_details"][
                "cached_tokens"
            ]
            == 0
        )
        assert (
            ask(server, long + "c", schema={"type": "object"})["prompt_tokens_details"]["cached_tokens"]
            == 1024
        )


def test_both_providers_cached_fields_are_read():
    assert cached_tokens({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 7}}) == 7
    assert cached_tokens({"prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 3}) == 64
    assert cached_tokens({"prompt_tokens": 10}) is None
    assert cached_tokens({"prompt_tokens_details": None, "prompt_cache_hit_tokens": -1}) is None


def test_cached_tokens_are_priced_at_price_cached():
    accounting = Accounting()
    stats = accounting.step("persona")
    stats.prompt_tokens, stats.cached_tokens, stats.completion_tokens = 1_000_000, 800_000, 100_000
    # DeepSeek-like: a hit costs a tenth of a miss.
    assert accounting.cost(0.28, 0.42, 0.028) == pytest.approx(0.2 * 0.28 + 0.8 * 0.028 + 0.1 * 0.42)
    assert accounting.cost(0.28, 0.42) == pytest.approx(0.28 + 0.042), "unset: cached at --price-in"
    assert dollars(10, 0, 0, None, 1.0) == 0


def schema_anywhere(script: Script):
    """The persona script, for a json_object endpoint too (the schema is in the prompt)."""

    def respond(body: dict, number: int):
        if schema_for_request(body) is None:
            schema = schema_from_messages(body["messages"])
            body = {**body, "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
        return script(body, number)

    return respond


@pytest.mark.parametrize(("rule", "profile"), [("deepseek", "deepseek"), ("openai", "openai")])
def test_the_run_report_counts_the_cached_tokens_the_server_served(tmp_path, rule, profile):
    input_path = filtered_users(tmp_path)
    work = tmp_path / "work"
    with FakeOpenAI(
        responder=schema_anywhere(Script(input_path)), profile=profile, prefix_cache=rule
    ) as server:
        report, _ = infer_personas(
            input_path, tmp_path / "personas.jsonl",
            settings_for(server, work, price_in=0.28, price_out=0.42, price_cached=0.028), console=quiet(),
        )  # fmt: skip
        served, prompt = server.cached_tokens, server.prompt_tokens
    assert server.errors == []
    recorded = json.loads((work / REPORT_FILE).read_text())["stages"]["infer-persona"]
    assert recorded["totals"]["cached_tokens"] == served == report.totals["cached_tokens"]
    assert recorded["totals"]["prompt_tokens"] == prompt
    assert sum(step["cached_tokens"] for step in recorded["steps"].values()) == served
    if rule == "deepseek":
        # Big Five opens with the bytes its persona request sent: the user's memories and turns.
        assert (
            recorded["steps"]["big_five"]["cached_tokens"]
            > 0.5 * recorded["steps"]["big_five"]["prompt_tokens"]
        )
    expected = dollars(prompt, served, recorded["totals"]["completion_tokens"], 0.28, 0.42, 0.028)
    assert recorded["cost"] == pytest.approx(expected)


def test_estimate_prices_what_a_prefix_cache_would_serve_at_price_cached(tmp_path):
    """--estimate renders the requests it would send: those of later users open with the same
    preamble, and each user's later steps with what their own earlier steps sent."""
    from personaemp.llm.settings import LLMSettings
    from personaemp.stages.queries import generate_queries

    input_path = filtered_users(tmp_path)
    with FakeOpenAI(responder=schema_anywhere(Script(input_path)), prefix_cache="deepseek") as server:
        infer_personas(
            input_path, tmp_path / "personas.jsonl", settings_for(server, tmp_path / "w"), console=quiet()
        )
        prices = {"price_in": 1.0, "price_out": 2.0}
        estimate = {}
        for cached in (None, 0.1):
            settings = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=tmp_path / "w",
                                   estimate=True, price_cached=cached, **prices)  # fmt: skip
            report, _ = generate_queries(
                tmp_path / "personas.jsonl", tmp_path / "q.jsonl", settings, console=quiet()
            )
            estimate[cached] = report.estimate
    plain, cheaper = estimate[None], estimate[0.1]
    assert 0 < cheaper["cached_tokens"] < cheaper["prompt_tokens"]
    assert cheaper["cached_tokens"] == sum(step["cached_tokens"] for step in cheaper["steps"].values())
    assert plain["cost"] == pytest.approx(
        (plain["prompt_tokens"] + 2 * plain["completion_tokens"]) / 1e6, rel=1e-3
    )
    assert cheaper["cost"] == pytest.approx(
        dollars(
            cheaper["prompt_tokens"], cheaper["cached_tokens"], cheaper["completion_tokens"], 1.0, 2.0, 0.1
        ),
        rel=1e-3,
    )
    assert cheaper["cost"] < plain["cost"]
