"""The Python API page's reference (docs/python-api.md), generated from the functions of
`import personaemp as pe` (personaemp/api.py) and their stages' options:
`python -m personaemp.apidocs docs/python-api.md` rewrites its block."""

from __future__ import annotations

import inspect
from pathlib import Path

from personaemp import api
from personaemp.options import specs
from personaemp.registry import STAGES, Stage, signature_parameters

COMMAND = "python -m personaemp.apidocs docs/python-api.md"

BEGIN, END = "<!-- api:begin -->", "<!-- api:end -->"


def documented_parameters(function, stage: Stage) -> list[inspect.Parameter]:
    """`pe.<function>`'s parameters as a reader calls it: its own, then, for its `**options`,
    each option of the stage's sections with the command's default (registry.signature_parameters)."""
    own = [p for p in inspect.signature(function).parameters.values() if p.kind is not p.VAR_KEYWORD]
    return [*own, *signature_parameters(stage)]


def _signature(function, stage: Stage) -> str:
    """`pe.name(a=None, *, b=1, ...)`: names and defaults, one per line; the LLM options,
    the same for every LLM function, named once below the functions."""
    parts, star = [], False
    llm = {option.name for option in specs("llm")} if stage.llm else set()
    for parameter in documented_parameters(function, stage):
        if parameter.name in llm:
            if not parts[-1].startswith("#"):
                parts.append("# ... and every LLM option (see below)")
            continue
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        default = parameter.default
        shown = repr(_plain(default))  # as Python writes it
        parts.append(f"{parameter.name}={shown}")
    lines = "".join(f"    {part}\n" if part.startswith("#") else f"    {part},\n" for part in parts)
    return f"pe.{function.__name__}(\n{lines}) -> StageResult"


def _plain(value):
    """A default as a caller writes it: paths as strings, in a list too (push's dialogues)."""
    if isinstance(value, Path):
        return str(value)
    return [_plain(item) for item in value] if isinstance(value, list) else value


def reference_markdown() -> str:
    """Every `pe.*` stage function as it is: its signature, what it does, its own options
    (the LLM options once, at the end). Between BEGIN and END in docs/python-api.md."""
    from personaemp.options import show_default

    def row(option) -> str:
        default = show_default(option.default)
        return f"| `{option.name}` | {f'`{default}`' if default else '—'} | {option.help.replace('|', '/')} |"

    out = [
        "<!-- generated from personaemp/registry.py: python -m personaemp.apidocs docs/python-api.md -->",
        "",
    ]
    for stage in STAGES.values():
        function = getattr(api, stage.function)
        out += [f"### `pe.{stage.function}`", ""]
        if stage.llm:
            out += [f"And `await pe.a{stage.function}(...)`, the same arguments.", ""]
        out += ["```text", _signature(function, stage), "```", ""]  # a signature, not a snippet
        out += [f"`personaemp {stage.command}`: {' '.join(inspect.cleandoc(stage.help).split())}", ""]
        first = ", ".join(f"`{name}`" for name in stage.positional)
        flags = ", ".join(f"`--{name.replace('_', '-')}`" for name in stage.positional)
        out += [
            (f"{first}: the command's {flags} (also by keyword). " if stage.positional else "")
            + ("`settings=pe.LLMSettings(...)` or the [LLM options](#llm-options) as keywords. " if stage.llm
               else "")
            + "`config=`: a personaemp.toml; `progress=True` prints what the command prints.",
            "",
        ]  # fmt: skip
        options = [option for option in specs(stage.sections[0]) if option.name not in stage.positional]
        if options:
            out += ["| argument | default | meaning |", "|---|---|---|", *map(row, options), ""]
    out += ["### LLM options", "", "Every LLM function takes these as keywords (or `settings=`).", ""]
    out += ["| argument | default | meaning |", "|---|---|---|", *map(row, specs("llm"))]
    return "\n".join(out) + "\n"


if __name__ == "__main__":  # python -m personaemp.apidocs docs/python-api.md
    import sys

    from personaemp.io import rewrite_generated

    changed = rewrite_generated(Path(sys.argv[1]), BEGIN, END, reference_markdown())
    print(f"{sys.argv[1]}: {'updated' if changed else 'up to date'}")
