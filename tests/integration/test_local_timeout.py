"""A timed-out request is said on screen when it is sent again, and the embedded model's time
for a request follows its measured speed and the request's max_tokens (issue 63: on a loaded
machine the model ran at 1 token/s, the first persona request hit the fixed 600 s local
timeout and was re-sent without a word). Against the test server (its `llamacpp` profile for
the embedded model's endpoint), never the model itself."""

from __future__ import annotations

import asyncio
import io
import itertools

from conftest import SAMPLE_TASK1
from fake_openai import FakeOpenAI
from rich.console import Console

from personaemp.dataset.filter import filter_users
from personaemp.dataset.persona import infer_personas
from personaemp.llm.accounting import Accounting
from personaemp.llm.endpoints import Endpoint, EndpointPool
from personaemp.llm.session import LOCAL_CAP, LOCAL_SLACK, local_deadline
from personaemp.llm.settings import LLMSettings


def test_the_local_deadline_follows_the_measured_speed_and_max_tokens():
    accounting = Accounting()
    deadline = local_deadline(accounting, 600.0)
    request = {"max_tokens": 1024}
    assert deadline(request, 0) == 600.0  # no reply yet: the floor
    stats = accounting.step("persona")
    stats.completion_tokens, stats.seconds = 300, 300.0  # 1 token/s, as on the loaded machine
    assert deadline(request, 0) == LOCAL_SLACK * 1024 == 2048.0
    assert deadline(request, 1) == 4096.0  # timed out once: twice the time
    assert deadline({"max_tokens": 64}, 0) == 600.0  # never under the floor
    assert deadline(request, 10) == LOCAL_CAP


def test_a_request_past_its_deadline_gets_a_longer_one_when_sent_again(tmp_path):
    """The pool hands the deadline the request's timeouts so far: the first try (0.5 s) times
    out on a reply that takes 0.8 s, the second (1 s) gets it."""
    latencies = itertools.chain([0.8, 0.8], itertools.repeat(0.0))
    retried = []
    with FakeOpenAI(profile="llamacpp", latency=lambda: next(latencies)) as server:

        async def send():
            endpoint = Endpoint(server.base_url, "sk-test", 1, None, 0.5)
            endpoint.deadline = local_deadline(Accounting(), 0.5)
            pool = EndpointPool([endpoint], max_retries=2)
            request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
            try:
                return await pool.send(request, lambda *given: retried.append(given))
            finally:
                await endpoint.client.close()

        reply = asyncio.run(send())
    assert reply is not None and server.count == 2
    [(error, attempt, retries)] = retried
    assert error.kind == "timeout" and "within 0.5 s" in error.message and (attempt, retries) == (1, 2)


def test_a_timed_out_request_sent_again_is_said_on_screen(tmp_path):
    filtered = tmp_path / "filtered.jsonl"
    filter_users(SAMPLE_TASK1, filtered, console=Console(quiet=True))
    latencies = itertools.chain([1.5], itertools.repeat(0.0))
    shown = io.StringIO()
    with FakeOpenAI(latency=lambda: next(latencies)) as server:
        settings = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=tmp_path / "work",
                               concurrency=1, timeout=1.0, max_retries=2)  # fmt: skip
        report = infer_personas(filtered, tmp_path / "p.jsonl", settings, console=Console(file=shown,
                                width=200), limit=1).report  # fmt: skip
    assert report.outcome.done == 1
    text = " ".join(shown.getvalue().split())
    assert "the request timed out (no whole reply within 1 s); sent again (retry 1 of 2)" in text, text
