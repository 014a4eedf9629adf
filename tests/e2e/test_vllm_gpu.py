"""--llm vllm on a real GPU: infer-persona on the shipped sample through ray.data.llm's vLLM
processor, no endpoint. Runs only where vLLM (the [vllm] extra), a CUDA GPU and a model are
present: PERSONAEMP_VLLM_MODEL names a local model folder or a Hugging Face id the machine
has cached (e.g. Qwen/Qwen2.5-1.5B-Instruct). Elsewhere tests/e2e/test_ray_vllm.py runs the same
rounds with ray.data.llm's HTTP processor in vLLM's place."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import SAMPLE_TASK1
from rich.console import Console

MODEL = os.environ.get("PERSONAEMP_VLLM_MODEL")
pytest.importorskip("vllm")
torch = pytest.importorskip("torch")
if not (MODEL and torch.cuda.is_available()):
    pytest.skip("needs a CUDA GPU and PERSONAEMP_VLLM_MODEL", allow_module_level=True)


def test_infer_persona_on_vllm_writes_cited_personas(sample_build, tmp_path):
    """Every user of the sample becomes a persona row or a failure row (none lost), each
    persona's traits cite memory ids the user has (the stage's own check), and the report
    counts the vLLM rounds and their requests."""
    import ray

    from personaemp.dataset.options import PersonaOptions
    from personaemp.registry import STAGES, RunOptions
    from personaemp.shared_options import LLMOptions, PathsOptions

    shutil.copy(sample_build / "filtered.jsonl", tmp_path / "filtered.jsonl")
    options = RunOptions(
        paths=PathsOptions(input=str(SAMPLE_TASK1), processed=tmp_path),
        llm=LLMOptions(
            llm="vllm", executor="ray", model=MODEL, workers=1, vllm={"engine": {"max_model_len": 8192}}
        ),
        persona=PersonaOptions(),
    )
    try:
        result = STAGES["infer-persona"].run(options, Console(width=160), full=True)
    finally:
        ray.shutdown()
    outcome = result.report.outcome
    users = len((tmp_path / "filtered.jsonl").read_text().splitlines())
    assert outcome.done + outcome.failed == users
    assert outcome.done > 0
    for line in (tmp_path / "personas.jsonl").read_text().splitlines():
        persona = json.loads(line)
        assert persona["traits"] and all(trait["evidence"] for trait in persona["traits"])
    figures = result.report.notes["vllm"]
    assert figures["rounds"] >= 2 and figures["answered"] > 0
