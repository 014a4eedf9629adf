"""The LLM stages end to end on the embedded local model (llm/models.py, via llama.cpp).

Real requests to a real local server: slow (half a minute per stage and user on one core),
so one short user only, at temperature 0 as in the demo, and each stage in its own test so the
two run on different workers. A 0.5B model's content is weak; what is
checked is that every reply went through the schema, the grounding and check rules, that the
books balance, and that the compact prompt's schema gets one moment per category.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI
from rich.console import Console

from personaemp.dataset.filter import filter_users
from personaemp.dataset.persona import infer_personas
from personaemp.dataset.queries import QueryOptions, generate_queries
from personaemp.llm.local import MODEL_NAME
from personaemp.llm.settings import LLMSettings
from personaemp.records import Persona, Query

# the embedded model's recorded replies (tests/cassettes.py; `make record-embedded` records them)
pytestmark = [pytest.mark.recorded, pytest.mark.usefixtures("embedded_replies")]
SAMPLE = Path(__file__).resolve().parents[2] / "data" / "raw" / "alpsbench_sample" / "task1"
# An English user with two short memories: the first filtered user writes Russian, whose
# tokens made the persona reply three times longer (infer-persona 32 s instead of 20 s).
USER = "sess_520340fb28df__65201"


def test_infer_persona_on_the_embedded_model(tmp_path):
    quiet = Console(file=open(tmp_path / "console.txt", "w"))  # noqa: SIM115
    filter_users(str(SAMPLE), tmp_path / "filtered.jsonl", console=quiet)
    settings = LLMSettings(llm="local", work_dir=tmp_path / "work", temperature=0.0)  # as the demo

    made = infer_personas(
        tmp_path / "filtered.jsonl", tmp_path / "personas.jsonl", settings, users=[USER], require_depth=False
    )
    report, summary = made.report, made.summary
    assert report.outcome.balanced and report.outcome.units == 1
    assert report.model == MODEL_NAME and report.endpoint_kind == "local"
    assert report.calls and all(call["structured"] == "json_object_schema" for call in report.calls)
    rows = [json.loads(line) for line in (tmp_path / "personas.jsonl").read_text().splitlines()]
    failures = (tmp_path / "infer-persona.failures.jsonl").read_text().splitlines()
    assert len(rows) + len(failures) == 1
    for row in rows:
        persona = Persona.model_validate(row)
        memory_ids = {m.memory_id for m in persona.memories}
        assert all(set(trait.evidence) <= memory_ids and trait.evidence for trait in persona.traits)
        if persona.eligible:
            assert persona.big_five is not None and persona.traits
    assert summary.eligible + summary.ineligible == len(rows)


def test_gen_queries_on_the_embedded_model(tmp_path):
    """From one persona written by the test server (a valid, eligible one), so this test
    does not depend on what the base model makes of the persona step."""
    quiet = Console(file=open(tmp_path / "console.txt", "w"))  # noqa: SIM115
    filter_users(str(SAMPLE), tmp_path / "filtered.jsonl", console=quiet)
    with FakeOpenAI() as server:
        fake = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=tmp_path / "fake-work")
        infer_personas(
            tmp_path / "filtered.jsonl", tmp_path / "personas.jsonl", fake, users=[USER], console=quiet
        )
    assert Persona.model_validate_json((tmp_path / "personas.jsonl").read_text().splitlines()[0]).eligible

    settings = LLMSettings(llm="local", work_dir=tmp_path / "work", temperature=0.0)  # as the demo
    options = QueryOptions(enforce=("memory_ids_valid", "length_ok", "not_duplicate"))
    made = generate_queries(
        tmp_path / "personas.jsonl", tmp_path / "queries.jsonl", settings, options=options
    )
    report, funnel = made.report, made.summary
    assert report.outcome.balanced and report.outcome.units == 1
    assert report.endpoint_kind == "local"
    assert funnel.generated == sum(funnel.accepted.values()) + sum(funnel.rejected.values())
    assert funnel.situations == len(options.categories), "the compact schema: one moment per category"
    for line in (tmp_path / "queries.jsonl").read_text().splitlines():
        row = json.loads(line)
        memory_ids = {m["memory_id"] for m in row["memories"]}
        for query in (Query.model_validate(q) for q in row["queries"]):
            assert set(query.memory_ids) <= memory_ids and query.checks.passed
            assert query.category in options.categories
            assert not {"{", "}", "[", "]", '"'} & set(query.query), "plain text under the grammar"
