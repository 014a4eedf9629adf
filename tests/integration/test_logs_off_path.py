"""The log readers off the happy path (issue 44): timestamps read as instants, conversations
that come twice, a UTF-8 byte order mark, user ids of two JSON types, and where
extract-memories' work goes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import order_free_responder, read_jsonl, write_jsonl
from fake_openai import FakeOpenAI
from log_shapes import TABLE_COLUMNS, regroup, sample_sessions, write_shape
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.errors import RowError
from personaemp.io import ErrorPolicy
from personaemp.sources.logs import Bounds, bound_user, read_instant, read_log

BOM = b"\xef\xbb\xbf"
TEXTS = [turn["text"] for s in sample_sessions(range(0, 6)) for turn in s["turns"] if turn["role"] == "user"]


def chat(user, conversation: str, when, text: str | None = None, **extra) -> dict:
    """A line of an OpenAI-messages log: one conversation, a real user message of the sample."""
    text = text or TEXTS[len(conversation) % len(TEXTS)]
    return {
        "user_id": user, "conversation_id": conversation, "timestamp": when,
        "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "I see."}], **extra,
    }  # fmt: skip


def read(path: Path, policy: ErrorPolicy | None = None, fmt: str = "auto", **options):
    return list(read_log(path, policy or ErrorPolicy("fail"), fmt, **options))


def sessions(user) -> list[str]:
    return [session.session_id for session in user.sessions]


# --- time ---------------------------------------------------------------------------------------


def test_sessions_are_ordered_by_instant_and_max_sessions_keeps_the_latest(tmp_path):
    """Epoch seconds across a digit boundary, milliseconds, ISO with and without a zone and
    a null: ordered as instants, the null one first; --max-sessions keeps the truly latest."""
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [
            chat("a", "2027", "2027-01-01T00:00:00Z"),
            chat("a", "2001-late", 1_000_000_000),  # 2001-09-09T01:46:40
            chat("a", "none", None),
            chat("a", "2001-early", 999_999_999),  # a second earlier: sorts after as text
            chat("a", "2024-ms", 1_704_067_200_000),  # 2024-01-01 in milliseconds
            chat("a", "2024-east", "2024-01-01T03:00:00+05:00"),  # 2023-12-31T22:00 UTC
            chat("a", "2024-zoneless", "2024-01-01T00:30:00"),  # UTC
        ],
    )
    (user,) = read(path)
    order = ["none", "2001-early", "2001-late", "2024-east", "2024-ms", "2024-zoneless", "2027"]
    assert sessions(user) == order
    stamps = {s.session_id: s.timestamp for s in user.sessions}
    assert stamps["2001-late"] == "2001-09-09T01:46:40+00:00" and stamps["none"] is None
    assert stamps["2024-east"] == "2023-12-31T22:00:00+00:00"
    assert user.counts["sessions_without_time"] == 1
    assert sessions(bound_user(user, Bounds(max_sessions=3))) == ["2024-ms", "2024-zoneless", "2027"]


def test_instants_of_each_kind():
    assert read_instant(999_999_999) < read_instant(1_000_000_000) == read_instant("1000000000")
    assert read_instant(1_000_000_000) == read_instant(1_000_000_000_000)  # milliseconds, told by magnitude
    assert read_instant("2024-03-10") == read_instant("2024-03-10T00:00:00Z") == read_instant(1_710_028_800)
    assert read_instant("3/10/2024", "%m/%d/%Y") == read_instant("2024-03-10")
    assert read_instant(None) is read_instant("  ") is None
    for bad in ("yesterday", True, "3/10/2024"):
        with pytest.raises(ValueError, match="time"):
            read_instant(bad)


def test_an_unreadable_time_names_its_line_and_the_option_and_skip_leaves_that_row_out(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [chat("a", "x", "2024-01-02"), chat("a", "y", "yesterday")])
    with pytest.raises(RowError, match=r"m.jsonl:2: time 'yesterday' .*--time-format"):
        read(path)
    policy = ErrorPolicy("skip")
    (user,) = read(path, policy)
    assert sessions(user) == ["x"] and len(policy.skipped) == 1


US_DATES = (
    "user_id,session_id,turn,role,text,sent\n"
    "u,march-10,1,user,I finally told my manager I was leaving.,3/10/2024\n"
    "u,march-9,1,user,I cannot sleep before the interview.,3/9/2024\n"
    "u,december,1,user,My sister moved away this week.,12/1/2023\n"
    "u,undated,1,user,Nobody called on my birthday.,\n"
)


def test_a_table_time_column_in_a_named_format(tmp_path):
    path = tmp_path / "turns.csv"
    path.write_text(US_DATES, encoding="utf-8")
    columns = {"time": "sent"}
    with pytest.raises(RowError, match=r"turns.csv:\d: time '.*' is neither ISO 8601.*--time-format"):
        read(path, columns=columns)
    (user,) = read(path, columns=columns, time_format="%m/%d/%Y")
    assert sessions(user) == ["undated", "december", "march-9", "march-10"]
    assert user.sessions[-1].timestamp == "2024-03-10T00:00:00+00:00"
    assert sessions(bound_user(user, Bounds(max_sessions=2))) == ["march-9", "march-10"]


def test_a_parquet_table_with_epoch_numbers_is_ordered_by_instant(tmp_path):
    import polars as pl

    frame = pl.DataFrame(
        {
            "user_id": ["u"] * 3,
            "session_id": ["late", "early", "ms"],
            "turn": [1, 1, 1],
            "role": ["user"] * 3,
            "text": TEXTS[:3],
            "sent": [1_000_000_000, 999_999_999, 1_704_067_200_000],
        }
    )
    path = tmp_path / "turns.parquet"
    frame.write_parquet(path)
    (user,) = read(path, fmt="table", columns={"time": "sent"})
    assert sessions(user) == ["early", "late", "ms"]


def test_the_time_format_flag_reaches_the_reader(tmp_path):
    path = tmp_path / "turns.csv"
    path.write_text(US_DATES, encoding="utf-8")
    output = tmp_path / "out" / "memories.jsonl"
    with FakeOpenAI(responder=order_free_responder()) as server:
        result = CliRunner().invoke(
            app,
            ["extract-memories", "-i", str(path), "-o", str(output), "--time-column", "sent",
             "--time-format", "%m/%d/%Y", "--max-sessions", "2", "--base-url", server.base_url,
             "--model", "fake", "--work-dir", str(tmp_path / "out" / "work")],
            env={"OPENAI_API_KEY": "sk-test"},
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    (row,) = read_jsonl(output)
    assert [s["session_id"] for s in row["sessions"]] == ["march-9", "march-10"]


# --- conversations that come twice ---------------------------------------------------------------


def test_a_conversation_twice_is_kept_once_and_an_id_with_other_turns_is_renamed(tmp_path):
    same = chat("a", "c1", "2024-01-01T10:00:00Z")
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [
            same,
            chat("a", "c2", "2024-01-02T10:00:00Z"),
            same,  # the export listed it again
            chat("a", "c1", "2024-01-03T10:00:00Z", TEXTS[4]),  # the id reused for another chat
            chat("b", "c1", "2024-01-01T10:00:00Z"),  # another user's c1: their own
        ],
    )
    a, b = read(path)
    assert sessions(a) == ["c1", "c2", "c1#2"] and sessions(b) == ["c1"]
    assert a.counts["duplicate_conversations"] == 1 and a.counts["session_ids_repeated"] == 1
    assert a.sessions[-1].turns[0].text == TEXTS[4]
    evidence = [(s.session_id, t.index) for s in a.sessions for t in s.turns]
    assert len(evidence) == len(set(evidence))  # every {session_id, utterance_index} names one turn


def test_wildchat_parquet_with_a_conversation_twice(tmp_path):
    dealt = regroup(range(0, 3), users=1)
    path = write_shape("wildchat", [*dealt, dealt[1]], tmp_path, parquet=True)
    (user,) = read(path)
    assert sorted(sessions(user)) == sorted(s["session_id"] for s in dealt)
    assert user.counts["duplicate_conversations"] == 1
    repeated = next(s for s in user.sessions if s.session_id == dealt[1]["session_id"])
    assert len(repeated.turns) == len(dealt[1]["turns"])


def test_a_table_with_its_rows_twice(tmp_path):
    path = tmp_path / "turns.csv"
    rows = "u,s1,1,user,I miss my old team.\nu,s1,2,assistant,That is a real loss.\n"
    path.write_text("user_id,session_id,turn,role,text\n" + rows + rows, encoding="utf-8")
    (user,) = read(path, columns={})
    assert [t.text for t in user.sessions[0].turns] == ["I miss my old team.", "That is a real loss."]
    assert user.counts["duplicate_rows"] == 2


# --- a byte order mark ---------------------------------------------------------------------------


def with_bom(path: Path) -> Path:
    path.write_bytes(BOM + path.read_bytes())
    return path


@pytest.mark.parametrize("shape", ["messages", "wildchat", "sharegpt", "table"])
@pytest.mark.parametrize("given", ["auto", "named"])
def test_a_byte_order_mark_is_read_past_in_every_format(tmp_path, shape, given):
    dealt = regroup(range(0, 4), users=2)
    path = with_bom(write_shape(shape, dealt, tmp_path))
    names = ("user", "session", "order", "role", "text", "time")
    options = {"columns": dict(zip(names, TABLE_COLUMNS[1::2], strict=True))} if shape == "table" else {}
    fmt = "auto" if given == "auto" else shape
    for policy in (ErrorPolicy("fail"), ErrorPolicy("skip")):
        users = read(path, policy, fmt, **options)
        assert sum(len(u.sessions) for u in users) == len(dealt)  # row 1 too
        assert policy.skipped == []


def test_a_byte_order_mark_before_a_tsv_header(tmp_path):
    path = tmp_path / "turns.tsv"
    path.write_bytes(BOM + b"user_id\tsession_id\tturn\trole\ttext\nu\ts\t1\tuser\tI lost my job.\n")
    (user,) = read(path, columns={})
    assert user.user_id == "u" and user.sessions[0].turns[0].text == "I lost my job."


# --- user ids of two types ------------------------------------------------------------------------


def test_user_ids_one_and_text_one_are_one_user_counted_and_one_point_zero_stays_apart(tmp_path):
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [chat(1, "x", "2024-01-01"), chat("1", "y", "2024-01-02"), chat(1.0, "z", "2024-01-03"),
         chat("2", "w", "2024-01-01")],
    )  # fmt: skip
    users = {user.user_id: user for user in read(path)}
    assert sorted(users) == ["1", "1.0", "2"]
    assert sessions(users["1"]) == ["x", "y"] and users["1"].counts["user_ids_merged"] == 1
    assert "user_ids_merged" not in users["1.0"].counts and "user_ids_merged" not in users["2"].counts


# --- the command: what it says, where its work goes -------------------------------------------------


def test_the_command_counts_what_reading_found_and_says_where_its_work_went(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = write_jsonl(
        tmp_path / "m.jsonl",
        [chat(1, "x", 1_000_000_000), chat("1", "x", 1_000_000_000), chat("1", "x", 999_999_999, TEXTS[3]),
         chat(2, "y", None)],
    )  # fmt: skip
    with_bom(log)
    runner = CliRunner()
    with FakeOpenAI(responder=order_free_responder()) as server:

        def extract(*extra: str):
            result = runner.invoke(
                app, ["extract-memories", "-i", str(log), "--base-url", server.base_url, "--model", "fake",
                      *extra], env={"OPENAI_API_KEY": "sk-test", "COLUMNS": "400"},
            )  # fmt: skip
            assert result.exit_code == 0, result.output
            return " ".join(result.output.split())

        elsewhere = extract("-o", "out/memories.jsonl")
        beside = extract("-o", "out2/memories.jsonl", "--work-dir", "out2/.work")
        default = extract()
    assert "cache and run report: data/processed/.personaemp (--work-dir moves them)" in elsewhere
    assert (tmp_path / "data" / "processed" / ".personaemp" / "run_report.json").is_file()
    assert "cache and run report" not in beside
    assert (tmp_path / "out2" / ".work" / "run_report.json").is_file()
    assert "cache and run report" not in default  # beside data/processed/memories.jsonl
    assert 'm.jsonl: 1 user ids came both as a number and as text (1 and "1")' in elsewhere
    assert "1 duplicate conversations kept once" in elsewhere
    assert "1 conversation ids repeated with other turns" in elsewhere
    assert "1 conversations without a time" in elsewhere
    rows = {row["user_id"]: row for row in read_jsonl(tmp_path / "out" / "memories.jsonl")}
    assert [s["session_id"] for s in rows["1"]["sessions"]] == ["x", "x#2"]  # the earlier one keeps its id
    recorded = json.loads((tmp_path / "out" / "manifest.json").read_text())["extract-memories"]["report"]
    where = tmp_path / "data" / "processed" / ".personaemp"
    assert Path(recorded).resolve() == (where / "run_report.json").resolve()  # the manifest says so too


def test_a_turn_without_a_string_role_is_a_bad_row_that_skip_skips(tmp_path):
    """Found reading this code: the check ran on the second read, past --on-error skip."""
    broken = {**chat("a", "y", "2024-01-02"), "messages": [{"role": 5, "content": "I feel alone."}]}
    path = write_jsonl(tmp_path / "m.jsonl", [chat("a", "x", "2024-01-01"), broken])
    with pytest.raises(RowError, match=r"m.jsonl:2: turn 0: a turn needs a string role"):
        read(path)
    policy = ErrorPolicy("skip")
    (user,) = read(path, policy)
    assert sessions(user) == ["x"] and len(policy.skipped) == 1
