"""`--batch DIR`: a stage built from batch files (OpenAI Batch API, `vllm run-batch`).

No endpoint is contacted. Each invocation
1. imports every answer file in DIR into the cache (lines with `custom_id` and `response`
   or `error`); a line that failed (an error, a status other than 200, a body that is not
   a chat completion) is not imported, so its request is asked for again;
2. runs the stage as far as the cache answers (engine.Pending stops the other units);
3. writes the requests still needed as the next round's input in DIR and says what to
   submit. Chained steps and re-asks simply take more rounds; with nothing left, the stage
   has finished as usual.
A request's `custom_id` is its step and cache key, so an answer can only land on the
request that asked for it, and a request asked twice is written once.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy, iter_jsonl
from personaemp.llm.endpoints import LLMError, _parse_completion

MAX_LINES = 50_000  # the OpenAI Batch API's limits per input file
MAX_BYTES = 190 * 2**20  # (200 MB), with room to spare
URL = "/v1/chat/completions"
_ROUND = re.compile(r"-round-(\d+)")


class BatchQueue:
    """The requests a run could not answer from the cache: custom_id -> (step, key, body)."""

    # A request gets one answer line: an invalid answer is served again with its verdict (so
    # the engine re-asks, a new request), never queued again (the same request, the same line).
    answers_once = True

    def __init__(self) -> None:
        self.requests: dict[str, tuple[str, str, dict[str, Any]]] = {}

    def add(self, step: str, request: dict[str, Any], key: str) -> None:
        self.requests.setdefault(f"{step}-{key}", (step, key, request))


def _lines(path: Path):
    """(line number, object) of a batch file: the toolkit's JSONL reader, one-line errors."""
    try:
        for lineno, _, row in iter_jsonl(path, ErrorPolicy("fail")):
            yield lineno, row
    except RowError as error:
        raise InputError(
            f"{error.location}: {error.reason}", "a batch file holds one object per line"
        ) from None


def import_answers(folder: Path, cache) -> tuple[dict[str, int], dict[str, Path]]:
    """The answer lines in `folder` not in the cache yet, into the cache. Returns the counts
    and the requests of input files that have no answer line yet (custom_id -> file).

    A 4xx answer (the request itself was refused) is stored as an error, so its unit fails
    instead of asking the same request round after round; a line that failed otherwise
    (an error, a 5xx or 429, not a chat completion) is left out: it is asked again. A reply
    already in the cache is never replaced: the engine's verdict on it (invalid, re-asked)
    stands, and --retry-failed can ask afresh."""
    requests: dict[str, tuple[str, dict, Path]] = {}
    answers: list[dict] = []
    for path in sorted(folder.glob("*.jsonl")):
        for lineno, row in _lines(path):
            if not isinstance(row, dict) or "custom_id" not in row:
                raise InputError(
                    f"{path}:{lineno}: no custom_id", "only batch input and output files go in DIR"
                )
            if "body" in row:
                requests[row["custom_id"]] = (row["custom_id"].split("-", 1)[0], row["body"], path)
            else:
                answers.append(row)
    counts = {"imported": 0, "failed": 0, "refused": 0, "unknown": 0}
    answered: set[str] = set()
    for row in answers:
        custom_id = row["custom_id"]
        answered.add(custom_id)
        if custom_id not in requests:
            counts["unknown"] += 1  # its input file is gone: the request is asked again if needed
            continue
        step, body, _ = requests[custom_id]
        key = custom_id.split("-", 1)[1]
        if cache.has(key):
            continue  # imported in an earlier round
        response = row.get("response") or {}
        status = response.get("status_code")
        if isinstance(status, int) and 400 <= status < 500 and status not in (408, 409, 429):
            message = json.dumps((response.get("body") or {}).get("error", response.get("body")))[:300]
            cache.put(key, step, body, {"error": f"HTTP {status}: {message}", "status": status}, valid=True)
            counts["refused"] += 1
            continue
        try:
            if row.get("error") or status != 200:
                raise LLMError("server_error", "failed line")
            reply = _parse_completion(response.get("body"))
        except LLMError:
            counts["failed"] += 1
            continue
        cache.put(key, step, body, reply.as_dict(), valid=True)
        counts["imported"] += 1
    awaiting = {cid: path for cid, (_, _, path) in requests.items() if cid not in answered}
    return counts, awaiting


def write_requests(folder: Path, stage: str, queue: BatchQueue, awaiting: dict[str, Path]) -> list[Path]:
    """The next round's input files (OpenAI batch input lines), split at the API's limits,
    for the queued requests not already waiting in an unanswered input file."""
    rounds = [int(m.group(1)) for p in folder.glob(f"{stage}-round-*.jsonl") if (m := _ROUND.search(p.name))]
    number = max(rounds, default=0) + 1
    written: list[Path] = []
    lines: list[bytes] = []
    size = 0

    def flush() -> None:
        path = folder / f"{stage}-round-{number}-part-{len(written) + 1}.jsonl"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(b"".join(lines))
        tmp.replace(path)
        written.append(path)

    for custom_id, (_, _, body) in queue.requests.items():
        if custom_id in awaiting:
            continue  # already in a file waiting for its answers: submitting twice pays twice
        line = (
            json.dumps(
                {"custom_id": custom_id, "method": "POST", "url": URL, "body": body}, ensure_ascii=False
            ).encode()
            + b"\n"
        )
        if lines and (len(lines) >= MAX_LINES or size + len(line) > MAX_BYTES):
            flush()
            lines, size = [], 0
        lines.append(line)
        size += len(line)
    if lines:
        flush()
    return written
