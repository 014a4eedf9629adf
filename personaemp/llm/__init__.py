"""LLM engine: the only package that talks to chat-completion endpoints.

The public API the stages build on:

    STEP = Step("persona", PersonaReply, prompt="persona")          # declared once per step
    settings = LLMSettings(base_urls=[...], model="...")             # or LLMSettings(llm="local")
    plan = LLMStage("my-stage", rows, make_work, key="user_id", output=path,
                    fingerprint=lambda engine: engine.fingerprint(STEP, hash), steps=[STEP])
    report = run_llm_stage(plan, settings=settings)                  # or await arun_llm_stage(...)

where `make_work(engine)` returns an async function of one row that calls
`await engine.call(STEP, messages, schema=..., parse=...)` and returns the output row; a
unit that fails for good raises `UnitError` (LLMError is one), a parse that refuses a reply
raises `RejectedReply` (the engine re-asks first). `EndpointError` stops the whole run.
"""

from personaemp.llm.endpoints import LLMError
from personaemp.llm.engine import CallResult, EndpointError, Engine
from personaemp.llm.session import open_engine
from personaemp.llm.settings import LLMSettings
from personaemp.llm.stage import LLMStage, StageReport, arun_llm_stage, run_llm_stage
from personaemp.llm.step import RejectedReply, Step

__all__ = [
    "CallResult",
    "EndpointError",
    "Engine",
    "LLMError",
    "LLMSettings",
    "LLMStage",
    "RejectedReply",
    "StageReport",
    "Step",
    "arun_llm_stage",
    "open_engine",
    "run_llm_stage",
]
