"""The LLM engine through a real HTTP server (tests/fake_openai.py): faults, cache, caps."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from fake_openai import (
    FakeOpenAI,
    drop,
    empty,
    hang,
    huge,
    invalid_json_content,
    malformed_body,
    rate_limit,
    reply,
    server_error,
    trickle,
    truncated,
)
from pydantic import BaseModel

from personaemp.errors import PersonaempError
from personaemp.llm.endpoints import LLMError, _retry_after
from personaemp.llm.engine import EndpointError, bounded
from personaemp.llm.session import open_engine
from personaemp.llm.settings import LLMSettings
from personaemp.llm.step import RejectedReply, Step

GOOD = {"text": "hello", "mood": 3}


class Greeting(BaseModel):
    text: str
    mood: int


GREET = Step("greet", Greeting)


def settings_for(server: FakeOpenAI, tmp_path: Path, **overrides) -> LLMSettings:
    values = dict(base_urls=[server.base_url], model="fake", work_dir=tmp_path / "work", api_key="sk-test")
    values.update(overrides)
    return LLMSettings(**values)


def ask(settings: LLMSettings, count: int = 1, **call_options):
    """Make `count` calls; return (results or exceptions, accounting of the step)."""

    async def main():
        async with open_engine(settings) as engine:

            async def one(number):
                messages = [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": f"#{number}"},
                ]
                return await engine.call(GREET, messages, **call_options)

            results = await asyncio.gather(*(one(n) for n in range(count)), return_exceptions=True)
            return results, engine.accounting.step("greet")

    return asyncio.run(main())


@pytest.mark.parametrize(
    "fault",
    [
        rate_limit(0.01), server_error(500), server_error(503), drop(), malformed_body(), hang(5),
        # A byte every 50 ms: each read is quick, the whole (~12 s) is not. Before the timeout
        # bounded the whole request, it was waited for (one request, no retry).
        trickle(0.05, bound=30, content=GOOD),
        # Far more than max_tokens 1024 can hold: cut off while read and retried, not stored
        # and re-asked as an invalid reply.
        huge(1_000_000),
    ],
    ids=["429", "500", "503", "drop", "malformed_body", "hang", "trickle", "huge"],
)  # fmt: skip
def test_transport_faults_are_retried(tmp_path, fault):
    with FakeOpenAI() as server:
        server.queue(fault, reply(GOOD))
        # 2 s: short enough to cut hang(5) and the trickle, long enough that the good reply is
        # never cut on a loaded machine (0.5 s was: a third request, the test failing)
        settings = settings_for(server, tmp_path, timeout=2.0)
        [result], stats = ask(settings)
        assert result.value == Greeting(**GOOD)
        assert server.count == 2
        assert (stats.requests, stats.retries, stats.reasks) == (2, 1, 0)
    stored = sum(path.stat().st_size for path in (tmp_path / "work").iterdir())
    assert stored < 100_000  # the cache holds no oversized reply


def test_the_reply_bound_follows_max_tokens(tmp_path):
    """A reply of 300 kB is cut off at max_tokens 1000 (bound 96 kB) but read at 10000 (384 kB)."""
    with FakeOpenAI() as server:
        server.queue(huge(300_000), huge(300_000))
        [small], _ = ask(settings_for(server, tmp_path, max_tokens=1000, max_retries=0))
        [large], stats = ask(settings_for(server, tmp_path, max_tokens=10000, max_retries=0, max_reasks=0))
    # The first request of a run failing on the endpoint's side: the run stops.
    assert isinstance(small, EndpointError) and "max_tokens 1000" in str(small)
    assert "honours max_tokens" in small.hint
    assert isinstance(large, LLMError) and large.kind == "invalid"  # read whole: not JSON
    assert server.count == 2


def test_retry_after_is_honoured_and_counted(tmp_path):
    with FakeOpenAI() as server:
        server.queue(rate_limit(0.2), reply(GOOD))
        [result], stats = ask(settings_for(server, tmp_path))
        first, second = server.chat_requests
        assert result.value.text == "hello" and stats.retries == 1
        assert second.received_at - first.received_at >= 0.2


@pytest.mark.parametrize(
    ("fault", "echo"),
    [
        (invalid_json_content(), '{"persona": "unterminated'),
        (reply({"text": "hi"}), '{"text": "hi"}'),
        (empty(), ""),
        (truncated('{"text": "hel'), '{"text": "hel'),
    ],
    ids=["invalid_json", "schema_invalid", "empty", "truncated"],
)
def test_bad_replies_are_reasked_with_the_reason(tmp_path, fault, echo):
    with FakeOpenAI() as server:
        server.queue(fault, reply(GOOD))
        [result], stats = ask(settings_for(server, tmp_path, max_tokens=100))
        assert result.value == Greeting(**GOOD)
        assert (stats.requests, stats.reasks, stats.retries) == (2, 1, 0)
        first, second = (r.body for r in server.chat_requests)
        # The bad reply is quoted inside the user turn, never replayed as an assistant turn
        # (DeepSeek's thinking mode refuses assistant turns without their reasoning).
        assert [m["role"] for m in second["messages"]] == [m["role"] for m in first["messages"]]
        assert second["messages"][0] == first["messages"][0]
        reask = second["messages"][-1]["content"]
        assert reask.startswith(first["messages"][-1]["content"] + "\n\n")
        assert "could not be used" in reask and f"<<<\n{echo}\n>>>" in reask
        # A cut reply gets room to finish the second time.
        assert second["max_tokens"] == (200 if fault.finish_reason == "length" else 100)


def test_reask_names_the_invalid_field(tmp_path):
    with FakeOpenAI() as server:
        server.queue(reply({"text": "hi", "mood": "very"}), reply(GOOD))
        ask(settings_for(server, tmp_path))
        reask = server.chat_requests[1].body["messages"][-1]["content"]
        assert "mood" in reask and "integer" in reask


def test_persistent_transport_fault_after_replies_ends_as_llm_error(tmp_path):
    faults = iter([None, *[server_error(502)] * 10])
    with FakeOpenAI(responder=lambda body, n: next(faults) or reply(GOOD)) as server:
        [ok, error], stats = ask(settings_for(server, tmp_path, max_retries=2), count=2)
        assert ok.value == Greeting(**GOOD)
        assert isinstance(error, LLMError)
        assert (error.kind, error.attempts) == ("server_error", 3)
        assert server.count == 4 and stats.failures == {"server_error": 1}


def test_endpoint_failing_before_any_reply_stops_the_run(tmp_path):
    """A 5xx on every request before any reply is about the endpoint, not the units: a
    run-level EndpointError, not a unit failure."""
    with FakeOpenAI(responder=lambda body, n: server_error(502)) as server:
        results, _ = ask(settings_for(server, tmp_path, max_retries=2), count=3)
        assert all(isinstance(r, EndpointError) for r in results)
        assert "HTTP 502" in str(results[0]) and "check its log" in str(results[0])
        # One request at a time until the endpoint has answered: only the first unit's went out.
        assert server.count == 3 and server.max_in_flight == 1


def test_persistent_bad_replies_end_as_llm_error_with_raw(tmp_path):
    with FakeOpenAI(responder=lambda body, n: reply({"text": "no mood"})) as server:
        [error], stats = ask(settings_for(server, tmp_path, max_reasks=2))
        assert isinstance(error, LLMError) and error.kind == "invalid"
        assert error.raw == '{"text": "no mood"}'
        assert server.count == 3 and stats.reasks == 2


def test_unauthorized_stops_the_run(tmp_path):
    with FakeOpenAI(responder=lambda body, n: server_error(401)) as server:
        [error], _ = ask(settings_for(server, tmp_path))
        assert isinstance(error, PersonaempError) and not isinstance(error, LLMError)
        assert "API key" in str(error) and server.count == 1


def test_parse_rejections_are_reasked_and_give_the_failure_kind(tmp_path):
    def parse(value: Greeting) -> int:
        if value.mood > 5:
            raise RejectedReply("too_moody", "mood must be at most 5")
        return value.mood * 10

    with FakeOpenAI() as server:
        server.queue(reply({"text": "x", "mood": 9}), reply(GOOD))
        [result], stats = ask(settings_for(server, tmp_path), parse=parse)
        assert result.value.mood == 3 and result.parsed == 30 and stats.reasks == 1
        assert "mood must be at most 5" in server.chat_requests[1].body["messages"][-1]["content"]
    with FakeOpenAI(responder=lambda body, n: reply({"text": "x", "mood": 9})) as server:
        [error], stats = ask(settings_for(server, tmp_path / "again", max_reasks=1), parse=parse)
        assert isinstance(error, LLMError) and error.kind == "too_moody"
        assert stats.failures == {"too_moody": 1}


def test_second_run_is_served_from_cache(tmp_path):
    with FakeOpenAI() as server:
        settings = settings_for(server, tmp_path)
        first, stats = ask(settings, count=5)
        assert server.count == 5 and stats.cache_hits == 0
        second, stats = ask(settings, count=5)
        assert server.count == 5 and stats.cache_hits == 5 and stats.requests == 0
        assert [r.value for r in first] == [r.value for r in second]
        assert all(r.cached for r in second)


def test_bad_replies_are_never_served_from_the_cache(tmp_path):
    """A reply that failed validation is stored for the record but never answers a later
    request: the next run (a retry) asks afresh, and only the valid reply is replayed."""
    with FakeOpenAI() as server:
        server.queue(invalid_json_content(), reply(GOOD))
        settings = settings_for(server, tmp_path)
        ask(settings)
        assert server.count == 2
        [result], stats = ask(settings)
        assert server.count == 3 and stats.cache_hits == 0 and stats.requests == 1
        [again], stats = ask(settings)
        assert server.count == 3 and stats.cache_hits == 1 and again.cached
        assert again.value == result.value


def test_no_cache_and_refresh(tmp_path):
    with FakeOpenAI() as server:
        settings = settings_for(server, tmp_path)
        ask(settings)
        ask(settings_for(server, tmp_path, use_cache=False))
        assert server.count == 2
        ask(settings_for(server, tmp_path, refresh=True))
        assert server.count == 3
        ask(settings)
        assert server.count == 3


def test_sample_index_and_sampling_are_part_of_the_key(tmp_path):
    with FakeOpenAI() as server:
        ask(settings_for(server, tmp_path))
        ask(settings_for(server, tmp_path), sample=1)
        ask(settings_for(server, tmp_path, temperature=0.1))
        assert server.count == 3
        # Runtime knobs are not: another timeout or concurrency reuses the cache.
        ask(settings_for(server, tmp_path, timeout=7, concurrency=3))
        assert server.count == 3


def test_in_flight_never_exceeds_the_cap(tmp_path):
    with FakeOpenAI(latency=lambda: 0.05) as server:
        results, _ = ask(settings_for(server, tmp_path, concurrency=3), count=12)
        assert all(not isinstance(r, Exception) for r in results)
        assert server.count == 12 and server.max_in_flight == 3


def test_requests_are_spread_over_endpoints(tmp_path):
    with FakeOpenAI(latency=lambda: 0.05) as one, FakeOpenAI(latency=lambda: 0.05) as two:
        settings = settings_for(one, tmp_path, concurrency=2)
        settings.base_urls.append(two.base_url)
        results, _ = ask(settings, count=12)
        assert all(not isinstance(r, Exception) for r in results)
        assert one.count + two.count == 12 and one.count >= 3 and two.count >= 3
        assert one.max_in_flight <= 2 and two.max_in_flight <= 2


def test_connection_refused_endpoint_is_retried_elsewhere(tmp_path):
    with FakeOpenAI() as good:
        settings = settings_for(good, tmp_path, max_retries=4)
        settings.base_urls.insert(0, "http://127.0.0.1:9/v1")  # nothing listens on port 9
        results, stats = ask(settings, count=4)
        assert all(not isinstance(r, Exception) for r in results)
        assert good.count == 4


def test_every_request_carries_max_tokens_and_the_schema(tmp_path):
    with FakeOpenAI() as server:
        ask(settings_for(server, tmp_path, max_tokens=77))
        body = server.chat_requests[0].body
        assert body["max_tokens"] == 77 and "max_completion_tokens" not in body
        assert body["response_format"]["type"] == "json_schema"
        # The model's schema without pydantic's titles ("Text" for text): billed, and no help.
        titled = Greeting.model_json_schema()
        assert titled["title"] == "Greeting" and titled["properties"]["text"]["title"] == "Text"
        untitled = {**titled, "properties": {"text": {"type": "string"}, "mood": {"type": "integer"}}}
        del untitled["title"]
        assert body["response_format"]["json_schema"]["schema"] == untitled == GREET.schema
        assert server.chat_requests[0].headers["authorization"] == "Bearer sk-test"


def test_a_cut_reply_under_a_grammar_keeps_its_budget(tmp_path):
    """Under a bounded grammar (the embedded model) a cut reply means the model looped:
    doubling max_tokens only let it loop for minutes longer."""
    with FakeOpenAI() as server:
        server.queue(truncated('{"text": "hel'), reply(GOOD))
        [result], stats = ask(settings_for(server, tmp_path, structured="json_object_schema", max_tokens=100))
        assert result.value == Greeting(**GOOD) and stats.cut_replies == 1
        assert [r.body["max_tokens"] for r in server.chat_requests] == [100, 100]


@pytest.mark.parametrize("mode", ["json_object_schema", "json_object", "none"])
def test_structured_modes(tmp_path, mode):
    with FakeOpenAI(responder=lambda body, n: reply(GOOD)) as server:
        [result], _ = ask(settings_for(server, tmp_path, structured=mode))
        assert result.value.text == "hello"
        body = server.chat_requests[0].body
        schema = GREET.schema
        if mode == "json_object_schema":
            # Grammar endpoints get every free string and list bounded.
            assert body["response_format"] == {"type": "json_object", "schema": bounded(schema)}
            assert body["response_format"]["schema"]["properties"]["text"]["maxLength"] == 200
            assert body["messages"][0]["content"] == "Be brief."
        else:
            assert body.get("response_format") == ({"type": "json_object"} if mode == "json_object" else None)
            # The schema text ends the request: the system message stays the same for every step,
            # so a provider's prefix cache can serve it (and what follows it) across steps.
            assert body["messages"][0] == {"role": "system", "content": "Be brief."}
            assert body["messages"][-1]["role"] == "user"
            assert body["messages"][-1]["content"].endswith(json.dumps(schema, separators=(",", ":")))


def test_api_key_never_reaches_a_file(tmp_path):
    secret = "sk-live-DO-NOT-STORE-1234567890"

    def leaky(body, number):  # an endpoint that echoes the key in its first (bad) reply
        return reply(f"cannot help, key {secret}") if number == 1 else reply(GOOD)

    with FakeOpenAI(responder=leaky) as server:
        settings = settings_for(server, tmp_path, api_key=secret)
        [result], stats = ask(settings)
        assert result.value == Greeting(**GOOD) and stats.reasks == 1  # the leaky branch ran
        assert server.chat_requests[0].headers["authorization"] == f"Bearer {secret}"
        # The re-ask quotes the bad reply: scrubbed before it was ever sent back.
        assert "[redacted]" in server.chat_requests[1].body["messages"][-1]["content"]
    assert secret not in repr(settings)
    files = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert any(path.name == "cache.sqlite" for path in files)
    for path in files:
        assert secret.encode() not in path.read_bytes(), path


def test_retry_after_header_forms():
    assert _retry_after({"retry-after-ms": "1500"}) == 1.5
    assert _retry_after({"retry-after": "2"}) == 2.0
    assert _retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past
    assert _retry_after({}) is None
    assert _retry_after({"retry-after": "soon"}) is None


def test_bounded_schema_limits_free_strings_and_lists_only():
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "kind": {"type": "string", "enum": ["a", "b"]},
            "short": {"type": "string", "maxLength": 10},
            "tags": {"type": "array", "items": {"type": ["string", "null"]}},
            "few": {"type": "array", "maxItems": 2, "items": {"type": "integer"}},
            "many": {"type": "array", "maxItems": 8, "items": {"type": "integer"}},
            "exact": {"type": "array", "minItems": 6, "maxItems": 6, "items": {"type": "integer"}},
        },
    }
    result = bounded(schema)["properties"]
    assert result["many"]["maxItems"] == 4  # a larger bound comes down too
    assert result["exact"]["maxItems"] == 6  # never below minItems
    assert result["name"]["maxLength"] == 200 and "maxLength" not in result["kind"]
    assert result["short"]["maxLength"] == 10
    assert result["tags"]["maxItems"] == 4 and result["tags"]["items"]["maxLength"] == 200
    assert result["few"]["maxItems"] == 2
    assert "maxLength" not in schema["properties"]["name"]  # the input is not changed


def test_bounded_free_strings_are_plain_text_for_the_grammar():
    """The embedded model wrote queries ending in '}, {' (closing the list inside a string)."""
    import re

    result = bounded({"type": "object", "properties": {"q": {"type": "string", "minLength": 2}}})
    pattern = result["properties"]["q"]["pattern"]
    assert pattern.startswith("^") and pattern.endswith("{2,200}$")
    assert re.fullmatch(pattern[1:-1], "I want to feel heard, validated and comforted.")
    for broken in ("heard. }, {", 'say "hi"', "a\\nb", "<b>loud</b>", "# heading", "line\nbreak", "x"):
        assert not re.fullmatch(pattern[1:-1], broken), broken
    kept = bounded({"type": "string", "enum": ["a"]}), bounded({"type": "string", "pattern": "^m[0-9]+$"})
    assert "pattern" not in kept[0] and kept[1]["pattern"] == "^m[0-9]+$"


def test_rpm_spaces_request_starts(tmp_path):
    with FakeOpenAI() as server:
        results, _ = ask(settings_for(server, tmp_path, rpm=600, concurrency=5), count=5)
        assert all(not isinstance(r, Exception) for r in results)
        arrivals = sorted(r.received_at for r in server.chat_requests)
        # 600 per minute: one start every 0.1 s although 5 could be in flight at once, so
        # the five arrive over at least 0.4 s (less a margin for connection set-up jitter).
        assert len(arrivals) == 5 and arrivals[-1] - arrivals[0] >= 0.35


def test_every_answered_request_is_timed_and_cached_replies_are_not(tmp_path):
    """The run report's per-call timings: one entry per answered request (re-asks included),
    none for cache hits."""
    with FakeOpenAI(responder=lambda body, n: reply(GOOD), latency=lambda: 0.05) as server:
        server.queue(invalid_json_content())
        settings = settings_for(server, tmp_path)

        async def main():
            async with open_engine(settings) as engine:
                for number in range(3):
                    await engine.call(GREET, [{"role": "user", "content": f"#{number}"}])
                return engine.accounting

        accounting = asyncio.run(main())
        stats = accounting.step("greet")
        calls = accounting.slowest_calls()
        assert stats.requests == 4 and stats.answered == 4 and len(calls) == 4
        assert all(call["step"] == "greet" and call["seconds"] >= 0.05 for call in calls)
        assert stats.slowest >= 0.05 and stats.seconds >= 4 * 0.05
        assert all(call["completion_tokens"] > 0 for call in calls)

        sent = server.count
        again = asyncio.run(main())
        # The invalid first reply is never served again: one fresh request, two cache hits.
        assert server.count == sent + 1 and len(again.slowest_calls()) == 1
        assert again.step("greet").answered == 1 and again.step("greet").cache_hits == 2


def test_a_long_run_keeps_only_the_slowest_calls_in_its_report():
    """Before: every answered request's timing stayed in memory (200K dicts at 100K users)."""
    from personaemp.llm.accounting import CALLS_KEPT, Accounting

    accounting = Accounting()
    timings = [(i * 7919 % 1000) / 100 for i in range(CALLS_KEPT + 300)]
    for seconds in timings:
        step = "persona" if seconds < 5 else "big_five"
        accounting.record_call(step, seconds, prompt_tokens=1, completion_tokens=1, mode="json_schema")
    kept = [call["seconds"] for call in accounting.slowest_calls()]
    assert kept == sorted(timings, reverse=True)[:CALLS_KEPT] and len(accounting._slowest) == CALLS_KEPT
    assert {call["step"] for call in accounting.only({"big_five"}).slowest_calls()} == {"big_five"}
    assert accounting.step("persona").answered + accounting.step("big_five").answered == len(timings)
