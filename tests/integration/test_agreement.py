"""`personaemp agreement`: the statistics, the figures of hand-made labels worked out by hand,
the second judge through the real check step, and the card's Quality section."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import order_free_responder, read_jsonl, write_jsonl
from fake_openai import FakeOpenAI
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.publish import publish
from personaemp.dataset.split import split_users
from personaemp.review.agreement import (
    card_quality,
    compute_agreement,
    confusion,
    kappa_of,
    rogan_gladen,
    wilson,
)
from personaemp.review.page import LLM_CHECKS, LabelFile, make_event, read_items

# --- the statistics ----------------------------------------------------------------------------


def test_kappa_of_a_worked_example():
    # 50 pairs: 20 both pass, 5 + 10 disagreements, 15 both fail: observed 0.7, chance 0.5
    assert kappa_of([20, 5, 10, 15]) == pytest.approx(0.4)
    assert kappa_of([10, 0, 0, 10]) == 1.0
    assert kappa_of([30, 0, 0, 0]) is None  # one answer only: chance agreement is total
    assert kappa_of([0, 0, 0, 0]) is None
    assert confusion([(True, True), (True, False), (False, True), (False, False), (True, True)]) == [
        2,
        1,
        1,
        1,
    ]


def test_wilson_interval_of_a_worked_example():
    assert wilson(8, 10) == [0.4902, 0.9433]
    assert wilson(0, 5) == [0.0, 0.4345]
    assert wilson(0, 0) is None


def test_rogan_gladen_corrects_the_apparent_share():
    assert rogan_gladen(0.8, 0.9, 0.8) == pytest.approx(0.6 / 0.7)
    assert rogan_gladen(0.99, 0.9, 0.5) == 1.0  # clipped
    assert rogan_gladen(0.8, 0.5, 0.5) is None  # a judge no better than chance corrects nothing


# --- hand-made labels --------------------------------------------------------------------------


def queries_row(user: str, verdicts: list[tuple[bool, bool]]) -> dict:
    """A gen-queries row whose queries have these (emotional_support, accepted) outcomes."""
    made = []
    for n, (verdict, accepted) in enumerate(verdicts, 1):
        checks = {name: True for name in LLM_CHECKS}
        checks.update(emotional_support=verdict, passed=accepted, reasons={})
        made.append({"query_id": f"{user}-q{n}", "category": "ES", "query": "text", "memory_ids": ["m1"],
                     "situation": {"topic": "t", "text": "s", "memory_ids": ["m1"]}, "checks": checks,
                     "accepted": accepted})  # fmt: skip
    return {
        "user_id": user, "language": "en", "profile": "", "big_five": {},
        "memories": [{"memory_id": "m1", "label": "L", "value": "v"}],
        "traits": [{"aspect": "a", "statement": "Worries", "evidence": ["m1"]}],
        "queries": [q for q in made if q.pop("accepted")],
        "rejected_queries": [q for q in made if not q["checks"]["passed"]],
    }  # fmt: skip


def test_figures_of_hand_made_labels(tmp_path):
    # 10 queries; the judge passes emotional_support on 8 (u1-q1..q8) and fails 2 (q9, q10)
    verdicts = [(True, True)] * 8 + [(False, False)] * 2
    path = write_jsonl(tmp_path / "queries.jsonl", [queries_row("u1", verdicts)])
    items = {i["query_id"]: i for i in read_items(path)}
    labels = LabelFile(tmp_path / "labels.jsonl")

    def label(reviewer, query, field, value):
        labels.append(
            make_event({"reviewer": reviewer, "query_id": query, "field": field, "value": value}, items)
        )

    # ana labels all ten: agrees on q1-q6 and q9-q10, disagrees on q7, q8 (the judge passed them)
    for n in range(1, 11):
        label("ana", f"u1-q{n}", "check:emotional_support", "disagree" if n in (7, 8) else "agree")
        label("ana", f"u1-q{n}", "query", "reject" if n in (7, 8, 9, 10) else "accept")
        label("ana", f"u1-q{n}", "trait:0", "supported")
    # bo labels q1-q4: the same as ana except q4
    for n in range(1, 5):
        label("bo", f"u1-q{n}", "check:emotional_support", "disagree" if n == 4 else "agree")
    report = compute_agreement(path, labels.path, resamples=500, seed=1)

    es = report["judge_vs_people"]["emotional_support"]
    # pairs (judge, person): ana 6 (T,T) + 2 (T,F) + 2 (F,F); bo 3 (T,T) + 1 (T,F)
    assert es["confusion"] == [9, 3, 0, 2] and es["pairs"] == 14 and es["queries"] == 10
    assert es["agreement"] == round(11 / 14, 4)
    assert es["constant"] == round(9 / 14, 4)  # always "passes"
    assert es["kappa"] == round(kappa_of([9, 3, 0, 2]), 4)
    low, high = es["kappa_ci"]
    assert low <= es["kappa"] <= high
    assert es["precision"] == 0.75 and es["precision_ci"] == wilson(9, 12)
    assert (es["sensitivity"], es["specificity"]) == (1.0, 0.4)
    # the judge passed 8 of 10: corrected with Se 1, Sp 0.4 -> (0.8 + 0.4 - 1) / 0.4 = 0.5
    assert es["apparent_pass"] == 0.8 and es["corrected_pass"] == 0.5
    assert report["judge_vs_people"]["role_awareness"]["pairs"] == 0  # nobody labelled it

    acceptance = report["acceptance"]
    assert acceptance["confusion"] == [6, 2, 0, 2] and acceptance["precision"] == 0.75
    people = report["people_vs_people"]
    assert people["reviewer_pairs"] == [["ana", "bo"]]
    assert people["fields"]["emotional_support"]["confusion"] == [3, 1, 0, 0]  # (ana, bo) on q1-q4
    assert report["traits"] == {"labelled": 1, "supported": 1, "share": 1.0, "share_ci": wilson(1, 1)}
    assert report["judge_vs_judge"] is None


# --- a build from the shared sample through the fake endpoint ----------------------------------


@pytest.fixture
def build(sample_build, tmp_path, monkeypatch) -> Path:
    """A copy of the sample build (queries, their manifest) with its own splits."""
    monkeypatch.chdir(tmp_path)  # a default path lands here, never in the repository
    processed = tmp_path / "processed"
    processed.mkdir()
    for name in ("queries.jsonl", "manifest.json", "personas.jsonl", "filter_report.json"):
        if (sample_build / name).exists():
            shutil.copy(sample_build / name, processed / name)
    split_users(processed / "queries.jsonl", processed / "splits", ood=True, seed=13, test_size=0.1)
    return processed


def label_sample(build: Path, reviewers=("ana", "bo"), size=24) -> Path:
    """Two reviewers label the same sample as the page would post it: ana agrees with the judge
    except on every fourth query, bo on every third; traits alternate."""
    from personaemp.review.page import open_session

    session = open_session(build / "queries.jsonl", build / "labels.jsonl", size, 0)
    for r, reviewer in enumerate(reviewers):
        for n, item in enumerate(session.items):

            def post(field, value, item=item, reviewer=reviewer):
                body = {"reviewer": reviewer, "query_id": item["query_id"], "field": field, "value": value}
                session.labels.append(make_event(body, session.by_id))

            odd = n % (4 + r) == 0
            post("query", "reject" if odd or not item["accepted"] else "accept")
            for check in LLM_CHECKS:
                post(f"check:{check}", "disagree" if odd else "agree")
            for t in range(len(item["traits"])):
                post(f"trait:{t}", "unsupported" if (n + t) % 3 == 0 else "supported")
    return build / "labels.jsonl"


def test_the_second_judge_reruns_the_check_step_apart_from_the_build(build, tmp_path):
    label_sample(build)
    before = (build / "queries.jsonl").read_bytes()
    generated = sum(
        len(r["queries"]) + len(r["rejected_queries"]) for r in read_jsonl(build / "queries.jsonl")
    )
    with FakeOpenAI(responder=order_free_responder(seed=8)) as second:
        result = CliRunner().invoke(app, [
            "agreement", "--input", str(build / "queries.jsonl"), "--judge-model", "judge-2",
            "--judge-base-url", second.base_url, "--work-dir", str(tmp_path / "work"),
            "--resamples", "300",
        ])  # fmt: skip
        assert result.exit_code == 0, result.output
        bodies = [r.body for r in second.chat_requests]
    # one check-step request per user with queries, the second judge's model, the check prompt
    assert bodies and all(b["model"] == "judge-2" for b in bodies)
    assert all("reviews" in json.dumps(b["response_format"]) for b in bodies)
    assert len(bodies) == sum(
        1 for r in read_jsonl(build / "queries.jsonl") if r["queries"] or r["rejected_queries"]
    )
    assert (build / "queries.jsonl").read_bytes() == before  # the build is not touched
    second_rows = read_jsonl(build / "second_judge.jsonl")
    assert sum(len(r["queries"]) for r in second_rows) == generated
    assert {r["provenance"]["model"] for r in second_rows} == {"judge-2"}

    report = json.loads((build / "agreement" / "agreement.json").read_text())
    assert (build / "agreement" / "agreement.png").read_bytes().startswith(b"\x89PNG")
    assert report["judge_vs_judge"]["model"] == "judge-2"
    assert report["judge_vs_judge"]["queries"] == generated
    for check in LLM_CHECKS:
        people = report["judge_vs_people"][check]
        assert people["pairs"] == 48  # 24 queries x 2 reviewers
        assert people["agreement"] is not None and people["constant"] is not None
        assert report["judge_vs_judge"]["checks"][check]["pairs"] == generated
    # the summary names every check with its kappa and interval
    for check in LLM_CHECKS:
        line = next(line for line in result.stderr.splitlines() if f"│ {check}" in line)
        assert "[" in line, line
    assert "people vs people, query: κ" in result.stderr
    assert "traits supported:" in result.stderr

    # a second run sends nothing: the second judge's rows are done
    with FakeOpenAI(responder=order_free_responder(seed=8)) as again:
        result = CliRunner().invoke(app, [
            "agreement", "--input", str(build / "queries.jsonl"), "--judge-model", "judge-2",
            "--judge-base-url", again.base_url, "--work-dir", str(tmp_path / "work"), "--resamples", "300",
        ])  # fmt: skip
        assert result.exit_code == 0, result.output
        assert again.count == 0


def test_agreement_without_labels_or_a_second_judge_exits_2(build):
    result = CliRunner().invoke(app, ["agreement", "--input", str(build / "queries.jsonl")])
    assert result.exit_code == 2
    assert "labels.jsonl: no labels, and no second judge" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_judge_endpoint_without_a_model_exits_2(build):
    result = CliRunner().invoke(
        app, ["agreement", "--input", str(build / "queries.jsonl"), "--judge-base-url", "http://x/v1"]
    )
    assert result.exit_code == 2 and "--judge-base-url needs --judge-model" in result.stderr


def test_the_card_has_a_quality_section_from_the_labels(build, tmp_path):
    label_sample(build)
    out = tmp_path / "dataset"
    publish(build / "splits", out=out, quality=card_quality)  # as push passes it
    card = (out / "README.md").read_text(encoding="utf-8")
    quality = card.split("## Quality", 1)[1].split("\n## ", 1)[0]
    assert "2 reviewers labelled 24 of the" in quality
    assert "queries on the review page (`personaemp review`) (a sample" in quality
    assert "Label Studio" not in quality
    rows = [line for line in quality.splitlines() if line.startswith("| ") and "LLM check" not in line]
    assert [row.split(" | ")[0].strip("| ") for row in rows] == list(LLM_CHECKS)
    report = compute_agreement(build / "queries.jsonl", build / "labels.jsonl")
    es = report["judge_vs_people"]["emotional_support"]
    assert f"| emotional_support | 48 | {es['kappa']:.2f} [" in quality
    assert "Persona traits people found supported" in quality
    assert "![Judge agreement per LLM check](figures/agreement.png)" in card
    assert (out / "figures" / "agreement.png").read_bytes().startswith(b"\x89PNG")
    # and the enforced/recorded split of the honest card
    assert "A query was accepted when it passed every one of: `emotional_support`" in card
    assert "| not_copied | decided acceptance |" in card


def test_the_card_says_labels_imported_from_label_studio_came_from_there(build, tmp_path):
    """Labels imported from Label Studio (reviewers named as the import names them) are not
    said to come from `personaemp review`'s page; a mix names both."""
    label_sample(build, reviewers=("label-studio:7", "label-studio:bo@example.org"))
    out = tmp_path / "dataset"
    publish(build / "splits", out=out, quality=card_quality)
    quality = (out / "README.md").read_text(encoding="utf-8").split("## Quality", 1)[1].split("\n## ", 1)[0]
    assert "2 reviewers labelled 24 of the" in quality
    assert "queries in Label Studio (imported by `personaemp review --import-label-studio`) (a" in quality
    assert "review page" not in quality

    label_sample(build, reviewers=("ana",))
    publish(build / "splits", out=out, quality=card_quality)
    quality = (out / "README.md").read_text(encoding="utf-8").split("## Quality", 1)[1]
    assert "3 reviewers labelled" in quality
    assert "on the review page (`personaemp review`) and in Label Studio" in quality


def test_a_card_without_labels_says_none_exist(build, tmp_path):
    out = tmp_path / "dataset"
    publish(build / "splits", out=out, quality=card_quality)
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "## Quality\n\nNo human labels exist for this build" in card
    assert not (out / "figures" / "agreement.png").exists()


# --- figures that hold -------------------------------------------------------------------------


def test_the_figures_follow_from_the_seed_alone(build):
    """Two runs with the same --bootstrap-seed give the same intervals whatever the
    interpreter's hash seed (a set's order once fed the resampling)."""
    import subprocess
    import sys

    from conftest import REPO

    label_sample(build, reviewers=("ana", "bo", "cy"))
    code = (
        "import json, sys; from personaemp.review.agreement import compute_agreement; "
        "print(json.dumps(compute_agreement(sys.argv[1], sys.argv[2], resamples=300, seed=4)))"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code, str(build / "queries.jsonl"), str(build / "labels.jsonl")],
            env={"PYTHONPATH": str(REPO), "PYTHONHASHSEED": hashseed}, capture_output=True, text=True,
            check=True,
        ).stdout
        for hashseed in ("1", "2", "3", "4")
    }  # fmt: skip
    assert len(runs) == 1
    assert json.loads(runs.pop())["people_vs_people"]["fields"]["emotional_support"]["kappa_ci"]


def test_agreement_json_prints_the_report(build):
    label_sample(build)
    result = CliRunner().invoke(
        app, ["agreement", "--input", str(build / "queries.jsonl"), "--resamples", "100", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report == json.loads((build / "agreement" / "agreement.json").read_text())
    assert report["judge_vs_people"]["emotional_support"]["pairs"] == 48


def test_labels_about_what_a_query_does_not_have_are_counted_not_scored(tmp_path):
    path = write_jsonl(tmp_path / "queries.jsonl", [queries_row("u1", [(True, True), (False, False)])])
    items = {i["query_id"]: i for i in read_items(path)}
    body = {"reviewer": "ana", "query_id": "u1-q1", "field": "trait:0", "value": "unsupported"}
    good = make_event(body, items)
    forged = [
        {**good, "field": "trait:99", "value": "supported"},  # the user has one trait
        {**good, "field": "check:length_ok", "value": "agree", "judge": True},  # not an LLM check
        {**good, "query_id": "u7-q1", "field": "query", "value": "accept"},  # not in this build
        {**good, "field": "query", "value": "maybe"},  # not a value the page takes
    ]
    write_jsonl(tmp_path / "labels.jsonl", [good, *forged])
    report = compute_agreement(path, tmp_path / "labels.jsonl", resamples=50)
    assert report["traits"]["labelled"] == 1 and report["traits"]["share"] == 0.0  # not "100% of 1"
    assert report["labels"]["not_scored"] == {"unknown_query": 1, "unknown_target": 2, "invalid": 1}
    assert report["acceptance"]["pairs"] == 0 and report["labels"]["queries_labelled"] == 1
