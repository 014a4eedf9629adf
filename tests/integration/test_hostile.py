"""A hostile environment and inputs that cannot be right: every failure is one line with the
path and what to do (exit 2 for a bad path or input, 1 for the machine), no traceback; a
damaged file the toolkit rewrites is kept aside; a torn last line is cut back, not blamed.

The disk cases mount a small tmpfs (full) or a read-only one: root only (CI runs as root)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import REPO, SAMPLE_TASK1, read_jsonl, write_jsonl
from typer.testing import CliRunner

from personaemp.cli import app


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"OPENAI_API_KEY": "sk-test"})


def one_line(result, code: int, *words: str) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and "Error" in result.stderr, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    for word in words:
        assert word in errors[0], (word, errors[0])
    return errors[0]


@pytest.fixture(scope="module")
def server():
    """The capable fake endpoint in a process of its own: its thread's complaints about
    connections a stopped run dropped must not show in the output under test."""
    process = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "capable_server.py")], stdout=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("READY "), line
        yield line.split()[1]
    finally:
        process.kill()
        process.wait()


def llm(server: str) -> list[str]:
    return ["--base-url", server, "--model", "fake", "--max-retries", "0"]


@pytest.fixture
def filtered(tmp_path) -> Path:
    output = tmp_path / "p" / "filtered.jsonl"
    result = invoke("filter", "--input", SAMPLE_TASK1, "--output", output)
    assert result.exit_code == 0, result.output
    return output


def mount(target: Path, options: str) -> Path:
    target.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True)
    if done.returncode:
        pytest.skip(f"needs root to mount a tmpfs ({done.stderr.decode().strip()})")
    return target


@pytest.fixture
def small_disk(tmp_path):
    folder = mount(tmp_path / f"full-{uuid.uuid4().hex[:6]}", "size=48k")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def read_only(tmp_path):
    folder = mount(tmp_path / f"ro-{uuid.uuid4().hex[:6]}", "size=64k,ro")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


# --- OS errors: one line ------------------------------------------------------------------------


def test_a_read_only_output_folder_is_one_line(read_only):
    result = invoke("filter", "--input", SAMPLE_TASK1, "--output", read_only / "f.jsonl")
    one_line(result, 2, str(read_only), "read-only")


@pytest.mark.parametrize("where", ["--output", "--work-dir"])
def test_a_read_only_folder_under_an_llm_stage_is_one_line(server, filtered, tmp_path, read_only, where):
    paths = {"--output": tmp_path / "p.jsonl", "--work-dir": tmp_path / "work"}
    paths[where] = read_only / "here"
    result = invoke("infer-persona", "-i", filtered, "-o", paths["--output"],
                    "--work-dir", paths["--work-dir"], *llm(server))  # fmt: skip
    one_line(result, 2, str(read_only), "read-only")


def test_a_full_disk_under_the_filter_is_one_line_naming_the_file(small_disk):
    result = invoke("filter", "--input", SAMPLE_TASK1, "--output", small_disk / "f.jsonl")
    one_line(result, 1, "f.jsonl", "no space left", "finished rows are kept")
    assert [p.name for p in small_disk.iterdir() if p.name.endswith(".tmp")] == []


def test_a_full_disk_under_the_cache_is_one_line(server, filtered, small_disk):
    result = invoke("infer-persona", "-i", filtered, "-o", filtered.with_name("personas.jsonl"),
                    "--work-dir", small_disk / "work", *llm(server))  # fmt: skip
    one_line(result, 1, "no space left")


def test_a_full_disk_under_the_output_is_one_line_and_a_rerun_resumes(server, filtered, tmp_path):
    disk = mount(tmp_path / "out-disk", "size=24k")
    try:
        output = disk / "personas.jsonl"
        args = ["infer-persona", "-i", filtered, "-o", output, "--work-dir", tmp_path / "work", *llm(server)]
        result = invoke(*args)
        one_line(result, 1, "no space left", str(disk))
        kept = read_jsonl(output) if output.exists() else []
        subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)
        again = invoke(*args)
        assert again.exit_code == 0, again.output
        rows = read_jsonl(output)
        assert len(rows) == 16 and {r["user_id"] for r in kept} <= {r["user_id"] for r in rows}
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_an_output_that_is_a_folder_is_one_line(tmp_path):
    (tmp_path / "f.jsonl").mkdir()
    result = invoke("filter", "--input", SAMPLE_TASK1, "--output", tmp_path / "f.jsonl")
    one_line(result, 2, "f.jsonl", "is a folder")
    assert {p.name for p in tmp_path.iterdir()} <= {"f.jsonl", ".f.jsonl.lock"}


def test_a_work_dir_that_is_a_file_is_one_line(server, filtered, tmp_path):
    (tmp_path / "work").write_text("x")
    result = invoke("infer-persona", "-i", filtered, "-o", tmp_path / "p.jsonl",
                    "--work-dir", tmp_path / "work", *llm(server))  # fmt: skip
    one_line(result, 2, "work", "is a file, not a folder")


def test_a_config_that_is_not_utf8_is_one_line(tmp_path):
    config = tmp_path / "c.toml"
    config.write_bytes(b'[filter]\ninput = "\xff\xfe"\n')
    one_line(invoke("run", "--config", config), 2, "c.toml", "not valid UTF-8")


def test_a_row_nested_too_deep_is_one_line(tmp_path):
    source = tmp_path / "task1"
    shutil.copytree(SAMPLE_TASK1, source)
    line = (source / "model_input.jsonl").read_text(encoding="utf-8").splitlines()[0]
    deep = "[" * 200_000 + "]" * 200_000
    with (source / "model_input.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(line[:-1] + f', "x": {deep}}}\n')
    result = invoke("filter", "--input", source, "--output", tmp_path / "f.jsonl")
    one_line(result, 2, "model_input.jsonl:49", "nested too deep")


# --- damaged files the toolkit rewrites: kept aside ----------------------------------------------


@pytest.mark.parametrize("damage", ["cut", "garbage"])
def test_a_damaged_cache_is_kept_aside_and_the_run_goes_on(server, filtered, tmp_path, damage):
    work = tmp_path / "work"
    args = ["infer-persona", "-i", filtered, "-o", tmp_path / "p.jsonl", "--work-dir", work, *llm(server)]
    assert invoke(*args, "--limit", "3").exit_code == 0
    cache = work / "cache.sqlite"
    data = cache.read_bytes()
    cache.write_bytes(data[: len(data) // 2] if damage == "cut" else b"\x00garbage" * 500)
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert (
        "reply cache is damaged" in result.stderr and "kept aside as cache.sqlite.corrupt-" in result.stderr
    )
    aside = list(work.glob("cache.sqlite.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes()[:16] == cache.with_name(aside[0].name).read_bytes()[:16]
    assert len(read_jsonl(tmp_path / "p.jsonl")) == 16


def test_a_damaged_run_report_and_manifest_are_kept_aside(server, filtered, tmp_path):
    work = tmp_path / "work"
    (work).mkdir()
    (work / "run_report.json").write_text('{"stages": {"gen-queries": ')
    (filtered.parent / "manifest.json").write_text("[1, 2")
    result = invoke("infer-persona", "-i", filtered, "-o", filtered.with_name("personas.jsonl"),
                    "--work-dir", work, *llm(server))  # fmt: skip
    assert result.exit_code == 0, result.output
    for folder, name in ((work, "run_report.json"), (filtered.parent, "manifest.json")):
        assert f"{name}: not valid JSON" in result.stderr
        (aside,) = folder.glob(f"{name}.corrupt-*")
        assert aside.read_text().startswith(("[1, 2", '{"stages"'))
        assert (
            "infer-persona" in json.loads((folder / name).read_text()).get("stages", {})
            or name == "manifest.json"
        )


# --- torn tails are cut back ----------------------------------------------------------------------


def test_a_torn_last_checkpoint_line_is_cut_back_and_the_run_resumes(server, filtered, tmp_path):
    output = tmp_path / "p.jsonl"
    args = ["infer-persona", "-i", filtered, "-o", output, "--work-dir", tmp_path / "work", *llm(server)]
    assert invoke(*args, "--limit", "4").exit_code == 0
    whole = output.read_bytes()
    # a full disk: the last row's bytes partly written, then the newline of a later flush
    output.write_bytes(whole + whole.splitlines(keepends=True)[0][:40] + b"\n")
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert "its last line was cut off in the middle" in result.stderr
    assert "delete the file" not in result.output
    assert len(read_jsonl(output)) == 16


def test_a_damaged_middle_line_names_the_line_and_keeps_the_file(server, filtered, tmp_path):
    output = tmp_path / "p.jsonl"
    args = ["infer-persona", "-i", filtered, "-o", output, "--work-dir", tmp_path / "work", *llm(server)]
    assert invoke(*args, "--limit", "4").exit_code == 0
    lines = output.read_bytes().splitlines(keepends=True)
    lines[1] = b"{oops\n"
    output.write_bytes(b"".join(lines))
    line = one_line(invoke(*args), 1, "p.jsonl:2", "remove that line")
    assert "delete" not in line
    assert output.read_bytes() == b"".join(lines)


def test_merge_cuts_a_torn_shard_and_asks_for_that_shard_again(server, filtered, tmp_path):
    output = filtered.with_name("personas.jsonl")
    base = ["infer-persona", "-i", filtered, "-o", output, "--work-dir", tmp_path / "work", *llm(server)]
    for part in ("1/2", "2/2"):
        assert invoke(*base, "--shard", part).exit_code == 0
    shard = filtered.with_name("personas.shard-2-of-2.jsonl")
    shard.write_bytes(shard.read_bytes()[:-30])  # a kill in the middle of the last row
    result = invoke("merge", "infer-persona", "-i", filtered, "-o", output)
    assert "its last line was cut off" in result.stderr
    one_line(result, 2, "in no shard", "run shard 2/2 again")
    assert invoke(*base, "--shard", "2/2").exit_code == 0
    again = invoke("merge", "infer-persona", "-i", filtered, "-o", output)
    assert again.exit_code == 0, again.output
    assert len(read_jsonl(output)) == 16


# --- inputs that cannot be right ------------------------------------------------------------------


def test_a_stale_shard_stops_merge(server, filtered, tmp_path):
    output = filtered.with_name("personas.jsonl")
    base = ["infer-persona", "-i", filtered, "-o", output, "--work-dir", tmp_path / "work", *llm(server)]
    for part in ("1/2", "2/2"):
        assert invoke(*base, "--shard", part).exit_code == 0
    rows = read_jsonl(filtered)
    rows[0]["memories"][0]["value"] += " (edited after the shards ran)"
    write_jsonl(filtered, rows)
    result = invoke("merge", "infer-persona", "-i", filtered, "-o", output)
    one_line(result, 2, rows[0]["user_id"], "earlier version", "again")
    assert not output.exists()


def test_a_user_twice_in_an_llm_stage_input_stops_it(server, filtered, tmp_path):
    rows = read_jsonl(filtered)
    write_jsonl(filtered, [*rows, rows[2]])
    result = invoke("infer-persona", "-i", filtered, "-o", tmp_path / "p.jsonl", *llm(server))
    one_line(result, 2, f"filtered.jsonl:{len(rows) + 1}", rows[2]["user_id"], "line 3")
    assert not (tmp_path / "p.jsonl").exists()


@pytest.fixture
def two_splits(tmp_path) -> Path:
    splits = tmp_path / "splits"
    for split, qid in (("random", "qa"), ("ood", "qb")):
        query = {
            "query_id": qid, "category": "ES", "query": "I failed my driving test again and feel awful.",
            "situation": {"topic": "exam", "text": "They just failed a test.", "memory_ids": ["m1"]},
            "memory_ids": ["m1"],
        }  # fmt: skip
        memory = {"memory_id": "m1", "label": "States_Experiences", "value": "failed a test"}
        row = {"user_id": f"u-{split}", "eligible": True, "profile": "Anxious before exams.",
               "queries": [query], "memories": [memory]}  # fmt: skip
        write_jsonl(splits / split / "test.jsonl", [row])
    return splits


def evaluate(splits: Path, responses: Path, server) -> object:
    return invoke("evaluate", "--splits", splits, "--responses", responses, "--dynamic",
                  "--output", splits.parent / "eval" / "report.json", *llm(server))  # fmt: skip


def test_responses_of_another_split_stop_evaluate(server, two_splits, tmp_path):
    responses = write_jsonl(tmp_path / "sys.jsonl", [{"query_id": "qb", "response": "There, there."}])
    result = evaluate(two_splits, responses, server)
    one_line(result, 2, "sys.jsonl", "answers a query of the random test split", "ood test")
    assert not (tmp_path / "eval").exists()


def test_an_empty_responses_file_stops_evaluate(server, two_splits, tmp_path):
    responses = tmp_path / "sys.jsonl"
    responses.write_text("")
    one_line(evaluate(two_splits, responses, server), 2, "sys.jsonl", "no responses")


def test_local_with_a_base_url_is_refused(filtered, tmp_path):
    result = invoke("infer-persona", "-i", filtered, "-o", tmp_path / "p.jsonl", "--llm", "local",
                    "--base-url", "http://127.0.0.1:9/v1")  # fmt: skip
    one_line(result, 2, "--llm", "--base-url")


def test_a_split_on_a_layout_without_splits_is_refused(tmp_path):
    result = invoke(
        "filter", "--input", SAMPLE_TASK1, "--benchmark-split", "nosuch", "--output", tmp_path / "f.jsonl"
    )
    one_line(result, 2, "--benchmark-split nosuch", "leave out --benchmark-split")
    assert not (tmp_path / "f.jsonl").exists()


def test_a_genuine_bug_keeps_its_traceback_and_says_it_is_one(monkeypatch, tmp_path):
    import personaemp.dataset.filter

    def broken(*args, **kwargs):
        raise ZeroDivisionError("sk-test in a bug")

    monkeypatch.setattr(personaemp.dataset.filter, "filter_users", broken)
    result = CliRunner().invoke(
        app, ["filter", "--input", str(SAMPLE_TASK1), "--output", str(tmp_path / "f.jsonl")],
        env={"OPENAI_API_KEY": "sk-test"},
    )  # fmt: skip
    assert result.exit_code == 1
    assert "Traceback" in result.stderr and "ZeroDivisionError" in result.stderr
    assert "Bug: this is an error in personaemp itself" in result.stderr
    assert "sk-test" not in result.stderr
