"""A long request shows the stage is alive (issue 51): seconds waiting and the model's speed,
on the bar of a terminal and as a line every few seconds in a log. Against the test server,
whose replies here take 1.5 s each (two requests: infer-persona's one request for each of two users,
one at a time)."""

from __future__ import annotations

import io
import re

import pytest
from conftest import SAMPLE_TASK1
from fake_openai import FakeOpenAI, default_content, reply
from rich.console import Console

from personaemp.dataset.filter import filter_users
from personaemp.dataset.persona import infer_personas
from personaemp.llm import alive
from personaemp.llm.settings import LLMSettings

SLOW = 1.5  # seconds the server takes for each reply
TOKENS = 40  # completion tokens each reply says it has


def counted(body: dict, number: int):
    return reply(default_content(body), usage={"prompt_tokens": 100, "completion_tokens": TOKENS,
                                               "total_tokens": 100 + TOKENS})  # fmt: skip


@pytest.fixture
def slow_run(tmp_path, monkeypatch):
    """Runs infer-persona on two users, one at a time, against a slow server, drawing on `console`."""
    monkeypatch.setattr(alive, "ALIVE_AFTER", 0.5)
    monkeypatch.setattr(alive, "HEARTBEAT", 0.25)
    filtered = tmp_path / "filtered.jsonl"
    filter_users(SAMPLE_TASK1, filtered, console=Console(quiet=True))

    def run(console: Console) -> FakeOpenAI:
        with FakeOpenAI(responder=counted, latency=lambda: SLOW) as server:
            settings = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=tmp_path / "work",
                                   concurrency=1, max_tokens=200)  # fmt: skip
            output = tmp_path / "personas.jsonl"
            report = infer_personas(filtered, output, settings, console=console, limit=2).report
        assert report.outcome.done == 2 and server.count == 2
        return server

    return run


def test_a_log_gets_a_line_while_a_request_is_long(slow_run):
    log = io.StringIO()
    slow_run(Console(file=log, width=200))  # not a terminal: rich draws no bar until the end
    lines = [line for line in log.getvalue().splitlines() if "waiting" in line]
    first = [line for line in lines if "speed not known" in line]
    then = [re.search(r"model ([\d.]+) tokens/s", line) for line in lines if "speed not known" not in line]
    assert first and then, log.getvalue()
    for line in first:  # the first user's request: no reply yet, so no speed
        waiting = r"1 request waiting [0-9] s · model speed not known yet \(no reply so far\)"
        assert re.fullmatch(r"infer-persona: 0/2 units · " + waiting, line), line
    for found in then:  # the second user's: the first reply's 40 tokens took >= 1.5 s
        assert found is not None and 0 < float(found[1]) <= TOKENS / SLOW, lines


def test_a_terminal_shows_it_on_the_bar(slow_run):
    screen = io.StringIO()
    slow_run(Console(file=screen, width=250, force_terminal=True))
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())  # the frames, without styles
    first = r"infer-persona +0/2 done 0 .* 1 request waiting [0-9] s · model speed not known yet"
    assert re.search(first, drawn), drawn[:2000]
    assert re.search(r"1 request waiting [0-9] s · model [\d.]+ tokens/s", drawn), drawn[-2000:]


def test_a_quick_reply_shows_nothing(tmp_path):
    """Below ALIVE_AFTER the bar and the log stay as they were."""
    filtered = tmp_path / "filtered.jsonl"
    filter_users(SAMPLE_TASK1, filtered, console=Console(quiet=True))
    log = io.StringIO()
    with FakeOpenAI() as server:
        settings = LLMSettings(base_urls=[server.base_url], model="fake", work_dir=tmp_path / "work")
        infer_personas(filtered, tmp_path / "personas.jsonl", settings, console=Console(file=log), limit=1)
    assert "waiting" not in log.getvalue() and "infer-persona" in log.getvalue()


def test_the_bar_fits_an_80_column_terminal(slow_run):
    """Issue 63: at 80 columns the waiting note wrapped one word a line, 12-14 lines tall,
    redrawn every second. Each column now stays on one line, cut with an ellipsis."""
    screen = io.StringIO()
    slow_run(Console(file=screen, width=80, force_terminal=True))
    drawn = re.sub(r"\x1b\[[0-9;?]*m", "", screen.getvalue())  # no styles
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", drawn)  # every cursor move: a break
    lines = [line for line in drawn.replace("\r", "\n").splitlines() if line.strip()]
    assert lines and all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    bars = [line for line in lines if "infer-persona" in line and "/2" in line]
    assert any("1 request waiting" in line for line in bars), lines  # the note on the bar's line
    assert not [line for line in lines if line.strip() in ("request", "waiting", "model", "speed")], lines
