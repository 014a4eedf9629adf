"""fork_map's workers end when the pool ends them, whatever SIGTERM handler the parent holds.

Ray installs one in the driver of `--executor ray` (a C++ stack dump, then sys.exit), and `run`
forks the stats plots after it: each worker the pool ended printed a stack, and in `make test`
one that had run Ray's tests left a worker waiting on the pool's lock for ever."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

CODE = """
import signal
signal.signal(signal.SIGTERM, signal.default_int_handler)  # any handler of the parent's
from personaemp.parallel import fork_map
print(fork_map(signal.getsignal, [signal.SIGTERM] * 4))
"""


def test_the_pools_workers_take_sigterm_as_the_system_does():
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([0] * 4).replace("0", "<Handlers.SIG_DFL: 0>")
