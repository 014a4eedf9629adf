"""From a reply's text to its JSON answer, whatever the provider wrapped around it.

Reasoning models put their thinking in `<think>…</think>` inside `content` (MiniMax-M2.x;
some servers drop the opening tag), chat models asked for JSON in prose add a preamble or
a fenced block. The answer is the first complete JSON object once all that is set aside.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Bump when extraction changes what a reply parses to: it is part of every step's fingerprint.
EXTRACTOR_VERSION = 2

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n(.*?)```", re.DOTALL)
_DECODER = json.JSONDecoder(strict=False)  # small models write raw newlines inside strings


def split_reasoning(text: str) -> tuple[str, str]:
    """(answer, reasoning): `<think>` blocks removed, and everything up to a lone `</think>`.

    An opened `<think>` that never closes means the reply was cut while reasoning: no answer.
    """
    reasoning = [match.group(0) for match in _THINK_BLOCK.finditer(text)]
    answer = _THINK_BLOCK.sub("", text)
    closes = list(_THINK_CLOSE.finditer(answer))
    if closes:  # the opening tag was dropped by the server
        reasoning.append(answer[: closes[-1].start()])
        answer = answer[closes[-1].end() :]
    opened = _THINK_OPEN.search(answer)
    if opened:
        reasoning.append(answer[opened.end() :])
        answer = answer[: opened.start()]
    return answer.strip(), "".join(reasoning)


def extract_json(text: str) -> Any:
    """The JSON answer of a reply: the whole text, else a fenced block, else the first
    complete JSON object after a preamble. ValueError says what is wrong."""
    answer, _ = split_reasoning(text)
    if not answer:
        raise ValueError("the reply holds no answer after its reasoning")
    try:
        return _DECODER.decode(answer)
    except json.JSONDecodeError as exc:
        whole_error = exc
    for block in _FENCE.finditer(answer):
        try:
            return _DECODER.decode(block.group(1).strip())
        except json.JSONDecodeError:
            continue
    start = answer.find("{")
    while start >= 0:
        try:
            value, _ = _DECODER.raw_decode(answer, start)
            return value
        except json.JSONDecodeError:
            start = answer.find("{", start + 1)
    raise ValueError(
        f"the reply is not valid JSON ({whole_error.msg}: line {whole_error.lineno}, "
        f"column {whole_error.colno})"
    )
