"""personaemp.language: a user's own words, the detector on them, and the source-field normalizer."""

from __future__ import annotations

import importlib
import json
import threading
import time

import pytest
from conftest import REPO

from personaemp import language
from personaemp.dataset.filter import filter_users
from personaemp.language import detect_language, normalize_language, own_words, user_language


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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Jag vill ha ett lockande namn på min ciabatta till mina kunder på caféet.", "sv"),
        ("Czemu po piwie chce się sikać? Mąż mnie denerwuje, co mam zrobić?", "pl"),
        ("Γεια σου, τι κάνεις σήμερα;", "el"),  # the script decides, no model
        ("Tôi muốn trả lời câu hỏi phỏng vấn về sở thích đọc sách của mình.", "vi"),
    ],
)
def test_detect_language_beyond_the_old_word_lists(text, expected):
    assert detect_language(text) == expected


def test_own_words_drop_code_urls_and_quotes():
    turns = [
        "why does this fail?\n```python\ndef f(x):\n    return x + 1\n```",
        "see https://example.com/a?b=c and tell me",
        'what does "Je ne sais quoi" mean in English?',
        "    at javax.xml.bind.ContextFinder.newInstance(ContextFinder.java:232)",
    ]
    words = own_words(turns)
    assert "def" not in words and "example.com" not in words and "sais" not in words
    assert "javax" not in words
    assert "why does this fail?" in words and "what does mean in English?" in words


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # One pass drops every kind at once, however they nest; each pass tries only the kinds
        # whose marks the turn holds (the expected words are what the single full pattern gave).
        ('write to me at bob@example.com "or call" later', "write to me at later"),
        ('see "the docs at https://x.y/z" and `code` too', "see and too"),
        ("„Zitat“ und «citation» and 「引用」 and 『二重』 stay out", "und and and stay out"),
        ('an unclosed "quote with a@b.co and www.site.com inside', 'an unclosed "quote with and inside'),
        ("```\nfenced without an end\nx = 1", ""),
        ("mail me: someone@@mail..com, ok?", "mail me: , ok?"),
    ],
)
def test_own_words_drop_each_kind_of_brought_along_text(text, expected):
    assert own_words([text]) == expected


@pytest.mark.parametrize(
    "text", ["", "123 !!", "a", "  x  ", "a_b", "\x00a\x7f", "Hello, world! 42 times_over the top.", "1a2b3"]
)
def test_runs_of_ascii_text_are_what_the_run_pattern_finds(text):
    """ASCII text takes a shortcut (one Latin run from the first letter to the last)."""
    expected: list[tuple[str, int]] = []
    for match in language._RUN.finditer(text):
        size = match.end() - match.start()
        if expected and expected[-1][0] == match.lastgroup:
            expected[-1] = (match.lastgroup, expected[-1][1] + size)
        else:
            expected.append((match.lastgroup, size))
    assert language._runs(text) == expected


def test_own_words_drop_what_follows_translate_colon():
    assert own_words(["Vale, traduce esto: And you were way too quick"]) == "Vale, traduce esto"
    assert own_words(["翻译：The number of layers in a 3D U-Net can vary."]) == "翻译"


def test_own_words_drop_turns_pasted_after_a_bare_translate_request():
    turns = ["переведи", "Έχω το pcx 5 χρόνια και κάθε μέρα το χρησιμοποιώ για να πάω δουλειά.", "спасибо"]
    assert own_words(turns) == "переведи\nспасибо"


def test_own_words_keep_the_frame_around_a_long_block_in_another_script():
    letter = "Hello lovely Danina. Of course not, on the contrary, I am very pleased you wrote first. " * 3
    assert own_words([f"ответь на письмо {letter}"]).rstrip(" .") == "ответь на письмо"
    assert own_words([f"{letter} 请帮我写一封回复"]).lstrip(" .") == "请帮我写一封回复"


def test_own_words_keep_a_short_mention_in_another_script():
    text = "My friend sent me 你好 and I do not know what it means, can you help me with this message?"
    assert own_words([text]) == text


def test_own_words_count_a_repeated_message_once_and_bound_long_turns():
    words = own_words(["the same question again"] * 5 + ["x" * 5000])
    assert words.count("the same question again") == 1
    assert len(words.splitlines()[-1]) == 200


def test_user_language_of_a_translation_request_over_quoted_text():
    turns = ['Translate\n"これらのデザインを使って、着ぐるみ魔法少女チームを組んだら楽しいと思う"'] * 3
    assert user_language(turns) == "en"


def test_user_language_none_without_words():
    assert user_language([]) is None
    assert user_language(["```\nprint(1)\n```", "https://example.com"]) is None


def shipped_turns(user_id, sample_task1):
    for line in (sample_task1 / "model_input.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["benchmark_id"] == user_id:
            return [t["text"] for s in row["input"]["sessions"] for t in s["turns"] if t["role"] == "user"]
    raise AssertionError(user_id)


# The demo's user who writes Russian and pastes Greek posts to translate: the old guesser
# (writing system of the first 1,000 characters) labelled them Greek.
RUSSIAN_QUOTING_GREEK = "sess_106869d719d0__75791"


def test_russian_user_quoting_greek_is_russian(sample_task1):
    assert user_language(shipped_turns(RUSSIAN_QUOTING_GREEK, sample_task1)) == "ru"


def test_filter_writes_the_users_own_language(tmp_path, sample_task1):
    output = tmp_path / "filtered.jsonl"
    filter_users(str(sample_task1), output)
    rows = {row["user_id"]: row for row in map(json.loads, output.read_text(encoding="utf-8").splitlines())}
    assert rows[RUSSIAN_QUOTING_GREEK]["language"] == "ru"


def test_shipped_users_of_the_hand_checked_list(sample_task1):
    """bench/dataset/language_gold.jsonl: the one shipped user read wrongly pastes an English jailbreak
    under two short Spanish questions (see the README's language table)."""
    gold = [
        json.loads(line)
        for line in (REPO / "bench" / "dataset" / "language_gold.jsonl").read_text().splitlines()
    ]
    shipped = [g for g in gold if g["source"] == "shipped"]
    assert len(shipped) == 48
    found = {g["user_id"]: user_language(shipped_turns(g["user_id"], sample_task1)) for g in shipped}
    misses = {g["user_id"] for g in shipped if found[g["user_id"]] != g["language"]}
    assert misses <= {"sess_54bbbfa1dbc1__92123"}


def test_threads_asking_at_once_load_the_model_once(monkeypatch):
    """A threaded server (the benches' fake endpoint) asked from 32 threads at once:
    functools.cache alone let each thread load the 0.5 s model (16 s of CPU)."""
    from py3langid.langid import LanguageIdentifier

    loads = []
    real = LanguageIdentifier.from_model_file.__func__

    def counted(cls, *args, **kwargs):
        loads.append(1)
        time.sleep(0.05)  # the real load is slow: every thread arrives before the first ends
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(LanguageIdentifier, "from_model_file", classmethod(counted))
    fresh = importlib.reload(language)  # a module that has loaded no model yet
    start = threading.Barrier(8)
    found = []

    def detect() -> None:
        start.wait()
        found.append(fresh.detect_language("Das ist ein ganz normaler deutscher Satz über das Wetter."))

    threads = [threading.Thread(target=detect) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loads) == 1 and found == ["de"] * 8
