"""How an option is declared, once, and what follows from the declaration.

One pydantic model per TOML section. A field is an option: its name is the TOML key, its
type, default and constraints are the validation, and its `Opt` metadata holds the help
text, the CLI spelling (default `--field-name`), the environment variable and, for file
paths, where its default comes from inside a config and how it is written (path safety).

A stage's section lives beside the stage: `@declare("filter")` on `FilterOptions` in
personaemp/dataset/options.py, the options of the build's stages (`personaemp/<product>/options.py`;
a Stage line of the registry may name another module, as a stage with light code its own).
Here: the machinery (Opt, Section, declare, the catalogue, introspection, one-line errors,
the docs tables), the shared sections `[paths]` and `[llm]`, and the option types several
stages share. From the declarations follow:

- the Typer options of each stage command (`personaemp.cli`),
- the sections of personaemp.toml and their resolution, flag > env var > file > default
  (`personaemp.config`),
- the option tables of the docs' Options page (`markdown_tables`,
  `python -m personaemp.registry docs/options.md`).

This module and the options modules stay light (pydantic only): `personaemp --help` imports them.
"""

from __future__ import annotations

import importlib
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
    create_model,
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
PERSONA_CHECKS = ("no_internal_ids", "level_matches_rationale")  # personaemp.dataset.persona.PERSONA_CHECKS
STEPS = (
    "persona", "situations", "check",
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
    "persona", "situations", "check",
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
    # allow_inf_nan: an infinite or NaN number (temperature=inf, timeout=nan) is refused here,
    # at option time, not sent to the server after the filter has run.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

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


# --- the catalogue -----------------------------------------------------------------------------
# Every section by its TOML name and every stage command's sections. A section is declared
# where its stage lives (`@declare("filter")` in personaemp/dataset/options.py), the
# shared ones ([paths], [llm]) here; the registry (personaemp/registry.py) imports each
# stage's options module, puts the sections in pipeline order and fills COMMANDS and
# CLI_ONLY from its Stage lines. So a stage is its module(s) plus one registry line.
SECTIONS: dict[str, type[Section]] = {}  # TOML section -> its model, in pipeline order
COMMANDS: dict[str, tuple[str, ...]] = {}  # stage command -> its sections (the first is its own)


def catalogue() -> dict[str, type[Section]]:
    """SECTIONS, whole: the products declare their sections and the registry gathers them, so a
    caller below it (config, the reward in a trainer's worker) has the registry loaded here, by
    name, as a host loads its plugins (an import of it here would point up the layers)."""
    if "personaemp.registry" not in sys.modules:  # (while it loads, it is filling SECTIONS)
        importlib.import_module("personaemp.registry")
    return SECTIONS


def declare(name: str) -> Callable[[type[Section]], type[Section]]:
    """Class decorator: `model` is the TOML section [name] (also importable on its own, as
    personaemp.reward's from_config does with [reward])."""

    def register(model: type[Section]) -> type[Section]:
        if SECTIONS.get(name, model) is not model:
            raise TypeError(f"[{name}] is declared twice: {SECTIONS[name].__name__} and {model.__name__}")
        SECTIONS[name] = model
        return model

    return register


# --- the sections ------------------------------------------------------------------------------


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


SplitName = Literal["random", "ood"]
Part = Literal["train", "test"]


# personaemp.instruments.policy.CONTEXTS: what a policy sees (respond, and export's prompts)
Context = Literal["none", "memory", "memory-summary", "rag", "mismatch", "persona"]
SplitSetting = Annotated[SplitName, Opt("Split setting.")]
RagK = Annotated[int, Field(ge=1), Opt("Memories given with --context rag (the paper: 3).")]
MismatchSeed = Annotated[
    int, Opt("Seed choosing whose memories each user gets with --context mismatch (never their own).")
]


class RunSections(Section):
    """The base of RunOptions (every section as a field, built by `run_options` from SECTIONS):
    the file paths a section leaves unset follow [paths] and the previous stage (see
    `Opt.derive`), also when the model is built in Python."""

    @model_validator(mode="after")
    def _derived_paths(self) -> RunSections:
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


_RUN_OPTIONS: dict[tuple[str, ...], type[RunSections]] = {}


def run_options() -> type[RunSections]:
    """personaemp.toml as one model: every declared section, in pipeline order (the file may
    leave any out). personaemp.registry.RunOptions is this, once every stage is declared."""
    key = tuple(SECTIONS)
    if key not in _RUN_OPTIONS:
        fields: dict[str, Any] = {name: (model, model()) for name, model in SECTIONS.items()}
        _RUN_OPTIONS[key] = create_model("RunOptions", __base__=RunSections, __module__=__name__, **fields)
        _RUN_OPTIONS[key].__doc__ = "personaemp.toml: every section (the file may leave any out)."
    return _RUN_OPTIONS[key]


def derive(rule: str, section: Callable[[str], Any]) -> Any:
    """The value of a derived default (`Opt.derive`), given the sections it refers to."""
    if rule.startswith("processed:"):
        return section("paths").processed / rule.split(":", 1)[1]
    name, field = rule.split(".")
    return getattr(section(name), field)


# What every stage command, `run` and `merge` print: declared once (personaemp.cli.output_options).
OUTPUT_OPTIONS: dict[str, str] = {
    "--quiet": "No summaries or progress on stderr (errors are still shown).",
    "--json": "Print the command's result (files, counts, cost, report) as JSON on stdout.",
}
# Options of the stage commands that are not stage settings: no TOML key. Every command's
# are CLI_COMMON's; the registry adds each Stage's own (`Stage.cli_only`).
CLI_COMMON: dict[str, str] = {
    "--config": "personaemp.toml to read the command's sections from (flags and env vars win).",
    **OUTPUT_OPTIONS,
}
CLI_ONLY: dict[str, dict[str, str]] = {}


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
        "<!-- generated from the options modules: python -m personaemp.registry docs/options.md -->",
        "",
    ]
    for command, sections in COMMANDS.items():
        out.append(f"#### `personaemp {command}` — TOML `[{sections[0]}]`")
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
