"""Every option of every stage, declared once.

One pydantic model per TOML section: `[extract]` (extract-memories), `[filter]`, `[persona]`
(infer-persona), `[queries]` (gen-queries), `[split]`, `[stats]`, `[push]`, `[criteria]`,
`[respond]`, `[evaluate]`, `[table]`, `[review]`, `[agreement]`, `[export]`, `[reward]` (the
training reward), `[llm]` (the options every LLM command shares) and `[paths]` (where a
config's files live). A field is an option: its name is the TOML key, its type, default and
constraints are the validation, and its `Opt` metadata holds the help text, the CLI spelling
(default `--field-name`), the environment variable and, for file paths, where its default
comes from inside a config. From these models follow:

- the Typer options of each stage command (`personaemp.cli`),
- the sections of personaemp.toml and their resolution, flag > env var > file > default
  (`personaemp.config`),
- the option tables of the docs' Options page (`markdown_tables`,
  `python -m personaemp.options docs/options.md`).

This module stays light (pydantic only): `personaemp --help` imports it.
"""

from __future__ import annotations

import re
import sys
import types
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from personaemp.errors import InputError
from personaemp.records import Category

PROCESSED = Path("data/processed")
RAW_INPUT = "data/raw/alpsbench_sample/task1"
LLM_PANEL = "LLM endpoint and engine"

# Names the stages define; options.py repeats them so `--help` does not import the stages
# (tests/test_options.py checks they agree).
FORMATS = ("auto", "task1", "raw", "hf")  # personaemp.sources.FORMATS
LOG_FORMATS = ("auto", "wildchat", "messages", "sharegpt", "table", "task1")  # personaemp.sources.logs
CHECKS = (
    "emotional_support", "logical_consistency", "role_awareness", "memory_ids_valid",
    "category_match", "length_ok", "language_match", "not_duplicate", "not_copied",
    "no_scaffolding", "no_internal_ids",
)  # fmt: skip  # personaemp.instruments.query_check.CHECKS
PERSONA_CHECKS = ("no_internal_ids", "level_matches_rationale")  # personaemp.build.persona.PERSONA_CHECKS
STEPS = (
    "persona", "big_five", "situations", "query", "check",
    "criteria", "respond", "summary", "judge", "judge_dynamic", "bystander", "judge_joint",
    "extract_memories", "hidden_need", "simulate", "in_character",
)  # fmt: skip  # the stages' Step names (judge_joint: personaemp.training.reward)
STEP_KEYS = ("temperature", "max_tokens")

Format = Literal["auto", "task1", "raw", "hf"]
LogFormat = Literal["auto", "wildchat", "messages", "sharegpt", "table", "task1"]
Check = Literal[
    "emotional_support", "logical_consistency", "role_awareness", "memory_ids_valid",
    "category_match", "length_ok", "language_match", "not_duplicate", "not_copied",
    "no_scaffolding", "no_internal_ids",
]  # fmt: skip
PersonaCheck = Literal["no_internal_ids", "level_matches_rationale"]
StepName = Literal[
    "persona", "big_five", "situations", "query", "check",
    "criteria", "respond", "summary", "judge", "judge_dynamic", "bystander", "judge_joint",
    "extract_memories", "hidden_need", "simulate", "in_character",
]  # fmt: skip


@dataclass(frozen=True)
class Opt:
    """How an option shows outside Python: help, CLI flags, env var, derived default."""

    help: str
    flags: tuple[str, ...] = ()  # default: --field-name (a bool: --field-name/--no-field-name)
    env: str | None = None
    metavar: str | None = None
    # Inside a config, the default comes from elsewhere: "paths.input", "filter.output"
    # (the previous stage's output) or "processed:NAME" (NAME under [paths] processed).
    derive: str | None = None
    # What the command does with a path option (personaemp.paths checks them before it
    # writes): "read", "write" (a file; `beside`: files written next to it, {stem}/{name}
    # of it), "update" (a file read and added to: labels, a second judge's verdicts) or
    # "folder" (written; `beside`: the entries written inside, else all of it).
    io: Literal["read", "write", "update", "folder"] | None = None
    beside: tuple[str, ...] = ()
    # The option's earlier name (TOML key; its flag --old-name): still read, with a one-line
    # notice on stderr, for one release.
    renamed_from: str | None = None


class OptionProblem(ValueError):
    """A validation failure naming the option it is about; `{field}` placeholders in the
    message become the names the user wrote (a flag, an env var or a TOML key)."""

    def __init__(self, field: str, message: str, hint: str | None = None):
        super().__init__(message)
        self.field, self.message, self.hint = field, message, hint


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


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def with_derived(self, names) -> Section:
        """Note which options hold the value of their `Opt.derive` rule, not the user's: push
        tells a leftover file at the default place from one it was asked to publish. Kept
        beside the fields (copies keep it), not among them: equal options stay equal."""
        self._derived = frozenset(names)
        return self

    def derived(self, name: str) -> bool:
        """Whether `name` holds its derived default (no flag, env var, TOML key or argument gave it)."""
        return name in getattr(self, "_derived", ())

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            renames = renamed(cls)
            for old in data.keys() & renames.keys():  # an earlier name: read, for one release
                if renames[old] in data:
                    raise OptionProblem(old, f"is the old name of {renames[old]}", "give only the new one")
                warnings.warn(f"{old} is now {renames[old]}", FutureWarning, stacklevel=2)
                data = {renames.get(key, key): value for key, value in data.items()}
            for key in data:
                if key not in cls.model_fields:
                    raise OptionProblem(str(key), "is not a known key", f"use {', '.join(cls.model_fields)}")
        return data


def notice_renamed(old: str, new: str, where: str = "") -> None:
    """The one line an earlier option name gets (stderr): it works, for one release."""
    sys.stderr.write(f"warning: {where}{old} is deprecated, use {new} (the old name goes next release)\n")


def renamed(model: type[BaseModel]) -> dict[str, str]:
    """{earlier name: name} of a section's renamed options (Opt.renamed_from)."""
    return {
        opt.renamed_from: name
        for name, info in model.model_fields.items()
        for opt in info.metadata
        if isinstance(opt, Opt) and opt.renamed_from
    }


# --- the sections ------------------------------------------------------------------------------


class PathsOptions(Section):
    """[paths]: a config's input and the folder its stages write to (TOML only)."""

    input: Annotated[str, Opt("Default input of `filter` (its --input).")] = RAW_INPUT
    processed: Annotated[Path, Opt("Folder of every stage's default output, the cache and the dataset.")] = (
        PROCESSED
    )


class FilterOptions(Section):
    input: Annotated[
        str,
        Opt(
            "AlpsBench task1 folder, benchmark_data/ root, raw export file or folder, or hf:OWNER/NAME.",
            ("--input", "-i"),
            env="PERSONAEMP_INPUT",
            derive="paths.input",
            io="read",
        ),
    ] = RAW_INPUT
    format: Annotated[Format, Opt("Input format (auto: detected).")] = "auto"
    rules: Annotated[
        Path | None,
        Opt(
            "Rules TOML; each key it sets overrides the shipped default (see --show-rules).",
            metavar="FILE",
            io="read",
        ),
    ] = None
    output: Annotated[
        Path,
        Opt(
            "Kept users, one per line; filter_report.json goes beside it.",
            ("--output", "-o"),
            derive="processed:filtered.jsonl",
            io="write",
            beside=("filter_report.json",),
        ),
    ] = PROCESSED / "filtered.jsonl"
    benchmark_split: Annotated[
        str | None,
        Opt(
            "Split of a benchmark_data/ root (dev, validation, examples) or of a Hub dataset (train).",
            renamed_from="split",
        ),
    ] = None
    hf_config: Annotated[str | None, Opt("Config name of a Hub dataset.")] = None
    on_error: Annotated[
        Literal["fail", "skip"],
        Opt("fail: stop at the first bad row, write nothing; skip: skip bad rows and count them."),
    ] = "fail"
    turns: Annotated[
        Literal["user", "all"],
        Opt("user: keep the user's own turns (what later stages read); all: keep assistant turns too."),
    ] = "user"
    force: Force = False


class ExtractOptions(Section):
    """[extract]: extract-memories, the stage before `filter` when the input is a conversation log."""

    input: Annotated[
        str,
        Opt(
            "Conversation log: WildChat parquet/JSONL, OpenAI-messages JSONL, ShareGPT JSON/JSONL, a "
            "CSV/parquet table of turns, or an AlpsBench task1 folder (its dialogues only).",
            ("--input", "-i"),
            derive="paths.input",
            io="read",
        ),
    ] = RAW_INPUT
    format: Annotated[LogFormat, Opt("Log format (auto: detected from the file and its first record).")] = (
        "auto"
    )
    output: Annotated[
        Path,
        Opt(
            "Users with their extracted memories, in the AlpsBench raw-export shape `filter` reads; "
            "conversations.jsonl (the users as read) goes beside it.",
            ("--output", "-o"),
            derive="processed:memories.jsonl",
            io="write",
            beside=(
                "conversations.jsonl",
                "extract-memories.failures.jsonl",
                "gold_comparison.json",
                "alpsbench_predictions.jsonl",
            ),
        ),
    ] = PROCESSED / "memories.jsonl"
    user_field: Annotated[
        str | None,
        Opt(
            "Field holding the user id (messages, ShareGPT: default user_id or user; WildChat: "
            "hashed_ip). Without one, each conversation is its own user.",
            metavar="NAME",
        ),
    ] = None
    user_column: Annotated[str, Opt("Table: the column of user ids.", metavar="NAME")] = "user_id"
    session_column: Annotated[
        str | None, Opt("Table: the column of conversation ids (none: one session per user).", metavar="NAME")
    ] = "session_id"
    order_column: Annotated[
        str, Opt("Table: the column of turn numbers within a session.", metavar="NAME")
    ] = "turn"
    role_column: Annotated[str, Opt("Table: the column of roles (user, assistant).", metavar="NAME")] = "role"
    text_column: Annotated[str, Opt("Table: the column of turn texts.", metavar="NAME")] = "text"
    time_column: Annotated[str | None, Opt("Table: a column of timestamps (optional).", metavar="NAME")] = (
        None
    )
    time_format: Annotated[
        str | None,
        Opt(
            "strptime format of text timestamps (e.g. %m/%d/%Y %H:%M); without it, ISO 8601 or seconds "
            "(milliseconds from 1e11 up) since 1970. A time without a zone is UTC.",
            metavar="FORMAT",
        ),
    ] = None
    max_sessions: Annotated[int, Field(ge=1), Opt("Latest sessions kept per user.")] = 50
    max_turns: Annotated[
        int, Field(ge=1), Opt("Latest turns kept per user, all roles (AlpsBench's longest: 249).")
    ] = 249
    max_turn_chars: Annotated[
        int,
        Field(ge=200),
        Opt("Characters kept of a longer turn (its head and tail); code blocks cut first."),
    ] = 2000
    max_user_chars: Annotated[
        int, Field(ge=1000), Opt("Characters of the user's own messages per prompt (the latest kept).")
    ] = 24000
    on_error: Annotated[
        Literal["fail", "skip"],
        Opt("fail: stop at the first bad row, write nothing; skip: skip bad rows and count them."),
    ] = "fail"
    compare_gold: Annotated[
        Path | None,
        Opt(
            "AlpsBench reference_output.jsonl: write precision, recall and F1 of the extracted memories "
            "against it (gold_comparison.json beside the output).",
            metavar="FILE",
            io="read",
        ),
    ] = None
    match_threshold: Annotated[
        float, Field(gt=0, le=1), Opt("--compare-gold: the value overlap (token F1) a match needs.")
    ] = 0.3
    alpsbench_predictions: Annotated[
        bool,
        Opt(
            "Also write alpsbench_predictions.jsonl beside the output: the memories as AlpsBench's task1 "
            "scorer reads them (memory_items per session; with --compare-gold, the gold beside them)."
        ),
    ] = False
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N users.")] = None
    users: Annotated[
        Names | None,
        Field(min_length=1),
        Opt("Only these user ids (repeat or comma-separate).", metavar="ID"),
    ] = None
    shard: Shard = None


class StepSampling(Section):
    """[llm.steps.<step>]: sampling of one LLM step over the step's and the run's defaults."""

    temperature: Annotated[float | None, Field(ge=0)] = None
    max_tokens: Annotated[int | None, Field(ge=1)] = None


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
            f"{', '.join(STEPS)}; KEY: {', '.join(STEP_KEYS)} (TOML: [llm.steps.STEP]).",
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


class PersonaOptions(Section):
    input: Annotated[
        Path, Opt("Filtered users (filter's output).", ("--input", "-i"), derive="filter.output", io="read")
    ] = PROCESSED / "filtered.jsonl"
    output: Annotated[
        Path,
        Opt(
            "Personas, one per user.",
            ("--output", "-o"),
            derive="processed:personas.jsonl",
            io="write",
            beside=("infer-persona.failures.jsonl",),
        ),
    ] = PROCESSED / "personas.jsonl"
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N users.")] = None
    users: Annotated[
        Names | None,
        Field(min_length=1),
        Opt("Only these user ids (repeat or comma-separate).", metavar="ID"),
    ] = None
    require_depth: Annotated[
        bool, Opt("Drop users the depth check turns away (--no-require-depth keeps grounded ones).")
    ] = True
    enforce: Annotated[
        PersonaChecks | None,
        Opt(
            "Checks a trait statement or Big Five rationale must pass, else the reply is asked "
            f"again (default: every check; all are recorded): {', '.join(PERSONA_CHECKS)}.",
            metavar="CHECKS",
        ),
    ] = None
    shard: Shard = None
    force: Force = False

    _enforce_names_a_check = field_validator("enforce")(_some_checks)


class QueriesOptions(Section):
    input: Annotated[
        Path, Opt("Personas (infer-persona's output).", ("--input", "-i"), derive="persona.output", io="read")
    ] = PROCESSED / "personas.jsonl"
    output: Annotated[
        Path,
        Opt(
            "Accepted queries per user; rejected.jsonl goes beside it.",
            ("--output", "-o"),
            derive="processed:queries.jsonl",
            io="write",
            beside=("rejected.jsonl", "gen-queries.failures.jsonl"),
        ),
    ] = PROCESSED / "queries.jsonl"
    per_category: Annotated[int, Field(ge=1), Opt("Situations (so queries) per category per user.")] = 1
    categories: Annotated[
        Categories, Field(min_length=1), Opt("Query categories: a subset of ES, HEQ, SS.", metavar="CATS")
    ] = ["ES", "HEQ", "SS"]
    enforce: Annotated[
        Checks | None,
        Opt(
            f"Checks a query must pass (default: every check; all are recorded): {', '.join(CHECKS)}.",
            metavar="CHECKS",
        ),
    ] = None
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N eligible users.")] = None
    users: Annotated[
        Names | None,
        Field(min_length=1),
        Opt("Only these user ids (repeat or comma-separate).", metavar="ID"),
    ] = None
    shard: Shard = None
    force: Force = False

    _enforce_names_a_check = field_validator("enforce")(_some_checks)


class SplitOptions(Section):
    input: Annotated[
        Path, Opt("Queries (gen-queries' output).", ("--input", "-i"), derive="queries.output", io="read")
    ] = PROCESSED / "queries.jsonl"
    out_dir: Annotated[
        Path,
        Opt(
            "Folder of the splits and split_report.json.",
            ("--out-dir", "-o"),
            derive="processed:splits",
            io="folder",
            beside=("random", "ood", "split_report.json"),
        ),
    ] = PROCESSED / "splits"
    ood: Annotated[
        bool, Opt("Also the OOD split: one Big Five cluster held out (the paper publishes both).")
    ] = True
    seed: Annotated[int, Opt("Seed of the shuffle and of KModes.")] = 13
    test_size: Annotated[float, Field(gt=0, lt=1), Opt("Share of users in test (OOD: the target size).")] = (
        0.1
    )
    k: Annotated[
        int | None, Field(ge=2), Opt("Clusters; default: the elbow over k_min..k_max.", ("--k",))
    ] = None
    k_min: Annotated[int, Field(ge=2), Opt("Smallest k of the elbow sweep.")] = 2
    k_max: Annotated[int, Field(ge=2), Opt("Largest k of the elbow sweep.")] = 8
    holdout: Annotated[
        int | None, Field(ge=0), Opt("Cluster id to hold out; default: the size closest to test_size.")
    ] = None
    seeds: Annotated[int, Field(ge=1), Opt("KModes runs per k (the lowest cost is kept).")] = 5
    force: Force = False

    @model_validator(mode="after")
    def _k_range(self) -> SplitOptions:
        if self.k_min > self.k_max:
            raise OptionProblem("k_min", "must be at most {k_max}")
        return self


class StatsOptions(Section):
    processed: Annotated[
        Path,
        Opt(
            "Folder the stages wrote to (its manifest.json names their files): the build to describe.",
            ("--processed",),
            derive="paths.processed",
        ),
    ] = PROCESSED
    out_dir: Annotated[
        Path,
        Opt(
            "Folder of stats.json and the plots (figures/*.png).",
            derive="processed:stats",
            io="folder",
            beside=("stats.json", "figures"),
            renamed_from="out",
        ),
    ] = PROCESSED / "stats"
    force: Force = False


# Options several sections share, declared once.
SplitsFolder = Annotated[
    Path, Opt("Folder written by `personaemp split`.", ("--splits",), derive="split.out_dir", io="read")
]


class PushOptions(Section):
    splits: SplitsFolder = PROCESSED / "splits"
    repo_id: Annotated[
        str | None, Opt("Hub dataset repo OWNER/NAME; without one, a dry run.", metavar="OWNER/NAME")
    ] = None
    dry_run: Annotated[bool, Opt("Write the repository to --out-dir instead of pushing it.")] = False
    out_dir: Annotated[
        Path, Opt("Folder of a dry run.", derive="processed:dataset", io="folder", renamed_from="out")
    ] = PROCESSED / "dataset"
    private: Annotated[bool, Opt("Create the repo private.")] = False
    revision: Annotated[str | None, Opt("Branch to push to.")] = None
    include_dialogue: Annotated[bool, Opt("Also publish the users' own messages.")] = False
    criteria: Annotated[
        Path,
        Opt(
            "Criteria file (`personaemp criteria`); published as a `criteria` column when it exists.",
            ("--criteria",),
            derive="processed:criteria.jsonl",
            io="read",
        ),
    ] = PROCESSED / "criteria.jsonl"
    dialogues: Annotated[
        Path,
        Opt(
            "Dialogues (`personaemp gen-dialogues`); published as a `dialogues` config when the file exists.",
            derive="processed:dialogues.jsonl",
            io="read",
        ),
    ] = PROCESSED / "dialogues.jsonl"
    force: Force = False

    @field_validator("repo_id")
    @classmethod
    def _owner_name(cls, value: str | None) -> str | None:
        if value is not None and value.count("/") != 1:
            raise OptionProblem("repo_id", f"must look like OWNER/NAME, not {value!r}")
        return value

    @model_validator(mode="after")
    def _one_target(self) -> PushOptions:
        if self.dry_run and self.repo_id:
            raise OptionProblem("dry_run", "and {repo_id} exclude each other", "give one of them")
        return self

    @property
    def is_dry_run(self) -> bool:
        """Without a repo id there is nothing to push to: a dry run into `out_dir`."""
        return self.dry_run or not self.repo_id


# personaemp.prompts.LAYOUTS: where a request about one PERM dimension holds its standard
Layout = Annotated[
    Literal["paper", "shared"],
    Opt(
        "paper: as the authors' prompts, each request holds only its dimension's standard, before "
        "the context and the reply; shared: the three standards in a task every request shares "
        "(a provider's prefix cache serves it), the dimension named last. Named in every report."
    ),
]
DEFAULT_LAYOUT = "paper"  # the authors' (criteria, evaluate and the reward alike)


class CriteriaOptions(Section):
    input: Annotated[
        Path,
        Opt(
            "Queries (gen-queries' output, or a split file).",
            ("--input", "-i"),
            derive="queries.output",
            io="read",
        ),
    ] = PROCESSED / "queries.jsonl"
    output: Annotated[
        Path,
        Opt(
            "Criteria per query and dimension.",
            ("--output", "-o"),
            derive="processed:criteria.jsonl",
            io="write",
            beside=("criteria.failures.jsonl",),
        ),
    ] = PROCESSED / "criteria.jsonl"
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N queries.")] = None
    users: Annotated[
        Names | None,
        Field(min_length=1),
        Opt("Only the queries of these user ids (repeat or comma-separate).", metavar="ID"),
    ] = None
    layout: Layout = DEFAULT_LAYOUT


SplitName = Literal["random", "ood"]
Part = Literal["train", "test"]


# personaemp.instruments.policy.CONTEXTS: what a policy sees (respond, and export's prompts)
Context = Literal["none", "memory", "memory-summary", "rag", "mismatch", "persona"]
SplitSetting = Annotated[SplitName, Opt("Split setting.")]
RagK = Annotated[int, Field(ge=1), Opt("Memories given with --context rag (the paper: 3).")]
MismatchSeed = Annotated[
    int, Opt("Seed choosing whose memories each user gets with --context mismatch (never their own).")
]


class RespondOptions(Section):
    splits: SplitsFolder = PROCESSED / "splits"
    split: SplitSetting = "random"
    part: Annotated[Part, Opt("Part of the split.")] = "test"
    context: Annotated[
        Context,
        Opt(
            "What the policy sees besides the query: nothing (w/o memory), the numbered memories "
            "(the paper's input), a summary of the user it first writes from them (the Memory "
            "baseline), the rag_k memories most similar to the query (RAG), another user's "
            "memories (mismatched memory), or the persona (the judge reads it too)."
        ),
    ] = "memory"
    rag_k: RagK = 3
    mismatch_seed: MismatchSeed = 0
    output: Annotated[
        Path | None,
        Opt(
            "Responses, one per query (default: responses-<split>-<part>-<context>.jsonl beside the "
            "splits folder; name one per model).",
            ("--output", "-o"),
            io="write",
            beside=("{stem}.failures.jsonl",),
        ),
    ] = None
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N queries.")] = None

    @property
    def output_path(self) -> Path:
        return self.output or self.splits.parent / f"responses-{self.split}-{self.part}-{self.context}.jsonl"


class DialoguesOptions(Section):
    input: Annotated[
        Path,
        Opt(
            "Accepted queries: gen-queries' output or a split file (one dialogue per query).",
            ("--input", "-i"),
            derive="queries.output",
            io="read",
        ),
    ] = PROCESSED / "queries.jsonl"
    output: Annotated[
        Path,
        Opt(
            "Dialogues, one per query.",
            ("--output", "-o"),
            derive="processed:dialogues.jsonl",
            io="write",
            beside=("gen-dialogues.failures.jsonl",),
        ),
    ] = PROCESSED / "dialogues.jsonl"
    limit: Annotated[int | None, Field(ge=1), Opt("Only the first N dialogues.")] = None
    per_user: Annotated[int | None, Field(ge=1), Opt("Only the first N queries of each user.")] = None
    max_turns: Annotated[
        int, Field(ge=1, le=20), Opt("Supporter turns at most; the user may end sooner.")
    ] = 6
    context: Annotated[
        Context,
        Opt("What the supporter sees besides the conversation, as for `respond --context`."),
    ] = "memory"
    rag_k: RagK = 3
    mismatch_seed: MismatchSeed = 0
    supporter_model: Annotated[
        str | None,
        Opt(
            "The model under test (default: --model; the simulator is always the LLM options' model).",
            env="PERSONAEMP_SUPPORTER_MODEL",
        ),
    ] = None
    supporter_base_url: Annotated[
        Names,
        Opt("The supporter's endpoint (default: the LLM options' endpoint; same key).",
            env="PERSONAEMP_SUPPORTER_BASE_URL", metavar="URL"),
    ] = []  # fmt: skip
    turn_attempts: Annotated[
        int,
        Field(ge=1, le=10),
        Opt("Replies asked per simulated turn that breaks a rule before the dialogue fails."),
    ] = 3
    character_check: Annotated[
        bool, Opt("Check each simulated turn with the LLM: in character, no invented facts.")
    ] = True


class ExportOptions(Section):
    splits: SplitsFolder = PROCESSED / "splits"
    split: SplitSetting = "random"
    part: Annotated[Part, Opt("Part of the split (train to train on, test to evaluate).")] = "train"
    format: Annotated[
        Literal["trl", "verl"],
        Opt(
            "trl: JSON lines with a conversational `prompt` and the reward's columns (datasets, "
            "GRPOTrainer); verl: parquet with data_source, prompt, ability, reward_model, extra_info."
        ),
    ] = "trl"
    context: Annotated[
        Context,
        Opt("What the policy sees besides the query, as `personaemp respond --context` (the same prompt)."),
    ] = "memory"
    rag_k: RagK = 3
    mismatch_seed: MismatchSeed = 0
    summaries: Annotated[
        Path | None,
        Opt(
            "With --context memory-summary: the responses of `respond --context memory-summary`, "
            "whose summaries the prompts carry.",
            metavar="FILE",
            io="read",
        ),
    ] = None
    criteria: Annotated[
        Path | None,
        Opt("Fixed criteria (`personaemp criteria`) to carry in each row, for a fixed-criteria reward.",
            ("--criteria",), metavar="FILE", io="read"),
    ] = None  # fmt: skip
    data_source: Annotated[str, Opt("verl's data_source of every row.")] = "personaemp"
    dialogues: Annotated[
        bool,
        Opt(
            "Rows for multi-turn rollouts with the simulated user: interaction_kwargs (verl: in "
            "extra_info) name personaemp's Interaction and carry the user it plays."
        ),
    ] = False
    output: Annotated[
        Path | None,
        Opt(
            "The file written (default: export/<split>-<part>-<context>.jsonl, or .parquet with "
            "--format verl, beside the splits folder).",
            ("--output", "-o"),
            io="write",
        ),
    ] = None

    @property
    def output_path(self) -> Path:
        suffix = "parquet" if self.format == "verl" else "jsonl"
        name = f"{self.split}-{self.part}-{self.context}.{suffix}"
        return self.output or self.splits.parent / "export" / name


class JudgeSpec(Section):
    """One judge of a panel ([[evaluate.judges]], or --judge "name=a;model=m;base_url=URL;key_env=VAR")."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][\w.-]*$"), Opt("Name in reports and file names.")]
    model: Annotated[str | None, Opt("Judge model (default: --judge-model, else --model).")] = None
    base_url: Annotated[str | None, Opt("Its endpoint (default: --base-url).")] = None
    key_env: Annotated[
        str | None, Opt("Environment variable holding its API key (default: OPENAI_API_KEY).")
    ] = None


def _judge_specs(value: Any) -> Any:
    """TOML tables pass through; a flag's "key=value;key=value" becomes one."""
    if isinstance(value, str | dict):
        value = [value]
    if not isinstance(value, list | tuple):
        return value
    found = []
    for item in value:
        if isinstance(item, str):
            table: dict[str, str] = {}
            for part in filter(None, (p.strip() for p in item.split(";"))):
                key, sep, text = part.partition("=")
                if not sep:
                    raise OptionProblem(
                        "judges", f"takes name=NAME;model=MODEL;base_url=URL;key_env=VAR, not {item!r}"
                    )
                table[key.strip()] = text.strip()
            item = table
        found.append(item)
    return found


class EvaluateOptions(Section):
    splits: SplitsFolder = PROCESSED / "splits"
    split: SplitSetting = "random"
    part: Annotated[Part, Opt("Part of the split.")] = "test"
    responses: Annotated[
        Names,
        Opt(
            "Responses file of a system (query_id, response per line); repeat for several, each "
            "named by its file name.",
            metavar="FILE",
            io="read",
        ),
    ] = []
    dialogues: Annotated[
        Names,
        Opt(
            "Dialogues of a system (`personaemp gen-dialogues`), scored per session instead of "
            "responses: the emotion trajectory and PERM over the supporter's side; repeat for "
            "several, each named by its file name.",
            metavar="FILE",
            io="read",
        ),
    ] = []
    per_turn: Annotated[bool, Opt("With --dialogues: PERM for each supporter turn too.")] = False
    all_dialogues: Annotated[
        bool,
        Opt(
            "With --dialogues: score each system on all of its own dialogues, not only the "
            "queries every system has one for (the table says: not comparable)."
        ),
    ] = False
    criteria: Annotated[
        Path,
        Opt(
            "Fixed criteria (`personaemp criteria`).",
            derive="criteria.output",
            io="read",
            renamed_from="criteria_file",
        ),
    ] = PROCESSED / "criteria.jsonl"
    judge_model: Annotated[str | None, Opt("Judge model (default: --model).")] = None
    judges: Annotated[
        list[JudgeSpec],
        BeforeValidator(_judge_specs),
        Opt(
            "A judge of a panel, repeatable: every system is judged by each, side by side, with how "
            'far they agree. "name=NAME;model=MODEL;base_url=URL;key_env=VAR" (only name required; '
            "TOML: [[evaluate.judges]] tables).",
            ("--judge",),
            metavar="SPEC",
        ),
    ] = []
    missing: Annotated[
        Literal["skip", "floor"],
        Opt(
            "A query without a response: skip (the authors' rule: what their eval.py judges is judged "
            "- any non-empty text, the part after </think> - and the means are over those) or floor "
            "(no visible reply - none, blank, cut while reasoning - scores 1 and counts in the means)."
        ),
    ] = "skip"
    unreadable: Annotated[
        Literal["authors", "fail"],
        Opt(
            "A judgment that cannot be read after the re-asks. authors: a fixed judgment drops that "
            "dimension of that query from its mean, a dynamic one counts 3 of 5 (their reward); fail: "
            "the query fails (kept in the failures file, --retry-failed asks again), an unreadable "
            "sample of k is left out of its mean."
        ),
    ] = "authors"
    layout: Layout = DEFAULT_LAYOUT
    dynamic: Annotated[bool, Opt("PereGRM: the judge writes its own criteria in each call.")] = False
    samples: Annotated[int, Field(ge=1), Opt("Judgments averaged per dimension with --dynamic (@k).")] = 1
    bystander: Annotated[bool, Opt("Also the persona-blind bystander score B and the reward.")] = False
    reward_lambda: Annotated[
        float, Field(ge=0), Opt("lambda of reward = H + lambda * (B - 1).", ("--lambda",))
    ] = 0.5
    output: Annotated[
        Path,
        Opt(
            "Report (JSON); the scores go beside it (<name>.scores.jsonl).",
            ("--output", "-o"),
            derive="processed:evaluation/report.json",
            io="write",
            # a panel's judges each write <stem>.<judge>.json and its scores and failures
            beside=(
                "{stem}.scores.jsonl",
                "{stem}.failures.jsonl",
                "{stem}.*.json",
                "{stem}.*.scores.jsonl",
                "{stem}.*.failures.jsonl",
            ),  # fmt: skip
            renamed_from="report",
        ),
    ] = PROCESSED / "evaluation" / "report.json"

    @model_validator(mode="after")
    def _samples_need_dynamic(self) -> EvaluateOptions:
        if self.samples > 1 and not self.dynamic:
            raise OptionProblem("samples", "applies to {dynamic} judging", "add {dynamic}")
        return self

    @model_validator(mode="after")
    def _judges_named_once(self) -> EvaluateOptions:
        names = [judge.name for judge in self.judges]
        for name in names:
            if names.count(name) > 1:
                raise OptionProblem("judges", f"names {name!r} twice", "give each judge its own name")
        return self


class TableOptions(Section):
    reports: Annotated[
        Names,
        Opt(
            "Report of `personaemp evaluate` (one per split: random, ood), repeatable; each judge "
            "of a report is a column group.",
            ("--report", "-r"),
            metavar="FILE",
            io="read",
        ),
    ] = []
    format: Annotated[Literal["markdown", "csv", "latex"], Opt("Output format.")] = "markdown"
    output: Annotated[
        Path | None, Opt("Write the table here (default: print it).", ("--output", "-o"), io="write")
    ] = None
    harmonic: Annotated[bool, Opt("Add H (0-1) beside Avg in each group.")] = False
    digits: Annotated[int, Field(ge=0, le=6), Opt("Decimals shown.")] = 2
    judge: Annotated[
        str | None,
        Opt("Only this judge of a panel report (e.g. the paper's Table 2 from a Table 1 run).", ("--judge",)),
    ] = None
    systems: Annotated[
        Names | None,
        Field(min_length=1),
        Opt("Only these systems, in this order (repeat or comma-separate).", metavar="NAME"),
    ] = None


class ReviewOptions(Section):
    input: Annotated[
        Path,
        Opt("Queries to review (gen-queries' output: accepted and rejected).", ("--input", "-i"),
            derive="queries.output", io="read"),
    ] = PROCESSED / "queries.jsonl"  # fmt: skip
    labels: Annotated[
        Path | None,
        Opt(
            "Labels file: every click is appended to it at once (JSON lines; several reviewers share "
            "it). Default: labels.jsonl beside --input, where `agreement` and the card look.",
            ("--labels",),
            io="update",
        ),
    ] = None
    size: Annotated[
        int,
        Field(ge=1),
        Opt("Queries in the sample, taken in turn from each category/language/outcome stratum."),
    ] = 60
    seed: Annotated[
        int, Opt("Seed of the sample (the same seed gives the same queries in the same order).")
    ] = 0
    host: Annotated[
        str,
        Opt(
            "Address to serve the page on. Every API call needs the session's token (in the address "
            "printed at start); beyond loopback (0.0.0.0), whoever reaches it with that address can "
            "read the sample and label, over plain HTTP."
        ),
    ] = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535), Opt("Port of the page (0: any free port).")] = 8765
    dialogues: Annotated[
        Names,
        Opt(
            "Review dialogues (`personaemp gen-dialogues`) instead of queries; repeat for several "
            "supporters, each named by its file name: a query's dialogues are shown side by side. "
            "Labels default to dialogue_labels.jsonl beside the first file.",
            metavar="FILE",
            io="read",
        ),
    ] = []


class AgreementOptions(Section):
    input: Annotated[
        Path,
        Opt(
            "Queries the labels are about (gen-queries' output).",
            ("--input", "-i"),
            derive="queries.output",
            io="read",
        ),
    ] = PROCESSED / "queries.jsonl"
    labels: Annotated[
        Path | None,
        Opt("Labels of `personaemp review` (or imported from Label Studio). Default: labels.jsonl "
            "beside --input.", ("--labels",), io="read"),
    ] = None  # fmt: skip
    second_judge: Annotated[
        Path | None,
        Opt(
            "The second judge's verdicts, kept apart from the build's files (written with "
            "--judge-model, read when present). Default: second_judge.jsonl beside --input.",
            ("--second-judge",),
            io="update",
        ),
    ] = None
    judge_model: Annotated[
        str | None,
        Opt(
            "Re-run the check step on the same queries with this model as a second judge first "
            "(the other LLM options as given; its endpoint: --judge-base-url).",
            env="PERSONAEMP_SECOND_JUDGE_MODEL",
        ),
    ] = None
    judge_base_url: Annotated[
        Names,
        Opt("Endpoint of the second judge (default: the LLM options' endpoint).",
            env="PERSONAEMP_SECOND_JUDGE_BASE_URL", metavar="URL"),
    ] = []  # fmt: skip
    out: Annotated[
        Path | None,
        Opt(
            "Folder of agreement.json and agreement.png. Default: agreement/ beside --input.",
            ("--out-dir", "-o"),
            io="folder",
            beside=("agreement.json", "agreement.png"),
        ),
    ] = None
    resamples: Annotated[int, Field(ge=100), Opt("Bootstrap resamples of each interval.")] = 2000
    bootstrap_seed: Annotated[int, Opt("Seed of the bootstrap.")] = 0
    dialogues: Annotated[
        Names,
        Opt(
            "Dialogues people labelled (`personaemp review --dialogues`), as given there: people vs "
            "the in_character check, final emotion vs people's rating, the supporters' ranking. "
            "Labels default to dialogue_labels.jsonl beside the first file.",
            metavar="FILE",
            io="read",
        ),
    ] = []

    def paths(self) -> tuple[Path, Path, Path]:
        """(labels, second judge, out), the defaults beside the input."""
        return (
            self.labels or self.input.with_name("labels.jsonl"),
            self.second_judge or self.input.with_name("second_judge.jsonl"),
            self.out or self.input.with_name("agreement"),
        )

    @model_validator(mode="after")
    def _an_endpoint_needs_a_model(self) -> AgreementOptions:
        if self.judge_base_url and not self.judge_model:
            raise OptionProblem("judge_base_url", "needs {judge_model}: which model is the second judge")
        return self


class RewardConfig(Section):
    """[reward]: the training reward as `personaemp.reward.from_config` builds it (verl's
    `compute_score` reads the file named by $PERSONAEMP_CONFIG); the judge is [llm]."""

    dynamic: Annotated[
        bool,
        Opt("PereGRM (the judge writes its criteria); false: fixed criteria from `criteria`.",
            env="PERSONAEMP_REWARD_DYNAMIC"),
    ] = True  # fmt: skip
    samples: Annotated[
        int,
        Field(ge=1),
        Opt("k: judgments averaged per dimension (dynamic).", env="PERSONAEMP_REWARD_SAMPLES"),
    ] = 1
    bystander: Annotated[
        bool, Opt("Subtract the bystander penalty: H + lambda * (B - 1).", env="PERSONAEMP_REWARD_BYSTANDER")
    ] = True
    reward_lambda: Annotated[float, Field(ge=0), Opt("lambda (the paper trains with 0.5).")] = 0.5
    joint: Annotated[
        bool,
        Opt("The three dimensions in one judge call (k + 1 calls per rollout instead of 3k + 1).",
            env="PERSONAEMP_REWARD_JOINT"),
    ] = False  # fmt: skip
    fallback: Annotated[
        Literal["lowest", "neutral", "floor"],
        Opt("A judgment that cannot be had: lowest (the rollout gets at most the step's lowest judged "
            "reward: a judge failure never pays), floor (1, B = 0) or neutral (3 of 5, B = 0.8, the "
            "authors' values, above most judged B); counted and logged either way.",
            env="PERSONAEMP_REWARD_FALLBACK"),
    ] = "lowest"  # fmt: skip
    criteria: Annotated[
        Path | None, Opt("Fixed criteria (`personaemp criteria`) when dynamic is false.", io="read")
    ] = None
    layout: Layout = DEFAULT_LAYOUT
    judge_model: Annotated[str | None, Opt("Judge model (default: [llm] model).")] = None
    log: Annotated[
        Path | None,
        Opt("JSON lines, one per training step: calls, tokens, seconds, failures, fallbacks.",
            env="PERSONAEMP_REWARD_LOG", io="write"),
    ] = None  # fmt: skip

    @model_validator(mode="after")
    def _dynamic_only(self) -> RewardConfig:
        if not self.dynamic and (self.samples > 1 or self.joint):
            raise OptionProblem("dynamic", "is false: samples and joint apply to the dynamic judge")
        return self


class RunOptions(Section):
    """personaemp.toml: every section (the file may leave any out).

    The file paths a section leaves unset follow [paths] and the previous stage (see
    `Opt.derive`), also when the model is built in Python."""

    paths: PathsOptions = PathsOptions()
    extract: ExtractOptions = ExtractOptions()
    filter: FilterOptions = FilterOptions()
    llm: LLMOptions = LLMOptions()
    persona: PersonaOptions = PersonaOptions()
    queries: QueriesOptions = QueriesOptions()
    dialogues: DialoguesOptions = DialoguesOptions()
    split: SplitOptions = SplitOptions()
    stats: StatsOptions = StatsOptions()
    push: PushOptions = PushOptions()
    criteria: CriteriaOptions = CriteriaOptions()
    respond: RespondOptions = RespondOptions()
    export: ExportOptions = ExportOptions()
    evaluate: EvaluateOptions = EvaluateOptions()
    table: TableOptions = TableOptions()
    review: ReviewOptions = ReviewOptions()
    agreement: AgreementOptions = AgreementOptions()
    reward: RewardConfig = RewardConfig()

    @model_validator(mode="after")
    def _derived_paths(self) -> RunOptions:
        for name in type(self).model_fields:  # in order: a stage derives from earlier ones
            current = getattr(self, name)
            update = {
                option.name: derive(option.opt.derive, lambda section: getattr(self, section))
                for option in specs(name)
                if option.opt.derive and option.name not in current.model_fields_set
            }
            if update:
                fields = type(current).model_fields
                derived = {field for field in fields if current.derived(field)} | update.keys()
                setattr(self, name, current.model_copy(update=update).with_derived(derived))
        return self


def derive(rule: str, section: Callable[[str], Any]) -> Any:
    """The value of a derived default (`Opt.derive`), given the sections it refers to."""
    if rule.startswith("processed:"):
        return section("paths").processed / rule.split(":", 1)[1]
    name, field = rule.split(".")
    return getattr(section(name), field)


# TOML section -> its model, in pipeline order.
SECTIONS: dict[str, type[Section]] = {
    name: info.annotation for name, info in RunOptions.model_fields.items() if info.annotation
}

# Stage commands and the sections their options come from (the first is the stage's own).
COMMANDS: dict[str, tuple[str, ...]] = {
    "extract-memories": ("extract", "llm"),
    "filter": ("filter",),
    "infer-persona": ("persona", "llm"),
    "gen-queries": ("queries", "llm"),
    "gen-dialogues": ("dialogues", "llm"),
    "split": ("split",),
    "stats": ("stats",),
    "push": ("push",),
    "criteria": ("criteria", "llm"),
    "respond": ("respond", "llm"),
    "export": ("export",),
    "evaluate": ("evaluate", "llm"),
    "table": ("table",),
    "review": ("review",),
    "agreement": ("agreement", "llm"),
}
# What every stage command, `run` and `merge` print: declared once (personaemp.cli.output_options).
OUTPUT_OPTIONS: dict[str, str] = {
    "--quiet": "No summaries or progress on stderr (errors are still shown).",
    "--json": "Print the command's result (files, counts, cost, report) as JSON on stdout.",
}
# Options of the stage commands that are not stage settings: no TOML key.
CLI_ONLY: dict[str, dict[str, str]] = {
    command: {
        "--config": "personaemp.toml to read the command's sections from (flags and env vars win).",
        **OUTPUT_OPTIONS,
    }
    for command in COMMANDS
}
CLI_ONLY["filter"]["--show-rules"] = "Print the default rules file and exit."
CLI_ONLY["infer-persona"]["--show"] = "Print this user's persona next to its evidence and exit."
CLI_ONLY["review"]["--export-label-studio"] = (
    "Write the sample as a Label Studio project (tasks.json, label_config.xml) to this folder and exit."
)
CLI_ONLY["review"]["--import-label-studio"] = (
    "Bring the labels file to a Label Studio export's state (JSON or JSON-MIN; edits and deletions "
    "included) and exit."
)


# --- introspection -----------------------------------------------------------------------------


def _plain(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without `| None` and Annotated, whether None is allowed)."""
    optional = False
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(annotation) if a is not type(None)]
            optional = optional or len(args) < len(get_args(annotation))
            annotation = args[0] if len(args) == 1 else annotation
            if len(args) != 1:
                return annotation, optional
        else:
            return annotation, optional


@dataclass(frozen=True)
class OptionSpec:
    """One option as the CLI, the TOML file, the environment and the docs see it."""

    section: str
    name: str  # the field name = the TOML key = the Python parameter name
    info: FieldInfo
    opt: Opt

    @property
    def base(self) -> Any:
        return _plain(self.info.annotation)[0]

    @property
    def kind(self) -> str:
        """bool, list (repeatable, comma-separated), dict (repeatable KEY=VALUE) or value."""
        base = self.base
        if base is bool:
            return "bool"
        origin = get_origin(base)
        return "list" if origin is list else "dict" if origin is dict else "value"

    @property
    def flags(self) -> tuple[str, ...]:
        if self.opt.flags:
            return self.opt.flags
        dashed = self.name.replace("_", "-")
        return (f"--{dashed}/--no-{dashed}",) if self.kind == "bool" else (f"--{dashed}",)

    @property
    def old_flag(self) -> str | None:
        """The flag of the option's earlier name, still accepted (hidden from --help)."""
        old = self.opt.renamed_from
        return f"--{old.replace('_', '-')}" if old else None

    @property
    def flag(self) -> str:
        """The main spelling, e.g. --ood (not --no-ood)."""
        return self.flags[0].split("/")[0]

    @property
    def choices(self) -> tuple[str, ...] | None:
        base = self.base
        if get_origin(base) is list:
            base = _plain(get_args(base)[0])[0]
        return get_args(base) if get_origin(base) is Literal else None

    @property
    def metavar(self) -> str:
        if self.opt.metavar:
            return self.opt.metavar
        if self.choices and self.kind == "value":
            return "|".join(self.choices)
        base = self.base
        return {int: "INTEGER", float: "NUMBER", Path: "PATH"}.get(base, "TEXT")

    @property
    def default(self) -> Any:
        return self.info.get_default(call_default_factory=True)

    @property
    def help(self) -> str:
        return self.opt.help


def specs(section: str) -> list[OptionSpec]:
    model = SECTIONS[section]
    found = []
    for name, info in model.model_fields.items():
        opt = next((m for m in info.metadata if isinstance(m, Opt)), None)
        if opt is None:
            raise TypeError(f"{model.__name__}.{name} has no Opt(...) metadata")
        found.append(OptionSpec(section, name, info, opt))
    return found


def spec(section: str, name: str) -> OptionSpec:
    for option in specs(section):
        if option.name == name:
            return option
    raise KeyError(f"[{section}] has no option {name!r}")


def show_default(value: Any) -> str:
    """A default as the docs and --help show it (TOML-like)."""
    if value is None or value == [] or value == {}:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def parse_assignments(
    items: list[str], flag: str, shape: str = "STEP.KEY=VALUE (e.g. check.temperature=0)"
) -> dict[str, dict[str, str]]:
    """`--step check.temperature=0` (repeatable) -> {"check": {"temperature": "0"}}."""
    found: dict[str, dict[str, str]] = {}
    for item in items:
        match = re.fullmatch(r"\s*([\w-]+)\.([\w-]+)\s*=\s*(.*?)\s*", item)
        if not match or not match.group(3):
            raise InputError(f"{flag} takes {shape}, not {item!r}")
        step, key, value = match.groups()
        found.setdefault(step, {})[key] = value
    return found


# --- one-line validation errors ----------------------------------------------------------------

_MESSAGES = {
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be greater than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
    "int_parsing": "must be a whole number, not {input!r}",
    "int_type": "must be a whole number, not {input!r}",
    "int_from_float": "must be a whole number, not {input!r}",
    "float_parsing": "must be a number, not {input!r}",
    "float_type": "must be a number, not {input!r}",
    "bool_parsing": "must be true or false, not {input!r}",
    "bool_type": "must be true or false, not {input!r}",
    "literal_error": "must be {expected}, not {input!r}",
    "too_short": "must not be empty",
    "string_type": "must be a string, not {input!r}",
    "list_type": "must be a list, not {input!r}",
    "dict_type": "must be a table, not {input!r}",
    "model_type": "must be a table, not {input!r}",
    "path_type": "must be a path, not {input!r}",
}


def describe(exc: ValidationError, name: Callable[[str, bool], str]) -> str:
    """One line for a model's first validation error. `name(field, lead)` says how the
    user wrote a field: a flag, an env var or a TOML key (`lead`: with the file's path)."""
    error = exc.errors(include_url=False)[0]
    loc = [str(part) for part in error["loc"] if not isinstance(part, int) and part != "[key]"]
    problem = (error.get("ctx") or {}).get("error")
    if isinstance(problem, OptionProblem):
        if not loc or loc[-1] != problem.field:  # raised by a model validator: about one field
            loc.append(problem.field)
        others = {field: name(field, False) for field in _placeholders(problem.message, problem.hint)}
        text = problem.message.format(**others)
        hint = problem.hint.format(**others) if problem.hint else None
    else:
        template = _MESSAGES.get(error["type"])
        ctx = {**(error.get("ctx") or {}), "input": error.get("input")}
        try:
            text = template.format(**ctx) if template else None
        except (KeyError, IndexError):
            text = None
        if text is None:
            text = error["msg"][:1].lower() + error["msg"][1:]
        if error["type"] == "extra_forbidden":
            text = "is not a known key"
        hint = None
    where = name(loc[0], True) if loc else name("", True)
    if len(loc) > 1:
        # a TOML key goes on with dots (llm.steps.check); a flag with a space (--step check.x)
        where += ("." if where.split(": ")[-1].replace(".", "").isidentifier() else " ") + ".".join(loc[1:])
    return f"{where} {text}" + (f" — {hint}" if hint else "")


def _placeholders(*texts: str | None) -> set[str]:
    return {m for text in texts if text for m in re.findall(r"{(\w+)}", text)}


# --- Options page tables ---------------------------------------------------------------------

BEGIN, END = "<!-- options:begin -->", "<!-- options:end -->"
_TITLES = {
    "extract-memories": "`personaemp extract-memories` — TOML `[extract]`",
    "filter": "`personaemp filter` — TOML `[filter]`",
    "infer-persona": "`personaemp infer-persona` — TOML `[persona]`",
    "gen-queries": "`personaemp gen-queries` — TOML `[queries]`",
    "gen-dialogues": "`personaemp gen-dialogues` — TOML `[dialogues]`",
    "split": "`personaemp split` — TOML `[split]`",
    "stats": "`personaemp stats` — TOML `[stats]`",
    "push": "`personaemp push` — TOML `[push]`",
    "criteria": "`personaemp criteria` — TOML `[criteria]`",
    "respond": "`personaemp respond` — TOML `[respond]`",
    "export": "`personaemp export` — TOML `[export]`",
    "evaluate": "`personaemp evaluate` — TOML `[evaluate]`",
    "table": "`personaemp table` — TOML `[table]`",
    "review": "`personaemp review` — TOML `[review]`",
    "agreement": "`personaemp agreement` — TOML `[agreement]`",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _flag_cell(option: OptionSpec) -> str:
    shown = " ".join(f"`{flag}`" for part in option.flags for flag in part.split("/"))
    return shown + (" (repeatable)" if option.kind in ("list", "dict") else "")


def _formerly(option: OptionSpec) -> str:
    old = option.opt.renamed_from
    return f" Formerly `{option.old_flag}` / `{old}` (still read, with a notice)." if old else ""


def _table(options: list[OptionSpec]) -> list[str]:
    lines = ["| option | TOML key | env var | default | meaning |", "|---|---|---|---|---|"]
    for option in options:
        default = show_default(option.default)
        derived = option.opt.derive
        if derived:
            source = (
                f"`<processed>/{derived.split(':', 1)[1]}`"
                if derived.startswith("processed:")
                else f"`[{derived.split('.')[0]}] {derived.split('.')[1]}`"
            )
            default = f"`{default}`; in a config: {source}"
        elif default:
            default = f"`{default}`"
        else:
            default = "—"
        lines.append(
            "| "
            + " | ".join(
                [
                    _flag_cell(option),
                    f"`{option.name}`",
                    f"`{option.opt.env}`" if option.opt.env else "",
                    _cell(default),
                    _cell(option.help + _formerly(option)),
                ]
            )
            + " |"
        )
    return lines


def markdown_tables() -> str:
    """The option tables, from the models (between BEGIN and END in docs/options.md)."""
    out: list[str] = [
        "<!-- generated from personaemp/options.py: python -m personaemp.options docs/options.md -->",
        "",
    ]
    for command, sections in COMMANDS.items():
        out.append(f"#### {_TITLES[command]}")
        out.append("")
        out.extend(_table(specs(sections[0])))
        out.append("")
        if "llm" in sections:
            out.append("And the LLM options below (TOML `[llm]`).")
        only = "; ".join(
            f"`{flag}`: {text[0].lower() + text[1:].rstrip('.')}" for flag, text in CLI_ONLY[command].items()
        )
        out.append(f"Command-only (no TOML key): {only}.")
        out.append("")
    out.append("#### LLM options of every LLM command — TOML `[llm]`")
    out.append("")
    out.extend(_table(specs("llm")))
    out.append("")
    out.append("#### The training reward (`personaemp.reward.from_config`) — TOML `[reward]`")
    out.append("")
    out.append("| TOML key | env var | default | meaning |")
    out.append("|---|---|---|---|")
    for option in specs("reward"):
        default = show_default(option.default)
        out.append(
            f"| `{option.name}` | {f'`{option.opt.env}`' if option.opt.env else ''} | "
            f"{f'`{default}`' if default else '—'} | {_cell(option.help)} |"
        )
    out.append("")
    out.append("#### `personaemp run` — TOML `[paths]`")
    out.append("")
    out.append("| TOML key | default | meaning |")
    out.append("|---|---|---|")
    for option in specs("paths"):
        out.append(f"| `{option.name}` | `{show_default(option.default)}` | {_cell(option.help)} |")
    return "\n".join(out) + "\n"


def update_readme(path: Path) -> bool:
    """Rewrite the block between the markers of the options page (docs/options.md, which
    the README links to; the name is older than the page); True if the file changed."""
    text = path.read_text(encoding="utf-8")
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    new = text[:start] + "\n" + markdown_tables() + text[end:]
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def readme_block(text: str) -> str:
    """What the options page (docs/options.md) holds between the markers."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].removeprefix("\n")


def env_values(section: str, env: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """{field: (env var, value)} for the section's options whose env var is set (non-empty)."""
    return {
        option.name: (option.opt.env, env[option.opt.env])
        for option in specs(section)
        if option.opt.env and env.get(option.opt.env, "").strip()
    }


if __name__ == "__main__":  # python -m personaemp.options docs/options.md
    if len(sys.argv) > 1:
        changed = update_readme(Path(sys.argv[1]))
        print(f"{sys.argv[1]}: {'updated' if changed else 'up to date'}")
    else:
        print(markdown_tables(), end="")
