"""serve-local's signal handling, with a stand-in server that ignores SIGTERM the way
uvicorn does while it finishes a reply (the real server: tests/test_local_model.py)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from personaemp.llm import local

STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(120)
"""


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_ends_the_server_even_when_it_ignores_sigterm(stop, tmp_path, monkeypatch):
    pid_file = tmp_path / "server.pid"
    monkeypatch.setattr(local, "local_model_path", lambda: tmp_path / "model.gguf")
    monkeypatch.setattr(
        local, "_server_command", lambda *args: [sys.executable, "-c", STUBBORN, str(pid_file)]
    )
    monkeypatch.setattr(local, "STOP_GRACE", 0.3)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def send_when_running() -> None:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()) or signal.getsignal(stop) == before[stop]:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        os.kill(os.getpid(), stop)

    threading.Thread(target=send_when_running, daemon=True).start()
    assert local.serve_local() == 0
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)  # killed and reaped, not left behind
    assert {sig: signal.getsignal(sig) for sig in before} == before, "handlers restored"


def test_a_server_that_exits_on_its_own_passes_its_exit_code_on(tmp_path, monkeypatch):
    monkeypatch.setattr(local, "local_model_path", lambda: tmp_path / "model.gguf")
    monkeypatch.setattr(local, "_server_command", lambda *args: [sys.executable, "-c", "raise SystemExit(3)"])
    assert local.serve_local() == 3
