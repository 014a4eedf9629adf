"""The sections every stage shares, [paths] and [llm], and the option types several stages
share (declared with personaemp.options' machinery). The stages' own sections are in their
products' options modules (personaemp/dataset/options.py...). Light: `--help` imports it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from personaemp.options import Opt, OptionProblem, Section, declare
from personaemp.records import Category
from personaemp.vocabulary import (
    STEP_KEYS,
    STEP_NAMES,
    Check,
    LayoutName,
    Part,
    PersonaCheck,
    SplitName,
    StepName,
)

PROCESSED = Path("data/processed")
RAW_INPUT = "data/raw/alpsbench_sample/task1"
LLM_PANEL = "LLM endpoint and engine"


def _split_commas(value: Any) -> Any:
    """A list option takes a list, a comma-separated string, or both (repeated flags)."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list | tuple):
        parts: list[Any] = []
        for item in value:
            if isinstance(item, str):
                parts.extend(part.strip() for part in item.split(",") if part.strip())
            else:
                parts.append(item)
        return parts
    return value


def _upper(value: Any) -> Any:
    value = _split_commas(value)
    return [v.upper() if isinstance(v, str) else v for v in value] if isinstance(value, list) else value


Names = Annotated[list[str], BeforeValidator(_split_commas)]


def _files(value: Any) -> Any:
    """A list of files: one path (a derived default, a Python argument) is a list of one."""
    return [value] if isinstance(value, PurePath) else _split_commas(value)


Files = Annotated[list[Path], BeforeValidator(_files)]


def _shard(value: str | None) -> str | None:
    """I/N with 1 <= I <= N: one line for every bad form (`a/b`, `2`, `0/2`), as parse_shard gives."""
    match = re.fullmatch(r"\s*(\d+)/(\d+)\s*", value) if value is not None else None
    if value is not None and (match is None or not 1 <= int(match[1]) <= int(match[2])):
        raise OptionProblem("shard", f"is {value!r}: expected I/N with 1 <= I <= N, e.g. 2/3")
    return value


Shard = Annotated[
    str | None,
    AfterValidator(_shard),
    Opt(
        "Work on part I of N of the users (by a hash of the id; many machines, one part each) "
        "into <output>.shard-I-of-N.jsonl; `personaemp merge` joins the parts.",
        metavar="I/N",
    ),
]
Users = Annotated[
    Names | None,
    Field(min_length=1),
    Opt("Only these user ids (repeat or comma-separate).", metavar="ID"),
]
OnError = Annotated[
    Literal["fail", "skip"],
    Opt("fail: stop at the first bad row, write nothing; skip: skip bad rows and count them."),
]
Categories = Annotated[list[Category], BeforeValidator(_upper)]
Force = Annotated[
    bool,
    Opt(
        "Redo the stage even when its inputs, options and code are those of its last finished "
        "run and its outputs are as that run left them (it is skipped then)."
    ),
]
Checks = Annotated[list[Check], BeforeValidator(_split_commas)]
PersonaChecks = Annotated[list[PersonaCheck], BeforeValidator(_split_commas)]


def _some_checks(value: list[str] | None) -> list[str] | None:
    """An `enforce` option names at least one check, or is left out (all of them)."""
    if value is not None and not value:
        raise OptionProblem(
            "enforce", "is empty", "name the checks to enforce, or leave it out for all of them"
        )
    return value


@declare("paths")
class PathsOptions(Section):
    """[paths]: a config's input and the folder its stages write to (TOML only)."""

    input: Annotated[str, Opt("Default input of `filter` (its --input).")] = RAW_INPUT
    processed: Annotated[Path, Opt("Folder of every stage's default output, the cache and the dataset.")] = (
        PROCESSED
    )


class StepSampling(Section):
    """[llm.steps.<step>]: sampling of one LLM step over the step's and the run's defaults."""

    temperature: Annotated[float | None, Field(ge=0)] = None
    max_tokens: Annotated[int | None, Field(ge=1)] = None


@declare("llm")
class LLMOptions(Section):
    """[llm]: the options every LLM command shares. The API key is not one of
    them: it comes from OPENAI_API_KEY only (a flag would land in shell history)."""

    base_url: Annotated[
        Names,
        Opt(
            "OpenAI-compatible endpoint; repeat or comma-separate for several (requests go to the "
            "least busy one).",
            env="OPENAI_BASE_URL",
            metavar="URL",
        ),
    ] = []
    model: Annotated[
        str | None, Opt("Model name (required for a remote endpoint).", env="PERSONAEMP_MODEL")
    ] = None
    llm: Annotated[
        Literal["auto", "local", "remote", "vllm"],
        Opt(
            "auto: the embedded local model unless an endpoint is set; local; remote; vllm: --model "
            "in vLLM engines on the Ray cluster's GPUs (ray.data.llm, with --executor ray), no endpoint."
        ),
    ] = "auto"
    structured: Annotated[
        Literal["auto", "json_schema", "json_object_schema", "json_object", "none"],
        Opt(
            "Structured output. auto: json_schema, stepping down to json_object, then none, if the "
            "endpoint refuses it (remembered per endpoint); json_object_schema on the local server."
        ),
    ] = "auto"
    concurrency: Annotated[
        int,
        Field(ge=1),
        Opt("Requests in flight per endpoint (the local server takes 1).", env="PERSONAEMP_CONCURRENCY"),
    ] = 16
    rpm: Annotated[float | None, Field(gt=0), Opt("Requests per minute per endpoint.")] = None
    timeout: Annotated[float, Field(gt=0), Opt("Seconds per request.")] = 120.0
    max_tokens: Annotated[int, Field(ge=1), Opt("max_tokens sent with every request.")] = 1024
    temperature: Annotated[float, Field(ge=0), Opt("Sampling temperature.")] = 0.7
    seed: Annotated[int | None, Opt("Sampling seed sent with every request.")] = None
    steps: Annotated[
        dict[StepName, StepSampling],
        Opt(
            "Sampling of one step over the run's: STEP.KEY=VALUE, repeatable; STEP: "
            f"{', '.join(STEP_NAMES)}; KEY: {', '.join(STEP_KEYS)} (TOML: [llm.steps.STEP]).",
            ("--step",),
            metavar="STEP.KEY=VALUE",
        ),
    ] = {}
    max_retries: Annotated[
        int,
        Field(ge=0),
        Opt("Network/HTTP retries per request (429, 408, 409, 5xx, timeouts), with backoff."),
    ] = 6
    max_reasks: Annotated[int, Field(ge=0), Opt("Re-asks after an invalid, empty or cut-off reply.")] = 2
    work_dir: Annotated[
        Path,
        Opt(
            "Cache and run report folder.",
            env="PERSONAEMP_WORK_DIR",
            derive="processed:.personaemp",
            io="folder",
        ),
    ] = PROCESSED / ".personaemp"
    no_cache: Annotated[bool, Opt("Neither read nor write the cache.", ("--no-cache/--cache",))] = False
    refresh: Annotated[bool, Opt("Ignore cached replies and overwrite them.")] = False
    retry_failed: Annotated[bool, Opt("Ask again for content failures (invalid, cut, ungrounded...).")] = (
        False
    )
    price_in: Annotated[float | None, Field(ge=0), Opt("Price per million prompt tokens.")] = None
    price_out: Annotated[float | None, Field(ge=0), Opt("Price per million completion tokens.")] = None
    price_cached: Annotated[
        float | None,
        Field(ge=0),
        Opt(
            "Price per million prompt tokens the provider's prefix cache serves (reported as "
            "cached or cache-hit tokens); unset: priced at --price-in."
        ),
    ] = None
    cache_rule: Annotated[
        Literal["auto", "deepseek", "openai", "none"],
        Opt(
            "How the provider's prefix cache bills a prompt, for --estimate: deepseek (64-token "
            "blocks, the schema stated in the prompt), openai (from 1,024 tokens in 128-token "
            "steps, the schema its prefix), none (nothing cached); auto: openai for api.openai.com, "
            "none for a local server, else deepseek."
        ),
    ] = "auto"
    batch: Annotated[
        Path | None,
        Opt(
            "Work from batch files in this folder instead of an endpoint: import the answer files "
            "found there, go as far as they allow, write the requests still needed as the next "
            "round's input (OpenAI Batch / vllm run-batch format).",
            metavar="DIR",
        ),
    ] = None
    estimate: Annotated[
        bool,
        Opt(
            "Print the requests, tokens and cost this command would send now (from the cache and "
            "the rendered prompts), and send and write nothing."
        ),
    ] = False
    max_cost: Annotated[
        float | None,
        Field(gt=0),
        Opt(
            "Stop (resumable) before this run's spend, counted from the endpoint's usage at "
            "--price-in/--price-out (cached prompt tokens at --price-cached), could exceed this "
            "many dollars (each stage of `run` its own).",
            metavar="USD",
        ),
    ] = None
    executor: Annotated[
        Literal["local", "ray"],
        Opt(
            "local: this process sends every request; ray: the units run on a pool of Ray workers, "
            "each with its share of --concurrency, and this process writes the files (needs the "
            "[ray] extra; --estimate and --batch run locally).",
            env="PERSONAEMP_EXECUTOR",
        ),
    ] = "local"
    workers: Annotated[
        int, Field(ge=1), Opt("Ray workers (--executor ray): one engine each, at most --concurrency.")
    ] = 2
    ray_address: Annotated[
        str | None,
        Opt(
            "The Ray cluster to run on (--executor ray), e.g. ray://head:10001; unset: a local Ray "
            "is started (inside `ray job submit`, the job's cluster).",
            env="RAY_ADDRESS",
            metavar="ADDRESS",
        ),
    ] = None

    vllm: Annotated[
        dict[Literal["engine", "processor"], dict[str, Any]],
        Opt(
            "--llm vllm: engine.KEY=VALUE goes to vLLM's engine (e.g. engine.max_model_len=8192, "
            "engine.tensor_parallel_size=2), processor.KEY=VALUE to ray.data.llm's processor "
            "(e.g. processor.batch_size=64, processor.accelerator_type=H100); repeatable "
            "(TOML: [llm.vllm.engine], [llm.vllm.processor]).",
            ("--vllm",),
            metavar="PART.KEY=VALUE",
        ),
    ] = {}

    @model_validator(mode="after")
    def _a_batch_needs_the_cache(self) -> LLMOptions:
        if self.batch is not None and (self.no_cache or self.refresh):
            raise OptionProblem("batch", "works through the cache", "leave out {no_cache} and {refresh}")
        if self.batch is not None and not self.model:
            raise OptionProblem("batch", "needs {model}: every request in a batch file names it")
        if self.batch is not None and self.estimate:
            raise OptionProblem("batch", "and {estimate} exclude each other", "give one of them")
        return self

    @model_validator(mode="after")
    def _a_budget_needs_prices(self) -> LLMOptions:
        if self.max_cost is not None and self.price_in is None and self.price_out is None:
            raise OptionProblem("max_cost", "needs a price to count with", "give {price_in} and {price_out}")
        return self

    @model_validator(mode="after")
    def _vllm_runs_on_ray(self) -> LLMOptions:
        if self.llm != "vllm":
            return self
        if self.executor != "ray":
            raise OptionProblem("llm", "is 'vllm', which runs on Ray", "add {executor} ray")
        if not self.model:
            raise OptionProblem("llm", "is 'vllm' but no {model} is set", "give a Hugging Face id or a path")
        if self.base_url:
            raise OptionProblem("llm", "is 'vllm' (no endpoint) but {base_url} is set", "give one of them")
        if self.no_cache or self.refresh:
            raise OptionProblem(
                "llm",
                "is 'vllm', which works in rounds through the cache",
                "leave out {no_cache} and {refresh}",
            )
        return self

    @model_validator(mode="after")
    def _endpoints_speak_http(self) -> LLMOptions:
        for url in self.base_url:
            scheme = url.partition("://")[0].lower() if "://" in url else ""
            if scheme not in ("http", "https"):
                from personaemp.secrets import redact_url

                raise OptionProblem(
                    "base_url",
                    f"takes an http:// or https:// endpoint, not {redact_url(url)!r}",
                    "e.g. http://127.0.0.1:8000/v1 or https://api.openai.com/v1",
                )
        return self

    @model_validator(mode="after")
    def _ray_needs_an_endpoint(self) -> LLMOptions:
        if self.executor == "ray" and self.llm != "vllm" and (self.llm == "local" or not self.base_url):
            raise OptionProblem(
                "executor", "is 'ray' but no endpoint is set (the embedded model is one process)",
                "give {base_url}: the workers share its endpoints",
            )  # fmt: skip
        return self

    @model_validator(mode="after")
    def _local_has_no_endpoint(self) -> LLMOptions:
        if self.llm == "local" and self.base_url:
            raise OptionProblem(
                "llm", "is 'local' (the embedded model) but {base_url} is set", "give one of them"
            )
        return self

    @model_validator(mode="after")
    def _remote_needs_an_endpoint(self) -> LLMOptions:
        if self.llm == "remote" and not self.base_url:
            raise OptionProblem(
                "llm", "is 'remote' but no endpoint is set", "give {base_url} or set OPENAI_BASE_URL"
            )
        return self

    def step_sampling(self) -> dict[str, dict[str, float | int]]:
        """`steps` as the engine takes it: only what was set."""
        return {
            name: chosen
            for name, step in self.steps.items()
            if (chosen := step.model_dump(exclude_none=True))
        }


# Options several sections share, declared once.
SplitsFolder = Annotated[
    Path, Opt("Folder written by `personaemp split`.", ("--splits",), derive="split.out_dir", io="read")
]


# Where a request about one PERM dimension holds its standard (vocabulary.LAYOUTS).
Layout = Annotated[
    LayoutName,
    Opt(
        "paper: as the authors' prompts, each request holds only its dimension's standard, before "
        "the context and the reply; shared: the three standards in a task every request shares "
        "(a provider's prefix cache serves it), the dimension named last. Named in every report."
    ),
]
DEFAULT_LAYOUT = "paper"  # the authors' (criteria, evaluate and the reward alike)


@dataclass(frozen=True)
class JudgeDefaults:
    """The judge instrument's defaults (personaemp.instruments.judges.JudgeOptions), which
    [evaluate] declares its options with (personaemp/evaluation/options.py)."""

    dynamic: bool = False
    samples: int = 1
    bystander: bool = False
    reward_lambda: float = 0.5
    missing: str = "skip"
    unreadable: str = "authors"
    layout: str = DEFAULT_LAYOUT


JUDGE_DEFAULTS = JudgeDefaults()


SplitSetting = Annotated[SplitName, Opt("Split setting.")]


class OfASplit(Section):
    """The options of a command that reads one part of one split setting (respond, evaluate,
    export): these three come first in its section."""

    splits: SplitsFolder = PROCESSED / "splits"
    split: SplitSetting = "random"
    part: Annotated[Part, Opt("Part of the split.")] = "test"


RagK = Annotated[int, Field(ge=1), Opt("Memories given with --context rag (the paper: 3).")]
MismatchSeed = Annotated[
    int, Opt("Seed choosing whose memories each user gets with --context mismatch (never their own).")
]
