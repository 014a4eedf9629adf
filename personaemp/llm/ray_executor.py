"""`--executor ray`: an LLM stage's units run on a pool of Ray workers; this process writes.

A command's LLM stages share one pool of Ray actors (WorkerPool), started with its first
unit to do and kept to its end: each actor holds one engine (its own HTTP clients and cache
handle, its share of --concurrency and --rpm) and runs each stage's own `make_work(engine)`,
shipped to it once with cloudpickle. This process runs the stage as one process does
(runner.run_units, or run_chain for `run`'s two stages, overlapped), each unit's work a call
on the least busy actor, whose answer is the unit's row, its failure (a UnitError: a failure
row, never a failed job) or the error that stops the run (as one process would stop). So
the output, failures file, report and freshness record are those of a one-process run. A
make_work's state lives on each worker: units that share work made once (a user's summary)
are marked by it (shared_per) and go to one worker.

Nothing twice, nothing lost: a worker lost (its node gone) is replaced, and each unit it
held is sent to another; the unit is written once, when its call answers. A killed driver
loses at most the units in flight: the rows it wrote are skipped on the next run (the output
scan), and the reply cache answers the requests the workers had answered.

Not Ray Data (map_batches over an ActorPoolStrategy, as first built): it started a pool per
stage and three actors of its own, held each block until its slowest unit was done, and
could not feed gen-queries from infer-persona's rows, which cost 2.6x one process's CPU (see
docs/past-one-machine.md). Its checkpointing (DataContext.checkpoint_config) covers a plan
from a read to a Ray Data write, while these rows are written here, by the runner that
already resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import logging
import os
import pickle
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from personaemp.errors import InputError, PersonaempError, UnitError
from personaemp.llm.accounting import CALLS_KEPT, Accounting
from personaemp.llm.settings import LLMSettings

WORKER_CPUS = 1.0  # one core per engine: the client does its JSON and checks there


def uses_ray(settings: LLMSettings) -> bool:
    """Whether the units go to Ray: --estimate and --batch send nothing, so they stay here."""
    return settings.executor == "ray" and not settings.estimate and settings.batch is None


def pool_size(settings: LLMSettings) -> tuple[int, int]:
    """(workers, requests in flight per endpoint per worker): all of them within --concurrency."""
    workers = min(settings.workers, settings.concurrency)
    return workers, settings.concurrency // workers


AUTH_MODE = "RAY_AUTH_MODE"  # Ray's variable: token (its default for a local Ray) or disabled
TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"  # where Ray 2.60 says it


@contextlib.contextmanager
def _quiet_logger(name: str):
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def connect(settings: LLMSettings) -> str:
    """Ray ready in this process; a line saying which (a local Ray started: its start-up time)."""
    try:
        import ray
    except ImportError:
        raise InputError(
            "--executor ray needs Ray, which is not installed", "pip install 'personaemp[ray]'"
        ) from None
    if ray.is_initialized():
        return "Ray (connected before)"
    started = time.perf_counter()
    address = settings.ray_address or os.environ.get("RAY_ADDRESS")
    local = {} if address else {"num_cpus": max(os.cpu_count() or 1, settings.workers)}
    # A local Ray turns on token authentication (a token in ~/.ray/auth_token, made once) unless
    # RAY_AUTH_MODE says otherwise, and logged a WARNING saying so on every run: that logger is
    # quiet while a local Ray starts, and our line says what it meant.
    auth, quiet = "", contextlib.nullcontext()
    if not address and AUTH_MODE not in os.environ:
        auth = f"; token authentication on, Ray's default ({AUTH_MODE}=disabled turns it off)"
        quiet = _quiet_logger(TOKEN_LOGGER)
    try:
        # The workers' own output stays in Ray's logs: what a unit or the run meets comes back.
        # "local": a Ray of our own, never another one that happens to run on this machine (Ray
        # connects to the latest of those unasked, and then refuses our num_cpus)
        with quiet:
            ray.init(
                address=address or "local", include_dashboard=False, logging_level=logging.WARNING,
                log_to_driver=False, **local,
            )  # fmt: skip
    except (ConnectionError, RuntimeError, ValueError) as exc:
        if not address:
            raise PersonaempError(
                f"could not start a local Ray ({str(exc).splitlines()[0]})",
                "a loaded machine can make Ray's start-up time out: run it again, or give --ray-address",
            ) from None
        raise PersonaempError(
            f"cannot reach the Ray cluster at {address} ({str(exc).splitlines()[0]})",
            "check --ray-address (RAY_ADDRESS), or leave it unset to start a local Ray",
        ) from None
    seconds = time.perf_counter() - started
    return f"Ray at {address}" if address else f"a local Ray (started in {seconds:.1f} s{auth})"


@dataclasses.dataclass
class WorkerFigures:
    """What the workers counted (requests, tokens, cache hits...), merged as one engine's;
    each EngineBeside's too, by its name."""

    latest: dict[str, tuple[int, Accounting, dict, dict[str, Accounting]]] = dataclasses.field(
        default_factory=dict
    )

    def add(self, blob: bytes) -> bool:
        """One worker's running figures; True if they are newer than those held."""
        name, seq, *figures = pickle.loads(blob)
        if name in self.latest and self.latest[name][0] >= seq:
            return False
        self.latest[name] = (seq, *figures)
        return True

    def accounting(self) -> Accounting:
        return merged([accounting for _, accounting, _, _ in self.latest.values()])

    def structured(self) -> dict | None:
        """The structured mode the workers used (the first worker's word on it)."""
        return next((structured for _, _, structured, _ in self.latest.values()), None)

    def besides(self) -> dict[str, Accounting]:
        """Each EngineBeside's accounting (by its name), merged over the workers that opened it."""
        names = {name for *_, besides in self.latest.values() for name in besides}
        return {
            name: merged([besides[name] for *_, besides in self.latest.values() if name in besides])
            for name in names
        }


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
    job's runtime_env, so a key from the environment never travels through Ray.
    The work folder is the driver's: a relative one was opened in each worker's own
    folder (a Ray started elsewhere: the reply cache of another folder)."""
    fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.init}
    key = settings.api_key if os.environ.get(settings.key_env) != settings.api_key else None
    return {
        **fields, "api_key": key, "concurrency": share, "executor": "local",
        "work_dir": Path(settings.work_dir).absolute(),
        "rpm": settings.rpm / workers if settings.rpm else settings.rpm,
        "max_cost": settings.max_cost / workers if settings.max_cost else settings.max_cost,
    }  # fmt: skip


def shared_per(field: str) -> Callable[[Callable], Callable]:
    """Mark a stage's make_work whose work shares a result among the units with one value of
    `field` (respond --context memory-summary: one summary per user, for all their queries):
    on Ray those units all go to one worker, so the result is made once, as in one process.

        @shared_per("user_id")
        def make_work(engine): ...
    """

    def mark(make_work: Callable) -> Callable:
        make_work.shared_per = field
        return make_work

    return mark


class EngineBeside:
    """A second engine a stage's work uses beside its own (gen-dialogues' supporter on its own
    endpoint), opened with the stage. Shipped to a Ray worker inside the work, it arrives
    without it, and opens one there on first use, with the worker's share of the limits,
    kept while the worker lives (as the worker's own engine is). The workers' figures of it
    come back under its name: merged, they become this engine's accounting (counted).

    `on_count`: called here, never on a worker, when its figures change (`counted`)."""

    def __init__(self, settings: LLMSettings, engine, on_count: Callable[[], None] | None = None):
        self.settings, self.engine, self.opening, self.on_count = settings, engine, None, on_count
        self.name = uuid.uuid4().hex  # its figures', on the workers and here
        self.fingerprints: dict[tuple[str, str], str] = {}

    def __getstate__(self) -> dict[str, Any]:
        workers, share = pool_size(self.settings)  # the key travels as the pool's does
        arguments = _worker_settings(self.settings, share, workers)
        return {**self.__dict__, "settings": arguments, "engine": None, "opening": None, "on_count": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, settings=LLMSettings(**state["settings"]))

    async def get(self):
        """The engine, opened here on first use if it came without one."""
        if self.engine is None:
            if self.opening is None:
                self.opening = asyncio.ensure_future(self._open())
            await self.opening
        return self.engine

    async def _open(self) -> None:
        from personaemp.llm.session import open_engine

        self.stack = contextlib.AsyncExitStack()  # open while the worker lives
        self.engine = await self.stack.enter_async_context(open_engine(self.settings))

    def counted(self, accounting: Accounting | None = None) -> None:
        """Its figures changed: a unit done in this process, or the workers' figures come in
        (`accounting`: theirs merged, this engine's from now on). Tells on_count."""
        if accounting is not None:
            self.engine.accounting = accounting
        if self.on_count is not None:
            self.on_count()

    def fingerprint(self, step, prompt_hash: str = "") -> str:
        """Engine.fingerprint, computed where the engine was opened with the stage; a worker
        checks its own prompt hashes against those (another hash: another fingerprint)."""
        key = (step.name, prompt_hash)
        if self.engine is not None and key not in self.fingerprints:
            self.fingerprints[key] = self.engine.fingerprint(step, prompt_hash)
        return self.fingerprints.get(key, f"{step.name}/{prompt_hash}: not the driver's")


def _recipe(make_work: Callable, fingerprint: Callable) -> tuple[bytes, list[EngineBeside]]:
    """The stage's work and fingerprint for the workers, with the EngineBesides they hold
    (found by a first pass; the worker sends their figures), and those EngineBesides. A stage
    reads its prompts once per run through a functools.cache made inside it, which pickle
    cannot name: it goes as a new cache over the same function (the worker checks it computes
    the same fingerprint)."""
    import functools

    from ray import cloudpickle

    besides: dict[str, EngineBeside] = {}

    class Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, functools._lru_cache_wrapper) and "<locals>" in obj.__qualname__:
                return functools.cache, (obj.__wrapped__,)
            if isinstance(obj, EngineBeside):
                besides[obj.name] = obj
            return super().reducer_override(obj)

    def dump(value: Any) -> bytes:
        buffer = io.BytesIO()
        Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        return buffer.getvalue()

    dump((make_work, fingerprint))
    return dump((make_work, fingerprint, list(besides.values()))), list(besides.values())


class UnitWorker:
    """A Ray actor: one engine for the whole command, each stage's work on the units sent
    to it, many at once (an async actor). A stage's work is made on its first unit."""

    def __init__(self, settings: dict[str, Any]):
        self.settings = settings
        self.name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.seq, self.sent = 0, 0.0
        self.engine = self.opened = None
        self.stages: dict[str, asyncio.Future] = {}
        self.besides: dict[str, EngineBeside] = {}  # the stages' EngineBesides, by name

    def ready(self) -> str:
        return self.name

    async def _open(self) -> None:
        from personaemp.llm.session import open_engine

        self.stack = contextlib.AsyncExitStack()  # open while the actor lives
        self.engine = await self.stack.enter_async_context(open_engine(LLMSettings(**self.settings)))

    async def _stage(self, recipe, fingerprint: str):
        from ray import cloudpickle

        if self.opened is None:
            self.opened = asyncio.ensure_future(self._open())
        await self.opened
        make_work, fingerprint_of, besides = cloudpickle.loads(await recipe)
        self.besides.update((beside.name, beside) for beside in besides)
        if fingerprint_of(self.engine) != fingerprint:
            raise PersonaempError(
                f"Ray worker {self.name} would make other rows than the driver (prompts, model or "
                "personaemp differ there)",
                "install the same personaemp and prompts on every node",
            )
        return make_work(self.engine)

    async def run(
        self, stage: str, recipe: list, fingerprint: str, unit: bytes
    ) -> tuple[bytes, bytes, bytes]:
        """(result, fatal, figures) of one unit. `recipe`: [the stage's recipe's ObjectRef], in
        a list so that Ray does not fetch it for every unit."""
        if stage not in self.stages:
            self.stages[stage] = asyncio.ensure_future(self._stage(recipe[0], fingerprint))
        try:
            work = await self.stages[stage]
            row = await work(msgspec.json.decode(unit))
        except UnitError as error:
            failed = {"kind": error.kind, "error": str(error), "raw": error.raw, "attempts": error.attempts,
                      "fields": error.fields}  # fmt: skip
            return msgspec.json.encode({"failed": failed}), b"", self.figures(every=0.5)
        except Exception as exc:  # noqa: BLE001 - as one process: the run stops with it
            return b"", _fatal(exc), self.figures()
        return msgspec.json.encode({"row": row}), b"", self.figures(every=0.5)

    def figures(self, every: float = 0.0) -> bytes:
        """The engine's figures so far (requests, tokens...), and each opened EngineBeside's by
        name; b"" if sent less than `every` seconds ago (the driver's progress bar needs no more)."""
        if self.engine is None or time.monotonic() - self.sent < every:
            return b""
        self.seq, self.sent = self.seq + 1, time.monotonic()
        besides = {name: b.engine.accounting for name, b in self.besides.items() if b.engine is not None}
        return pickle.dumps(
            (self.name, self.seq, self.engine.accounting, self.engine.structured_report(), besides)
        )


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


class WorkerPool:
    """The command's Ray workers, alive from its first LLM stage to its last (`run`'s two
    stages share them, chained as in one process). Each unit goes to the live worker with
    the fewest units in flight, each holding at most twice the requests it may send (or to
    its group's worker, shared_per); a worker lost (its node
    gone) is replaced, and the units it held go to another worker. `engine`'s accounting
    becomes the workers' (merged) as their figures come in, so the progress bar and the
    report count what they sent; so does each EngineBeside's (counted)."""

    def __init__(self, settings: LLMSettings, engine):
        import ray

        self.size, share = pool_size(settings)
        # Units a worker holds at most: twice the requests it may have in flight, as one
        # process's window. Without it the first worker up took the whole window and sent
        # it at its share of --concurrency while the others started.
        self.cap = 2 * share * max(1, len(settings.base_urls))
        self.arguments = _worker_settings(settings, share, self.size)
        self.engine, self.figures = engine, WorkerFigures()
        self.besides: dict[str, EngineBeside] = {}  # the stages' EngineBesides, by name
        self.actor = ray.remote(num_cpus=WORKER_CPUS, max_restarts=0, max_task_retries=0)(UnitWorker)
        self.load: dict[Any, int] = {}  # live workers: units in flight on each
        self.starting: dict[Any, asyncio.Future] = {}
        self.gone: set = set()
        self.changed = asyncio.Event()  # a worker joined, was lost, or finished a unit
        self.owners: dict[tuple[str, Any], Any] = {}  # (stage, shared value): its units' worker

    async def __aenter__(self) -> WorkerPool:
        return self  # the workers start with the first unit to do: none for a finished stage

    async def __aexit__(self, *exc_info) -> None:
        import ray

        last = [worker.figures.remote() for worker in self.load]
        for blob in await asyncio.gather(*last, return_exceptions=True):
            if isinstance(blob, bytes):
                self._take(blob)
        for task in self.starting.values():
            task.cancel()
        for worker in [*self.load, *self.starting]:
            ray.kill(worker)

    def _take(self, blob: bytes) -> None:
        """A worker's figures (b"": none): the engine's and each EngineBeside's accounting
        become the workers', merged, if they are newer than those held."""
        if blob and self.figures.add(blob):
            self.engine.accounting = self.figures.accounting()
            for name, accounting in self.figures.besides().items():
                if name in self.besides:
                    self.besides[name].counted(accounting)

    def _start(self) -> None:
        """A new worker, taking units once it is placed and started (a lost node's
        replacement may wait for a free CPU on the cluster)."""
        from ray.exceptions import RayActorError

        worker = self.actor.remote(self.arguments)

        async def started() -> None:
            try:
                await worker.ready.remote()
            except RayActorError:
                self._lost(worker)
                return
            self.starting.pop(worker, None)
            self.load[worker] = 0
            self.changed.set()

        self.starting[worker] = asyncio.ensure_future(started())

    def _lost(self, worker) -> None:
        """A worker gone, replaced once (each of its units in flight sees it fail)."""
        if worker in self.gone:
            return
        self.gone.add(worker)
        self.load.pop(worker, None)
        self.starting.pop(worker, None)
        if len(self.gone) <= 4 * self.size:
            self._start()
        self.changed.set()  # a unit waiting for a worker sees the count

    async def _least_busy(self):
        if not self.starting and not self.load and not self.gone:
            for _ in range(self.size):
                self._start()
        while True:
            if len(self.gone) > 4 * self.size:
                raise PersonaempError(
                    f"{len(self.gone)} Ray workers were lost (of {self.size}): the run stops",
                    "see the Ray logs (/tmp/ray/session_latest/logs) for why they die",
                )
            free = [worker for worker, units in self.load.items() if units < self.cap]
            if free:
                return min(free, key=self.load.__getitem__)
            self.changed.clear()
            await self.changed.wait()

    async def _worker_for(self, stage: str, shared: Any):
        """The worker for a unit: its group's (shared_per), while that worker lives, else
        the least busy one (which takes the group on)."""
        owner = self.owners.get((stage, shared)) if shared is not None else None
        if owner in self.load:
            return owner
        worker = await self._least_busy()
        if shared is not None:
            owner = self.owners.get((stage, shared))
            if owner in self.load:  # another unit of the group took a worker while this waited
                return owner
            self.owners[(stage, shared)] = worker
        return worker

    def work(self, stage: str, make_work: Callable, fingerprint_of: Callable, fingerprint: str):
        """The Work (runner.Work) that runs `make_work(engine)` on a worker for each unit."""
        import ray
        from ray.exceptions import RayActorError

        made, besides = _recipe(make_work, fingerprint_of)
        recipe = [ray.put(made)]
        self.besides.update((beside.name, beside) for beside in besides)
        field = getattr(make_work, "shared_per", None)

        async def work(unit: dict[str, Any]) -> dict[str, Any]:
            encoded = msgspec.json.encode(unit)
            while True:
                worker = await self._worker_for(stage, unit.get(field) if field else None)
                self.load[worker] += 1
                try:
                    result, fatal, blob = await worker.run.remote(stage, recipe, fingerprint, encoded)
                except RayActorError:  # its node or process is gone: the unit again, elsewhere
                    self._lost(worker)
                    continue
                finally:
                    if worker in self.load:
                        self.load[worker] -= 1
                        self.changed.set()
                self._take(blob)
                if fatal:
                    _raise(fatal)
                done = msgspec.json.decode(result)
                if "row" in done:
                    return done["row"]
                failed = done["failed"]
                error = UnitError(failed["kind"], failed["error"], failed["raw"], failed["attempts"])
                error.fields = failed.get("fields") or {}  # the stage's columns (whose failure it was)
                raise error

        return work
