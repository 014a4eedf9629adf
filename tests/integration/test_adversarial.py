"""Issue 44's adversarial replay: hostile cases as an attacker or a careless user would try
them, over extract-memories, staleness, shards, Label Studio import, the results API,
config and secrets. Every case asserts its exact outcome: the exit code, ONE `Error:` line
naming the file:line or option (and no traceback), an existing output byte-identical after
a refused run, no key in any file under tmp_path or in any output, and the right rows when
it succeeds.

A case is a function registered with `@case(area)`; the table of hostile logs below
registers one case per row. One test runs them all; the last one counts them."""

from __future__ import annotations

import json
import shutil
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import SAMPLE_TASK1, clean_environment, order_free_responder, read_jsonl, write_jsonl
from fake_openai import KEY_FORMS, FakeOpenAI, reply
from log_shapes import sample_sessions
from typer.testing import CliRunner

from personaemp.cli import app

KEY = "sk-adversary-NEVER-SHOWN-7f3a9c0d2e"
BOM = b"\xef\xbb\xbf"
EARLIER = b'{"user_id": "earlier", "note": "a finished run\'s row"}\n'
TEXTS = [t["text"] for s in sample_sessions(range(0, 8)) for t in s["turns"] if t["role"] == "user"]


# --- the harness ---------------------------------------------------------------------------------


@dataclass
class Case:
    area: str
    name: str
    run: Callable[[Ctx], None]
    marks: tuple = ()


CASES: dict[str, Case] = {}


def case(area: str, *marks):
    def register(function):
        name = f"{area}-{function.__name__.removeprefix('_')}"
        assert name not in CASES, name
        CASES[name] = Case(area, name, function, marks)
        return function

    return register


@dataclass
class Ctx:
    tmp: Path
    base_url: str
    outputs: list[str] = field(default_factory=list)  # every stdout and stderr seen

    def invoke(self, *args, env: dict[str, str] | None = None):
        result = CliRunner().invoke(app, [str(a) for a in args], env={"OPENAI_API_KEY": KEY, **(env or {})})
        self.outputs += [result.stdout, result.stderr]
        assert "Traceback" not in result.output, result.output
        return result

    def llm(self, work: str = "work") -> list[str]:
        return ["--base-url", self.base_url, "--model", "fake", "--work-dir", self.tmp / work]


def refused(result, code: int, *words: str) -> str:
    """Exit `code` and one `Error:` line holding every word; besides it, only `warning:` lines
    for bad input (2), and the run's progress for a failed run (1)."""
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("warning: ")]
    if code == 1:
        lines = [line for line in lines if "Error" in line]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for word in words:
        assert str(word) in lines[0], (word, lines[0])
    return lines[0]


def succeeded(result) -> str:
    assert result.exit_code == 0, result.output
    assert "Error" not in result.stderr, result.stderr
    return " ".join(result.stderr.split())


def key_forms() -> set[str]:
    return {form(KEY).lower() for form in KEY_FORMS.values()} | {urllib.parse.quote(KEY, safe="").lower()}


@pytest.fixture(scope="module")
def server():
    with FakeOpenAI(responder=order_free_responder()) as fake:
        yield fake


@pytest.fixture
def ctx(tmp_path, server, monkeypatch):
    clean_environment(monkeypatch)
    monkeypatch.chdir(tmp_path)
    return Ctx(tmp_path, server.base_url)


# --- extract-memories: hostile logs, as a table ----------------------------------------------------


def chat(user, conversation, when, text: str | None = None, **extra) -> dict:
    """A line of an OpenAI-messages log: a real user message of the sample and a reply."""
    text = text or TEXTS[len(str(conversation)) % len(TEXTS)]
    return {
        "user_id": user,
        "conversation_id": conversation,
        "timestamp": when,
        "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "I see."}],
        **extra,
    }


def lines(*rows) -> bytes:
    """JSON lines; a bytes row is written as it is."""
    out = b""
    for row in rows:
        out += row if isinstance(row, bytes) else json.dumps(row, ensure_ascii=False).encode() + b"\n"
    return out


def sharegpt(user, conversation, when, text: str | None = None) -> dict:
    text = text or TEXTS[len(str(conversation)) % len(TEXTS)]
    return {
        "id": conversation,
        "user": user,
        "timestamp": when,
        "conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "Go on."}],
    }


def table(header: str, *rows: str, end: str = "\n") -> bytes:
    """A CSV (or TSV) file; `{A}`, `{B}`, `{C}` in a row are the sample's texts, quoted."""
    quoted = {name: '"' + text.replace('"', '""') + '"' for name, text in zip("ABC", TEXTS, strict=False)}
    return end.join([header, *(row.format(**quoted) for row in rows), ""]).encode()


CSV = "user_id,session_id,turn,role,text,sent"
A, B, C = TEXTS[:3]


@dataclass
class Log:
    """A hostile log: its file name and bytes, the flags, and the outcome: `code` with the
    words of the one error line, or (exit 0) the users' session ids in order and counts
    the `read:` line states."""

    name: str
    file: str
    content: bytes | None  # None: a folder
    flags: tuple = ()
    code: int = 0
    words: tuple = ()
    sessions: dict | None = None  # user -> session ids in time order
    said: tuple = ()  # on stderr
    check: Callable[[list[dict]], None] | None = None  # on conversations.jsonl's rows
    marks: tuple = ()


def stamps(*expected):
    def check(rows):
        assert [s["timestamp"] for row in rows for s in row["sessions"]] == list(expected)

    return check


def texts_without(bad: str):
    def check(rows):
        for row in rows:
            for session in row["sessions"]:
                for turn in session["turns"]:
                    assert bad not in turn["text"] and turn["text"] == turn["text"].strip("\ufeff"), turn

    return check


LOGS = [
    # --- byte order marks
    Log(
        "bom-jsonl",
        "m.jsonl",
        BOM + lines(chat("a", "c1", "2024-01-01")),
        sessions={"a": ["c1"]},
        check=texts_without("\ufeff"),
    ),
    Log(
        "bom-jsonl-skip",
        "m.jsonl",
        BOM + lines(chat("a", "c1", "2024-01-01"), chat("a", "c2", "2024-01-02")),
        flags=("--on-error", "skip"),
        sessions={"a": ["c1", "c2"]},
    ),
    Log(
        "bom-jsonl-format",
        "m.jsonl",
        BOM + lines(chat("a", "c1", "2024-01-01")),
        flags=("--format", "messages"),
        sessions={"a": ["c1"]},
    ),
    Log(
        "bom-sharegpt-array",
        "s.json",
        BOM + json.dumps([sharegpt("a", "x", "2024-02-01")]).encode(),
        sessions={"a": ["x"]},
    ),
    Log(
        "bom-sharegpt-array-indented",
        "s.json",
        BOM
        + json.dumps([sharegpt("a", "x", "2024-02-01"), sharegpt("a", "w", "2024-01-01")], indent=2).encode(),
        flags=("--format", "sharegpt"),
        sessions={"a": ["w", "x"]},
    ),
    Log(
        "bom-csv",
        "t.csv",
        BOM + table(CSV, "u,s1,1,user,{A},2024-01-01"),
        flags=("--time-column", "sent"),
        sessions={"u": ["s1"]},
    ),
    Log(
        "bom-tsv-crlf",
        "t.tsv",
        BOM + table(CSV.replace(",", "\t"), "u\ts1\t1\tuser\t{A}\t", end="\r\n"),
        sessions={"u": ["s1"]},
        check=texts_without("\r"),
    ),
    Log(
        "bom-twice",
        "m.jsonl",
        BOM + BOM + lines(chat("a", "c1", "2024-01-01")),
        code=2,
        words=("m.jsonl:1", "not valid JSON"),
    ),
    Log(
        "bom-on-a-later-line",
        "m.jsonl",
        lines(chat("a", "c1", "2024-01-01")) + BOM + lines(chat("a", "c2", None)),
        code=2,
        words=("m.jsonl:2", "not valid JSON"),
    ),
    Log(
        "utf16-log",
        "m.jsonl",
        b"\xff\xfe" + json.dumps(chat("a", "c1", None)).encode("utf-16-le"),
        code=2,
        words=("m.jsonl:1",),
    ),
    # --- line ends, encodings, junk
    Log(
        "crlf-jsonl",
        "m.jsonl",
        lines(chat("a", "c1", "2024-01-01")).replace(b"\n", b"\r\n") * 1,
        sessions={"a": ["c1"]},
        check=texts_without("\r"),
    ),
    Log(
        "crlf-csv",
        "t.csv",
        table(CSV, "u,s1,1,user,{A},", "u,s1,2,assistant,Tell me more.,", end="\r\n"),
        sessions={"u": ["s1"]},
        check=texts_without("\r"),
    ),
    Log(
        "blank-lines-between",
        "m.jsonl",
        b"\n\n" + lines(chat("a", "c1", None)) + b"\n   \n" + lines(chat("a", "c2", None)),
        sessions={"a": ["c1", "c2"]},
    ),
    Log(
        "invalid-utf8-jsonl",
        "m.jsonl",
        lines(chat("a", "c1", None)) + b'{"user_id": "a", "messages": "\xff\xfe"}\n',
        code=2,
        words=("m.jsonl:2", "UTF-8"),
    ),
    Log(
        "invalid-utf8-csv",
        "t.csv",
        table(CSV, "u,s1,1,user,{A},") + b"u,s2,1,user,caf\xe9 alone,\n",
        code=2,
        words=("t.csv:3", "not valid UTF-8", "iconv"),
    ),
    Log("binary-junk", "m.jsonl", bytes(range(256)) * 8, code=2, words=("m.jsonl",)),
    Log(
        "binary-junk-skip",
        "m.jsonl",
        lines(chat("a", "c1", None)) + b"\x00\x01\x02garbage\x00\n",
        flags=("--on-error", "skip"),
        sessions={"a": ["c1"]},
        said=("1 bad rows skipped",),
    ),
    Log("empty-file", "m.jsonl", b"", code=2, words=("m.jsonl", "no records")),
    Log("only-blank-lines", "m.jsonl", b"\n \n\t\n", code=2, words=("m.jsonl", "no records")),
    Log("empty-csv", "t.csv", b"", code=2, words=("t.csv",)),
    Log(
        "header-only-csv", "t.csv", table(CSV), code=2, words=("t.csv", "no conversation with a user message")
    ),
    Log("a-folder", "logs", None, code=2, words=("logs", "a folder without model_input.jsonl")),
    Log(
        "no-such-file",
        "missing.jsonl",
        b"",
        flags=("--input", "missing.jsonl"),
        code=2,
        words=("missing.jsonl", "no such file"),
    ),
    Log(
        "unknown-suffix",
        "m.txt",
        lines(chat("a", "c1", None)),
        code=2,
        words=("m.txt", "cannot tell the format"),
    ),
    Log(
        "truncated-last-line",
        "m.jsonl",
        lines(chat("a", "c1", None)) + lines(chat("a", "c2", None))[:-40],
        code=2,
        words=("m.jsonl:2",),
    ),
    Log(
        "deeply-nested",
        "m.jsonl",
        lines(chat("a", "c1", None)) + b'{"user_id": "a", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
        code=2,
        words=("m.jsonl:2", "nested too deep"),
    ),
    Log(
        "gigantic-line",
        "m.jsonl",
        lines(chat("a", "c1", None, "I feel alone. " + "la " * 2_000_000)),
        sessions={"a": ["c1"]},
        check=lambda rows: len(rows[0]["sessions"][0]["turns"][0]["text"]) < 2_200,
    ),
    Log(
        "a-json-array-not-sharegpt",
        "s.json",
        json.dumps([{"question": "q", "answer": "a"}]).encode(),
        code=2,
        words=("s.json", "cannot tell the format", "--format"),
    ),
    Log(
        "a-json-object-not-an-array",
        "s.json",
        json.dumps({"conversations": []}).encode(),
        code=2,
        words=("s.json",),
    ),
    Log(
        "array-of-numbers-as-sharegpt",
        "s.json",
        b"[1, 2, 3]",
        flags=("--format", "sharegpt"),
        code=2,
        words=("s.json:1", "expected a JSON object"),
    ),
    Log(
        "a-line-that-is-a-list",
        "m.jsonl",
        lines(chat("a", "c1", None), [1, 2]),
        code=2,
        words=("m.jsonl:2", "expected a JSON object, got list"),
    ),
    Log(
        "messages-not-a-list",
        "m.jsonl",
        lines(chat("a", "c1", None), {**chat("a", "c2", None), "messages": "hi"}),
        code=2,
        words=("m.jsonl:2", "'messages' must be a list"),
    ),
    Log(
        "a-turn-text-a-number",
        "m.jsonl",
        lines({**chat("a", "c1", None), "messages": [{"role": "user", "content": 5}]}),
        code=2,
        words=("m.jsonl:1", "a turn's text must be a string"),
    ),
    Log(
        "only-system-turns",
        "m.jsonl",
        lines({**chat("a", "c1", None), "messages": [{"role": "system", "content": "x"}]}),
        code=2,
        words=("m.jsonl", "no conversation with a user message"),
    ),
    Log(
        "wrong-format-named",
        "m.jsonl",
        lines(chat("a", "c1", None)),
        flags=("--format", "wildchat"),
        code=2,
        words=("m.jsonl:1", "no 'hashed_ip'"),
    ),
    # --- a table with missing columns
    Log(
        "csv-missing-text-column",
        "t.csv",
        table("user_id,session_id,turn,role", "u,s1,1,user"),
        code=2,
        words=("t.csv", "no column 'text'", "--text-column"),
    ),
    Log(
        "csv-named-time-column-absent",
        "t.csv",
        table(CSV, "u,s1,1,user,{A},"),
        flags=("--time-column", "when"),
        code=2,
        words=("t.csv", "no column 'when'", "--time-column"),
    ),
    Log(
        "csv-order-not-a-number",
        "t.csv",
        table(CSV, "u,s1,first,user,{A},"),
        code=2,
        words=("t.csv:2", "turn order 'first' is not a number"),
    ),
    Log("csv-no-user", "t.csv", table(CSV, ",s1,1,user,{A},"), code=2, words=("t.csv:2", "no user id")),
    Log(
        "csv-unquoted-comma-in-text",
        "t.csv",
        table(CSV, "u,s1,1,user,{A},", "u,s1,2,user,I feel bad, really,"),
        code=2,
        words=("t.csv:3", "more fields than the header's 6", "quote the fields"),
    ),
    # --- time
    Log(
        "epoch-digit-boundary",
        "m.jsonl",
        lines(chat("a", "late", 1_000_000_000), chat("a", "early", 999_999_999)),
        sessions={"a": ["early", "late"]},
        check=stamps("2001-09-09T01:46:39+00:00", "2001-09-09T01:46:40+00:00"),
    ),
    Log(
        "epoch-seconds-vs-ms",
        "m.jsonl",
        lines(
            chat("a", "ms-2024", 1_704_067_200_000),
            chat("a", "s-2023", 1_672_531_200),
            chat("a", "txt", "1700000000"),
        ),
        sessions={"a": ["s-2023", "txt", "ms-2024"]},
    ),
    Log(
        "epoch-float-seconds",
        "m.jsonl",
        lines(chat("a", "b", 1_000_000_000.5), chat("a", "a", 1_000_000_000.25)),
        sessions={"a": ["a", "b"]},
        check=stamps("2001-09-09T01:46:40.250000+00:00", "2001-09-09T01:46:40.500000+00:00"),
    ),
    Log(
        "negative-epoch",
        "m.jsonl",
        lines(chat("a", "after", 0), chat("a", "before", -1)),
        sessions={"a": ["before", "after"]},
        check=stamps("1969-12-31T23:59:59+00:00", "1970-01-01T00:00:00+00:00"),
    ),
    Log(
        "mixed-iso-epoch-null",
        "m.jsonl",
        lines(
            chat("a", "y2027", "2027-01-01T00:00:00Z"),
            chat("a", "null", None),
            chat("a", "y2024", 1_704_067_200),
            chat("a", "east", "2024-01-01T03:00:00+05:00"),
        ),
        sessions={"a": ["null", "east", "y2024", "y2027"]},
        said=("1 conversations without a time",),
    ),
    Log(
        "nan-literal",
        "m.jsonl",
        lines(chat("a", "c1", None)) + b'{"user_id": "a", "conversation_id": "c2", '
        b'"timestamp": NaN, "messages": [{"role": "user", "content": "I am tired."}]}\n',
        code=2,
        words=("m.jsonl:2",),
    ),
    Log(
        "nan-text",
        "m.jsonl",
        lines(chat("a", "c1", "NaN")),
        code=2,
        words=("m.jsonl:1", "'NaN'", "--time-format"),
    ),
    Log(
        "infinity-number",
        "m.jsonl",
        lines(chat("a", "c1", None)) + b'{"user_id": "a", "timestamp": 1e400, '
        b'"messages": [{"role": "user", "content": "I am tired."}]}\n',
        code=2,
        words=("m.jsonl:2", "out of range"),
    ),
    Log("huge-epoch", "m.jsonl", lines(chat("a", "c1", 10**30)), code=2, words=("m.jsonl:1", "out of range")),
    Log(
        "huge-negative-epoch",
        "m.jsonl",
        lines(chat("a", "c1", -(10**20))),
        code=2,
        words=("m.jsonl:1", "out of range"),
    ),
    Log(
        "time-true",
        "m.jsonl",
        lines(chat("a", "c1", True)),
        code=2,
        words=("m.jsonl:1", "time True is not a time"),
    ),
    Log(
        "time-object",
        "m.jsonl",
        lines(chat("a", "c1", {"$date": 1})),
        code=2,
        words=("m.jsonl:1", "not a time"),
    ),
    Log(
        "time-list",
        "m.jsonl",
        lines(chat("a", "c1", [2024, 1, 1])),
        code=2,
        words=("m.jsonl:1", "not a time"),
    ),
    Log(
        "garbage-time-skipped",
        "m.jsonl",
        lines(chat("a", "ok", "2024-01-01"), chat("a", "bad", "next tuesday")),
        flags=("--on-error", "skip"),
        sessions={"a": ["ok"]},
        said=("1 bad rows skipped",),
    ),
    Log(
        "us-dates-jsonl-without-format",
        "m.jsonl",
        lines(chat("a", "c1", "3/10/2024")),
        code=2,
        words=("m.jsonl:1", "'3/10/2024'", "--time-format"),
    ),
    Log(
        "us-dates-jsonl-with-format",
        "m.jsonl",
        lines(chat("a", "mar10", "3/10/2024"), chat("a", "mar9", "3/9/2024"), chat("a", "dec", "12/1/2023")),
        flags=("--time-format", "%m/%d/%Y"),
        sessions={"a": ["dec", "mar9", "mar10"]},
    ),
    Log(
        "iso-value-under-a-time-format",
        "m.jsonl",
        lines(chat("a", "c1", "3/9/2024"), chat("a", "c2", "2024-03-10")),
        flags=("--time-format", "%m/%d/%Y"),
        code=2,
        words=("m.jsonl:2", "does not match --time-format"),
    ),
    Log(
        "us-dates-csv-mixed-rows",
        "t.csv",
        table(CSV, "u,s1,1,user,{A},3/9/2024", "u,s2,1,user,{B},2024-03-10"),
        flags=("--time-column", "sent", "--time-format", "%m/%d/%Y"),
        code=2,
        words=("t.csv:3", "does not match --time-format"),
    ),
    Log(
        "us-dates-csv-max-sessions",
        "t.csv",
        table(
            CSV, "u,mar10,1,user,{A},3/10/2024", "u,mar9,1,user,{B},3/9/2024", "u,dec,1,user,{C},12/31/2023"
        ),
        flags=("--time-column", "sent", "--time-format", "%m/%d/%Y", "--max-sessions", "2"),
        sessions={"u": ["mar9", "mar10"]},
    ),
    Log(
        "epoch-text-in-csv",
        "t.csv",
        table(CSV, "u,late,1,user,{A},1000000000", "u,early,1,user,{B},999999999"),
        flags=("--time-column", "sent"),
        sessions={"u": ["early", "late"]},
    ),
    Log(
        "max-sessions-keeps-the-latest-instants",
        "m.jsonl",
        lines(
            chat("a", "y2001", 999_999_999),
            chat("a", "y2024", "2024-06-01"),
            chat("a", "none", None),
            chat("a", "y2023", 1_672_531_200_000),
        ),
        flags=("--max-sessions", "2"),
        sessions={"a": ["y2023", "y2024"]},
    ),
    # --- duplicate and conflicting sessions
    Log(
        "same-conversation-three-times",
        "m.jsonl",
        lines(*[chat("a", "c1", "2024-01-01")] * 3),
        sessions={"a": ["c1"]},
        said=("2 duplicate conversations kept once",),
    ),
    Log(
        "same-id-other-turns",
        "m.jsonl",
        lines(
            chat("a", "c1", "2024-01-02", A),
            chat("a", "c1", "2024-01-01", B),
            chat("a", "c1", "2024-01-03", C),
        ),
        sessions={"a": ["c1", "c1#2", "c1#3"]},
        said=("2 conversation ids repeated with other turns",),
    ),
    Log(
        "id-collides-with-a-renamed-one",
        "m.jsonl",
        lines(
            chat("a", "c1", "2024-01-01", A),
            chat("a", "c1#2", "2024-01-02", B),
            chat("a", "c1", "2024-01-03", C),
        ),
        sessions={"a": ["c1", "c1#2", "c1#3"]},
    ),
    Log(
        "same-turns-other-times",
        "m.jsonl",
        lines(chat("a", "c1", "2024-01-01"), chat("a", "c1", "2025-01-01")),
        sessions={"a": ["c1"]},
        said=("1 duplicate conversations kept once",),
    ),
    Log(
        "duplicate-table-rows",
        "t.csv",
        table(CSV, "u,s1,1,user,{A},", "u,s1,1,user,{A},", "u,s1,2,assistant,Ok.,"),
        sessions={"u": ["s1"]},
        check=lambda rows: len(rows[0]["sessions"][0]["turns"]) == 2,
    ),
    Log(
        "no-conversation-ids",
        "m.jsonl",
        lines({**chat("a", None, None, A)}, {**chat("a", None, None, A)}),
        check=lambda rows: len(rows[0]["sessions"]) == 2,
    ),
    # --- user and conversation ids of every type
    Log(
        "number-and-text-ids-merge",
        "m.jsonl",
        lines(chat(1, "x", "2024-01-01"), chat("1", "y", "2024-01-02")),
        sessions={"1": ["x", "y"]},
        said=('1 user ids came both as a number and as text (1 and "1")',),
    ),
    Log(
        "float-id-stays-apart",
        "m.jsonl",
        lines(chat(1, "x", "2024-01-01"), chat(1.0, "y", "2024-01-02")),
        sessions={"1": ["x"], "1.0": ["y"]},
    ),
    Log(
        "null-user-ids-each-their-own",
        "m.jsonl",
        lines(chat(None, "x", None), chat(None, "y", None)),
        check=lambda rows: len(rows) == 2 and not any(r["user_id_given"] for r in rows),
    ),
    Log(
        "true-user-id",
        "m.jsonl",
        lines(chat(True, "x", None), chat("True", "y", None)),
        code=2,
        words=("m.jsonl:1", "user id"),
    ),
    Log(
        "nested-user-id", "m.jsonl", lines(chat({"id": 1}, "x", None)), code=2, words=("m.jsonl:1", "user id")
    ),
    Log("list-user-id", "m.jsonl", lines(chat([1, 2], "x", None)), code=2, words=("m.jsonl:1", "user id")),
    Log(
        "nested-conversation-id",
        "m.jsonl",
        lines(chat("a", {"id": 1}, None)),
        code=2,
        words=("m.jsonl:1", "conversation id"),
    ),
    Log(
        "nested-user-id-skipped",
        "m.jsonl",
        lines(chat("a", "x", None), chat({"id": 1}, "y", None)),
        flags=("--on-error", "skip"),
        sessions={"a": ["x"]},
        said=("1 bad rows skipped",),
    ),
    Log(
        "user-field-named-but-absent",
        "m.jsonl",
        lines(chat("a", "x", None)),
        flags=("--user-field", "uid"),
        code=2,
        words=("m.jsonl:1", "no 'uid'", "--user-field"),
    ),
]


def _log_case(log: Log):
    def run(ctx: Ctx):
        source = ctx.tmp / log.file
        if log.content is None:
            source.mkdir()
        elif log.name != "no-such-file":
            source.write_bytes(log.content)
        out = ctx.tmp / "out"
        out.mkdir()
        earlier = {name: EARLIER for name in ("memories.jsonl", "conversations.jsonl")}
        if log.code:
            for name, content in earlier.items():
                (out / name).write_bytes(content)
        flags = [str(f) for f in log.flags]
        given = [] if "--input" in flags else ["--input", source]
        result = ctx.invoke("extract-memories", *given, *flags, "-o", out / "memories.jsonl", *ctx.llm())
        if log.code:
            refused(result, log.code, *log.words)
            assert {name: (out / name).read_bytes() for name in earlier} == earlier, "a refused run wrote"
            return
        text = succeeded(result)
        for words in log.said:
            assert words in text, (words, text)
        rows = read_jsonl(out / "conversations.jsonl")
        if log.sessions is not None:
            assert {r["user_id"]: [s["session_id"] for s in r["sessions"]] for r in rows} == log.sessions
        if log.check is not None:
            assert log.check(rows) is not False
        memories = read_jsonl(out / "memories.jsonl")
        assert sorted(r["user_id"] for r in memories) == sorted(r["user_id"] for r in rows)

    run.__name__ = log.name
    case("extract", *log.marks)(run)


for _log in LOGS:
    _log_case(_log)


# --- staleness: an input edited after a run re-runs the stage, never serves stale rows -----------


def six_users(ctx: Ctx, name: str = "m.jsonl") -> Path:
    rows = [chat(f"user-{n}", f"c{n}", f"2024-01-0{n + 1}", TEXTS[n]) for n in range(6)]
    return write_jsonl(ctx.tmp / name, rows)


def extract(ctx: Ctx, log: Path, *flags, out: str = "out"):
    return ctx.invoke(
        "extract-memories", "-i", log, "-o", ctx.tmp / out / "memories.jsonl", *flags, *ctx.llm()
    )


def filtered(ctx: Ctx, users: int = 3) -> Path:
    """The sample's filter output, cut to `users` users (a fresh copy of the input first, so a
    case may edit it)."""
    output = ctx.tmp / "p" / "filtered.jsonl"
    result = ctx.invoke("filter", "--input", SAMPLE_TASK1, "--output", output)
    assert result.exit_code == 0, result.output
    output.write_text("".join(output.read_text().splitlines(keepends=True)[:users]))
    return output


def same_size_edit(path: Path, old: bytes, new: bytes) -> None:
    """Change bytes of a file, keeping its size and its modification time."""
    assert len(old) == len(new)
    stat = path.stat()
    content = path.read_bytes()
    assert old in content, old
    path.write_bytes(content.replace(old, new, 1))
    import os

    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@case("stale")
def _log_edited_after_a_run_is_read_again(ctx):
    log = six_users(ctx)
    succeeded(extract(ctx, log))
    rows = read_jsonl(log)
    rows[2]["messages"][0]["content"] = "My dog died last week and I keep setting out two bowls."
    write_jsonl(log, rows)
    succeeded(extract(ctx, log))
    (row,) = [r for r in read_jsonl(ctx.tmp / "out" / "memories.jsonl") if r["user_id"] == "user-2"]
    assert "two bowls" in json.dumps(row["sessions"])


@case("stale")
def _log_edited_keeping_size_and_mtime_is_read_again(ctx):
    log = six_users(ctx)
    succeeded(extract(ctx, log))
    same_size_edit(log, b'"c3"', b'"z3"')
    succeeded(extract(ctx, log))
    sessions = {
        r["user_id"]: r["sessions"][0]["session_id"] for r in read_jsonl(ctx.tmp / "out" / "memories.jsonl")
    }
    assert sessions["user-3"] == "z3"


@case("stale")
def _log_unchanged_sends_nothing_again(ctx):
    log = six_users(ctx)
    succeeded(extract(ctx, log))
    before = (ctx.tmp / "out" / "memories.jsonl").read_bytes()
    text = succeeded(extract(ctx, log))
    assert (ctx.tmp / "out" / "memories.jsonl").read_bytes() == before
    assert "unchanged since" in text or "0 done + 6 done earlier" in text, text


@case("stale")
def _user_removed_from_the_log_leaves_no_row(ctx):
    log = six_users(ctx)
    succeeded(extract(ctx, log))
    write_jsonl(log, read_jsonl(log)[:4])
    succeeded(extract(ctx, log))
    assert sorted(r["user_id"] for r in read_jsonl(ctx.tmp / "out" / "memories.jsonl")) == [
        f"user-{n}" for n in range(4)
    ]


@case("stale")
def _filter_input_edited_keeping_size_and_mtime_runs_again(ctx):
    source = ctx.tmp / "task1"
    source.mkdir()
    for name in ("model_input.jsonl", "reference_output.jsonl"):
        (source / name).write_bytes((SAMPLE_TASK1 / name).read_bytes())
    output = ctx.tmp / "f" / "filtered.jsonl"
    succeeded(ctx.invoke("filter", "--input", source, "--output", output))
    first = read_jsonl(output)[0]
    value = first["memories"][0]["value"].encode()
    same_size_edit(source / "reference_output.jsonl", value, value[::-1])
    text = succeeded(ctx.invoke("filter", "--input", source, "--output", output))
    assert "unchanged since" not in text
    assert value[::-1].decode() in output.read_text()


@case("stale")
def _filter_output_edited_by_hand_is_written_again(ctx):
    output = ctx.tmp / "f" / "filtered.jsonl"
    succeeded(ctx.invoke("filter", "--input", SAMPLE_TASK1, "--output", output))
    good = output.read_bytes()
    output.write_bytes(good.replace(b'"user_id"', b'"user_ID"', 1))
    text = succeeded(ctx.invoke("filter", "--input", SAMPLE_TASK1, "--output", output))
    assert "unchanged since" not in text and output.read_bytes() == good


@case("stale")
def _rules_file_edited_runs_the_filter_again(ctx):
    from personaemp.rules import default_rules_text

    rules = ctx.tmp / "rules.toml"
    rules.write_text(default_rules_text(), encoding="utf-8")
    output = ctx.tmp / "f" / "filtered.jsonl"
    succeeded(ctx.invoke("filter", "--input", SAMPLE_TASK1, "--rules", rules, "--output", output))
    rules.write_bytes(rules.read_bytes() + b"\n# edited\n")
    text = succeeded(ctx.invoke("filter", "--input", SAMPLE_TASK1, "--rules", rules, "--output", output))
    assert "unchanged since" not in text


@case("stale")
def _personas_input_edited_runs_infer_persona_again(ctx):
    source = filtered(ctx)
    personas = ctx.tmp / "p" / "personas.jsonl"
    succeeded(ctx.invoke("infer-persona", "-i", source, "-o", personas, *ctx.llm()))
    rows = read_jsonl(source)
    write_jsonl(source, rows[:2])
    text = succeeded(ctx.invoke("infer-persona", "-i", source, "-o", personas, *ctx.llm()))
    assert "unchanged since" not in text
    assert [r["user_id"] for r in read_jsonl(personas)] == [r["user_id"] for r in rows[:2]]


@case("stale")
def _personas_input_same_size_edit_runs_again(ctx):
    source = filtered(ctx, users=2)
    personas = ctx.tmp / "p" / "personas.jsonl"
    succeeded(ctx.invoke("infer-persona", "-i", source, "-o", personas, *ctx.llm()))
    value = read_jsonl(source)[0]["memories"][0]["value"].encode()
    same_size_edit(source, value, value.upper() if value.upper() != value else value.lower())
    text = succeeded(ctx.invoke("infer-persona", "-i", source, "-o", personas, *ctx.llm()))
    assert "unchanged since" not in text


@case("stale")
def _split_input_edited_splits_again(ctx):
    source = filtered(ctx, users=4)
    personas = ctx.tmp / "p" / "personas.jsonl"
    queries = ctx.tmp / "p" / "queries.jsonl"
    succeeded(ctx.invoke("infer-persona", "-i", source, "-o", personas, *ctx.llm()))
    succeeded(ctx.invoke("gen-queries", "-i", personas, "-o", queries, *ctx.llm()))
    splits = ctx.tmp / "p" / "splits"
    succeeded(ctx.invoke("split", "-i", queries, "--out-dir", splits, "--no-ood"))
    rows = read_jsonl(queries)
    write_jsonl(queries, rows[:-1])
    text = succeeded(ctx.invoke("split", "-i", queries, "--out-dir", splits, "--no-ood"))
    assert "unchanged since" not in text
    users = {
        r["user_id"] for part in ("train", "test") for r in read_jsonl(splits / "random" / f"{part}.jsonl")
    }
    assert rows[-1]["user_id"] not in users and users


# --- shards ------------------------------------------------------------------------------------------


def _bad_shard(value: str, words: tuple = (), marks: tuple = ()):
    def run(ctx):
        log = six_users(ctx)
        out = ctx.tmp / "out"
        out.mkdir()
        (out / "memories.jsonl").write_bytes(EARLIER)
        refused(extract(ctx, log, "--shard", value), 2, "--shard", *words)
        assert (out / "memories.jsonl").read_bytes() == EARLIER
        assert not list(out.glob("memories.shard-*"))

    run.__name__ = "bad-shard-" + (value.replace("/", "-of-").replace(" ", "_") or "empty")
    case("shards", *marks)(run)


for _value in ("0/2", "3/2", "1/0", "0/0", "a/b", "1-2", "", "-1/2", "1/2/3", "2", "1.0/2"):
    _bad_shard(_value, ("1 <= I <= N", "e.g. 2/3"))


def sharded_run(ctx: Ctx, parts: int = 2) -> Path:
    log = six_users(ctx)
    for part in range(1, parts + 1):
        succeeded(extract(ctx, log, "--shard", f"{part}/{parts}"))
    return log


def merge(ctx: Ctx, log: Path, stage: str = "extract-memories"):
    return ctx.invoke("merge", stage, "-i", log, "-o", ctx.tmp / "out" / "memories.jsonl")


@case("shards")
def _merge_of_whole_shards_is_one_runs_rows(ctx):
    log = sharded_run(ctx, 3)
    succeeded(merge(ctx, log))
    rows = read_jsonl(ctx.tmp / "out" / "memories.jsonl")
    assert [r["user_id"] for r in rows] == [f"user-{n}" for n in range(6)]  # input order


@case("shards")
def _merge_with_a_missing_shard(ctx):
    log = six_users(ctx)
    succeeded(extract(ctx, log, "--shard", "1/2"))
    refused(merge(ctx, log), 2, "shard 2 of 2 not found", "run it, then merge")
    assert not (ctx.tmp / "out" / "memories.jsonl").exists()


@case("shards")
def _merge_with_a_torn_shard(ctx):
    log = sharded_run(ctx)
    shard = ctx.tmp / "out" / "memories.shard-1-of-2.jsonl"
    shard.write_bytes(shard.read_bytes()[:-25])
    refused(merge(ctx, log), 2, "in no shard", "run shard 1/2 again")


@case("shards")
def _merge_with_a_shard_from_an_older_log(ctx):
    log = sharded_run(ctx)
    rows = read_jsonl(log)
    rows[0]["messages"][0]["content"] += " (edited after the shards ran)"
    write_jsonl(log, rows)
    refused(merge(ctx, log), 2, "again")
    assert not (ctx.tmp / "out" / "memories.jsonl").exists()


@case("shards")
def _merge_with_a_user_in_two_shards(ctx):
    log = sharded_run(ctx)
    one, two = (ctx.tmp / "out" / f"memories.shard-{n}-of-2.jsonl" for n in (1, 2))
    two.write_bytes(two.read_bytes() + one.read_bytes().splitlines(keepends=True)[0])
    refused(merge(ctx, log), 2, "memories.shard-2-of-2.jsonl", "belongs to shard 1/2")


@case("shards")
def _merge_with_a_duplicated_row_in_one_shard(ctx):
    log = sharded_run(ctx)
    one = ctx.tmp / "out" / "memories.shard-1-of-2.jsonl"
    one.write_bytes(one.read_bytes() + one.read_bytes().splitlines(keepends=True)[0])  # the same line again
    succeeded(merge(ctx, log))
    assert [r["user_id"] for r in read_jsonl(ctx.tmp / "out" / "memories.jsonl")] == [
        f"user-{n}" for n in range(6)
    ]


@case("shards")
def _merge_with_shards_of_two_partitions(ctx):
    log = sharded_run(ctx, 2)
    succeeded(extract(ctx, log, "--shard", "1/3"))
    refused(merge(ctx, log), 2, "cut 2 and 3 ways", "delete the shard files")


@case("shards")
def _merge_without_shards(ctx):
    log = six_users(ctx)
    refused(merge(ctx, log), 2, "no shards of", "--shard I/N")


@case("shards")
def _merge_of_a_stage_that_has_no_shards(ctx):
    log = six_users(ctx)
    refused(merge(ctx, log, "split"), 2, "split")


@case("shards")
def _merge_of_a_user_not_in_the_input(ctx):
    log = sharded_run(ctx)
    write_jsonl(log, [r for r in read_jsonl(log) if r["user_id"] != "user-0"])
    refused(merge(ctx, log), 2, "user-0", "not in")


@case("shards")
def _a_shard_run_twice_sends_nothing_new(ctx):
    log = sharded_run(ctx)
    shard = ctx.tmp / "out" / "memories.shard-2-of-2.jsonl"
    before = shard.read_bytes()
    succeeded(extract(ctx, log, "--shard", "2/2"))
    assert shard.read_bytes() == before
    succeeded(merge(ctx, log))
    assert len(read_jsonl(ctx.tmp / "out" / "memories.jsonl")) == 6


# --- Label Studio import ------------------------------------------------------------------------------

LS_DATA = Path(__file__).parents[1] / "data" / "label_studio"


@pytest.fixture(scope="module")
def ls_queries(tmp_path_factory, sample_build):
    """The sample build's queries, exported as a Label Studio project once per module: (queries, ids).
    A copy of conftest's `sample_build` (the same run this fixture made again, ~10 s of CPU)."""
    processed = tmp_path_factory.mktemp("ls") / "processed"
    shutil.copytree(sample_build, processed)
    result = CliRunner().invoke(
        app,
        [
            "review",
            "--input",
            str(processed / "queries.jsonl"),
            "--size",
            "6",
            "--export-label-studio",
            str(processed.parent / "ls"),
        ],
    )
    assert result.exit_code == 0, result.output
    tasks = json.loads(next((processed.parent / "ls").glob("tasks*.json")).read_text())
    return processed / "queries.jsonl", [task["data"]["query_id"] for task in tasks]


def recorded(name: str, ids: list[str]) -> list[dict]:
    text = (LS_DATA / f"{name}.json").read_text()
    for n, query_id in enumerate(ids):
        text = text.replace(f'"Q{n}"', json.dumps(query_id))
    return json.loads(text)


@dataclass
class Import:
    """A Label Studio export made hostile: `content(ids)` its bytes (or a JSON value); the
    outcome: `code` and the words of the one line, or (0) the words on stderr and the count
    of labels that hold a value."""

    name: str
    content: Callable[[list[str]], Any]
    code: int = 0
    words: tuple = ()
    labels: int | None = None
    marks: tuple = ()


def _with(name: str, change: Callable[[list[dict]], Any]):
    def make(ids):
        content = recorded(name, ids)
        change(content)
        return content

    return make


def _results(content, extra):
    content[0]["annotations"][0]["result"].append(extra)


IMPORTS = [
    Import("whole-json-export", _with("json", lambda c: None), labels=None, words=("labels set",)),
    Import("whole-json-min-export", _with("json_min", lambda c: None), words=("labels set",)),
    Import(
        "unknown-control-counted",
        _with(
            "json",
            lambda c: _results(
                c,
                {
                    "from_name": "sentiment",
                    "to_name": "x",
                    "type": "choices",
                    "value": {"choices": ["Positive"]},
                },
            ),
        ),
        words=("1 result from controls this project does not have: sentiment — left out",),
    ),
    Import("every-annotation-empty", _with("json", lambda c: [t.update(annotations=[]) for t in c])),
    Import(
        "annotations-with-empty-results",
        _with("json", lambda c: [a.update(result=[]) for t in c for a in t["annotations"]]),
    ),
    Import(
        "cancelled-annotations",
        _with("json", lambda c: [a.update(was_cancelled=True) for t in c for a in t["annotations"]]),
    ),
    Import("not-json", lambda ids: b"{not json", code=2, words=("export.json", "not valid JSON")),
    Import(
        "cut-in-the-middle",
        lambda ids: json.dumps(recorded("json", ids)).encode()[:-300],
        code=2,
        words=("export.json", "not valid JSON"),
    ),
    Import("empty-file", lambda ids: b"", code=2, words=("export.json",)),
    Import(
        "an-object-not-a-list",
        lambda ids: {"tasks": recorded("json", ids)},
        code=2,
        words=("export.json", "not a Label Studio JSON or JSON-MIN export"),
    ),
    Import("a-list-of-strings", lambda ids: ["task"], code=2, words=("export.json", "entry 1", "is text")),
    Import(
        "annotations-null-reads-as-none",
        _with("json", lambda c: c[0].update(annotations=None)),
        words=("0 labels set and 6 removed",),
    ),
    Import(
        "choices-a-string",
        _with("json", lambda c: c[0]["annotations"][0]["result"][0]["value"].update(choices="accept")),
        code=2,
        words=("export.json", "choices"),
    ),
    Import(
        "from-name-a-list",
        _with("json", lambda c: c[0]["annotations"][0]["result"][0].update(from_name=["query"])),
        code=2,
        words=("export.json", "from_name is a list"),
    ),
    Import(
        "another-projects-export",
        lambda ids: [{"id": 1, "data": {"image": "cat.jpg"}, "annotations": []}],
        code=2,
        words=("export.json", "has no query_id"),
    ),
    Import(
        "another-builds-query-ids",
        _with("json", lambda c: c[0]["data"].update(query_id="someone-else-q9")),
        code=2,
        words=("export.json", "'someone-else-q9' is not in"),
    ),
    Import(
        "bom-before-the-export",
        lambda ids: BOM + json.dumps(recorded("json", ids)).encode(),
        words=("labels set",),
    ),
    Import(
        "nan-in-the-export",
        lambda ids: (
            json.dumps(recorded("json", ids)).replace('"lead_time": ', '"lead_time": NaN, "x": ', 1).encode()
        ),
        code=2,
        words=("export.json", "not valid JSON"),
    ),
]


def _import_case(item: Import):
    def run(ctx, ls):
        queries, ids = ls
        folder = ctx.tmp / "processed"
        folder.mkdir()
        mine = folder / "queries.jsonl"
        mine.write_bytes(queries.read_bytes())
        labels = folder / "labels.jsonl"
        # an earlier good import: a refused one must leave its labels as they are
        path = ctx.tmp / "export.json"
        path.write_text(json.dumps(recorded("json", ids)))
        succeeded(ctx.invoke("review", "--input", mine, "--import-label-studio", path))
        before = labels.read_bytes()
        content = item.content(ids)
        path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
        result = ctx.invoke("review", "--input", mine, "--import-label-studio", path, "--json")
        if item.code:
            refused(result, item.code, *item.words)
            assert labels.read_bytes() == before, "a refused import wrote labels"
            return
        text = succeeded(result)
        for words in item.words:
            assert words in text, (words, text)
        json.loads(result.stdout)  # --json: one JSON document on stdout

    run.__name__ = item.name
    run.uses_label_studio = True
    case("label-studio", *item.marks)(run)


for _item in IMPORTS:
    _import_case(_item)


# --- the results API ----------------------------------------------------------------------------------


def pe_filtered(ctx: Ctx):
    import personaemp as pe

    return pe.filter_users(str(SAMPLE_TASK1), ctx.tmp / "f" / "filtered.jsonl")


@case("results")
def _rows_of_an_output_deleted_since(ctx):
    result = pe_filtered(ctx)
    result.output.unlink()
    for read in (result.rows, result.to_polars, result.queries):
        with pytest.raises(FileNotFoundError, match="filter's output is not there"):
            read()


@case("results")
def _rows_of_an_output_emptied_since(ctx):
    result = pe_filtered(ctx)
    result.output.write_text("")
    assert result.rows() == []
    frame = result.to_polars()
    assert frame.height == 0 and {"user_id", "memories"} <= set(frame.columns)
    assert result.queries().height == 0 and "query" in result.queries().columns


@case("results")
def _rows_of_an_output_replaced_by_a_folder(ctx):
    result = pe_filtered(ctx)
    result.output.unlink()
    result.output.mkdir()
    with pytest.raises(Exception) as caught:
        result.rows()
    assert "filtered.jsonl" in str(caught.value) and "Traceback" not in str(caught.value)


@case("results")
def _rows_of_an_output_damaged_since(ctx):
    from personaemp.errors import RowError

    result = pe_filtered(ctx)
    lines = result.output.read_bytes().splitlines(keepends=True)
    result.output.write_bytes(lines[0] + b"{oops\n" + b"".join(lines[1:]))
    with pytest.raises(RowError, match=r"filtered.jsonl:2: "):
        result.rows()


@case("results")
def _a_file_name_it_did_not_write(ctx):
    result = pe_filtered(ctx)
    with pytest.raises(KeyError, match="filter wrote no 'random/test'; it wrote report"):
        result.rows("random/test")


@case("results")
def _a_split_name_misspelt(ctx):
    import personaemp as pe

    TRAITS = ("openness", "conscientiousness", "extraversion", "agreeableness", "neuroticism")  # noqa: N806

    queries = ctx.tmp / "queries.jsonl"
    levels = {trait: {"level": "medium", "evidence": [], "rationale": "x"} for trait in TRAITS}
    rows = [
        {
            "user_id": f"u{n}",
            "eligible": True,
            "big_five": levels,
            "memories": [],
            "queries": [
                {
                    "query_id": f"u{n}-q1",
                    "category": "ES",
                    "query": "I failed again.",
                    "checks": {"passed": True},
                    "memory_ids": [],
                    "situation": {"topic": "exam", "text": "They failed.", "memory_ids": []},
                }
            ],
        }
        for n in range(10)
    ]
    write_jsonl(queries, rows)
    result = pe.split_users(queries, ctx.tmp / "splits", ood=False)
    with pytest.raises(KeyError, match="'random/tset'; it wrote .*random/test"):
        result.rows("random/tset")
    assert len(result.rows("random/train")) + len(result.rows("random/test")) == 10


@case("results")
def _scores_of_a_stage_that_wrote_none(ctx):
    result = pe_filtered(ctx)
    with pytest.raises(KeyError, match="filter wrote no 'scores'"):
        result.scores()


@case("results")
def _rows_of_an_output_that_is_a_folder(ctx):
    from personaemp.results import StageResult

    result = StageResult("push", ctx.tmp / "dataset", files={"card": ctx.tmp / "dataset" / "README.md"})
    with pytest.raises(ValueError, match="push's output .* is not a JSONL file"):
        result.rows()


@case("results")
def _an_option_misspelt(ctx):
    import personaemp as pe

    with pytest.raises(TypeError, match="filter: unknown option 'inptu'; the options are"):
        pe.filter_users(inptu=str(SAMPLE_TASK1))


@case("results")
def _an_input_that_is_not_there(ctx):
    import personaemp as pe

    with pytest.raises(pe.InputError, match="nowhere.jsonl"):
        pe.infer_personas(
            ctx.tmp / "nowhere.jsonl",
            ctx.tmp / "p.jsonl",
            base_url=[ctx.base_url],
            model="fake",
            work_dir=ctx.tmp / "work",
        )
    assert not (ctx.tmp / "p.jsonl").exists()


@case("results")
def _a_stage_that_failed_every_unit_reads_empty_with_columns(ctx):
    import personaemp as pe

    source = filtered(ctx, users=2)
    with FakeOpenAI(responder=lambda body, n: reply("no JSON today")) as bad:
        result = pe.infer_personas(
            source,
            ctx.tmp / "p" / "personas.jsonl",
            base_url=[bad.base_url],
            model="fake",
            work_dir=ctx.tmp / "work",
            max_reasks=0,
        )
    assert result.failed_entirely() and result.rows() == []
    assert {"user_id", "big_five", "openness"} <= set(result.to_polars().columns)


# --- config --------------------------------------------------------------------------------------------


def config(ctx: Ctx, text: str | bytes) -> Path:
    path = ctx.tmp / "c.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def filter_with(ctx: Ctx, text: str | bytes, *flags, env=None):
    """`filter --config` with an existing output that a refused run must leave alone."""
    output = ctx.tmp / "f" / "filtered.jsonl"
    output.parent.mkdir(exist_ok=True)
    if not output.exists():
        output.write_bytes(EARLIER)
    result = ctx.invoke(
        "filter", "--config", config(ctx, text), "--input", SAMPLE_TASK1, "-o", output, *flags, env=env
    )
    return result, output


def extract_with(ctx: Ctx, text: str | bytes, *flags, env=None):
    """`extract-memories --config` with an existing output that a refused run must leave alone."""
    log = six_users(ctx)
    output = ctx.tmp / "out" / "memories.jsonl"
    output.parent.mkdir(exist_ok=True)
    output.write_bytes(EARLIER)
    result = ctx.invoke(
        "extract-memories",
        "--config",
        config(ctx, text),
        "-i",
        log,
        "-o",
        output,
        "--base-url",
        ctx.base_url,
        "--work-dir",
        ctx.tmp / "work",
        *flags,
        env=env,
    )
    return result, output


def _config_refused(name: str, text: str | bytes, *words, flags=(), env=None, marks=(), command=filter_with):
    def run(ctx):
        result, output = command(ctx, text, *flags, env=env)
        line = refused(result, 2, *words)
        assert output.read_bytes() == EARLIER
        assert "hunter2" not in line

    run.__name__ = name
    case("config", *marks)(run)


_config_refused(
    "unknown-section", "[filtr]\nkeep_turns = 'all'\n", "c.toml", "[filtr] is not a known section"
)
_config_refused("unknown-key", "[filter]\nturn = 'all'\n", "c.toml", "filter.turn", "is not a known key")
_config_refused(
    "secret-in-llm", "[llm]\napi_key = 'hunter2'\n", "c.toml", "secrets do not belong", "llm.api_key"
)
_config_refused(
    "secret-nested", "[llm.steps.check]\naccess_token = 'hunter2'\n", "c.toml", "llm.steps.check.access_token"
)
_config_refused("secret-in-push", "[push]\nhf_token = 'hunter2'\n", "c.toml", "push.hf_token", "HF_TOKEN")
_config_refused("password-key", "[llm]\nPassword = 'hunter2'\n", "c.toml", "secrets do not belong")
_config_refused("not-toml", "[filter\nturns = 1\n", "c.toml", "not valid TOML")
_config_refused("duplicate-key", "[llm]\nmodel = 'a'\nmodel = 'b'\n", "c.toml", "not valid TOML")
_config_refused("section-not-a-table", "filter = 3\n", "c.toml", "filter must be a table")
_config_refused("bom-then-unknown-section", BOM + b"[nope]\n", "c.toml", "[nope] is not a known section")
_config_refused("utf16-config", "\ufeff[filter]\n".encode("utf-16"), "c.toml", "not valid UTF-8")
_config_refused("bad-type", "[llm]\nconcurrency = 'many'\n", "c.toml: llm.concurrency", command=extract_with)
_config_refused("bad-value", "[llm]\nconcurrency = 0\n", "c.toml: llm.concurrency", command=extract_with)
_config_refused("bad-turns", "[filter]\nturns = 'some'\n", "c.toml: filter.turns")
_config_refused(
    "bad-max-sessions", "[extract]\nmax_sessions = -5\n", "c.toml: extract.max_sessions", command=extract_with
)
_config_refused(
    "env-bad-concurrency",
    "",
    "PERSONAEMP_CONCURRENCY",
    env={"PERSONAEMP_CONCURRENCY": "lots"},
    command=extract_with,
)
_config_refused(
    "env-bad-executor", "", "PERSONAEMP_EXECUTOR", env={"PERSONAEMP_EXECUTOR": "gpu"}, command=extract_with
)


@case("config")
def _config_with_a_bom_is_read(ctx):
    result, output = filter_with(ctx, BOM + b"[filter]\nturns = 'all'\nforce = true\n")
    succeeded(result)
    assert len(read_jsonl(output)) == 16


@case("config")
def _config_that_is_a_folder(ctx):
    (ctx.tmp / "c.d").mkdir()
    refused(ctx.invoke("filter", "--config", ctx.tmp / "c.d", "-o", ctx.tmp / "f.jsonl"), 2, "c.d", "folder")


@case("config")
def _config_that_is_not_there(ctx):
    refused(ctx.invoke("filter", "--config", ctx.tmp / "none.toml"), 2, "none.toml", "no such config file")


@case("config")
def _a_flag_wins_over_a_bad_env_var(ctx):
    log = six_users(ctx)
    result = ctx.invoke(
        "extract-memories",
        "-i",
        log,
        "-o",
        ctx.tmp / "out" / "memories.jsonl",
        *ctx.llm(),
        "--concurrency",
        "2",
        env={"PERSONAEMP_CONCURRENCY": "lots"},
    )
    succeeded(result)


@case("config")
def _env_input_that_is_not_there(ctx):
    result = ctx.invoke("filter", "-o", ctx.tmp / "f.jsonl", env={"PERSONAEMP_INPUT": str(ctx.tmp / "gone")})
    refused(result, 2, "gone")


def _set_refused(name: str, item: str, *words):
    def run(ctx):
        refused(
            ctx.invoke("run", "--set", item, "--set", f"paths.processed={ctx.tmp / 'processed'}"), 2, *words
        )
        assert not (ctx.tmp / "processed").exists()

    run.__name__ = name
    case("config")(run)


_set_refused("set-without-equals", "persona.limit", "--set takes SECTION.KEY=VALUE")
_set_refused("set-unknown-section", "personas.limit=2", "[personas] is not a known section")
_set_refused("set-unknown-key", "persona.limt=2", "[persona] has no key 'limt'")
_set_refused("set-a-table", "llm.steps=check", "llm.steps is a table")
_set_refused("set-bad-value", "persona.limit=-3", "--set persona.limit")
_set_refused("set-bad-number", "split.test_size=lots", "--set split.test_size")
_set_refused(
    "set-a-secret-key-name",
    "llm.api_key=hunter2",
    "llm.api_key=[redacted]: secrets do not belong on the command line",
)


@case("config")
def _run_config_with_a_bom_and_a_set(ctx):
    text = BOM + f'[paths]\ninput = "{SAMPLE_TASK1}"\nprocessed = "{ctx.tmp / "processed"}"\n'.encode()
    text += b'[persona]\nlimit = 2\n[split]\nood = false\n[llm]\nmodel = "fake"\n'
    result = ctx.invoke(
        "run",
        "--config",
        config(ctx, text),
        "--set",
        f"llm.base_url={ctx.base_url}",
        "--set",
        f"llm.work_dir={ctx.tmp / 'work'}",
    )
    succeeded(result)
    assert len(read_jsonl(ctx.tmp / "processed" / "personas.jsonl")) == 2


# --- secrets: no key in any file or line (the replay scans every file and output after each case) ------


def secret_run(ctx: Ctx, base_url: str, env_key: str = KEY, *flags):
    source = filtered(ctx, users=2)
    return ctx.invoke(
        "infer-persona",
        "-i",
        source,
        "-o",
        ctx.tmp / "p" / "personas.jsonl",
        "--base-url",
        base_url,
        "--model",
        "fake",
        "--work-dir",
        ctx.tmp / "work",
        *flags,
        env={"OPENAI_API_KEY": env_key},
    )


@case("secrets")
def _key_as_the_urls_password(ctx):
    url = ctx.base_url.replace("http://", f"http://tok:{KEY}@")
    succeeded(secret_run(ctx, url, "sk-another-0000", "--json"))


@case("secrets")
def _key_as_the_urls_user(ctx):
    succeeded(secret_run(ctx, ctx.base_url.replace("http://", f"http://{KEY}@"), "sk-another-0000"))


@case("secrets")
def _key_in_the_urls_query(ctx):
    # the path goes after the query: the fake server has no such route (one line, the key masked)
    refused(secret_run(ctx, f"{ctx.base_url}?api-key={KEY}", "sk-another-0000"), 1, "--base-url")


@case("secrets")
def _endpoint_echoing_the_key(ctx):
    with FakeOpenAI(echo_key=True) as echo:
        succeeded(secret_run(ctx, echo.base_url))
    assert echo.chat_requests[0].headers["authorization"] == f"Bearer {KEY}"


@case("secrets")
def _endpoint_echoing_the_key_upper_cased(ctx):
    with FakeOpenAI(echo_key="upper") as echo:
        succeeded(secret_run(ctx, echo.base_url))


@case("secrets")
def _endpoint_refusing_the_key_and_echoing_it(ctx):
    with FakeOpenAI(require_key="sk-the-right-one", echo_key="percent") as echo:
        refused(secret_run(ctx, echo.base_url), 1, "refused the API key", "OPENAI_API_KEY")


@case("secrets")
def _key_in_the_url_of_a_dead_endpoint(ctx):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    refused(
        secret_run(ctx, f"http://{KEY}@127.0.0.1:{port}/v1", "sk-x", "--max-retries", "0"),
        1,
        "[redacted]@127.0.0.1",
    )


@case("secrets")
def _key_in_the_url_given_to_run_set(ctx):
    url = ctx.base_url.replace("http://", f"http://tok:{KEY}@")
    text = f'[paths]\ninput = "{SAMPLE_TASK1}"\nprocessed = "{ctx.tmp / "processed"}"\n[persona]\nlimit = 2\n'
    text += '[split]\nood = false\n[llm]\nmodel = "fake"\n'
    result = ctx.invoke(
        "run",
        "--config",
        config(ctx, text),
        "--set",
        f"llm.base_url={url}",
        "--set",
        f"llm.work_dir={ctx.tmp / 'work'}",
        "--json",
        env={"OPENAI_API_KEY": "sk-y"},
    )
    succeeded(result)


@case("secrets")
def _key_in_the_url_in_a_config_file(ctx):
    log = six_users(ctx)
    url = ctx.base_url.replace("http://", f"http://tok:{KEY}@")
    path = config(ctx, f'[llm]\nbase_url = ["{url}"]\nmodel = "fake"\n')
    result = ctx.invoke(
        "extract-memories",
        "--config",
        path,
        "-i",
        log,
        "-o",
        ctx.tmp / "out" / "memories.jsonl",
        "--work-dir",
        ctx.tmp / "work",
        env={"OPENAI_API_KEY": "sk-z"},
    )
    succeeded(result)
    path.unlink()  # the user's own file holds it; nothing the run wrote may


@case("secrets")
def _key_in_the_url_of_an_estimate(ctx):
    log = six_users(ctx)
    url = ctx.base_url.replace("http://", f"http://tok:{KEY}@")
    result = ctx.invoke(
        "extract-memories",
        "-i",
        log,
        "-o",
        ctx.tmp / "out" / "memories.jsonl",
        "--base-url",
        url,
        "--model",
        "fake",
        "--work-dir",
        ctx.tmp / "work",
        "--estimate",
        "--json",
    )
    succeeded(result)
    assert not (ctx.tmp / "out" / "memories.jsonl").exists()


# --- the replay ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [pytest.param(name, marks=c.marks, id=name) for name, c in CASES.items()])
def test_adversarial_case(ctx, name, request):
    ctx_case = CASES[name]
    if getattr(ctx_case.run, "uses_label_studio", False):
        ctx_case.run(ctx, request.getfixturevalue("ls_queries"))
    else:
        ctx_case.run(ctx)
    forms = key_forms()
    for text in ctx.outputs:
        assert not any(form in text.lower() for form in forms), "the key was printed"
    for path in ctx.tmp.rglob("*"):
        if path.is_file():
            content = path.read_bytes().lower()
            assert not any(form.encode() in content for form in forms), f"the key is in {path}"


def test_the_replay_has_at_least_137_cases():
    assert len(CASES) >= 137, len(CASES)
