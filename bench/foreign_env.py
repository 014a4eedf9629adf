"""Run a command (the test suite) with a foreign endpoint and key exported, and count what
reaches that endpoint: nothing may.

    .venv/bin/python bench/foreign_env.py -- make test
    .venv/bin/python bench/foreign_env.py -- .venv/bin/pytest -q tests/integration/test_budget.py

It starts a logging HTTP server on 127.0.0.1 that answers every request (any method, any path)
with an OpenAI-shaped chat reply and counts it, then runs the command with the README's
`OPENAI_API_KEY`, `OPENAI_BASE_URL` and `PERSONAEMP_MODEL` pointing at it, `HF_TOKEN` set, and
an invalid value in every other PERSONAEMP_* variable an option declares (personaemp/options.py).
It prints one line — the command's exit status and the requests that reached the server — and
exits 0 only when the command passed and no request arrived. The tests isolate themselves in
tests/conftest.py (isolate_environment); this is the proof that they do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOREIGN_KEY = "sk-foreign-key-of-the-developer"
FOREIGN_MODEL = "foreign-model"


class Counter(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[str] = []
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        server: Counter = self.server  # type: ignore[assignment]
        with server.lock:
            server.requests.append(f"{self.command} {self.path}")
        body = json.dumps({
            "id": "foreign", "object": "chat.completion", "model": FOREIGN_MODEL, "created": 0,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "{}"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            "data": [{"id": FOREIGN_MODEL, "object": "model"}],
        }).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _answer

    def log_message(self, *args) -> None:  # the count is the log
        pass


def foreign_environment(base_url: str, *, invalid: bool = True) -> dict[str, str]:
    """The README's exports pointing at `base_url`; with `invalid`, an invalid value in every
    other PERSONAEMP_* variable an option declares. (No proxy: `make test`'s own steps, pip
    and apt for chromium when missing, would send their requests to it, not the tests.)"""
    readme = {"OPENAI_API_KEY": FOREIGN_KEY, "OPENAI_BASE_URL": base_url, "PERSONAEMP_MODEL": FOREIGN_MODEL}
    if not invalid:
        return readme
    sys.path.insert(0, str(ROOT))
    from personaemp.options import sections, specs

    declared = [option.opt.env for section in sections() for option in specs(section) if option.opt.env]
    env = dict.fromkeys(declared, "not-a-valid-value")
    env.update({
        **readme, "PERSONAEMP_BASE_URL": base_url, "HF_TOKEN": "hf_foreign",
        "PERSONAEMP_CONFIG": "/nonexistent/personaemp.toml",
        "PERSONAEMP_PROMPTS": "/nonexistent/prompts", "PERSONAEMP_CONCURRENCY": "-3",
        "PERSONAEMP_WORK_DIR": "/nonexistent/work", "PERSONAEMP_REWARD_LOG": "/nonexistent/reward.log",
    })  # fmt: skip
    return env


def run_foreign(
    command: list[str], cwd: Path = ROOT, timeout: float | None = None, *, invalid: bool = True
) -> tuple[int, list[str]]:
    """(the command's exit status, the requests that reached the foreign endpoint)."""
    server = Counter()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {**os.environ, **foreign_environment(server.base_url, invalid=invalid)}
        status = subprocess.run(command, cwd=cwd, env=env, timeout=timeout).returncode
    finally:
        server.shutdown()
        server.server_close()
    return status, list(server.requests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme-only", action="store_true", help="export only the README's three")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --, e.g. -- make test")
    status, requests = run_foreign(command, invalid=not args.readme_only)
    shown = ", ".join(requests[:5]) + (f" and {len(requests) - 5} more" if len(requests) > 5 else "")
    print(f"foreign endpoint: {len(requests)} requests reached it{': ' + shown if requests else ''}; "
          f"the command exited {status}")  # fmt: skip
    return 0 if status == 0 and not requests else 1


if __name__ == "__main__":
    sys.exit(main())
