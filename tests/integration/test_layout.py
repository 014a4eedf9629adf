"""The package's shape: four products over shared layers, imports only going down, and the
commands' --help unchanged unless on purpose (tests/data/help.txt; regenerate it with
`python tests/integration/test_layout.py` after changing a command or an option)."""

from __future__ import annotations

import ast
import importlib
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "personaemp"
HELP = REPO / "tests" / "data" / "help.txt"
PRODUCTS = ("dataset", "evaluation", "review", "training")
# Above the products: what derives the commands, pe.* and run from the registry, the docs
# generated from the products' records (filedocs), and the
# public aliases of moved modules.
TOP = {
    "cli",
    "api",
    "apidocs",
    "filedocs",
    "pipeline",
    "registry",
    "reward",
    "stages",
    "__main__",
    "__init__",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def by_name(node: ast.AST) -> bool:
    """A call that imports a module named by a literal string: `importlib.import_module("x")`,
    `import_module("x")` or `__import__("x")` (an import all the same, only hidden)."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
    first = node.args[0]
    return (
        name in ("import_module", "__import__")
        and isinstance(first, ast.Constant)
        and isinstance(first.value, str)
        and first.value.startswith("personaemp.")
    )


def import_graph() -> dict[str, set[str]]:
    """Module -> the personaemp modules it imports (at any depth of the file, lazily too), by a
    statement or by name (`by_name`)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif by_name(node):  # importlib.import_module("personaemp.x"), __import__("personaemp.x")
                targets = [node.args[0].value]
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target not in (name, "personaemp"):
                    found.add(target)
        graph[name] = found
    return graph


def floor(module: str) -> tuple[int, str | None]:
    """2: above the products; 1: a product (and which); 0: a layer below them."""
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in PRODUCTS:
        return 1, parts[1]
    if len(parts) == 2 and parts[1] in TOP or module == "personaemp":
        return 2, None
    if len(parts) >= 2 and parts[1] == "stages":
        return 2, None
    return 0, None


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_imports_have_no_circle():
    assert circles(import_graph()) == []


def test_imports_only_go_down_and_no_product_imports_another():
    wrong = []
    for module, targets in import_graph().items():
        here, product = floor(module)
        for target in targets:
            there, other = floor(target)
            if there > here or (there == here == 1 and other != product):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_the_four_products_are_four_folders():
    for product in PRODUCTS:
        assert (PACKAGE / product / "__init__.py").is_file()
    from personaemp.registry import STAGES

    for stage in STAGES.values():  # each stage's code sits in one product folder
        assert stage.module.split(".")[0] in PRODUCTS, stage.command
        assert callable(importlib.import_module(f"personaemp.{stage.module}").from_options), stage.command


def test_the_catalogue_is_data_and_every_section_it_names_is_declared():
    """The checks the registry once made as it loaded: each stage's sections are declared in the
    module its line names, [reward] is training.options' RewardConfig, the order is the pipeline's."""
    from personaemp import catalogue
    from personaemp.options import sections
    from personaemp.training.options import RewardConfig

    tree = ast.parse((PACKAGE / "catalogue.py").read_text(encoding="utf-8"))
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
                and node.module.startswith("personaemp")]  # fmt: skip
    declared = sections()
    for line in catalogue.LINES:
        assert all(name in declared for name in line.sections), line.command
        assert declared[line.sections[0]].__module__ == f"personaemp.{line.options_from}", line.command
    assert declared["reward"] is RewardConfig
    assert list(declared) == ["paths", *(line.sections[0] for line in catalogue.LINES), "llm", "reward"]
    assert sections() is declared and list(catalogue.COMMANDS) == [line.command for line in catalogue.LINES]


def test_a_missing_section_is_named_with_its_module(monkeypatch):
    from personaemp import catalogue, options

    monkeypatch.setitem(catalogue.SECTION_MODULES, "nowhere", "dataset.options")
    options.sections.cache_clear()
    try:
        named = r"\[nowhere\]: no @declare\('nowhere'\) in personaemp.dataset.options"
        with pytest.raises(TypeError, match=named):
            options.sections()
    finally:
        monkeypatch.undo()
        options.sections.cache_clear()


def test_each_stage_prints_its_own_summary():
    """A stage's summary is `print_summary(result, console)` in its own module, found by
    convention; the registry wires none (no lambda in it) and summaries.py keeps shared pieces."""
    from personaemp import summaries
    from personaemp.registry import STAGES

    tree = ast.parse((PACKAGE / "registry.py").read_text(encoding="utf-8"))
    assert not [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Lambda)]
    silent = {"table", "review", "agreement"}  # their output is the command's (a file, a page)
    for stage in STAGES.values():
        module = importlib.import_module(f"personaemp.{stage.module}")
        assert callable(getattr(module, "print_summary", None)) != (stage.command in silent), stage.command
    shared = {name for name in dir(summaries) if name.startswith("print_")}
    assert shared == {"print_stage_report", "print_estimate", "print_run_report", "print_batch_round"}


def test_no_module_writes_into_globals():
    """A module's names are the ones its code defines: none written through globals() or vars()."""
    writes = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if (isinstance(owner, ast.Call) and getattr(owner.func, "id", None) in ("globals", "vars")
                        and node.func.attr in ("update", "__setitem__", "setdefault")):  # fmt: skip
                    writes.append(f"{path.relative_to(REPO)}:{node.lineno}")
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                owner = node.value
                if isinstance(owner, ast.Call) and getattr(owner.func, "id", None) in ("globals", "vars"):
                    writes.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert writes == []


def test_no_signature_surgery():
    """Commands and functions are made by code a reader can follow: nothing assigns a
    function's __signature__ or __annotations__ (cli.py builds click objects from the specs)."""
    assigned = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in ("__signature__", "__annotations__"):
                    assigned.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert assigned == []


def test_the_old_module_paths_import_with_a_warning():
    import personaemp.dataset.split as new

    with pytest.warns(DeprecationWarning, match="personaemp.stages.split moved to personaemp.dataset.split"):
        sys.modules.pop("personaemp.stages.split", None)
        import personaemp.stages.split as old
    assert old is new


def help_text() -> str:
    """Every command's --help at a fixed width, in one text."""
    from typer.main import get_command
    from typer.testing import CliRunner

    from personaemp.cli import app

    width = {"TERMINAL_WIDTH": "100", "COLUMNS": "100"}
    runner = CliRunner()
    out = []
    for name in [None, *sorted(get_command(app).commands)]:
        result = runner.invoke(app, [*([name] if name else []), "--help"], env=width)
        assert result.exit_code == 0, result.output
        out.append(f"=== {name}\n{result.output}")
    return "\n".join(out)


def test_every_commands_help_is_the_recorded_one(monkeypatch):
    monkeypatch.setenv("TERMINAL_WIDTH", "100")
    assert help_text() == HELP.read_text(encoding="utf-8"), (
        "a command's --help changed: if on purpose, regenerate tests/data/help.txt with "
        "`python tests/integration/test_layout.py`"
    )


if __name__ == "__main__":
    os.environ["TERMINAL_WIDTH"] = os.environ["COLUMNS"] = "100"
    HELP.write_text(help_text(), encoding="utf-8")
    print(f"wrote {HELP}")
