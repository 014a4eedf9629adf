"""AlpsBench readers (personaemp.sources.read_users): task1 layout, release root, raw export, hf."""

from __future__ import annotations

import shutil

import pytest
from conftest import (
    EMOTIONAL_TEXT,
    SAMPLE_USERS,
    memory_item,
    raw_record,
    read_jsonl,
    session,
    simple_task1,
    task1_input,
    task1_reference,
    turn,
    write_json,
    write_jsonl,
    write_task1,
)

from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy
from personaemp.sources import detect_format, read_users


def read(source, mode="fail", **kwargs):
    """All users of a source, with their turns and language read (turns may be read lazily)."""
    policy = ErrorPolicy(mode)
    users = list(read_users(str(source), policy, **kwargs))
    if mode == "fail":
        for user in users:
            assert isinstance(user.turns, list)
            assert user.language is None or isinstance(user.language, str)
    return users, policy


# --- task1 layout -----------------------------------------------------------------------


def test_task1_joins_on_benchmark_id_whatever_the_reference_order(tmp_path):
    ids = ["sess_a__1", "sess_b__2", "sess_c__3"]
    inputs = [task1_input(i, sessions=[session("s1", f"text of {i}", "ok")], user_id=None) for i in ids]
    references = [task1_reference(i, [memory_item("m1", value=f"memory of {i}")]) for i in reversed(ids)]
    folder = write_task1(tmp_path / "task1", inputs, references)

    users, policy = read(folder)

    assert [u.user_id for u in users] == ids  # input order; user_id falls back to benchmark_id
    for user, benchmark_id in zip(users, ids, strict=True):
        assert user.memories[0].value == f"memory of {benchmark_id}"
        assert user.turns[0].text == f"text of {benchmark_id}"
        assert user.source.format == "task1"
        assert user.source.benchmark_id == benchmark_id
        assert user.source.path == str(folder / "model_input.jsonl")
        assert user.source.line_index == 7
        assert user.intents == []
    assert policy.skipped == []


def test_task1_user_id_kept_when_given(tmp_path):
    folder = write_task1(
        tmp_path, [task1_input("sess_a__1", user_id="alice")], [task1_reference("sess_a__1")]
    )
    users, _ = read(folder)
    assert [u.user_id for u in users] == ["alice"]
    assert users[0].source.benchmark_id == "sess_a__1"


def test_task1_turns_flatten_all_sessions_in_order(tmp_path):
    sessions = [session("s1", "first user", "first reply"), session("s2", "second user", "second reply")]
    folder = write_task1(
        tmp_path,
        [task1_input("b__1", sessions=sessions, dialogue=[turn("user", "IGNORED, sessions win")])],
        [task1_reference("b__1")],
    )
    [user], _ = read(folder)
    assert [(t.session_id, t.index, t.role, t.text) for t in user.turns] == [
        ("s1", 0, "user", "first user"),
        ("s1", 1, "assistant", "first reply"),
        ("s2", 0, "user", "second user"),
        ("s2", 1, "assistant", "second reply"),
    ]


@pytest.mark.parametrize("sessions", [None, []])
def test_task1_turns_fall_back_to_dialogue(tmp_path, sessions):
    dialogue = [turn("user", "hello there, my friend"), turn("assistant", "hi")]
    row = task1_input("b__1", dialogue=dialogue)
    row["input"]["sessions"] = sessions
    folder = write_task1(tmp_path, [row], [task1_reference("b__1")])
    [user], _ = read(folder)
    assert [(t.role, t.text, t.session_id, t.index) for t in user.turns] == [
        ("user", "hello there, my friend", None, 0),
        ("assistant", "hi", None, 1),
    ]


def test_task1_memories_from_gold(tmp_path):
    items = [
        memory_item("mem-7", "Thoughts/Opinions", "Thinks remote work is lonely", confidence=0.8),
        memory_item(
            "mem-2",
            "UNMAPPED",
            "Gets stressed before exams",
            label_suggestion="emotional/stress/exams",
            evidence=["I panic before exams", "I cannot sleep"],
            emotion="anxiety",
        ),
    ]
    folder = write_task1(tmp_path, [task1_input("b__1")], [task1_reference("b__1", items)])
    [user], _ = read(folder)
    assert [m.model_dump() for m in user.memories] == [
        {
            "memory_id": "mem-7",
            "label": "Thoughts/Opinions",
            "label_suggestion": None,
            "value": "Thinks remote work is lonely",
            "evidence_text": "My sister and I argued again",
            "type": "direct",
            "confidence": 0.8,
            "emotion": None,
        },
        {
            "memory_id": "mem-2",
            "label": "UNMAPPED",
            "label_suggestion": "emotional/stress/exams",
            "value": "Gets stressed before exams",
            "evidence_text": "I panic before exams | I cannot sleep",
            "type": "direct",
            "confidence": 0.9,
            "emotion": "anxiety",
        },
    ]


def test_task1_missing_memory_ids_numbered_in_source_order(tmp_path):
    items = [memory_item(None, value="first"), memory_item(None, value="second"), memory_item(None)]
    folder = write_task1(tmp_path, [task1_input("b__1")], [task1_reference("b__1", items)])
    [user], _ = read(folder)
    assert [(m.memory_id, m.value) for m in user.memories][:2] == [("m1", "first"), ("m2", "second")]
    assert [m.memory_id for m in user.memories] == ["m1", "m2", "m3"]


def test_task1_missing_label_becomes_unmapped(tmp_path):
    item = memory_item("m1", label=None, label_suggestion="family/conflict")
    folder = write_task1(tmp_path, [task1_input("b__1")], [task1_reference("b__1", [item])])
    [user], _ = read(folder)
    assert user.memories[0].label == "UNMAPPED"


def test_task1_the_model_input_file_path_itself(tmp_path):
    folder = simple_task1(tmp_path / "task1", ["b__1", "b__2"])
    assert detect_format(str(folder / "model_input.jsonl")) == "task1"
    users, _ = read(folder / "model_input.jsonl")
    assert [u.user_id for u in users] == ["b__1", "b__2"]


def test_task1_shipped_sample_reads_completely(sample_task1):
    users, policy = read(sample_task1)
    references = read_jsonl(sample_task1 / "reference_output.jsonl")
    inputs = read_jsonl(sample_task1 / "model_input.jsonl")
    assert len(users) == SAMPLE_USERS
    assert policy.skipped == []
    assert [u.source.benchmark_id for u in users] == [row["benchmark_id"] for row in inputs]
    assert sum(len(u.memories) for u in users) == sum(len(r["gold"]["memory_items"]) for r in references)
    assert sum(len(u.turns) for u in users) == sum(
        len(s["turns"]) for row in inputs for s in row["input"]["sessions"]
    )
    assert all(u.language for u in users)


# --- release root: benchmark_data/<split>/task1/ -------------------------------------------


def test_release_root_with_one_split_picks_it(tmp_path):
    simple_task1(tmp_path / "release" / "benchmark_data" / "test" / "task1", ["b__1", "b__2"])
    for root in (tmp_path / "release", tmp_path / "release" / "benchmark_data"):
        assert detect_format(str(root)) == "task1"
        users, _ = read(root)
        assert [u.user_id for u in users] == ["b__1", "b__2"]


def test_release_root_with_two_splits(tmp_path):
    data = tmp_path / "release" / "benchmark_data"
    simple_task1(data / "dev" / "task1", ["dev__1"])
    simple_task1(data / "test" / "task1", ["test__1", "test__2"])
    (data / "notes").mkdir()  # a folder without task1 is not a split

    with pytest.raises(InputError) as caught:
        read(tmp_path / "release")
    assert "several splits (dev, test)" in str(caught.value)
    assert "--benchmark-split dev|test" in str(caught.value)

    users, _ = read(tmp_path / "release", split="test")
    assert [u.user_id for u in users] == ["test__1", "test__2"]
    users, _ = read(data, split="dev")
    assert [u.user_id for u in users] == ["dev__1"]

    with pytest.raises(InputError) as caught:
        read(tmp_path / "release", split="train")
    assert "no split 'train'" in str(caught.value)
    assert "dev, test" in str(caught.value)


def test_folder_with_a_task1_subfolder(tmp_path):
    simple_task1(tmp_path / "alps" / "task1", ["b__1"])
    users, _ = read(tmp_path / "alps")
    assert [u.user_id for u in users] == ["b__1"]


# --- raw export -----------------------------------------------------------------------------


def _raw_records():
    return [
        raw_record(
            "u1",
            intents=[("Personal Advice and Guidance", "Relationship Advice")],
            language="English",
            memory_items=[memory_item("m1"), memory_item(None, "Thoughts/Opinions", "Likes honesty")],
        ),
        raw_record("u2", language="zh-CN", intents=[("Technical and Professional Intent", "Coding Help")]),
        raw_record(None, memory_items=[memory_item(None, value="no user id")]),
    ]


def _check_raw_users(users, origin):
    assert [u.user_id for u in users][:2] == ["u1", "u2"]
    u1, u2, u3 = users
    assert u1.language == "en"
    assert u2.language == "zh"
    assert u3.language == "en"  # detected from the user's turns
    assert [(i.category, i.subtype) for i in u1.intents] == [
        ("Personal Advice and Guidance", "Relationship Advice")
    ]
    assert [(i.category, i.subtype) for i in u2.intents] == [
        ("Technical and Professional Intent", "Coding Help")
    ]
    assert u3.intents == []
    assert [m.memory_id for m in u1.memories] == ["m1", "m2"]
    assert [t.role for t in u1.turns] == ["user", "assistant"]
    assert all(u.source.format == "raw" and u.source.path == str(origin) for u in users)
    assert [u.source.line_index for u in users] == [0, 1, 2]


def test_raw_json_data_object(tmp_path):
    path = write_json(tmp_path / "split_part1.json", {"data": _raw_records()})
    assert detect_format(str(path)) == "raw"
    users, _ = read(path)
    _check_raw_users(users, path)
    assert users[2].user_id == "split_part1#2"


def test_raw_json_data_object_with_meta_first(tmp_path):
    path = write_json(
        tmp_path / "export.json", {"meta": {"version": "1.0", "count": 3}, "data": _raw_records()}
    )
    users, _ = read(path)
    _check_raw_users(users, path)


def test_raw_json_plain_list(tmp_path):
    path = write_json(tmp_path / "export.json", _raw_records())
    users, _ = read(path)
    _check_raw_users(users, path)


def test_raw_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "export.jsonl", _raw_records())
    users, _ = read(path, fmt="raw")
    _check_raw_users(users, path)
    assert users[2].user_id == "export#2"


def test_raw_as_written_by_json_dump(tmp_path):
    """The export as json.dump writes it by default (", " between records) must be readable."""
    path = write_json(tmp_path / "split_part1.json", {"data": _raw_records()}, style="default")
    users, _ = read(path)
    _check_raw_users(users, path)


def test_raw_folder_of_split_parts_read_in_name_order(tmp_path):
    folder = tmp_path / "export"
    write_json(folder / "split_part2.json", {"data": [raw_record("u3"), raw_record("u4")]})
    write_json(folder / "split_part1.json", {"data": [raw_record("u1"), raw_record("u2")]})
    (folder / "README.txt").write_text("not data")
    assert detect_format(str(folder)) == "raw"
    users, _ = read(folder)
    assert [u.user_id for u in users] == ["u1", "u2", "u3", "u4"]
    assert [u.source.path for u in users] == [str(folder / "split_part1.json")] * 2 + [
        str(folder / "split_part2.json")
    ] * 2


def test_raw_record_with_a_3mb_turn(tmp_path):
    long_text = "I keep thinking about my father. " * 100_000  # about 3.3 MB
    records = [
        raw_record("u1"),
        raw_record("u2", sessions=[session("s1", long_text, "ok")]),
        raw_record("u3"),
    ]
    path = write_json(tmp_path / "export.json", records)
    users, _ = read(path)
    assert [u.user_id for u in users] == ["u1", "u2", "u3"]
    assert users[1].turns[0].text == long_text


def test_raw_duplicate_user_id(tmp_path):
    path = write_jsonl(tmp_path / "export.jsonl", [raw_record("u1"), raw_record("u2"), raw_record("u1")])
    with pytest.raises(RowError) as caught:
        read(path)
    assert f"{path}:3: duplicate user id 'u1' (first at {path}:1)" in str(caught.value)
    users, policy = read(path, mode="skip")
    assert [u.user_id for u in users] == ["u1", "u2"]
    assert len(policy.skipped) == 1


def test_raw_bad_records_name_file_and_line(tmp_path):
    rows = [
        raw_record("ok1"),
        {"user_id": "nomem", "sessions": []},
        {"user_id": "nosessions", "memory_items": []},
        [1, 2],
        raw_record("badintent", intents_ranked=[{"intent_subtype": "x"}]),
        raw_record("ok2"),
    ]
    path = write_jsonl(tmp_path / "export.jsonl", rows)
    with pytest.raises(RowError, match=r"export\.jsonl:2: missing required field 'memory_items'"):
        read(path)
    users, policy = read(path, mode="skip")
    assert [u.user_id for u in users] == ["ok1", "ok2"]
    assert [entry.split(": ", 1)[0] for entry in policy.skipped] == [f"{path}:{n}" for n in (2, 3, 4, 5)]
    assert "missing required field 'sessions'" in policy.skipped[1]
    assert "expected a JSON object, got list" in policy.skipped[2]
    assert "intent_category" in policy.skipped[3]


def test_raw_empty_jsonl_gives_no_users(tmp_path):
    path = tmp_path / "export.jsonl"
    path.write_text("")
    users, policy = read(path)
    assert users == [] and policy.skipped == []


def test_raw_folder_without_data_files(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(InputError, match="no .json or .jsonl files in this folder"):
        read(tmp_path)


def test_unknown_suffix_cannot_be_detected(tmp_path):
    path = tmp_path / "export.csv"
    path.write_text("a,b\n")
    with pytest.raises(InputError, match=r"export\.csv: cannot tell the format"):
        read(path)


def test_unknown_format_name(tmp_path):
    with pytest.raises(InputError, match="unknown --format 'bogus'"):
        read_users(str(tmp_path), ErrorPolicy(), fmt="bogus")


# --- hf: (datasets.load_dataset, streaming) -----------------------------------------------


def test_hf_local_folder_of_raw_records(tmp_path):
    records = [
        raw_record(
            "u1", intents=[("Personal Advice and Guidance", "Relationship Advice")], language="English"
        ),
        raw_record("u2", intents=[("Technical and Professional Intent", "Coding Help")], language="English"),
    ]
    write_jsonl(tmp_path / "ds" / "train.jsonl", records)
    spec = f"hf:{tmp_path / 'ds'}"
    assert detect_format(spec) == "hf"
    users, policy = read(spec)
    assert [u.user_id for u in users] == ["u1", "u2"]
    assert [i.category for i in users[1].intents] == ["Technical and Professional Intent"]
    assert users[0].language == "en"
    assert [m.memory_id for m in users[0].memories] == ["m1"]
    assert [t.text for t in users[0].turns][1] == "I hear you."
    assert users[0].source.format == "raw" and users[0].source.path == spec
    assert policy.skipped == []


def test_hf_local_folder_of_joined_task1_rows(tmp_path):
    rows = []
    for benchmark_id in ("b__1", "b__2"):
        row = task1_input(benchmark_id)
        row["gold"] = task1_reference(benchmark_id, [memory_item("m1"), memory_item("m2", value="x")])["gold"]
        rows.append(row)
    write_jsonl(tmp_path / "ds" / "train.jsonl", rows)
    users, _ = read(f"hf:{tmp_path / 'ds'}")
    assert [u.user_id for u in users] == ["b__1", "b__2"]
    assert users[0].source.format == "task1"
    assert [m.memory_id for m in users[0].memories] == ["m1", "m2"]
    assert [t.role for t in users[0].turns] == ["user", "assistant"]


def test_hf_bad_row_names_the_row(tmp_path):
    good = raw_record("u1")
    bad = raw_record("u2", memory_items=[memory_item("m1", value=None)])
    write_jsonl(tmp_path / "ds" / "train.jsonl", [good, bad, raw_record("u3")])
    spec = f"hf:{tmp_path / 'ds'}"
    with pytest.raises(RowError, match=r"\[train\] row 1: memory m1: value"):
        read(spec)
    users, policy = read(spec, mode="skip")
    assert [u.user_id for u in users] == ["u1", "u3"]
    assert len(policy.skipped) == 1


def test_hf_unreachable_hub_fails_fast_with_one_line(no_network_hub):
    with pytest.raises(InputError) as caught:
        read("hf:nobody-xyz/nothing")
    message = str(caught.value)
    assert message.startswith("hf:nobody-xyz/nothing: cannot reach the Hugging Face Hub (nonexistent.invalid")
    assert "\n" not in message


def test_hf_needs_an_id():
    with pytest.raises(InputError, match="needs a dataset id"):
        read("hf:")


# --- bad task1 inputs: every error names file:line ------------------------------------------


def test_missing_input_path(tmp_path):
    with pytest.raises(InputError, match="nowhere: no such file or folder"):
        read(tmp_path / "nowhere")
    with pytest.raises(InputError, match="nowhere: no such file or folder"):
        read(tmp_path / "nowhere", fmt="task1")


def test_task1_folder_missing_the_reference_file_says_so(tmp_path):
    """A task1 folder that lost reference_output.jsonl must not be read as a raw export."""
    write_jsonl(tmp_path / "task1" / "model_input.jsonl", [task1_input("b__1")])
    with pytest.raises(InputError) as caught:
        read(tmp_path / "task1")
    assert "reference_output.jsonl" in str(caught.value)


def test_task1_format_given_missing_the_reference_file(tmp_path):
    write_jsonl(tmp_path / "task1" / "model_input.jsonl", [task1_input("b__1")])
    with pytest.raises(InputError, match="has model_input.jsonl but no reference_output.jsonl"):
        read(tmp_path / "task1", fmt="task1")
    with pytest.raises(InputError, match="has model_input.jsonl but no reference_output.jsonl"):
        read(tmp_path / "task1" / "model_input.jsonl")


def test_empty_task1_files_give_no_users(tmp_path):
    folder = write_task1(tmp_path, [], [])
    users, policy = read(folder)
    assert users == [] and policy.skipped == []


def test_empty_input_file_with_references_reports_each_reference(tmp_path):
    folder = write_task1(tmp_path, [], [task1_reference("b__1"), task1_reference("b__2")])
    with pytest.raises(RowError, match=r"reference_output\.jsonl:1: no row for 'b__1' in model_input\.jsonl"):
        read(folder)
    users, policy = read(folder, mode="skip")
    assert users == []
    assert len(policy.skipped) == 2


def _bad_task1_case(tmp_path, case):
    """Two good sessions (good__1, good__2) around one broken thing; returns (folder, where, what)."""
    inputs = [task1_input("good__1"), None, task1_input("good__2")]
    references = [task1_reference("good__1"), task1_reference("good__2")]
    where, what = "model_input.jsonl:2", None
    if case == "invalid_json":
        inputs[1], what = '{"benchmark_id": "bad__1", "input": ', "not valid JSON"
        references.append(task1_reference("bad__1"))
    elif case == "invalid_utf8":
        inputs[1], what = b'{"benchmark_id": "bad\xff__1"}', "not valid UTF-8"
    elif case == "no_benchmark_id":
        row = task1_input("bad__1")
        del row["benchmark_id"]
        inputs[1], what = row, "missing required field 'benchmark_id'"
    elif case == "no_input":
        row = task1_input("bad__1")
        del row["input"]
        inputs[1], what = row, "missing required field 'input'"
        references.append(task1_reference("bad__1"))
    elif case == "no_turns":
        row = task1_input("bad__1", sessions=[])
        inputs[1], what = row, "missing required field"
        references.append(task1_reference("bad__1"))
    elif case == "sessions_not_a_list":
        row = task1_input("bad__1", sessions={"session_id": "s1"})
        inputs[1], what = row, "sessions must be a list, got dict"
        references.append(task1_reference("bad__1"))
    elif case == "input_without_reference":
        inputs[1], what = task1_input("bad__1"), "no row for 'bad__1' in reference_output.jsonl"
    elif case == "duplicate_input":
        inputs[1], what = task1_input("good__1"), "duplicate benchmark_id 'good__1'"
    elif case == "turns_not_a_list":
        row = task1_input("bad__1", sessions=[{"session_id": "s1", "turns": {"role": "user"}}])
        inputs[1], what = row, "turns must be a list, got dict"
        references.append(task1_reference("bad__1"))
    elif case == "turn_without_text":
        row = task1_input("bad__1", sessions=[{"session_id": "s1", "turns": [{"role": "user"}]}])
        inputs[1], what = row, "a turn needs a string 'role' and 'text'"
        references.append(task1_reference("bad__1"))
    elif case == "reference_without_input":
        inputs.pop(1)
        references.insert(1, task1_reference("lonely__1"))
        where, what = "reference_output.jsonl:2", "no row for 'lonely__1' in model_input.jsonl"
    elif case == "duplicate_reference":
        inputs.pop(1)
        references.insert(1, task1_reference("good__1"))
        where, what = "reference_output.jsonl:2", "duplicate benchmark_id 'good__1' (first at line 1)"
    elif case == "reference_invalid_json":
        inputs.pop(1)
        references.insert(1, "{oops")
        where, what = "reference_output.jsonl:2", "not valid JSON"
    elif case == "reference_no_gold":
        inputs[1] = task1_input("bad__1")
        references.insert(1, {"benchmark_id": "bad__1", "task": "task1"})
        where, what = "reference_output.jsonl:2", "missing required field 'gold.memory_items'"
    elif case == "memory_items_not_a_list":
        inputs[1] = task1_input("bad__1")
        references.insert(1, task1_reference("bad__1", {"m1": memory_item()}))
        where, what = "reference_output.jsonl:2", "memory_items must be a list, got dict"
    elif case == "memory_value_a_number":
        inputs[1] = task1_input("bad__1")
        references.insert(1, task1_reference("bad__1", [memory_item("m1", value=42)]))
        where, what = "reference_output.jsonl:2", "memory m1: value: Input should be a valid string"
    elif case == "duplicate_memory_id":
        inputs[1] = task1_input("bad__1")
        references.insert(1, task1_reference("bad__1", [memory_item("m1"), memory_item("m1")]))
        where, what = "reference_output.jsonl:2", "memory id 'm1' appears twice"
    else:  # pragma: no cover
        raise AssertionError(case)
    return write_task1(tmp_path / "task1", inputs, references), where, what


BAD_TASK1_CASES = [
    "invalid_json",
    "invalid_utf8",
    "no_benchmark_id",
    "no_input",
    "no_turns",
    "sessions_not_a_list",
    "input_without_reference",
    "duplicate_input",
    "reference_without_input",
    "duplicate_reference",
    "reference_invalid_json",
    "reference_no_gold",
    "memory_items_not_a_list",
    "memory_value_a_number",
    "duplicate_memory_id",
]


@pytest.mark.parametrize("case", BAD_TASK1_CASES)
def test_bad_task1_row_fails_naming_file_and_line(tmp_path, case):
    folder, where, what = _bad_task1_case(tmp_path, case)
    with pytest.raises(RowError) as caught:
        read(folder)
    message = str(caught.value)
    assert message.startswith(f"{folder / where}: {what}")
    assert caught.value.location == str(folder / where)
    assert message.endswith("fix the row or pass --on-error skip")


# Turns inside a session may be checked only when they are first read (user.turns).
BAD_TURN_CASES = ["turns_not_a_list", "turn_without_text"]


@pytest.mark.parametrize("case", BAD_TURN_CASES)
def test_bad_turns_fail_naming_file_and_line_when_read(tmp_path, case):
    folder, where, what = _bad_task1_case(tmp_path, case)
    with pytest.raises(RowError) as caught:
        read(folder)
    assert str(caught.value).startswith(f"{folder / where}: {what}")


@pytest.mark.parametrize("case", BAD_TASK1_CASES)
def test_bad_task1_row_skipped_with_skip_policy(tmp_path, case):
    folder, where, what = _bad_task1_case(tmp_path, case)
    users, policy = read(folder, mode="skip")
    assert [u.user_id for u in users] == ["good__1", "good__2"]
    assert policy.skipped[0].startswith(f"{folder / where}: {what}")
    # A broken input line also leaves its reference row unmatched: counted as a second bad row.
    expected = 2 if case == "invalid_json" else 1
    assert len(policy.skipped) == expected, policy.skipped


def test_skip_counts_several_bad_rows_and_keeps_all_good_ones(tmp_path):
    good = [f"good__{n}" for n in range(5)]
    inputs = [task1_input(good[0]), "not json", task1_input(good[1]), {"input": {}}, task1_input(good[2])]
    inputs += [task1_input(good[3]), task1_input("noref__1"), task1_input(good[4])]
    references = [task1_reference(i) for i in good] + [task1_reference("noinput__1")]
    folder = write_task1(tmp_path, inputs, references)
    users, policy = read(folder, mode="skip")
    assert [u.user_id for u in users] == good
    assert [entry.split(": ", 1)[0] for entry in policy.skipped] == [
        f"{folder / 'model_input.jsonl'}:2",
        f"{folder / 'model_input.jsonl'}:4",
        f"{folder / 'model_input.jsonl'}:7",
        f"{folder / 'reference_output.jsonl'}:6",
    ]


def test_sample_with_a_broken_line_fails_at_that_line(sample_copy):
    path = sample_copy / "model_input.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2] = lines[2][: len(lines[2]) // 2] + "\n"
    path.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(RowError) as caught:
        read(sample_copy)
    assert str(caught.value).startswith(f"{path}:3: not valid JSON")
    users, policy = read(sample_copy, mode="skip")
    assert len(users) == SAMPLE_USERS - 1
    assert policy.skipped[0].startswith(f"{path}:3: not valid JSON")


def test_task1_reader_does_not_write_into_the_input_folder(tmp_path, sample_task1):
    folder = tmp_path / "task1"
    shutil.copytree(sample_task1, folder)
    before = sorted(p.name for p in folder.iterdir())
    read(folder)
    assert sorted(p.name for p in folder.iterdir()) == before


def test_language_field_on_task1_row_is_normalized(tmp_path):
    folder = write_task1(tmp_path, [task1_input("b__1", language="Spanish")], [task1_reference("b__1")])
    [user], _ = read(folder)
    assert user.language == "es"


def test_detected_language_of_task1_user(tmp_path):
    chinese = [session("s1", "我和我的姐姐又吵架了，我觉得很难过，不知道该怎么办。", "我理解你的感受。")]
    folder = write_task1(
        tmp_path,
        [task1_input("b__1", sessions=chinese), task1_input("b__2")],
        [task1_reference("b__1"), task1_reference("b__2")],
    )
    users, _ = read(folder)
    assert [u.language for u in users] == ["zh", "en"]


def test_task1_repeated_user_id_is_a_duplicate(tmp_path):
    """Sessions of one user in separate task1 rows would otherwise become two users with one id."""
    inputs = [task1_input("a__1", user_id="u7"), task1_input("b__2"), task1_input("c__3", user_id="u7")]
    folder = write_task1(tmp_path, inputs, [task1_reference(i["benchmark_id"]) for i in inputs])
    with pytest.raises(RowError) as caught:
        read(folder)
    assert "model_input.jsonl:3: duplicate user id 'u7' (first at " in str(caught.value)
    assert "model_input.jsonl:1)" in str(caught.value)
    users, policy = read(folder, mode="skip")
    assert [u.user_id for u in users] == ["u7", "b__2"]
    assert len(policy.skipped) == 1


def test_task1_invalid_utf8_inside_a_kept_users_turn_names_the_line(tmp_path):
    """Dialogue bytes are decoded when the turns are first read; a bad byte there is a RowError."""
    folder = simple_task1(tmp_path, ["a__1", "b__2"])
    lines = (folder / "model_input.jsonl").read_bytes().splitlines(keepends=True)
    marker = EMOTIONAL_TEXT.encode()
    assert marker in lines[1]
    lines[1] = lines[1].replace(marker, marker[:10] + b"\xff" + marker[10:], 1)
    (folder / "model_input.jsonl").write_bytes(b"".join(lines))
    users = list(read_users(str(folder), ErrorPolicy()))
    assert users[0].turns
    with pytest.raises(RowError) as caught:
        users[1].turns  # noqa: B018 - reading the property is the act under test
    assert str(caught.value).startswith(f"{folder / 'model_input.jsonl'}:2: dialogue text is not valid UTF-8")


def test_task1_invalid_utf8_in_a_user_turn_is_named_by_the_language_and_the_output(tmp_path):
    """A user's turns are digested and decoded as one JSON array; a bad byte in one makes
    that fail, and the turn-by-turn decoding then names the line as it did before."""
    folder = simple_task1(tmp_path, ["a__1", "b__2"])
    lines = (folder / "model_input.jsonl").read_bytes().splitlines(keepends=True)
    marker = EMOTIONAL_TEXT.encode()
    lines[1] = lines[1].replace(marker, marker[:10] + b"\xff" + marker[10:], 1)
    (folder / "model_input.jsonl").write_bytes(b"".join(lines))
    good, bad = read_users(str(folder), ErrorPolicy())
    assert good.language == "en"
    assert good._turn_dicts(("user",))[0]["text"] == EMOTIONAL_TEXT
    expected = f"{folder / 'model_input.jsonl'}:2: dialogue text is not valid UTF-8"
    with pytest.raises(RowError) as caught:
        bad.language  # noqa: B018 - reading the property is the act under test
    assert str(caught.value).startswith(expected)
    with pytest.raises(RowError) as caught:
        bad._turn_dicts(("user",))
    assert str(caught.value).startswith(expected)
