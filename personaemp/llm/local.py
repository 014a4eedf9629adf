"""The embedded model (llm/models.py) served by llama-cpp-python's OpenAI-compatible server.

The server runs as a child process so the rest of the engine talks to it exactly like any
other endpoint. It answers one request at a time and accepts structured output only as
`response_format={"type": "json_object", "schema": ...}` (send `max_tokens`, not
`max_completion_tokens`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from types import TracebackType

from personaemp.errors import PersonaempError
from personaemp.llm.models import EMBEDDED, assemble

MODEL_NAME = EMBEDDED.name
# Sent with every request to the embedded model: a 0.5B model loops (one Japanese sentence
# written five times until the grammar's length bound); a mild penalty on tokens repeated
# within the last REPEAT_WINDOW (the server's setting) stops most loops without bending the JSON.
REQUEST_EXTRAS = {"repeat_penalty": 1.15}
REPEAT_WINDOW = 256
STOP_GRACE = 1.0  # seconds a stopped server gets to exit before it is killed (it would finish its reply)
_INSTALL_HINT = "pip install 'personaemp[local]' (compiles llama-cpp-python: minutes; see the README)"


def local_model_path() -> Path:
    """The GGUF file, joined into the cache from the pinned chunk packages and checked."""
    try:
        import llama_cpp  # noqa: F401  (only checked: the server needs it)
    except ImportError as exc:
        raise PersonaempError("the embedded model is not installed", hint=_INSTALL_HINT) from exc
    try:
        return assemble(EMBEDDED)
    except OSError as exc:  # disk full, unreadable cache
        raise PersonaempError(f"could not assemble the embedded model: {exc}") from exc


class GrammarLastSampler:
    """Pick a token as if there were no grammar; mask the vocabulary only when the pick breaks it.

    llama-cpp-python 0.3 puts the grammar first in its sampler chain, so every token checks
    all 262,144 gemma-3 tokens (151,936 for Qwen2.5) against the grammar: 10.7 tokens/s on 2 cores against 51
    without a grammar, 48.6 with this sampler (bench/dataset/demo_bench.py --sampler). llama.cpp's
    own server samples first and checks the one token picked; the output is the same
    (greedy: the best allowed token either way). This does that.

    When the pick breaks the grammar (about half the tokens of a base model's JSON), only the
    FEW highest logits are checked before the whole vocabulary: a full check cost 55 ms a
    token on one core. Greedy output is unchanged: the subset's pick is taken only when no
    token outside it could beat it (penalties only lower logits); sampling draws from the
    allowed tokens among the FEW, which top-k / min-p would keep anyway.
    """

    FEW = 1024

    def __init__(self, chain, llama, grammar, *, greedy: bool) -> None:
        import llama_cpp.llama_cpp as lib
        from llama_cpp._internals import LlamaTokenDataArray

        self._lib = lib
        self.chain = chain  # llama-cpp-python's own chain, built without the grammar
        self.greedy = greedy
        self.grammar = lib.llama_sampler_init_grammar(
            llama._model.vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8")
        )
        if not self.grammar:
            raise ValueError("llama.cpp rejected the grammar")
        self.n_vocab = llama._n_vocab
        self.all = LlamaTokenDataArray(n_vocab=self.n_vocab)
        self.few = LlamaTokenDataArray(n_vocab=min(self.FEW, self.n_vocab - 1))
        self.one_data = (lib.llama_token_data * 1)()
        self.one = lib.llama_token_data_array(data=self.one_data, size=1, selected=-1, sorted=False)
        self.full_scans = 0  # how often the cheap check failed (for tests and curiosity)

    def _pick(self, logits, *, with_grammar: bool) -> int:
        lib, cur = self._lib, self.all
        cur.copy_logits(logits)
        cur.candidates.selected = -1
        if with_grammar:
            lib.llama_sampler_apply(self.grammar, ctypes.byref(cur.candidates))
        lib.llama_sampler_apply(self.chain.sampler, ctypes.byref(cur.candidates))
        return int(cur.candidates_data.id[cur.candidates.selected])

    def _pick_among_few(self, logits) -> int | None:
        """The pick among the FEW best logits with the grammar, or None when it is not
        certainly the pick over the whole vocabulary (greedy) or nothing there is allowed."""
        import numpy as np

        lib, few = self._lib, self.few
        size = few.n_vocab
        order = np.argpartition(logits, self.n_vocab - size - 1)
        best = order[self.n_vocab - size :]
        outside = float(logits[order[self.n_vocab - size - 1]])  # the best logit left out
        few.candidates_data.id[:] = best
        few.candidates_data.logit[:] = logits[best]
        few.candidates_data.p[:] = 0.0
        few.candidates.size, few.candidates.sorted, few.candidates.selected = size, False, -1
        lib.llama_sampler_apply(self.grammar, ctypes.byref(few.candidates))
        lib.llama_sampler_apply(self.chain.sampler, ctypes.byref(few.candidates))
        selected = few.candidates.selected
        logit = float(few.candidates_data.logit[selected])
        if logit == float("-inf") or (self.greedy and logit < outside):
            return None
        return int(few.candidates_data.id[selected])

    def _allowed(self, token: int) -> bool:
        self.one_data[0].id, self.one_data[0].logit, self.one_data[0].p = token, 0.0, 0.0
        self.one.size, self.one.selected = 1, -1
        self._lib.llama_sampler_apply(self.grammar, ctypes.byref(self.one))
        return self.one_data[0].logit != float("-inf")

    def sample(self, ctx, idx: int = -1) -> int:
        import numpy as np

        pointer = self._lib.llama_get_logits_ith(ctx.ctx, idx)
        logits = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))
        token = self._pick(logits, with_grammar=False)
        if not self._allowed(token):
            token = self._pick_among_few(logits)
            if token is None:
                self.full_scans += 1
                token = self._pick(logits, with_grammar=True)
        self._lib.llama_sampler_accept(self.grammar, token)
        self.chain.accept(token)
        return token

    def close(self) -> None:
        if self.grammar:
            self._lib.llama_sampler_free(self.grammar)
            self.grammar = None
        self.chain.close()

    def __del__(self) -> None:
        self.close()


def _patch_llama_cpp() -> None:
    """Two fixes to llama-cpp-python 0.3 that its server CLI has no option for.

    - Extra weight buffers off: on CPUs with AMX (Sapphire Rapids and later) llama.cpp repacks
      the weights for AMX and then segfaults in its first matrix multiply
      (ggml-org/llama.cpp#20824, fix pending in #26954).
    - Grammar checked last (see GrammarLastSampler): structured replies about 4.5x faster.
    """
    import llama_cpp.llama_cpp as llama_lib
    from llama_cpp import Llama

    default_params = llama_lib.llama_model_default_params

    def params_without_extra_buffers():
        params = default_params()
        params.use_extra_bufts = False
        return params

    llama_lib.llama_model_default_params = params_without_extra_buffers

    init_sampler = Llama._init_sampler
    if getattr(init_sampler, "grammar_last", False):
        return

    def grammar_last(self, *args, grammar=None, **kwargs):
        if grammar is None or kwargs.get("logits_processor") is not None:  # keep upstream's order
            return init_sampler(self, *args, grammar=grammar, **kwargs)
        greedy = kwargs.get("temp", 0.8) == 0.0  # 0.8: _init_sampler's default
        return GrammarLastSampler(init_sampler(self, *args, **kwargs), self, grammar, greedy=greedy)

    grammar_last.grammar_last = True
    Llama._init_sampler = grammar_last


def _run_llama_server() -> None:
    """`python -m llama_cpp.server` with the fixes of `_patch_llama_cpp`."""
    from llama_cpp.server.__main__ import main

    _patch_llama_cpp()
    main()


def _server_command(model_path: Path, host: str, port: int, n_ctx: int, n_threads: int) -> list[str]:
    return [
        sys.executable,
        "-c",
        "from personaemp.llm.local import _run_llama_server; _run_llama_server()",
        "--model",
        str(model_path),
        "--model_alias",
        MODEL_NAME,
        *(
            ["--chat_format", EMBEDDED.chat_format] if EMBEDDED.chat_format else []
        ),  # else the GGUF's template
        "--host",
        host,
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(n_threads),
        "--n_threads_batch",
        str(n_threads),
        # True (the server's default) keeps n_ctx x vocab float logits: ~5-8.6 GB at n_ctx 8192.
        "--logits_all",
        "False",
        "--flash_attn",
        "True",  # measured: about 1.5x faster prompt processing and smaller KV cache at long contexts
        "--use_mlock",
        "False",  # mlock of the weights fails under the usual container memlock limit
        # The repeat penalty's window (llama.cpp's default: 64 tokens): long enough to cover the
        # moment written just before, which a 0.5B model otherwise writes again for each category.
        "--last_n_tokens_size",
        str(REPEAT_WINDOW),
    ]


def local_threads() -> int:
    """PERSONAEMP_LOCAL_THREADS, else every core (the server answers one request at a time)."""
    return int(os.environ.get("PERSONAEMP_LOCAL_THREADS") or 0) or os.cpu_count() or 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent():
    """A preexec_fn that makes Linux kill the child when its parent dies; None elsewhere.

    Linux ties this to the parent *thread*: enter LocalServer in a thread that outlives it.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        # Resolved before fork: loading a library in the forked child could deadlock.
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    parent = os.getpid()

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def _tail(path: Path, lines: int = 20) -> str:
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines)).rstrip()
    except OSError:
        return "(no log)"


class LocalServer:
    """Run the embedded model on 127.0.0.1 for the duration of a `with` block.

    >>> with LocalServer() as server:
    ...     client = openai.OpenAI(base_url=server.base_url, api_key="local")

    The server's output goes to `log_path` (a temp file unless given; a temp log is removed
    on a clean exit and kept when startup or the body failed).
    """

    model = MODEL_NAME

    def __init__(
        self,
        port: int | None = None,
        n_ctx: int = 8192,
        n_threads: int | None = None,
        log_path: Path | None = None,
        startup_timeout: float = 120.0,
        model_path: Path | None = None,
    ):
        self.port = port
        self.n_ctx = n_ctx
        self.n_threads = n_threads or local_threads()
        self.startup_timeout = startup_timeout
        self.model_path = model_path
        self._own_log = log_path is None
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="personaemp-llama-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        self.log_path = Path(log_path)
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> LocalServer:
        model_path = self.model_path or local_model_path()
        if self.port is None:
            self.port = _free_port()
        command = _server_command(model_path, "127.0.0.1", self.port, self.n_ctx, self.n_threads)
        with self.log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent(),
            )
        try:
            self._wait_until_ready()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop()
        if self._own_log and exc_type is None:
            self.log_path.unlink(missing_ok=True)

    def _wait_until_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via HTTP(S)_PROXY
        while True:
            code = self.process.poll()
            if code is not None:
                self._fail(f"the embedded model server exited with code {code} during startup")
            try:
                with opener.open(f"{self.base_url}/models", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet (or still loading the model)
            if time.monotonic() > deadline:
                self._fail(f"the embedded model server did not start within {self.startup_timeout:g} s")
            time.sleep(0.2)

    def _fail(self, message: str) -> None:
        raise PersonaempError(
            f"{message}; last lines of {self.log_path}:\n{_tail(self.log_path)}",
            hint=f"see the full log at {self.log_path}",
        )

    def _stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        _terminate(self.process)


def _terminate(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after STOP_GRACE: uvicorn would first finish the reply it is on."""
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        process.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def serve_local(host: str = "127.0.0.1", port: int = 8011, n_ctx: int = 8192) -> int:
    """Serve the embedded model in the foreground until the server exits or we are stopped.

    SIGINT, SIGTERM and SIGHUP stop the server too, within STOP_GRACE seconds even in the
    middle of a generation (uvicorn alone would finish it first: minutes on a long reply).
    Returns the exit code: 0 when stopped on request, else the server's own.
    """
    command = _server_command(local_model_path(), host, port, n_ctx, local_threads())
    log_path = Path(tempfile.gettempdir()) / f"personaemp-serve-local-{port}.log"  # llama.cpp's ~1,400 lines
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent(),
        )
    print(
        f"serving {MODEL_NAME} at http://{host}:{port}/v1 (its log: {log_path})", file=sys.stderr, flush=True
    )
    stop_requested: list[int] = []

    def stop(signum, frame) -> None:
        stop_requested.append(signum)

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, stop) for sig in signals}
    try:
        while process.poll() is None and not stop_requested:
            time.sleep(0.1)
        if stop_requested:
            _terminate(process)
            return 0
        print(f"the server exited ({process.returncode}); last lines of {log_path}:\n{_tail(log_path)}",
              file=sys.stderr)  # fmt: skip
        return process.returncode
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if process.poll() is None:
            process.kill()
            process.wait()
