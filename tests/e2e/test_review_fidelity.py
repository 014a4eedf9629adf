"""`personaemp review --fidelity` and `agreement --fidelity`: people take the discriminator's
blinded test in Chromium from the keyboard alone; the page never gets the answer; the labels
file records each pick and whether it was right; agreement reports people's accuracy (Wilson
CI) and kappa between the LLM discriminator and them, with n."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
from browser import Browser, find_chromium
from fake_openai import FakeOpenAI
from test_fidelity import settings_for, user, write_rows
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.fidelity import FidelityOptionsUsed, measure_fidelity
from personaemp.errors import InputError
from personaemp.review.agreement import fidelity_agreement
from personaemp.review.fidelity import kappa, read_fidelity_items
from personaemp.review.page import make_event, open_fidelity_session, read_label_events, review_server

needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="no chromium (apt-get install chromium)")


@pytest.fixture
def fidelity_file(tmp_path):
    users = write_rows(tmp_path / "users.jsonl", [user("u1"), user("u2"), user("u3")])
    output = tmp_path / "fidelity.jsonl"
    with FakeOpenAI() as server:  # its discriminator always answers "A"
        options = FidelityOptionsUsed(variants=("none", "full"), discriminator=True)
        measure_fidelity(users, output, settings_for(server, tmp_path / "work"), options=options)
    return output


def test_pairs_are_blinded_and_a_pick_records_whether_it_was_right(fidelity_file):
    items = read_fidelity_items(fidelity_file)
    assert len(items) == 3 * 3  # per cut: none, full and self
    assert {i["_source"] for i in items} == {"none", "full", "self"}
    real = {row["cut_id"]: row["real"] for row in map(json.loads, fidelity_file.read_text().splitlines())}
    for item in items:  # the real message sits where the answer says
        assert (item["first"] if item["_answer"] == "A" else item["second"]) == real[item["query_id"]]
    assert {i["_answer"] for i in items} == {"A", "B"}  # both orders occur
    session = open_fidelity_session(fidelity_file, fidelity_file.with_name("l.jsonl"), 4, 0)
    item = session.items[0]
    right = make_event({"reviewer": "ana", "item": item["item"], "field": "pick", "value": item["_answer"]},
                       session.by_id)  # fmt: skip
    assert right["correct"] is True and right["source"] == item["_source"]
    with pytest.raises(InputError, match="pick takes A or B"):
        make_event({"reviewer": "ana", "item": item["item"], "field": "pick", "value": "C"}, session.by_id)
    assert kappa([(True, True), (False, False)]) == 1.0 and kappa([]) is None


@needs_chromium
def test_a_reviewer_picks_from_the_keyboard_and_agreement_reports_it(fidelity_file, tmp_path):
    labels = tmp_path / "fidelity_labels.jsonl"
    session = open_fidelity_session(fidelity_file, labels, 3, 0)
    server = review_server(session)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        request = urllib.request.Request(f"{base}/api/items", headers={"X-Review-Token": session.token})
        with urllib.request.urlopen(request, timeout=10) as response:
            sent = json.loads(response.read())["items"]
        assert sent and not any(key.startswith("_") for item in sent for key in item)  # no answer
        answers = [item["_answer"] for item in session.items]
        wrong = {"A": "B", "B": "A"}
        with Browser() as browser:
            page = browser.page(1366, 768)
            page.goto(f"{base}/?token={session.token}")
            page.wait_for("!document.getElementById('login').hidden")
            page.type("ana")  # the name field has the focus: no mouse
            page.key("Enter")
            page.wait_for("document.body.dataset.ready === 'true'")
            assert page.evaluate("document.getElementById('position').textContent") == "1 of 3"
            page.key(answers[0].lower())  # right
            page.key("j")
            page.key(wrong[answers[1]].lower())  # wrong
            page.key("ArrowRight")
            page.key(answers[2].lower())  # right, then cleared and picked again
            page.key(answers[2].lower())
            page.key(answers[2].lower())
            page.wait_for("document.body.dataset.pending === '0'")
            assert page.evaluate("document.getElementById('position').textContent") == "3 of 3"
            page.reload()
            page.wait_for("document.body.dataset.ready === 'true'")  # resumes where it was
            assert page.evaluate("document.getElementById('progress').textContent") == "3 picked"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    events = read_label_events(labels)
    assert [e["value"] for e in events] == [answers[0], wrong[answers[1]], answers[2], None, answers[2]]
    report = fidelity_agreement(fidelity_file, labels)
    assert report["people_accuracy"]["all"]["n"] == 3
    assert report["people_accuracy"]["all"]["share"] == pytest.approx(2 / 3)
    assert report["kappa_llm_people"]["n"] == 3
    result = CliRunner().invoke(
        app,
        ["agreement", "--fidelity", str(fidelity_file), "--labels", str(labels), "-o", str(tmp_path / "agr")],
    )
    assert result.exit_code == 0, result.output
    assert "people picked the real message (all): 0.67" in result.output and "n=3 pairs" in result.output
    assert (tmp_path / "agr" / "fidelity_agreement.json").is_file()
