"""What compiling at install saves (issue 63 item 9): the CPU seconds of `personaemp --help`
with PYTHONDONTWRITEBYTECODE=1, when nothing is compiled (every start compiles what it
imports) and when everything was compiled at install, and what compiling costs once.

    .venv/bin/python bench/bytecode_bench.py --starts 6

It never touches the venv's own __pycache__: each case reads its bytecode from a folder of
its own (PYTHONPYCACHEPREFIX), an empty one or one `compileall` filled, as `make` does.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_of(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds of the children, wall seconds) of one run of `command`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        command, env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=6, help="starts measured per case")
    args = parser.parse_args()
    help_command = [sys.executable, "-m", "personaemp", "--help"]
    with tempfile.TemporaryDirectory() as empty, tempfile.TemporaryDirectory() as full:
        base = {**os.environ, "PYTHONPATH": str(ROOT)}
        compiled = [sys.executable, "-m", "compileall", "-q", "-j", "0", sysconfig.get_paths()["purelib"],
                    str(ROOT / "personaemp")]  # fmt: skip
        cost, wall = cpu_of(compiled, {**base, "PYTHONPYCACHEPREFIX": full})
        print(f"compileall of site-packages and personaemp/: {cost:.1f} s of CPU ({wall:.1f} s wall), once")
        for name, prefix in (("not compiled", empty), ("compiled at install", full)):
            env = {**base, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": prefix}
            runs = [cpu_of(help_command, env) for _ in range(args.starts)]
            cpu = sum(r[0] for r in runs) / len(runs)
            print(f"personaemp --help, {name}: {cpu:.2f} s of CPU a start "
                  f"(mean of n={len(runs)}, PYTHONDONTWRITEBYTECODE=1)")  # fmt: skip
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
