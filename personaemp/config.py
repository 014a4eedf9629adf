"""Settings resolution for every command: flag > env var > personaemp.toml > default.

The options themselves are declared in personaemp.options; this module reads the TOML
file (refusing secrets and unknown sections), layers the sources, fills the file paths a
config derives (a stage reads the previous stage's output, outputs live under
`[paths] processed`) and turns any bad value into one InputError line that names the
flag, env var or TOML key it came from. The API key is never an option: it is read from
OPENAI_API_KEY only.
"""

from __future__ import annotations

import json
import os
import tomllib
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from personaemp.errors import InputError
from personaemp.options import (
    RunSections,
    Section,
    derive,
    describe,
    env_values,
    notice_renamed,
    parse_assignments,
    renamed,
    run_options,
    sections,
    spec,
    specs,
)
from personaemp.secrets import secret_name, shown_assignment
from personaemp.shared_options import LLMOptions


def read_config(path: Path) -> dict[str, Any]:
    """The TOML file's tables, checked for secrets and unknown sections (keys are checked
    when a section is resolved, against its model)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a BOM (Windows editors) is not TOML
    except FileNotFoundError:
        raise InputError(
            f"{path}: no such config file", "copy personaemp.toml from the repository and edit it"
        ) from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, not a config file") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not valid UTF-8 (byte {exc.start})", "save the file as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML ({exc})") from None
    secrets = _secret_keys(data)
    if secrets:
        raise InputError(
            f"{path}: secrets do not belong in a file ({', '.join(secrets)})",
            "set OPENAI_API_KEY / HF_TOKEN in the environment instead",
        )
    for name, value in data.items():
        if name not in sections():
            raise InputError(f"{path}: [{name}] is not a known section", _section_hint(value))
        if not isinstance(value, dict):
            raise InputError(f"{path}: {name} must be a table ([{name}]), not {value!r}")
    return data


def _secret_keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    found = []
    for name, value in data.items():
        lowered = name.lower()
        if secret_name(lowered):
            found.append(prefix + name)
        if isinstance(value, dict):
            found.extend(_secret_keys(value, f"{prefix}{name}."))
    return found


class Resolver:
    """Resolves sections on demand, so a command meets only the options it uses.

    `flags`: {section: {field: value}} of the options given on the command line; `style`
    says how to name an option whose value is a default ("cli": its flag, "toml": its key).
    `cli`: for `run`, the sections whose options are also its flags, with those given
    ({section: {field: value}}, named by their flags; `flags` are then its --set keys).
    """

    def __init__(
        self,
        path: Path | None = None,
        *,
        env: Mapping[str, str] | None = None,
        flags: Mapping[str, Mapping[str, Any]] | None = None,
        style: str = "toml",
        cli: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        self.path = path
        self.data = read_config(path) if path is not None else {}
        self.env = os.environ if env is None else env
        self.flags = flags or {}
        self.cli = cli or {}
        self.style = style
        self._resolved: dict[str, Section] = {}
        self._pending: set[str] = set()

    def section(self, name: str) -> Any:
        if name not in self._resolved:
            if name in self._pending:  # a derive cycle is a bug in options.py
                raise RuntimeError(f"options of [{name}] derive from themselves")
            self._pending.add(name)
            try:
                self._resolved[name] = self._resolve(name)
            finally:
                self._pending.discard(name)
        return self._resolved[name]

    def all(self) -> RunSections:
        """Every section, resolved now: a bad value anywhere stops before any stage runs."""
        return run_options().model_construct(**{name: self.section(name) for name in sections()})

    paths = property(lambda self: self.section("paths"))
    filter = property(lambda self: self.section("filter"))
    llm = property(lambda self: self.section("llm"))
    persona = property(lambda self: self.section("persona"))
    queries = property(lambda self: self.section("queries"))
    split = property(lambda self: self.section("split"))
    stats = property(lambda self: self.section("stats"))
    push = property(lambda self: self.section("push"))
    criteria = property(lambda self: self.section("criteria"))
    respond = property(lambda self: self.section("respond"))
    evaluate = property(lambda self: self.section("evaluate"))

    def _resolve(self, name: str) -> Section:
        model = sections()[name]
        values: dict[str, Any] = {}
        sources: dict[str, tuple[str, str]] = {}  # field -> (name with the file, short name)
        renames = renamed(model)
        for key, value in self.data.get(name, {}).items():
            if key in renames and renames[key] not in self.data[name]:  # an earlier key: read, noted
                notice_renamed(f"{name}.{key}", f"{name}.{renames[key]}", f"{self.path}: ")
                key = renames[key]
            values[key] = value
            sources[key] = (f"{self.path}: {name}.{key}", f"{name}.{key}")
        for key, (variable, value) in env_values(name, self.env).items():
            values[key] = _merge(values.get(key), value)
            sources[key] = (variable, variable)
        for key, value in self.flags.get(name, {}).items():
            if key in renames:  # the Python API, given an earlier name (the CLI maps its flags)
                warnings.warn(f"{key}= is deprecated, use {renames[key]}=", FutureWarning, stacklevel=2)
                key = renames[key]
            values[key] = _merge(values.get(key), value)
            # how the caller wrote it: a flag, `run --set`, or (the Python API) the argument's name
            given = {"python": key, "set": f"--set {name}.{key}"}.get(self.style) or spec(name, key).flag
            sources[key] = (given, given)
        for key, value in self.cli.get(name, {}).items():  # run's own flags (load_config: none twice)
            values[key] = _merge(values.get(key), value)
            sources[key] = (spec(name, key).flag,) * 2
        for option in specs(name):
            if option.name not in values and option.opt.derive:
                values[option.name] = derive(option.opt.derive, self.section, option.kind == "list")

        def display(field: str, lead: bool) -> str:
            if field in sources:
                return sources[field][0 if lead else 1]
            if not field:
                return f"{self.path}: [{name}]" if self.path else f"[{name}]"
            known = {option.name for option in specs(name)}
            if (self.style == "cli" or name in self.cli) and field in known:
                return spec(name, field).flag
            return f"{self.path}: {name}.{field}" if lead and self.path else f"{name}.{field}"

        try:
            return model.model_validate(values).with_derived(values.keys() - sources.keys())
        except ValidationError as exc:
            raise InputError(describe(exc, display)) from None


def _merge(old: Any, new: Any) -> Any:
    """A later source replaces a value; tables (per-step sampling) merge key by key."""
    if isinstance(old, dict) and isinstance(new, dict):
        merged = dict(old)
        for key, value in new.items():
            merged[key] = _merge(old.get(key), value)
        return merged
    return new


def load_config(
    path: Path | None,
    env: Mapping[str, str] | None = None,
    settings: list[str] | None = None,
    flags: Mapping[str, Mapping[str, Any]] | None = None,
) -> RunSections:
    """Every option of `personaemp run`: `settings` (`run --set SECTION.KEY=VALUE`) and
    `flags` (`run --model ...`: {section: {option: value}}, cli_flags) over env vars over the
    file over the defaults. A key given both ways is refused."""
    tables = set_flags(settings or [])
    for section, given in (flags or {}).items():
        for key in sorted(given.keys() & tables.get(section, {}).keys()):
            raise InputError(
                f"{spec(section, key).flag} and --set {section}.{key} both give {section}.{key}",
                "give one of them",
            )
    return Resolver(path, env=env, flags=tables, cli=flags, style="set").all()


def _section_hint(table: Any) -> str:
    """Where the keys of an unknown section live (`[run] executor` is `[llm] executor`), else
    the sections there are."""
    keys = table if isinstance(table, dict) else {}
    homes = {
        f"[{section}] {key}"
        for key in keys
        for section in sections()
        if key in {option.name for option in specs(section)}
    }
    if 0 < len(homes) <= 3:  # a key of many sections (input, output) says nothing
        return f"write {', '.join(sorted(homes))}"
    return f"use {', '.join(sections())}"


def set_flags(items: list[str]) -> dict[str, dict[str, Any]]:
    """`--set persona.limit=8` (repeatable) -> {"persona": {"limit": "8"}}: any key of any
    section, checked against the options' declarations. The value is read as the config
    file reads it: `["a", "b"]` a list, `"text"` a string, `{k = 1}` a table; a bare word
    is text (`llm.model=gpt-4o-mini`, the comma form `queries.categories=ES,HEQ`), and a
    number or true/false goes on as written, for the option to read. A table's keys are
    dotted, as in a TOML file: `llm.vllm.engine.max_model_len=8192`. A list key given
    again adds to it."""
    found: dict[str, dict[str, Any]] = {}
    for given_item in items:
        name, equals, text = given_item.partition("=")
        item = shown_assignment(given_item)  # as errors show it: a key's value masked
        path = [part.strip().replace("-", "_") for part in name.split(".")]
        if not (equals and len(path) >= 2 and all(path)):
            raise InputError(f"--set takes SECTION.KEY=VALUE (e.g. persona.limit=8), not {item!r}")
        section, key, inner = path[0], path[1], path[2:]
        if section not in sections():
            raise InputError(
                f"--set {item}: [{section}] is not a known section", f"use {', '.join(sections())}"
            )
        options = {option.name: option for option in specs(section)}
        if key not in options and secret_name(key):
            raise InputError(
                f"--set {item}: secrets do not belong on the command line", "set them in the environment"
            )
        if key not in options:
            raise InputError(
                f"--set {item}: [{section}] has no key {key!r}", f"its keys: {', '.join(options)}"
            )
        option = options[key]
        try:
            value = toml_value(text)
        except ValueError as exc:
            raise InputError(f"--set {item}: {exc}", "close the string, list or table") from None
        if option.kind == "dict":
            if not inner and not isinstance(value, dict):
                raise InputError(
                    f"--set {item}: {section}.{key} is a table",
                    f"give --set {section}.{key}.{option.metavar} or a [{section}.{key}.…] table in the file",
                )
            for part in reversed(inner):
                value = {part: value}
            secrets = _secret_keys(value, f"{section}.{key}.")
            if secrets:
                raise InputError(
                    f"--set {item}: secrets do not belong on the command line ({', '.join(secrets)})",
                    "set them in the environment instead",
                )
        elif inner:
            raise InputError(
                f"--set {item}: {section}.{key} is not a table", f"give --set {section}.{key}=VALUE"
            )
        elif not isinstance(value, str | list | dict):
            value = text.strip()  # 8, 0.5, true: the option reads its text, as a flag's
        given = found.setdefault(section, {})
        if option.kind == "list":
            given.setdefault(key, []).extend(value if isinstance(value, list) else [value])
        else:
            twice = _set_twice(given.get(key), value, f"{section}.{key}")
            if twice:  # not the last one silently
                raise InputError(f"--set {twice} is given twice, with two values", "give it once")
            given[key] = _merge(given.get(key), value)
    return found


def _set_twice(old: Any, new: Any, name: str) -> str | None:
    """The key (dotted) that two `--set`s give different values, None when they agree or
    touch different keys of a table."""
    if old is None or old == new:
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        return next((found for key in old.keys() & new.keys()
                     if (found := _set_twice(old[key], new[key], f"{name}.{key}"))), None)  # fmt: skip
    return name


TOML_OPENERS = ('"', "'", "[", "{")


def toml_value(text: str) -> Any:
    """`text` read as the value of a TOML key; not TOML (a bare word, a path): the text itself.
    Text that opens a TOML string, list or table and does not close it (`["a", "b"`, `"abc`)
    is a mistake, not text: ValueError."""
    text = text.strip()
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError as exc:
        if text.startswith(TOML_OPENERS):
            raise ValueError(f"not a TOML value ({exc})") from None
        return text


def typed_assignments(tables: dict[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
    """`--vllm engine.max_model_len=8192` as the TOML file gives it: 8192, not "8192" (JSON
    literals: numbers, true/false, lists; anything else stays text)."""

    def typed(item: str) -> Any:
        try:
            return json.loads(item)
        except ValueError:
            return item

    return {part: {key: typed(item) for key, item in table.items()} for part, table in tables.items()}


def cli_flags(section: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The flags of one section as the resolver takes them (KEY=VALUE lists become tables)."""
    values = {}
    for name, value in given.items():
        option = spec(section, name)
        values[name] = (
            typed_assignments(parse_assignments(value, option.flag, option.metavar))
            if option.kind == "dict"
            else value
        )
    return values


def llm_settings(options: LLMOptions, env: Mapping[str, str] | None = None):
    """The engine's settings from the resolved [llm] options; the key from OPENAI_API_KEY only
    (`env`, else the process's environment, as LLMSettings reads it)."""
    from personaemp.llm.settings import KEY_ENV, LLMSettings

    key = None if env is None else env.get(KEY_ENV) or None
    settings = LLMSettings(
        base_urls=list(options.base_url),
        api_key=key,
        model=options.model,
        llm=options.llm,
        structured=options.structured,
        concurrency=options.concurrency,
        rpm=options.rpm,
        timeout=options.timeout,
        max_retries=options.max_retries,
        max_reasks=options.max_reasks,
        max_tokens=options.max_tokens,
        temperature=options.temperature,
        seed=options.seed,
        steps=options.step_sampling(),
        work_dir=options.work_dir,
        use_cache=not options.no_cache,
        refresh=options.refresh,
        price_in=options.price_in,
        price_out=options.price_out,
        price_cached=options.price_cached,
        cache_rule=options.cache_rule,
        max_cost=options.max_cost,
        estimate=options.estimate,
        batch=options.batch,
        executor=options.executor,
        workers=options.workers,
        ray_address=options.ray_address,
        vllm=options.vllm,
    )
    if key is not None:  # from the variable, though handed over as an argument
        settings.key_source = f"${KEY_ENV}"
    settings.check_installed()  # before any stage starts
    return settings
