"""A stage is its module plus one catalogue line: a toy stage added to a copy of the package
touches two files (a new dataset/wordcount.py and one StageLine in catalogue.py), and gets its
command, flags, TOML section, env vars, path checks, docs table and `pe.` function from them
(docs/development.md, "Adding a stage", walks through the same stage)."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO

# The toy stage's whole module: its options (the section [wordcount]), its function, from_options.
TOY = '''"""`personaemp wordcount`: the words of each row's text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from personaemp.options import Opt, Section, declare
from personaemp.results import StageResult


@declare("wordcount")
class WordcountOptions(Section):
    input: Annotated[Path, Opt("Rows (JSON lines).", ("--input", "-i"), io="read")] = Path("rows.jsonl")
    output: Annotated[Path, Opt("Counts, one per row.", ("--output", "-o"), io="write")] = Path("out.jsonl")
    field: Annotated[str, Opt("The field with the text.", env="PERSONAEMP_WORDCOUNT_FIELD")] = "text"


def count_words(input: Path, output: Path, *, field: str = "text") -> StageResult:
    rows = [json.loads(line) for line in Path(input).read_text().splitlines() if line.strip()]
    Path(output).write_text("".join(json.dumps({"words": len(row[field].split())}) + "\\n" for row in rows))
    return StageResult("wordcount", Path(output), counts={"rows": len(rows)})


def from_options(section: WordcountOptions, console) -> StageResult:
    return count_words(section.input, section.output, field=section.field)
'''
LINE = (
    '    StageLine("wordcount", "count_words", "dataset.wordcount", "Count the words of each row.", '
    'sections=("wordcount",), options_module="dataset.wordcount"),\n'
)


def _with_toy_stage(root: Path) -> Path:
    """A copy of the package with the toy stage added: the new module and one catalogue line."""
    package = root / "personaemp"
    shutil.copytree(REPO / "personaemp", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "dataset" / "wordcount.py").write_text(TOY, encoding="utf-8")
    catalogue = package / "catalogue.py"
    text = catalogue.read_text(encoding="utf-8")
    end = text.index(")  # fmt: skip")  # the end of the LINES tuple
    catalogue.write_text(text[:end] + LINE + text[end:], encoding="utf-8")
    return package


def _changed(left: Path, right: Path) -> list[str]:
    """Files that differ between two trees, or stand in one only (relative to `right`)."""
    found = []
    compare = filecmp.dircmp(left, right, ignore=["__pycache__"])
    stack = [(compare, Path())]
    while stack:
        node, where = stack.pop()
        found += [str(where / name) for name in node.left_only + node.right_only + node.diff_files]
        stack += [(sub, where / name) for name, sub in node.subdirs.items()]
    return sorted(found)


def _run(root: Path, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "PERSONAEMP_WORDCOUNT_FIELD"}
    environ.update({"PYTHONPATH": str(root), "TERMINAL_WIDTH": "200", "COLUMNS": "200", **(env or {})})
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=120
    )


def test_a_toy_stage_is_its_module_and_one_catalogue_line(tmp_path):
    package = _with_toy_stage(tmp_path / "src")
    assert _changed(REPO / "personaemp", package) == ["catalogue.py", "dataset/wordcount.py"]
    old = (REPO / "personaemp" / "catalogue.py").read_text(encoding="utf-8").splitlines()
    assert len((package / "catalogue.py").read_text(encoding="utf-8").splitlines()) == len(old) + 1
    root, work = tmp_path / "src", tmp_path / "work"
    work.mkdir()
    (work / "rows.jsonl").write_text(
        '{"text": "one two three", "note": "a b"}\n{"text": "four", "note": "c"}\n'
    )

    # the command, with its flags and env var in --help
    shown = _run(root, "-m", "personaemp", "wordcount", "--help", cwd=work)
    assert shown.returncode == 0, shown.stderr
    assert "Count the words of each row." in shown.stdout
    assert "--field" in shown.stdout and "PERSONAEMP_WORDCOUNT_FIELD" in shown.stdout
    listed = _run(root, "-m", "personaemp", "--help", cwd=work)
    assert "wordcount" in listed.stdout

    # flags over env var over the TOML section over the defaults
    made = _run(root, "-m", "personaemp", "wordcount", "--json", cwd=work)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["counts"] == {"rows": 2}
    assert (work / "out.jsonl").read_text() == '{"words": 3}\n{"words": 1}\n'
    (work / "personaemp.toml").write_text('[wordcount]\nfield = "note"\noutput = "from-toml.jsonl"\n')
    made = _run(root, "-m", "personaemp", "wordcount", "--config", "personaemp.toml", cwd=work)
    assert made.returncode == 0, made.stderr
    assert (work / "from-toml.jsonl").read_text() == '{"words": 2}\n{"words": 1}\n'
    made = _run(
        root, "-m", "personaemp", "wordcount", "-c", "personaemp.toml", "-o", "env.jsonl", cwd=work,
        env={"PERSONAEMP_WORDCOUNT_FIELD": "text"},
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert (work / "env.jsonl").read_text() == '{"words": 3}\n{"words": 1}\n'

    # a bad TOML key and an output over the input: one line, exit 2, nothing written
    (work / "bad.toml").write_text("[wordcount]\nfeild = 'text'\n")
    bad = _run(root, "-m", "personaemp", "wordcount", "-c", "bad.toml", "-o", "bad.jsonl", cwd=work)
    assert bad.returncode == 2 and "feild" in bad.stderr and not (work / "bad.jsonl").exists()
    before = (work / "rows.jsonl").read_bytes()
    over = _run(root, "-m", "personaemp", "wordcount", "-o", "rows.jsonl", cwd=work)
    assert over.returncode == 2 and "would write over" in " ".join(over.stderr.split())
    assert (work / "rows.jsonl").read_bytes() == before

    # the docs table and the Python function
    tables = _run(root, "-m", "personaemp.registry", cwd=work)
    assert "#### `personaemp wordcount` — TOML `[wordcount]`" in tables.stdout
    assert "| `--field` | `field` | `PERSONAEMP_WORDCOUNT_FIELD` | `text` | The field with the text. |" in (
        tables.stdout
    )
    script = "import personaemp as pe; print(pe.count_words('rows.jsonl', 'py.jsonl', field='note').counts)"
    python = _run(root, "-c", script, cwd=work)
    assert python.returncode == 0, python.stderr
    assert (
        python.stdout.strip() == "{'rows': 2}"
        and (work / "py.jsonl").read_text() == '{"words": 2}\n{"words": 1}\n'
    )
