"""Reading the JSON answer out of what providers wrap around it (personaemp/llm/reply.py)."""

from __future__ import annotations

import pytest

from personaemp.llm.reply import extract_json, split_reasoning

ANSWER = '{"text": "final", "mood": 3}'
DRAFT = 'Let me draft: {"text": "draft", "mood": 9}. Hmm, mood should be lower.'


@pytest.mark.parametrize(
    "content",
    [
        ANSWER,
        f"<think>\n{DRAFT}\n</think>\n\n{ANSWER}",  # MiniMax-M2.x
        f"{DRAFT}\n</think>\n{ANSWER}",  # the server dropped the opening tag
        f"<THINK>{DRAFT}</THINK>{ANSWER}",
        f"Sure! Here is the JSON you asked for:\n\n```json\n{ANSWER}\n```\nAnything else?",
        f"Here you go: {ANSWER} Hope it helps.",
        f"<think>{DRAFT}</think>\nSure:\n```\n{ANSWER}\n```",
        '{"text": "a\nraw newline", "mood": 3}'.replace("a\nraw newline", "final"),
    ],
    ids=["plain", "think", "lone-close", "upper", "fenced", "preamble", "think+fence", "strict-off"],
)
def test_the_answer_is_found_and_drafts_in_reasoning_are_ignored(content):
    assert extract_json(content) == {"text": "final", "mood": 3}


def test_raw_control_characters_inside_strings_are_tolerated():
    assert extract_json('{"text": "two\nlines"}') == {"text": "two\nlines"}


def test_reasoning_is_returned_apart():
    answer, reasoning = split_reasoning(f"<think>{DRAFT}</think>{ANSWER}")
    assert answer == ANSWER and DRAFT in reasoning


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (f"<think>{DRAFT} and still thinking", "no answer after its reasoning"),
        ("<think>only thoughts</think>", "no answer after its reasoning"),
        ('{"text": "cut', "not valid JSON"),
        ("I cannot help with that.", "not valid JSON"),
    ],
)
def test_no_answer_says_why(content, message):
    with pytest.raises(ValueError, match=message):
        extract_json(content)
