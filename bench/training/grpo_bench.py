"""A few real TRL GRPO steps on CPU with PereGRM as the reward, and what each rollout score costs.

    pip install -e '.[train]'          # trl, transformers, torch
    python bench/training/grpo_bench.py [--steps 3] [--base-url URL --model M]

What it does, all offline:
  1. writes a small split (4 users, 8 queries) and exports it with `personaemp export
     --format trl` (the prompts `respond` sends);
  2. builds a tiny policy: a byte-level BPE tokenizer trained here on those prompts, and a
     Llama-shaped model with random weights from a transformers config (nothing downloaded);
  3. runs GRPOTrainer for --steps steps with PereGRM (k = 1, bystander, lambda 0.5) as the
     reward, the judge being tests/fake_openai.py on 127.0.0.1 (or --base-url);
  4. scores the same rollouts again, each instrument on a cold cache: per dimension with
     k = 1 and k = 8, joint with k = 1 and k = 8, and prints calls, HTTP requests and tokens
     per rollout score beside the authors' count (3k + 1), with how far the joint scores
     agree with the per-dimension ones (with the fake judge, whose scores are a hash of the
     reply plus noise, the agreement only shows the plumbing: run it on a real judge with
     --base-url/--model for a figure that means something);
  5. scores the first step's batch once more on its warm cache: 0 requests.

The k samples and three dimensions sharing their prompt prefix (what cuts an endpoint's
prompt cost, not its call count) come from the prompt layout of the `cost` work; this bench
counts calls and tokens as the engine reports them (cached prompt tokens when it does).
Prints figures, asserts nothing; not part of `make test`. Without trl/transformers/torch it
says so and exits 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

TRAITS = ("openness", "conscientiousness", "extraversion", "agreeableness", "neuroticism")
SITUATIONS = [
    ("failed the driving test a second time", "I failed my driving test again and feel awful."),
    (
        "argued with a close friend about money",
        "My friend is angry I asked for my money back. What do I say?",
    ),
    ("was passed over for a promotion", "They gave the promotion to someone newer. I feel invisible."),
    ("has to give a toast at a sister's wedding", "How do I give a wedding toast without freezing up?"),
]


def missing_extra() -> str | None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import trl  # noqa: F401
    except ImportError as exc:
        return f"the [train] extra is not installed ({exc.name} missing): pip install -e '.[train]'"
    return None


def write_split(folder: Path) -> Path:
    rows = []
    for u in range(4):
        user = f"u{u}"
        memories = [
            {"memory_id": f"m{i}", "label": "States_Experiences", "value": f"{user} {text}"}
            for i, (text, _) in enumerate(SITUATIONS, 1)
        ]
        rows.append(
            {
                "user_id": user,
                "eligible": True,
                "language": "en",
                "profile": f"{user} is careful, shy in groups, and very loyal to family.",
                "memories": memories,
                "big_five": {
                    t: {"level": "medium", "evidence": ["m1"], "rationale": "r", "thin_evidence": False}
                    for t in TRAITS
                },  # fmt: skip
                "queries": [
                    {
                        "query_id": f"{user}-q{q}",
                        "category": "ES",
                        "query": SITUATIONS[(u + q) % 4][1],
                        "situation": {"topic": "t", "text": SITUATIONS[(u + q) % 4][0], "memory_ids": ["m1"]},
                        "memory_ids": ["m1"],
                    }
                    for q in range(2)
                ],
            }
        )
    path = folder / "splits" / "random" / "train.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return folder / "splits"


def fake_judge(body: dict, number: int):
    """Scores from a hash of the reply (its 'quality') plus per-request noise."""
    from fake_openai import instance_from_schema, schema_for_request

    text = json.dumps(body["messages"])
    reply = re.findall(r"<response-[0-9a-f]{16}>(.*?)</response-", text, re.S)
    quality = int(hashlib.sha256((reply[-1] if reply else "").encode()).hexdigest()[:4], 16) / 0xFFFF
    noise = int(hashlib.sha256((text + str(body.get("temperature"))).encode()).hexdigest()[:4], 16) / 0xFFFF
    # the sample index is not in the body: vary with the request number for k > 1
    noise = (noise + number * 0.37) % 1.0
    score = round(min(5.0, max(1.0, 1 + 4 * quality + (noise - 0.5))), 1)
    schema = schema_for_request(body) or {}
    props = schema.get("properties", {})
    if "content_effectiveness" in props:
        return dict.fromkeys(props, int(8 + 10 * quality))
    if "resonation" in props:
        return {
            d: {"criteria": ["c"], "analysis": "a", "score": score}
            for d in ("resonation", "expression", "reception")
        }
    if "score" in props:
        return (
            {"criteria": ["c"], "analysis": "a", "score": score}
            if "criteria" in props
            else {"analysis": "a", "score": score}
        )
    return instance_from_schema(schema)


def tiny_policy(texts: list[str]):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    special = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        texts, vocab_size=600, min_frequency=1, special_tokens=special, show_progress=False
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<|pad|>", eos_token="<|end|>")
    tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    return tokenizer, LlamaForCausalLM(config)


RESULTS = ROOT / "bench" / "results" / "grpo_bench.json"
DOCS = ROOT / "docs" / "training.md"
BEGIN, END = "<!-- grpo_bench.py --write-docs: begin -->", "<!-- grpo_bench.py --write-docs: end -->"


def docs_table(result: dict) -> str:
    """The table of docs/training.md from the bench's figures (tests/unit/test_docs_figures.py
    checks the page holds exactly this)."""
    lines = [BEGIN, "| mode | k | calls per rollout | tokens per rollout | authors' 3k + 1 |",
             "|---|---|---|---|---|"]  # fmt: skip
    for row in result["modes"]:
        mode = "per dimension" if row["mode"] == "per-dimension" else row["mode"]
        lines.append(f"| {mode} | {row['k']} | {row['calls_per_rollout']:g} | "
                     f"{row['tokens_per_rollout']:,.0f} | {row['authors']} |")  # fmt: skip
    lines.append("")
    versions = result["versions"]
    lines.append(
        f"(`bench/training/grpo_bench.py --write-docs`: {result['rollouts']} rollouts; "
        f"trl {versions['trl']}, "
        f"transformers {versions['transformers']}, torch {versions['torch']}; tokens "
        f"as the fake server counts them.) A re-scored batch sent {result['rescored_requests']} requests."
    )
    lines.append(END)
    return "\n".join(lines)


def write_docs(figures: list[dict], rollouts: int, rescored: int) -> None:
    import torch
    import transformers
    import trl

    result = {
        "rollouts": rollouts,
        "modes": figures,
        "rescored_requests": rescored,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                     "torch": torch.__version__},
    }  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    page = DOCS.read_text(encoding="utf-8")
    start, end = page.index(BEGIN), page.index(END) + len(END)
    DOCS.write_text(page[:start] + docs_table(result) + page[end:], encoding="utf-8")
    print(f"wrote {RESULTS} and the table of {DOCS}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--base-url", help="a real judge endpoint instead of the fake server")
    parser.add_argument("--model", default="fake-judge")
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help="write the figures to bench/results/grpo_bench.json and the table of docs/training.md",
    )
    args = parser.parse_args(argv)
    reason = missing_extra()
    if reason:
        print(f"grpo_bench: skipped: {reason}")
        return 0

    import datasets
    from fake_openai import FakeOpenAI
    from trl import GRPOConfig, GRPOTrainer

    from personaemp.llm.settings import LLMSettings
    from personaemp.training.export import write_export
    from personaemp.training.reward import PereGRM, agreement, summarise

    work = Path(tempfile.mkdtemp(prefix="grpo_bench-"))
    splits = write_split(work)
    exported = work / "train.jsonl"
    write_export(splits, exported, format="trl", part="train", context="memory")
    dataset = datasets.load_dataset("json", data_files=str(exported), split="train")
    texts = [m["content"] for row in dataset for m in row["prompt"]]
    import torch

    torch.manual_seed(0)  # the same random policy, so the same rollouts, on every run
    tokenizer, model = tiny_policy(texts)
    print(
        f"policy: {sum(p.numel() for p in model.parameters()):,} parameters (random), vocab {len(tokenizer)}"
    )

    server = None if args.base_url else FakeOpenAI(responder=fake_judge)
    base_url = args.base_url or server.base_url
    steps_cfg = {"judge_dynamic": {"temperature": 0.7}, "judge_joint": {"temperature": 0.7}}

    def settings(name: str) -> LLMSettings:
        return LLMSettings(base_urls=[base_url], model=args.model, work_dir=work / name, steps=steps_cfg,
                           concurrency=16)  # fmt: skip

    batches: list = []

    class Recording(PereGRM):
        def __call__(self, prompts=None, completions=None, **columns):
            batches.append(self.rollouts_from_columns(completions, columns))
            return super().__call__(prompts=prompts, completions=completions, **columns)

    reward = Recording(settings("train"), log_path=work / "reward.jsonl")
    config = GRPOConfig(
        output_dir=str(work / "out"), max_steps=args.steps, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=24, learning_rate=1e-5, logging_steps=1,
        report_to=[], use_cpu=True, save_strategy="no", bf16=False, seed=0, temperature=1.0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model, reward_funcs=[reward], args=config, train_dataset=dataset, processing_class=tokenizer
    )
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    total = summarise(reward.steps)
    print(
        f"GRPO: {trainer.state.global_step} steps in {seconds:.1f} s, {total['rollouts']} rollouts scored "
        f"({total['judged']} judged, {total['distinct']} distinct), {total['calls']} judge calls, "
        f"{total['requests']} requests, fallbacks {total['fallbacks'] or 0}"
    )

    rollouts = [rollout for batch in batches for rollout in batch]
    modes = [("per-dimension", 1, False), ("per-dimension", 8, False), ("joint", 1, True), ("joint", 8, True)]
    results = {}
    figures = []
    print(f"\nthe same {len(rollouts)} rollouts, each instrument on a cold cache:")
    print(
        f"{'mode':<15}{'k':>3}{'calls/rollout':>15}{'requests/rollout':>18}"
        f"{'tokens/rollout':>16}{'authors 3k+1':>14}"
    )
    for name, k, joint in modes:
        scorer = PereGRM(settings(f"{name}-{k}"), samples=k, joint=joint)
        results[(name, k)] = scorer.score(rollouts)
        line = results[(name, k)].record
        figures.append({"mode": name, "k": k, "calls_per_rollout": line["calls_per_rollout"],
                        "tokens_per_rollout": line["tokens_per_rollout"], "authors": 3 * k + 1})  # fmt: skip
        print(
            f"{name:<15}{k:>3}{line['calls_per_rollout']:>15.2f}"
            f"{line['requests'] / max(1, line['judged']):>18.2f}"
            f"{line['tokens_per_rollout']:>16.1f}{3 * k + 1:>14}"
        )
    for k in (1, 8):
        found = agreement(results[("per-dimension", k)], results[("joint", k)])
        print(
            f"agreement per-dimension vs joint, k={k}, {found['rollouts']} rollouts: Spearman H "
            f"{found['harmonic']['spearman']}, reward {found['reward']['spearman']}; mean |diff| H "
            f"{found['harmonic']['mean_abs_diff']}" + ("  (fake judge: plumbing only)" if server else "")
        )
    again = PereGRM(settings("train")).score(batches[0])
    print(f"\nfirst step's batch scored again on its warm cache: {again.record['requests']} requests")
    print(f"reward log: {work / 'reward.jsonl'}")
    if args.write_docs:
        if args.base_url:
            print("--write-docs: the docs' table is the fake judge's; not written for --base-url")
        else:
            write_docs(figures, len(rollouts), again.record["requests"])
    if server:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
