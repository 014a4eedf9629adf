"""What the engine needs to know: endpoints, model, limits, cache. Plain data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from personaemp.errors import InputError

STRUCTURED_MODES = ("auto", "json_schema", "json_object_schema", "json_object", "none")
LLM_CHOICES = ("auto", "local", "remote")


@dataclass
class LLMSettings:
    """Settings shared by every LLM stage (flags > env vars > personaemp.toml > defaults).

    `api_key` is kept out of repr() and of `public()`, so it never reaches a report.
    """

    base_urls: list[str] = field(default_factory=list)
    api_key: str | None = field(default=None, repr=False)
    model: str | None = None
    llm: str = "auto"  # auto: local unless an endpoint is configured
    structured: str = "auto"  # auto: json_object_schema for the local server, json_schema otherwise
    concurrency: int = 16  # requests in flight per endpoint
    rpm: float | None = None  # requests per minute per endpoint
    timeout: float = 120.0  # seconds per request
    max_retries: int = 6  # network/HTTP retries per request
    max_reasks: int = 2  # re-asks after an invalid or truncated reply
    max_tokens: int = 1024
    temperature: float = 0.7
    work_dir: Path = Path("data/processed/.personaemp")
    use_cache: bool = True
    refresh: bool = False  # ignore cached replies, overwrite them
    price_in: float | None = None  # per million prompt tokens
    price_out: float | None = None  # per million completion tokens
    local_log: Path | None = None

    def __post_init__(self) -> None:
        if self.llm not in LLM_CHOICES:
            raise InputError(f"--llm must be one of {', '.join(LLM_CHOICES)}, not {self.llm!r}")
        if self.structured not in STRUCTURED_MODES:
            raise InputError(f"--structured must be one of {', '.join(STRUCTURED_MODES)}")
        if self.concurrency < 1:
            raise InputError("--concurrency must be at least 1")
        if self.llm == "remote" and not self.base_urls:
            raise InputError("--llm remote needs an endpoint", "pass --base-url or set OPENAI_BASE_URL")
        if self.timeout <= 0 or self.max_tokens < 1 or self.max_retries < 0 or self.max_reasks < 0:
            raise InputError("--timeout and --max-tokens must be positive; retries and re-asks >= 0")

    @property
    def uses_local(self) -> bool:
        return self.llm == "local" or (self.llm == "auto" and not self.base_urls)

    def public(self) -> dict:
        """The settings as recorded in reports: everything but the key."""
        return {
            "endpoints": list(self.base_urls) if not self.uses_local else ["local"],
            "model": self.model,
            "structured": self.structured,
            "concurrency": self.concurrency,
            "rpm": self.rpm,
            "timeout": self.timeout,
            "max_retries": self.max_retries,
            "max_reasks": self.max_reasks,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "cache": self.use_cache,
            "refresh": self.refresh,
        }
