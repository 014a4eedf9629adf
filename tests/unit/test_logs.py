"""The conversation-log readers (personaemp/sources/logs/): grouping, order, bounds, bad rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write_jsonl
from log_shapes import SHAPES, TABLE_COLUMNS, expected_users, regroup, write_shape

from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy
from personaemp.sources.logs import Bounds, bound_user, detect_log_format, read_log, trim_text

TABLE = dict(zip(("user", "session", "order", "role", "text", "time"), TABLE_COLUMNS[1::2], strict=True))


def read(path: Path, fmt: str = "auto", policy: ErrorPolicy | None = None, **options):
    if fmt == "table" or path.suffix == ".csv":
        options.setdefault("columns", TABLE)
    return list(read_log(path, policy or ErrorPolicy("fail"), fmt, **options))


def grouping(users) -> dict[str, list[str]]:
    return {user.user_id: [s.session_id for s in user.sessions] for user in users}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rows", [range(0, 9), range(20, 30)], ids=["first", "held-back"])
def test_users_are_grouped_as_the_data_says_in_time_order(tmp_path, shape, rows):
    dealt = regroup(rows, users=3)
    path = write_shape(shape, dealt, tmp_path)
    assert detect_log_format(path) == shape
    users = read(path)
    assert grouping(users) == expected_users(dealt)
    for user in users:
        assert user.id_given and user.format == shape
        for session in user.sessions:
            # utterance indices are positions in the conversation: the first user turn of the
            # messages shape is 1 (its system message is position 0, left out)
            assert [t.role for t in session.turns][:1] == ["user"]
            assert len({t.index for t in session.turns}) == len(session.turns)


def test_the_sessions_keep_their_real_text_and_positions(tmp_path):
    dealt = regroup(range(0, 4), users=2)
    users = read(write_shape("messages", dealt, tmp_path))
    session = next(s for u in users for s in u.sessions if s.session_id == dealt[0]["session_id"])
    first = dealt[0]["turns"][0]["text"]
    assert session.turns[0].index == 1 and session.turns[0].text == first


def test_wildchat_parquet_with_other_columns(tmp_path):
    dealt = regroup(range(0, 9), users=3)
    path = write_shape("wildchat", dealt, tmp_path, parquet=True)
    assert detect_log_format(path) == "wildchat"
    users = read(path)
    assert grouping(users) == expected_users(dealt)
    assert all(u.location.startswith(f"{path}:") for u in users)


def test_a_table_in_parquet_with_other_columns(tmp_path):
    import polars as pl

    dealt = regroup(range(0, 6), users=2)
    frame = pl.read_csv(write_shape("table", dealt, tmp_path), infer_schema=False)
    frame = frame.with_columns(pl.lit([1, 2]).alias("nested"), pl.col("position").cast(pl.Int64))
    path = tmp_path / "turns.parquet"
    frame.write_parquet(path)
    assert detect_log_format(path) == "table"
    assert grouping(read(path, columns=TABLE)) == expected_users(dealt)


def test_a_table_orders_turns_by_number_not_by_text(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(
        "user_id,session_id,turn,role,text\nu,s,10,user,tenth\nu,s,2,user,second\n", encoding="utf-8"
    )
    (user,) = list(read_log(path, ErrorPolicy("fail"), "table", columns={}))
    assert [t.text for t in user.sessions[0].turns] == ["second", "tenth"]


def test_messages_without_a_user_id_make_each_conversation_a_user(tmp_path):
    dealt = regroup(range(0, 4), users=1)
    path = write_shape("messages", dealt, tmp_path)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    write_jsonl(path, [{k: v for k, v in row.items() if k != "user_id"} for row in rows])
    users = read(path)
    assert len(users) == len(dealt) and all(len(u.sessions) == 1 for u in users)
    assert not any(u.id_given for u in users)
    assert len({u.user_id for u in users}) == len(users)


def test_a_named_user_field(tmp_path):
    dealt = regroup(range(0, 4), users=2)
    path = write_shape("messages", dealt, tmp_path)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    rows = [{**row, "account": row.pop("user_id")} for row in rows]
    write_jsonl(path, rows)
    assert grouping(read(path, user_field="account")) == expected_users(dealt)
    del rows[1]["account"]
    write_jsonl(path, rows)
    with pytest.raises(RowError, match=r"messages.jsonl:2: no 'account'"):
        read(path, user_field="account")


def test_wildchat_without_hashed_ip_names_the_line(tmp_path):
    dealt = regroup(range(0, 3), users=1)
    path = write_shape("wildchat", dealt, tmp_path)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    del rows[2]["hashed_ip"]
    write_jsonl(path, rows)
    with pytest.raises(RowError, match=r"wildchat.jsonl:3: no 'hashed_ip'"):
        read(path)
    policy = ErrorPolicy("skip")
    assert sum(len(u.sessions) for u in read(path, policy=policy)) == 2
    assert len(policy.skipped) == 1


def test_empty_conversations_are_counted_and_left_out(tmp_path):
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [
            {"user_id": "a", "messages": []},
            {"user_id": "a", "messages": [{"role": "assistant", "content": "hello?"}]},
            {"user_id": "a", "messages": [{"role": "user", "content": "   "}]},
            {"user_id": "a", "messages": [{"role": "user", "content": "I miss my dad."}]},
            {"user_id": "b", "messages": []},
        ],
    )
    users = read(path)
    assert [u.user_id for u in users] == ["a"]
    assert len(users[0].sessions) == 1 and users[0].counts["empty_conversations"] == 3


def test_non_utf8_jsonl_names_the_line(tmp_path):
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [{"user_id": "a", "messages": [{"role": "user", "content": "fine"}]},
         b'{"user_id": "b", "messages": [{"role": "user", "content": "caf\xe9"}]}'],
    )  # fmt: skip
    with pytest.raises(RowError, match=r"m.jsonl:2: not valid UTF-8"):
        read(path)


def test_non_utf8_csv_names_the_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"user_id,session_id,turn,role,text\nu,s,1,user,fine\nu,s,2,user,caf\xe9\n")
    with pytest.raises(InputError, match=r"t.csv:3: not valid UTF-8") as caught:
        list(read_log(path, ErrorPolicy("fail"), "table", columns={}))
    assert "re-encode" in str(caught.value)


def test_a_turn_of_one_megabyte_is_trimmed_to_the_bound(tmp_path):
    huge = "I have been feeling low since the move. " + "x" * 1_000_000
    path = write_jsonl(
        tmp_path / "m.jsonl",
        [
            {
                "user_id": "a",
                "messages": [{"role": "user", "content": huge}, {"role": "assistant", "content": "ok"}],
            }
        ],
    )
    (user,) = read(path)
    bounds = Bounds()
    bound_user(user, bounds)
    text = user.sessions[0].turns[0].text
    assert len(text) < bounds.max_turn_chars + 100
    assert text.startswith("I have been feeling low") and "characters trimmed" in text
    assert user.counts["turns_trimmed"] == 1 and user.counts["chars_trimmed"] > 990_000


def test_bounds_keep_the_latest_turns_and_cut_code():
    code = "```python\n" + "print(1)\n" * 200 + "```"
    trimmed, removed = trim_text(f"Why does this fail?\n{code}\nThanks", Bounds())
    assert "code trimmed" in trimmed and trimmed.endswith("Thanks") and removed > 1000
    from personaemp.sources.logs import LogSession, LogTurn, LogUser

    sessions = [
        LogSession(
            f"s{n}", None, [LogTurn(i, "user" if i % 2 == 0 else "assistant", f"m{n}.{i}") for i in range(4)]
        )
        for n in range(5)
    ]
    user = bound_user(LogUser("u", "f:1", "messages", "f", sessions), Bounds(max_sessions=3, max_turns=6))
    assert [s.session_id for s in user.sessions] == ["s3", "s4"]
    assert [t.text for t in user.sessions[0].turns] == ["m3.2", "m3.3"]
    assert user.counts["sessions_dropped"] == 3 and user.counts["turns_dropped"] == 4 + 2


def test_auto_detection_refuses_what_it_cannot_tell(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"text": "hello"}])
    with pytest.raises(InputError, match="cannot tell the format"):
        detect_log_format(path)
    (tmp_path / "x.txt").write_text("hello", encoding="utf-8")
    with pytest.raises(InputError, match="cannot tell the format"):
        detect_log_format(tmp_path / "x.txt")
