"""The benchmark half: `criteria`, `respond` and `evaluate` on hand-made split files.

The users, queries and Big Five levels are written to real files under tmp_path; the
models are the fake OpenAI server, scripted so every number in the report can be
worked out by hand (the judge's score depends on the query it reads, so a score that
landed on the wrong query would show).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import read_jsonl, write_jsonl
from fake_openai import FakeOpenAI, invalid_json_content
from rich.console import Console
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.errors import InputError
from personaemp.llm.settings import LLMSettings
from personaemp.records import DIMENSIONS
from personaemp.stages.criteria import write_criteria
from personaemp.stages.evaluate import JudgeOptions, evaluate, harmonic
from personaemp.stages.respond import most_similar, write_responses

QUIET = Console(quiet=True)
LEVELS = {
    "u1": ("high", "low", "medium", "high", "low"),
    "u2": ("low", "low", "high", "medium", "medium"),
    "u3": ("medium", "high", "low", "low", "high"),
}
TRAITS = ("openness", "conscientiousness", "extraversion", "agreeableness", "neuroticism")
# The judge's score for each query (read from the query text it is shown), per dimension.
SCORES = {"u1-q1": (5, 4, 3), "u1-q2": (2, 2, 2), "u2-q1": (4, 4, 4), "u3-q1": (3, 5, 1)}
CATEGORY = {"u1-q1": "ES", "u1-q2": "SS", "u2-q1": "HEQ", "u3-q1": "ES"}


def user_row(user: str, query_ids: list[str]) -> dict:
    return {
        "user_id": user,
        "eligible": True,
        "language": "en",
        "profile": f"Profile of {user}: cares about family, anxious before exams.",
        "memories": [
            {"memory_id": "m1", "label": "States_Experiences", "value": f"{user} failed a driving test"},
            {"memory_id": "m2", "label": "Social_Relationships", "value": f"{user} has a younger sister"},
            {"memory_id": "m3", "label": "Preferences/Food", "value": "likes spicy noodles"},
            {"memory_id": "m4", "label": "Thoughts/Goals", "value": "wants to pass the driving exam soon"},
        ],
        "big_five": {t: {"level": lv, "evidence": ["m1"], "rationale": "r", "thin_evidence": False}
                     for t, lv in zip(TRAITS, LEVELS[user], strict=True)},
        "queries": [
            {
                "query_id": qid,
                "category": CATEGORY[qid],
                "query": f"[{qid}] I failed my driving test again and feel awful.",
                "situation": {"topic": "exam", "text": "They just failed a test.", "memory_ids": ["m1"]},
                "memory_ids": ["m1"],
            }
            for qid in query_ids
        ],
    }  # fmt: skip


@pytest.fixture
def workspace(tmp_path) -> Path:
    rows = [user_row("u1", ["u1-q1", "u1-q2"]), user_row("u2", ["u2-q1"]), user_row("u3", ["u3-q1"])]
    write_jsonl(tmp_path / "queries.jsonl", rows)
    write_jsonl(tmp_path / "splits" / "random" / "test.jsonl", rows)
    write_jsonl(tmp_path / "splits" / "random" / "train.jsonl", rows[:1])
    return tmp_path


def settings(server: FakeOpenAI, tmp_path: Path, **steps) -> LLMSettings:
    return LLMSettings(base_urls=[server.base_url], model="fake", work_dir=tmp_path / "work", steps=steps)


def query_id_in(body: dict) -> str | None:
    found = re.search(r"\[(u\d-q\d)\]", json.dumps(body["messages"]))
    return found.group(1) if found else None


def judge(body: dict, number: int):
    """Scripted models: a text reply for the policy, scores by query for the judge."""
    text = json.dumps(body["messages"])
    if "response_format" not in body and "Answer in json" not in text:
        return f"I'm sorry to hear that ({query_id_in(body)}). You will pass next time."
    qid = query_id_in(body)
    if "grading sheet" in text:  # the criteria step
        return {"criteria": [{"name": f"c{i}", "weight": i + 1, "description": "d"} for i in range(5)]}
    if "Dimension: " in text:
        dimension = re.search(r"Dimension: (\w+)", text).group(1)
        score = SCORES[qid][DIMENSIONS.index(dimension)]
        reply = {"analysis": f"{qid} {dimension}", "score": score}
        if "judge_dynamic" in text or "First decide" in text:
            reply["criteria"] = [{"name": f"c{i}", "weight": 25, "description": "d"} for i in range(4)]
        return reply
    if "outside reader" in text:
        return {"aspects": [{"name": n, "score": 16} for n in ("a", "b", "c", "d", "e")]}
    raise AssertionError(f"unexpected request: {text[:200]}")


def test_criteria_are_normalised_per_query_and_dimension(workspace):
    with FakeOpenAI(responder=lambda body, n: {"criteria": [
        {"name": "acknowledge the failed test", "weight": 3, "description": "names it"},
        {"name": "mention the sister", "weight": 1, "description": "family"},
        {"name": "no lecture", "weight": 2, "description": "no advice dump"},
        {"name": "hope", "weight": 2, "description": "next month"},
    ]}) as server:  # fmt: skip
        report = write_criteria(
            workspace / "queries.jsonl",
            workspace / "criteria.jsonl",
            settings(server, workspace),
            console=QUIET,
        )
        assert server.count == 4 * 3  # each query x each dimension
        requests = [r.body for r in server.chat_requests]
    assert report.outcome.balanced and report.outcome.done == 4
    rows = read_jsonl(workspace / "criteria.jsonl")
    assert [r["query_id"] for r in rows] == ["u1-q1", "u1-q2", "u2-q1", "u3-q1"]
    for row in rows:
        for dimension in DIMENSIONS:
            weights = [c["weight"] for c in row["criteria"][dimension]]
            assert weights == [37.5, 12.5, 25.0, 25.0]
            assert [c["given_weight"] for c in row["criteria"][dimension]] == [3, 1, 2, 2]
    assert all(r["temperature"] == 0.0 for r in requests), "criteria are written at temperature 0"
    seen = json.dumps([r["messages"] for r in requests])
    assert "younger sister" in seen and "Profile of u2" in seen and "They just failed a test." in seen


def test_respond_keeps_the_answer_without_reasoning_and_gives_each_context(workspace):
    def policy(body, n):
        return f"<think>planning a reply</think>Here for you ({query_id_in(body)})."

    with FakeOpenAI(responder=policy) as server:
        for context in ("none", "memory", "persona", "rag"):
            write_responses(
                workspace / "splits", workspace / f"{context}.jsonl", settings(server, workspace),
                context=context, rag_k=2, console=QUIET,
            )  # fmt: skip
        bodies = [r.body for r in server.chat_requests]
    assert len(bodies) == 4 * 4 and all("response_format" not in b for b in bodies)
    rows = read_jsonl(workspace / "memory.jsonl")
    assert [r["response"] for r in rows] == [
        f"Here for you ({q})." for q in ("u1-q1", "u1-q2", "u2-q1", "u3-q1")
    ]
    assert {r["context"] for r in rows} == {"memory"} and not any(r["truncated"] for r in rows)
    prompts = {
        ctx: json.dumps(bodies[i * 4]["messages"])
        for i, ctx in enumerate(("none", "memory", "persona", "rag"))
    }
    assert "spicy noodles" not in prompts["none"] and "Profile of" not in prompts["none"]
    assert "spicy noodles" in prompts["memory"] and "Profile of" not in prompts["memory"]
    assert "Profile of u1" in prompts["persona"] and "spicy noodles" not in prompts["persona"]
    assert "driving test" in prompts["rag"] and "spicy noodles" not in prompts["rag"]
    assert all("They just failed a test." not in p for p in prompts.values()), (
        "the policy never sees the situation"
    )


def test_rag_picks_the_memories_sharing_rare_words():
    memories = [
        {"memory_id": "m1", "value": "likes spicy noodles"},
        {"memory_id": "m2", "value": "failed the driving exam twice"},
        {"memory_id": "m3", "value": "has a cat"},
        {"memory_id": "m4", "value": "the driving instructor was rude"},
    ]
    assert [m["memory_id"] for m in most_similar("my driving exam is tomorrow", memories, 2)] == ["m2", "m4"]
    assert [m["memory_id"] for m in most_similar("我的猫生病了", [{"memory_id": "a", "value": "养了一只猫"},
            {"memory_id": "b", "value": "喜欢跑步"}], 1)] == ["a"]  # fmt: skip


def write_criteria_file(workspace: Path) -> Path:
    item = {"name": "n", "weight": 25.0, "description": "d"}
    rows = [{"query_id": q, "criteria": {d: [item] * 4 for d in DIMENSIONS}} for q in SCORES]
    return write_jsonl(workspace / "criteria.jsonl", rows)


def test_evaluate_scores_each_system_by_query_and_counts_missing_and_empty(workspace):
    criteria = write_criteria_file(workspace)
    full = write_jsonl(workspace / "full.jsonl", [{"query_id": q, "response": f"reply {q}"} for q in SCORES])
    # u1-q1 has no row, u1-q2 an empty response: both floor, no judge call; the rest are judged.
    gaps = write_jsonl(workspace / "gaps.jsonl", [
        {"query_id": "u1-q2", "response": "  "},
        {"query_id": "u2-q1", "response": "fine"},
        {"query_id": "u3-q1", "response": "ok"},
        {"query_id": "elsewhere-q9", "response": "not in this split"},
    ])  # fmt: skip
    with FakeOpenAI(responder=judge) as server:
        _, evaluation = evaluate(
            workspace / "splits", [full, gaps], workspace / "eval" / "report.json",
            settings(server, workspace), criteria_file=criteria, options=JudgeOptions(bystander=True),
            console=QUIET,
        )  # fmt: skip
        assert server.count == (4 + 2) * 4  # judged queries x (3 dimensions + bystander)
    assert json.loads((workspace / "eval" / "report.json").read_text()) == evaluation
    scores = {r["unit_id"]: r for r in read_jsonl(workspace / "eval" / "report.scores.jsonl")}
    for qid, expected in SCORES.items():
        assert [scores[f"full/{qid}"]["scores"][d] for d in DIMENSIONS] == list(expected)
    assert scores["gaps/u1-q1"]["status"] == "missing" and scores["gaps/u1-q2"]["status"] == "empty"
    assert scores["gaps/u1-q2"]["scores"] == dict.fromkeys(DIMENSIONS, 1.0)
    assert scores["gaps/u2-q1"]["scores"] == dict(zip(DIMENSIONS, SCORES["u2-q1"], strict=True))

    full_entry, gaps_entry = evaluation["systems"]["full"], evaluation["systems"]["gaps"]
    assert (full_entry["queries"], full_entry["judged"], full_entry["missing"], full_entry["empty"]) == (
        4,
        4,
        0,
        0,
    )
    assert (gaps_entry["queries"], gaps_entry["judged"], gaps_entry["missing"], gaps_entry["empty"]) == (
        4,
        2,
        1,
        1,
    )
    # resonation over the four queries: (5 + 2 + 4 + 3) / 4
    assert full_entry["dimensions"] == {"resonation": 3.5, "expression": 3.75, "reception": 2.5}
    assert full_entry["avg"] == round((3.5 + 3.75 + 2.5) / 3, 3)
    hs = [harmonic(dict(zip(DIMENSIONS, s, strict=True))) for s in SCORES.values()]
    assert full_entry["harmonic"] == round(sum(hs) / 4, 4)
    assert full_entry["bystander"] == 0.8
    assert full_entry["reward"] == round(sum(h + 0.5 * (0.8 - 1) for h in hs) / 4, 4)
    assert gaps_entry["dimensions"]["resonation"] == (1 + 1 + 4 + 3) / 4
    assert gaps_entry["bystander"] == round((0 + 0 + 0.8 + 0.8) / 4, 4)
    # by category and Big Five level
    assert full_entry["by_category"]["ES"]["n"] == 2
    assert full_entry["by_category"]["ES"]["dimensions"]["resonation"] == (5 + 3) / 2
    assert full_entry["by_big_five"]["openness"]["high"]["n"] == 2  # u1's two queries
    assert full_entry["by_big_five"]["openness"]["low"]["dimensions"]["reception"] == 4
    assert evaluation["mode"] == "fixed" and evaluation["judge_model"] == "fake"


def test_an_unreadable_judgment_is_counted_never_filled(workspace):
    criteria = write_criteria_file(workspace)
    full = write_jsonl(workspace / "full.jsonl", [{"query_id": q, "response": f"reply {q}"} for q in SCORES])

    def flaky(body, n):
        return invalid_json_content() if query_id_in(body) == "u2-q1" else judge(body, n)

    with FakeOpenAI(responder=flaky) as server:
        report, evaluation = evaluate(
            workspace / "splits", [full], workspace / "report.json", settings(server, workspace),
            criteria_file=criteria, console=QUIET,
        )  # fmt: skip
    entry = evaluation["systems"]["full"]
    assert (
        report.outcome.failed == 1 and entry["unparsed"] == 1 and entry["failures_by_kind"] == {"invalid": 1}
    )
    assert (entry["queries"], entry["judged"], entry["n"]) == (4, 3, 3)
    assert entry["dimensions"]["resonation"] == round((5 + 2 + 3) / 3, 3), "the unparsed query is left out"
    failures = read_jsonl(workspace / "report.failures.jsonl")
    assert [f["unit_id"] for f in failures] == ["full/u2-q1"]
    scores = {r["query_id"]: r["scores"] for r in read_jsonl(workspace / "report.scores.jsonl")}
    assert scores == {q: dict(zip(DIMENSIONS, SCORES[q], strict=True)) for q in ("u1-q1", "u1-q2", "u3-q1")}


def test_dynamic_at_k_averages_k_samples_and_needs_a_temperature(workspace):
    full = write_jsonl(workspace / "full.jsonl", [{"query_id": q, "response": f"r {q}"} for q in SCORES])
    with FakeOpenAI(responder=judge) as server:
        with pytest.raises(InputError, match="identical judgments"):
            evaluate(workspace / "splits", [full], workspace / "r.json", settings(server, workspace),
                     options=JudgeOptions(dynamic=True, samples=3), console=QUIET)  # fmt: skip
        assert server.count == 0
        _, evaluation = evaluate(
            workspace / "splits", [full], workspace / "r.json",
            settings(server, workspace, judge_dynamic={"temperature": 0.7}),
            options=JudgeOptions(dynamic=True, samples=3), console=QUIET,
        )  # fmt: skip
        assert server.count == 4 * 3 * 3
        assert all(r.body["temperature"] == 0.7 for r in server.chat_requests)
    rows = read_jsonl(workspace / "r.scores.jsonl")
    assert all(len(r["samples"][d]) == 3 for r in rows for d in DIMENSIONS)
    assert evaluation["mode"] == "dynamic@3" and evaluation["criteria_file"] is None
    assert evaluation["systems"]["full"]["dimensions"] == {
        "resonation": 3.5,
        "expression": 3.75,
        "reception": 2.5,
    }


def test_bad_inputs_stop_before_any_request(workspace):
    criteria = write_criteria_file(workspace)
    twice = write_jsonl(workspace / "twice.jsonl", [{"query_id": "u1-q1", "response": "a"}] * 2)
    wrong = write_jsonl(workspace / "wrong.jsonl", [{"query": "u1-q1", "response": "a"}])
    partial = write_jsonl(workspace / "partial.jsonl", [{"query_id": "u1-q1", "criteria": {}}])
    with FakeOpenAI(responder=judge) as server:
        run = lambda responses, **kw: evaluate(  # noqa: E731
            workspace / "splits", responses, workspace / "r.json", settings(server, workspace),
            console=QUIET, **{"criteria_file": criteria, **kw},
        )  # fmt: skip
        with pytest.raises(InputError, match=r"twice.jsonl:2: a second response to u1-q1"):
            run([twice])
        with pytest.raises(InputError, match=r"wrong.jsonl:1: not a response row"):
            run([wrong])
        with pytest.raises(InputError, match=r"partial.jsonl:1: not a criteria row"):
            run([write_jsonl(workspace / "good.jsonl", [{"query_id": "u1-q1", "response": "a"}])],
                criteria_file=partial)  # fmt: skip
        with pytest.raises(InputError, match="both named 'twice'"):
            run([twice, workspace / "other" / "twice.jsonl"])
        with pytest.raises(InputError, match="no such split file"):
            evaluate(workspace / "nowhere", [twice], workspace / "r.json", settings(server, workspace))
        assert server.count == 0
    assert not (workspace / "r.json").exists()


def test_the_three_commands_from_the_cli(workspace, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.chdir(workspace)
    runner = CliRunner()
    with FakeOpenAI(responder=judge) as server:
        common = ["--base-url", server.base_url, "--model", "fake", "--work-dir", "work"]
        result = runner.invoke(
            app, ["criteria", "--input", "queries.jsonl", "--output", "criteria.jsonl", *common]
        )
        assert result.exit_code == 0, result.output
        result = runner.invoke(
            app, ["respond", "--splits", "splits", "--context", "rag", "--output", "rag.jsonl", *common]
        )
        assert result.exit_code == 0, result.output
        result = runner.invoke(app, ["evaluate", "--splits", "splits", "--responses", "rag.jsonl",
                                     "--criteria", "criteria.jsonl", "--output", "eval.json",
                                     *common])  # fmt: skip
        assert result.exit_code == 0, result.output
    assert "resonation" in result.output and "Avg" in result.output and "rag" in result.output
    evaluation = json.loads((workspace / "eval.json").read_text())
    assert evaluation["systems"]["rag"]["judged"] == 4
    assert evaluation["systems"]["rag"]["dimensions"] == {
        "resonation": 3.5,
        "expression": 3.75,
        "reception": 2.5,
    }


def test_a_rerun_sends_nothing_and_a_changed_response_is_judged_again_alone(workspace):
    criteria = write_criteria_file(workspace)
    rows = [{"query_id": q, "response": f"reply {q}"} for q in SCORES]
    mine = write_jsonl(workspace / "mine.jsonl", rows)
    with FakeOpenAI(responder=judge) as server:
        run = lambda: evaluate(  # noqa: E731
            workspace / "splits", [mine], workspace / "r.json", settings(server, workspace),
            criteria_file=criteria, console=QUIET,
        )  # fmt: skip
        first = run()[1]
        assert server.count == 4 * 3
        report, again = run()
        assert server.count == 4 * 3, "a re-run sends 0 requests"
        assert report.outcome.done_before == 4 and again["systems"] == first["systems"]
        rows[2]["response"] = "a different reply"
        write_jsonl(mine, rows)
        run()
        assert server.count == 4 * 3 + 3, "only the changed response is judged again"


def test_own_responses_lose_their_reasoning_and_unknown_ids_are_named(workspace):
    criteria = write_criteria_file(workspace)
    own = write_jsonl(workspace / "own.jsonl", [
        {"query_id": "u1-q1", "response": "<think>the user is sad</think>I am sorry."},
        {"query_id": "u1-q2", "response": "<think>never closed"},
        "",
        {"query_id": "typo-q1", "response": "hello"},
    ])  # fmt: skip
    with FakeOpenAI(responder=judge) as server:
        _, evaluation = evaluate(
            workspace / "splits", [own], workspace / "r.json", settings(server, workspace),
            criteria_file=criteria, console=QUIET,
        )  # fmt: skip
        judged = json.dumps([r.body["messages"] for r in server.chat_requests])
    assert "I am sorry." in judged and "the user is sad" not in judged and "never closed" not in judged
    entry = evaluation["systems"]["own"]
    assert (entry["judged"], entry["empty"], entry["missing"]) == (1, 1, 2)  # reasoning only: empty
    assert entry["unknown_query_ids"] == 1 and entry["unknown_examples"] == [f"{own}:4 typo-q1"]
    assert entry["blank_lines"] == [f"{own}:3"]


def test_two_models_answering_into_one_folder_keep_their_own_failures(workspace):
    """Before: every respond output in a folder shared respond.failures.jsonl, and each run
    rewrote it with its own rows only, so a re-run of the first model asked again."""

    def policy(body, n):
        if "[u2-q1]" in json.dumps(body["messages"]) and body["model"] == "a":
            return ""  # model a never answers u2-q1: a failure to keep
        return "I hear you."

    with FakeOpenAI(responder=policy) as server:
        for model in ("a", "b"):
            s = LLMSettings(base_urls=[server.base_url], model=model, work_dir=workspace / "work")
            write_responses(workspace / "splits", workspace / "runs" / f"{model}.jsonl", s, console=QUIET)
        sent = server.count
        s = LLMSettings(base_urls=[server.base_url], model="a", work_dir=workspace / "work")
        report = write_responses(workspace / "splits", workspace / "runs" / "a.jsonl", s, console=QUIET)
        assert server.count == sent and report.outcome.failed_before == 1
    assert [f["query_id"] for f in read_jsonl(workspace / "runs" / "a.failures.jsonl")] == ["u2-q1"]


def test_weights_sum_to_exactly_100_and_bad_criteria_rows_are_one_line(workspace):
    from personaemp.stages.criteria import CriteriaReply, normalise

    six = CriteriaReply.model_validate({"criteria": [{"name": "n", "weight": 1, "description": "d"}] * 6})
    assert sum(c.weight for c in normalise(six)) == 100 and {c.weight for c in normalise(six)} == {
        16.67,
        16.66,
    }
    item = {"name": "n", "weight": "25", "description": "d"}
    bad = write_jsonl(
        workspace / "crit.jsonl", [{"query_id": "u1-q1", "criteria": {d: [item] for d in DIMENSIONS}}]
    )
    full = write_jsonl(workspace / "full.jsonl", [{"query_id": "u1-q1", "response": "r"}])
    with pytest.raises(InputError, match=r"crit.jsonl:1: not a criteria row \(weight"):
        evaluate(
            workspace / "splits", [full], workspace / "r.json", LLMSettings(model="m"), criteria_file=bad
        )


def test_dynamic_counts_an_unreadable_sample_and_refuses_a_fixed_seed(workspace):
    full = write_jsonl(workspace / "full.jsonl", [{"query_id": q, "response": f"r {q}"} for q in SCORES])

    seen = []

    def once_unreadable(body, n):
        """The first sample of u3-q1's resonation is unreadable, re-asks included (3 requests)."""
        text = json.dumps(body["messages"])
        if "[u3-q1]" in text and "Dimension: resonation" in text:
            seen.append(n)
            if len(seen) <= 3:
                return invalid_json_content()
        return judge(body, n)

    with FakeOpenAI(responder=once_unreadable) as server:
        with pytest.raises(InputError, match="identical requests"):
            evaluate(workspace / "splits", [full], workspace / "r.json",
                     LLMSettings(base_urls=[server.base_url], model="m", seed=3, work_dir=workspace / "w",
                                 steps={"judge_dynamic": {"temperature": 0.7}}),
                     options=JudgeOptions(dynamic=True, samples=2), console=QUIET)  # fmt: skip
        _, evaluation = evaluate(
            workspace / "splits", [full], workspace / "r.json",
            settings(server, workspace, judge_dynamic={"temperature": 0.7}),
            options=JudgeOptions(dynamic=True, samples=2), console=QUIET,
        )  # fmt: skip
    entry = evaluation["systems"]["full"]
    assert entry["unparsed"] == 0 and entry["judged"] == 4
    assert entry["unparsed_samples"] == 1
    rows = {r["query_id"]: r for r in read_jsonl(workspace / "r.scores.jsonl")}
    assert rows["u3-q1"]["unparsed_samples"] == entry["unparsed_samples"]
    assert rows["u3-q1"]["scores"]["resonation"] == 3  # the readable samples, all 3
