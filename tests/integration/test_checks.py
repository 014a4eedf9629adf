"""personaemp.checks: the deterministic checks every generated query goes through."""

from __future__ import annotations

import pytest

from personaemp.checks import (
    COPY_SHARE,
    COPY_SHORT,
    COPY_WORDS,
    DUPLICATE_SIMILARITY,
    MAX_CHARS,
    MIN_CHARS,
    category_match,
    copied,
    duplicates,
    language_match,
    length_ok,
    longest_shared,
    memory_ids_valid,
    not_copied,
    similarity,
    tokens,
    words,
)

KNOWN = {"m1", "m2", "m3"}

SISTER = "I feel so alone since my sister stopped talking to me after the fight."
SISTER_AGAIN = "I feel so alone since my sister stopped talking to me after our fight."
RAISE = "How do I ask my manager for a raise without sounding ungrateful?"
ZH_SISTER = "我和妹妹吵架以后她一直不理我，我觉得特别孤单，该怎么办呢？"
ZH_SISTER_AGAIN = "我和妹妹吵架以后她一直不理我，我觉得非常孤单，该怎么办呢？"
ZH_PARTY = "明天要在家庭聚会上见到很多亲戚，我应该怎么开口说话才得体？"


# --- memory_ids_valid ---------------------------------------------------------------------------


def test_memory_ids_valid_accepts_known_ids():
    assert memory_ids_valid(["m1", "m3"], KNOWN) == (True, "")


def test_memory_ids_valid_names_every_unknown_id():
    ok, reason = memory_ids_valid(["m1", "m9", "x2"], KNOWN)
    assert not ok
    assert reason == "cites unknown memories m9, x2"


def test_memory_ids_valid_rejects_an_empty_citation():
    assert memory_ids_valid([], KNOWN) == (False, "cites no memory")
    assert memory_ids_valid([], set()) == (False, "cites no memory")


def test_memory_ids_valid_with_no_known_memories_rejects_any_id():
    ok, reason = memory_ids_valid(["m1"], set())
    assert not ok
    assert "m1" in reason


# --- category_match -----------------------------------------------------------------------------


@pytest.mark.parametrize("category", ["ES", "HEQ", "SS"])
def test_category_match_same_category(category):
    assert category_match(category, category) == (True, "")


def test_category_match_different_category_names_both():
    ok, reason = category_match("SS", "ES")
    assert not ok
    assert reason == "written for ES but reads as SS"


def test_category_match_without_a_judged_category_fails():
    ok, reason = category_match(None, "HEQ")
    assert not ok
    assert "HEQ" in reason


# --- length_ok ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "ok"),
    [
        (MIN_CHARS - 1, False),
        (MIN_CHARS, True),
        (MIN_CHARS + 1, True),
        (MAX_CHARS - 1, True),
        (MAX_CHARS, True),
        (MAX_CHARS + 1, False),
    ],
)
def test_length_ok_edges(size, ok):
    assert length_ok("a" * size)[0] is ok


def test_length_ok_reasons_give_the_size_and_the_bound():
    assert length_ok("a" * (MIN_CHARS - 1)) == (
        False,
        f"{MIN_CHARS - 1} characters, fewer than {MIN_CHARS}",
    )
    assert length_ok("a" * (MAX_CHARS + 1)) == (
        False,
        f"{MAX_CHARS + 1} characters, more than {MAX_CHARS}",
    )


def test_length_ok_ignores_surrounding_whitespace():
    padded = "   " + "a" * (MIN_CHARS - 1) + "\n\n  "
    assert not length_ok(padded)[0]
    assert length_ok("  " + "a" * MAX_CHARS + "  ")[0]


def test_length_ok_counts_characters_not_bytes():
    # 15 Chinese characters are 45 bytes of UTF-8 but exactly MIN_CHARS characters.
    assert length_ok("好" * MIN_CHARS) == (True, "")
    assert not length_ok("好" * (MIN_CHARS - 1))[0]


# --- language_match -----------------------------------------------------------------------------


def test_english_query_for_an_english_user_passes():
    assert language_match(SISTER, "en") == (True, "")


def test_english_query_for_a_chinese_user_fails_naming_both_languages():
    ok, reason = language_match(SISTER, "zh")
    assert not ok
    assert "en" in reason and "zh" in reason
    assert reason == "written in en, the user writes zh"


def test_chinese_query_for_a_chinese_user_passes():
    assert language_match(ZH_SISTER, "zh") == (True, "")


def test_chinese_query_for_an_english_user_fails():
    ok, reason = language_match(ZH_SISTER, "en")
    assert not ok
    assert reason == "written in zh, the user writes en"


@pytest.mark.parametrize("language", [None, ""])
def test_unknown_user_language_passes_anything(language):
    assert language_match(SISTER, language) == (True, "")
    assert language_match(ZH_SISTER, language) == (True, "")


def test_undetectable_text_is_not_held_against_the_query():
    # too few letters to tell a language: nothing to compare
    assert language_match("?? !! 123", "zh") == (True, "")


# --- similarity and duplicates ------------------------------------------------------------------


def test_similarity_of_identical_texts_is_one():
    assert similarity(SISTER, SISTER) == 1.0


def test_similarity_ignores_case_and_punctuation():
    assert similarity("Hello there, friend!", "hello there friend") == 1.0


def test_similarity_is_symmetric_and_bounded():
    for a, b in [(SISTER, SISTER_AGAIN), (SISTER, RAISE), (ZH_SISTER, ZH_PARTY)]:
        assert similarity(a, b) == pytest.approx(similarity(b, a))
        assert 0.0 <= similarity(a, b) <= 1.0


def test_near_identical_texts_are_above_the_threshold_and_different_ones_below():
    assert similarity(SISTER, SISTER_AGAIN) >= DUPLICATE_SIMILARITY
    assert similarity(SISTER, RAISE) < DUPLICATE_SIMILARITY


def test_duplicates_flags_an_identical_text_with_the_earlier_index():
    assert duplicates([SISTER, RAISE, SISTER]) == {2: 0}


def test_duplicates_flags_a_near_identical_text_with_the_earlier_index():
    assert duplicates([RAISE, SISTER, SISTER_AGAIN]) == {2: 1}


def test_duplicates_leaves_different_texts_alone():
    assert duplicates([SISTER, RAISE, ZH_PARTY]) == {}
    assert duplicates([]) == {}
    assert duplicates([SISTER]) == {}


def test_duplicates_points_every_repeat_at_the_first_original():
    # The second and third copies both repeat the first; the original is never flagged.
    assert duplicates([SISTER, SISTER_AGAIN, SISTER, RAISE]) == {1: 0, 2: 0}


def test_duplicates_on_chinese_texts_without_spaces():
    assert similarity(ZH_SISTER, ZH_SISTER_AGAIN) >= DUPLICATE_SIMILARITY
    assert similarity(ZH_SISTER, ZH_PARTY) < DUPLICATE_SIMILARITY
    assert duplicates([ZH_SISTER, ZH_PARTY, ZH_SISTER_AGAIN]) == {2: 0}
    assert duplicates([ZH_SISTER, ZH_PARTY]) == {}


# --- not_copied ---------------------------------------------------------------------------------

OWN = [
    "Also my boss gave the promotion to someone else. I do not know how to feel.",
    "Thanks, that helps a lot",
]
ZH_OWN = ["我和最好的朋友因为一点小误会已经一个月没说话了，好难受。"]


def test_a_query_that_is_the_users_message_is_a_copy():
    ok, reason = not_copied(OWN[0], OWN)
    assert ok is False
    assert reason == (
        "repeats 16 words of the user's own text: "
        "'also my boss gave the promotion to someone else i do not know how to feel'"
    )


def test_a_long_stretch_inside_an_honest_query_is_a_copy():
    text = "I keep thinking that my boss gave the promotion to someone else. How do I move on?"
    assert not_copied(text, OWN)[0] is False  # 8 words in a row: "my boss ... someone else"


def test_shared_names_and_short_phrases_are_not_a_copy():
    text = "My boss picked someone else for the promotion and I do not know what to say to him."
    assert longest_shared(text, OWN) == ("i", "do", "not", "know")
    assert not_copied(text, OWN) == (True, "")


def test_a_short_message_copied_whole_is_a_copy():
    assert words(tokens("Thanks, that helps a lot")) == 5
    ok, reason = not_copied("Thanks, that helps a lot!", OWN)
    assert ok is False and "repeats 5 words" in reason


def test_chinese_characters_count_as_half_words():
    assert tokens("我和她 Hello_world 42") == ["我", "和", "她", "hello", "world", "42"]
    assert words(tokens("我和她")) == 1.5
    # 8 characters in common (4 words) in a 30-character message: a paraphrase, not a copy
    paraphrase = "我和最好的朋友已经一个月没说话了，心里特别难受，是不是我做错了什么？"
    assert not_copied(paraphrase, ZH_OWN) == (True, "")
    # the whole sentence again: a copy
    assert not_copied("我和最好的朋友因为一点小误会已经一个月没说话了，怎么办？", ZH_OWN)[0] is False


def test_the_threshold_is_where_the_rule_says():
    below = " ".join(f"w{i}" for i in range(COPY_WORDS - 1))
    at = " ".join(f"w{i}" for i in range(COPY_WORDS))
    source = [at + " and more words after it"]
    padding = " then a good many words of the query that are its own and nobody else's at all"
    assert not_copied(below + padding, source)[0] is True
    assert not_copied(at + padding, source)[0] is False
    assert copied(COPY_SHORT, COPY_SHORT / COPY_SHARE) and not copied(COPY_SHORT - 0.5, COPY_SHORT)


def test_on_the_sample_build_honest_queries_pass_and_planted_copies_fail(sample_build):
    """The shipped sample through the fake endpoint: no generated query is a copy; each
    user's own longer messages, planted as queries, are."""
    import json

    from personaemp.instruments.query_check import own_texts
    from personaemp.records import Persona

    rows = [json.loads(line) for line in (sample_build / "queries.jsonl").read_text().splitlines()]
    generated = [q for row in rows for q in row["queries"] + row["rejected_queries"]]
    assert generated and all(q["checks"]["not_copied"] for q in generated)
    planted = 0
    for row in rows:
        persona = Persona.model_validate(row)
        for turn in persona.turns:
            if turn.role == "user" and len(tokens(turn.text)) >= 12:
                ok, reason = not_copied(turn.text[:300], own_texts(persona))
                assert ok is False, turn.text
                assert reason.startswith("repeats ")
                planted += 1
    assert planted >= 10
