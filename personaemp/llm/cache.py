"""The reply cache: SQLite, keyed by a hash of the exact request, raw replies only.

Parsed records live in the stage outputs; keeping raw replies apart means a changed
parser re-reads the cache instead of paying for LLM calls again. Only replies that
passed validation answer a later request: the others are kept for the record, so a
retry sends a fresh request instead of replaying the same bad reply.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from personaemp.errors import PersonaempError
from personaemp.io import set_aside

SCHEMA = """
CREATE TABLE IF NOT EXISTS replies (
    key TEXT PRIMARY KEY,
    step TEXT NOT NULL,
    request TEXT NOT NULL,
    reply TEXT NOT NULL,
    created_at REAL NOT NULL,
    valid INTEGER NOT NULL DEFAULT 0
)
"""


def request_key(request: dict[str, Any], sample: int | str) -> str:
    """sha256 of the canonical request: model, messages, sampling, response format, sample.

    Runtime knobs (endpoint, timeout, concurrency) are not in `request`, so they never
    change the key.
    """
    canonical = json.dumps({"request": request, "sample": sample}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class ReplyCache:
    """Raw replies by request key. WAL mode and a busy timeout let parallel runs share it."""

    def __init__(self, path: Path, read: bool = True, write: bool = True):
        self.path, self.read, self.write = path, read, write
        if not write:  # --estimate: read what is there, change nothing (not even the journal mode)
            # immutable: not even the -shm file a WAL reader makes (a writer elsewhere is not seen)
            self._db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True, check_same_thread=False)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(replies)")}
            self.read = read and "valid" in columns
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._open()
        except sqlite3.DatabaseError as exc:
            if _damaged(exc):  # cut or overwritten: keep it for the user, start a new one
                self._db.close()
                for extra in ("-wal", "-shm"):
                    Path(f"{path}{extra}").unlink(missing_ok=True)
                set_aside(path, f"the reply cache is damaged ({exc})")
                self._open()
            else:
                raise self._error(exc) from None

    def _open(self) -> None:
        self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=30000")
        self._db.execute(SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(replies)")}
        if "valid" not in columns:  # a cache from before validity was recorded: serve none of it
            self._db.execute("ALTER TABLE replies ADD COLUMN valid INTEGER NOT NULL DEFAULT 0")
        self._db.execute("SELECT COUNT(*) FROM replies").fetchone()  # reads the table's pages

    def _error(self, exc: sqlite3.Error) -> PersonaempError:
        """A database error as one line naming the cache file."""
        text = str(exc)
        if "full" in text or "No space" in text:
            return PersonaempError(
                f"{self.path}: no space left on the device (the reply cache could not be written)",
                "free some space and run it again: finished rows are kept and it resumes",
            )
        if _damaged(exc):
            return PersonaempError(
                f"{self.path}: the reply cache is damaged ({text})",
                "run it again: the damaged cache is kept aside and a new one is started",
            )
        return PersonaempError(f"{self.path}: the reply cache failed ({text})", "run it again")

    def _execute(self, sql: str, parameters: tuple = ()) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, parameters)
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None

    def get(self, key: str, any_verdict: bool = False) -> dict[str, Any] | None:
        """The reply to this request, if it passed validation (`any_verdict`: whatever it got)."""
        if not self.read:
            return None
        valid = "" if any_verdict else " AND valid = 1"
        row = self._execute(f"SELECT reply FROM replies WHERE key = ?{valid}", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, step: str, request: dict[str, Any], reply: dict[str, Any], valid: bool) -> None:
        if not self.write:
            return
        self._execute(
            "INSERT OR REPLACE INTO replies (key, step, request, reply, created_at, valid) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (key, step, json.dumps(request, ensure_ascii=False), json.dumps(reply), time.time(), int(valid)),
        )

    def reject(self, key: str) -> None:
        """A reply the stage refused after it was stored (a rule the schema cannot say): kept
        for the record, never served again, so a retry asks afresh."""
        if self.write:
            self._execute("UPDATE replies SET valid = 0 WHERE key = ?", (key,))

    def has(self, key: str) -> bool:
        """Whether the cache holds any reply (valid or not) for this request."""
        return self._execute("SELECT 1 FROM replies WHERE key = ?", (key,)).fetchone() is not None

    def replies_of(self, step: str, limit: int) -> list[tuple[str, str]]:
        """(request, reply) JSON of up to `limit` valid replies of one step (for --estimate)."""
        return self._db.execute(
            "SELECT request, reply FROM replies WHERE step = ? AND valid = 1 LIMIT ?", (step, limit)
        ).fetchall()

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM replies").fetchone()[0]

    def close(self) -> None:
        self._db.close()


def _damaged(exc: sqlite3.DatabaseError) -> bool:
    """Whether SQLite says the file is not (or no longer) a database, as opposed to busy or full."""
    text = str(exc)
    return "malformed" in text or "not a database" in text
