"""What the engine needs to know: endpoints, model, limits, cache. Plain data, no I/O.

The defaults and the validation are those of the `[llm]` options
(personaemp.shared_options.LLMOptions), where every LLM option is declared once; this class is
the engine's view of them (a list of endpoints, the key, use_cache instead of no_cache).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from personaemp.errors import InputError
from personaemp.options import describe, spec
from personaemp.secrets import redact_url
from personaemp.shared_options import LLMOptions, StepSampling

KEY_ENV = "OPENAI_API_KEY"  # the endpoint's key when none is given
_DEFAULT = LLMOptions()
_STEPS = TypeAdapter(dict[str, dict[str, StepSampling]])
_REPORTED = ("model", "structured", "concurrency", "rpm", "timeout", "max_retries", "max_reasks",
             "max_tokens", "temperature", "seed", "steps")  # fmt: skip
_CHECKED = (*(name for name in _REPORTED if name != "steps"), "llm", "work_dir", "refresh", "price_in",
            "price_out", "price_cached", "cache_rule", "max_cost", "estimate", "batch", "executor", "workers",
            "ray_address", "vllm")  # fmt: skip


# What a way of running needs beyond the core: the modules (found, not imported) and the extra
# that installs them. Checked before any stage starts (check_installed): `run --llm vllm`
# without vLLM failed after 37-45 s of filter and Ray start-up.
NEEDS: dict[str, tuple[tuple[str, ...], str]] = {
    # ray.data.llm's vLLM processor imports transformers, then vLLM
    "vllm": (("ray", "transformers", "vllm"), "pip install 'personaemp[vllm]' (vLLM runs on CUDA GPUs)"),
    "ray": (("ray",), "pip install 'personaemp[ray]'"),
    "local": (("llama_cpp",), "pip install 'personaemp[local]' (compiles llama-cpp-python: minutes)"),
}
_PACKAGES = {"llama_cpp": "llama-cpp-python"}  # a module whose package is named otherwise


@dataclass
class LLMSettings:
    """Settings shared by every LLM stage (flags > env vars > personaemp.toml > defaults).

    `api_key` is kept out of repr() and of `public()`, so it never reaches a report. Not
    given, it is read from the variable `key_env` (OPENAI_API_KEY), for every entry point
    alike (the CLI, `pe.*`, the reward); `key_source` says where it came from.
    """

    base_urls: list[str] = field(default_factory=lambda: list(_DEFAULT.base_url))
    api_key: str | None = field(default=None, repr=False)
    key_env: str = KEY_ENV
    model: str | None = _DEFAULT.model
    llm: str = _DEFAULT.llm  # auto: local unless an endpoint is configured
    structured: str = (
        _DEFAULT.structured
    )  # auto: json_object_schema for the local server, json_schema otherwise
    concurrency: int = _DEFAULT.concurrency  # requests in flight per endpoint
    rpm: float | None = _DEFAULT.rpm  # requests per minute per endpoint
    timeout: float = _DEFAULT.timeout  # seconds per request
    max_retries: int = _DEFAULT.max_retries  # network/HTTP retries per request
    max_reasks: int = _DEFAULT.max_reasks  # re-asks after an invalid or truncated reply
    max_tokens: int = _DEFAULT.max_tokens
    temperature: float = _DEFAULT.temperature
    seed: int | None = _DEFAULT.seed  # sent with every request when set
    # Per-step sampling over the steps' own defaults: {"check": {"temperature": 0.0}}.
    steps: dict[str, dict[str, float | int]] = field(default_factory=dict)
    work_dir: Path = _DEFAULT.work_dir
    use_cache: bool = not _DEFAULT.no_cache
    refresh: bool = _DEFAULT.refresh  # ignore cached replies, overwrite them
    price_in: float | None = _DEFAULT.price_in  # per million prompt tokens
    price_out: float | None = _DEFAULT.price_out  # per million completion tokens
    price_cached: float | None = _DEFAULT.price_cached  # per million cache-served prompt tokens
    cache_rule: str = _DEFAULT.cache_rule  # how --estimate counts cached tokens (llm/estimate.py)
    max_cost: float | None = _DEFAULT.max_cost  # dollars: stop before spending more
    estimate: bool = _DEFAULT.estimate  # count what would be sent; send and write nothing
    batch: Path | None = _DEFAULT.batch  # work from batch files in this folder, no endpoint
    # Who runs the units (llm/ray_executor.py); not reported: the rows are the same either way.
    executor: str = _DEFAULT.executor
    workers: int = _DEFAULT.workers
    ray_address: str | None = _DEFAULT.ray_address
    # --llm vllm: {"engine": vLLM's engine kwargs, "processor": ray.data.llm's} (llm/ray_vllm.py)
    vllm: dict[str, dict] = field(default_factory=dict)
    local_log: Path | None = None
    key_source: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        from personaemp import secrets

        if self.api_key:
            self.key_source = "the api_key argument"
        else:
            self.api_key = os.environ.get(self.key_env) or None
            self.key_source = f"${self.key_env}" + ("" if self.api_key else " (not set)")
        secrets.register(self.api_key)
        for url in self.base_urls:  # a key written into the URL is a key too
            secrets.register_url(url)
        # Paths as Python callers write them (str, ~): the engine joins them as Paths.
        self.work_dir = Path(self.work_dir).expanduser()
        if self.batch is not None:
            self.batch = Path(self.batch).expanduser()
        # Checked as the [llm] options are (same names, but for the endpoints and the cache).
        values = {name: getattr(self, name) for name in _CHECKED}
        values.update(base_url=list(self.base_urls), no_cache=not self.use_cache)
        flag = lambda name, lead: spec("llm", name).flag if name else "LLM settings"  # noqa: E731
        try:
            LLMOptions.model_validate(values)
            # The step names are checked where users write them (the options); the engine
            # takes any step's sampling, but each value must be sane.
            _STEPS.validate_python({"steps": self.steps})
        except ValidationError as exc:
            raise InputError(describe(exc, flag)) from None

    @property
    def uses_local(self) -> bool:
        return self.llm == "local" or (self.llm == "auto" and not self.base_urls)

    def check_installed(self) -> None:
        """One line at once when what these settings run on is not installed (NEEDS): before
        the filter runs and Ray starts. --estimate and --batch send nothing: they need none."""
        import importlib.util

        if self.estimate or self.batch is not None:
            return
        asked = [("vllm", "--llm vllm")] if self.llm == "vllm" else []
        asked += [("ray", "--executor ray")] if self.executor == "ray" else []
        asked += [("local", "the embedded model (--llm local)")] if self.uses_local else []
        for need, what in asked:
            modules, install = NEEDS[need]
            for module in modules:
                if importlib.util.find_spec(module) is None:
                    name = _PACKAGES.get(module, module)
                    raise InputError(f"{what} needs {name}, which is not installed here", install)

    def public(self) -> dict:
        """The settings as recorded in reports: everything but the key."""
        return {
            "endpoints": [redact_url(url) for url in self.base_urls] if not self.uses_local else ["local"],
            **{name: getattr(self, name) for name in _REPORTED},
            "cache": self.use_cache,
            "refresh": self.refresh,
            "max_cost": self.max_cost,
        }
