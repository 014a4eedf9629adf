"""LLM engine: the only package that talks to chat-completion endpoints.

The public API the stages build on:

    settings = LLMSettings(base_urls=[...], model="...")      # or LLMSettings(llm="local")
    report = run_llm_stage("my-stage", rows, make_work, settings=settings, key="user_id",
                           output=path, fingerprint=lambda engine: f"{engine.model}|v1")

where `make_work(engine)` returns an async function of one row that calls
`await engine.call(step, messages, ReplyModel, schema=..., check=...)` and returns the
output row; a unit that fails for good raises `UnitError` (LLMError is one).
"""

from personaemp.llm.endpoints import LLMError
from personaemp.llm.engine import CallResult, Engine
from personaemp.llm.run import StageReport, run_llm_stage
from personaemp.llm.session import open_engine
from personaemp.llm.settings import LLMSettings

__all__ = ["CallResult", "Engine", "LLMError", "LLMSettings", "StageReport", "open_engine", "run_llm_stage"]
