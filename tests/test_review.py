"""`personaemp review`: the sample, the labels file, the page's server and the page itself
in a real headless Chromium (tests/browser.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from browser import Browser, find_chromium
from conftest import REPO, read_jsonl

from personaemp.errors import InputError
from personaemp.review.page import (
    LLM_CHECKS,
    LabelFile,
    current_labels,
    make_event,
    open_session,
    read_items,
    read_label_events,
    review_server,
    sample_items,
    stratum,
)

# --- the sample --------------------------------------------------------------------------------


def test_items_are_every_generated_query_with_its_user(sample_build):
    items = read_items(sample_build / "queries.jsonl")
    rows = read_jsonl(sample_build / "queries.jsonl")
    assert len(items) == sum(len(r["queries"]) + len(r["rejected_queries"]) for r in rows)
    assert Counter(i["accepted"] for i in items) == {
        True: sum(len(r["queries"]) for r in rows),
        False: sum(len(r["rejected_queries"]) for r in rows),
    }
    item = items[0]
    assert item["memories"] and item["traits"] and set(item["big_five"]) >= {"openness", "neuroticism"}
    assert set(LLM_CHECKS) <= set(item["checks"])


def test_the_sample_takes_every_stratum_before_repeating_one(sample_build):
    items = read_items(sample_build / "queries.jsonl")
    strata = {stratum(i) for i in items}
    assert len(strata) >= 4  # categories x languages x outcomes of the sample build
    picked = sample_items(items, len(strata), seed=3)
    assert {stratum(i) for i in picked} == strata  # one of each, however rare
    assert any(not i["accepted"] for i in picked)


def test_the_sample_is_fixed_by_its_seed_and_size(sample_build):
    items = read_items(sample_build / "queries.jsonl")
    ids = lambda picked: [i["query_id"] for i in picked]  # noqa: E731
    assert ids(sample_items(items, 12, 1)) == ids(sample_items(list(reversed(items)), 12, 1))
    assert ids(sample_items(items, 12, 1)) != ids(sample_items(items, 12, 2))
    assert len(sample_items(items, 10_000, 1)) == len(items)
    assert len(set(ids(sample_items(items, 10_000, 1)))) == len(items)


def test_a_file_that_is_not_queries_is_one_line_naming_it(tmp_path):
    path = tmp_path / "personas.jsonl"
    path.write_text('{"user_id": "u1", "traits": []}\n')
    with pytest.raises(InputError, match=r"personas.jsonl:1: not a gen-queries row"):
        read_items(path)
    with pytest.raises(InputError, match="no such file"):
        read_items(tmp_path / "missing.jsonl")


# --- labels ------------------------------------------------------------------------------------

ITEM = {
    "query_id": "u1-q1", "user_id": "u1", "traits": [{"statement": "Worries a lot"}],
    "checks": {"emotional_support": True, "role_awareness": False, "length_ok": True},
}  # fmt: skip
ITEMS = {"u1-q1": ITEM}


def event(field: str, value, reviewer: str = "ana") -> dict:
    return make_event({"reviewer": reviewer, "query_id": "u1-q1", "field": field, "value": value}, ITEMS, "t")


def test_an_event_records_the_judges_verdict_and_the_traits_statement():
    assert event("check:role_awareness", "disagree") == {
        "reviewer": "ana", "query_id": "u1-q1", "user_id": "u1", "field": "check:role_awareness",
        "judge": False, "value": "disagree", "at": "t",
    }  # fmt: skip
    assert event("trait:0", "supported")["trait"] == "Worries a lot"
    assert event("query", "reject")["value"] == "reject"
    assert event("note", "too long")["value"] == "too long"
    assert event("query", None)["value"] is None  # clears


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("query", "maybe", "query takes accept or reject"),
        ("check:length_ok", "agree", "not an LLM check"),
        ("check:logical_consistency", "agree", "not an LLM check of this query"),
        ("trait:1", "supported", "no trait '1'"),
        ("trait:x", "supported", "no trait 'x'"),
        ("colour", "red", "unknown field 'colour'"),
        ("query:1", "accept", "unknown field"),
        ("note", 5, "a note is text"),
    ],
)
def test_a_bad_event_is_refused(field, value, message):
    with pytest.raises(InputError, match=re.escape(message)):
        event(field, value)


def test_an_event_needs_a_reviewer_and_a_query_of_the_sample():
    with pytest.raises(InputError, match="reviewer name"):
        make_event({"reviewer": " ", "query_id": "u1-q1", "field": "query", "value": "accept"}, ITEMS)
    with pytest.raises(InputError, match="no query 'u9-q1' in this sample"):
        make_event({"reviewer": "ana", "query_id": "u9-q1", "field": "query", "value": "accept"}, ITEMS)


def test_the_last_event_wins_per_reviewer_and_field_and_none_clears(tmp_path):
    labels = LabelFile(tmp_path / "labels.jsonl")
    for item in (
        event("query", "accept"), event("query", "reject"), event("query", "accept", "bo"),
        event("note", "hm"), event("note", None), event("trait:0", "supported"),
    ):  # fmt: skip
        labels.append(item)
    state = current_labels(labels.events())
    assert {f: e["value"] for f, e in state["ana"]["u1-q1"].items()} == {
        "query": "reject",
        "trait:0": "supported",
    }
    assert state["bo"]["u1-q1"]["query"]["value"] == "accept"
    assert len(read_jsonl(tmp_path / "labels.jsonl")) == 6  # append-only: nothing rewritten


def test_a_line_cut_by_a_crash_is_left_out_and_a_bad_line_inside_names_itself(tmp_path):
    path = tmp_path / "labels.jsonl"
    whole = json.dumps(event("query", "accept"))
    path.write_text(whole + "\n" + whole[:30])  # the writer died in the middle of a line
    assert len(read_label_events(path)) == 1
    path.write_text(whole[:30] + "\n" + whole + "\n")
    with pytest.raises(InputError, match=r"labels.jsonl:1: not valid JSON"):
        read_label_events(path)
    path.write_text('{"reviewer": "ana"}\n')
    with pytest.raises(InputError, match=r"labels.jsonl:1: not a label event"):
        read_label_events(path)


# --- the server --------------------------------------------------------------------------------


@pytest.fixture
def served(sample_build, tmp_path):
    session = open_session(sample_build / "queries.jsonl", tmp_path / "labels.jsonl", 8, 0)
    server = review_server(session)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield session, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers["Content-Type"]


def post(url: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_page_and_its_assets_come_from_the_package_and_name_no_other_host(served):
    _, base = served
    for path, kind in (("/", "text/html"), ("/review.js", "text/javascript"), ("/review.css", "text/css")):
        status, body, content_type = get(base + path)
        assert status == 200 and content_type.startswith(kind), path
        # nothing fetched from the internet: no absolute URL in what the page loads
        assert not re.search(rb"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", body), path
    assert get(base + "/nothing")[0] == 404


def test_a_posted_label_is_in_the_file_before_the_answer(served, tmp_path):
    session, base = served
    first = session.items[0]
    status, answer = post(base + "/api/label", {"reviewer": "ana", "query_id": first["query_id"],
                                                "field": "query", "value": "reject"})  # fmt: skip
    assert status == 200 and answer["saved"]["value"] == "reject"
    assert read_jsonl(tmp_path / "labels.jsonl")[-1]["field"] == "query"
    status, answer = post(base + "/api/label", {"reviewer": "ana", "query_id": "nope", "field": "query"})
    assert status == 400 and "no query 'nope'" in answer["error"]
    assert post(base + "/api/label", b"{not json")[0] == 400
    assert len(read_jsonl(tmp_path / "labels.jsonl")) == 1  # refused labels are not written

    _, body, _ = get(base + "/api/labels?reviewer=ana")
    assert json.loads(body) == {"reviewer": "ana", "labels": {first["query_id"]: {"query": "reject"}},
                                "reviewers": ["ana"]}  # fmt: skip
    assert json.loads(get(base + "/api/labels?reviewer=bo")[1])["labels"] == {}
    items = json.loads(get(base + "/api/items")[1])["items"]
    assert [i["query_id"] for i in items] == [i["query_id"] for i in session.items]


def test_cli_review_serves_until_interrupted(sample_build, tmp_path):
    labels = tmp_path / "labels.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-m", "personaemp", "review", "--input", str(sample_build / "queries.jsonl"),
         "--labels", str(labels), "--port", "0", "--size", "5"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        lines = [process.stderr.readline(), process.stderr.readline()]
        assert lines[0].startswith("review: 5 queries of "), lines
        url = re.search(r"open (http://127\.0\.0\.1:\d+/)", lines[1]).group(1)
        assert len(json.loads(get(url + "api/items")[1])["items"]) == 5
    finally:
        process.send_signal(signal.SIGINT)
        rest = process.communicate(timeout=20)[1]
    assert process.returncode == 0
    assert f"stopped; labels are in {labels}" in rest


def test_cli_review_without_queries_exits_2_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from personaemp.cli import app

    result = CliRunner().invoke(app, ["review", "--input", str(tmp_path / "none.jsonl")])
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0 and "none.jsonl: no such file" in result.stderr


# --- in a real browser -------------------------------------------------------------------------

needs_chromium = pytest.mark.skipif(
    find_chromium() is None, reason="no chromium (make test installs it: apt-get install chromium)"
)


def labelled(path: Path) -> dict[str, dict[str, str]]:
    """query_id -> field -> value, the reviewer ana's current labels read from the file."""
    state = current_labels(read_label_events(path)).get("ana", {})
    return {query: {field: e["value"] for field, e in fields.items()} for query, fields in state.items()}


@needs_chromium
@pytest.mark.slow
def test_a_reviewer_labels_with_keys_and_mouse_reloads_and_resumes(served, tmp_path):
    session, base = served
    items = session.items
    path = tmp_path / "labels.jsonl"
    settled = "document.body.dataset.ready === 'true'"
    with Browser() as browser:
        page = browser.page(1366, 768)
        page.goto(base + "/")
        page.wait_for("!document.getElementById('login').hidden")  # no name yet: asked for one
        page.click("#login-name")
        page.type("ana")
        page.click("#login-form button")
        page.wait_for("document.body.dataset.ready === 'true'")
        assert page.evaluate("document.getElementById('position').textContent") == f"1 of {len(items)}"
        # a laptop screen: two columns, query and checks side by side, nothing wider than the window
        tops = page.evaluate(
            "[...document.querySelectorAll('.panel')].map(p => p.getBoundingClientRect().top)"
        )
        assert tops[0] == tops[1] and tops[2] == tops[3] and tops[2] > tops[0], tops
        assert page.evaluate("document.documentElement.scrollWidth") <= 1366

        # item 1, keyboard: accept, agree with check 1, disagree with check 2, first trait supported
        page.key("a")
        page.key("1")
        page.key("2", shift=True)
        page.key("s")
        page.wait_for("document.body.dataset.pending === '0'")
        page.key("j")
        assert page.evaluate("document.getElementById('position').textContent") == f"2 of {len(items)}"

        # item 2, mouse: reject, disagree with the judge's role_awareness, second trait unsupported, a note
        page.click("#reject")
        page.click('tr[data-check="role_awareness"] button[data-value="disagree"]')
        page.click('li[data-trait="1"] button[data-value="unsupported"]')
        page.click("#note")
        page.type("reads like a template")
        page.key("Escape")  # leaves the note: saved
        page.wait_for("document.body.dataset.pending === '0'")
        # a second press of the same choice clears it; then the other one
        page.click("#reject")
        page.click("#accept")
        page.wait_for("document.body.dataset.pending === '0'")
        page.screenshot(tmp_path / "review.png")

        page.reload()
        page.wait_for(settled)
        # a reload stays where the reviewer was (the address says which query), labels restored
        assert page.evaluate("document.getElementById('position').textContent") == f"2 of {len(items)}"
        pressed = page.evaluate(
            "[...document.querySelectorAll('[aria-pressed=true]')]"
            ".map(b => b.dataset.field + '=' + b.dataset.value)"
        )
        assert sorted(pressed) == sorted(
            ["query=accept", "check:role_awareness=disagree", "trait:1=unsupported"]
        )
        assert page.evaluate("document.getElementById('note').value") == "reads like a template"
        # the page opened afresh (name remembered) resumes at the first query not decided: the third
        page.goto(base + "/")
        page.wait_for(settled)
        assert page.evaluate("document.getElementById('reviewer').value") == "ana"
        assert page.evaluate("document.getElementById('position').textContent") == f"3 of {len(items)}"

    first, second = items[0], items[1]
    assert labelled(path) == {
        first["query_id"]: {"query": "accept", "check:emotional_support": "agree",
                            "check:logical_consistency": "disagree", "trait:0": "supported"},
        second["query_id"]: {"query": "accept", "check:role_awareness": "disagree",
                             "trait:1": "unsupported", "note": "reads like a template"},
    }  # fmt: skip
    events = read_label_events(path)
    judged = {e["field"]: e["judge"] for e in events if e["field"].startswith("check:")}
    assert judged["check:emotional_support"] == first["checks"]["emotional_support"]
    assert [e["value"] for e in events if e["query_id"] == second["query_id"] and e["field"] == "query"] == [
        "reject",
        None,
        "accept",
    ]
    assert (tmp_path / "review.png").read_bytes().startswith(b"\x89PNG")

    # what the browser saved is what the agreement figures are made of
    from personaemp.review.agreement import compute_agreement

    report = compute_agreement(Path(session.source), path, resamples=200)
    assert {c: f["pairs"] for c, f in report["judge_vs_people"].items()} == {
        "emotional_support": 1, "logical_consistency": 1, "role_awareness": 1, "category_match": 0,
    }  # fmt: skip
    assert report["traits"]["labelled"] == 2 and report["acceptance"]["pairs"] == 2


@needs_chromium
@pytest.mark.slow
def test_two_reviewers_label_the_same_sample_apart(served, tmp_path):
    session, base = served
    with Browser() as browser:
        for name, key in (("ana", "a"), ("bo", "r")):
            page = browser.page(2560, 1440)
            page.goto(f"{base}/?reviewer={name}")
            page.wait_for("document.body.dataset.ready === 'true'")
            page.key(key)
            page.wait_for("document.body.dataset.pending === '0'")
            # wide screen: the four panels side by side
            tops = page.evaluate(
                "[...document.querySelectorAll('.panel')].map(p => p.getBoundingClientRect().top)"
            )
            assert len(set(tops)) == 1, tops
    state = current_labels(read_label_events(tmp_path / "labels.jsonl"))
    first = session.items[0]["query_id"]
    assert state["ana"][first]["query"]["value"] == "accept"
    assert state["bo"][first]["query"]["value"] == "reject"
