"""One options model: the stage commands, personaemp.toml and `personaemp run` agree.

The commands' options are generated from personaemp.options; these tests check the
generated Typer commands against the TOML sections (names, defaults, env vars), and run
every stage command and `personaemp run` with the stage functions replaced by recorders,
so that both sides are seen to pass the stage functions the same arguments.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, get_args

import pytest
import typer.main
from conftest import REPO, clean_environment
from typer.testing import CliRunner

from personaemp import options_page as page
from personaemp.catalogue import CLI_ONLY, COMMANDS
from personaemp.cli import app
from personaemp.config import llm_settings, load_config
from personaemp.llm.settings import LLMSettings
from personaemp.options import sections, show_default, specs
from personaemp.registry import RunOptions
from personaemp.results import StageResult
from personaemp.shared_options import LLMOptions, StepSampling

STAGE_OF = {
    "filter": "filter",
    "infer-persona": "persona",
    "gen-queries": "queries",
    "split": "split",
    "stats": "stats",
    "push": "push",
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    clean_environment(monkeypatch)
    monkeypatch.chdir(tmp_path)  # relative default paths land here, never in the repo


# --- the generated commands against the TOML sections -------------------------------------------


def click_command(name: str):
    return typer.main.get_command(app).commands[name]


def click_options(name: str) -> dict[str, Any]:
    """Option name -> click parameter, --help and the hidden earlier spellings left out."""
    return {p.name: p for p in click_command(name).params if p.name != "help" and not p.hidden}


def test_every_stage_option_is_a_toml_key_and_back():
    for command, names in COMMANDS.items():
        params = click_options(command)
        cli_only = {p.name for p in params.values() if set(p.opts) & set(CLI_ONLY[command])}
        assert len(cli_only) == len(CLI_ONLY[command]), command  # each listed CLI-only option exists
        keys = {option.name for section in names for option in specs(section)}
        assert set(params) - cli_only == keys, command
        assert keys == {name for section in names for name in sections()[section].model_fields}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_flags_defaults_and_env_vars_agree_with_the_model(command):
    params = click_options(command)
    for section in COMMANDS[command]:
        defaults = getattr(RunOptions(), section)
        for option in specs(section):
            param = params[option.name]
            spellings = [flag for part in option.flags for flag in part.split("/")]
            assert [*param.opts, *param.secondary_opts] == spellings, option.name
            assert param.envvar == option.opt.env, option.name
            toml_default = getattr(defaults, option.name)
            if option.kind == "bool":
                assert param.default is toml_default, option.name
            elif option.kind == "list":
                assert (param.default or None) == ([str(v) for v in toml_default or []] or None), option.name
            elif option.kind == "value":
                assert param.default == (show_default(toml_default) or None), option.name
            assert (param.default is None) == (toml_default in (None, [], {})), option.name


def test_the_existing_flag_spellings_are_kept():
    expected = {
        "filter": "--input -i --format --rules --output -o --benchmark-split --hf-config --on-error --turns "
        "--show-rules",
        "infer-persona": "--input -i --output -o --limit --users --require-depth --no-require-depth --show",
        "gen-queries": "--per-category --categories --enforce --limit --users",
        "split": "--input -i --out-dir -o --ood --no-ood --seed --test-size --k --k-min --k-max --holdout "
        "--seeds",
        "push": "--splits --repo-id --dry-run --out-dir --private --revision --include-dialogue",
    }
    llm = (
        "--base-url --model --llm --structured --concurrency --rpm --timeout --max-tokens --temperature "
        "--max-retries --max-reasks --work-dir --no-cache --refresh --retry-failed --price-in --price-out "
        "--seed --step"
    )
    for command, flags in expected.items():
        spelled = {flag for p in click_command(command).params for flag in [*p.opts, *p.secondary_opts]}
        assert set(flags.split()) <= spelled, command
        if "llm" in COMMANDS[command]:
            assert set(llm.split()) <= spelled, command


def test_the_api_key_is_no_option():
    for command in COMMANDS:
        spelled = {flag for p in click_command(command).params for flag in p.opts}
        assert not any("key" in flag or "token" in flag.replace("max-tokens", "") for flag in spelled)
    assert not any("key" in name for name in LLMOptions.model_fields)


def test_every_step_is_named_in_the_vocabulary():
    """The names themselves are declared once (personaemp/vocabulary.py); what is checked here is
    that the stages' Steps, the reward's fallback table and [llm.steps] use exactly them."""
    from personaemp import vocabulary
    from personaemp.dataset import dialogues, memories, persona, queries
    from personaemp.evaluation import criteria, evaluate, respond
    from personaemp.records import CATEGORIES
    from personaemp.training import reward

    stages = (memories, persona, queries, dialogues, criteria, respond, evaluate, reward)
    assert set(vocabulary.STEP_NAMES) == {step.name for stage in stages for step in stage.STEPS}
    assert set(reward.FALLBACKS) == set(get_args(vocabulary.Fallback))
    from personaemp.instruments import behaviours

    assert (tuple(behaviours.RISKY), tuple(behaviours.PROTECTIVE)) == (
        vocabulary.get_args(vocabulary.Risky),
        vocabulary.get_args(vocabulary.Protective),
    )
    assert set(vocabulary.STEP_KEYS) == set(StepSampling.model_fields)
    assert RunOptions().queries.categories == list(CATEGORIES)


def test_each_vocabulary_is_one_literal_and_its_tuple_derived():
    """No tuple of names is written twice: a module that needs one imports it from the vocabulary."""
    import ast

    from personaemp import vocabulary

    for name, value in vars(vocabulary).items():
        if name.isupper() and isinstance(value, tuple):
            assert any(get_args(literal) == value for literal in vars(vocabulary).values()), name
    known = {value for value in vars(vocabulary).values() if isinstance(value, tuple) and len(value) > 1}
    copies = []
    for path in (REPO / "personaemp").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            written = isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts)
            if written and tuple(e.value for e in node.elts) in known and path.name != "vocabulary.py":
                copies.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert copies == []


def test_llm_settings_defaults_are_the_options_defaults():
    """Each LLM default lives in one place: LLMSettings() is LLMOptions() seen by the engine."""
    assert LLMSettings() == llm_settings(LLMOptions(), env={})


def test_derived_defaults_match_the_static_ones():
    """A field's default is what its derivation gives under the default [paths]."""
    defaults = RunOptions()
    for section in sections():
        for option in specs(section):
            assert getattr(getattr(defaults, section), option.name) == option.default, option.name


# --- recording the stage calls -------------------------------------------------------------------


@pytest.fixture
def calls(monkeypatch) -> dict[str, tuple[tuple, dict]]:
    """Replace the five stage functions (and the summaries) by recorders."""
    from personaemp.dataset import filter, persona, publish, queries, split, stats

    recorded: dict[str, tuple[tuple, dict]] = {}

    def recorder(stage: str, result: Any):
        def record(*args, **kwargs):
            kwargs.pop("console", None)
            kwargs.pop("quality", None)  # push's agreement hook (review), not an option
            # Not an option: whether the report stands for the build. `run` says yes (its
            # limit sizes the build), a command leaves it to the stage (a limit = a quick look).
            full = kwargs.pop("full", None)
            assert full in (None, True)
            recorded[stage] = (args, kwargs)
            return result

        return record

    monkeypatch.setattr(filter, "filter_users", recorder("filter", StageResult("filter", None, None)))

    class RecordedFeed:
        """`run` streams the filter from a child process (streaming.py): its arguments are
        recorded here as the filter's call instead."""

        def __init__(self, filter_args):
            self.report = filter.filter_users(**filter_args).report

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            pass

    from personaemp.dataset import streaming

    monkeypatch.setattr(streaming, "FilterFeed", RecordedFeed)
    report = SimpleNamespace(estimate=None)  # what the summaries look at; they are stubbed too
    made = {stage: StageResult(stage, None, report) for stage in ("infer-persona", "gen-queries")}
    with_twin(monkeypatch, persona, "infer_personas", recorder("persona", made["infer-persona"]))
    with_twin(monkeypatch, queries, "generate_queries", recorder("queries", made["gen-queries"]))

    # `run` chains the two LLM stages on one engine: the stage plans get the arguments the
    # commands give the stage functions, and the chain the settings.
    def plan(stage: str):
        def make(*args, **kwargs):
            kwargs.pop("console", None)
            assert kwargs.pop("full", None) is True and kwargs.pop("chained", True) is True
            kwargs.pop("stream", None)  # the streamed filter's rows (RecordedFeed above)
            return SimpleNamespace(stage=stage, args=args, kwargs=kwargs, output=None, picked=set)

        return make

    def chain(first, second, handoff, final_input, *, settings, console=None, meanwhile=None):
        for stage in (first, second):
            recorded[stage.stage] = ((*stage.args, settings), stage.kwargs)
        return report, report

    from personaemp.llm import stage as llm_stage

    monkeypatch.setattr(persona, "persona_stage", plan("persona"))
    monkeypatch.setattr(queries, "queries_stage", plan("queries"))
    monkeypatch.setattr(llm_stage, "run_llm_chain", chain)
    monkeypatch.setattr(persona, "summarize", lambda *args: None)
    monkeypatch.setattr(queries, "funnel", lambda *args: None)
    monkeypatch.setattr(split, "split_users", recorder("split", StageResult("split", None, None)))
    monkeypatch.setattr(stats, "write_stats", recorder("stats", StageResult("stats", None, None)))
    pushed = SimpleNamespace(rows={}, target="somewhere", warnings=[])
    monkeypatch.setattr(publish, "publish", recorder("push", StageResult("push", None, pushed)))
    quiet_summaries(monkeypatch)
    stub_results(monkeypatch)
    return recorded


def quiet_summaries(monkeypatch) -> None:
    """No summaries: the stages' `print_summary` (and the shared pieces) print nothing."""
    import importlib

    from personaemp import catalogue, summaries
    from personaemp.dataset import filter as filter_stage

    for line in catalogue.LINES:
        module = importlib.import_module(f"personaemp.{line.module}")
        monkeypatch.setattr(module, "print_summary", lambda *args, **kwargs: None, raising=False)
    monkeypatch.setattr(filter_stage, "print_funnel", lambda *args, **kwargs: None)
    for name in dir(summaries):
        if name.startswith("print_"):
            monkeypatch.setattr(summaries, name, lambda *args, **kwargs: None)


def with_twin(monkeypatch, module, name: str, record) -> None:
    """Replace a stage function and its async twin (`a<name>`, what the commands await)."""

    async def arecord(*args, **kwargs):
        return record(*args, **kwargs)

    monkeypatch.setattr(module, name, record)
    monkeypatch.setattr(module, f"a{name}", arecord)


def stub_results(monkeypatch) -> None:
    """The recorders return stand-ins, not reports: their StageResults are stand-ins too."""
    from personaemp import results

    for name in dir(results):
        if name.startswith("of_"):
            monkeypatch.setattr(
                results, name, lambda report, *rest: results.StageResult("stub", None, report)
            )


def invoke(*args: Any, env: dict[str, str] | None = None):
    result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    assert result.exit_code == 0, result.output
    return result


def each_command(calls, *args: Any, env: dict[str, str] | None = None) -> dict[str, tuple[tuple, dict]]:
    """The stage calls of the five commands, each run with `args`."""
    seen = {}
    for command, stage in STAGE_OF.items():
        calls.clear()
        invoke(command, *args, env=env)
        seen[stage] = calls[stage]
    return seen


def run_all(calls, config: Path | None, env: dict[str, str] | None = None) -> dict[str, tuple[tuple, dict]]:
    calls.clear()
    invoke("run", *(["--config", config] if config else []), env=env)
    assert set(calls) == set(STAGE_OF.values())
    return dict(calls)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def toml_text(sections: dict[str, dict[str, Any]]) -> str:
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        tables = []
        for key, value in values.items():
            if isinstance(value, dict):
                tables.extend((f"[{section}.{key}.{name}]", table) for name, table in value.items())
            elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                tables.extend((f"[[{section}.{key}]]", table) for table in value)  # an array of tables
            elif value is not None:
                lines.append(f"{key} = {toml_value(value)}")
        for name, table in tables:
            lines.append(name)
            lines.extend(f"{k} = {toml_value(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"


def cli_args(section: str, values: dict[str, Any]) -> list[str]:
    """The flags that set `values`, spelled as the generated command takes them."""
    args: list[str] = []
    for option in specs(section):
        if option.name not in values:
            continue
        value = values[option.name]
        if value is None:  # an unset option has no flag
            continue
        on, _, off = option.flags[0].partition("/")
        if option.kind == "bool":
            args.append(on if value else off)
        elif option.kind == "list":
            for item in value:
                shown = ";".join(f"{k}={v}" for k, v in item.items()) if isinstance(item, dict) else str(item)
                args += [option.flag, shown]
        elif option.kind == "dict":
            for step, table in value.items():
                for key, item in table.items():
                    args += [option.flag, f"{step}.{key}={item}"]
        else:
            args += [option.flag, str(value)]
    return args


def test_run_with_the_default_toml_calls_the_stages_as_the_commands_do(calls, tmp_path):
    defaults = RunOptions().model_dump()
    del defaults["push"]["criteria"]  # a file named is one push must publish
    del defaults["push"]["dialogues"]  # ... and must exist
    config = tmp_path / "defaults.toml"
    config.write_text(toml_text(defaults), encoding="utf-8")
    assert load_config(config) == RunOptions()

    by_commands = each_command(calls)
    assert run_all(calls, config) == by_commands
    assert run_all(calls, None) == by_commands
    assert each_command(calls, "--config", config) == by_commands

    # the defaults the two sides used to disagree on
    assert by_commands["split"][1]["ood"] is True
    assert by_commands["push"][1]["out"] == Path("data/processed/dataset")
    assert by_commands["stats"][0] == (Path("data/processed"), Path("data/processed/stats"), False)
    assert by_commands["push"][1]["repo_id"] is None
    assert by_commands["filter"][1]["keep_turns"] == "user"
    settings = by_commands["persona"][0][2]
    assert settings.work_dir == Path("data/processed/.personaemp")
    assert settings.temperature == 0.7 and settings.use_cache and settings.steps == {}


# A value other than the default for every option of every section.
NON_DEFAULT: dict[str, dict[str, Any]] = {
    "extract": {
        "input": "logs/chats.jsonl",
        "format": "messages",
        "output": "e/memories.jsonl",
        "user_field": "account",
        "user_column": "speaker",
        "session_column": "chat",
        "order_column": "position",
        "role_column": "author",
        "text_column": "body",
        "time_column": "sent_at",
        "time_format": "%d.%m.%Y %H:%M",
        "max_sessions": 9,
        "max_turns": 99,
        "max_turn_chars": 999,
        "max_user_chars": 9999,
        "on_error": "skip",
        "compare_gold": "gold/reference_output.jsonl",
        "match_threshold": 0.5,
        "alpsbench_predictions": True,
        "limit": 3,
        "users": ["u1", "u2"],
        "shard": "1/2",
    },
    "filter": {
        "input": "raw/task1",
        "format": "raw",
        "rules": "my_rules.toml",
        "output": "f/filtered.jsonl",
        "benchmark_split": "dev",
        "hf_config": "task1",
        "on_error": "skip",
        "turns": "all",
        "force": True,
    },
    "llm": {
        "base_url": ["http://a.example/v1", "http://b.example/v1"],
        "model": "m",
        "llm": "remote",
        "structured": "json_object",
        "concurrency": 3,
        "rpm": 30.0,
        "timeout": 9.5,
        "max_tokens": 256,
        "temperature": 0.2,
        "seed": 7,
        "steps": {"check": {"temperature": 0.0, "max_tokens": 512}, "persona": {"temperature": 1.0}},
        "max_retries": 1,
        "max_reasks": 0,
        "work_dir": "w",
        "no_cache": True,
        "refresh": True,
        "retry_failed": True,
        "price_in": 1.5,
        "price_out": 2.5,
        "price_cached": 0.25,
        "cache_rule": "openai",
        "max_cost": 3.0,
        "estimate": False,
        "batch": None,
        "executor": "ray",
        "workers": 3,
        "ray_address": "ray://head:10001",
        "vllm": {"engine": {"max_model_len": 8192, "dtype": "bfloat16"}, "processor": {"batch_size": 32}},
    },
    "persona": {
        "input": "p/in.jsonl",
        "output": "p/out.jsonl",
        "limit": 3,
        "users": ["u1", "u2"],
        "require_depth": False,
        "enforce": ["level_matches_rationale"],
        "shard": None,  # `run` refuses a shard: see test_a_shard_reaches_the_stage_and_run_refuses_it
        "force": True,
    },
    "queries": {
        "input": "q/in.jsonl",
        "output": "q/out.jsonl",
        "per_category": 2,
        "categories": ["ES", "SS"],
        "enforce": ["length_ok", "not_duplicate"],
        "limit": 2,
        "users": ["u3"],
        "shard": None,
        "force": True,
    },
    "split": {
        "input": "s/in.jsonl",
        "out_dir": "s/out",
        "ood": False,
        "seed": 5,
        "test_size": 0.2,
        "k": 3,
        "k_min": 3,
        "k_max": 6,
        "holdout": 1,
        "seeds": 2,
        "force": True,
    },
    "stats": {"processed": "x/build", "out_dir": "x/stats", "force": True},
    "push": {
        "splits": "s/out",
        "repo_id": "me/data",
        "dry_run": False,
        "out_dir": "d",
        "private": True,
        "revision": "dev",
        "include_dialogue": True,
        "criteria": "c/crit.jsonl",
        "dialogues": ["s/dialogues.jsonl"],
        "dialogues_report": "s/eval.json",
        "force": True,
    },
    "criteria": {
        "input": "c/in.jsonl",
        "output": "c/out.jsonl",
        "limit": 4,
        "users": ["u9"],
        "layout": "shared",
    },
    "respond": {
        "splits": "r/splits",
        "split": "ood",
        "part": "train",
        "context": "rag",
        "rag_k": 5,
        "mismatch_seed": 9,
        "output": "r/out.jsonl",
        "limit": 7,
    },
    "evaluate": {
        "splits": "e/splits",
        "split": "ood",
        "part": "train",
        "responses": ["a.jsonl", "b.jsonl"],
        "dialogues": ["d1.jsonl"],
        "per_turn": True,
        "behaviours": False,
        "all_dialogues": True,
        "criteria": "e/criteria.jsonl",
        "judge_model": "judge",
        "judges": [
            {"name": "a", "model": "m1", "base_url": "http://127.0.0.1:9/v1", "key_env": "JUDGE_A_KEY"},
            {"name": "b"},
        ],
        "missing": "floor",
        "unreadable": "fail",
        "layout": "shared",
        "dynamic": True,
        "samples": 8,
        "bystander": True,
        "reward_lambda": 0.25,
        "output": "e/report.json",
    },
    "fidelity": {
        "input": "d/users.jsonl",
        "output": "d/fidelity.jsonl",
        "cuts": 2,
        "cut_seed": 3,
        "context": ["none", "full"],
        "voice": 0,
        "discriminator": True,
        "limit": 4,
    },
    "dialogues": {
        "input": "d/queries.jsonl",
        "output": "d/dialogues.jsonl",
        "limit": 3,
        "per_user": 1,
        "max_turns": 4,
        "context": "rag",
        "rag_k": 2,
        "mismatch_seed": 5,
        "supporter_model": "policy",
        "supporter_base_url": ["http://s.example/v1"],
        "turn_attempts": 2,
        "character_check": False,
        "voice": 0,
        "seeker": "auto",
    },
    "export": {
        "splits": "x/splits",
        "split": "ood",
        "part": "test",
        "format": "verl",
        "context": "persona",
        "rag_k": 4,
        "mismatch_seed": 2,
        "summaries": "x/summaries.jsonl",
        "criteria": "x/criteria.jsonl",
        "data_source": "mine",
        "dialogues": True,
        "output": "x/out.parquet",
    },
    "table": {
        "reports": ["t/random.json", "t/ood.json"],
        "format": "latex",
        "output": "t/table1.tex",
        "harmonic": True,
        "digits": 3,
        "judge": "gpt",
        "systems": ["none", "rag"],
    },  # fmt: skip
    "review": {
        "input": "v/q.jsonl",
        "labels": "v/labels.jsonl",
        "size": 9,
        "seed": 4,
        "host": "0.0.0.0",
        "port": 9001,
        "dialogues": ["v/a.jsonl", "v/b.jsonl"],
        "fidelity": "d/fidelity.jsonl",
    },  # fmt: skip
    "agreement": {
        "input": "g/q.jsonl",
        "labels": "g/labels.jsonl",
        "second_judge": "g/second.jsonl",
        "judge_model": "other",
        "judge_base_url": ["http://c.example/v1"],
        "out": "g/out",
        "resamples": 500,
        "bootstrap_seed": 3,
        "dialogues": ["g/a.jsonl", "g/b.jsonl"],
        "fidelity": "d/fidelity.jsonl",
    },
}


def test_the_non_default_values_cover_every_option():
    defaults = RunOptions()
    for section in COMMANDS.values():
        for name in section:
            assert set(NON_DEFAULT[name]) == set(sections()[name].model_fields), name
    for name, values in NON_DEFAULT.items():
        for key, value in values.items():
            # dry_run keeps its default (with a repo_id); estimate (`run` refuses it) and batch
            # (which excludes the no_cache and refresh set here) too
            if key not in ("dry_run", "estimate", "batch", "shard"):
                assert value != getattr(getattr(defaults, name), key), f"{name}.{key}"


def test_every_option_reaches_the_stage_the_same_way_from_flags_toml_and_run(calls, tmp_path):
    """BUG: holdout, revision, hf_config, turns, retry_failed, no_cache, refresh existed on
    one side only."""
    config = tmp_path / "all.toml"
    config.write_text(toml_text(NON_DEFAULT), encoding="utf-8")
    (tmp_path / "s").mkdir()  # the cwd: push checks that a dialogues file named exists and holds one
    (tmp_path / "s" / "dialogues.jsonl").write_text("{}\n", encoding="utf-8")

    by_run = run_all(calls, config)
    by_config = each_command(calls, "--config", config)
    by_flags = {}
    for command, stage in STAGE_OF.items():
        calls.clear()
        sections = COMMANDS[command]
        invoke(command, *(arg for section in sections for arg in cli_args(section, NON_DEFAULT[section])))
        by_flags[stage] = calls[stage]
    assert by_config == by_run
    assert by_flags == by_run

    args, kwargs = by_run["filter"]
    assert args == ()
    assert kwargs == {
        "source": "raw/task1",
        "output": Path("f/filtered.jsonl"),
        "fmt": "raw",
        "rules_path": Path("my_rules.toml"),
        "split": "dev",
        "hf_config": "task1",
        "on_error": "skip",
        "keep_turns": "all",
        "report_path": Path("f/filter_report.json"),
        "force": True,
    }
    args, kwargs = by_run["persona"]
    assert args[:2] == (Path("p/in.jsonl"), Path("p/out.jsonl"))
    assert kwargs == {
        "limit": 3, "users": ["u1", "u2"], "retry_failed": True, "require_depth": False,
        "enforce": ["level_matches_rationale"], "shard": None,
    }  # fmt: skip
    settings = args[2]
    assert settings.base_urls == ["http://a.example/v1", "http://b.example/v1"]
    assert (settings.model, settings.llm, settings.structured) == ("m", "remote", "json_object")
    assert (settings.concurrency, settings.rpm, settings.timeout) == (3, 30.0, 9.5)
    assert (settings.max_tokens, settings.temperature, settings.seed) == (256, 0.2, 7)
    assert settings.steps == NON_DEFAULT["llm"]["steps"]
    assert (settings.max_retries, settings.max_reasks, settings.work_dir) == (1, 0, Path("w"))
    assert (settings.use_cache, settings.refresh) == (False, True)
    assert (settings.price_in, settings.price_out, settings.price_cached) == (1.5, 2.5, 0.25)
    assert settings.cache_rule == "openai"
    assert (settings.executor, settings.workers, settings.ray_address) == ("ray", 3, "ray://head:10001")
    assert settings.vllm == NON_DEFAULT["llm"]["vllm"]  # typed alike from flags, TOML and run
    args, kwargs = by_run["queries"]
    assert args[:2] == (Path("q/in.jsonl"), Path("q/out.jsonl")) and args[2] == settings
    assert kwargs["options"].categories == ("ES", "SS") and kwargs["options"].per_category == 2
    assert kwargs["options"].enforce == ("length_ok", "not_duplicate")
    assert (kwargs["limit"], kwargs["users"], kwargs["retry_failed"]) == (2, ["u3"], True)
    assert by_run["split"] == (
        (Path("s/in.jsonl"), Path("s/out")),
        {"ood": False, "seed": 5, "test_size": 0.2, "k": 3, "k_range": (3, 6), "holdout": 1, "seeds": 2,
         "force": True},
    )  # fmt: skip
    assert by_run["stats"] == ((Path("x/build"), Path("x/stats"), True), {})
    assert by_run["push"] == (
        (Path("s/out"),),
        {"repo_id": "me/data", "out": None, "private": True, "revision": "dev", "include_dialogue": True,
         "criteria": Path("c/crit.jsonl"), "dialogues": [Path("s/dialogues.jsonl")],
         "dialogues_report": Path("s/eval.json"), "force": True},
    )  # fmt: skip


def test_env_vars_reach_the_commands_and_run_alike(calls, tmp_path):
    env = {
        "PERSONAEMP_INPUT": "env/input",
        "OPENAI_BASE_URL": "http://x.example/v1,http://y.example/v1",
        "PERSONAEMP_MODEL": "env-model",
        "PERSONAEMP_CONCURRENCY": "4",
        "PERSONAEMP_WORK_DIR": str(tmp_path / "work"),
        "OPENAI_API_KEY": "sk-env-key-1234",
    }
    config = tmp_path / "p.toml"
    config.write_text('[llm]\nmodel = "file-model"\nconcurrency = 9\n[paths]\ninput = "file/input"\n')

    by_commands = each_command(calls, "--config", config, env=env)
    assert run_all(calls, config, env=env) == by_commands
    assert by_commands["filter"][1]["source"] == "env/input"
    settings = by_commands["persona"][0][2]
    assert settings.base_urls == ["http://x.example/v1", "http://y.example/v1"]
    assert (settings.model, settings.concurrency) == ("env-model", 4)
    assert settings.work_dir == tmp_path / "work"
    assert settings.api_key == "sk-env-key-1234"

    # a flag wins over the env var
    calls.clear()
    invoke("infer-persona", "--concurrency", "2", "--model", "flag-model", env=env)
    settings = calls["persona"][0][2]
    assert (settings.model, settings.concurrency) == ("flag-model", 2)


# --- defaults that used to differ ---------------------------------------------------------------


def test_split_makes_the_ood_split_by_default(calls):
    """BUG: `split` made the OOD split only with --ood; `run` always did."""
    invoke("split")
    assert calls["split"][1]["ood"] is True
    invoke("split", "--no-ood")
    assert calls["split"][1]["ood"] is False


def test_push_dry_run_without_out_goes_to_the_processed_dataset_folder(calls):
    """BUG: `push --dry-run` needed --out (now --out-dir); `run` dry-ran into <processed>/dataset."""
    invoke("push", "--dry-run")
    assert calls["push"] == (
        (Path("data/processed/splits"),),
        {"repo_id": None, "out": Path("data/processed/dataset"), "private": False, "revision": None,
         "include_dialogue": False, "criteria": Path("data/processed/criteria.jsonl"),
         "dialogues": [Path("data/processed/dialogues.jsonl")], "dialogues_report": None, "force": False},
    )  # fmt: skip


def test_push_without_repo_id_is_a_dry_run_as_in_run(calls):
    invoke("push")
    assert calls["push"][1]["repo_id"] is None and calls["push"][1]["out"] == Path("data/processed/dataset")
    invoke("push", "--repo-id", "me/data")
    assert calls["push"][1]["repo_id"] == "me/data" and calls["push"][1]["out"] is None


# --- per-step sampling and the seed -------------------------------------------------------------


def test_step_flag_and_toml_steps_reach_the_settings(calls, tmp_path):
    steps = ("--step", "check.temperature=0", "--step", "situations.max_tokens=300")
    invoke("infer-persona", *steps, "--seed", "11")
    settings = calls["persona"][0][2]
    assert settings.steps == {"check": {"temperature": 0.0}, "situations": {"max_tokens": 300}}
    assert settings.seed == 11

    config = tmp_path / "p.toml"
    config.write_text("[llm.steps.check]\ntemperature = 0.0\nmax_tokens = 512\n")
    invoke("run", "--config", config)
    assert calls["persona"][0][2].steps == {"check": {"temperature": 0.0, "max_tokens": 512}}
    assert calls["queries"][0][2].steps == {"check": {"temperature": 0.0, "max_tokens": 512}}

    # a flag sets one key of a step; the file's other keys stay
    invoke("gen-queries", "--config", config, "--step", "check.temperature=0.3")
    assert calls["queries"][0][2].steps == {"check": {"temperature": 0.3, "max_tokens": 512}}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--step", "chek.temperature=0"], "--step chek must be 'persona', 'situations', 'check',"),
        (["--step", "check.temprature=0"], "--step check.temprature is not a known key"),
        (["--step", "check.temperature=hot"], "--step check.temperature must be a number, not 'hot'"),
        (["--step", "check.max_tokens=0"], "--step check.max_tokens must be at least 1"),
        (["--step", "check=0"], "--step takes STEP.KEY=VALUE"),
    ],
)
def test_bad_step_flags_exit_2_with_one_line(calls, args, message):
    result = CliRunner().invoke(app, ["infer-persona", *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().startswith(f"Error: {message}")
    assert len(result.stderr.strip().splitlines()) == 1
    assert calls == {}


# --- one-line errors, exit 2, nothing run -------------------------------------------------------


@pytest.mark.parametrize("command", ["infer-persona", "gen-queries", "run"])
def test_a_bad_concurrency_env_var_exits_2_with_one_line(calls, command):
    """BUG: PERSONAEMP_CONCURRENCY=abc exited 2 on the CLI but was a traceback in `run`."""
    result = CliRunner().invoke(app, [command], env={"PERSONAEMP_CONCURRENCY": "abc"})
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == "Error: PERSONAEMP_CONCURRENCY must be a whole number, not 'abc'"
    assert "Traceback" not in result.output
    assert calls == {}


def test_an_unused_bad_env_var_does_not_stop_a_stage_without_llm(calls):
    invoke("split", env={"PERSONAEMP_CONCURRENCY": "abc"})
    assert "split" in calls


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["infer-persona", "--limit", "0"], "--limit must be at least 1"),
        (["gen-queries", "--limit", "0"], "--limit must be at least 1"),
        (["infer-persona", "--limit", "many"], "--limit must be a whole number, not 'many'"),
        (["infer-persona", "--concurrency", "0"], "--concurrency must be at least 1"),
        (
            ["infer-persona", "--llm", "cloud"],
            "--llm must be 'auto', 'local', 'remote' or 'vllm', not 'cloud'",
        ),
        (["infer-persona", "--llm", "remote"], "--llm is 'remote' but no endpoint is set"),
        (["gen-queries", "--enforce", ""], "--enforce is empty"),
        (["gen-queries", "--enforce", "length_ok,bogus"], "--enforce must be 'emotional_support'"),
        (["gen-queries", "--categories", "ES,XX"], "--categories must be 'ES', 'HEQ' or 'SS', not 'XX'"),
        (["gen-queries", "--per-category", "0"], "--per-category must be at least 1"),
        (["split", "--k-min", "5", "--k-max", "3"], "--k-min must be at most --k-max"),
        (["split", "--test-size", "1"], "--test-size must be less than 1"),
        (["split", "--seeds", "0"], "--seeds must be at least 1"),
        (["split", "--k", "1"], "--k must be at least 2"),
        (["push", "--dry-run", "--repo-id", "me/x"], "--dry-run and --repo-id exclude each other"),
        (["push", "--repo-id", "nothing"], "--repo-id must look like OWNER/NAME"),
        (["filter", "--on-error", "ignore"], "--on-error must be 'fail' or 'skip', not 'ignore'"),
    ],
)
def test_bad_flags_exit_2_with_one_line(calls, args, message):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().startswith(f"Error: {message}")
    assert len(result.stderr.strip().splitlines()) == 1
    assert calls == {}


@pytest.mark.parametrize(
    ("commands", "text", "message"),
    [
        (["run", "gen-queries"], "[queries]\nenforce = []\n", "queries.enforce is empty"),
        (["run", "split"], "[split]\nseeed = 3\n", "split.seeed is not a known key"),
        (["run", "infer-persona"], "[llm]\ntemprature = 0.1\n", "llm.temprature is not a known key"),
        (["run", "infer-persona"], "[persona]\nlimit = 0\n", "persona.limit must be at least 1"),
        (["run", "push"], "[pipeline]\nx = 1\n", "[pipeline] is not a known section"),
        (["run", "filter"], "[llm]\nkey = 'sk-x'\n", "secrets do not belong in a file (llm.key)"),
    ],
)
def test_bad_toml_exits_2_naming_the_key(calls, tmp_path, commands, text, message):
    config = tmp_path / "p.toml"
    config.write_text(text)
    for command in commands:
        result = CliRunner().invoke(app, [command, "--config", str(config)])
        assert result.exit_code == 2, result.output
        assert result.stderr.strip().startswith(f"Error: {config}: {message}")
        assert len(result.stderr.strip().splitlines()) == 1
        assert calls == {}


def test_a_command_resolves_only_the_sections_it_uses(calls, tmp_path):
    """A stage command validates its own section, [llm] if it calls an LLM, and the
    sections its default paths come from; `run` validates every section before it starts."""
    config = tmp_path / "p.toml"
    config.write_text("[split]\nseeed = 3\n")
    invoke("infer-persona", "--config", config)
    assert "persona" in calls


def test_a_flag_overrides_a_bad_file_value_only_for_its_own_key(calls, tmp_path):
    config = tmp_path / "p.toml"
    config.write_text("[persona]\nlimit = 0\n")
    invoke("infer-persona", "--config", config, "--limit", "2")
    assert calls["persona"][1]["limit"] == 2


# --- the options page of the docs ---------------------------------------------------------------


def test_the_docs_option_tables_are_generated_from_the_models():
    text = (REPO / "docs" / "options.md").read_text(encoding="utf-8")
    assert text.count(page.BEGIN) == 1 and text.count(page.END) == 1
    hint = "run: python -m personaemp.registry docs/options.md"
    assert page.readme_block(text) == page.markdown_tables(), hint
    # One copy of the tables: the README (the PyPI page) links to the docs instead.
    assert page.BEGIN not in (REPO / "README.md").read_text(encoding="utf-8")


def test_the_tables_list_every_option_with_its_flag_key_env_and_default():
    tables = page.markdown_tables()
    for section in sections():
        for option in specs(section):
            assert f"`{option.name}`" in tables
            if section not in ("paths", "reward"):  # TOML only: no command has their flags
                assert f"`{option.flag}`" in tables
            if option.opt.env:
                assert f"`{option.opt.env}`" in tables
    for command in COMMANDS:
        for flag in CLI_ONLY[command]:
            assert f"`{flag}`" in tables


def test_update_readme_rewrites_only_the_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{page.BEGIN}\nstale\n{page.END}\noutro\n", encoding="utf-8")
    assert page.update_readme(readme) is True
    text = readme.read_text(encoding="utf-8")
    assert text.startswith(f"intro\n{page.BEGIN}\n") and text.endswith(f"{page.END}\noutro\n")
    assert page.readme_block(text) == page.markdown_tables()
    assert page.update_readme(readme) is False


def test_the_benchmark_commands_get_the_same_arguments_from_flags_and_config(monkeypatch, tmp_path):
    """criteria, respond and evaluate are not part of `run`; their flags and their TOML
    sections must still reach the stage function identically."""
    monkeypatch.setenv("JUDGE_A_KEY", "sk-judge-a")
    from personaemp.evaluation import criteria, evaluate, respond

    calls: dict[str, tuple] = {}

    def recorder(name, result):
        def record(*args, **kwargs):
            kwargs.pop("console", None)
            calls[name] = (tuple(a for a in args if not isinstance(a, LLMSettings)), kwargs)
            return result

        return record

    evaluation = {"systems": {}, "split": "", "part": "", "judge_model": "", "mode": "", "lambda": 0.5,
                  "scores_file": ""}  # fmt: skip
    report = SimpleNamespace(estimate=None, batch=None)  # what the commands look at after a stage
    made = {stage: StageResult(stage, None, report) for stage in ("criteria", "respond")}
    with_twin(monkeypatch, criteria, "write_criteria", recorder("criteria", made["criteria"]))
    with_twin(monkeypatch, respond, "write_responses", recorder("respond", made["respond"]))
    evaluated = StageResult("evaluate", None, None, evaluation)
    with_twin(monkeypatch, evaluate, "evaluate", recorder("evaluate", evaluated))
    quiet_summaries(monkeypatch)
    stub_results(monkeypatch)
    config = tmp_path / "bench.toml"
    # --dialogues is evaluate's other evaluation (evaluation/dialogues.py, tests/integration/test_sessions.py)
    dialogue_only = ("dialogues", "per_turn", "all_dialogues", "behaviours")
    single = {k: v for k, v in NON_DEFAULT["evaluate"].items() if k not in dialogue_only}
    sections = {"criteria": NON_DEFAULT["criteria"], "respond": NON_DEFAULT["respond"], "evaluate": single}
    config.write_text(toml_text(sections), encoding="utf-8")
    for command in ("criteria", "respond", "evaluate"):
        invoke(command, "--config", config)
        by_config = calls.pop(command)
        invoke(command, *cli_args(command, sections[command]))
        assert calls.pop(command) == by_config, command
    invoke("respond", "--config", config)
    args, kwargs = calls["respond"]
    assert args == (Path("r/splits"), Path("r/out.jsonl"))
    assert kwargs == {"split": "ood", "part": "train", "context": "rag", "rag_k": 5, "mismatch_seed": 9,
                      "limit": 7, "retry_failed": False}  # fmt: skip
    invoke("evaluate", "--config", config)
    args, kwargs = calls["evaluate"]
    assert args == (Path("e/splits"), [Path("a.jsonl"), Path("b.jsonl")], Path("e/report.json"))
    assert kwargs["judge_model"] == "judge" and kwargs["criteria_file"] == Path("e/criteria.jsonl")
    assert kwargs["options"] == evaluate.JudgeOptions(
        dynamic=True,
        samples=8,
        bystander=True,
        reward_lambda=0.25,
        missing="floor",
        unreadable="fail",
        layout="shared",
    )
    a, b = kwargs["judges"]
    assert (a.name, a.settings.model, a.settings.base_urls, a.settings.api_key) == (
        "a",
        "m1",
        ["http://127.0.0.1:9/v1"],
        "sk-judge-a",
    )
    assert (b.name, b.settings.model) == ("b", "judge"), "the panel's default model: --judge-model"
    monkeypatch.delenv("JUDGE_A_KEY")
    result = CliRunner().invoke(app, ["evaluate", "--config", str(config)])
    assert result.exit_code == 1 and "judge a: $JUDGE_A_KEY is not set" in result.output


def test_a_shard_reaches_the_stage_and_run_refuses_it(calls, tmp_path):
    for command, stage in (("infer-persona", "persona"), ("gen-queries", "queries")):
        calls.clear()
        invoke(command, "--shard", "2/3")
        assert calls[stage][1]["shard"] == "2/3"
        config = tmp_path / f"{stage}.toml"
        config.write_text(f'[{stage}]\nshard = "1/4"\n', encoding="utf-8")
        calls.clear()
        invoke(command, "--config", config)
        assert calls[stage][1]["shard"] == "1/4"
        calls.clear()
        result = CliRunner().invoke(app, ["run", "--config", str(config)])
        assert result.exit_code == 2 and "run does not work on shards" in result.output
        assert calls == {}, "refused before any stage ran"
    result = CliRunner().invoke(app, ["infer-persona", "--shard", "two"])
    assert result.exit_code == 2 and "shard" in result.output
