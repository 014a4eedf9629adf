"""Deadlines and reply bounds (issue 23, item 4), measured against the fake server in a
subprocess (so the client process's memory is the client's alone):

- a trickling server (a byte every 0.2 s): how long one request lasts with --timeout 2,
  through the engine's pool (whole-request deadline) and through the bare client (per read);
- a 5 MB reply at max_tokens 1024: the peak memory the client allocated and what it kept,
  bounded read vs the bare client;
- the cost of the bounded read on ordinary replies: ms per request, pool vs bare client.

    PYTHONPATH=$PWD .venv/bin/python bench/llm/deadline_bench.py
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import openai

from personaemp.llm.endpoints import Endpoint, EndpointPool, LLMError

ROOT = Path(__file__).resolve().parents[2]
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1024}
SMALL_REQUESTS = 300


@contextlib.contextmanager
def server(*flags: str):
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "fake_openai.py"), "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        yield process.stdout.readline().split()[1]
    finally:
        process.terminate()
        process.wait()


async def timed(coroutine) -> tuple[float, str]:
    started = time.monotonic()
    try:
        await coroutine
        outcome = "answered"
    except (LLMError, openai.OpenAIError) as error:
        outcome = f"{type(error).__name__}: {str(error)[:90]}"
    return time.monotonic() - started, outcome


def bare(base_url: str, timeout: float) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0, timeout=timeout)


async def trickle() -> None:
    with server("--trickle", "0.2", "--trickle-bound", "30") as url:
        endpoint = Endpoint(url, "k", 1, None, 2.0)
        seconds, outcome = await timed(EndpointPool([endpoint], 0).send(REQUEST, lambda: None))
        print(f"trickle, --timeout 2, pool (whole request): {seconds:5.1f} s  {outcome}")
        client = bare(url, 2.0)
        seconds, outcome = await timed(client.post("/chat/completions", body=REQUEST, cast_to=dict))
        print(f"trickle, --timeout 2, bare client (per read): {seconds:5.1f} s  {outcome}")
        await endpoint.client.close()
        await client.close()


async def huge() -> None:
    with server("--huge", "5000000") as url:
        endpoint = Endpoint(url, "k", 1, None, 30.0)
        client = bare(url, 30.0)
        for name, send in (
            ("pool (bounded read)", lambda: EndpointPool([endpoint], 0).send(REQUEST, lambda: None)),
            ("bare client", lambda: client.post("/chat/completions", body=REQUEST, cast_to=dict)),
        ):
            tracemalloc.start()
            kept = None
            try:
                kept = await send()
            except (LLMError, openai.OpenAIError) as error:
                outcome = f"{type(error).__name__}: {str(error)[:70]}"
            else:
                outcome = f"kept {len(kept['choices'][0]['message']['content']) / 1e6:.1f} MB of content"
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            del kept
            print(f"5 MB reply, max_tokens 1024, {name}: peak {peak / 1e6:5.2f} MB allocated  {outcome}")
        await endpoint.client.close()
        await client.close()


async def overhead() -> None:
    with server() as url:
        endpoint = Endpoint(url, "k", 1, None, 30.0)
        pool = EndpointPool([endpoint], 0)
        client = bare(url, 30.0)
        for _ in range(20):  # warm both connections
            await pool.send(REQUEST, lambda: None)
            await client.post("/chat/completions", body=REQUEST, cast_to=dict)
        for name, send in (
            ("pool (deadline + bounded read)", lambda: pool.send(REQUEST, lambda: None)),
            ("bare client", lambda: client.post("/chat/completions", body=REQUEST, cast_to=dict)),
        ):
            started = time.perf_counter()
            for _ in range(SMALL_REQUESTS):
                await send()
            each = (time.perf_counter() - started) / SMALL_REQUESTS * 1000
            print(f"small replies, {SMALL_REQUESTS} in a row, {name}: {each:.2f} ms a request")
        await endpoint.client.close()
        await client.close()


async def main() -> None:
    await trickle()
    await huge()
    await overhead()


if __name__ == "__main__":
    asyncio.run(main())
