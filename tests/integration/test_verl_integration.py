"""verl's own code on an exported parquet (skipped, with the reason, where verl is absent):
`RLHFDataset` reads the file `personaemp export --format verl` writes, verl's
`get_custom_reward_fn` loads the documented reward file with `load_extern_object`, and its
reward loop (RewardLoopWorker.compute_score_batch -> the naive reward-loop manager) scores
the rows' rollouts through `compute_score_async`, as verl 0.9 does in a GRPO step. Checked
with verl 0.9.1, transformers 5.10.4, torch 2.13.0 (CPU)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

verl = pytest.importorskip("verl", reason="verl is not installed (pip install -e '.[verl]')")

from fake_openai import FakeOpenAI  # noqa: E402

import personaemp.reward as public  # noqa: E402
import personaemp.training.reward as module  # noqa: E402
from personaemp.training.export import write_export  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def tiny_tokenizer(texts):
    sys.path.insert(0, str(ROOT / "bench" / "training"))
    try:
        from grpo_bench import tiny_policy
    finally:
        sys.path.remove(str(ROOT / "bench" / "training"))
    return tiny_policy(texts)[0]


def test_verls_loader_dataset_and_reward_loop_score_an_exported_parquet(tmp_path, monkeypatch):
    import numpy as np
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.import_utils import load_extern_object

    sys.path.insert(0, str(ROOT / "bench" / "training"))
    try:
        from grpo_bench import fake_judge, write_split
    finally:
        sys.path.remove(str(ROOT / "bench" / "training"))
    splits = write_split(tmp_path)
    parquet = tmp_path / "train.parquet"
    write_export(splits, parquet, format="verl", part="train", context="memory")

    import pandas

    rows = pandas.read_parquet(parquet)
    prompts = [m["content"] for prompt in rows["prompt"] for m in prompt]
    tokenizer = tiny_tokenizer(prompts)
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 4096,
                               "filter_overlong_prompts": False,
                               "truncation": "error", "return_raw_chat": True})  # fmt: skip
    dataset = RLHFDataset(str(parquet), tokenizer, config)
    assert len(dataset) == len(rows) == 8
    items = [dataset[i] for i in range(len(dataset))]
    assert all(item["extra_info"]["query_id"] for item in items)

    with FakeOpenAI(responder=fake_judge) as server:
        toml = tmp_path / "personaemp.toml"
        toml.write_text(
            f'[llm]\nbase_url = ["{server.base_url}"]\nmodel = "fake"\nconcurrency = 4\n'
            f'work_dir = "{tmp_path / "work"}"\n[reward]\nsamples = 1\nlog = "{tmp_path / "reward.jsonl"}"\n',
            encoding="utf-8",
        )
        monkeypatch.setenv(module.CONFIG_VAR, str(toml))
        function = load_extern_object(public.__file__, "compute_score_async")
        assert asyncio.iscoroutinefunction(function)
        reward_config = OmegaConf.create(
            {"reward": {"custom_reward_function": {"path": public.__file__, "name": "compute_score_async",
                                                   "reward_kwargs": {}},
                        "reward_model": {"enable": False}}}
        )  # fmt: skip
        texts = [f"I hear you, {n}. That sounds hard." for n in range(len(items))]

        class Decoder:
            def decode(self, ids, skip_special_tokens=True):
                return texts[int(ids[0])]

        n = len(items)
        data = DataProto.from_dict(
            tensors={"prompts": torch.zeros(n, 1, dtype=torch.long),
                     "responses": torch.arange(n).unsqueeze(1),
                     "attention_mask": torch.ones(n, 2, dtype=torch.long)},
            non_tensors={key: np.array([item[key] for item in items], dtype=object)
                         for key in ("data_source", "reward_model", "extra_info")},
        )  # fmt: skip
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            worker = object.__new__(RewardLoopWorker)  # its __init__ loads a tokenizer from a hub
            worker.config = reward_config
            worker.reward_manager = NaiveRewardManager(
                reward_config, Decoder(), get_custom_reward_fn(reward_config)
            )
            worker.loop = loop
            outputs = loop.run_until_complete(worker.compute_score_batch(data))
        finally:
            loop.close()
            asyncio.set_event_loop(None)
        module.default_reward().close()
        assert server.count == n * 4 and server.max_in_flight <= 4
    scores = [output["reward_score"] for output in outputs]
    assert len(scores) == n and all(-0.5 <= score <= 1.0 for score in scores)
    lines = [json.loads(line) for line in (tmp_path / "reward.jsonl").read_text().splitlines()]
    assert [line["rollouts"] for line in lines] == [n]  # one step, one line
