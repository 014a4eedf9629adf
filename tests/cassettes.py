"""The embedded model's recorded replies (tests/cassettes/embedded/), served by a stand-in for
its local server.

At temperature 0 on one thread, the pinned model's reply to a request is fixed bytes for a
given model file and llama-cpp-python version: decoding them again on every run (tens of
core-seconds a test) checks nothing new. So the stage tests on `--llm local` run the whole
engine path (`open_engine`, the endpoint pool, the HTTP client, the parse, rules and books)
against `StandIn`, which the test puts in place of `personaemp.llm.local.LocalServer`: it
listens on 127.0.0.1 like the real server and answers each request with the body the real
server answered when the cassette was recorded.

A cassette is JSON lines: a header naming what made the replies (`installed()`: the model's
name and sha256, llama-cpp-python's version, the server's thread count), then one line per
request: the engine's own cache key of the body as sent (`request_key(body, 0)`, llm/cache.py:
the sample never reaches the server), the request, and the server's status and reply body.

`make record-embedded` records them again (PERSONAEMP_RECORD_EMBEDDED=1: the stand-in passes
each request to a real LocalServer and writes what it answered). `test_cassettes.py` fails
with that command when the installed model or llama-cpp-python differs from a header, and
a request missing from its cassette fails the test with it too.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from personaemp.llm.cache import request_key
from personaemp.llm.local import MODEL_NAME, LocalServer, local_threads
from personaemp.llm.models import EMBEDDED

CASSETTES = Path(__file__).resolve().parent / "cassettes" / "embedded"
RERECORD = "make record-embedded"
RECORD_ENV = "PERSONAEMP_RECORD_EMBEDDED"
GUARDED = ("model", "model_sha256", "llama_cpp_python", "threads")  # a change in any: record again


def installed() -> dict[str, Any]:
    """What would make the replies here: the pinned model, llama-cpp-python (None: not
    installed) and the server's threads (PERSONAEMP_LOCAL_THREADS; tests/conftest.py sets 1)."""
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {
        "model": MODEL_NAME,
        "model_sha256": EMBEDDED.sha256,
        "llama_cpp_python": version,
        "threads": local_threads(),
    }


def mismatch(path: Path, header: dict[str, Any], here: dict[str, Any]) -> str | None:
    """Why the replies in `path` (its `header`) are not what `here` would answer, naming the
    command that records them again; None when they are."""
    changed = [
        f"{name} {header.get(name)!r} (here: {here.get(name)!r})"
        for name in GUARDED
        if header.get(name) != here.get(name)
    ]
    if not changed:
        return None
    return f"{path.name} was recorded with {', '.join(changed)}: record the replies again with `{RERECORD}`"


def read(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A cassette's header and its replies by key ({} and {} when there is none)."""
    if not path.exists():
        return {}, {}
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return lines[0], {entry["key"]: entry for entry in lines[1:]}


def write(path: Path, entries: dict[str, dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [installed(), *entries.values()]
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")


class StandIn:
    """In place of `LocalServer` (same constructor and `with` use): answers each chat request
    from the cassette at `path`; `record`: from a real LocalServer, kept for `write`."""

    model = MODEL_NAME

    def __init__(self, path: Path, *, record: bool = False, **server_options: Any) -> None:
        self.path, self.record, self.server_options = path, record, server_options
        self.header, self.replies = ({}, {}) if record else read(path)
        self.seen: dict[str, dict[str, Any]] = {}  # what this run asked, in order (record: written)
        self.misses: list[dict[str, Any]] = []  # requests the cassette does not hold
        self.port: int | None = None
        self.process = None
        self._upstream = None
        self._http: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> StandIn:
        if self.record:  # the real server (the module's name is the stand-in's while a test runs)
            self._upstream = LocalServer(**self.server_options).__enter__()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._http.daemon_threads = True
        self.port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info) -> None:
        assert self._http is not None
        self._http.shutdown()
        self._http.server_close()
        if self._upstream is not None:
            self._upstream.__exit__(*exc_info)

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        key = request_key(body, 0)
        entry = self.replies.get(key)
        if entry is None and self.record:
            entry = {"key": key, "request": body, **self._ask_upstream(body)}
            self.replies[key] = entry
        if entry is None:
            self.misses.append(body)
            message = (
                f"no recorded reply for this request in {self.path.name}: record again with `{RERECORD}`"
            )
            return 500, {"error": {"message": message, "type": "cassette_miss"}}
        self.seen.setdefault(key, entry)
        return entry["status"], entry["reply"]

    def _ask_upstream(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self._upstream is not None
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        request = urllib.request.Request(
            f"{self._upstream.base_url}/chat/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        try:
            with opener.open(request, timeout=900) as response:
                return {"status": response.status, "reply": json.loads(response.read())}
        except urllib.error.HTTPError as error:
            return {"status": error.code, "reply": json.loads(error.read() or b"{}")}

    def _handler(self):
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                self._send(*stand_in.answer(body))

        return Handler


def recording() -> bool:
    return os.environ.get(RECORD_ENV, "") not in ("", "0")
