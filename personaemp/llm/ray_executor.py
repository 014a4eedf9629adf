"""`--executor ray`: an LLM stage's units run on a pool of Ray workers; this process writes.

The units still to do become a Ray Dataset; `map_batches` runs them on an actor pool
(ActorPoolStrategy), each actor holding one engine (its own HTTP clients and cache handle,
its share of --concurrency and --rpm) and running the stage's own `make_work(engine)`, shipped
to it with cloudpickle. Each unit comes back as its row, its failure (a UnitError: a failure
row, never a failed job) or the error that stops the run (as one process would stop). This
process writes every result through runner.StageRun, as run_units does, so the output,
failures file, report and freshness record are those of a one-process run.

Nothing twice, nothing lost: a worker or node lost mid-stage has its blocks redone (Ray
Data's actors restart and their tasks are retried); a unit already written is not written
again (by unit id). A killed driver loses at most the units in flight: the rows it wrote are
skipped on the next run (the output scan), and the reply cache answers the requests the
workers had answered. Ray Data's own checkpointing (DataContext.checkpoint_config) is not
used: it covers a plan from a read to a Ray Data write, while these rows are written here,
by the runner that already resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import logging
import math
import os
import pickle
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from personaemp import locks
from personaemp.errors import InputError, PersonaempError, UnitError
from personaemp.llm.accounting import CALLS_KEPT, Accounting
from personaemp.llm.settings import LLMSettings
from personaemp.runner import StageOutcome, StageRun

# Blocks an actor runs at once: while one waits on its slowest unit, the others keep the
# actor's share of the endpoint busy.
CALLS_PER_WORKER = 4
WORKER_CPUS = 1.0  # one core per engine: the client does its JSON and checks there


def uses_ray(settings: LLMSettings) -> bool:
    """Whether the units go to Ray: --estimate and --batch send nothing, so they stay here."""
    return settings.executor == "ray" and not settings.estimate and settings.batch is None


def pool_size(settings: LLMSettings) -> tuple[int, int]:
    """(workers, requests in flight per endpoint per worker): all of them within --concurrency."""
    workers = min(settings.workers, settings.concurrency)
    return workers, settings.concurrency // workers


def connect(settings: LLMSettings) -> str:
    """Ray ready in this process; a line saying which (a local Ray started: its start-up time)."""
    try:
        import ray
    except ImportError:
        raise InputError(
            "--executor ray needs Ray, which is not installed", "pip install 'personaemp[ray]'"
        ) from None
    _quiet_data()
    if ray.is_initialized():
        return "Ray (connected before)"
    started = time.perf_counter()
    address = settings.ray_address or os.environ.get("RAY_ADDRESS")
    local = {} if address else {"num_cpus": max(os.cpu_count() or 1, settings.workers)}
    try:
        # The workers' own output stays in Ray's logs: what a unit or the run meets comes back.
        ray.init(
            address=address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
            **local,
        )  # fmt: skip
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise PersonaempError(
            f"cannot reach the Ray cluster at {address} ({str(exc).splitlines()[0]})",
            "check --ray-address (RAY_ADDRESS), or leave it unset to start a local Ray",
        ) from None
    seconds = time.perf_counter() - started
    return f"Ray at {address}" if address else f"a local Ray (started in {seconds:.1f} s)"


def _quiet_data() -> None:
    """No Ray Data progress bars or plan lines: the stage's own bar is on the console."""
    from ray.data import DataContext

    context = DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    for name in ("ray.data", "ray.data._internal"):
        logging.getLogger(name).setLevel(logging.WARNING)


@dataclasses.dataclass
class WorkerFigures:
    """What the workers counted (requests, tokens, cache hits...), merged as one engine's."""

    latest: dict[str, tuple[int, Accounting, dict]] = dataclasses.field(default_factory=dict)

    def add(self, blob: bytes) -> bool:
        """One worker's running figures; True if they are newer than those held."""
        name, seq, accounting, structured = pickle.loads(blob)
        if name in self.latest and self.latest[name][0] >= seq:
            return False
        self.latest[name] = (seq, accounting, structured)
        return True

    def accounting(self) -> Accounting:
        return merged([accounting for _, accounting, _ in self.latest.values()])

    def structured(self) -> dict | None:
        """The structured mode the workers used (the first worker's word on it)."""
        return next((structured for _, _, structured in self.latest.values()), None)


def merged(parts: Iterable[Accounting]) -> Accounting:
    """Several engines' accounting as one: counts summed, the slowest calls kept."""
    total = Accounting()
    slowest: list = []
    for part in parts:
        for name, stats in part.steps.items():
            into = total.step(name)
            for field in dataclasses.fields(stats):
                if field.name == "failures":
                    into.failures.update(stats.failures)
                elif field.name == "slowest":
                    into.slowest = max(into.slowest, stats.slowest)
                else:
                    setattr(into, field.name, getattr(into, field.name) + getattr(stats, field.name))
        slowest += [(seconds, total._answered + order, call) for seconds, order, call in part._slowest]
        total._answered += part._answered
    total._slowest = sorted(slowest, key=lambda entry: entry[0])[-CALLS_KEPT:]
    return total


def _worker_settings(settings: LLMSettings, share: int, workers: int) -> dict[str, Any]:
    """The worker's LLMSettings arguments: its share of the limits, one process each.

    The key goes along only when it is not in this process's environment (given as an
    argument): a local Ray's workers inherit the environment, a cluster's get it from the
    job's runtime_env, so a key from the environment never travels through Ray."""
    fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.init}
    key = settings.api_key if os.environ.get(settings.key_env) != settings.api_key else None
    return {
        **fields, "api_key": key, "concurrency": share, "executor": "local",
        "rpm": settings.rpm / workers if settings.rpm else settings.rpm,
        "max_cost": settings.max_cost / workers if settings.max_cost else settings.max_cost,
    }  # fmt: skip


def _recipe(make_work: Callable, fingerprint: Callable) -> bytes:
    """The stage's work and fingerprint for the workers. A stage reads its prompts once per
    run through a functools.cache made inside it, which pickle cannot name: it goes as a
    new cache over the same function (the worker checks it computes the same fingerprint)."""
    import functools

    from ray import cloudpickle

    class Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, functools._lru_cache_wrapper) and "<locals>" in obj.__qualname__:
                return functools.cache, (obj.__wrapped__,)
            return super().reducer_override(obj)

    buffer = io.BytesIO()
    Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump((make_work, fingerprint))
    return buffer.getvalue()


class UnitWorker:
    """A Ray Data actor: one engine, the stage's work on each unit of a batch, concurrently."""

    def __init__(self, recipe: bytes, settings: dict[str, Any], fingerprint: str):
        self.recipe, self.settings, self.fingerprint = recipe, settings, fingerprint
        self.name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.seq = 0
        self.engine = self.work = self.ready = None

    async def _open(self) -> None:
        from ray import cloudpickle

        from personaemp.llm.session import open_engine

        make_work, fingerprint = cloudpickle.loads(self.recipe)
        self.stack = contextlib.AsyncExitStack()  # open while the actor lives
        engine = await self.stack.enter_async_context(open_engine(LLMSettings(**self.settings)))
        if fingerprint(engine) != self.fingerprint:
            raise PersonaempError(
                f"Ray worker {self.name} would make other rows than the driver (prompts, model or "
                "personaemp differ there)",
                "install the same personaemp and prompts on every node",
            )
        self.engine, self.work = engine, make_work(engine)

    async def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        if self.ready is None:
            self.ready = asyncio.ensure_future(self._open())
        try:
            await self.ready
        except Exception as exc:  # every unit of the batch stops the run with it
            results = [(b"", _fatal(exc))] * len(batch["uid"])
        else:
            results = await asyncio.gather(*(self._one(unit) for unit in batch["unit"]))
        self.seq += 1
        figures = b""
        if self.engine is not None:
            figures = pickle.dumps(
                (self.name, self.seq, self.engine.accounting, self.engine.structured_report())
            )
        return {
            "uid": list(batch["uid"]),
            "result": [result for result, _ in results],
            "fatal": [fatal for _, fatal in results],
            "figures": [figures] + [b""] * (len(results) - 1),
        }

    async def _one(self, encoded: bytes) -> tuple[bytes, bytes]:
        try:
            row = await self.work(msgspec.json.decode(encoded))
        except UnitError as error:
            failed = {"kind": error.kind, "error": str(error), "raw": error.raw, "attempts": error.attempts}
            return msgspec.json.encode({"failed": failed}), b""
        except Exception as exc:  # noqa: BLE001 - as one process: the run stops with it
            return b"", _fatal(exc)
        return msgspec.json.encode({"row": row}), b""


def _fatal(exc: BaseException) -> bytes:
    text = "".join(traceback.format_exception(exc))
    try:
        return pickle.dumps((exc, text))
    except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
        return pickle.dumps((None, text))


def _raise(blob: bytes) -> None:
    try:
        exc, text = pickle.loads(blob)
    except Exception:  # noqa: BLE001 - it pickled but does not unpickle (its __init__)
        exc, text = None, "(not readable here)"
    if exc is None:
        raise PersonaempError(f"a Ray worker failed: {text.strip().splitlines()[-1]}", None)
    if not isinstance(exc, PersonaempError):
        exc.add_note(f"raised on a Ray worker:\n{text}")
    raise exc


async def run_units_on_ray(
    units: Iterable[dict[str, Any]],
    make_work: Callable,
    fingerprint_of: Callable,
    *,
    engine,
    settings: LLMSettings,
    key: str,
    output,
    failures,
    fingerprint: str,
    selected: set[str] | None = None,
    retry_failed: bool = False,
    on_progress: Callable[[StageOutcome], None] | None = None,
) -> tuple[StageOutcome, WorkerFigures]:
    """runner.run_units with the work done on Ray workers; `engine`'s accounting becomes
    the workers' (merged) as their figures come in, so the progress bar and the report
    count what they sent."""
    figures = WorkerFigures()
    with locks.exclusive(output):
        run = StageRun(
            key=key, output=output, failures=failures, fingerprint=fingerprint,
            selected=selected, retry_failed=retry_failed,
        )  # fmt: skip
        todo = {str(unit[key]): unit for unit in units if run.admit(unit)}
        if on_progress:
            on_progress(run.outcome)
        stopped = True
        try:
            with run:
                if todo:
                    for uid, result, fatal, blob in _results(
                        todo, make_work, fingerprint_of, settings, fingerprint
                    ):
                        if blob and figures.add(blob):
                            engine.accounting = figures.accounting()
                        if fatal:
                            _raise(fatal)
                        unit = todo.pop(uid, None)
                        if unit is None:  # a block redone after its results came back: once only
                            continue
                        await run.do(unit, _replay(msgspec.json.decode(result)))
                        if on_progress:
                            on_progress(run.outcome)
            stopped = False
        finally:
            run.finish(stopped)
    return run.outcome, figures


def _replay(result: dict[str, Any]):
    """The work StageRun.do runs for a unit done on a worker: its row, or its failure."""

    async def work(unit: dict[str, Any]) -> dict[str, Any]:
        if "row" in result:
            return result["row"]
        failed = result["failed"]
        raise UnitError(failed["kind"], failed["error"], failed["raw"], failed["attempts"])

    return work


def _results(todo: dict[str, dict], make_work, fingerprint_of, settings: LLMSettings, fingerprint: str):
    """(uid, result, fatal, figures) per unit, as the workers finish them (not in order)."""
    import ray
    from ray.data import ActorPoolStrategy

    workers, share = pool_size(settings)
    per_block = max(1, math.ceil(share / 2))  # CALLS_PER_WORKER blocks: 2 x share units per actor
    items = [{"uid": uid, "unit": msgspec.json.encode(unit)} for uid, unit in todo.items()]
    dataset = ray.data.from_items(items, override_num_blocks=math.ceil(len(items) / per_block))
    done = dataset.map_batches(
        UnitWorker,
        fn_constructor_kwargs={
            "recipe": _recipe(make_work, fingerprint_of),
            "settings": _worker_settings(settings, share, workers),
            "fingerprint": fingerprint,
        },
        batch_size=per_block,
        compute=ActorPoolStrategy(
            size=workers,
            max_tasks_in_flight_per_actor=CALLS_PER_WORKER,
            max_concurrent_calls_per_actor=CALLS_PER_WORKER,
        ),  # fmt: skip
        num_cpus=WORKER_CPUS,
    )
    for row in done.iter_rows():
        yield row["uid"], row["result"], row["fatal"], row["figures"]
