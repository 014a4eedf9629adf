"""Open an engine from settings: endpoints (or the embedded local server), cache, pool."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from personaemp.errors import InputError
from personaemp.llm.accounting import Accounting
from personaemp.llm.cache import ReplyCache
from personaemp.llm.endpoints import Endpoint, EndpointPool
from personaemp.llm.engine import DECISIONS_FILE, Budget, Engine
from personaemp.llm.estimate import cache_rule
from personaemp.llm.local import REQUEST_EXTRAS as LOCAL_REQUEST_EXTRAS
from personaemp.llm.models import EMBEDDED
from personaemp.llm.settings import LLMSettings
from personaemp.prompts import COMPACT

LOCAL_FLOOR = 600.0  # seconds the embedded model gets for a request before its speed is known
LOCAL_SLACK = 2.0  # times the time max_tokens take at the measured speed
LOCAL_CAP = 4 * 3600.0  # seconds: a stuck server is still told, in hours at worst


def local_deadline(accounting: Accounting, floor: float) -> Callable[[dict, int], float]:
    """The embedded model's time for a request: `floor` until a reply measured its speed, then
    LOCAL_SLACK times what the request's max_tokens take at that speed (completion tokens per
    second of reply time, over the run's replies), never under `floor`; doubled for each time
    the request timed out already. On a loaded machine the model ran at 1 token/s and the
    first persona request hit the fixed 600 s limit, was sent again and timed out again."""

    def deadline(request: dict, timeouts: int) -> float:
        seconds = floor
        steps = list(accounting.steps.values())
        tokens = sum(stats.completion_tokens for stats in steps)
        spent = sum(stats.seconds for stats in steps)
        if tokens and spent and request.get("max_tokens"):
            seconds = max(floor, LOCAL_SLACK * request["max_tokens"] * spent / tokens)
        return min(seconds * 2**timeouts, LOCAL_CAP)

    return deadline


@contextlib.asynccontextmanager
async def open_engine(
    settings: LLMSettings, notify: Callable[[str], None] | None = None, offline=None
) -> AsyncIterator[Engine]:
    """Yield a ready engine; the local server (if used) is stopped and the cache closed after.

    `notify(line)` hears what the engine decides on the way (a refused response format).
    `offline` (--estimate, --batch): no request will be sent, so no server is started."""
    if settings.llm == "vllm" and offline is None:  # only a stage's rounds reach vLLM (ray_vllm.py)
        raise InputError(
            "--llm vllm has no endpoint to send to here: it answers an LLM stage's requests in rounds",
            "for this, serve the model (e.g. `vllm serve`) and give --base-url",
        )
    async with contextlib.AsyncExitStack() as stack:
        if settings.uses_local and not (offline is not None and settings.model):
            from personaemp.llm.local import MODEL_NAME, LocalServer

            if offline is None:
                server = stack.enter_context(LocalServer(log_path=settings.local_log))
                base_url = server.base_url
            else:  # nothing will be sent: no server to start
                base_url = "http://127.0.0.1/v1"
            # llama.cpp serves one request at a time: more in flight would only queue there
            # and run into timeouts.
            base_urls, model, concurrency, kind = [base_url], MODEL_NAME, 1, "local"
            # Schema-constrained generation runs at ~20 tokens/s on 2 cores, at 1 token/s on
            # a loaded machine: at least LOCAL_FLOOR, then scaled (local_deadline).
            timeout = max(settings.timeout, LOCAL_FLOOR)
            structured = "json_object_schema" if settings.structured == "auto" else settings.structured
        else:
            if not settings.model:
                raise InputError("no model given for the endpoint", "pass --model or set PERSONAEMP_MODEL")
            base_urls, model, concurrency, kind = (
                settings.base_urls or ["http://127.0.0.1/v1"],  # offline: a batch needs no endpoint
                settings.model,
                settings.concurrency,
                "vllm" if settings.llm == "vllm" else "remote",  # vllm: answered in rounds (ray_vllm)
            )
            timeout = settings.timeout
            structured = settings.structured  # auto: negotiated by the engine
        endpoints = [
            Endpoint(url, settings.api_key, concurrency, settings.rpm, timeout, settings.key_source)
            for url in base_urls
        ]
        for endpoint in endpoints:
            stack.push_async_callback(endpoint.client.close)
        accounting = Accounting()
        if kind == "local":
            for endpoint in endpoints:
                endpoint.deadline = local_deadline(accounting, timeout)
        cache = None
        path = settings.work_dir / "cache.sqlite"
        if settings.estimate:  # read what is there, create and write nothing
            if settings.use_cache and not settings.refresh and path.exists():
                cache = ReplyCache(path, read=True, write=False)
                stack.callback(cache.close)
        elif settings.use_cache or settings.refresh or settings.batch is not None:
            cache = ReplyCache(path, read=settings.use_cache and not settings.refresh)
            stack.callback(cache.close)
        yield Engine(
            EndpointPool(endpoints, settings.max_retries),
            model=model,
            structured=structured,
            fold_system=kind == "local" and not EMBEDDED.system_role,
            max_tokens=settings.max_tokens,
            temperature=settings.temperature,
            max_reasks=settings.max_reasks,
            cache=cache,
            endpoint_kind=kind,
            seed=settings.seed,
            steps=settings.steps,
            decisions=settings.work_dir / DECISIONS_FILE,
            notify=notify,
            request_extras=LOCAL_REQUEST_EXTRAS if kind == "local" else None,
            offline=offline,
            prompt_variant=COMPACT if kind == "local" else None,
            shared_schemas=cache_rule(settings) == "openai",
            accounting=accounting,
            budget=Budget(settings.max_cost, settings.price_in, settings.price_out, settings.price_cached)
            if settings.max_cost is not None
            else None,
        )
