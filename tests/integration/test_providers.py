"""Both LLM stages, with default options, against every provider profile of the fake server.

The profiles reproduce what the providers document (tests/fake_openai.py): DeepSeek refuses
json_schema and demands reasoning_content on replayed assistant turns, MiniMax writes
<think> blocks into content, vLLM adds reasoning fields, plain models wrap JSON in fences,
llama-cpp-python 500s on json_schema. No unit may fail because of the protocol.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_openai import PROFILES, FakeOpenAI, reply
from rich.console import Console

from personaemp.dataset.filter import filter_users
from personaemp.dataset.persona import infer_personas
from personaemp.dataset.queries import generate_queries
from personaemp.llm.engine import DECISIONS_FILE
from personaemp.llm.settings import LLMSettings

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "raw" / "alpsbench_sample" / "task1"

EXPECTED_MODE = {
    "openai": "json_schema",
    "deepseek": "json_object",
    "minimax": "json_schema",
    "minimax_open_dropped": "json_schema",
    "vllm": "json_schema",
    "fenced": "json_object",
    "llamacpp": "json_object",
}
DRAFTING = 'The user seems anxious. A first draft: {"depth": "maybe"} ... no, follow the schema.'
REASONING = {"deepseek", "minimax", "minimax_open_dropped", "vllm"}


@pytest.fixture(scope="module")
def filtered(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("filtered")
    output = folder / "filtered.jsonl"
    filter_users(str(SAMPLE), output, report_path=folder / "filter_report.json", console=Console(quiet=True))
    return output


def settings_for(server: FakeOpenAI, work: Path) -> LLMSettings:
    """Default options: only where the endpoint is and which model."""
    return LLMSettings(base_urls=[server.base_url], model="fake", work_dir=work, api_key="sk-test")


def run_both(server: FakeOpenAI, filtered: Path, folder: Path, **persona_options):
    console = Console(file=(folder / "console.txt").open("w"), width=200)
    settings = settings_for(server, folder / "work")
    personas = infer_personas(
        filtered, folder / "personas.jsonl", settings, console=console, **persona_options
    ).report
    queries = generate_queries(
        folder / "personas.jsonl", folder / "queries.jsonl", settings, console=console
    ).report
    console.file.close()
    return personas, queries


@pytest.mark.parametrize("profile", PROFILES)
def test_both_llm_stages_complete_on_every_provider(tmp_path, filtered, profile):
    assert set(EXPECTED_MODE) == set(PROFILES)
    # Reasoning that drafts a wrong JSON object, as thinking models do: never the answer.
    with FakeOpenAI(profile=profile, reasoning=DRAFTING) as server:
        # One bad reply first, so a re-ask happens on every profile (DeepSeek refuses a
        # replayed assistant turn without its reasoning_content: re-asks must not replay).
        server.queue(reply({"not": "a persona"}))
        personas, queries = run_both(server, filtered, tmp_path, limit=4)
        refused = [r for r in server.chat_requests if (r.body or {}).get("response_format", {}).get("type")
                   == "json_schema" and EXPECTED_MODE[profile] != "json_schema"]  # fmt: skip
    assert server.errors == []
    for report in (personas, queries):
        assert report.outcome.failed == 0, (profile, report.outcome.failures_by_kind)
        assert report.outcome.done == report.outcome.units > 0
        assert report.structured["used"] == EXPECTED_MODE[profile]
    assert personas.steps["persona"]["reasks"] == 1
    # The mode is decided once: after the first refusal, it is remembered for the next stage.
    assert len(refused) == (1 if EXPECTED_MODE[profile] != "json_schema" else 0)
    assert queries.structured["decided_by"] == "remembered"
    decisions = json.loads((tmp_path / "work" / DECISIONS_FILE).read_text())
    assert decisions == {
        f"{server.base_url} fake": {
            "structured": EXPECTED_MODE[profile],
            "refused": personas.structured["refused"],
            "decided_at": decisions[f"{server.base_url} fake"]["decided_at"],
        }
    }
    thinking = personas.totals["reasoning_tokens"] + queries.totals["reasoning_tokens"]
    assert (thinking > 0) == (profile in REASONING)
    console = (tmp_path / "console.txt").read_text()
    assert "structured output auto: json_schema (first try)" in console  # the header
    if EXPECTED_MODE[profile] != "json_schema":
        assert "refused json_schema" in console and f"trying {EXPECTED_MODE[profile]}" in console
    # What the stages wrote is the answer, never the reasoning around it.
    text = (tmp_path / "personas.jsonl").read_text() + (tmp_path / "queries.jsonl").read_text()
    assert "<think>" not in text and "</think>" not in text and "```" not in text


def test_deepseek_json_object_requests_say_json_and_never_replay_assistant_turns(tmp_path, filtered):
    with FakeOpenAI(profile="deepseek") as server:
        server.queue(reply({"not": "a persona"}), reply({"still": "wrong"}))
        personas, _ = run_both(server, filtered, tmp_path, limit=2)
    assert personas.outcome.failed == 0
    sent = [r.body for r in server.chat_requests][1:]  # after the one refused json_schema request
    assert all(body["response_format"] == {"type": "json_object"} for body in sent)
    for body in sent:
        assert "json" in " ".join(m["content"] for m in body["messages"]).lower()
        assert [m["role"] for m in body["messages"]] == ["system", "user"]


def test_remembered_mode_is_used_from_the_first_request(tmp_path, filtered):
    with FakeOpenAI(profile="fenced") as server:
        run_both(server, filtered, tmp_path, limit=1)
    with FakeOpenAI(profile="fenced", port=0) as server:
        # Another port is another endpoint: it is negotiated anew.
        (tmp_path / "work" / "cache.sqlite").unlink()
        settings = settings_for(server, tmp_path / "work")
        report = infer_personas(
            filtered, tmp_path / "again.jsonl", settings, limit=1, console=Console(quiet=True)
        ).report
        assert report.structured["decided_by"] == "refusals"
        first = server.chat_requests[0].body
        assert first["response_format"]["type"] == "json_schema"
        # The same endpoint again: the remembered mode is sent at once, nothing is refused.
        before = server.count
        report = infer_personas(
            filtered, tmp_path / "third.jsonl", settings, users=None, limit=2, console=Console(quiet=True)
        ).report
        assert report.structured["decided_by"] == "remembered"
        assert all(r.body["response_format"]["type"] == "json_object" for r in server.chat_requests[before:])
