"""personaemp.toml: the settings of a whole `personaemp run`, in one file.

Resolution order for the LLM settings: environment variables (OPENAI_BASE_URL,
PERSONAEMP_MODEL, ...) over the file over the defaults; the API keys come from the
environment only and a file that holds one is refused.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from personaemp.errors import InputError, first_problem


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PathsConfig(_Section):
    input: str = "data/raw/alpsbench_sample/task1"
    processed: Path = Path("data/processed")


class FilterConfig(_Section):
    format: str = "auto"
    rules: Path | None = None
    split: str | None = None
    on_error: str = "fail"


class LLMConfig(_Section):
    llm: str = "auto"
    base_url: list[str] = []
    model: str | None = None
    structured: str = "auto"
    concurrency: int = 16
    rpm: float | None = None
    timeout: float = 120.0
    max_tokens: int = 1024
    temperature: float = 0.7
    max_retries: int = 6
    max_reasks: int = 2
    price_in: float | None = None
    price_out: float | None = None


class PersonaConfig(_Section):
    limit: int | None = None
    require_depth: bool = True


class QueriesConfig(_Section):
    per_category: int = 1
    categories: list[str] = ["ES", "HEQ", "SS"]
    enforce: list[str] | None = None  # default: every check


class SplitConfig(_Section):
    seed: int = 13
    test_size: float = 0.1
    ood: bool = True
    k: int | None = None
    k_min: int = 2
    k_max: int = 8
    seeds: int = 5


class PushConfig(_Section):
    repo_id: str | None = None  # none: a dry run into `out`
    out: Path | None = None  # default: <processed>/dataset
    private: bool = False
    include_dialogue: bool = False


class RunConfig(_Section):
    paths: PathsConfig = PathsConfig()
    filter: FilterConfig = FilterConfig()
    llm: LLMConfig = LLMConfig()
    persona: PersonaConfig = PersonaConfig()
    queries: QueriesConfig = QueriesConfig()
    split: SplitConfig = SplitConfig()
    push: PushConfig = PushConfig()


def load_config(path: Path | None) -> RunConfig:
    if path is None:
        return RunConfig()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such config file") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML ({exc})") from None
    suspicious = [
        name
        for section in data.values()
        if isinstance(section, dict)
        for name in section
        if ("key" in name.lower() or "token" in name.lower()) and name != "max_tokens"
    ]
    if suspicious:
        raise InputError(f"{path}: secrets do not belong in a file", "set OPENAI_API_KEY / HF_TOKEN instead")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{path}: {first_problem(exc)}") from None


def llm_settings_from(config: RunConfig):
    """The engine settings: environment over file over defaults."""
    from personaemp.llm.settings import LLMSettings

    llm = config.llm
    env = os.environ
    urls = env.get("OPENAI_BASE_URL")
    base_urls = [u.strip() for u in urls.split(",") if u.strip()] if urls else list(llm.base_url)
    return LLMSettings(
        base_urls=base_urls,
        api_key=env.get("OPENAI_API_KEY"),
        model=env.get("PERSONAEMP_MODEL") or llm.model,
        llm=llm.llm,
        structured=llm.structured,
        concurrency=int(env.get("PERSONAEMP_CONCURRENCY") or llm.concurrency),
        rpm=llm.rpm,
        timeout=llm.timeout,
        max_tokens=llm.max_tokens,
        temperature=llm.temperature,
        max_retries=llm.max_retries,
        max_reasks=llm.max_reasks,
        work_dir=Path(env.get("PERSONAEMP_WORK_DIR") or config.paths.processed / ".personaemp"),
        price_in=llm.price_in,
        price_out=llm.price_out,
    )
