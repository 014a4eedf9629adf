"""A pool double: `--executor ray`'s WorkerPool (llm/ray_executor.py) on two in-process workers.

What makes a stage's run on Ray differ from one process is not Ray's scheduler: it is that
the stage's `make_work` is shipped through cloudpickle to a worker that opens its own engine,
that its units are routed among the workers (the least busy; a `shared_per` group to one),
and that a unit's row, failure row or fatal error come back as bytes. `PoolDouble` keeps all
of that and drops the Ray processes: it stands in for the three calls WorkerPool makes on the
`ray` module (`remote`, `put`, `kill`) and for `connect`, and each UnitWorker it starts is the
real class, built from its arguments sent through cloudpickle, whose every call's arguments
and answer go through cloudpickle too. Its calls run on this process's event loop, many at
once, as an async actor's do.

Real Ray keeps its own tests (tests/e2e/test_ray.py, test_ray_cluster.py, the supporter test of
test_ray_stages.py): a local Ray's start costs about 10 core-seconds, this none.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from ray import cloudpickle

from personaemp.llm import ray_executor, stage


def shipped(value: Any) -> Any:
    """`value` as the other side of a process boundary gets it."""
    return cloudpickle.loads(cloudpickle.dumps(value))


class _Ref:
    """An ObjectRef: awaited (by each worker) for the value put."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def __await__(self):
        async def value() -> bytes:
            return shipped(self.blob)

        return value().__await__()


class _Method:
    def __init__(self, actor: _Actor, name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args: Any) -> asyncio.Future:
        args = shipped(args)
        actor = self.actor

        async def call() -> Any:
            if actor.killed:
                from ray.exceptions import RayActorError

                raise RayActorError()
            result = getattr(actor.instance, self.name)(*args)
            if inspect.isawaitable(result):
                result = await result
            actor.calls[self.name] = actor.calls.get(self.name, 0) + 1
            return shipped(result)

        return asyncio.ensure_future(call())


class _Actor:
    """An actor handle: `handle.method.remote(...)`."""

    def __init__(self, instance: Any) -> None:
        self.instance, self.killed, self.calls = instance, False, {}

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)


class _ActorClass:
    def __init__(self, double: PoolDouble, cls: type) -> None:
        self.double, self.cls = double, cls

    def remote(self, *args: Any) -> _Actor:
        actor = _Actor(self.cls(*shipped(args)))
        self.double.workers.append(actor)
        return actor


class PoolDouble:
    """`install(monkeypatch)` puts it in place of Ray for WorkerPool; `workers`: the
    UnitWorker handles started, in order."""

    def __init__(self) -> None:
        self.workers: list[_Actor] = []
        self.put_blobs = 0

    def install(self, monkeypatch) -> PoolDouble:
        import ray

        monkeypatch.setattr(ray, "remote", self.remote)
        monkeypatch.setattr(ray, "put", self.put)
        monkeypatch.setattr(ray, "kill", self.kill)
        where = lambda settings: "a pool double (tests/ray_double.py)"  # noqa: E731
        monkeypatch.setattr(ray_executor, "connect", where)
        monkeypatch.setattr(stage, "connect", where)
        return self

    def remote(self, **options: Any):
        return lambda cls: _ActorClass(self, cls)

    def put(self, blob: bytes) -> _Ref:
        self.put_blobs += 1
        return _Ref(blob)

    def kill(self, actor: _Actor) -> None:
        actor.killed = True

    def started(self) -> int:
        return len(self.workers)

    def up(self) -> int:
        return sum(1 for actor in self.workers if actor.calls.get("ready") and not actor.killed)

    def units_run(self) -> list[int]:
        """How many units each worker ran."""
        return [actor.calls.get("run", 0) for actor in self.workers]
