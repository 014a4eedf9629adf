"""`personaemp review --dialogues` and `agreement --dialogues`: the items, the label events, the
page in a real headless Chromium (keyboard only), and the three agreement figures of a labelled
fixture (tests/dialogue_fixture.py) worked out by hand."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
from browser import Browser, find_chromium
from conftest import read_jsonl
from dialogue_fixture import FINAL, RATING, agreement_args, write_dialogues, write_labels
from test_review import QUICK_STOP
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.errors import InputError
from personaemp.review.agreement import compute_dialogue_agreement, kappa_of, spearman, wilson
from personaemp.review.dialogues import read_dialogue_items
from personaemp.review.page import (
    UnknownTarget,
    current_labels,
    make_event,
    open_dialogue_session,
    read_label_events,
    review_server,
)


@pytest.fixture
def dialogues(tmp_path) -> list[Path]:
    return write_dialogues(tmp_path / "runs")


# --- the items and the events ------------------------------------------------------------------


def test_an_item_is_one_supporters_dialogue_with_the_others_of_its_query_beside_it(dialogues):
    items = {item["item"]: item for item in read_dialogue_items(dialogues)}
    assert len(items) == 12
    item = items["policy-a/u3-q1-d1"]
    assert item["beside"] == ["policy-b/u3-q1-d1"] and item["system"] == "policy-a"
    assert item["labelled_turns"] == [2, 4, 6]  # the simulated turns, not the opening query
    # a rejected reply: its text and thought apart from the rules it failed; an old row has rules only
    first = items["policy-a/u1-q1-d1"]["turns"][4]["rejected"][0]
    assert first["text"] == "I'm at 6/10 now." and set(first["failed"]) == {"no_emotion_number"}
    old = item["turns"][2]["rejected"][0]
    assert old["text"] is None and old["failed"] == {"in_character": "speaks like an assistant"}


def test_a_dialogue_label_keeps_the_check_it_is_set_against(dialogues):
    items = {item["item"]: item for item in read_dialogue_items(dialogues)}

    def event(key, field, value):
        return make_event({"reviewer": "ana", "item": key, "field": field, "value": value}, items, "t")

    out = event("policy-a/u2-q1-d1", "character:2", "out")
    assert out["check"] is True and out["query_id"] == "u2-q1" and out["system"] == "policy-a"
    # the reply rejected at that turn (the check failed it), offered blind: its verdict False
    rejected = event("policy-a/u2-q1-d1", "character:2.0", "out")
    assert rejected["check"] is False and rejected["kept"] is False
    # one rejected for a rule: the check never ran on it
    assert "check" not in event("policy-a/u1-q1-d1", "character:4.0", "in")
    with pytest.raises(UnknownTarget, match="no rejected reply the page offers"):
        event("policy-a/u2-q1-d1", "character:4.0", "in")
    # a turn whose in_character check did not run: no verdict recorded, never a pass
    assert "check" not in event("policy-b/u5-q1-d1", "character:2", "in")
    assert event("policy-a/u2-q1-d1", "perm:reception", 5)["value"] == 5
    with pytest.raises(UnknownTarget, match="turn '0' is not one the simulated user wrote"):
        event("policy-a/u2-q1-d1", "realism:0", "realistic")
    with pytest.raises(UnknownTarget):
        event("policy-a/u2-q1-d1", "character:3", "in")  # a supporter turn
    for field, value, message in (
        ("perm:reception", 6, "takes 1 to 5"),
        ("perm:reception", True, "takes 1 to 5"),
        ("perm:warmth", 3, "unknown PERM dimension 'warmth'"),
        ("realism:2", "yes", "takes realistic or unrealistic"),
        ("query", "accept", "unknown field 'query'"),
    ):
        with pytest.raises(InputError, match=re.escape(message)):
            event("policy-a/u2-q1-d1", field, value)
    with pytest.raises(InputError, match="no dialogue 'policy-c/u2-q1-d1'"):
        event("policy-c/u2-q1-d1", "note", "x")


# --- the figures -------------------------------------------------------------------------------


def test_the_three_figures_of_the_labelled_fixture(dialogues, tmp_path):
    labels = write_labels(dialogues, tmp_path / "labels.jsonl")
    report = compute_dialogue_agreement(dialogues, labels, resamples=500, seed=1)

    a = report["in_character"]
    # (check, person) pairs: ana on 11 checked dialogues x 3 kept turns (the check passed every
    # kept turn; she says out on one) and the 3 rejected replies the check failed (out), bo on
    # policy-a q1's 3 turns (in) and q2's rejected reply (out)
    assert a["confusion"] == [35, 1, 0, 4] and a["pairs"] == 40 and a["dialogues"] == 11
    assert (a["turns"], a["reviewers"], a["rejected_replies"]) == (36, 2, 3)  # n: replies, not pairs
    # policy-b q5 (--no-character-check) and the 4 replies rejected for a rule: never checked
    assert a["labelled_not_checked"] == 7
    assert a["kappa"] == round(kappa_of([35, 1, 0, 4]), 4) == 0.875
    assert a["kappa_ci"][0] <= a["kappa"] <= a["kappa_ci"][1]

    from scipy.stats import spearmanr

    finals = FINAL["policy-a"] + FINAL["policy-b"]
    ratings = RATING["policy-a"] + RATING["policy-b"]
    b = report["emotion_vs_people"]
    assert b["n"] == 12 and b["rho"] == round(spearmanr(finals, ratings).statistic, 4)
    assert b["rho_ci"][0] <= b["rho"] <= b["rho_ci"][1]

    c = report["ranking"]
    assert (c["pairs"], c["agree"], c["ties"]) == (5, 4, 1)  # q2 disagrees, q4 a tie
    assert c["share"] == 0.8 and c["share_ci"] == wilson(4, 5)
    assert c["by_final_emotion"] == c["by_people"] == ["policy-a", "policy-b"] and c["same"]
    assert c["queries"] == 6 and c["mean_final_emotion"] == {"policy-a": 60.0, "policy-b": 42.5}


def test_kappa_against_a_constant_check_is_not_measurable(dialogues, tmp_path):
    """Issue 63: every kept turn passed in_character (a failing reply is asked again), so over
    kept turns alone the check is constant and kappa was 0.00 [0.00, 0.00] whatever people said.
    Without the rejected replies labelled it is not measured, and the line says why."""
    from personaemp.review.agreement import dialogue_agreement_lines

    items = {item["item"]: item for item in read_dialogue_items(dialogues)}
    labels = LabelFileFor(tmp_path / "labels.jsonl")
    for key, item in items.items():
        for n, turn in enumerate(item["labelled_turns"]):
            value = "out" if n == 1 else "in"  # people vary; the check does not
            labels.add({"reviewer": "ana", "item": key, "field": f"character:{turn}", "value": value}, items)
    report = compute_dialogue_agreement(dialogues, tmp_path / "labels.jsonl", resamples=100, seed=1)
    a = report["in_character"]
    assert a["confusion"][2:] == [0, 0] and a["kappa"] is None and a["kappa_ci"] is None
    assert "the check said in character on all 33 labels" in a["not_measurable"]
    line = dialogue_agreement_lines(report)[0]
    assert "κ not measurable: the check said in character on all 33 labels" in line
    assert "label rejected replies too" in line and "κ 0.00" not in line


class LabelFileFor:
    def __init__(self, path: Path):
        from personaemp.review.page import LabelFile

        self.file = LabelFile(path)

    def add(self, body: dict, items: dict) -> None:
        self.file.append(make_event(body, items, "t"))


def test_spearman_of_a_worked_example():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert spearman([1, 2, 3], [5, 5, 5]) is None  # a constant side
    assert spearman([1, 2], [1, 2]) is None


def test_cli_agreement_prints_the_three_figures(dialogues, tmp_path):
    labels = write_labels(dialogues, dialogues[0].with_name("dialogue_labels.jsonl"))
    args = agreement_args(dialogues, 200)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert re.search(
        r"people vs the in_character check: κ 0\.88 \[[\d.]+, [\d.]+\].*n=36 replies of 11 dialogues "
        r"\(3 of them rejected\), 2 reviewers, 40 labels",
        out,
    )
    assert re.search(r"Spearman ρ 0\.\d\d \[[\d.]+, [\d.]+\], n=12 dialogues", out)
    assert (
        "supporter pairs ordered alike by final emotion and by people: 80.0% [37.5%, 96.4%], n=5 pairs" in out
    )
    written = json.loads((dialogues[0].with_name("agreement") / "dialogue_agreement.json").read_text())
    assert written["labels"]["events"] == len(read_jsonl(labels))
    # no labels: one line, exit 2
    labels.unlink()
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "dialogue_labels.jsonl: no labels" in result.stderr


def test_the_page_says_where_the_labels_go(dialogues):
    """Issue 63: the help said the labels go to the build's folder; dialogue labels go beside
    the first dialogues file. The page is told the file, and the help shows it."""
    from importlib import resources
    from urllib.request import Request, urlopen

    from personaemp.review.options import ReviewOptions
    from personaemp.review.page import review_labels

    labels = review_labels(ReviewOptions(dialogues=[str(p) for p in dialogues]))
    assert labels == dialogues[0].with_name("dialogue_labels.jsonl")
    session = open_dialogue_session(dialogues, labels, 6, 0)
    server = review_server(session)
    thread = threading.Thread(target=server.serve_forever, kwargs=QUICK_STOP, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/api/items"
        with urlopen(Request(url, headers={"X-Review-Token": session.token})) as answer:
            assert json.loads(answer.read())["labels"] == str(labels)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    page = resources.files("personaemp").joinpath("assets", "review", "index.html").read_text()
    assert "build's folder" not in page and 'class="labels-file"' in page


# --- in a real browser -------------------------------------------------------------------------

needs_chromium = pytest.mark.skipif(
    find_chromium() is None, reason="no chromium (make test installs it: apt-get install chromium)"
)


@pytest.fixture
def served(dialogues, tmp_path):
    session = open_dialogue_session(dialogues, tmp_path / "labels.jsonl", 6, 0)
    server = review_server(session)
    thread = threading.Thread(target=server.serve_forever, kwargs=QUICK_STOP, daemon=True)
    thread.start()
    yield session, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@needs_chromium
@pytest.mark.requires_browser
def test_a_reviewer_labels_a_dialogue_with_the_keyboard_alone(served, tmp_path):
    session, base = served
    first = session.items[0]
    path = tmp_path / "labels.jsonl"
    settled = "document.body.dataset.pending === '0'"
    with Browser() as browser:
        page = browser.page(1366, 900)
        page.goto(f"{base}/?token={session.token}")
        page.wait_for("!document.getElementById('login').hidden")
        page.type("ana")  # the name field has the focus
        page.key("Enter")
        page.wait_for("document.body.dataset.ready === 'true'")
        assert page.evaluate("document.body.dataset.mode") == "dialogue"
        # the help names the labels file the labels go to (it said "the build's folder")
        assert page.evaluate("document.querySelector('#help .labels-file').textContent") == str(path)
        # the dialogue and the other supporter's of the same query side by side, nothing wider
        # than the window; the emotion drawn as a line for each
        left = page.evaluate("document.getElementById('dialogue-panel').getBoundingClientRect().right")
        right = page.evaluate("document.getElementById('beside-panel').getBoundingClientRect().left")
        assert right > left
        assert page.evaluate("document.documentElement.scrollWidth") <= 1366
        assert page.evaluate("document.querySelectorAll('#d-chart polyline').length") == 2
        assert (
            page.evaluate("document.querySelector('#d-beside .beside-dialogue').dataset.item")
            == first["beside"][0]
        )

        # three simulated turns: realistic, in character (c moves on); the last one out of
        # character and not like them; then the supporter 4, 3, 5 on the PERM dimensions
        page.key("r")
        page.key("c")
        page.key("r")
        page.key("c")
        page.key("r", shift=True)
        page.key("c", shift=True)
        for digit in "435":
            page.key(digit)
        page.key("n")
        page.type("the user warms up too fast")
        page.key("Escape")
        page.wait_for(settled)
        assert page.evaluate("document.getElementById('progress').textContent") == "1 fully labelled"
        page.key("b")  # the other supporter's dialogue of this query
        assert page.evaluate("document.body.dataset.index") == "1"
        page.key("k")
        page.reload()
        page.wait_for("document.body.dataset.ready === 'true'")
        pressed = page.evaluate(
            "[...document.querySelectorAll('#dialogue-main [aria-pressed=true]:not(#d-blind *)')]"
            ".map(b => b.dataset.field + '=' + b.dataset.value)"
        )
        turns = first["labelled_turns"]
        # the blind check: every kept reply and the rejected ones with text, unmarked; a kept
        # reply's label is the turn's
        blind = page.evaluate("[...document.querySelectorAll('#d-blind .probe')].map(p => p.dataset.target)")
        assert sorted(blind) == sorted(p["target"] for p in first["probes"])
        assert page.evaluate("document.querySelectorAll('#d-blind .fail-why, #d-blind .chip').length") == 0
        blind_pressed = page.evaluate(
            "[...document.querySelectorAll('#d-blind [aria-pressed=true]')].map(b => b.dataset.field)"
        )
        assert sorted(blind_pressed) == sorted(f"character:{n}" for n in turns)
        assert sorted(pressed) == sorted([
            f"realism:{turns[0]}=realistic", f"character:{turns[0]}=in", f"realism:{turns[1]}=realistic",
            f"character:{turns[1]}=in", f"realism:{turns[2]}=unrealistic", f"character:{turns[2]}=out",
            "perm:resonation=4", "perm:expression=3", "perm:reception=5",
        ])  # fmt: skip
        # a dialogue whose in_character check did not run says so, never "pass"
        unchecked = next(n for n, item in enumerate(session.items) if item["item"] == "policy-b/u5-q1-d1")
        page.evaluate(f"go({unchecked})")
        chips = page.evaluate(
            "[...document.querySelectorAll('#d-turns .chip[data-check=in_character]')]"
            ".map(c => c.textContent)"
        )
        assert chips == ["in_character: not checked"] * 3
        # replies asked again: beside the turn only the rules they broke; their text is in the
        # blind check, unmarked among the kept replies (issue 63)
        with_rejected = next(n for n, item in enumerate(session.items) if item["item"] == "policy-a/u1-q1-d1")
        page.evaluate(f"go({with_rejected})")
        page.evaluate("document.querySelectorAll('details.rejected').forEach(d => d.open = true)")
        beside_turn = page.evaluate("document.querySelector('details.rejected').textContent")
        assert "no_emotion_number" in beside_turn and "I'm at 6/10 now." not in beside_turn
        assert "I'm at 6/10 now." in page.evaluate("document.getElementById('d-blind').textContent")
        page.screenshot(tmp_path / "dialogue.png")
    assert (tmp_path / "dialogue.png").read_bytes().startswith(b"\x89PNG")

    state = current_labels(read_label_events(path))["ana"][first["item"]]
    assert {field: e["value"] for field, e in state.items()} == {
        f"realism:{turns[0]}": "realistic", f"character:{turns[0]}": "in",
        f"realism:{turns[1]}": "realistic", f"character:{turns[1]}": "in",
        f"realism:{turns[2]}": "unrealistic", f"character:{turns[2]}": "out",
        "perm:resonation": 4, "perm:expression": 3, "perm:reception": 5, "note": "the user warms up too fast",
    }  # fmt: skip
    # what the browser saved is what the figures are made of
    report = compute_dialogue_agreement([Path(p) for p in session.source.split(", ")], path, resamples=200)
    assert report["in_character"]["pairs"] + report["in_character"]["labelled_not_checked"] == 3
    assert report["emotion_vs_people"]["n"] == 1


# --- Label Studio ------------------------------------------------------------------------------


def test_label_studio_gets_the_same_dialogue_tasks_and_labels_back(dialogues, tmp_path):
    """Export the dialogue sample as a project; an export of it with one annotator's work,
    imported, gives the labels the page would have written, and the same figures."""
    import xml.etree.ElementTree as ElementTree

    from personaemp.review.label_studio import CONFIG_FILE, TASKS_FILE

    folder = tmp_path / "ls"
    args = ["review", "--dialogues", str(dialogues[0]), "--dialogues", str(dialogues[1]), "--size", "2"]
    result = CliRunner().invoke(app, [*args, "--export-label-studio", str(folder)])
    assert result.exit_code == 0, result.output
    tasks = json.loads((folder / TASKS_FILE).read_text())
    session = open_dialogue_session(dialogues, tmp_path / "unused.jsonl", 2, 0)
    assert [t["data"]["item"] for t in tasks] == [i["item"] for i in session.items]  # the page's sample
    config = ElementTree.fromstring((folder / CONFIG_FILE).read_text())
    names = [c.get("name") for c in config.iter("Choices")]
    assert names == ["realism_2", "character_2", "realism_4", "character_4", "realism_6", "character_6",
                     "perm_resonation", "perm_expression", "perm_reception"]  # fmt: skip
    variables = {t.get("value")[1:] for t in config.iter("Text")}
    assert all(variables <= set(t["data"]) for t in tasks)
    first = tasks[0]["data"]
    assert "in_character" in first["turn_2_text"] and first["realism_2_choices"] == [
        {"value": "realistic"}, {"value": "unrealistic"},
    ]  # fmt: skip

    def choice(name, value):
        return {"from_name": name, "to_name": "dialogue", "type": "choices", "value": {"choices": [value]}}

    results = [choice("realism_2", "realistic"), choice("character_2", "out"), choice("perm_resonation", "4"),
               choice("perm_expression", "2"), choice("perm_reception", "3"),
               {"from_name": "note", "to_name": "dialogue", "type": "textarea",
                "value": {"text": ["flat"]}}]  # fmt: skip
    exported = [{"id": 11, "data": tasks[0]["data"], "annotations": [
        {"id": 7, "completed_by": {"id": 3, "email": "ana@example.org"}, "result": results,
         "updated_at": "2026-11-28T10:00:00Z", "was_cancelled": False}]}]  # fmt: skip
    export_file = tmp_path / "export.json"
    export_file.write_text(json.dumps(exported))
    labels = tmp_path / "labels.jsonl"
    result = CliRunner().invoke(
        app, [*args, "--labels", str(labels), "--import-label-studio", str(export_file)]
    )
    assert result.exit_code == 0, result.output
    key = first["item"]
    state = current_labels(read_label_events(labels))["label-studio:3"][key]
    assert {f: e["value"] for f, e in state.items()} == {
        "realism:2": "realistic", "character:2": "out", "perm:resonation": 4, "perm:expression": 2,
        "perm:reception": 3, "note": "flat",
    }  # fmt: skip
    assert state["character:2"]["check"] == next(i for i in session.items if i["item"] == key)["turns"][2][
        "checks"
    ].get("in_character")
    report = compute_dialogue_agreement(dialogues, labels, resamples=200)
    assert report["labels"]["label_studio_reviewers"] == 1 and report["emotion_vs_people"]["n"] == 1
    assert report["in_character"]["pairs"] == 1


def test_the_docs_show_what_agreement_prints_on_the_fixture(dialogues, tmp_path):
    from conftest import REPO

    from personaemp.review.agreement import dialogue_agreement_lines

    labels = write_labels(dialogues, tmp_path / "labels.jsonl")
    lines = dialogue_agreement_lines(compute_dialogue_agreement(dialogues, labels))  # the CLI's defaults
    docs = (REPO / "docs" / "commands" / "agreement.md").read_text(encoding="utf-8")
    shown = docs.split("a test of the arithmetic, not a measurement of the simulator):\n\n```text\n")[1]
    assert shown.split("\n```")[0].splitlines() == lines
