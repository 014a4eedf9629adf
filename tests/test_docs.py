"""Docs that run (issue 39): every ```python and ```sh block of README.md and docs/ runs,
read by Sybil, against the test server standing in for every provider, or is marked
`<!-- skip: next "why" -->` (the Hub, a GPU, a build tool, your own files).

Each page runs in its own folder holding the shipped sample and a copy of one small build
(conftest's `sample_build`, made once per session), its blocks in order sharing one
namespace, as a reader follows a page. Python blocks run as a notebook cell does (top-level
`await` allowed, inside a running event loop); a shell block's `personaemp` lines run in
this process (Typer's runner), `export` sets the environment, any `--base-url` and
`base_url=` point at the test server. A block that fails names its page and line.
"""

from __future__ import annotations

import ast
import asyncio
import re
import shlex
import shutil
import unittest

import pytest
from conftest import REPO, SAMPLE_TASK1, order_free_responder
from fake_openai import FakeOpenAI
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser
from typer.testing import CliRunner

# Every page: a new page's blocks run, or are marked, from the day it is written.
PAGES = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "docs" / "commands").glob("*.md")),
]


def replies():
    """The build's capable model (order free), and for evaluation a plain reply, criteria and
    judgments that depend on nothing but the request."""
    build = order_free_responder()

    def answer(body: dict, number: int):
        fmt = body.get("response_format")
        if not fmt:
            return "That sounds hard. It makes sense that you feel this way; what would help most now?"
        properties = (fmt.get("json_schema") or {}).get("schema", {}).get("properties", {})
        if "score" in properties:
            reply = {"analysis": "It acknowledges the feeling before any advice.", "score": 4}
            return {"criteria": ["c1", "c2", "c3"], **reply} if "criteria" in properties else reply
        if "criteria" in properties:
            return {"criteria": [{"name": f"c{i}", "weight": i + 1, "description": "d"} for i in range(4)]}
        if "content_effectiveness" in properties:
            return dict.fromkeys(properties, 16)
        return build(body, number)

    return answer


class Shell:
    """A shell block, line by line: `personaemp ...` in this process, `export`, `&&`,
    `python -c`, `pip install` and `source` (done: this process is that install); anything
    else is not runnable here and must be marked on the page, and so must a command that
    serves until Ctrl-C."""

    def __init__(self, server: FakeOpenAI, env: dict[str, str]):
        self.server, self.env = server, env

    def __call__(self, example) -> None:
        text = re.sub(r"\\\n\s*", " ", example.parsed)
        for line in text.splitlines():
            words = shlex.split(line, comments=True)
            for command in _chain(words):
                self.run(command, f"{example.path}:{example.line}")

    def run(self, words: list[str], where: str) -> None:
        if not words:
            return
        head = words[0]
        if head == "pip" and words[1:2] == ["install"] or head in ("source", "."):
            return  # installing and activating: done, this process is that install
        if head == "export":
            for assignment in words[1:]:
                name, _, value = assignment.partition("=")
                self.env[name] = self.server.base_url if name == "OPENAI_BASE_URL" else value
            return
        if head == "personaemp":
            if _serves(words[1:]):
                mark = '<!-- skip: next "why" -->'
                raise AssertionError(
                    f"{where}: `{shlex.join(words)}` serves until Ctrl-C: mark the block {mark}"
                )
            args = list(words)
            for i in range(1, len(args) - 1):
                if args[i] == "--base-url":
                    args[i + 1] = self.server.base_url
            args = [re.sub(r"base_url=[^;]+", f"base_url={self.server.base_url}", w) for w in args]
            from personaemp.cli import app

            result = CliRunner().invoke(app, args[1:], env=self.env, catch_exceptions=False)
            assert result.exit_code == 0, (
                f"{where}: {shlex.join(words)} -> exit {result.exit_code}\n{result.output}"
            )
            return
        if head in ("python", "python3") and words[1:2] == ["-c"]:
            exec(compile(words[2], where, "exec"), {})  # noqa: S102 - a docs snippet, as a reader runs it
            return
        raise AssertionError(
            f'{where}: `{head}` does not run offline: mark the block <!-- skip: next "why" -->'
        )


def _serves(args: list[str]) -> bool:
    """A command that serves until Ctrl-C (it would hang the test): serve-local, and review
    unless it only writes or reads Label Studio files."""
    if args[:1] == ["serve-local"]:
        return True
    return args[:1] == ["review"] and not {"--export-label-studio", "--import-label-studio"} & set(args)


def _chain(words: list[str]) -> list[list[str]]:
    out, current = [], []
    for word in words:
        if word == "&&":
            out.append(current)
            current = []
        else:
            current.append(word)
    return [*out, current]


def python_cell(example) -> None:
    """A Python block as a notebook cell runs it: top-level await, a loop already running."""
    source = re.sub(r"https?://[\w.:-]+/v1", example.namespace["__base_url__"], example.parsed)
    code = compile(source, f"{example.path}:{example.line}", "exec",
                   flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)  # fmt: skip

    async def cell():
        result = eval(code, example.namespace)  # noqa: S307 - a docs snippet
        if asyncio.iscoroutine(result):
            await result

    asyncio.run(cell())


@pytest.fixture(scope="module")
def server():
    with FakeOpenAI(responder=replies()) as fake:
        yield fake


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(REPO)))
def test_every_block_of_the_page_runs(page, server, sample_build, tmp_path, monkeypatch):
    env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url, "PERSONAEMP_MODEL": "fake",
           "NO_COLOR": "1"}  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "data" / "raw").mkdir(parents=True)
    (tmp_path / "data" / "raw" / "alpsbench_sample").symlink_to(SAMPLE_TASK1.parent)
    shutil.copytree(sample_build, tmp_path / "data" / "processed")
    shutil.copy(REPO / "personaemp.toml", tmp_path / "personaemp.toml")
    monkeypatch.chdir(tmp_path)
    sybil = Sybil(
        parsers=[
            CodeBlockParser(language="python", evaluator=python_cell),
            CodeBlockParser(language="sh", evaluator=Shell(server, env)),
            SkipParser(),
        ]
    )
    document = sybil.parse(page)
    document.namespace["__base_url__"] = server.base_url  # any endpoint a snippet names
    for example in document:
        try:
            example.evaluate()
        except unittest.SkipTest:  # a block marked as not runnable offline, with its reason
            continue


def test_the_files_page_lists_the_columns_the_records_have():
    """docs/files.md's tables are generated from the records: a field added to one and not
    regenerated fails here."""
    from personaemp.filedocs import BEGIN, END, files_markdown

    text = (REPO / "docs" / "files.md").read_text(encoding="utf-8")
    block = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    assert block == "\n" + files_markdown(), "run: python -m personaemp.filedocs docs/files.md"
    for column in ("`memories[].label_suggestion`", "`checks.passed`", "`big_five.neuroticism.level`",
                   "`persona_traits`", "`response`"):  # fmt: skip
        assert column in block
