"""fidelity under `--executor ray` writes what one process writes (the executor path every LLM
stage takes: llm/stage.py's WorkerPool), on two workers, with one cut failing.

The workers are the pool double's (tests/ray_double.py): the real WorkerPool and UnitWorker,
fidelity's work and every call and answer through cloudpickle, two in-process workers, as
the other stages' runs in tests/e2e/test_ray_stages.py. A real Ray's runs: tests/e2e/test_ray.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_openai import reply
from test_fidelity import user, write_rows
from test_ray_stages import assert_same, run_twice

from personaemp.dataset.fidelity import FidelityOptionsUsed, measure_fidelity
from personaemp.llm.settings import LLMSettings

ray = pytest.importorskip("ray")


def answer(body: dict, number: int):
    """A next message per request; u3's persona never gets a usable one (its cut's failure row:
    a variant's own unusable message is a measured outcome, not a failure)."""
    text = "\n".join(m.get("content") or "" for m in body["messages"])
    properties = body["response_format"]["json_schema"]["schema"].get("properties", {})
    if "pick" in properties:
        return reply({"reason": "r", "pick": "B"})
    if "depth" in properties:
        return reply("not json") if "weekend u3" in text else None  # else the default instance
    return reply({"thought": "t", "end": False, "text": f"and what about sundays then {len(text) % 7}"})


def test_fidelity_on_ray_writes_what_one_process_writes(pool_double, tmp_path):
    users = write_rows(tmp_path / "users.jsonl", [user(f"u{n}") for n in range(1, 5)])
    options = FidelityOptionsUsed(variants=("none", "full"), discriminator=True)

    def stage(folder: Path, llm: LLMSettings) -> None:
        measure_fidelity(users, folder / "fidelity.jsonl", llm, options=options)

    made = run_twice(tmp_path, answer, stage, pool_double)
    report = assert_same(made, "fidelity", ["fidelity.jsonl"], "fidelity.failures.jsonl")
    assert report["units"] == 4
    assert all(pool_double.units_run()), "both workers ran units"
