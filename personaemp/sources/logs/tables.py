"""Conversation logs as tables (CSV, TSV, parquet) and WildChat parquet, read with polars:
lazily, sorted into a temporary parquet file and streamed back in batches."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy
from personaemp.sources.logs.conversations import _TIME_HINT, LogUser, iso_instant, read_instant
from personaemp.sources.logs.jsonl import _distinct

# --- tables and WildChat parquet: polars ---------------------------------------------------------

TABLE_COLUMNS = ("user", "session", "order", "role", "text")
# The column names a table is read with unless mapped (options.ExtractOptions repeats them).
DEFAULT_COLUMNS = {
    "user": "user_id",
    "session": "session_id",
    "order": "turn",
    "role": "role",
    "text": "text",
}
BATCH_ROWS = 4096


def _polars_error(path: Path, exc: Exception) -> InputError:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "utf-8" in text.lower() or "utf8" in text.lower():
        line = _first_bad_line(path)
        where = f"{path}:{line}" if line else str(path)
        return InputError(f"{where}: not valid UTF-8", "re-encode the file as UTF-8 (iconv -t UTF-8)")
    return InputError(f"{path}: cannot read the table ({text})", "check the file and the column options")


def _first_bad_line(path: Path) -> int | None:
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return lineno
    return None


def _scan(path: Path):
    import polars as pl

    if path.suffix == ".parquet":
        return pl.scan_parquet(path)
    separator = "\t" if path.suffix == ".tsv" else ","
    return pl.scan_csv(path, infer_schema=False, separator=separator, encoding="utf8")


def _refuse_ragged_rows(path: Path) -> None:
    """A CSV row with more fields than the header (an unquoted comma in a message): polars
    reads only the columns asked for, and would cut that text at the comma without a word."""
    import csv

    import polars as pl

    if path.suffix == ".parquet":
        return
    try:  # every column read, in one streamed pass: polars stops at a ragged row
        _scan(path).select(pl.all().null_count()).collect(engine="streaming")
    except pl.exceptions.ComputeError as error:
        if "more fields" not in str(error):
            return  # (bad UTF-8...: the read that follows names it)
        separator = "\t" if path.suffix == ".tsv" else ","
        with path.open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(handle, delimiter=separator)
            width = len(next(reader))
            line = next((reader.line_num for row in reader if len(row) > width), None)
        where = f"{path}:{line}" if line else str(path)
        raise InputError(
            f"{where}: more fields than the header's {width} (a separator inside a text?)",
            'quote the fields that hold one ("I feel bad, really")',
        ) from None


def table_columns(path: Path) -> list[str]:
    import polars as pl

    try:
        return list(_scan(path).collect_schema().names())
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise _polars_error(path, exc) from None


def _instants(column, time_format: str | None):
    """The polars expression of `read_instant` over a column (null where it cannot be read: the
    reader names those rows)."""
    import polars as pl

    def read(values):
        found: dict[Any, int | None] = {}  # the rows of a session mostly share their time
        for value in values.to_list():
            if value not in found:
                try:
                    found[value] = read_instant(value, time_format)
                except ValueError:
                    found[value] = None
        return pl.Series([found[value] for value in values.to_list()], dtype=pl.Int64)

    return column.map_batches(read, return_dtype=pl.Int64, is_elementwise=True)


def _time_problem(row: dict, time_format: str | None) -> str | None:
    """Why a row's time cannot be read; None when it has none or it was read."""
    if row["instant"] is not None or row["time"] is None or not row["time"].strip():
        return None
    try:
        read_instant(row["time"], time_format)
    except ValueError as exc:
        return str(exc)
    return f"time {row['time']!r} cannot be read: {_TIME_HINT}"


def read_table(
    path: Path, policy: ErrorPolicy, columns: dict[str, str | None], time_format: str | None = None
) -> Iterator[LogUser]:
    """A table of turns: `columns` maps user, session, order, role, text (and time, optional)
    to the file's column names. One row per turn; users in order of first row, sessions in
    time order (`read_instant` of their earliest row; those without a time first, in file order).
    A row that repeats an earlier one of its session (order, role and text) is left out."""
    import polars as pl

    present = table_columns(path)
    columns = {**DEFAULT_COLUMNS, **columns}
    wanted = {name: columns.get(name) for name in (*TABLE_COLUMNS, "time")}
    for name, column in wanted.items():
        if column is not None and column not in present:
            flag = f"--{name}-column"
            raise InputError(f"{path}: no column {column!r} ({flag})", f"the file has {', '.join(present)}")
    for name in ("user", "order", "role", "text"):
        if wanted[name] is None:
            raise InputError(f"{path}: a table needs a {name} column", f"name it with --{name}-column")
    _refuse_ragged_rows(path)
    line_offset = 2 if path.suffix != ".parquet" else 1  # CSV: the header is line 1
    lf = _scan(path).with_row_index("_row")
    session = pl.col(wanted["session"]).cast(pl.String) if wanted["session"] else pl.lit("s1")
    time = pl.col(wanted["time"]) if wanted["time"] else pl.lit(None, pl.String)
    lf = lf.select(
        pl.col(wanted["user"]).cast(pl.String).alias("user"),
        session.alias("session"),
        pl.col(wanted["order"]).cast(pl.Float64, strict=False).alias("order"),
        pl.col(wanted["order"]).cast(pl.String).alias("order_text"),
        pl.col(wanted["role"]).cast(pl.String).alias("role"),
        pl.col(wanted["text"]).cast(pl.String).alias("text"),
        time.cast(pl.String).alias("time"),
        _instants(time, time_format).alias("instant"),
        pl.col("_row"),
    )
    lf = lf.with_columns(
        pl.col("_row").min().over("user").alias("_u"),
        pl.col("instant").min().over("user", "session").alias("_t"),  # sessions in time order
        pl.col("_row").min().over("user", "session").alias("_s"),  # ... or in file order
    ).sort(["_u", "_t", "_s", "order", "_row"], nulls_last=[False, False, False, True, False])

    def turns(batch) -> Iterator[tuple]:
        for row in batch:
            location = f"{path}:{row['_row'] + line_offset}"
            if row["user"] in (None, ""):
                policy.handle(RowError(location, f"no user id in column {wanted['user']!r}"))
                continue
            if row["order"] is None:
                policy.handle(
                    RowError(
                        location, f"turn order {row['order_text']!r} is not a number ({wanted['order']})"
                    )
                )
                continue
            problem = _time_problem(row, time_format)
            if problem:
                policy.handle(RowError(location, problem))
                continue
            yield (
                row["user"], row["session"], iso_instant(row["_t"]), row["role"], row["text"], location,
                None, (row["order"], row["role"], row["text"]),
            )  # fmt: skip

    yield from _grouped(path, "table", lf, turns, policy)


def read_wildchat_parquet(path: Path, policy: ErrorPolicy, options: dict) -> Iterator[LogUser]:
    """WildChat's parquet files: one conversation per row, users by `hashed_ip`, in time order."""
    import polars as pl

    present = table_columns(path)
    user = options.get("user_field") or "hashed_ip"
    time_format = options.get("time_format")
    missing = [c for c in (user, "conversation", "conversation_hash") if c not in present]
    if missing:
        raise InputError(f"{path}: no column {missing[0]!r}", "pass --format table for a table of turns")
    time = pl.col("timestamp") if "timestamp" in present else pl.lit(None, pl.String)
    lf = (
        _scan(path)
        .with_row_index("_row")
        .select(
            pl.col(user).cast(pl.String).alias("user"),
            pl.col("conversation_hash").cast(pl.String).alias("session"),
            time.cast(pl.String).alias("time"),
            _instants(time, time_format).alias("instant"),
            pl.col("conversation")
            .list.eval(pl.struct(pl.element().struct.field("role"), pl.element().struct.field("content")))
            .alias("conversation"),
            pl.col("_row"),
        )
        .with_columns(pl.col("_row").min().over("user").alias("_u"))
        .sort(["_u", "instant", "_row"], nulls_last=[False, False, False])
    )

    def turns(batch) -> Iterator[tuple]:
        for row in batch:
            location = f"{path}:{row['_row'] + 1}"
            if row["user"] in (None, ""):
                policy.handle(RowError(location, f"no {user!r} (the WildChat user)"))
                continue
            problem = _time_problem(row, time_format)
            if problem:
                policy.handle(RowError(location, problem))
                continue
            head = (row["user"], row["session"], iso_instant(row["instant"]))
            for turn in row["conversation"] or [{"role": None, "content": None}]:
                yield *head, turn["role"], turn["content"], location, row["_row"], None

    yield from _grouped(path, "wildchat", lf, turns, policy)


def _grouped(path: Path, fmt: str, lf, turns, policy: ErrorPolicy) -> Iterator[LogUser]:
    """Sink the sorted frame to a temporary parquet file, stream it back in batches and
    group consecutive rows into users and sessions."""
    import polars as pl

    with tempfile.TemporaryDirectory(prefix="personaemp-log-") as folder:
        sorted_path = Path(folder) / "sorted.parquet"
        try:
            lf.sink_parquet(sorted_path)
        except (pl.exceptions.PolarsError, OSError) as exc:
            raise _polars_error(path, exc) from None
        current: str | None = None
        user_rows: list[tuple] = []
        for batch in pl.scan_parquet(sorted_path).collect_batches(chunk_size=BATCH_ROWS):
            for item in turns(batch.iter_rows(named=True)):
                if current is not None and item[0] != current:
                    found = _table_user(fmt, path, user_rows, policy)
                    if found is not None:
                        yield found
                    user_rows = []
                current = item[0]
                user_rows.append(item)
        if user_rows:
            found = _table_user(fmt, path, user_rows, policy)
            if found is not None:
                yield found


def _table_user(fmt: str, path: Path, rows: list[tuple], policy: ErrorPolicy) -> LogUser | None:
    """One user from its rows (user, session, timestamp, role, text, location, conversation,
    turn key), in order: a conversation is a session's rows (a table), or one source row
    (WildChat: `conversation` is its row number); a turn key seen before in its session is a
    repeated row, left out."""
    counts: dict[str, int] = {}
    conversations: dict[tuple, tuple[str, str | None, str, list]] = {}
    seen: set[tuple] = set()
    for _, session, stamp, role, text, location, part, turn_key in rows:
        if turn_key is not None:
            if (session, turn_key) in seen:
                counts["duplicate_rows"] = counts.get("duplicate_rows", 0) + 1
                continue
            seen.add((session, turn_key))
        if (session, part) not in conversations:
            conversations[(session, part)] = (session, stamp, location, [])
        if role is not None or text is not None:
            conversations[(session, part)][3].append((role, text))
    read = [(session, pairs, stamp, location) for session, stamp, location, pairs in conversations.values()]
    built = _distinct(read, counts, policy)
    if not built:
        return None
    return LogUser(rows[0][0], rows[0][5], fmt, str(path), built, True, counts)
