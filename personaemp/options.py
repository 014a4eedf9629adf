"""How an option is declared, once, and what follows from the declaration.

One pydantic model per TOML section. A field is an option: its name is the TOML key, its
type, default and constraints are the validation, and its `Opt` metadata holds the help
text, the CLI spelling (default `--field-name`), the environment variable and, for file
paths, where its default comes from inside a config and how it is written (path safety).

A stage's section lives beside the stage: `@declare("filter")` on `FilterOptions` in
personaemp/dataset/options.py, the options of the build's stages (`personaemp/<product>/options.py`;
a catalogue line may name another module, as a stage with light code its own). The shared
sections ([paths], [llm]) and the option types several stages share are in
personaemp/shared_options.py; the docs' Options page tables in personaemp/options_page.py.
Here: the machinery (Opt, Section, declare, `sections()`, introspection, one-line errors).
From the declarations follow:

- the options of each stage command (`personaemp.cli`),
- the sections of personaemp.toml and their resolution, flag > env var > file > default
  (`personaemp.config`),
- the option tables of the docs' Options page (`personaemp.options_page`,
  `python -m personaemp.registry docs/options.md`).

This module and the options modules stay light (pydantic only): `personaemp --help` imports them.
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
import types
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, create_model, model_validator
from pydantic.fields import FieldInfo

from personaemp.errors import InputError


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

    @classmethod
    def input(cls, help: str, derive: str | None = None, **more: Any) -> Opt:
        """The file a command reads its records from: --input/-i, every command's alike."""
        return cls(help, ("--input", "-i"), derive=derive, io="read", **more)

    @classmethod
    def output(cls, help: str, derive: str | None = None, **more: Any) -> Opt:
        """The file a command writes: --output/-o, every command's alike."""
        return cls(help, ("--output", "-o"), derive=derive, io="write", **more)


class OptionProblem(ValueError):
    """A validation failure naming the option it is about; `{field}` placeholders in the
    message become the names the user wrote (a flag, an env var or a TOML key)."""

    def __init__(self, field: str, message: str, hint: str | None = None):
        super().__init__(message)
        self.field, self.message, self.hint = field, message, hint


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


# --- the sections, by name ---------------------------------------------------------------------
# A section is declared where its stage lives (`@declare("filter")` in
# personaemp/dataset/options.py), the shared ones ([paths], [llm]) here. personaemp.catalogue
# names the module of each; `sections()` loads them, in pipeline order, on first use.


def declare(name: str) -> Callable[[type[Section]], type[Section]]:
    """Class decorator: `model` is the TOML section [name]. It only marks the class; the
    catalogue's module list (personaemp.catalogue.SECTION_MODULES) is how it is found."""

    def mark(model: type[Section]) -> type[Section]:
        model.__section__ = name
        return model

    return mark


def declared(module: types.ModuleType) -> dict[str, type[Section]]:
    """{section: model} of the `@declare`d sections a module defines."""
    found: dict[str, type[Section]] = {}
    for value in vars(module).values():
        name = getattr(value, "__section__", None) if isinstance(value, type) else None
        if name is None or value.__module__ != module.__name__:
            continue
        if found.get(name, value) is not value:
            raise TypeError(f"[{name}] is declared twice: {found[name].__name__} and {value.__name__}")
        found[name] = value
    return found


@functools.cache
def sections() -> dict[str, type[Section]]:
    """Every TOML section -> its model, in pipeline order, from the modules the catalogue names
    (imported now: a plugin host's loading, driven by data, so no module here names a product)."""
    from personaemp.catalogue import SECTION_MODULES

    found: dict[str, type[Section]] = {}
    for name, module in SECTION_MODULES.items():
        models = declared(importlib.import_module(f"personaemp.{module}"))
        if name not in models:
            raise TypeError(f"[{name}]: no @declare({name!r}) in personaemp.{module}")
        found[name] = models[name]
    return found


class RunSections(Section):
    """The base of RunOptions (every section as a field, built by `run_options` from SECTIONS):
    the file paths a section leaves unset follow [paths] and the previous stage (see
    `Opt.derive`), also when the model is built in Python."""

    @model_validator(mode="after")
    def _derived_paths(self) -> RunSections:
        for name in type(self).model_fields:  # in order: a stage derives from earlier ones
            current = getattr(self, name)
            update = {
                option.name: derive(
                    option.opt.derive, lambda section: getattr(self, section), option.kind == "list"
                )
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
    key = tuple(sections())
    if key not in _RUN_OPTIONS:
        fields: dict[str, Any] = {name: (model, model()) for name, model in sections().items()}
        _RUN_OPTIONS[key] = create_model("RunOptions", __base__=RunSections, __module__=__name__, **fields)
        _RUN_OPTIONS[key].__doc__ = "personaemp.toml: every section (the file may leave any out)."
    return _RUN_OPTIONS[key]


def derive(rule: str, section: Callable[[str], Any], many: bool = False) -> Any:
    """The value of a derived default (`Opt.derive`), given the sections it refers to (`many`:
    for a list option, a list of it)."""
    if rule.startswith("processed:"):
        value = section("paths").processed / rule.split(":", 1)[1]
    else:
        name, field = rule.split(".")
        value = getattr(section(name), field)
    return [value] if many and not isinstance(value, list) else value


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
    model = sections()[section]
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
        earlier = found.setdefault(step, {}).get(key)
        if earlier is not None and earlier != value:  # not the last one silently
            twice = f"{flag} {step}.{key} is given twice ({earlier!r}, then {value!r})"
            raise InputError(twice, "give it once")
        found[step][key] = value
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


def env_values(section: str, env: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """{field: (env var, value)} for the section's options whose env var is set (non-empty)."""
    return {
        option.name: (option.opt.env, env[option.opt.env])
        for option in specs(section)
        if option.opt.env and env.get(option.opt.env, "").strip()
    }
