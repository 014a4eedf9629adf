"""Endpoints and the pool that spreads requests over them, with retries and backoff.

The only module that imports `openai`. The client's own retries are off: this module
retries, so every attempt is counted and `Retry-After` is honoured the same way everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import email.utils
import functools
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai

from personaemp.errors import PersonaempError, UnitError
from personaemp.secrets import redact, redact_url

RETRIABLE_STATUS = {408, 409, 429}
TRANSPORT_KINDS = ("rate_limited", "timeout", "connection", "server_error")
CAUTIOUS_CONNECTION_RETRIES = 2  # before an endpoint has ever answered: a dead one fails in ~2 s
_FORMAT_WORDS = re.compile(
    r"response[_ ]?format|json[_ ]?schema|json[_ ]?object|structured|guided|grammar", re.I
)
BACKOFF_BASE = 0.5  # seconds; doubled per attempt, with jitter
BACKOFF_CAP = 30.0
RETRY_AFTER_CAP = 120.0  # a server asking for longer than this is treated as asking for this
# The most a reply may weigh on the wire, from the request's max_tokens. Content and reasoning
# share max_tokens; real text averages 3-5 bytes a token, JSON-escaped CJK ~6, emoji up to 12
# (two \uXXXX escapes): 16 bytes covers any real average. vLLM sends the reasoning twice
# (reasoning_content and reasoning): x2. The envelope (ids, usage, an error body) fits in 64 KiB.
REPLY_BYTES_PER_TOKEN = 32
REPLY_OVERHEAD = 64 * 1024
REPLY_TOKENS_UNSTATED = 32768  # a request without max_tokens (none of ours): a generous bound


class LLMError(UnitError):
    """One call failed for good; the unit that made it goes to the failures file.

    `status` and `server_message` are set for HTTP errors (the endpoint's own words)."""

    status: int | None = None
    server_message: str = ""
    retry_after: float | None = None
    endpoint: str = "the endpoint"  # its base URL, for run-level messages
    too_large: bool = False  # the reply passed the size bound of its max_tokens


@dataclass
class RawReply:
    content: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning: str = ""  # reasoning_content / reasoning, as vLLM, SGLang and DeepSeek send it
    reasoning_tokens: int | None = None
    seconds: float | None = None  # how long the endpoint took to answer (not cached)
    cached_tokens: int | None = None  # prompt tokens the provider's prefix cache served

    def as_dict(self) -> dict[str, Any]:
        return {name: value for name, value in self.__dict__.items() if name != "seconds"}


class RateLimiter:
    """At most `rpm` request starts per rolling minute (simple spacing of starts)."""

    def __init__(self, rpm: float | None):
        self.interval = 60.0 / rpm if rpm else 0.0
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        if not self.interval:
            return
        async with self._lock:
            now = time.monotonic()
            delay = self._next - now
            self._next = max(now, self._next) + self.interval
        if delay > 0:
            await asyncio.sleep(delay)


def reply_limit(request: dict[str, Any]) -> int:
    """Bytes a reply to `request` may have (see REPLY_BYTES_PER_TOKEN)."""
    tokens = request.get("max_tokens") or request.get("max_completion_tokens") or REPLY_TOKENS_UNSTATED
    return tokens * REPLY_BYTES_PER_TOKEN + REPLY_OVERHEAD


class ReplyTooLarge(Exception):
    def __init__(self, limit: int):
        super().__init__(f"reply larger than {limit} bytes")
        self.limit = limit


# The byte limit of the request being sent by this task (set by _send_once, read by the hook).
_limit: contextvars.ContextVar[int | None] = contextvars.ContextVar("reply_limit", default=None)


async def _read_bounded(response) -> None:
    """Response hook: read the body here, decoded, and give up once it passes the limit, so an
    oversized reply is never held whole. The client's own read then finds it read."""
    limit = _limit.get()
    if limit is None:
        return
    parts, size = [], 0
    async with contextlib.aclosing(response.aiter_bytes()) as chunks:
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise ReplyTooLarge(limit)
            parts.append(chunk)
    response._content = b"".join(parts)  # what Response.aread() returns once set


class Endpoint:
    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        concurrency: int,
        rpm: float | None,
        timeout: float,
        key_source: str = "$OPENAI_API_KEY",
    ):
        self.base_url = redact_url(base_url)  # as shown and stored; the client alone has it whole
        self.key_source = key_source  # where the key came from, for a 401 (never the key)
        self.timeout = timeout  # seconds for a whole request, connect to last byte
        # (request, its timeouts so far) -> seconds for it, in place of `timeout` (the embedded
        # model's: from its measured speed and the request's max_tokens, session.local_deadline)
        self.deadline: Callable[[dict[str, Any], int], float] | None = None
        self.concurrency = concurrency
        self.in_flight = 0
        self.failures_in_row = 0
        self.cooldown_until = 0.0  # after transport failures, prefer the other endpoints
        self.limiter = RateLimiter(rpm)
        # The key lives only inside the client object; nothing else stores it.
        tls = _tls_context()
        http = {"verify": tls} if tls is not None else {}
        self.client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or "none",
            max_retries=0,
            timeout=timeout,  # per connect and read; _send_once bounds the whole request
            http_client=openai.DefaultAsyncHttpxClient(event_hooks={"response": [_read_bounded]}, **http),
        )


@functools.cache
def _tls_context():
    """One TLS context for every client of the process, built as the openai client builds
    its own (CA bundle, SSL_CERT_FILE...): loading the CA bundle cost 35 ms of CPU per
    client, per endpoint and stage. None (the client's own) if the HTTP library differs."""
    from openai import _base_client

    http = getattr(_base_client, "httpx2", None) or getattr(_base_client, "httpx", None)
    create = getattr(http, "create_ssl_context", None)
    return create() if create is not None else None


class EndpointPool:
    """Caps requests in flight per endpoint and sends each to the least busy one."""

    def __init__(self, endpoints: list[Endpoint], max_retries: int):
        self.endpoints = endpoints
        self.max_retries = max_retries
        self._slots = asyncio.Semaphore(sum(e.concurrency for e in endpoints))
        self._turn = 0  # rotates ties so equally busy endpoints share the load
        self._sent: dict[int, float] = {}  # requests on the wire: when each was sent (monotonic)
        self._sent_count = 0

    def waiting(self) -> tuple[int, float]:
        """Requests on the wire now, and how long the oldest has waited for its reply (s)."""
        started = list(self._sent.values())  # one C-level copy: safe from another thread
        return len(started), (time.monotonic() - min(started)) if started else 0.0

    def _pick(self) -> Endpoint:
        """The least busy endpoint with a free slot, healthy ones first."""
        now = time.monotonic()
        self._turn += 1
        count = len(self.endpoints)
        candidates = [e for e in self.endpoints if e.in_flight < e.concurrency]
        return min(
            candidates,
            key=lambda e: (
                e.cooldown_until > now,
                e.in_flight / e.concurrency,
                (self.endpoints.index(e) - self._turn) % count,
            ),
        )

    async def send(self, request: dict[str, Any], on_retry, *, cautious: bool = False) -> RawReply:
        """Send one chat request; retry retriable failures with backoff. Raises LLMError.

        `cautious` (no reply seen yet on this run): a refused connection is retried only
        briefly, so a dead endpoint is told in seconds. A refused response format is never
        retried: the engine steps down to another format instead."""
        attempt = timeouts = 0
        while True:
            try:
                return await self._send_once(request, timeouts)
            except LLMError as error:
                timeouts += error.kind == "timeout"
                retries = self.max_retries
                if cautious and error.kind == "connection":
                    retries = min(retries, CAUTIOUS_CONNECTION_RETRIES)
                if refuses_format(error, request):
                    retries = 0
                if error.kind not in TRANSPORT_KINDS or attempt >= retries:
                    error.attempts = attempt + 1
                    raise
                delay = getattr(error, "retry_after", None)
                if delay is not None:
                    delay = min(delay, RETRY_AFTER_CAP)
                else:
                    delay = min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt) * random.uniform(0.5, 1.0)
                attempt += 1
                on_retry(error, attempt, retries)
                await asyncio.sleep(delay)

    async def _send_once(self, request: dict[str, Any], timeouts: int = 0) -> RawReply:
        async with self._slots:
            endpoint = self._pick()
            endpoint.in_flight += 1
            limit = _limit.set(reply_limit(request))
            self._sent_count += 1
            number = self._sent_count
            seconds = endpoint.timeout if endpoint.deadline is None else endpoint.deadline(request, timeouts)
            try:
                await endpoint.limiter.wait()
                started = self._sent[number] = time.monotonic()
                options: dict[str, Any] = {} if endpoint.deadline is None else {"timeout": seconds}
                # The client's timeout is per read: a server sending a byte at a time would
                # hold the request forever. This deadline is for the whole of it.
                async with asyncio.timeout(seconds):
                    # The generic post() sends the request as built: chat.completions.create()
                    # would walk every message and schema to "transform" them (~1 ms CPU each).
                    response = await endpoint.client.post(
                        "/chat/completions", body=request, cast_to=dict, options=options
                    )
            except openai.APIStatusError as exc:
                error = _status_error(exc, endpoint.key_source)
            except (openai.APITimeoutError, TimeoutError):
                whole = f"no whole reply within {round(seconds, 1):g} s"
                error = LLMError("timeout", f"the request timed out ({whole})")
            except ReplyTooLarge as exc:
                error = LLMError(
                    "server_error",
                    f"the reply passed {exc.limit} bytes, more than max_tokens {request.get('max_tokens')} "
                    "can hold; cut off",
                )
                error.too_large = True
            except openai.APIConnectionError as exc:
                error = LLMError("connection", f"connection failed ({_connection_cause(exc)})")
            except (openai.APIResponseValidationError, ValueError) as exc:
                error = LLMError("server_error", f"unreadable response ({_first_line(exc)})")
            else:
                error = None
            finally:
                _limit.reset(limit)
                endpoint.in_flight -= 1
                self._sent.pop(number, None)
            _note_health(endpoint, error)
            if isinstance(error, LLMError):
                error.endpoint = endpoint.base_url
            if error is not None:
                raise error
        reply = _parse_completion(response)
        reply.seconds = time.monotonic() - started
        return reply


def cached_tokens(usage: dict) -> int | None:
    """The prompt tokens a provider's prefix cache served: OpenAI (and vLLM) say
    prompt_tokens_details.cached_tokens, DeepSeek prompt_cache_hit_tokens; None when neither."""
    details = usage.get("prompt_tokens_details") or {}
    for value in (details.get("cached_tokens") if isinstance(details, dict) else None,
                  usage.get("prompt_cache_hit_tokens")):  # fmt: skip
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _parse_completion(response: Any) -> RawReply:
    try:
        choice = response["choices"][0]
        message = choice["message"]
        content = message.get("content") or ""
        reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        usage = response.get("usage") or {}
        details = usage.get("completion_tokens_details") or {}
        if not isinstance(content, str) or not isinstance(reasoning, str):
            raise TypeError("content is not a string")
        return RawReply(
            content=redact(content),
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            reasoning=redact(reasoning),
            reasoning_tokens=details.get("reasoning_tokens"),
            cached_tokens=cached_tokens(usage),
        )
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise LLMError("server_error", f"not a chat completion ({type(exc).__name__}: {exc})") from None


def refuses_format(error: LLMError, request: dict[str, Any]) -> bool:
    """Did the endpoint refuse the request's response_format? DeepSeek says 400 "This
    response_format type is unavailable now", llama-cpp-python 500 with a validation error
    on response_format.type, others 422: all name it."""
    return (
        "response_format" in request
        and error.status is not None
        and (error.status in (400, 422) or error.status >= 500)
        and bool(_FORMAT_WORDS.search(error.server_message))
    )


def mentions_format(message: str) -> bool:
    return bool(_FORMAT_WORDS.search(message))


def _note_health(endpoint: Endpoint, error: Exception | None) -> None:
    if isinstance(error, LLMError) and error.kind in ("timeout", "connection", "server_error"):
        endpoint.failures_in_row += 1
        endpoint.cooldown_until = time.monotonic() + min(BACKOFF_CAP, 2 ** (endpoint.failures_in_row - 1))
    elif error is None:
        endpoint.failures_in_row, endpoint.cooldown_until = 0, 0.0


def _first_line(exc: BaseException) -> str:
    text = redact(str(exc).strip())
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _connection_cause(exc: BaseException) -> str:
    """The innermost cause's words ("Connection refused", a DNS failure), not the wrapper's."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return _first_line(exc)


def server_message(exc: openai.APIStatusError) -> str:
    """The endpoint's own error message: body.error.message, body.message, or the first line."""
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        text = inner.get("message") if isinstance(inner, dict) else inner
        if isinstance(text, str) and text.strip():
            return redact(" ".join(text.split()))[:300]
    return _first_line(exc)


def _status_error(exc: openai.APIStatusError, key_source: str = "$OPENAI_API_KEY") -> Exception:
    status = exc.status_code
    said = server_message(exc)
    message = f"HTTP {status}: {said}"
    if status in (401, 403):
        # Every request would fail the same way: stop the run, do not fill the failures file.
        return PersonaempError(
            f"the endpoint refused the API key ({message}); the key came from {key_source}",
            f"check {key_source.split(' ')[0] if key_source.startswith('$') else 'the key you passed'}",
        )
    if status == 404:
        return PersonaempError(
            f"the endpoint has no such model or path ({message})", "check --model and --base-url"
        )
    if (status in RETRIABLE_STATUS or status >= 500) and status != 501:
        error = LLMError("rate_limited" if status == 429 else "server_error", message)
        error.retry_after = _retry_after(exc.response.headers)
    else:  # 400, 422, 501 Not Implemented...: asking again would get the same answer
        error = LLMError("http_error", message)
    error.status, error.server_message = status, said
    return error


def _retry_after(headers) -> float | None:
    """Seconds the server asked us to wait: retry-after-ms, retry-after (seconds or a date)."""
    try:
        if headers.get("retry-after-ms"):
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None
