"""Docs that run (issue 39): every ```python and ```sh block of README.md and docs/ runs,
read by Sybil, against the test server standing in for every provider, or is marked
`<!-- skip: next "why" -->` (the Hub, a GPU, a build tool, your own files).

Each page runs in its own folder holding the shipped sample, personaemp.toml and a copy of
what `make demo` writes (`demo_build`, made once per session), its blocks in order sharing
one namespace, as a reader follows a page from a fresh clone after the README's demo.
Python blocks run as a notebook cell does (top-level `await` allowed, inside a running
event loop); a shell block's `personaemp` lines run in this process (Typer's runner),
`export` sets the environment, any `--base-url` (and `--supporter-base-url`...) and
`base_url=` point at the test server. A block that fails names its page and line.

A block marked skip is still checked (issue 51): each `personaemp` command of every shell
block parses against the CLI (the command exists, each flag is one of its options, each
value has the option's type), and a Python block compiles and its `personaemp` imports exist.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import re
import shlex
import shutil
import socket
import subprocess
import sys
import unittest
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, SAMPLE_TASK1, built_once, clean_environment, order_free_responder, read_jsonl
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
    """The build's capable model (order free), for evaluation a plain reply, criteria and
    judgments that depend on nothing but the request, and for dialogues the scripted
    simulated user and session judge of tests/integration/test_sessions.py."""
    from test_sessions import Judged, session_step

    build, dialogues = order_free_responder(), Judged(score=4.0)

    def answer(body: dict, number: int):
        if session_step(body) in ("hidden_need", "simulate", "in_character", "session_judge", "behaviours"):
            return dialogues(body, number)
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
        if "pick" in properties:  # fidelity's discriminator
            return {"reason": "It reads like their earlier messages.", "pick": "A"}
        if {"thought", "end", "text"} <= set(properties):  # fidelity's next message
            return {"thought": "they want a shorter answer", "end": number % 3 == 0,
                    "text": "ok but can you make it shorter? i dont have much time"}  # fmt: skip
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
                if args[i].endswith("base-url"):  # --base-url, --supporter-base-url, --judge-base-url
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


SEPARATORS = {"&&", "||", ";", "|", "do", "done", "then", "else", "fi"}


def _chain(words: list[str]) -> list[list[str]]:
    out, current = [], []
    for word in words:
        if word in SEPARATORS:
            out.append(current)
            current = []
        else:
            current.append(word)
    return [*out, current]


# --- what is not run is still checked -------------------------------------------------------------


def shell_commands(text: str) -> list[tuple[int, list[str]]]:
    """Each `personaemp ...` command of a shell block, with its line in the block (from 0):
    after `&&`, `;`, `|`, `do`, or inside another command (`ray job submit ... -- personaemp
    run ...`, `srun personaemp ...`)."""
    found, variables = [], {}
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        first, line = number, lines[number]
        while line.endswith("\\") and number + 1 < len(lines):  # a continued line
            number += 1
            line = line[:-1] + " " + lines[number]
        number += 1
        for command in _chain(shlex.split(line, comments=True)):
            assignments = command[1:] if command[:1] == ["export"] else command
            if assignments and all(re.fullmatch(r"\w+=.*", word, re.S) for word in assignments):
                variables.update(word.split("=", 1) for word in assignments)  # P="--model m": $P below
            elif "personaemp" in command:
                words = _without_redirections(command[command.index("personaemp") :])
                expanded = [shlex.split(variables[w[1:]]) if w[1:] in variables else [w] for w in words]
                found.append((first, [word for part in expanded for word in part]))
    return found


def _without_redirections(words: list[str]) -> list[str]:
    """`personaemp filter --show-rules > my_rules.toml`: the command without `> my_rules.toml`."""
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif re.fullmatch(r"\d?(>>?|<)", word):
            skip = True
        elif not re.match(r"\d?(>>?|<)\S", word):
            kept.append(word)
    return kept


def _unknown(value: str) -> bool:
    """A value the reader fills in (`$VAR`, `<path>`): only the flag is checked."""
    return "$" in value or "<" in value


def option_problems(given: dict[tuple[str, str], object], from_set: bool = False) -> list[str]:
    """Type errors of `{(section, name): value}` (as flags give them, or --set: set_flags),
    each checked against its option's declaration alone (the rest of the command may come
    from a config file or the environment)."""
    from pydantic import ValidationError

    from personaemp.config import cli_flags
    from personaemp.errors import InputError
    from personaemp.options import sections

    problems = []
    for (section, name), value in given.items():
        texts = value if isinstance(value, list) else [value]
        if any(isinstance(text, str) and _unknown(text) for text in texts):
            continue
        try:
            model = sections()[section]
            model.model_validate({name: value} if from_set else cli_flags(section, {name: value}))
        except InputError as error:
            problems.append(str(error))
        except ValidationError as error:
            problems.extend(
                f"{section}.{name}={value!r}: {e['msg']}" for e in error.errors() if e["loc"][:1] == (name,)
            )
    return problems


def command_problems(words: list[str]) -> list[str]:
    """Why `personaemp ...` (shlex words) would not parse: an unknown command or option, a
    value of the wrong type. Nothing is run."""
    import typer.main

    from personaemp import cli
    from personaemp.catalogue import COMMANDS
    from personaemp.config import set_flags
    from personaemp.errors import InputError
    from personaemp.options import specs

    group = typer.main.get_command(cli.app)
    if len(words) < 2 or words[1].startswith("-"):
        try:
            group.make_context("personaemp", words[1:])
        except Exception as error:  # (by name: typer bundles its own click)
            return [] if type(error).__name__ == "Exit" else [f"{type(error).__name__}: {error}"]
        return []
    name = words[1]
    if name not in group.commands:
        return [f"no command {name!r} (commands: {', '.join(group.commands)})"]
    try:
        context = group.commands[name].make_context(name, words[2:])
    except Exception as error:  # click's UsageError, BadParameter, NoSuchOption...
        if type(error).__name__ == "Exit":  # --help
            return []
        return [f"{type(error).__name__}: {getattr(error, 'message', error)}"]
    sections = getattr(cli, "RUN_SECTIONS", ()) if name == "run" else COMMANDS.get(name, ())
    given = {}
    for section in sections:
        for option in specs(section):
            source = context.get_parameter_source(option.name)
            if source is not None and source.name == "COMMANDLINE":
                given[(section, option.name)] = context.params[option.name]
    if name == "run" and context.params.get("settings"):
        try:
            tables = set_flags(context.params["settings"])
        except InputError as error:
            return [str(error)]
        keys = {(section, key): value for section, keys in tables.items() for key, value in keys.items()}
        return option_problems(given) + option_problems(keys, from_set=True)
    return option_problems(given)


def python_problems(source: str, where: str) -> list[str]:
    """A Python block compiles, and each name it imports from personaemp exists (read from the
    module's source: importing it may need what the block's skip says is missing)."""
    try:
        tree = ast.parse(source, where)
        compile(tree, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except SyntaxError as error:
        return [f"does not compile: {error}"]
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in modules:
            if module.split(".")[0] != "personaemp":
                continue
            if importlib.util.find_spec(module) is None:
                problems.append(f"no module {module}")
            elif name is not None and not _defines(module, name):
                problems.append(f"{module} has no {name}")
    return problems


def _defines(module: str, name: str) -> bool:
    """Whether `from module import name` works: the module's attribute or submodule; where
    importing the module needs a package not installed here (what the block's skip says),
    a name its source defines at the top level."""
    try:
        loaded = importlib.import_module(module)
    except ImportError as error:
        if (error.name or "personaemp").split(".")[0] == "personaemp":
            return False
        source = Path(importlib.util.find_spec(module).origin).read_text(encoding="utf-8")
        return name in _top_level_names(ast.parse(source))
    submodule = hasattr(loaded, "__path__") and importlib.util.find_spec(f"{module}.{name}") is not None
    return hasattr(loaded, name) or submodule


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(target.id for target in targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
    return names


def page_problems(page: Path) -> list[str]:
    """Every shell block's `personaemp` commands and every skipped Python block of the page,
    checked as above: `page:line: problem` each."""

    def ignore(example) -> None: ...

    parsers = [CodeBlockParser(language=language, evaluator=ignore) for language in ("python", "sh")]
    problems = []
    skipped = False
    for example in Sybil(parsers=[*parsers, SkipParser()]).parse(page):
        if not example.region.lexemes:  # a skip mark: it is about the next block
            skipped = True
            continue
        language = example.region.lexemes["arguments"]
        where = f"{page.relative_to(REPO)}:{example.line}"
        if language == "sh":
            for line, words in shell_commands(example.parsed):
                problems.extend(
                    f"{where}+{line + 1}: `{shlex.join(words)}`: {p}" for p in command_problems(words)
                )
        elif language == "python" and skipped:
            problems.extend(f"{where}: {p}" for p in python_problems(example.parsed, where))
        skipped = False
    return problems


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


@pytest.fixture(scope="session")
def demo_build(tmp_path_factory) -> Path:
    """What `make demo` leaves in data/processed (`personaemp run --config personaemp.toml`:
    its three users, the random split alone), the test server's capable model standing in
    for the embedded one: each page starts from it, as a newcomer after the README's demo.
    Built once per run (conftest.built_once), each page copies it."""
    from rich.console import Console

    from personaemp.config import load_config
    from personaemp.pipeline import run_pipeline

    def build(processed: Path) -> None:
        with (
            FakeOpenAI(responder=order_free_responder()) as fake,
            open(processed.parent / "log.txt", "w") as log,
        ):
            given = [f"paths.input={SAMPLE_TASK1}", f"paths.processed={processed}",
                     f"llm.base_url={fake.base_url}", "llm.model=fake"]  # fmt: skip
            run_pipeline(load_config(REPO / "personaemp.toml", env={}, settings=given), Console(file=log))

    return built_once(tmp_path_factory, "demo_build", build)


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(REPO)))
def test_every_block_of_the_page_runs(page, server, demo_build, tmp_path, monkeypatch):
    env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url, "PERSONAEMP_MODEL": "fake",
           "NO_COLOR": "1"}  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "data" / "raw").mkdir(parents=True)
    (tmp_path / "data" / "raw" / "alpsbench_sample").symlink_to(SAMPLE_TASK1.parent)
    shutil.copytree(demo_build, tmp_path / "data" / "processed")
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


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(REPO)))
def test_every_command_of_the_page_parses_run_or_skipped(page):
    """A block marked skip is never run: its commands are still parsed against the CLI, its
    Python compiled. Before (issue 51), docs/past-one-machine.md's three `personaemp run`
    commands shipped with options run did not have (--executor, --workers, --base-url...)."""
    assert page_problems(page) == []


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


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("personaemp infer-persona --limit abc", "Input should be a valid integer"),
        ("personaemp infer-persona --shard 0/2", "expected I/N with 1 <= I <= N"),
        ("personaemp gen-queries --categories ES,XX", "queries.categories"),
        ("personaemp infer-persona --step check.temperature", "--step takes STEP.KEY=VALUE"),
        ("personaemp serve-local --port eighty", "valid integer"),
        ("personaemp infer-persona --limt 3", "No such option: --limt"),
        ("personaemp infer-personas", "no command 'infer-personas'"),
        ("personaemp run --set persona.limit=abc", "persona.limit='abc'"),
        ("personaemp run --set persona.limt=3", "[persona] has no key 'limt'"),
        ("personaemp run --set llm.vllm.engine.max_model_len=8192 --set 'persona.users=[\"a\"]'", None),
        ("personaemp run --set llm.steps.check.temperature=-1", "llm.steps="),
        ("personaemp run --workers two", "llm.workers='two'"),
        ('P="--limit x"\npersonaemp infer-persona $P', "persona.limit='x'"),
        ("for s in a b; do personaemp split --seed $s; done", None),  # a loop's variable: the flag only
        ("personaemp filter --show-rules > rules.toml && personaemp filter --rules rules.toml", None),
    ],
)
def test_the_static_check_finds_what_would_not_parse(line, said):
    problems = [p for _, words in shell_commands(line) for p in command_problems(words)]
    if said is None:
        assert problems == []
    else:
        assert any(said in problem for problem in problems), problems


@pytest.mark.parametrize(
    ("source", "said"),
    [
        (
            "from personaemp.reward import PereGRM\nimport personaemp.training.interaction",
            None,
        ),
        ("import torch\nfrom personaemp.reward import PereGRM", None),  # only personaemp's are checked
        ("from personaemp.reward import PerGRM", "personaemp.reward has no PerGRM"),
        ("import personaemp.rewards", "no module personaemp.rewards"),
        ("x = (", "does not compile"),
        ("await something()", None),  # a notebook cell
    ],
)
def test_a_skipped_python_block_compiles_and_its_imports_exist(source, said):
    problems = python_problems(source, "page.md:1")
    assert problems == [] if said is None else any(said in p for p in problems), problems


# --- the tour without a key ---------------------------------------------------------------------


def readme_section(title: str) -> str:
    """The README's text under the heading `title`, to the next heading."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    heading = re.search(rf"^#+ {re.escape(title)}$", text, re.M)
    assert heading, f"README.md has no heading {title!r}"
    rest = text[heading.end() :]
    end = re.search(r"^#+ ", rest, re.M)
    return rest[: end.start() if end else None]


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.S)


# A process without pytest, as a reader's `pip install -e .` has none: the stand-in must not need it.
WITHOUT_PYTEST = "import runpy, sys; sys.modules['pytest'] = None; sys.argv = sys.argv[1:]; " \
                 "runpy.run_path(sys.argv[0], run_name='__main__')"  # fmt: skip


def test_the_readme_tour_runs_without_a_key_against_the_stand_in(tmp_path, monkeypatch):
    """Issue 63: against a generic test server the tour accepted 0 of 26 queries and `split`
    stopped, and the server that makes it work was named only on the Benchmarks page. The
    README's stand-in block (marked skip: it serves until stopped) is run as written, in a
    process without pytest, on a free port; then the tour's blocks, its `export` line replaced
    by the stand-in's as the README says, from a folder holding only the shipped sample."""
    [stand_in] = sh_blocks(readme_section("Without a key: a stand-in endpoint"))
    serve, export = [shlex.split(line, comments=True) for line in stand_in.strip().splitlines()]
    assert serve[:2] == ["python", "bench/capable_server.py"] and serve[-1] == "&", serve
    documented = serve[serve.index("--port") + 1]
    assert f"OPENAI_BASE_URL=http://127.0.0.1:{documented}/v1" in export, "the two lines name one port"
    with socket.socket() as probe:  # the documented port may be taken here
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    args = [port if word == documented else word for word in serve[1:-1]]
    server = subprocess.Popen([sys.executable, "-c", WITHOUT_PYTEST, *args], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        ready = server.stdout.readline()
        assert ready == f"READY http://127.0.0.1:{port}/v1\n", ready + server.stdout.read()
        clean_environment(monkeypatch)
        (tmp_path / "data" / "raw").mkdir(parents=True)
        (tmp_path / "data" / "raw" / "alpsbench_sample").symlink_to(SAMPLE_TASK1.parent)
        monkeypatch.chdir(tmp_path)
        shell = Shell(SimpleNamespace(base_url=ready.split()[1]), {"NO_COLOR": "1"})
        shell.run(export, "README.md (the stand-in's export)")
        tour, evaluation = sh_blocks(readme_section("A five-minute tour"))
        tour = "\n".join(line for line in tour.splitlines() if not line.startswith("export "))
        for number, block in enumerate((tour, evaluation)):
            shell(SimpleNamespace(parsed=block, path="README.md", line=f"tour block {number + 1}"))
    finally:
        server.kill()
        server.wait()
    accepted = [q for row in read_jsonl(tmp_path / "data/processed/queries.jsonl") for q in row["queries"]]
    assert {q["category"] for q in accepted} == {"ES", "HEQ", "SS"}
    splits = tmp_path / "data" / "processed" / "splits"
    for name in ("random/train", "random/test", "ood/train", "ood/test"):
        assert read_jsonl(splits / f"{name}.jsonl"), name
    assert (tmp_path / "data/processed/dataset/README.md").exists()
    assert (tmp_path / "runs" / "report.json").exists()


def test_the_readme_lists_every_command_page():
    """Issue 63: the README's list of the docs' pages left out extract-memories, gen-dialogues
    and export."""
    listed = readme_section("Documentation")
    pages = sorted((REPO / "docs" / "commands").glob("*.md"))
    missing = [page.stem for page in pages if page.stem not in listed]
    assert missing == []
