"""Conversation logs in the four shapes extract-memories reads, made from real dialogues.

The sessions are those of the shipped AlpsBench sample (data/raw/alpsbench_sample/task1,
WildChat dialogues), regrouped: sample rows `rows` are dealt to `users` people in turn,
each session gets a timestamp, and every file lists a person's sessions newest first, so
a reader that keeps file order instead of time order is caught. `expected_users` says what
the data says: each user id and its session ids in time order.
"""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE_INPUT = REPO / "data" / "raw" / "alpsbench_sample" / "task1" / "model_input.jsonl"
SHAPES = ("wildchat", "messages", "sharegpt", "table")


def sample_sessions(rows: range) -> list[dict]:
    """The sessions of sample rows `rows`: {session_id, turns: [{role, text}]}."""
    lines = SAMPLE_INPUT.read_text(encoding="utf-8").splitlines()
    sessions = []
    for number in rows:
        row = json.loads(lines[number])
        for session in row["input"]["sessions"]:
            turns = [{"role": t["role"], "text": t["text"]} for t in session["turns"]]
            sessions.append({"session_id": f"{session['session_id']}-{number}", "turns": turns})
    return sessions


def regroup(rows: range, users: int, prefix: str = "person") -> list[dict]:
    """Sessions dealt to `users` people: [{user, session_id, timestamp, turns}], each person's
    sessions newest first (the order the files are written in)."""
    start = datetime(2023, 4, 1, tzinfo=UTC)
    dealt = []
    for number, session in enumerate(sample_sessions(rows)):
        when = start + timedelta(days=number)
        dealt.append({**session, "user": f"{prefix}-{number % users}", "timestamp": when.isoformat()})
    return sorted(dealt, key=lambda s: (s["user"], s["timestamp"]), reverse=True)


def expected_users(dealt: list[dict]) -> dict[str, list[str]]:
    """user -> its session ids in time order."""
    users: dict[str, list[tuple[str, str]]] = {}
    for session in dealt:
        users.setdefault(session["user"], []).append((session["timestamp"], session["session_id"]))
    return {user: [sid for _, sid in sorted(found)] for user, found in users.items()}


def write_shape(shape: str, dealt: list[dict], folder: Path, *, parquet: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if shape == "wildchat":
        rows = [
            {
                "conversation_hash": s["session_id"], "hashed_ip": s["user"], "timestamp": s["timestamp"],
                "model": "gpt-4-0314", "turn": len(s["turns"]) // 2, "language": "English", "toxic": False,
                "conversation": [
                    {"role": t["role"], "content": t["text"], "turn_identifier": n, "language": "English",
                     "toxic": False, "redacted": False}
                    for n, t in enumerate(s["turns"])
                ],
            }
            for s in dealt
        ]  # fmt: skip
        if parquet:
            import polars as pl

            frame = pl.DataFrame(rows).with_columns(pl.col("timestamp").str.to_datetime(time_zone="UTC"))
            path = folder / "wildchat.parquet"
            frame.write_parquet(path)
            return path
        return _jsonl(folder / "wildchat.jsonl", rows)
    if shape == "messages":
        rows = [
            {
                "user_id": s["user"], "conversation_id": s["session_id"], "timestamp": s["timestamp"],
                "messages": [{"role": "system", "content": "You are a helpful assistant."}]
                + [{"role": t["role"], "content": t["text"]} for t in s["turns"]],
            }
            for s in dealt
        ]  # fmt: skip
        return _jsonl(folder / "messages.jsonl", rows)
    if shape == "sharegpt":
        rows = [
            {
                "id": s["session_id"], "user": s["user"], "timestamp": s["timestamp"],
                "conversations": [
                    {"from": "human" if t["role"] == "user" else "gpt", "value": t["text"]}
                    for t in s["turns"]
                ],
            }
            for s in dealt
        ]  # fmt: skip
        path = folder / "sharegpt.json"
        path.write_text(json.dumps(rows, ensure_ascii=False, indent=1), encoding="utf-8")
        return path
    if shape == "table":
        path = folder / "turns.csv"
        with path.open("w", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["speaker_id", "chat", "position", "author", "body", "sent_at", "model"])
            # Sessions of one person newest first, and turns within one backwards: the order
            # column, not the file, says the order.
            for s in dealt:
                for n in reversed(range(len(s["turns"]))):
                    t = s["turns"][n]
                    writer.writerow(
                        [s["user"], s["session_id"], n, t["role"], t["text"], s["timestamp"], "x"]
                    )
        return path
    raise ValueError(shape)


TABLE_COLUMNS = ["--user-column", "speaker_id", "--session-column", "chat", "--order-column", "position",
                 "--role-column", "author", "--text-column", "body", "--time-column", "sent_at"]  # fmt: skip


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path
