"""What runs the stages of the catalogue (personaemp/catalogue.py): `STAGES[command].run(options,
console)` calls the stage's module and prints its summary. The commands (cli.py), `import
personaemp as pe` (api.py) and `personaemp run` (pipeline.py) all go through `STAGES`.

A stage's module has `from_options(section, console, ...)`: its resolved options to its
function's arguments, its return value to a StageResult (a coroutine for an LLM stage, given
`settings`, the engine's LLMSettings, and `retry`). What differs between stages stays there.

A stage's options: its TOML section, a pydantic model with `@options.declare("name")`, in
its options module (`StageLine.options_module`, by default its product's `options.py`, which
`personaemp --help` imports without the stage's code); `options.sections()` loads them in
the catalogue's order, so flags, TOML keys, env vars, the docs tables and the path checks
all follow from the catalogue line.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from personaemp import manifest, results
from personaemp.aio import run_sync
from personaemp.catalogue import LINES, StageLine
from personaemp.options import run_options
from personaemp.options_page import markdown_tables


@dataclass(frozen=True)
class Stage(StageLine):
    """A catalogue line (personaemp.catalogue) with what runs it."""

    def call(self, *args, **extra):
        """The module's `from_options`, imported now (a command imports only its own stage)."""
        module = importlib.import_module(f"personaemp.{self.module}")
        wiring = WIRING.get(self.command)
        return module.from_options(*args, **extra, **(wiring() if wiring else {}))

    def options(self, options) -> Any:
        """The stage's own section of `options` (a config.Resolver, or run's RunOptions)."""
        name = self.sections[0]
        return getattr(options, name) if hasattr(options, name) else options.section(name)

    def run(self, options, console: Console, llm=None, env: Mapping[str, str] | None = None, **extra):
        """The stage on `options` (its section; an LLM stage also [llm], whose key is read from
        `env`, unless `llm` gives the engine's settings), then its summary on `console`."""
        if self.llm:
            return run_sync(self.arun(options, console, llm, env, **extra))
        return self._shown(self.call(self.options(options), console, **extra), console)

    async def arun(self, options, console: Console, llm=None, env: Mapping[str, str] | None = None, **extra):
        """`run` of an LLM stage, awaited: resolve its options, skip it if current, run it,
        record it, print its summary."""
        if llm is None:
            from personaemp.config import llm_settings

            llm = llm_settings(options.llm, env)
        section = self.options(options)
        books = (
            manifest.LLMBooks(self.command, [(self.sections[0], section)], options.llm)
            if self.fresh
            else None
        )
        last = books.current(section.force) if books else None
        if last is not None:
            console.print(books.unchanged(last))
            return results.StageResult(self.command, section.output, counts=last["result"])
        made = await self.call(section, console, llm, retry=options.llm.retry_failed, **extra)
        if books:
            books.record([made], made.counts)
        return self._shown(made, console)

    def _shown(self, result, console: Console):
        self.summary(result, console)
        return result

    def summary(self, result, console: Console) -> None:
        """The stage's summary of `result` on `console`: its module's `print_summary(result,
        console)`, found as `from_options` is (a stage without one prints nothing)."""
        show = getattr(importlib.import_module(f"personaemp.{self.module}"), "print_summary", None)
        if show is not None:
            show(result, console)


def _push_wiring() -> dict[str, Any]:
    """push's card shows the agreement measured in review: wired here, above both products."""
    from personaemp.review.agreement import card_quality

    return {"quality": card_quality}


WIRING = {"push": _push_wiring}  # arguments that come from another product

STAGES: dict[str, Stage] = {line.command: Stage(**vars(line)) for line in LINES}
RunOptions = run_options()  # personaemp.toml: every section (the file may leave any out)


def signature_parameters(stage: Stage) -> list[inspect.Parameter]:
    """The stage's options as keyword arguments with the command's defaults (api.py)."""
    from personaemp.options import specs

    first: dict[str, Any] = {}  # an option in two sections: the first one's
    for section in stage.sections:
        for option in specs(section):
            first.setdefault(option.name, option)
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option.default,
                              annotation=option.info.annotation)
            for name, option in first.items() if name not in stage.positional]  # fmt: skip


if __name__ == "__main__":  # python -m personaemp.registry docs/options.md: the Options page's tables
    if len(sys.argv) > 1:
        from personaemp.options_page import update_readme

        changed = update_readme(Path(sys.argv[1]))
        print(f"{sys.argv[1]}: {'updated' if changed else 'up to date'}")
    else:
        print(markdown_tables(), end="")
