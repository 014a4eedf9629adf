"""personaemp.language: the small deterministic language guesser and source-field normalizer."""

from __future__ import annotations

import pytest

from personaemp.language import detect_language, normalize_language


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I am feeling really sad today and I do not know what to do with my life.", "en"),
        ("我今天感觉很难过，不知道该怎么办。我和妈妈吵架了。", "zh"),
        ("今日はとても悲しいです。どうすればいいかわかりません。", "ja"),
        ("日本語を勉強しています", "ja"),  # mostly Han characters, but kana decides
        ("Сегодня мне очень грустно, и я не знаю, что делать.", "ru"),
        ("Hoy estoy muy triste y no sé qué hacer con mi vida, pero mi familia me ayuda.", "es"),
        ("Hoje estou muito triste e não sei o que fazer com a minha vida, você me ajuda?", "pt"),
        ("오늘 너무 슬퍼요. 어떻게 해야 할지 모르겠어요.", "ko"),
    ],
)
def test_detect_language(text, expected):
    assert detect_language(text) == expected


def test_detect_language_english_with_a_few_foreign_characters():
    text = "My friend sent me 你好 and I did not know what it means, can you help me with this?"
    assert detect_language(text) == "en"


def test_detect_language_script_beats_latin_code():
    text = "请帮我看看这段代码为什么报错: def f(x): return x + 1，我已经试了很久了，真的很烦。" * 3
    assert detect_language(text) == "zh"


@pytest.mark.parametrize("text", ["", "   ", "ok", "12345 !!!", "?!", "I", "a", "de"])
def test_detect_language_too_little_text_gives_none(text):
    assert detect_language(text) is None


def test_detect_language_is_deterministic():
    text = "de la que el en"  # common in Spanish and Portuguese alike
    assert len({detect_language(text) for _ in range(5)}) == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("English", "en"),
        ("english", "en"),
        (" Chinese ", "zh"),
        ("en", "en"),
        ("en-US", "en"),
        ("EN_us", "en"),
        ("zh-CN", "zh"),
        ("pt-BR", "pt"),
        ("Japanese", "ja"),
        (None, None),
        ("", None),
        ("   ", None),
        (3, None),
    ],
)
def test_normalize_language(value, expected):
    assert normalize_language(value) == expected
