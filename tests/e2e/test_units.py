"""The resumable stage runner: appends, failures, resume, retry-failed, kill -9 safety."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from fake_openai import FakeOpenAI, reply
from pydantic import BaseModel

from personaemp.errors import UnitError
from personaemp.llm.settings import LLMSettings
from personaemp.llm.stage import LLMStage, run_llm_stage
from personaemp.llm.step import Step
from personaemp.units import run_units

TESTS = Path(__file__).parents[1]


def run(units, work, tmp_path, **options):
    options.setdefault("fingerprint", "v1")
    options.setdefault("window", 4)
    return asyncio.run(
        run_units(
            units,
            work,
            key="id",
            output=tmp_path / "out.jsonl",
            failures=tmp_path / "out.failures.jsonl",
            **options,
        )
    )


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_outputs_in_input_order_and_failures_with_reasons(tmp_path):
    async def work(unit):
        await asyncio.sleep(0.01 * (10 - unit["id"]))  # finish in reverse order
        if unit["id"] % 3 == 0:
            raise UnitError("ungrounded", f"unit {unit['id']} has no evidence", raw="{}", attempts=2)
        return {**unit, "square": unit["id"] ** 2}

    units = [{"id": n} for n in range(10)]
    outcome = run(units, work, tmp_path)
    assert (outcome.done, outcome.failed, outcome.balanced) == (6, 4, True)
    assert outcome.failures_by_kind == {"ungrounded": 4}
    rows = lines(tmp_path / "out.jsonl")
    assert [r["id"] for r in rows] == [1, 2, 4, 5, 7, 8]
    assert all(r["square"] == r["id"] ** 2 and len(r["input_hash"]) == 16 for r in rows)
    failures = lines(tmp_path / "out.failures.jsonl")
    assert [f["id"] for f in failures] == [0, 3, 6, 9]
    assert failures[0]["kind"] == "ungrounded" and failures[0]["attempts"] == 2
    assert failures[0]["error"] == "unit 0 has no evidence" and failures[0]["raw"] == "{}"


def test_rerun_skips_done_and_failed_and_retry_failed_retries_only_failures(tmp_path):
    calls = []
    fail = {3}

    async def work(unit):
        calls.append(unit["id"])
        if unit["id"] in fail:
            raise UnitError("flaky", "try later")
        return dict(unit)

    units = [{"id": n} for n in range(5)]
    run(units, work, tmp_path)
    assert sorted(calls) == [0, 1, 2, 3, 4]
    calls.clear()
    outcome = run(units, work, tmp_path)
    assert calls == [] and (outcome.done_before, outcome.failed_before, outcome.balanced) == (4, 1, True)
    fail.clear()
    outcome = run(units, work, tmp_path, retry_failed=True)
    assert calls == [3] and (outcome.done, outcome.done_before) == (1, 4)
    assert [r["id"] for r in lines(tmp_path / "out.jsonl")] == [0, 1, 2, 3, 4]
    assert (tmp_path / "out.failures.jsonl").read_text() == ""


def test_changed_input_or_fingerprint_is_recomputed(tmp_path):
    calls = []

    async def work(unit):
        calls.append(unit["id"])
        return {**unit, "seen": unit["text"]}

    run([{"id": 1, "text": "a"}, {"id": 2, "text": "b"}], work, tmp_path)
    calls.clear()
    run([{"id": 1, "text": "a"}, {"id": 2, "text": "CHANGED"}], work, tmp_path)
    assert calls == [2]
    assert [r["seen"] for r in lines(tmp_path / "out.jsonl")] == ["a", "CHANGED"]
    calls.clear()
    run([{"id": 1, "text": "a"}, {"id": 2, "text": "CHANGED"}], work, tmp_path, fingerprint="v2")
    assert sorted(calls) == [1, 2]


def test_a_rerun_with_nothing_to_do_leaves_the_files_untouched(tmp_path):
    """The stage's files are rewritten only when their rows change: a re-run keeps their
    modification time, which is what tells split, stats and push their input is unchanged
    (personaemp.manifest)."""

    async def work(unit):
        if unit["id"] == 2:
            raise UnitError("flaky", "try later")
        return dict(unit)

    units = [{"id": n} for n in range(5)]
    run(units, work, tmp_path)
    files = (tmp_path / "out.jsonl", tmp_path / "out.failures.jsonl")
    before = [(path.read_bytes(), path.stat().st_mtime_ns) for path in files]
    time.sleep(0.01)
    run(units, work, tmp_path)
    assert [(path.read_bytes(), path.stat().st_mtime_ns) for path in files] == before
    run(units[:4], work, tmp_path)  # one unit fewer: rewritten
    assert [r["id"] for r in lines(files[0])] == [0, 1, 3]
    assert files[0].stat().st_mtime_ns != before[0][1]


def test_units_no_longer_in_the_input_leave_the_output(tmp_path):
    async def work(unit):
        return dict(unit)

    run([{"id": n} for n in range(4)], work, tmp_path)
    run([{"id": 1}, {"id": 3}], work, tmp_path)
    assert [r["id"] for r in lines(tmp_path / "out.jsonl")] == [1, 3]


def test_a_torn_last_line_is_cut_and_recomputed(tmp_path):
    async def work(unit):
        return dict(unit)

    run([{"id": n} for n in range(3)], work, tmp_path)
    path = tmp_path / "out.jsonl"
    path.write_bytes(path.read_bytes()[:-7])  # as if killed in the middle of the last write
    calls = []

    async def counting(unit):
        calls.append(unit["id"])
        return dict(unit)

    outcome = run([{"id": n} for n in range(3)], counting, tmp_path)
    assert calls == [2] and outcome.done_before == 2
    assert [r["id"] for r in lines(path)] == [0, 1, 2]


def test_a_slow_unit_does_not_hold_back_the_others(tmp_path):
    """Unit 0 finishes only once the 19 others have: no sleeps raced against each other (it
    flaked under load). Were unit 0 to hold back the window, the others could not finish; the
    wait's bound only turns that hang into a failure."""
    finished = []
    others_done = asyncio.Event()

    async def work(unit):
        if unit["id"] == 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(others_done.wait(), timeout=60)
        finished.append(unit["id"])
        if len(finished) == 19 and 0 not in finished:
            others_done.set()
        return dict(unit)

    run([{"id": n} for n in range(20)], work, tmp_path, window=4)
    assert finished[-1] == 0 and len(finished) == 20


DRIVER = """
import sys
from pathlib import Path
from pydantic import BaseModel
from personaemp.llm.stage import LLMStage, run_llm_stage
from personaemp.llm.settings import LLMSettings
from personaemp.llm.step import Step

class Echo(BaseModel):
    text: str

def make_work(engine):
    async def work(unit):
        result = await engine.call(Step("echo", Echo), [{"role": "user", "content": f"unit {unit['id']}"}])
        return {**unit, "echo": result.value.text}
    return work

base_url, out = sys.argv[1], Path(sys.argv[2])
settings = LLMSettings(base_urls=[base_url], model="fake", concurrency=4, work_dir=out.parent / "work")
units = [{"id": n} for n in range(40)]
plan = LLMStage("echo", units, make_work, key="id", output=out, fingerprint=lambda engine: "v1")
report = run_llm_stage(plan, settings=settings)
print(report.outcome.done, report.outcome.done_before, report.outcome.balanced)
"""


def test_sigkill_mid_stage_then_resume_repeats_no_finished_unit(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    out = tmp_path / "echo.jsonl"

    def unit_of(recorded) -> int:
        return int(recorded.body["messages"][-1]["content"].split()[-1])

    # The first 10 requests are answered, the rest held until the kill: the kill lands mid-stage
    # however slow the machine is.
    release = threading.Event()

    def responder(body, n):
        if n > 10:
            release.wait(60)
        return reply({"text": "ok"})

    with FakeOpenAI(responder=responder) as server:
        env = {**os.environ, "PYTHONPATH": str(TESTS.parent)}
        process = subprocess.Popen([sys.executable, str(driver), server.base_url, str(out)], env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if out.exists() and out.read_bytes().count(b"\n") >= 10:
                break
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.wait()
        release.set()
        finished = [json.loads(line)["id"] for line in out.read_bytes().splitlines() if line.endswith(b"}")]
        assert len(finished) == 10
        before = server.count

        result = subprocess.run(
            [sys.executable, str(driver), server.base_url, str(out)], env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        done, done_before, balanced = result.stdout.split()
        assert int(done) + int(done_before) == 40 and balanced == "True"
        # A request the kill cut short may be recorded late, without a body: not the resume's.
        resumed = {unit_of(r) for r in server.chat_requests[before:] if isinstance(r.body, dict)}
        assert not resumed & set(finished)
    rows = lines(out)
    assert [r["id"] for r in rows] == list(range(40))
    assert all(r["echo"] == "ok" for r in rows)


class Echo(BaseModel):
    text: str


def test_stage_report_balances_and_records_no_key(tmp_path):
    secret = "sk-never-in-a-file-987"

    def make_work(engine):
        async def work(unit):
            result = await engine.call(Step("echo", Echo), [{"role": "user", "content": str(unit["id"])}])
            return {**unit, "echo": result.value.text}

        return work

    with FakeOpenAI(responder=lambda body, n: reply({"text": "ok"} if n % 4 else {"bad": 1})) as server:
        settings = LLMSettings(
            base_urls=[server.base_url], model="fake", api_key=secret, work_dir=tmp_path / "w", max_reasks=0
        )
        plan = LLMStage(
            "echo",
            [{"id": n} for n in range(8)],
            make_work,
            key="id",
            output=tmp_path / "echo.jsonl",
            fingerprint=lambda engine: "v1",
        )
        report = run_llm_stage(plan, settings=settings)
    assert report.outcome.balanced and report.outcome.failed == 2
    saved = json.loads((tmp_path / "w" / "run_report.json").read_text())["stages"]["echo"]
    assert (saved["units"], saved["done"], saved["failed"]) == (8, 6, 2)
    assert saved["failures_by_kind"] == {"invalid": 2}
    assert saved["steps"]["echo"]["requests"] == 8
    assert saved["settings"]["model"] == "fake"
    failures = lines(tmp_path / "echo.failures.jsonl")
    assert [f["kind"] for f in failures] == ["invalid", "invalid"] and failures[0]["raw"] == '{"bad": 1}'
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes()


def test_a_chain_whose_streamed_input_fails_keeps_the_rows_of_users_it_never_saw(tmp_path):
    """The stream (run's filter) fails after one new unit was done: the first stage must not
    rewrite its file from that one alone; the rows of an earlier run stay."""
    from personaemp.errors import InputError
    from personaemp.units import Link, StageRun, run_chain

    output, failures = tmp_path / "first.jsonl", tmp_path / "first.failures.jsonl"
    second_out = tmp_path / "second.jsonl"

    def runs():
        first = StageRun(key="id", output=output, failures=failures, fingerprint="f")
        second = StageRun(
            key="id", output=second_out, failures=tmp_path / "s.failures.jsonl", fingerprint="s"
        )
        return first, second

    async def work(unit):
        return {"id": unit["id"], "value": unit["text"].upper()}

    async def echo(unit):
        return {"id": unit["id"]}

    async def chain(units, final):
        first, second = runs()
        await run_chain(Link(first, work), units, Link(second, echo), lambda row: dict(row), final, window=4)

    earlier = [{"id": f"u{i}", "text": f"old {i}"} for i in range(3)]
    asyncio.run(chain(earlier, lambda: [dict(json.loads(line)) for line in output.read_text().splitlines()]))
    assert [json.loads(line)["id"] for line in output.read_text().splitlines()] == ["u0", "u1", "u2"]

    written = asyncio.Event()

    async def stream():
        yield {"id": "u9", "text": "new"}
        await written.wait()
        raise InputError("input.jsonl:5: not JSON")

    async def noting(unit):
        row = await work(unit)
        asyncio.get_running_loop().call_soon(written.set)  # once the row is appended
        return row

    async def stopped():
        first, second = runs()
        await run_chain(Link(first, noting), stream(), Link(second, echo), lambda row: None, list, window=4)

    try:
        asyncio.run(stopped())
    except InputError:
        pass
    else:
        raise AssertionError("the stream's error stops the chain")
    ids = [json.loads(line)["id"] for line in output.read_text().splitlines()]
    assert ids == ["u0", "u1", "u2", "u9"], "appended, not rewritten from the one unit seen"


def test_a_chain_finishes_the_first_stage_while_the_second_still_works(tmp_path):
    """The first stage's rewrite (and the reading of the second's whole input) is done as
    soon as its last unit ends, beside the second's last units, not after them."""
    from personaemp.units import Link, StageRun, run_chain

    output = tmp_path / "first.jsonl"
    output.write_text(json.dumps({"id": "gone", "value": "stale", "input_hash": "x"}) + "\n")
    first = StageRun(key="id", output=output, failures=tmp_path / "f.failures.jsonl", fingerprint="f")
    second = StageRun(
        key="id", output=tmp_path / "s.jsonl", failures=tmp_path / "s.failures.jsonl", fingerprint="s"
    )
    final_reads = []

    async def upper(unit):
        return {"id": unit["id"], "value": unit["text"].upper()}

    async def waits_for_the_rewrite(unit):
        for _ in range(500):
            if "gone" not in output.read_text():
                return {"id": unit["id"]}
            await asyncio.sleep(0.01)
        raise AssertionError("the first stage was not finished while the second worked")

    def final_input():
        final_reads.append(output.read_text())
        return [json.loads(line) for line in output.read_text().splitlines()]

    units = [{"id": f"u{i}", "text": f"t{i}"} for i in range(3)]
    asyncio.run(
        run_chain(Link(first, upper), units, Link(second, waits_for_the_rewrite), dict, final_input, window=4)
    )
    assert [json.loads(line)["id"] for line in output.read_text().splitlines()] == ["u0", "u1", "u2"]
    assert len(final_reads) == 1 and "gone" not in final_reads[0]
    assert sorted(json.loads(line)["id"] for line in (tmp_path / "s.jsonl").read_text().splitlines()) == [
        "u0", "u1", "u2",
    ]  # fmt: skip
