"""`run` takes any stage option with --set and says which key a stage flag is; a config
saved with a byte order mark is read (issue 44: "a newcomer's second run")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from personaemp.config import load_config, read_config, set_flags
from personaemp.errors import InputError


def personaemp(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "personaemp", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=cwd,
    )


def test_set_gives_run_any_key_of_any_section_over_the_file(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[persona]\nlimit = 5\n[llm]\ntemperature = 0.0\n")
    options = load_config(
        config, env={}, settings=["persona.limit=2", "llm.base-url=http://a/v1", "llm.base_url=http://b/v1"]
    )
    assert options.persona.limit == 2  # over the file
    assert options.llm.temperature == 0.0  # the file, where --set says nothing
    assert options.llm.base_url == ["http://a/v1", "http://b/v1"]  # a list key: once per value
    assert load_config(config, env={}).persona.limit == 5


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("persona.limt=2", "[persona] has no key 'limt' — its keys: input, output, limit"),
        ("personas.limit=2", "[personas] is not a known section"),
        ("persona.limit", "--set takes SECTION.KEY=VALUE (e.g. persona.limit=8), not 'persona.limit'"),
        ("llm.steps=check", "llm.steps is a table — set it in the config file"),
    ],
)
def test_set_refuses_what_is_not_a_key_in_one_line(item, message):
    with pytest.raises(InputError) as caught:
        set_flags([item])
    assert message in str(caught.value)


def test_a_bad_value_given_with_set_is_named_as_given(tmp_path):
    with pytest.raises(InputError, match=r"--set persona.limit must be at least 1"):
        load_config(None, env={}, settings=["persona.limit=0"])


def test_run_given_a_stage_flag_says_which_key_it_is(tmp_path):
    """Before: "No such option: --limit" and nothing else, though the README said run takes
    the stage options."""
    result = personaemp(tmp_path, "run", "--limit", "3")
    assert result.returncode == 2
    text = " ".join(result.stderr.replace("│", " ").split())
    assert "--limit is extract.limit, persona.limit, queries.limit for run: --set extract.limit=..." in text
    help_text = personaemp(tmp_path, "run", "--help").stdout
    assert "--set" in help_text and "extract-memories" in help_text


def test_a_config_with_a_byte_order_mark_is_read(tmp_path):
    """Before: "not valid TOML (Invalid statement (at line 1, column 1))" for a file saved by Notepad."""
    config = tmp_path / "personaemp.toml"
    config.write_bytes(b"\xef\xbb\xbf" + (REPO / "personaemp.toml").read_bytes())
    assert read_config(config)["persona"]["require_depth"] is False


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ('[run]\nexecutor = "ray"\n', "write [llm] executor"),  # as the Ray issue first spelled it
        ("[run]\nworkers = 4\nray_address = 'ray://h:10001'\n", "write [llm] ray_address, [llm] workers"),
        ("[foo]\nbar = 1\n", "use paths, extract, filter, llm"),
        ("[run]\ninput = 'x'\n", "use paths, extract, filter, llm"),  # a key of many sections
    ],
)
def test_an_unknown_section_says_where_its_keys_live(tmp_path, text, hint):
    path = tmp_path / "personaemp.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match="is not a known section") as caught:
        read_config(path)
    assert caught.value.hint.startswith(hint)
