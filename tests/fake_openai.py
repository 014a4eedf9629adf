"""A fake OpenAI-compatible chat-completions server for tests and benchmarks (stdlib only).

In-process use (tests)::

    with FakeOpenAI() as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
        server.queue(rate_limit(0.05), reply({"persona": "..."}))
        ...
        assert server.count == 2

Every POST /v1/chat/completions takes the next queued action (FIFO); when the queue is
empty it asks ``responder(body, number)`` (``number`` is the 1-based arrival ordinal of the
chat request, equal to ``server.count`` at arrival). With no responder the reply is a valid
JSON instance of the schema in ``response_format`` (``json_schema`` type, or llama.cpp-style
``json_object`` with a ``schema`` key), or ``{}`` when the request carries no schema.

Standalone use (benchmarks, separate process)::

    python tests/fake_openai.py --port 0 --latency-median 0.3 --latency-sigma 0.8 --fault-rate 0.1 --seed 1

prints ``READY http://127.0.0.1:PORT/v1`` once listening and serves until killed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "Action",
    "FakeOpenAI",
    "Recorded",
    "drop",
    "empty",
    "hang",
    "instance_from_schema",
    "invalid_json_content",
    "lognormal_latency",
    "malformed_body",
    "rate_limit",
    "reply",
    "schema_for_request",
    "schema_invalid",
    "server_error",
    "truncated",
]

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
INVALID_JSON_TEXT = '{"persona": "unterminated'
MALFORMED_BODY = b'{"id": "chatcmpl-broken", "object": "chat.completion", "choices": [{"index": 0, "mess'


# --------------------------------------------------------------------------- records and actions


@dataclass
class Recorded:
    """One request as the server received it. Header names are lower-cased.

    ``received_at`` is ``time.monotonic()`` when the request body had been read.
    """

    path: str
    headers: dict[str, str]
    body: dict | None
    raw: bytes
    method: str = "POST"
    received_at: float = 0.0


@dataclass(frozen=True)
class Action:
    """What the server does with one chat request. Build with the factory functions below."""

    kind: str  # reply | rate_limit | server_error | hang | malformed_body | drop
    content: str | dict | list | None = None  # None: generate (schema instance)
    finish_reason: str = "stop"
    usage: dict | None = None
    status: int = 200
    retry_after: float | None = None
    seconds: float = 0.0
    cut: bool = False  # truncate the generated content to half its length


def reply(content: str | dict | list, finish_reason: str = "stop", usage: dict | None = None) -> Action:
    """A normal 200 reply; a dict/list ``content`` is JSON-encoded. ``usage`` overrides counting."""
    return Action("reply", content=content, finish_reason=finish_reason, usage=usage)


def schema_invalid(content: str | dict | list) -> Action:
    """A reply whose content is valid JSON but wrong for the schema (alias of ``reply``)."""
    return reply(content)


def invalid_json_content() -> Action:
    """A 200 reply whose message content is not JSON text."""
    return reply(INVALID_JSON_TEXT)


def truncated(content: str | dict | list | None = None) -> Action:
    """A reply with finish_reason "length"; with no content, the generated reply cut in half."""
    if content is None:
        return Action("reply", finish_reason="length", cut=True)
    return reply(content, finish_reason="length")


def empty() -> Action:
    """A 200 reply with content ""."""
    return reply("")


def rate_limit(retry_after: float = 0.05) -> Action:
    """HTTP 429 with a ``Retry-After`` header (seconds, may be fractional) and an OpenAI error body."""
    return Action("rate_limit", status=429, retry_after=retry_after)


def server_error(status: int = 500) -> Action:
    """HTTP ``status`` (5xx) with an OpenAI-style error body."""
    return Action("server_error", status=status)


def hang(seconds: float, content: str | dict | list | None = None) -> Action:
    """Sleep ``seconds`` (woken early by ``stop()``), then answer normally.

    With no ``content`` the answer is what the responder (or default schema reply) gives.
    """
    return Action("hang", content=content, seconds=seconds)


def malformed_body() -> Action:
    """HTTP 200, ``Content-Type: application/json``, but the body is truncated, non-JSON bytes."""
    return Action("malformed_body")


def drop() -> Action:
    """Close the TCP connection without sending any response bytes."""
    return Action("drop")


FAULTS: dict[str, Callable[[], Action]] = {
    "rate_limit": rate_limit,
    "server_error": server_error,
    "invalid_json_content": invalid_json_content,
    "truncated": truncated,
    "empty": empty,
    "drop": drop,
}


def lognormal_latency(median: float, sigma: float, rng: random.Random) -> Callable[[], float]:
    """A latency callable drawing from a log-normal with the given median (seconds) and sigma."""
    lock = threading.Lock()
    mu = math.log(median)

    def draw() -> float:
        with lock:
            return rng.lognormvariate(mu, sigma)

    return draw


# --------------------------------------------------------------------------- schema instances


def schema_for_request(body: dict | None) -> dict | None:
    """The JSON schema a chat request asks its reply to follow, or None."""
    if not isinstance(body, dict):
        return None
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema":
        js = fmt.get("json_schema")
        if isinstance(js, dict) and isinstance(js.get("schema"), dict):
            return js["schema"]
        return None
    if fmt.get("type") == "json_object" and isinstance(fmt.get("schema"), dict):
        return fmt["schema"]
    return None


_FORMAT_STRINGS = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00Z",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def instance_from_schema(schema: dict, root: dict | None = None, *, _depth: int = 0, _index: int = 0) -> Any:
    """A JSON value valid for ``schema`` (the subset Pydantic v2 and structured outputs use).

    Supports object, string (enum, minLength, maxLength, a few formats), integer/number
    (minimum, exclusiveMinimum, maximum), boolean, null, array (minItems, maxItems,
    prefixItems; one item by default), enum, const, anyOf/oneOf (first option), allOf
    (merged), ``$ref`` into the root document (``#/$defs/..``, ``#/definitions/..``) and
    type lists such as ``["string", "null"]``. ``pattern`` is not honoured.
    """
    root = schema if root is None else root
    if _depth > 64:
        raise ValueError("schema nests too deeply (recursive $ref without a way out?)")
    deep = _depth > 8  # past this, take the shortest way out of recursive schemas

    def sub(s: dict, index: int = 0) -> Any:
        return instance_from_schema(s, root, _depth=_depth + 1, _index=index)

    if schema is True or schema == {}:
        return "value"
    if "$ref" in schema:
        target = _resolve_ref(root, schema["$ref"])
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return sub({**target, **rest} if rest else target, _index)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][_index % len(schema["enum"])] if schema["enum"] else None
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            options = schema[key]
            if deep:
                nulls = [o for o in options if isinstance(o, dict) and o.get("type") == "null"]
                options = nulls or options
            return sub(options[0], _index)
    if schema.get("allOf"):
        merged: dict = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            part = _resolve_ref(root, part["$ref"]) if "$ref" in part else part
            for k, v in part.items():
                if k == "properties":
                    merged["properties"] = {**merged.get("properties", {}), **v}
                elif k == "required":
                    merged["required"] = [*merged.get("required", []), *v]
                else:
                    merged.setdefault(k, v)
        return sub(merged, _index)

    kind = schema.get("type")
    if isinstance(kind, list):
        non_null = [t for t in kind if t != "null"]
        if not non_null or (deep and "null" in kind):
            return None
        kind = non_null[0]
    if kind is None:
        if "properties" in schema or "additionalProperties" in schema:
            kind = "object"
        elif "items" in schema or "prefixItems" in schema:
            kind = "array"
        else:
            return "value"

    if kind == "object":
        props: dict = schema.get("properties", {})
        required = set(schema.get("required", []))
        names = [n for n in props if n in required] if deep else list(props)
        out = {name: sub(props[name]) for name in names}
        for name in required - set(out):  # required but not described
            out[name] = "value"
        return out
    if kind == "array":
        prefix = schema.get("prefixItems") or []
        low = schema.get("minItems", 0 if deep else 1)
        high = schema.get("maxItems")
        n = max(low, len(prefix))
        if high is not None:
            n = min(n, high)
        items = schema.get("items", {})
        out_items = [sub(prefix[i], i) if i < len(prefix) else sub(items or {}, i) for i in range(n)]
        return out_items
    if kind == "string":
        text = _FORMAT_STRINGS.get(schema.get("format", ""), "text" if _index == 0 else f"text{_index}")
        low = schema.get("minLength", 0)
        if len(text) < low:
            text += "x" * (low - len(text))
        if "maxLength" in schema:
            text = text[: schema["maxLength"]]
        return text
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer", _index)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    raise ValueError(f"unsupported schema type {kind!r}")


def _number(schema: dict, integer: bool, index: int) -> int | float:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if "exclusiveMinimum" in schema:
        em = schema["exclusiveMinimum"]
        lo = math.floor(em) + 1 if integer else em + (0.5 if hi is None else (hi - em) / 2)
    if "exclusiveMaximum" in schema:
        ex = schema["exclusiveMaximum"]
        hi = math.ceil(ex) - 1 if integer else ex - (0.5 if lo is None else (ex - lo) / 2)
    value = (lo if lo is not None else min(1, hi) if hi is not None else 1) + index
    if hi is not None:
        value = min(value, hi)
    return math.ceil(value) if integer else value


def _resolve_ref(root: dict, ref: str) -> dict:
    if not ref.startswith("#"):
        raise ValueError(f"only local $ref is supported, got {ref!r}")
    node: Any = root
    for part in ref.lstrip("#").strip("/").split("/"):
        if part == "":
            continue
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def default_content(body: dict | None) -> str:
    """The reply text the default responder gives: a schema instance, or ``{}``."""
    schema = schema_for_request(body)
    if schema is None:
        return "{}"
    return json.dumps(instance_from_schema(schema), ensure_ascii=False)


# --------------------------------------------------------------------------- server


def _tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def _message_text(message: Any) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _error_body(message: str, type_: str, code: str | None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True
    fake: FakeOpenAI


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeOpenAI/1.0"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.fake._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.fake._track(self.connection, False)

    # -- plumbing

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
        self._end_chat()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()
        except OSError:  # the client went away (e.g. it timed out during a hang)
            self.close_connection = True

    def _record(self, raw: bytes) -> Recorded:
        body = None
        if raw:
            try:
                parsed = json.loads(raw)
                body = parsed if isinstance(parsed, dict) else None
            except ValueError:
                body = None
        rec = Recorded(
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            raw=raw,
            method=self.command,
            received_at=time.monotonic(),
        )
        self.server.fake._append(rec)
        return rec

    # -- verbs

    def do_GET(self) -> None:
        self._record(b"")
        path = self.path.split("?", 1)[0]
        if path == MODELS_PATH:
            data = {"object": "list", "data": [{"id": "fake-model", "object": "model", "owned_by": "test"}]}
            self._send(200, json.dumps(data).encode())
        elif path == "/stats":  # for benchmarks: the latencies the server slept
            with self.server.fake._lock:
                stats = {"count": self.server.fake.count, "latencies": list(self.server.fake.latencies)}
            self._send(200, json.dumps(stats).encode())
        elif path in ("/health", "/v1/health"):
            self._send(200, b'{"status": "ok"}')
        else:
            self._send(404, _error_body(f"no route GET {path}", "invalid_request_error", "not_found"))

    def do_POST(self) -> None:
        raw = self._read_body()
        rec = self._record(raw)
        path = self.path.split("?", 1)[0]
        if path != CHAT_PATH:
            self._send(404, _error_body(f"no route POST {path}", "invalid_request_error", "not_found"))
            return
        fake = self.server.fake
        number = fake._begin_chat()
        self._chat_open = True
        try:
            self._chat(rec, number)
        finally:
            self._end_chat()

    def _end_chat(self) -> None:
        # Leave the in-flight count *before* the client can see the answer, so that a test
        # reading `in_flight` right after its call returns never sees a stale count.
        if getattr(self, "_chat_open", False):
            self._chat_open = False
            self.server.fake._end_chat()

    def _chat(self, rec: Recorded, number: int) -> None:
        fake = self.server.fake
        body = rec.body
        if body is None or not isinstance(body.get("messages"), list):
            msg = "request body must be a JSON object with a 'messages' list"
            self._send(400, _error_body(msg, "invalid_request_error", None))
            return
        try:
            action = fake._next_action(body, number)
            if fake.latency is not None:
                seconds = fake.latency()
                with fake._lock:
                    fake.latencies.append(seconds)
                fake._wait(seconds)
            if action.kind == "hang":
                fake._wait(action.seconds)
                action = fake._after_hang(action, body, number)
        except Exception as exc:  # a broken responder must be visible, not a silent 500
            fake._errors_append(exc)
            self._send(500, _error_body(f"fake server error: {exc!r}", "server_error", None))
            return

        if action.kind == "drop":
            self.close_connection = True
            self._end_chat()
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if action.kind == "malformed_body":
            self._send(200, MALFORMED_BODY)
            return
        if action.kind == "rate_limit":
            retry = action.retry_after if action.retry_after is not None else 0.05
            msg = f"Rate limit reached for requests. Please try again in {retry:g}s."
            self._send(
                429,
                _error_body(msg, "requests", "rate_limit_exceeded"),
                {"Retry-After": f"{retry:g}"},
            )
            return
        if action.kind == "server_error":
            msg = "The server had an error while processing your request."
            self._send(action.status, _error_body(msg, "server_error", None))
            return

        # reply
        if action.content is None:
            content = default_content(body)
        elif isinstance(action.content, str):
            content = action.content
        else:
            content = json.dumps(action.content, ensure_ascii=False)
        if action.cut:
            content = content[: len(content) // 2]
        prompt_text = "".join(_message_text(m) for m in body["messages"])
        usage = action.usage or {
            "prompt_tokens": _tokens(prompt_text),
            "completion_tokens": _tokens(content),
            "total_tokens": _tokens(prompt_text) + _tokens(content),
        }
        n = body.get("n") or 1
        payload = {
            "id": f"chatcmpl-fake-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake-model"),
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": action.finish_reason,
                }
                for i in range(n)
            ],
            "usage": usage,
        }
        self._send(200, json.dumps(payload, ensure_ascii=False).encode())


class FakeOpenAI:
    """An OpenAI-compatible chat-completions server on 127.0.0.1, started on construction.

    Use as a context manager (``with FakeOpenAI() as server:``) or call ``stop()``.
    """

    def __init__(
        self,
        responder: Callable[[dict, int], Action | str | dict | None] | None = None,
        latency: Callable[[], float] | None = None,
        seed: int = 0,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.responder = responder
        self.latency = latency
        self.seed = seed
        self.rng = random.Random(seed)
        self.requests: list[Recorded] = []
        self.errors: list[BaseException] = []  # exceptions raised by the responder / latency
        self.latencies: list[float] = []  # every latency slept, for benchmarks (GET /stats)
        self.max_in_flight = 0
        self._in_flight = 0
        self._count = 0
        self._queue: deque[Action] = deque()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._connections: set[socket.socket] = set()
        self._httpd = _Server((host, port), _Handler)
        self._httpd.fake = self
        self.host, self.port = self._httpd.server_address[:2]
        self.base_url = f"http://{self.host}:{self.port}/v1"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    # -- public API

    def __enter__(self) -> FakeOpenAI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def count(self) -> int:
        """Number of POST /v1/chat/completions received so far."""
        return self._count

    @property
    def in_flight(self) -> int:
        """Chat requests being handled right now."""
        return self._in_flight

    @property
    def chat_requests(self) -> list[Recorded]:
        """The recorded POST /v1/chat/completions requests, in arrival order."""
        with self._lock:
            return [r for r in self.requests if r.method == "POST" and r.path.split("?")[0] == CHAT_PATH]

    def queue(self, *actions: Action | str | dict) -> None:
        """The next chat requests get these actions, FIFO, before the responder is asked."""
        with self._lock:
            self._queue.extend(_coerce(a) for a in actions)

    def stop(self) -> None:
        """Stop serving, wake hanging handlers and close open connections. Idempotent."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            conns = list(self._connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    # -- used by the handler

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _append(self, rec: Recorded) -> None:
        with self._lock:
            self.requests.append(rec)

    def _errors_append(self, exc: BaseException) -> None:
        with self._lock:
            self.errors.append(exc)

    def _begin_chat(self) -> int:
        with self._lock:
            self._count += 1
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            return self._count

    def _end_chat(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _wait(self, seconds: float) -> None:
        if seconds > 0:
            self._stopped.wait(seconds)

    def _next_action(self, body: dict, number: int) -> Action:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        return self._respond(body, number)

    def _respond(self, body: dict, number: int) -> Action:
        if self.responder is None:
            return Action("reply")
        return _coerce(self.responder(body, number))

    def _after_hang(self, action: Action, body: dict, number: int) -> Action:
        if action.content is not None:
            return reply(action.content)
        follow = self._respond(body, number)
        return Action("reply") if follow.kind == "hang" else follow


def _coerce(value: Action | str | dict | list | None) -> Action:
    if isinstance(value, Action):
        return value
    if value is None:
        return Action("reply")
    if isinstance(value, str | dict | list):
        return reply(value)
    raise TypeError(f"responder returned {type(value).__name__}; expected Action, str, dict or None")


# --------------------------------------------------------------------------- standalone


def fault_responder(fault_rate: float, seed: int) -> Callable[[dict, int], Action]:
    """Each chat request independently gets a random fault with probability ``fault_rate``.

    The draw depends only on (seed, request number), so a run is reproducible per arrival order.
    """
    names = sorted(FAULTS)

    def respond(body: dict, number: int) -> Action:
        rng = random.Random(f"{seed}:{number}")
        if rng.random() < fault_rate:
            return FAULTS[rng.choice(names)]()
        return Action("reply")

    return respond


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-median", type=float, default=0.0, help="seconds; 0 = no latency")
    parser.add_argument("--latency-sigma", type=float, default=0.0, help="log-normal sigma (0 = constant)")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="probability of a random fault")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    latency = None
    if args.latency_median > 0:
        latency = lognormal_latency(args.latency_median, args.latency_sigma, random.Random(args.seed))
    responder = fault_responder(args.fault_rate, args.seed) if args.fault_rate > 0 else None
    server = FakeOpenAI(responder=responder, latency=latency, seed=args.seed, host=args.host, port=args.port)
    print(f"READY {server.base_url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        print(
            f"STOPPED requests={server.count} max_in_flight={server.max_in_flight}",
            file=sys.stderr,
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
