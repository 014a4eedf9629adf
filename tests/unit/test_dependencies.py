"""Every declared dependency is used: a package in [project] dependencies that no module of
personaemp imports is dead weight on every install (polars was, after the filter's counts
moved to a Counter)."""

from __future__ import annotations

import ast
import re
import tomllib

from conftest import REPO


def declared() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [re.split(r"[\[<>=!~; ]", spec, maxsplit=1)[0].lower() for spec in project["dependencies"]]


def imported() -> set[str]:
    modules = set()
    for path in (REPO / "personaemp").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules.add(node.module.split(".")[0])
    return modules


def test_every_declared_dependency_is_imported_by_the_package():
    names = declared()
    assert "typer" in names and "datasets" in names  # the parse found the list
    modules = imported()  # parsed once: once per name, it took 6.7 s of make test
    unused = [name for name in names if name.replace("-", "_") not in modules]
    assert unused == [], f"declared in pyproject.toml but imported nowhere in personaemp/: {unused}"
