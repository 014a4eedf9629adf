"""The filter stage: personaemp.dataset.filter.filter_users and select_user."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import (
    EMOTIONAL_TEXT,
    FLAG,
    SAMPLE_KEPT,
    SAMPLE_TASK1,
    SAMPLE_USERS,
    files_in,
    memory_item,
    raw_record,
    read_jsonl,
    session,
    simple_task1,
    task1_input,
    task1_reference,
    write_jsonl,
    write_task1,
)
from rich.console import Console

from personaemp.dataset.filter import GATES, filter_users, select_user
from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy
from personaemp.records import User
from personaemp.rules import RuleSet, load_rules
from personaemp.sources import read_users

TECHNICAL = [("Technical and Professional Intent", "Coding Help")]
PERSONAL = [("Personal Advice and Guidance", "Relationship Advice")]
CHINESE = [session("s1", "我和我的姐姐又吵架了，我觉得很难过，不知道该怎么办。", "我理解。")]


def run(tmp_path, source, **kwargs):
    output = tmp_path / "out" / "filtered.jsonl"
    report = filter_users(str(source), output, **kwargs).report
    return report, output


def write_rules(tmp_path, text):
    path = tmp_path / "rules.toml"
    path.write_text(text, encoding="utf-8")
    return path


def raw_users(tmp_path, records):
    return write_jsonl(tmp_path / "export" / "users.jsonl", records)


# --- the shipped sample ----------------------------------------------------------------------


@pytest.fixture
def sample_run(tmp_path, sample_task1):
    report, output = run(tmp_path, sample_task1, report_path=tmp_path / "out" / "report.json")
    return report, output, read_jsonl(output)


def test_sample_funnel(sample_run):
    report, _, rows = sample_run
    assert report.users_in == SAMPLE_USERS
    assert report.kept == SAMPLE_KEPT
    assert report.balanced()
    assert report.users_in == report.kept + sum(report.dropped.values())
    assert set(report.dropped) == set(GATES)
    assert report.bad_rows_skipped == 0
    assert report.users_without_intents == SAMPLE_USERS  # task1 rows carry no intents
    assert report.dropped["intents"] == 0
    assert len(rows) == SAMPLE_KEPT


def test_sample_output_rows(sample_run, sample_task1):
    _, output, rows = sample_run
    assert output.read_bytes().count(b"\n") == SAMPLE_KEPT
    input_ids = [r["benchmark_id"] for r in read_jsonl(sample_task1 / "model_input.jsonl")]
    ids = [row["source"]["benchmark_id"] for row in rows]
    assert ids == [i for i in input_ids if i in set(ids)]  # input order, no duplicates
    for row in rows:
        User.model_validate(row)
        memory_ids = [m["memory_id"] for m in row["memories"]]
        assert row["filter"]["matched_rules"]
        assert row["filter"]["matched_memory_ids"]
        assert set(row["filter"]["matched_memory_ids"]) <= set(memory_ids)
        assert all(rule.startswith(("label:", "unmapped:")) for rule in row["filter"]["matched_rules"])
        assert all("[ERROR:" not in m["value"] for m in row["memories"])
        assert row["turns"] and all(t["role"] == "user" for t in row["turns"])
        assert row["language"]


def test_sample_flagged_memories_counted(sample_run, sample_task1):
    report, _, rows = sample_run
    references = read_jsonl(sample_task1 / "reference_output.jsonl")
    items = [m for r in references for m in r["gold"]["memory_items"]]
    flagged = sum("[ERROR:" in m["value"] for m in items)
    assert flagged == 20
    assert report.flagged_memories_dropped == flagged
    assert report.memories_in == len(items)
    assert sum(row["filter"]["flagged_memories_dropped"] for row in rows) <= flagged


def test_sample_kept_rows_keep_every_unflagged_memory_and_user_turn(sample_run, sample_task1):
    _, _, rows = sample_run
    references = {r["benchmark_id"]: r for r in read_jsonl(sample_task1 / "reference_output.jsonl")}
    inputs = {r["benchmark_id"]: r for r in read_jsonl(sample_task1 / "model_input.jsonl")}
    for row in rows:
        benchmark_id = row["source"]["benchmark_id"]
        items = references[benchmark_id]["gold"]["memory_items"]
        unflagged = [m["memory_id"] for m in items if "[ERROR:" not in m["value"]]
        assert [m["memory_id"] for m in row["memories"]] == unflagged
        assert row["filter"]["flagged_memories_dropped"] == len(items) - len(unflagged)
        user_turns = [
            t["text"]
            for s in inputs[benchmark_id]["input"]["sessions"]
            for t in s["turns"]
            if t["role"] == "user"
        ]
        assert [t["text"] for t in row["turns"]] == user_turns


def test_sample_report_file(sample_run, tmp_path):
    report, _, _ = sample_run
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["users_in"] == SAMPLE_USERS
    assert written["kept"] == SAMPLE_KEPT
    assert written["dropped"] == report.dropped
    assert written["flagged_memories_dropped"] == 20
    assert sum(written["languages_kept"].values()) == SAMPLE_KEPT
    assert sum(written["top_labels_kept"].values()) <= sum(written["top_labels_all"].values())
    assert written["matched_rules"] == report.matched_rules


def test_sample_keep_all_turns(tmp_path, sample_task1):
    _, output = run(tmp_path, sample_task1, keep_turns="all")
    rows = read_jsonl(output)
    inputs = {r["benchmark_id"]: r for r in read_jsonl(sample_task1 / "model_input.jsonl")}
    assert len(rows) == SAMPLE_KEPT
    roles = {t["role"] for row in rows for t in row["turns"]}
    assert roles == {"user", "assistant"}
    for row in rows:
        sessions = inputs[row["source"]["benchmark_id"]]["input"]["sessions"]
        assert [(t["role"], t["text"]) for t in row["turns"]] == [
            (t["role"], t["text"]) for s in sessions for t in s["turns"]
        ]


def test_sample_runs_are_byte_identical(tmp_path, sample_task1):
    first = tmp_path / "a" / "filtered.jsonl"
    second = tmp_path / "b" / "filtered.jsonl"
    filter_users(str(sample_task1), first, report_path=tmp_path / "a" / "report.json")
    filter_users(str(sample_task1), second, report_path=tmp_path / "b" / "report.json")
    assert first.read_bytes() == second.read_bytes()
    one = json.loads((tmp_path / "a" / "report.json").read_text())
    two = json.loads((tmp_path / "b" / "report.json").read_text())
    assert {k: v for k, v in one.items() if k != "output"} == {k: v for k, v in two.items() if k != "output"}


def test_unknown_keep_turns(tmp_path, sample_task1):
    with pytest.raises(InputError, match="--turns must be 'user' or 'all'"):
        run(tmp_path, sample_task1, keep_turns="assistant")
    assert not (tmp_path / "out").exists() or files_in(tmp_path / "out") == []


# --- gates on small raw exports -------------------------------------------------------------


def test_intent_gate(tmp_path):
    path = raw_users(
        tmp_path,
        [
            raw_record("technical", intents=TECHNICAL),
            raw_record("personal", intents=PERSONAL),
            raw_record("no_intents"),
            raw_record("mixed", intents=TECHNICAL + [("Emotional Support", None)]),
        ],
    )
    report, output = run(tmp_path, path)
    rows = {row["user_id"]: row for row in read_jsonl(output)}
    assert list(rows) == ["personal", "no_intents", "mixed"]
    assert report.dropped["intents"] == 1
    assert report.users_without_intents == 1
    assert rows["personal"]["filter"]["matched_rules"] == [
        "intent:personal advice",
        "label:Social_Relationships",
    ]
    assert rows["mixed"]["filter"]["matched_rules"][0] == "intent:emotional support"
    assert rows["no_intents"]["filter"]["matched_rules"] == ["label:Social_Relationships"]
    assert rows["personal"]["intents"] == [
        {"category": "Personal Advice and Guidance", "subtype": "Relationship Advice"}
    ]


def test_language_allowlist(tmp_path):
    path = raw_users(
        tmp_path,
        [
            raw_record("english", language="English"),
            raw_record("chinese", language="Chinese"),
            raw_record("detected_chinese", sessions=CHINESE),
            raw_record("detected_english"),
        ],
    )
    rules = write_rules(tmp_path, '[language]\nallow = ["en"]\n')
    report, output = run(tmp_path, path, rules_path=rules)
    assert [row["user_id"] for row in read_jsonl(output)] == ["english", "detected_english"]
    assert report.dropped["language"] == 2
    assert report.languages_kept == {"en": 2}

    report, output = run(tmp_path, path)  # default rules: every language
    assert report.kept == 4
    assert report.languages_kept == {"en": 2, "zh": 2}


def test_min_memories_counts_only_unflagged_memories(tmp_path):
    three = [memory_item("m1"), memory_item("m2", "Preferences/Food", "Likes tea"), memory_item("m3")]
    two_and_flagged = [memory_item("m1"), memory_item("m2"), memory_item("m3", value="Has a cat" + FLAG)]
    path = raw_users(
        tmp_path,
        [
            raw_record("three", memory_items=three),
            raw_record("two_plus_flagged", memory_items=two_and_flagged),
            raw_record("one", memory_items=[memory_item("m1")]),
        ],
    )
    rules = write_rules(tmp_path, "[memories]\nmin_memories = 3\n")
    report, output = run(tmp_path, path, rules_path=rules)
    assert [row["user_id"] for row in read_jsonl(output)] == ["three"]
    assert report.dropped["min_memories"] == 2
    assert report.flagged_memories_dropped == 1


def test_min_matched_memories(tmp_path):
    one_match = [memory_item("m1"), memory_item("m2", "Preferences/Food", "Likes tea")]
    two_matches = [memory_item("m1"), memory_item("m2", "Thoughts/Opinions", "Values honesty")]
    path = raw_users(
        tmp_path, [raw_record("one", memory_items=one_match), raw_record("two", memory_items=two_matches)]
    )
    rules = write_rules(tmp_path, "[memories]\nmin_matched_memories = 2\n")
    report, output = run(tmp_path, path, rules_path=rules)
    [row] = read_jsonl(output)
    assert row["user_id"] == "two"
    assert row["filter"]["matched_memory_ids"] == ["m1", "m2"]
    assert row["filter"]["matched_rules"] == ["label:Social_Relationships", "label:Thoughts/Opinions"]
    assert report.dropped["memory_labels"] == 1


def test_user_whose_only_emotional_memory_is_flagged_is_dropped(tmp_path):
    items = [
        memory_item("m1", "Social_Relationships/Family", "Fights with their sister" + FLAG),
        memory_item("m2", "Preferences/Food", "Likes green tea"),
    ]
    path = raw_users(tmp_path, [raw_record("flagged_only", memory_items=items), raw_record("ok")])
    report, output = run(tmp_path, path)
    assert [row["user_id"] for row in read_jsonl(output)] == ["ok"]
    assert report.dropped["memory_labels"] == 1
    assert report.flagged_memories_dropped == 1


def test_user_with_only_a_flagged_memory_fails_min_memories(tmp_path):
    items = [memory_item("m1", value="Fights with their sister" + FLAG)]
    path = raw_users(tmp_path, [raw_record("flagged_only", memory_items=items)])
    report, output = run(tmp_path, path)
    assert output.read_bytes() == b""
    assert report.dropped["min_memories"] == 1


def test_unmapped_memory_kept_on_its_suggestion(tmp_path):
    items = [
        memory_item(
            "m1", "UNMAPPED", "Competes with a coworker", label_suggestion="workplace/conflict/rivalry"
        ),
        memory_item(
            "m2", "UNMAPPED", "Prefers short answers", label_suggestion="interaction/style/preference"
        ),
    ]
    path = raw_users(tmp_path, [raw_record("u1", memory_items=items)])
    _, output = run(tmp_path, path)
    [row] = read_jsonl(output)
    assert row["filter"]["matched_rules"] == ["unmapped:conflict*"]
    assert row["filter"]["matched_memory_ids"] == ["m1"]
    assert [m["memory_id"] for m in row["memories"]] == ["m1", "m2"]


def test_gates_are_counted_under_the_first_failed_gate(tmp_path):
    path = raw_users(
        tmp_path,
        [
            # fails intents, min_memories (none unflagged) and language: counted under intents
            raw_record(
                "a",
                intents=TECHNICAL,
                language="Chinese",
                memory_items=[memory_item("m1", value="x" + FLAG)],
            ),
            # passes intents, fails min_memories and language
            raw_record("b", intents=PERSONAL, language="Chinese", memory_items=[]),
            # passes min_memories, fails memory labels and language
            raw_record(
                "c", language="Chinese", memory_items=[memory_item("m1", "Preferences/Food", "Likes tea")]
            ),
            # fails only language
            raw_record("d", language="Chinese"),
            raw_record("e", language="English"),
        ],
    )
    rules = write_rules(tmp_path, '[language]\nallow = ["en"]\n')
    report, output = run(tmp_path, path, rules_path=rules)
    assert report.dropped == {"intents": 1, "min_memories": 1, "memory_labels": 1, "language": 1}
    assert report.kept == 1
    assert report.balanced()


def test_select_user_decisions(tmp_path):
    path = raw_users(
        tmp_path,
        [
            raw_record(
                "kept",
                intents=PERSONAL,
                memory_items=[memory_item("m1"), memory_item("m2", value="x" + FLAG)],
            ),
            raw_record("technical", intents=TECHNICAL),
        ],
    )
    rules = RuleSet(load_rules())
    kept, technical = read_users(str(path), ErrorPolicy())
    decision = select_user(kept, rules)
    assert decision.gate is None
    assert decision.flagged == 1
    assert [m.memory_id for m in decision.memories] == ["m1"]
    assert decision.match.matched_memory_ids == ["m1"]
    assert decision.match.matched_rules == ["intent:personal advice", "label:Social_Relationships"]
    assert decision.match.flagged_memories_dropped == 1

    decision = select_user(technical, rules)
    assert decision.gate == "intents"
    assert decision.match is None


# --- errors and atomic output ---------------------------------------------------------------


def _broken_sample(sample_copy, line=30):
    path = sample_copy / "model_input.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines.insert(line - 1, '{"benchmark_id": "broken", "input": \n')  # an extra, broken line
    path.write_text("".join(lines), encoding="utf-8")
    return path


def test_failing_run_writes_nothing(tmp_path, sample_copy):
    broken = _broken_sample(sample_copy)
    out = tmp_path / "out"
    with pytest.raises(RowError) as caught:
        filter_users(str(sample_copy), out / "filtered.jsonl", report_path=out / "report.json")
    assert str(caught.value).startswith(f"{broken}:30: not valid JSON")
    assert files_in(out) == []


def test_failing_run_keeps_the_previous_output(tmp_path, sample_copy):
    _broken_sample(sample_copy)
    out = tmp_path / "out"
    out.mkdir()
    output = out / "filtered.jsonl"
    output.write_bytes(b'{"sentinel": true}\n')
    (out / "report.json").write_text("old report")
    with pytest.raises(RowError):
        filter_users(str(sample_copy), output, report_path=out / "report.json")
    assert output.read_bytes() == b'{"sentinel": true}\n'
    assert (out / "report.json").read_text() == "old report"
    assert files_in(out) == ["filtered.jsonl", "report.json"]  # no manifest entry either


def test_failing_run_on_unmatched_reference_writes_nothing(tmp_path):
    """The unmatched reference row is found only after every input row was read."""
    folder = write_task1(
        tmp_path / "task1",
        [task1_input("b__1"), task1_input("b__2")],
        [task1_reference("b__1"), task1_reference("b__2"), task1_reference("lonely__1")],
    )
    out = tmp_path / "out"
    with pytest.raises(RowError, match=r"reference_output\.jsonl:3: no row for 'lonely__1'"):
        filter_users(str(folder), out / "filtered.jsonl")
    assert files_in(out) == []


def test_skip_run_counts_bad_rows(tmp_path, sample_copy):
    broken = _broken_sample(sample_copy)
    report, output = run(tmp_path, sample_copy, on_error="skip")
    assert report.bad_rows_skipped == 1
    assert report.skipped_rows[0].startswith(f"{broken}:30: not valid JSON")
    assert report.users_in == SAMPLE_USERS
    assert report.kept == SAMPLE_KEPT
    assert report.balanced()
    assert len(read_jsonl(output)) == SAMPLE_KEPT


def test_bad_turns_of_a_user_fail_or_are_skipped(tmp_path):
    bad = task1_input("bad__1", sessions=[{"session_id": "s1", "turns": [{"role": "user", "text": 5}]}])
    folder = write_task1(
        tmp_path / "task1",
        [task1_input("good__1"), bad, task1_input("good__2")],
        [task1_reference(i) for i in ("good__1", "bad__1", "good__2")],
    )
    with pytest.raises(RowError) as caught:
        filter_users(str(folder), tmp_path / "out" / "filtered.jsonl")
    assert str(caught.value).startswith(f"{folder / 'model_input.jsonl'}:2: a turn needs a string")
    assert files_in(tmp_path / "out") == []

    report, output = run(tmp_path, folder, on_error="skip")
    assert [row["user_id"] for row in read_jsonl(output)] == ["good__1", "good__2"]
    assert report.bad_rows_skipped == 1
    assert report.users_in == 2
    assert report.balanced()


def test_missing_input_writes_nothing(tmp_path):
    with pytest.raises(InputError, match="no such file or folder"):
        run(tmp_path, tmp_path / "nothing")
    assert not (tmp_path / "out" / "filtered.jsonl").exists()


def test_report_not_written_without_report_path(tmp_path):
    folder = simple_task1(tmp_path / "task1", ["b__1"])
    report, output = run(tmp_path, folder)
    assert report.kept == 1
    assert files_in(output.parent) == ["filtered.jsonl", "manifest.json"]


def test_empty_input_is_refused_and_keeps_the_previous_output(tmp_path):
    """An empty input used to exit 0 and replace the previous output with an empty file."""
    folder = write_task1(tmp_path / "task1", [], [])
    output = tmp_path / "out" / "filtered.jsonl"
    output.parent.mkdir()
    output.write_bytes(b'{"sentinel": true}\n')
    with pytest.raises(InputError, match="no users to read"):
        run(tmp_path, folder, report_path=tmp_path / "out" / "report.json")
    assert output.read_bytes() == b'{"sentinel": true}\n'
    assert files_in(output.parent) == ["filtered.jsonl"]


def test_filter_users_takes_paths_or_strings_for_both_ends(tmp_path):
    """Before: a Path source failed in detect_format and a str output failed at the lock."""
    by_path = filter_users(SAMPLE_TASK1, str(tmp_path / "a.jsonl"), console=Console(quiet=True)).report
    by_str = filter_users(str(SAMPLE_TASK1), tmp_path / "b.jsonl", console=Console(quiet=True)).report
    assert by_path.kept == by_str.kept == SAMPLE_KEPT
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_the_same_turns_are_decided_once_and_other_turns_get_their_own_language(tmp_path, monkeypatch):
    """A history seen again (a copied session, a replicated input) is not read again; one word
    more, or the same words split into other turns, is another history."""
    import personaemp.sources.normalize as normalize

    calls = []  # one per history decided (the filter decides its kept users a batch at a time)
    real = normalize.user_languages
    monkeypatch.setattr(normalize, "user_languages", lambda users: calls.extend(users) or real(users))
    monkeypatch.setattr(normalize, "_LANGUAGES", {})
    split = [
        session("s1", "我和我的姐姐又吵架了，", "嗯。"),
        session("s2", "我觉得很难过，不知道该怎么办。", "我理解。"),
    ]
    path = raw_users(
        tmp_path,
        [
            raw_record("first", sessions=CHINESE),
            raw_record("copy", sessions=CHINESE),
            raw_record("english"),
            raw_record("split", sessions=split),
        ],
    )
    report, output = run(tmp_path, path)
    assert report.kept == 4
    assert {row["user_id"]: row["language"] for row in read_jsonl(output)} == {
        "first": "zh", "copy": "zh", "english": "en", "split": "zh",
    }  # fmt: skip
    assert len(calls) == 3, "the copy's language came from the first user's"


def sample_output(folder: Path) -> tuple[bytes, dict]:
    """The sample filtered into `folder`: the output's bytes and the report (its path left out)."""
    filter_users(str(SAMPLE_TASK1), folder / "filtered.jsonl", report_path=folder / "report.json")
    report = json.loads((folder / "report.json").read_text())
    report.pop("output")
    return (folder / "filtered.jsonl").read_bytes(), report


def test_kept_users_decided_a_batch_at_a_time_are_written_as_one_by_one(tmp_path, monkeypatch):
    """Languages are decided LANGUAGE_BATCH kept users at a time: the same bytes, in the same
    order, whatever the batch size (2: many batches and a partial one at the end; 1: each
    user alone)."""
    import personaemp.dataset.filter as stage

    outputs = []
    for size in (1, 2, 1000):
        monkeypatch.setattr(stage, "LANGUAGE_BATCH", size)
        outputs.append(sample_output(tmp_path / str(size)))
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[0][1]["kept"] == SAMPLE_KEPT > 2


def language_workers() -> list[int]:
    """This process's descendants running the language worker (Linux /proc)."""
    import os

    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes()
            parent = int((cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"serve_languages" in command and parent == os.getpid():
            found.append(int(cmdline.parent.name))
    return found


def counted_workers(monkeypatch) -> list:
    """The language workers the filter starts from now on, in a list."""
    import personaemp.dataset.filter as stage
    from personaemp.language import LanguageWorker

    started = []

    class Counted(LanguageWorker):
        def __init__(self):
            super().__init__()
            started.append(self)

        @staticmethod
        def worth_it() -> bool:
            return True  # one core too: the test is of the worker, not of the machine

    monkeypatch.setattr(stage, "LanguageWorker", Counted)
    return started


def test_a_big_input_has_its_languages_decided_in_a_second_process(tmp_path, monkeypatch):
    """Past WORKER_AFTER kept users the languages go to a worker process while the reading
    goes on: the same bytes as in-process, batches back in order, no worker left after.
    Without the history cache, every user is the worker's (as on an input of distinct users)."""
    import personaemp.dataset.filter as stage
    import personaemp.sources.normalize as normalize

    started = counted_workers(monkeypatch)
    monkeypatch.setattr(normalize, "LANGUAGE_CACHE", 0)
    monkeypatch.setattr(stage, "LANGUAGE_BATCH", 3)  # many batches, several in flight, a partial last
    outputs = []
    for after in (10**9, 2):  # never a worker; a worker from the third kept user on
        monkeypatch.setattr(stage, "WORKER_AFTER", after)
        outputs.append(sample_output(tmp_path / str(after)))
    assert len(started) == 1 and started[0]._process.returncode == 0
    assert outputs[0] == outputs[1] and outputs[0][1]["kept"] == SAMPLE_KEPT > 6
    assert language_workers() == []


def test_a_stopped_filter_stops_its_language_worker(tmp_path, monkeypatch):
    """A bad row met after the worker started stops the filter: the worker goes with it and
    nothing is written."""
    import personaemp.dataset.filter as stage

    started = counted_workers(monkeypatch)
    monkeypatch.setattr(stage, "LANGUAGE_BATCH", 1)
    monkeypatch.setattr(stage, "WORKER_AFTER", 1)
    ids = [f"u{n}__{n}" for n in range(6)]
    folder = simple_task1(tmp_path / "task1", ids)
    path = folder / "model_input.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[4] = b"{not json\n"
    path.write_bytes(b"".join(lines))
    with pytest.raises(RowError, match="model_input.jsonl:5"):
        filter_users(str(folder), tmp_path / "out" / "filtered.jsonl")
    assert not (tmp_path / "out" / "filtered.jsonl").exists()
    assert len(started) == 1 and started[0]._process.returncode is not None
    assert language_workers() == []


def test_a_bad_turn_of_a_waiting_user_is_skipped_in_its_place(tmp_path):
    """A kept user waits for its batch's languages, but its turns are read at once: its bad
    byte is counted before the next row's error, and the users around it are written."""
    ids = ["a__1", "b__2", "c__3", "d__4"]
    folder = simple_task1(tmp_path / "task1", ids)
    path = folder / "model_input.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    marker = EMOTIONAL_TEXT.encode()
    lines[1] = lines[1].replace(marker, marker[:10] + b"\xff" + marker[10:], 1)
    lines[2] = b"{not json\n"
    path.write_bytes(b"".join(lines))
    report, output = run(tmp_path, folder, on_error="skip")
    assert [row["user_id"] for row in read_jsonl(output)] == ["a__1", "d__4"]
    places = [row.split(": ", 1)[0] for row in report.skipped_rows]
    assert places[:2] == [f"{path}:2", f"{path}:3"]  # then c__3's unjoined reference row
    assert "dialogue text is not valid UTF-8" in report.skipped_rows[0]
    with pytest.raises(RowError, match=r"model_input\.jsonl:2: dialogue text is not valid UTF-8"):
        run(tmp_path, folder)
