"""`personaemp review`: the sample, the labels file, the page's server and the page itself
in a real headless Chromium (tests/browser.py)."""

from __future__ import annotations

import contextlib
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

# serve_forever checks for shutdown() every poll_interval (0.5 s by default): each test's
# server took half a second to stop (test_review: 12.8 s -> 6.3 s of worker time in make test)
QUICK_STOP = {"poll_interval": 0.05}

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
    thread = threading.Thread(target=server.serve_forever, kwargs=QUICK_STOP, daemon=True)
    thread.start()
    TOKEN["now"] = session.token
    yield session, f"http://127.0.0.1:{server.server_address[1]}"
    TOKEN.pop("now", None)
    server.shutdown()
    server.server_close()
    thread.join()


TOKEN: dict[str, str] = {}  # the served session's token, set by the fixture


def get(url: str, headers: dict | None = None) -> tuple[int, bytes, str]:
    request = urllib.request.Request(url, headers={"X-Review-Token": TOKEN.get("now", ""), **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers["Content-Type"]


def post(url: str, body, headers: dict | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", "X-Review-Token": TOKEN.get("now", ""), **(headers or {})}
    request = urllib.request.Request(url, data=data, headers={k: v for k, v in sent.items() if v is not None})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_page_and_its_assets_come_from_the_package_and_name_no_other_host(served):
    _, base = served
    for path, kind in (
        ("/", "text/html"),
        ("/review.js", "text/javascript"),
        ("/dialogue.js", "text/javascript"),
        ("/review.css", "text/css"),
    ):
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
        url, token = re.search(r"open (http://127\.0\.0\.1:\d+/)\?token=([\w-]+) ", lines[1]).groups()
        assert get(url + "api/items")[0] == 403  # the address without its token reads nothing
        assert len(json.loads(get(url + "api/items", {"X-Review-Token": token})[1])["items"]) == 5
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
@pytest.mark.requires_browser
def test_a_reviewer_labels_with_keys_and_mouse_reloads_and_resumes(served, tmp_path):
    session, base = served
    items = session.items
    path = tmp_path / "labels.jsonl"
    settled = "document.body.dataset.ready === 'true'"
    with Browser() as browser:
        page = browser.page(1366, 768)
        page.goto(f"{base}/?token={session.token}")
        page.wait_for("!document.getElementById('login').hidden")  # no name yet: asked for one
        page.click("#login-name")
        page.type("ana")
        page.click("#login-form button")
        page.wait_for("document.body.dataset.ready === 'true'")
        assert page.evaluate("document.getElementById('position').textContent") == f"1 of {len(items)}"
        # a laptop screen: two columns, query and checks side by side, nothing wider than the window
        tops = page.evaluate(
            "[...document.querySelectorAll('#main .panel')].map(p => p.getBoundingClientRect().top)"
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
        page.goto(f"{base}/?token={session.token}")
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
@pytest.mark.requires_browser
def test_two_reviewers_label_the_same_sample_apart(served, tmp_path):
    session, base = served
    with Browser() as browser:
        for name, key in (("ana", "a"), ("bo", "r")):
            page = browser.page(2560, 1440)
            page.goto(f"{base}/?token={session.token}&reviewer={name}")
            page.wait_for("document.body.dataset.ready === 'true'")
            page.key(key)
            page.wait_for("document.body.dataset.pending === '0'")
            # wide screen: the four panels side by side
            tops = page.evaluate(
                "[...document.querySelectorAll('#main .panel')].map(p => p.getBoundingClientRect().top)"
            )
            assert len(set(tops)) == 1, tops
    state = current_labels(read_label_events(tmp_path / "labels.jsonl"))
    first = session.items[0]["query_id"]
    assert state["ana"][first]["query"]["value"] == "accept"
    assert state["bo"][first]["query"]["value"] == "reject"


# --- attacks: only the page's own requests, bounded bodies, no click lost -------------------------


def raw(base: str, head: str, body: bytes = b"") -> tuple[int, dict]:
    """One request written by hand (headers a browser or urllib would not send), its answer."""
    import socket

    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer:
                length = int(re.search(rb"Content-Length: (\d+)", answer).group(1))
                if len(answer.split(b"\r\n\r\n", 1)[1]) >= length:
                    break
    status = int(answer.split()[1])
    return status, json.loads(answer.split(b"\r\n\r\n", 1)[1])


def a_label(session, **changes) -> dict:
    return {"reviewer": "ana", "query_id": session.items[0]["query_id"], "field": "query", "value": "accept",
            **changes}  # fmt: skip


def test_a_cross_origin_simple_post_is_refused_and_writes_nothing(served, tmp_path):
    """What a page on another site can send from the reviewer's browser without asking: a
    text/plain POST with its own Origin, without the session's token."""
    session, base = served
    body = json.dumps(a_label(session)).encode()
    forged = {"Content-Type": "text/plain", "Origin": "http://attacker.example", "X-Review-Token": None}
    assert post(base + "/api/label", body, forged)[0] == 403
    # each guard alone refuses: another Origin, text/plain, no token, a wrong token
    assert post(base + "/api/label", body, {"Origin": "http://attacker.example"})[0] == 403
    assert post(base + "/api/label", body, {"Sec-Fetch-Site": "cross-site"})[0] == 403
    assert post(base + "/api/label", body, {"Content-Type": "text/plain"})[0] == 415
    assert post(base + "/api/label", body, {"X-Review-Token": None})[0] == 403
    status, answer = post(base + "/api/label", body, {"X-Review-Token": "guess"})
    assert status == 403 and "token" in answer["error"]
    assert not (tmp_path / "labels.jsonl").exists()
    # the page's own request: same origin, JSON, the token
    assert post(base + "/api/label", body, {"Origin": base})[0] == 200
    assert len(read_jsonl(tmp_path / "labels.jsonl")) == 1


def test_a_foreign_host_reads_nothing_even_with_the_token(served, tmp_path):
    """DNS rebinding: the attacker's name resolving to 127.0.0.1 brings its own Host header."""
    session, base = served
    rebound = {"Host": "rebind.attacker.example:" + base.rsplit(":", 1)[1]}
    for path in ("/api/items", "/api/labels?reviewer=ana", "/"):
        status, body, _ = get(base + path, rebound)
        assert status == 403 and b"memories" not in body, path
    assert post(base + "/api/label", a_label(session), rebound)[0] == 403
    assert not (tmp_path / "labels.jsonl").exists()
    # without the token, the page's own address gives the page but no data
    assert get(base + "/", {"X-Review-Token": ""})[0] == 200
    assert get(base + "/api/items", {"X-Review-Token": ""})[0] == 403
    localhost = {"Host": "localhost:" + base.rsplit(":", 1)[1]}
    assert get(base + "/api/items", localhost)[0] == 200


def test_the_hosts_answered_are_the_address_served():
    from personaemp.review.page import served_hosts

    assert served_hosts("127.0.0.1", 8765) == {"127.0.0.1:8765", "localhost:8765", "[::1]:8765"}
    assert served_hosts("10.1.2.3", 80) == {"10.1.2.3:80", "10.1.2.3"}
    assert served_hosts("0.0.0.0", 8765) is None  # any name reaches it: the token decides


@pytest.mark.requires_browser
def test_cli_review_beyond_loopback_says_so_in_one_line(sample_build, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-m", "personaemp", "review", "--input", str(sample_build / "queries.jsonl"),
         "--labels", str(tmp_path / "labels.jsonl"), "--port", "0", "--host", "0.0.0.0"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        lines = [process.stderr.readline() for _ in range(3)]
        assert lines[1].startswith("warning: serving on 0.0.0.0, beyond this machine") and "token" in lines[1]
        url, token = re.search(r"open (http://0\.0\.0\.0:\d+/)\?token=([\w-]+) ", lines[2]).groups()
        url = url.replace("0.0.0.0", "127.0.0.1")
        assert get(url + "api/items", {"X-Review-Token": ""})[0] == 403
        assert get(url + "api/items", {"X-Review-Token": token})[0] == 200
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=20)


def test_bodies_are_bounded_in_size_and_nesting(served, tmp_path):
    session, base = served
    port = base.rsplit(":", 1)[1]
    head = (f"POST /api/label HTTP/1.1\nHost: 127.0.0.1:{port}\nContent-Type: application/json\n"
            f"X-Review-Token: {session.token}\n")  # fmt: skip
    # announced sizes: refused before a byte of the body is read
    assert raw(base, head + "Content-Length: 200000000\n")[0] == 413
    assert raw(base, head + "Content-Length: 1e12\n")[0] == 400
    assert raw(base, head + "Content-Length: -5\n")[0] == 400
    assert raw(base, head)[0] == 411
    deep = b"[" * 100_000 + b"]" * 100_000
    assert raw(base, head + f"Content-Length: {len(deep)}\n", deep)[0] == 413
    nested = b"[" * 20_000 + b"]" * 20_000  # within the size limit, deeper than a parser goes
    status, answer = raw(base, head + f"Content-Length: {len(nested)}\n", nested)
    assert status == 400 and "nested" in answer["error"]
    shaped = json.dumps(a_label(session, reviewer={"name": "ana"})).encode()
    assert raw(base, head + f"Content-Length: {len(shaped)}\n", shaped)[0] == 400
    assert not (tmp_path / "labels.jsonl").exists()
    assert get(base + "/api/items")[0] == 200  # and the server goes on


@pytest.mark.parametrize("name", ["ana\x1b[2J", "bo\nfake line", "cy\x07", "dee\u202eevil", "\x00"])
def test_a_reviewer_name_is_printable_text(served, tmp_path, name):
    session, base = served
    status, answer = post(base + "/api/label", a_label(session, reviewer=name))
    assert status == 400 and "printable" in answer["error"]
    assert not (tmp_path / "labels.jsonl").exists()


def test_names_already_in_the_file_are_shown_escaped_at_start(sample_build, tmp_path):
    from rich.console import Console

    from personaemp.review.page import from_options

    labels = tmp_path / "labels.jsonl"
    labels.write_text(json.dumps({"reviewer": "eve\x1b]0;owned\x07", "query_id": "x", "field": "query",
                                  "value": "accept"}) + "\n")  # fmt: skip
    console = Console(file=(out := __import__("io").StringIO()), force_terminal=False, width=400)

    class Options:
        input, size, seed, host, port = sample_build / "queries.jsonl", 3, 0, "127.0.0.1", 0

    Options.labels = labels
    with pytest.MonkeyPatch.context() as patch:
        from http.server import ThreadingHTTPServer

        patch.setattr(
            ThreadingHTTPServer, "serve_forever", lambda self: (_ for _ in ()).throw(KeyboardInterrupt)
        )
        from_options(Options, console)
    shown = out.getvalue()
    assert "\x1b" not in shown and "\x07" not in shown
    assert r"'eve\x1b]0;owned\x07'" in shown


def test_a_click_after_a_torn_line_is_a_line_of_its_own(served, tmp_path, capsys):
    """The last line cut by a crash (power loss, full disk): the next click must not land on
    its end, or the file is broken for the page, agreement and every later click."""
    session, base = served
    path = tmp_path / "labels.jsonl"
    whole = json.dumps(make_event(a_label(session), session.by_id, "t"))
    path.write_text(whole + "\n" + whole[:25])
    status, answer = post(base + "/api/label", a_label(session, value="reject"))
    assert status == 200
    assert path.read_text().endswith("\n") and len(path.read_text().splitlines()) == 2
    assert [e["value"] for e in read_label_events(path)] == ["accept", "reject"]
    assert json.loads(get(base + "/api/labels?reviewer=ana")[1])["labels"] == {
        session.items[0]["query_id"]: {"query": "reject"}
    }
    assert "its last line was cut off in the middle (25 bytes" in capsys.readouterr().err
    from personaemp.review.agreement import compute_agreement

    assert compute_agreement(Path(session.source), path, resamples=20)["acceptance"]["pairs"] == 1


def test_a_click_on_a_full_disk_is_not_reported_saved(sample_build, tmp_path):
    from test_hostile import mount

    disk = mount(tmp_path / "small", "size=64k")
    try:
        session = open_session(sample_build / "queries.jsonl", disk / "labels.jsonl", 4, 0)
        server = review_server(session)
        thread = threading.Thread(target=server.serve_forever, kwargs=QUICK_STOP, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{server.server_address[1]}"
        TOKEN["now"] = session.token
        filler = disk / "filler"
        with filler.open("wb", buffering=0) as handle, contextlib.suppress(OSError):
            while True:  # the whole disk
                handle.write(b"x" * 4096)
        status, answer = post(base + "/api/label", a_label(session))
        assert status == 503 and answer["error"].startswith("not saved: No space left")
        filler.unlink()
        assert post(base + "/api/label", a_label(session, value="reject"))[0] == 200
        assert [e["value"] for e in read_label_events(disk / "labels.jsonl")] == ["reject"]
        server.shutdown()
        server.server_close()
    finally:
        TOKEN.pop("now", None)
        subprocess.run(["umount", "-l", str(disk)], check=False)
