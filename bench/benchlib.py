"""What the benches share, written once: the machine line printed beside every figure, the
argument parser with the options most benches take, and the test server in another process
(READY <url>, its /stats) or in this one.

A bench finds it with `sys.path.insert(0, str(ROOT / "bench"))` and `import benchlib`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "alpsbench" / "task1"  # the full AlpsBench task1, when present
TESTS = ROOT / "tests"


def machine() -> str:
    """The CPU model, cores, Python and the speed of one core now."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor() or model
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}; {speed()}"


def speed() -> str:
    """One core's speed now: the CPU model here stays the same while its speed varies by a
    third between hours, so figures measured at different times need this beside them."""
    started = time.perf_counter()
    total = 0
    for number in range(10_000_000):
        total += number
    return f"a 10M-step Python loop {time.perf_counter() - started:.2f} s"


def parser(
    doc: str | None,
    *,
    users: int | None = None,
    median: float | None = None,
    sigma: float | None = None,
    in_flight: int | None = None,
) -> argparse.ArgumentParser:
    """The bench's parser (its docstring as help), with the common options it takes:
    --users and --source (the input), --median and --sigma (the server's latency, s),
    --in-flight (requests at once), each given its default here."""  # fmt: skip
    made = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    if users is not None:
        made.add_argument("--users", type=int, default=users)
        made.add_argument("--source", type=Path, default=SHARED)
    if in_flight is not None:
        made.add_argument("--in-flight", type=int, default=in_flight)
    if median is not None:
        made.add_argument("--median", type=float, default=median)
    if sigma is not None:
        made.add_argument("--sigma", type=float, default=sigma)
    return made


def start_server(script: Path, *args: str, quiet: bool = False) -> tuple[subprocess.Popen, str]:
    """A test server script (tests/fake_openai.py, bench/capable_server.py) in another
    process: (the process, its base URL), once it says READY."""
    command = [sys.executable, str(script), *args]
    stderr = subprocess.DEVNULL if quiet else None
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    line = server.stdout.readline().strip()
    if not line.startswith("READY "):
        server.kill()
        sys.exit(f"fake server did not start: {line!r}")
    return server, line.split(" ", 1)[1]


def capable_server(median: float, sigma: float, *, quiet: bool = False) -> tuple[subprocess.Popen, str]:
    """bench/capable_server.py (a capable model's answers) with that latency, seed 1."""
    return start_server(
        ROOT / "bench" / "capable_server.py",
        *("--latency-median", str(median), "--latency-sigma", str(sigma), "--seed", "1"),
        quiet=quiet,
    )


def server_stats(base_url: str) -> dict:
    """The test server's GET /stats: requests, in flight, the latencies it slept."""
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/stats") as response:
        return json.load(response)


@contextlib.contextmanager
def fake_endpoint(responder) -> Iterator[tuple[Path, object]]:
    """A temporary folder and the test server in this process answering with `responder`:
    (the folder, the engine's settings for it, model "fake")."""
    sys.path.insert(0, str(TESTS))
    from fake_openai import FakeOpenAI

    from personaemp.llm.settings import LLMSettings

    with tempfile.TemporaryDirectory() as folder, FakeOpenAI(responder=responder) as server:
        work = Path(folder)
        yield work, LLMSettings(base_urls=[server.base_url], model="fake", work_dir=work / "w")
