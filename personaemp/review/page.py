"""`personaemp review`: people label a sample of a build's queries on a local web page.

The page (personaemp/assets/review/, shipped in the package, nothing fetched from the
internet) shows one query at a time with everything it was made from; every click is
appended at once to a labels file (JSON lines, flushed and synced), so nothing is lost
when the browser or the server stops. What counts is the last event per reviewer, query
and field (`current_labels`), which is also how a reviewer resumes.

A label event::

    {"reviewer": "ana", "query_id": "u1-q2", "user_id": "u1", "field": "check:role_awareness",
     "value": "disagree", "judge": true, "at": "2026-11-23T19:40:02Z"}

`field` is `query` (accept | reject), `check:<name>` (agree | disagree with the judge's
verdict `judge`), `trait:<n>` (supported | unsupported, `trait` holds its statement) or
`note` (text); `value` null clears the field. A label on a dialogue (`review --dialogues`,
review/dialogues.py) names it by `item` (`<system>/<dialogue_id>`) beside its `query_id`.
"""

from __future__ import annotations

import json
import os
import random
import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from hmac import compare_digest
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from secrets import token_urlsafe
from typing import Any
from urllib.parse import parse_qs, urlparse

import msgspec

from personaemp.errors import InputError
from personaemp.instruments.query_check import CHECKS, JUDGED
from personaemp.io import ErrorPolicy, cut_torn_tail, iter_jsonl
from personaemp.review.dialogues import LABELS_FILE, dialogue_event, read_dialogue_items
from personaemp.review.fidelity import LABELS_FILE as FIDELITY_LABELS
from personaemp.review.fidelity import fidelity_event, public, read_fidelity_items, sample_pairs
from personaemp.review.fields import NAME_CHARS, NOTE_CHARS, VALUES, UnknownTarget, shown

# The checks whose verdict is the LLM judge's: its three judgments, and the category it
# reads (category_match compares that reading with the category the query was written for).
LLM_CHECKS = (*JUDGED, "category_match")
ASSETS = {
    "/": "index.html",
    "/review.js": "review.js",
    "/dialogue.js": "dialogue.js",
    "/review.css": "review.css",
    "/fidelity.html": "fidelity.html",
    "/fidelity.js": "fidelity.js",
}
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


# --- the items -------------------------------------------------------------------------------


def read_items(queries: Path) -> list[dict[str, Any]]:
    """Every generated query of a build (accepted and rejected), each with what the page
    shows beside it: the user's memories, persona traits and Big Five levels."""
    items = []
    for lineno, _, row in iter_jsonl(queries, ErrorPolicy("fail")):
        if not isinstance(row, dict) or "user_id" not in row or "queries" not in row:
            raise InputError(f"{queries}:{lineno}: not a gen-queries row (no user_id or queries)")
        user = {
            "user_id": str(row["user_id"]),
            "language": row.get("language"),
            "profile": row.get("profile") or "",
            "memories": [
                {k: m.get(k) for k in ("memory_id", "label", "value", "evidence_text")}
                for m in row.get("memories") or []
            ],
            "traits": row.get("traits") or [],
            "big_five": row.get("big_five") or {},
        }
        for accepted, key in ((True, "queries"), (False, "rejected_queries")):
            for query in row.get(key) or []:
                checks = query.get("checks") or {}
                items.append(
                    {
                        **user,
                        "query_id": query["query_id"],
                        "category": query.get("category"),
                        "query": query.get("query", ""),
                        "situation": query.get("situation") or {},
                        "memory_ids": query.get("memory_ids") or [],
                        "accepted": accepted,
                        "checks": {n: checks[n] for n in CHECKS if isinstance(checks.get(n), bool)},
                        "reasons": checks.get("reasons") or {},
                        "judge_language": checks.get("language"),
                        "enforced": checks.get("enforced"),
                    }
                )
    return items


def stratum(item: dict[str, Any]) -> tuple:
    """What the sample balances over: category, language, accepted or not, failed checks."""
    failed = tuple(name for name, ok in item["checks"].items() if not ok)
    return item["category"] or "", item["language"] or "", item["accepted"], failed


def sample_items(items: Sequence[dict[str, Any]], size: int, seed: int) -> list[dict[str, Any]]:
    """`size` items taken in turn from each stratum (shuffled with `seed`), so a rare
    outcome — a rejected query, a failed check, a small language — is seen, not drowned
    by the common one. The same items, size and seed give the same sample in the same order."""
    rng = random.Random(seed)
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for item in sorted(items, key=lambda i: i["query_id"]):
        groups[stratum(item)].append(item)
    queues = [groups[key] for key in sorted(groups, key=repr)]
    for queue in queues:
        rng.shuffle(queue)
    rng.shuffle(queues)
    picked: list[dict[str, Any]] = []
    while len(picked) < size and any(queues):
        for queue in queues:
            if queue and len(picked) < size:
                picked.append(queue.pop())
    return picked


def sample_dialogues(items: Sequence[dict[str, Any]], size: int, seed: int) -> list[dict[str, Any]]:
    """`size` queries, taken in turn from each category / language / ending stratum (as the
    query sample is), each with all its systems' dialogues one after the other: the same
    person labels both supporters of a query."""
    per_query: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in items:
        per_query[item["query_id"]].append(item)
    stand_ins = [
        {"query_id": query, "category": group[0]["category"], "language": group[0]["language"],
         "accepted": True, "checks": {f"ended_by_{d['ended_by']}": False for d in group}}
        for query, group in per_query.items()
    ]  # fmt: skip
    return [item for picked in sample_items(stand_ins, size, seed) for item in per_query[picked["query_id"]]]


# --- the labels ------------------------------------------------------------------------------


encode, decode = msgspec.json.Encoder().encode, msgspec.json.Decoder().decode
BATCH_LINES = 10_000  # lines per write and fsync when many labels come at once (an import)
LABEL_STUDIO_REVIEWER = "label-studio:"  # a reviewer name's prefix when the labels came from Label Studio
CLICK_LOST = "the click it held was never reported saved (the page showed it NOT SAVED)"


class LabelFile:
    """The append-only labels file: one event a line. An event is reported saved only once
    it is written and synced; a line torn by a crash is cut back before the next append,
    so a click never lands on the end of a broken line."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._tail_checked = False

    def append(self, event: dict[str, Any]) -> None:
        self.extend([event])

    def extend(self, events: Iterable[dict[str, Any]]) -> None:
        """Append events in batches of BATCH_LINES, each written once and synced once."""
        lines = [encode(event) + b"\n" for event in events]
        with self._lock:
            try:
                if not self._tail_checked:
                    cut_torn_tail(self.path, CLICK_LOST)
                    self._tail_checked = True
                created = not self.path.exists()
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("ab") as handle:
                    for start in range(0, len(lines), BATCH_LINES):
                        handle.write(b"".join(lines[start : start + BATCH_LINES]))
                        handle.flush()
                        os.fsync(handle.fileno())
                if created:  # the new name itself must survive a power loss
                    _sync_folder(self.path.parent)
            except OSError:
                self._tail_checked = False  # a write cut by a full disk: look at the tail again
                raise

    def events(self) -> list[dict[str, Any]]:
        return read_label_events(self.path) if self.path.exists() else []


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


LABEL_TEXT_KEYS = ("reviewer", "query_id", "field", "item")  # what current_labels keys on: text


def read_label_events(path: Path) -> list[dict[str, Any]]:
    """The events of a labels file; a line cut by a crash (the last one) is left out."""
    events = []
    lines = Path(path).read_bytes().split(b"\n")
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            event = decode(raw)
        except msgspec.DecodeError:
            if number == len(lines):  # the line in flight when the writer died
                continue
            raise InputError(
                f"{path}:{number}: not valid JSON — a labels file holds one event a line"
            ) from None
        if not isinstance(event, dict) or not {"reviewer", "query_id", "field"} <= event.keys():
            raise InputError(f"{path}:{number}: not a label event (reviewer, query_id, field)")
        wrong = [key for key in LABEL_TEXT_KEYS if key in event and not isinstance(event[key], str)]
        if wrong and not (wrong == ["item"] and event["item"] is None):
            raise InputError(
                f"{path}:{number}: a label event's {wrong[0]} is text, not {shown(event[wrong[0]], 40)}",
                "fix or remove the line (the review page writes only text there)",
            )
        events.append(event)
    return events


def current_labels(events: Iterable[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """reviewer -> query_id (a dialogue's: its item) -> field -> its last event (fields
    cleared last are left out)."""
    state: dict[str, dict[str, dict[str, Any]]] = defaultdict(lambda: defaultdict(dict))
    for event in events:
        fields = state[event["reviewer"]][event.get("item") or event["query_id"]]
        if event.get("value") in (None, ""):
            fields.pop(event["field"], None)
        else:
            fields[event["field"]] = event
    return {reviewer: {q: dict(f) for q, f in queries.items() if f} for reviewer, queries in state.items()}


def make_event(body: Any, items: dict[str, dict[str, Any]], now: str | None = None) -> dict[str, Any]:
    """A label event from what the page posted, checked against the sample (InputError;
    UnknownTarget for a trait or check the query does not have)."""
    if not isinstance(body, dict):
        raise InputError("a label is a JSON object")
    reviewer = body.get("reviewer")
    reviewer = reviewer.strip() if isinstance(reviewer, str) else ""
    # printable only: names are shown on the terminal and in the card
    if not reviewer or len(reviewer) > NAME_CHARS or not reviewer.isprintable():
        raise InputError(f"a reviewer name of 1-{NAME_CHARS} printable characters is needed")
    if "item" in body:  # a dialogue, or a pair of review --fidelity
        key = body["item"]
        item = items.get(key) if isinstance(key, str) else None
        if item is None or item.get("kind") not in ("dialogue", "fidelity"):
            raise InputError(f"no dialogue {shown(key)} in this sample")
        if item["kind"] == "fidelity":
            event = fidelity_event(body, item, reviewer)
        else:
            event = dialogue_event(body, item, reviewer)
        event["at"] = now or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return event
    query_id, name, value = body.get("query_id"), body.get("field"), body.get("value")
    item = items.get(query_id) if isinstance(query_id, str) else None
    if item is None or item.get("kind") == "dialogue":
        raise InputError(f"no query {shown(query_id)} in this sample")
    if not isinstance(name, str):
        raise InputError("a label's field is text")
    kind, _, target = name.partition(":")
    event = {"reviewer": reviewer, "query_id": item["query_id"], "user_id": item["user_id"], "field": name}
    if kind == "note" and not target:
        if value is not None and (not isinstance(value, str) or len(value) > NOTE_CHARS):
            raise InputError(f"a note is text of at most {NOTE_CHARS} characters")
    elif kind in VALUES and (kind == "query") == (not target):
        if value is not None and value not in VALUES[kind]:
            raise InputError(f"{name} takes {' or '.join(VALUES[kind])}, not {shown(value)}")
        if kind == "check":
            if target not in LLM_CHECKS or target not in item["checks"]:
                raise UnknownTarget(f"{shown(target)} is not an LLM check of this query")
            event["judge"] = item["checks"][target]
        if kind == "trait":
            if not target.isdigit() or int(target) >= len(item["traits"]):
                raise UnknownTarget(f"this query's user has no trait {shown(target)}")
            event["trait"] = item["traits"][int(target)].get("statement", "")
    else:
        raise InputError(f"unknown field {shown(name)}")
    event["value"] = value
    event["at"] = now or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return event


# --- the server ------------------------------------------------------------------------------


MAX_BODY = 64 * 1024  # a label is under 1 KB; a full note, escaped, fits many times over
TOKEN_HEADER = "X-Review-Token"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARDS = ("", "0.0.0.0", "::")


@dataclass
class ReviewSession:
    """What one `personaemp review` serves: the sample, its labels file and the session's
    token (every API request carries it; only the page opened from the printed address has it)."""

    items: list[dict[str, Any]]
    labels: LabelFile
    source: str = ""
    token: str = field(default_factory=lambda: token_urlsafe(24), repr=False)
    page: str = "index.html"  # what "/" serves (review --fidelity: its own page)
    by_id: dict[str, dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.by_id = {item.get("item") or item["query_id"]: item for item in self.items}


def _asset(name: str) -> bytes:
    return resources.files("personaemp").joinpath("assets", "review", name).read_bytes()


def served_hosts(host: str, port: int) -> frozenset[str] | None:
    """The Host headers the page answers: the address it serves (and the loopback names when
    it serves loopback); None for a wildcard address, where the token alone decides."""
    if host in WILDCARDS:
        return None
    names = set(LOOPBACK) if host in LOOPBACK else {host.lower()}
    bracketed = {f"[{name}]" if ":" in name else name for name in names}
    return frozenset(f"{name}:{port}" for name in bracketed) | (
        frozenset(bracketed) if port == 80 else frozenset()
    )


class Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class _Handler(BaseHTTPRequestHandler):
    session: ReviewSession
    hosts: frozenset[str] | None
    server_version = "personaemp-review"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one line per click would drown the console

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")  # the address holds the token
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, value: Any, status: int = HTTPStatus.OK) -> None:
        self._send(status, json.dumps(value, ensure_ascii=False).encode("utf-8"))

    def _check(self, api: bool) -> None:
        """Only the page's own requests: the served Host, a same-origin Origin (or none), and
        on the API the session's token (Refused otherwise)."""
        host = (self.headers.get("Host") or "").strip().lower()
        if self.hosts is not None and host not in self.hosts:
            raise Refused(HTTPStatus.FORBIDDEN, "this server answers only at the address it serves")
        origin = self.headers.get("Origin")
        if origin is not None and origin.lower() != f"http://{host}":
            raise Refused(HTTPStatus.FORBIDDEN, "requests from another site are refused")
        if self.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
            raise Refused(HTTPStatus.FORBIDDEN, "requests from another site are refused")
        if api and not compare_digest(
            (self.headers.get(TOKEN_HEADER) or "").encode(), self.session.token.encode()
        ):
            raise Refused(
                HTTPStatus.FORBIDDEN,
                "no or wrong session token: open the address `personaemp review` printed "
                "(a restarted server has a new one)",
            )

    def _refuse(self, error: Refused) -> None:
        self._json({"error": error.message}, error.status)

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        url = urlparse(self.path)
        try:
            self._check(api=url.path.startswith("/api/"))
        except Refused as error:
            return self._refuse(error)
        if url.path in ASSETS:
            name = self.session.page if url.path == "/" else ASSETS[url.path]
            self._send(HTTPStatus.OK, _asset(name), TYPES[Path(name).suffix])
        elif url.path == "/api/items":
            self._json({"source": self.session.source, "labels": str(self.session.labels.path),
                        "items": [public(i) for i in self.session.items]})  # fmt: skip
        elif url.path == "/api/labels":
            reviewer = (parse_qs(url.query).get("reviewer") or [""])[0]
            try:
                labels = current_labels(self.session.labels.events())
            except InputError as error:
                return self._json({"error": error.message}, HTTPStatus.INTERNAL_SERVER_ERROR)
            mine = labels.get(reviewer, {})
            values = {q: {f: e["value"] for f, e in fields.items()} for q, fields in mine.items()}
            self._json({"reviewer": reviewer, "labels": values, "reviewers": sorted(labels)})
        else:
            self._json({"error": "not found"}, HTTPStatus.NOT_FOUND)

    def do_POST(self) -> None:  # noqa: N802
        try:
            self._check(api=True)
            if urlparse(self.path).path != "/api/label":
                raise Refused(HTTPStatus.NOT_FOUND, "not found")
            body = self._body()
            event = make_event(body, self.session.by_id)
        except Refused as error:
            return self._refuse(error)
        except InputError as error:
            return self._json({"error": error.message}, HTTPStatus.BAD_REQUEST)
        try:
            self.session.labels.append(event)
        except OSError as error:  # a full disk: not saved, and the page says so and retries
            return self._json({"error": f"not saved: {error.strerror}"}, HTTPStatus.SERVICE_UNAVAILABLE)
        self._json({"saved": event})

    def _body(self) -> Any:
        """The request's JSON body, bounded in size and nesting."""
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise Refused(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "a label is sent as application/json")
        length = self.headers.get("Content-Length")
        if length is None:
            raise Refused(HTTPStatus.LENGTH_REQUIRED, "Content-Length is needed")
        if not length.strip().isdigit():
            self.close_connection = True  # the body cannot be skipped: end the connection
            raise Refused(HTTPStatus.BAD_REQUEST, "Content-Length is not a number of bytes")
        if int(length) > MAX_BODY:
            self.close_connection = True
            raise Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"a label is at most {MAX_BODY} bytes")
        try:
            return json.loads(self.rfile.read(int(length)) or b"null")
        except RecursionError:
            raise Refused(HTTPStatus.BAD_REQUEST, "a label is a flat JSON object, not nested") from None
        except ValueError as error:
            raise Refused(HTTPStatus.BAD_REQUEST, f"not valid JSON ({error})") from None


def review_server(session: ReviewSession, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """The page's server, bound (port 0: a free one) but not yet serving."""
    handler = type("ReviewHandler", (_Handler,), {"session": session, "hosts": None})
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as error:
        raise InputError(
            f"cannot listen on {host}:{port} ({error.strerror})", "pick another --port"
        ) from None
    handler.hosts = served_hosts(host, server.server_address[1])
    server.daemon_threads = True
    return server


def page_address(server: ThreadingHTTPServer, session: ReviewSession) -> str:
    """The address to open: the page with the session's token (as Jupyter prints its own)."""
    host, port = server.server_address[:2]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}/?token={session.token}"


def open_session(queries: Path, labels: Path, size: int, seed: int) -> ReviewSession:
    items = read_items(Path(queries))
    if not items:
        raise InputError(f"{queries}: no generated queries to review")
    return ReviewSession(sample_items(items, size, seed), LabelFile(labels), source=str(queries))


def open_dialogue_session(dialogues: Sequence[Path], labels: Path, size: int, seed: int) -> ReviewSession:
    """The sample of `size` queries' dialogues, every system's dialogue of each (dialogues.py)."""
    items = read_dialogue_items([Path(p) for p in dialogues])
    if not items:
        raise InputError(f"{dialogues[0]}: no dialogues to review")
    return ReviewSession(
        sample_dialogues(items, size, seed), LabelFile(labels), source=", ".join(map(str, dialogues))
    )


def open_fidelity_session(path: Path, labels: Path, size: int, seed: int) -> ReviewSession:
    """A sample of `size` blinded pairs of a fidelity file (review/fidelity.py)."""
    items = read_fidelity_items(Path(path), seed)
    if not items:
        raise InputError(f"{path}: no pairs to review", "run `personaemp fidelity` first")
    return ReviewSession(
        sample_pairs(items, size, seed), LabelFile(labels), source=str(path), page="fidelity.html"
    )


def _dialogues(options) -> list[Path]:
    return [Path(p) for p in getattr(options, "dialogues", None) or ()]  # options made before --dialogues


def review_labels(options) -> Path:
    """The labels file: --labels, else labels.jsonl beside the queries (dialogue_labels.jsonl
    beside the first dialogues file)."""
    if options.labels:
        return options.labels
    if getattr(options, "fidelity", None):
        return Path(options.fidelity).with_name(FIDELITY_LABELS)
    if _dialogues(options):
        return Path(_dialogues(options)[0]).with_name(LABELS_FILE)
    return Path(options.input).with_name("labels.jsonl")


def from_options(options, console) -> None:
    """`personaemp review` on its options (ReviewOptions): serve the page until Ctrl-C."""
    from rich.markup import escape

    labels = review_labels(options)
    if getattr(options, "fidelity", None):
        session = open_fidelity_session(options.fidelity, labels, options.size, options.seed)
        what = f"{len(session.items)} blinded pairs"
    elif _dialogues(options):
        session = open_dialogue_session(_dialogues(options), labels, options.size, options.seed)
        what = f"{len(session.items)} dialogues of {len({i['query_id'] for i in session.items})} queries"
    else:
        session = open_session(options.input, labels, options.size, options.seed)
        what = f"{len(session.items)} queries"
    server = review_server(session, options.host, options.port)
    names = [
        name if name.isprintable() else shown(name)
        for name in sorted(current_labels(session.labels.events()))
    ]
    console.print(
        f"review: {what} of {escape(session.source)} (seed {options.seed}); "
        f"labels go to {escape(str(labels))}"
        + (f" (reviewers so far: {escape(', '.join(names))})" if names else "")
    )
    if options.host not in LOOPBACK:
        console.print(
            f"[yellow]warning: serving on {escape(options.host)}, beyond this machine: whoever can reach it "
            "and has the address below (its token) can read the sampled users' memories and write labels; "
            "the token crosses the network in clear (plain HTTP)[/]"
        )
    console.print(
        f"open [bold]{escape(page_address(server, session))}[/] — Ctrl-C stops the server "
        "(every label is already saved)"
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        console.print(f"stopped; labels are in {escape(str(labels))}")
    finally:
        server.server_close()
