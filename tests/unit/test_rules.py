"""personaemp.rules: defaults, user overrides, keyword and label matching, flagged memories."""

from __future__ import annotations

import tomllib

import pytest
from conftest import raw_record, session, write_jsonl

from personaemp.errors import InputError
from personaemp.io import ErrorPolicy
from personaemp.records import Intent, Memory
from personaemp.rules import KeywordMatcher, Rules, RuleSet, default_rules_text, load_rules
from personaemp.sources import read_users


def memory(
    label="Social_Relationships/Family", value="Misses their brother", suggestion=None, memory_id="m1"
):
    return Memory(memory_id=memory_id, label=label, label_suggestion=suggestion, value=value)


def write_rules(tmp_path, text, name="rules.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- loading -----------------------------------------------------------------------------


def test_default_rules():
    rules = load_rules()
    assert isinstance(rules, Rules)
    assert rules.memories.flagged_value_pattern == r"\[ERROR:"
    assert rules.memories.min_memories == 1
    assert rules.memories.min_matched_memories == 1
    assert "Social_Relationships" in rules.labels.prefixes
    assert "Thoughts/Opinions" in rules.labels.prefixes
    assert "Preferences" not in rules.labels.prefixes
    assert "personal advice" in rules.intents.keywords
    assert "conflict*" in rules.unmapped.keywords
    assert rules.language.allow == []


def test_default_rules_text_is_the_file_that_is_loaded():
    parsed = tomllib.loads(default_rules_text())
    assert Rules.model_validate(parsed) == load_rules()
    assert "flagged_value_pattern" in default_rules_text()


def test_user_file_overrides_only_the_keys_it_sets(tmp_path):
    path = write_rules(tmp_path, '[language]\nallow = ["en"]\n\n[memories]\nmin_memories = 3\n')
    rules = load_rules(path)
    defaults = load_rules()
    assert rules.language.allow == ["en"]
    assert rules.memories.min_memories == 3
    # keys the file does not set keep their defaults, inside and outside the sections it sets
    assert rules.memories.min_matched_memories == defaults.memories.min_matched_memories
    assert rules.memories.flagged_value_pattern == defaults.memories.flagged_value_pattern
    assert rules.labels.prefixes == defaults.labels.prefixes
    assert rules.unmapped.keywords == defaults.unmapped.keywords
    assert rules.intents.keywords == defaults.intents.keywords


def test_user_file_replaces_a_list_as_a_whole(tmp_path):
    rules = load_rules(write_rules(tmp_path, '[labels]\nprefixes = ["Possessions"]\n'))
    assert rules.labels.prefixes == ["Possessions"]


def test_invalid_toml_names_the_file(tmp_path):
    path = write_rules(tmp_path, "[language\nallow = ['en']\n", name="broken.toml")
    with pytest.raises(InputError) as caught:
        load_rules(path)
    assert str(caught.value).startswith(f"{path}: not valid TOML")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("[memories]\nmin_memory = 2\n", "memories.min_memory"),
        ("[bogus]\nx = 1\n", "bogus"),
        ("[labels]\nprefixes = 'Social'\n", "labels.prefixes"),
        ("[memories]\nmin_memories = -1\n", "memories.min_memories"),
    ],
)
def test_unknown_or_wrong_keys_name_the_file_and_key(tmp_path, text, where):
    path = write_rules(tmp_path, text)
    with pytest.raises(InputError) as caught:
        load_rules(path)
    assert str(caught.value).startswith(f"{path}: {where}: ")


def test_bad_regex_names_the_file(tmp_path):
    path = write_rules(tmp_path, "[memories]\nflagged_value_pattern = '[ERROR'\n")
    with pytest.raises(InputError) as caught:
        load_rules(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: memories.flagged_value_pattern: ")
    assert "not a valid regular expression" in message


def test_missing_rules_file(tmp_path):
    with pytest.raises(InputError, match="nope.toml: no such rules file"):
        load_rules(tmp_path / "nope.toml")


def test_rules_file_not_utf8(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"# caf\xe9\n[language]\nallow = []\n")
    with pytest.raises(InputError, match="latin1.toml: cannot read the rules file"):
        load_rules(path)


# --- keyword matching ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keywords", "text", "expected"),
    [
        (["conflict"], "workplace/conflict/manager_competition", "conflict"),
        (["conflict"], "conflicting schedules", None),
        (["conflict"], "CONFLICT", "conflict"),
        (["conflict"], "Marital-Conflict", "conflict"),
        (["relationship*"], "Social_Relationships", "relationship*"),
        (["relationship*"], "relationship", "relationship*"),
        (["relationship*"], "interrelationship", None),
        (["emotion*"], "emotional/regulation", "emotion*"),
        (["personal advice"], "Personal Advice and Guidance", "personal advice"),
        (["personal advice"], "personal/advice", "personal advice"),
        (["personal advice"], "personal and advice", None),
        (["self esteem"], "low_self-esteem", "self esteem"),
        (["mood"], "moody", None),
        (["sad*"], "", None),
        (["sad*"], None, None),
        ([], "anything", None),
        (["*", "sad"], "sad day", "sad"),
    ],
)
def test_keyword_matcher(keywords, text, expected):
    assert KeywordMatcher(keywords).find(text) == expected


def test_keyword_matcher_returns_the_keyword_that_occurs_first_in_the_text():
    matcher = KeywordMatcher(["family", "conflict*"])
    assert matcher.find("family/conflict") == "family"
    assert matcher.find("conflict_with_family") == "conflict*"


def test_keyword_matcher_regex_characters_are_literal():
    matcher = KeywordMatcher(["well.being"])
    assert matcher.find("well being") == "well.being"
    assert matcher.find("wellxbeing") is None


# --- labels, unmapped suggestions, intents, languages ------------------------------------------


@pytest.fixture
def rules() -> RuleSet:
    return RuleSet(load_rules())


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ("Thoughts/Opinions/Positive", "label:Thoughts/Opinions"),
        ("Thoughts/Opinions", "label:Thoughts/Opinions"),
        ("thoughts/opinions", "label:Thoughts/Opinions"),
        ("Thoughts/OpinionsX", None),
        ("Thoughts/Curiosity", None),
        ("Possessions", "label:Possessions"),
        ("Possessions/Pet", "label:Possessions"),
        ("PossessionsX", None),
        ("Social_Relationships/Friends", "label:Social_Relationships"),
        ("Personal_Background/Family", "label:Personal_Background/Family"),
        ("Personal_Background/Occupation", None),
        ("Preferences/Food", None),
        ("/Possessions/", "label:Possessions"),
    ],
)
def test_label_prefixes_match_whole_segments(rules, label, expected):
    assert rules.match_memory(memory(label=label)) == expected


@pytest.mark.parametrize(
    ("suggestion", "expected"),
    [
        ("workplace/conflict/manager_competition", "unmapped:conflict*"),
        ("interaction/style/preference", None),
        ("emotional/state/anxiety", "unmapped:emotion*"),
        (None, None),
        ("", None),
    ],
)
def test_unmapped_memories_match_on_their_suggestion(rules, suggestion, expected):
    assert rules.match_memory(memory(label="UNMAPPED", suggestion=suggestion)) == expected
    assert rules.match_memory(memory(label=" unmapped ", suggestion=suggestion)) == expected


def test_label_match_results_are_per_rule_set(tmp_path):
    only_possessions = RuleSet(load_rules(write_rules(tmp_path, '[labels]\nprefixes = ["Possessions"]\n')))
    defaults = RuleSet(load_rules())
    family = memory(label="Social_Relationships/Family")
    assert defaults.match_memory(family) == "label:Social_Relationships"
    assert only_possessions.match_memory(family) is None
    assert defaults.match_memory(family) == "label:Social_Relationships"


@pytest.mark.parametrize(
    ("value", "flagged"),
    [
        ("Likes cats [ERROR: Unsupported by evidence]", True),
        ("Has a sister [ERROR: Role-play/third-party possible]", True),
        ("Mentions an [error: lowercase] note", False),
        ("Worried about an ERROR in their code", False),
        ("Likes cats", False),
    ],
)
def test_flagged_memories(rules, value, flagged):
    assert rules.is_flagged(memory(value=value)) is flagged


def test_custom_flag_pattern(tmp_path):
    custom = RuleSet(
        load_rules(write_rules(tmp_path, "[memories]\nflagged_value_pattern = '(?i)\\[error:'\n"))
    )
    assert custom.is_flagged(memory(value="x [error: lowercase]"))


def test_match_intents(rules):
    assert (
        rules.match_intents([Intent(category="Personal Advice and Guidance", subtype="Relationship Advice")])
        == "intent:personal advice"
    )
    assert rules.match_intents([Intent(category="Other", subtype="Social_Relationships")]) == (
        "intent:relationship*"
    )
    assert (
        rules.match_intents([Intent(category="Technical and Professional Intent", subtype="Coding Help")])
        is None
    )
    assert (
        rules.match_intents(
            [
                Intent(category="Technical and Professional Intent", subtype="Coding Help"),
                Intent(category="Emotional Support", subtype=None),
            ]
        )
        == "intent:emotional support"
    )
    assert rules.match_intents([]) is None


def _users_with_languages(tmp_path, languages):
    """Real users read from a raw export whose records carry these `language` fields."""
    records = [raw_record(f"u{n}", language=language) for n, language in enumerate(languages)]
    path = write_jsonl(tmp_path / "users.jsonl", records)
    return list(read_users(str(path), ErrorPolicy()))


def test_language_allowlist(tmp_path, rules):
    users = _users_with_languages(tmp_path, ["English", "zh", "ZH-tw", "Russian", "  "])
    assert [u.language for u in users] == ["en", "zh", "zh", "ru", "en"]  # the last one detected
    assert all(rules.language_allowed(u) for u in users)  # empty allowlist keeps every language
    allow = RuleSet(load_rules(write_rules(tmp_path, '[language]\nallow = ["EN", "zh"]\n')))
    assert [allow.language_allowed(u) for u in users] == [True, True, True, False, True]


def test_language_allowlist_drops_unknown_language(tmp_path):
    records = [raw_record("u1", sessions=[session("s1", "12345 67890", "ok")])]
    [user] = read_users(str(write_jsonl(tmp_path / "users.jsonl", records)), ErrorPolicy())
    assert user.language is None
    assert RuleSet(load_rules()).language_allowed(user)
    allow = RuleSet(load_rules(write_rules(tmp_path, '[language]\nallow = ["en"]\n')))
    assert not allow.language_allowed(user)
