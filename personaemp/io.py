"""File I/O: streaming JSONL/JSON readers that name file:line on errors, and atomic writes."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgspec
from pydantic import ValidationError

from personaemp.errors import InputError, RowError, first_problem, some


class ErrorPolicy:
    """What to do with a bad input row: stop the run (`fail`) or count it and go on (`skip`)."""

    def __init__(self, mode: str = "fail"):
        if mode not in ("fail", "skip"):
            raise InputError(f"--on-error must be 'fail' or 'skip', not {mode!r}")
        self.mode = mode
        self.skipped: list[str] = []

    def handle(self, error: RowError) -> None:
        if self.mode == "fail":
            raise error
        self.skipped.append(f"{error.location}: {error.reason}")


def _check_readable(path: Path) -> None:
    if not path.exists():
        raise InputError(f"{path}: no such file", "check the path")
    if not path.is_file():
        raise InputError(f"{path}: not a file")


def _json_error(exc: Exception, raw: bytes | None = None) -> str:
    text = str(exc)
    if isinstance(exc, UnicodeDecodeError) or "utf-8" in text.lower():
        return "not valid UTF-8"
    if raw is not None:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return "not valid UTF-8"
    return f"not valid JSON ({text})"


_GENERIC = msgspec.json.Decoder()
BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark


def iter_jsonl(
    path: Path, policy: ErrorPolicy, decoder: msgspec.json.Decoder | None = None
) -> Iterator[tuple[int, int, Any]]:
    """Yield (line number, byte offset, decoded value) for each non-blank line.

    Decodes raw bytes with msgspec rather than through jsonlines.Reader: on real AlpsBench
    dialogues that reader (decode to str, then parse) measured 1.6x slower, and this is
    the filter's hot loop. A typed `decoder` (a msgspec Struct with `msgspec.Raw` fields)
    checks the syntax of the whole line but builds only the fields it names; the UTF-8 of
    the strings it skips is checked when, and if, those fields are decoded.
    """
    _check_readable(path)
    decoder = decoder or _GENERIC
    offset = 0
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, 1):
            start, offset = offset, offset + len(raw)
            if lineno == 1 and raw.startswith(BOM):  # Windows tools write one: not part of the row
                raw, start = raw[len(BOM) :], start + len(BOM)
            if not raw or raw.isspace():  # blank line (strip() would copy every long line)
                continue
            try:
                value = decoder.decode(raw)
            except RecursionError:
                policy.handle(RowError(f"{path}:{lineno}", "nested too deep to be a row"))
                continue
            except (msgspec.DecodeError, UnicodeDecodeError) as exc:
                # msgspec.ValidationError is a DecodeError: a typed field had the wrong type.
                reason = str(exc) if isinstance(exc, msgspec.ValidationError) else _json_error(exc, raw)
                policy.handle(RowError(f"{path}:{lineno}", reason))
                continue
            yield lineno, start, value


def read_jsonl_at(handle: IO[bytes], offset: int) -> Any:
    """Decode the one line that starts at `offset` (used to join files without loading them)."""
    handle.seek(offset)
    return _GENERIC.decode(handle.readline())


_CHUNK = 1 << 20
_MAX_RECORD = 256 << 20


def iter_json_array(path: Path, policy: ErrorPolicy, key: str = "data") -> Iterator[tuple[str, Any]]:
    """Stream the records of a JSON file holding a list, or an object whose `key` is a list.

    Decodes one record at a time from a sliding buffer, so memory stays at about one record
    however big the file is. Yields ("file: record N", value).
    """
    _check_readable(path)
    decoder = json.JSONDecoder()
    with path.open("r", encoding="utf-8-sig") as handle:  # -sig: a leading BOM is skipped
        reader = _Buffer(handle, path)
        first = reader.next_char()
        if first == "{":
            reader.pos += 1
            reader.seek_key(decoder, key)
        elif first != "[":
            raise InputError(f"{path}: expected a JSON list or an object with a {key!r} list")
        reader.pos += 1
        number = 0
        while True:
            char = reader.next_char()
            if char == "]":
                return
            if number and char != ",":
                raise InputError(f"{path}: record {number}: expected ',' or ']' after it")
            if number:
                reader.pos += 1
                reader.next_char()
            number += 1
            location = f"{path}: record {number}"
            try:
                value = reader.decode(decoder)
            except ValueError as exc:
                # A broken record makes the rest of the list unreadable: not skippable.
                raise InputError(f"{location}: {_json_error(exc)}", "fix the file") from exc
            yield location, value


class _Buffer:
    """A growing window over a text file for incremental `raw_decode`."""

    def __init__(self, handle: IO[str], path: Path):
        self.handle, self.path = handle, path
        self.text, self.pos, self.eof = "", 0, False

    def _fill(self, size: int = _CHUNK) -> bool:
        if self.eof:
            return False
        try:
            chunk = self.handle.read(size)
        except UnicodeDecodeError as exc:
            raise InputError(f"{self.path}: not valid UTF-8 ({exc.reason})") from exc
        if not chunk:
            self.eof = True
            return False
        self.text = self.text[self.pos :] + chunk
        self.pos = 0
        return True

    def next_char(self) -> str:
        while True:
            while self.pos < len(self.text) and self.text[self.pos].isspace():
                self.pos += 1
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self._fill():
                raise InputError(f"{self.path}: the JSON ends too early")

    def decode(self, decoder: json.JSONDecoder) -> Any:
        while True:
            try:
                value, end = decoder.raw_decode(self.text, self.pos)
            except ValueError:
                # Incomplete record in the window: read more, doubling so big records stay linear.
                pending = len(self.text) - self.pos
                if pending > _MAX_RECORD or not self._fill(max(_CHUNK, pending)):
                    raise
                continue
            if end == len(self.text) and not self.eof and self._fill():
                continue  # a number or literal may continue in the next chunk
            self.pos = end
            return value

    def seek_key(self, decoder: json.JSONDecoder, key: str) -> None:
        """Skip members of the top-level object until `key`, leaving pos on its list."""
        while True:
            char = self.next_char()
            if char == "}":
                raise InputError(f"{self.path}: the top-level object has no {key!r} list")
            if char == ",":
                self.pos += 1
                self.next_char()
            name = self.decode(decoder)
            if self.next_char() != ":":
                raise InputError(f"{self.path}: not valid JSON near member {name!r}")
            self.pos += 1
            self.next_char()
            if name == key:
                if self.text[self.pos] != "[":
                    raise InputError(f"{self.path}: {key!r} is not a list")
                return
            self.decode(decoder)


class StageRows:
    """A stage's input file, validated once and then read again row by row when iterated.

    Holds the ids and byte offsets of the rows kept, not the rows: an LLM stage's memory
    does not grow with its input (100K users of AlpsBench are gigabytes of dialogue)."""

    def __init__(self, path: Path, ids: list[str], offsets: list[int]):
        self.path, self.ids, self.offsets = path, ids, offsets
        self._stamp = file_stamp(path)

    def __len__(self) -> int:
        return len(self.ids)

    def part(self, keep) -> StageRows:
        """The rows whose id `keep(id)` accepts (a shard's)."""
        kept = [(uid, offset) for uid, offset in zip(self.ids, self.offsets, strict=True) if keep(uid)]
        return StageRows(self.path, [uid for uid, _ in kept], [offset for _, offset in kept])

    def __iter__(self) -> Iterator[dict]:
        if file_stamp(self.path) != self._stamp:
            raise InputError(f"{self.path} changed while the stage was reading it", "run the stage again")
        with self.path.open("rb") as handle:
            for offset in self.offsets:
                yield read_jsonl_at(handle, offset)


def file_stamp(path: Path) -> tuple[int, int]:
    """Size and modification time: what a re-read by offset checks has not changed."""
    status = path.stat()
    return status.st_size, status.st_mtime_ns


def iter_records(path: Path, model, what: str, hint: str | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, record) of each row of a JSONL file, validated as `model` (a pydantic
    model); a row that is not one stops the read: "FILE:LINE: not `what` (its first problem)"."""
    for lineno, _, row in iter_jsonl(Path(path), ErrorPolicy("fail")):
        try:
            record = model.model_validate(row)
        except ValidationError as exc:
            raise InputError(f"{path}:{lineno}: not {what} ({first_problem(exc)})", hint) from None
        yield lineno, record


def read_stage_rows(path: Path, model, *, keep=None, kind: str = "user") -> tuple[StageRows, int]:
    """The rows of a stage's input file, each validated as `model` (a pydantic model).

    `keep(record)` drops the rows it refuses (counted, returned second). An empty input is
    an error: a stage never replaces its previous output with nothing.
    """
    ids, offsets, skipped = [], [], 0
    lines: dict[str, int] = {}  # user id -> its line: each user once
    try:
        for lineno, offset, row in iter_jsonl(path, ErrorPolicy("fail")):
            try:
                record = model.model_validate(row)
            except (ValidationError, RecursionError) as exc:
                problem = first_problem(exc) if isinstance(exc, ValidationError) else "nested too deep"
                raise InputError(f"{path}:{lineno}: not a {kind} row ({problem})") from None
            uid = str(row["user_id"])
            if uid in lines:
                raise InputError(
                    f"{path}:{lineno}: user {uid} again (first on line {lines[uid]})",
                    "keep one row per user: each is one unit of work and one output row",
                )
            lines[uid] = lineno
            if keep is not None and not keep(record):
                skipped += 1
                continue
            ids.append(uid)
            offsets.append(offset)
    except RowError as error:  # its hint names --on-error, which the LLM stages do not have
        raise InputError(
            error.message, "fix the line, or run the stage that writes this file again"
        ) from None
    if not ids and not skipped:
        raise InputError(f"{path}: no rows", "check that the previous stage wrote this file")
    return StageRows(path, ids, offsets), skipped


def pick_units(
    ids: list[str], path: Path, *, limit: int | None = None, users=None, label: str = "user"
) -> set[str] | None:
    """The ids a quick look works on (`users`, then the first `limit`), or None for all.

    A picked user that is not among the rows is an error."""
    if limit is not None and limit < 1:
        raise InputError(f"--limit must be at least 1, not {limit}")
    if limit is None and not users:
        return None
    if users:
        wanted = {str(u) for u in users}
        missing = wanted - set(ids)
        if missing:
            raise InputError(
                f"{path}: no {label} {some(sorted(missing))}",
                "check the ids against --input (the previous stage's output)",
            )
        ids = [uid for uid in ids if uid in wanted]
    return set(ids[:limit] if limit is not None else ids)


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[IO[bytes]]:
    """Write to a temporary file beside `path`, rename it over `path` only on success."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs are ordinary files
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        # No call before the unlink: a signal handler raising (a stopped child's SIGTERM)
        # runs at a call, and one there would leave the temporary file behind.
        try:  # noqa: SIM105 - suppress() is a call: the window above
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        named(exc, path)
        raise


def named(exc: BaseException, path: Path) -> None:
    """Give an OSError from a write (a full disk says no file) the path it was about."""
    if isinstance(exc, OSError) and not exc.filename:
        exc.filename = str(path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json_atomic(path: Path, value: Any) -> None:
    with atomic_output(path) as handle:
        handle.write(msgspec.json.format(msgspec.json.encode(value), indent=2) + b"\n")


def notice(message: str) -> None:
    """One line to the user about something put right on the way (stderr, as the summaries)."""
    import sys

    sys.stderr.write(f"warning: {message}\n")
    sys.stderr.flush()


def cut_torn_tail(path: Path, lost: str) -> int:
    """Cut a last line torn by a kill or a full disk in the middle of a write (no newline at
    the end), so the next append starts on a line of its own; one notice says what the cut
    line held (`lost`). Returns the bytes cut."""
    if not path.exists() or path.stat().st_size == 0:
        return 0
    with path.open("rb+") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return 0
        position = size
        while position > 0:  # back a block at a time to the last newline
            position = max(0, position - (1 << 16))
            handle.seek(position)
            cut = handle.read(size - position).rfind(b"\n")
            if cut >= 0:
                position += cut + 1
                break
        cut_back(handle, path, position, size, lost)
        return size - position


def cut_back(handle: IO[bytes], path: Path, size: int, was: int, lost: str) -> None:
    handle.truncate(size)
    handle.flush()
    os.fsync(handle.fileno())
    notice(f"{path}: its last line was cut off in the middle ({was - size} bytes, a crash or a full disk); "
           f"dropped, {lost}")  # fmt: skip


def set_aside(path: Path, why: str) -> Path:
    """Rename a damaged file to `NAME.corrupt-<time>` (kept for the user, out of the way of
    what replaces it) and say so in one line."""
    import time

    stamp = time.strftime("%Y%m%dT%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    number = 1
    while target.exists():
        number += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{number}")
    os.replace(path, target)
    notice(f"{path}: {why}; kept aside as {target.name}, a new one is written")
    return target


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object file that the toolkit rewrites (a manifest, a run report): {} when it
    is missing; set aside (never silently replaced) when it is not a readable object."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        value = json.loads(data)
    except ValueError as exc:  # UnicodeDecodeError too
        set_aside(path, f"not valid JSON ({exc})")
        return {}
    if not isinstance(value, dict):
        set_aside(path, "not a JSON object")
        return {}
    return value


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read a MiB at a time."""
    import hashlib

    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def rewrite_generated(path: Path, begin: str, end: str, generated: str) -> bool:
    """Put `generated` between the `begin` and `end` markers of a docs page; True if the
    file changed (python -m personaemp.apidocs / personaemp.filedocs)."""
    text = Path(path).read_text(encoding="utf-8")
    start, stop = text.index(begin) + len(begin), text.index(end)
    new = text[:start] + "\n" + generated + text[stop:]
    if new != text:
        Path(path).write_text(new, encoding="utf-8")
    return new != text
