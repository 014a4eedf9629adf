"""`--llm vllm --executor ray`: the model in vLLM engines on the Ray cluster's GPUs, no endpoint.

A stage runs in rounds over the batch-file machinery (llm/batch.py), in a folder of the work
folder that no one edits by hand:
1. the stage runs as far as the cache answers and writes the requests it still needs;
2. those requests become a Ray Dataset, and ray.data.llm's vLLM processor answers them: the
   chat template, then vLLM, with each request's JSON schema as its structured output
   (`sampling_params.structured_outputs.json`); a request vLLM fails on comes back as an
   error row (`should_continue_on_error`), not a failed job;
3. the answers are written as batch answer lines, one by one, and imported into the cache;
then again, until the stage asks for nothing more (chained steps and re-asks are rounds).
So the rows, failures file and report are those of any other run of the stage, and a killed
run resumes: the cache holds every answer imported, the answers file of an unfinished round
is kept up to its last whole line, and only the requests with no answer go to vLLM again.

Each round is one Ray Data job, so its engines load the model once per round: rounds are few
(a stage's steps and re-asks), and each answers every unit's request at once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from personaemp.errors import InputError, PersonaempError
from personaemp.llm.batch import _lines
from personaemp.llm.settings import LLMSettings

MAX_ROUNDS = 40  # a stage's steps x (1 + re-asks) is far fewer: more means a loop
REFUSED = 422  # an answer line for a request vLLM failed on: the unit fails, it is not re-sent
ANSWERS = "vllm-answers-"  # answers files; the stage's request files are <stage>-round-N-part-K


def uses_vllm(settings: LLMSettings) -> bool:
    """Whether a stage runs in vLLM rounds: not for --estimate (it sends nothing) nor with
    --batch (the user answers the rounds' files, e.g. with `vllm run-batch`)."""
    return settings.llm == "vllm" and not settings.estimate and settings.batch is None


# --- one request, one answer line --------------------------------------------------------------


def vllm_input(row: dict[str, Any]) -> dict[str, Any]:
    """A batch request (custom_id, body: a chat-completions request) as vLLM's processor
    takes it: the messages, and the sampling with the reply's schema as structured output.
    The schema travels as JSON text, so rows with different schemas fit one Arrow column."""
    body = json.loads(row["body"])
    sampling: dict[str, Any] = {"temperature": body["temperature"], "max_tokens": body["max_tokens"]}
    if body.get("seed") is not None:
        sampling["seed"] = body["seed"]
    response_format = body.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        schema = response_format["json_schema"]["schema"]
        sampling["structured_outputs"] = {"json": json.dumps(schema, ensure_ascii=False)}
    elif response_format.get("type") == "json_object":
        schema = response_format.get("schema")
        constraint = {"json": json.dumps(schema, ensure_ascii=False)} if schema else {"json_object": True}
        sampling["structured_outputs"] = constraint
    return {"messages": body["messages"], "sampling_params": sampling}


def answer_line(row: dict[str, Any], model: str) -> dict[str, Any]:
    """A processed row as a batch answer line (OpenAI batch output format), which
    batch.import_answers reads: a chat completion, or a refusal for a request vLLM failed."""
    error = row.get("__inference_error__") or ""
    if error:
        body = {"error": {"message": str(error)[:500], "type": "vllm_error"}}
        return {"custom_id": row["custom_id"], "response": {"status_code": REFUSED, "body": body}}
    limit = json.loads(row["body"])["max_tokens"]
    generated = int(row.get("num_generated_tokens") or 0)
    completion = {
        "id": f"vllm-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": row.get("generated_text") or ""},
                # ray.data.llm gives no finish reason: a reply that used every token was cut
                "finish_reason": "length" if generated >= limit else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": int(row.get("num_input_tokens") or 0),
            "completion_tokens": generated,
            "total_tokens": int(row.get("num_input_tokens") or 0) + generated,
        },
    }
    return {"custom_id": row["custom_id"], "response": {"status_code": 200, "body": completion}}


def _keep_columns(row: dict[str, Any]) -> dict[str, Any]:
    """What answer_line needs of vLLM's output row (the prompt and token ids stay behind)."""
    return {
        key: row.get(key)
        for key in ("custom_id", "body", "generated_text", "num_input_tokens", "num_generated_tokens")
    }


# --- the processor -------------------------------------------------------------------------------


@dataclass
class Processor:
    """A ray.data.llm processor's parts: its config, and the row maps around it."""

    config: Any
    preprocess: Callable[[dict], dict]
    postprocess: Callable[[dict], dict]


def vllm_processor(settings: LLMSettings) -> Processor:
    """ray.data.llm's vLLM processor for `settings.model`: `--workers` engines, each
    request's row kept going when vLLM fails on it (an error row)."""
    try:
        from ray.data.llm import vLLMEngineProcessorConfig
    except ImportError:
        raise InputError(
            "--llm vllm needs ray.data.llm and vLLM, which are not installed",
            "pip install 'personaemp[vllm]'",
        ) from None
    engine = dict(settings.vllm.get("engine") or {})
    processor = dict(settings.vllm.get("processor") or {})
    processor.setdefault("batch_size", 64)
    processor.setdefault("concurrency", settings.workers)
    ours = {"model_source": settings.model, "engine_kwargs": engine, "should_continue_on_error": True}
    if taken := sorted(set(processor) & set(ours)):
        raise InputError(
            f"--vllm processor.{taken[0]} is set by personaemp",
            "--model names the model, --vllm engine.KEY=VALUE goes to the engine",
        )
    try:
        config = vLLMEngineProcessorConfig(**ours, **processor)
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        said = " ".join(str(exc).split())[:300]
        raise InputError(
            f"--vllm processor: {said}", "see ray.data.llm's vLLMEngineProcessorConfig"
        ) from None
    return Processor(config, vllm_input, _keep_columns)


# Who builds the processor: tests put ray.data.llm's HTTP processor here (no GPU on CPU CI).
build_processor_for: Callable[[LLMSettings], Processor] = vllm_processor


# --- rounds --------------------------------------------------------------------------------------


def folder_for(settings: LLMSettings, stage: str, output: Path) -> Path:
    """The stage's rounds folder: one per stage and output (respond writes one per system)."""
    digest = hashlib.sha256(os.path.abspath(output).encode()).hexdigest()[:10]
    return settings.work_dir / "vllm" / f"{stage}-{digest}"


def unanswered(folder: Path, only: set[str] | None = None) -> list[tuple[str, dict]]:
    """(custom_id, body) of each request in the folder with no answer line yet (`only`: of
    these custom_ids: what the stage asks for now, not what a killed run with other
    options had asked for)."""
    requests: dict[str, dict] = {}
    answered: set[str] = set()
    for path in sorted(folder.glob("*.jsonl")):
        for _, row in _lines(path):
            if "body" in row:
                requests.setdefault(row["custom_id"], row["body"])
            else:
                answered.add(row["custom_id"])
    return [
        (custom_id, body)
        for custom_id, body in requests.items()
        if custom_id not in answered and (only is None or custom_id in only)
    ]


def salvage(folder: Path) -> int:
    """An answers file a killed run left (`.partial`): its whole lines kept as answers."""
    kept = 0
    for partial in folder.glob(f".{ANSWERS}*.partial"):
        lines = []
        for line in partial.read_bytes().split(b"\n"):
            try:
                json.loads(line)
            except ValueError:
                continue  # the line being written when the run died
            lines.append(line + b"\n")
        final = folder / partial.name[1:].removesuffix(".partial")
        final.write_bytes(b"".join(lines))
        partial.unlink()
        kept += len(lines)
    return kept


def answer(
    folder: Path,
    requests: list[tuple[str, dict]],
    settings: LLMSettings,
    on_answer: Callable[[], None] = lambda: None,
    parts: Processor | None = None,
) -> dict[str, Any]:
    """One round: `requests` through the processor (`parts`, else build_processor_for's) on
    Ray, each answer written (and flushed) as it comes; the answers file is named final
    once the round is done. Blocking."""
    import logging

    import ray
    from ray.data import DataContext
    from ray.data.llm import build_processor

    parts = parts or build_processor_for(settings)

    # Ray Data's own progress bars and INFO lines: the round's bar (rounds) says as much.
    DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)

    try:
        processor = build_processor(parts.config, preprocess=parts.preprocess, postprocess=parts.postprocess)
    except ImportError as exc:  # ray.data.llm's vLLM processor imports transformers, then vLLM
        raise InputError(
            f"--llm vllm needs {exc.name or 'vLLM'}, which is not installed here",
            "pip install 'personaemp[vllm]' (vLLM runs on CUDA GPUs)",
        ) from None
    items = [{"custom_id": cid, "body": json.dumps(body, ensure_ascii=False)} for cid, body in requests]
    name = f"{ANSWERS}{uuid.uuid4().hex[:8]}.jsonl"
    partial = folder / f".{name}.partial"
    started = time.perf_counter()
    counts = {"requests": len(items), "answered": 0, "refused": 0, "prompt_tokens": 0, "completion_tokens": 0}
    try:
        _write_answers(processor(ray.data.from_items(items)), partial, settings, counts, on_answer)
    except Exception as exc:  # noqa: BLE001 - the Ray Data job failed: its first cause says why
        kept = counts["answered"] + counts["refused"]
        raise PersonaempError(
            f"a vLLM round stopped: {_root_cause(exc)}",
            f"its {kept} answers so far are kept: see Ray's logs (/tmp/ray/session_latest/logs), "
            "then run the same command again",
        ) from None
    partial.replace(folder / name)
    counts["seconds"] = round(time.perf_counter() - started, 1)
    return counts


_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))(?:\(.*?\))?: (.+)$")
_WRAPPERS = ("UserCodeException", "RayTaskError", "RaySystemError")


def _root_cause(exc: BaseException) -> str:
    """The error under Ray's wrappers, in one line: Ray's text of a failed task holds the
    original traceback first ("RuntimeError: ..."), then its own wrappers."""
    for line in str(exc).splitlines():
        found = _RAISED.match(line.strip())
        if found and not found.group(1).rsplit(".", 1)[-1].startswith(_WRAPPERS):
            return f"{found.group(1).rsplit('.', 1)[-1]}: {found.group(2)[:300]}"
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first[:300]}"


def _write_answers(dataset, partial: Path, settings: LLMSettings, counts: dict, on_answer) -> None:
    """The round's answers, each written and flushed as it comes back."""
    with open(partial, "wb") as sink:
        for row in dataset.iter_rows():
            line = answer_line(row, settings.model or "")
            sink.write(json.dumps(line, ensure_ascii=False).encode() + b"\n")
            sink.flush()
            on_answer()
            status = line["response"]["status_code"]
            counts["answered" if status == 200 else "refused"] += 1
            if status == 200:
                usage = line["response"]["body"]["usage"]
                counts["prompt_tokens"] += usage["prompt_tokens"]
                counts["completion_tokens"] += usage["completion_tokens"]


class Rounds:
    """A stage's vLLM rounds: its passes run from batch files in its rounds folder (`settings`)
    until one asks for nothing more; between passes (`after`), vLLM on Ray answers what the
    last one asked for. The last pass's report is the stage's: every round's figures in its
    notes (`notes`), and the units finished by earlier passes counted as finished in this
    run, not before it.

    A round runs on this thread, the event loop waiting: nothing else runs meanwhile (no
    chain, no stream on --llm vllm), and Ctrl-C stops it at once (a thread would be waited for)."""

    def __init__(self, settings: LLMSettings, stage: str, output: Path, console) -> None:
        self.parts = build_processor_for(settings)  # a wrong --vllm setting said before any pass
        self.folder = folder_for(settings, stage, output)
        self.folder.mkdir(parents=True, exist_ok=True)
        kept = salvage(self.folder)
        self.given, self.stage, self.console = settings, stage, console
        self.settings = replace(settings, batch=self.folder)  # each pass's
        self.figures = {"rounds": 0, "requests": 0, "answered": 0, "refused": 0, "prompt_tokens": 0,
                        "completion_tokens": 0, "seconds": 0.0}  # fmt: skip
        self.first = None  # the first pass's outcome: what was finished before this run
        console.print(f"[bold]{stage}[/]: model {settings.model} · vLLM on Ray, in rounds")
        if kept:
            console.print(f"{stage}: {kept} answers of an unfinished round kept")

    def notes(self) -> dict[str, dict[str, Any]]:
        """The rounds' figures so far, for the pass's report."""
        return {"vllm": {"text": _summary(self.figures), **self.figures}} if self.figures["rounds"] else {}

    def after(self, report) -> bool:
        """After a pass: answer what it asked for in a round, and say another pass follows;
        or, when it asked for nothing, end (its report counted as the whole run's)."""
        from rich.progress import Progress

        from personaemp.llm.ray_executor import connect

        stage, folder, figures = self.stage, self.folder, self.figures
        self.first = self.first or replace(report.outcome)
        if not (report.batch or {}).get("files"):
            shutil.rmtree(folder, ignore_errors=True)  # the cache holds every answer
            first, last = self.first, report.outcome  # units finished by earlier passes are this run's too
            last.done, last.done_before = last.done + last.done_before - first.done_before, first.done_before
            last.failed, last.failed_before = (
                last.failed + last.failed_before - first.failed_before, first.failed_before,
            )  # fmt: skip
            return False
        requests = unanswered(folder, set(report.batch["queued"]))
        if figures["rounds"] >= MAX_ROUNDS or not requests:
            raise PersonaempError(
                f"{stage}: still asking after {figures['rounds']} vLLM rounds ({len(requests)} requests "
                "unanswered)",
                f"look at the requests in {folder}",
            )
        where = f" on {connect(self.given)}" if figures["rounds"] == 0 else ""
        title = f"{stage}: round {figures['rounds'] + 1}, {len(requests)} requests to vLLM{where}"
        self.console.print(title)
        with Progress(*Progress.get_default_columns(), console=self.console, transient=True) as progress:
            task = progress.add_task(title, total=len(requests))
            advance = functools.partial(progress.advance, task)
            counts = answer(folder, requests, self.given, advance, self.parts)
        figures["rounds"] += 1
        for key, value in counts.items():
            figures[key] += value
        return True


def _summary(figures: dict[str, Any]) -> str:
    refused = f", {figures['refused']} failed in vLLM" if figures["refused"] else ""
    return (
        f"vLLM on Ray: {figures['requests']} requests in {figures['rounds']} rounds "
        f"({figures['seconds']:.0f} s){refused}"
    )
