"""serve-local's signal handling, with a stand-in server that ignores SIGTERM the way
uvicorn does while it finishes a reply (the real server: tests/e2e/test_local_model.py)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

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


def test_the_server_s_own_output_goes_to_a_log_and_one_line_is_shown(tmp_path, monkeypatch, capfd):
    """llama.cpp prints ~1,400 lines while loading: they go to a file the one line names; a
    server that exits shows the log's last lines."""
    monkeypatch.setattr(local, "local_model_path", lambda: tmp_path / "model.gguf")
    loading = "import sys; [print(f'llama_model_loader: line {i}') for i in range(1400)]; sys.exit(3)"
    monkeypatch.setattr(local, "_server_command", lambda *args: [sys.executable, "-c", loading])
    assert local.serve_local(port=8999) == 3
    out, err = capfd.readouterr()
    assert out == ""
    log = err.splitlines()[0].split("(its log: ", 1)[1].rstrip(")")
    assert err.splitlines()[0].startswith(
        f"serving {local.MODEL_NAME} at http://127.0.0.1:8999/v1 (its log: "
    )
    assert len(Path(log).read_text(encoding="utf-8").splitlines()) == 1400
    assert "llama_model_loader: line 1399" in err and "llama_model_loader: line 0\n" not in err
    assert len(err.splitlines()) < 30
