"""The dialogues config's card: per language and supporter what was kept and lost, how the
dialogues ended, the histogram of final emotion, each check's rate over every reply judged and
"not checked" for a check that did not run (never 100%), and that every turn is model-written."""

from __future__ import annotations

import re

from conftest import read_jsonl, write_jsonl
from dialogue_fixture import build_queries, dialogue, write_failures

from personaemp.dataset.publish import publish


def test_the_card_says_what_happened_to_the_dialogues(tmp_path, sample_build):
    splits, queries = build_queries(sample_build, tmp_path)
    queries = queries[:3]
    assert len(queries) == 3
    # policy-b's run: three dialogues, the last one (n=5) made with --no-character-check, and
    # two lost to the simulator's rules
    rows = [dialogue("policy-b", n, query, user) for n, (query, user) in zip((1, 4, 5), queries, strict=True)]
    run = tmp_path / "run"
    dialogues = write_jsonl(run / "dialogues.jsonl", rows)
    lost = read_jsonl(write_failures(dialogues))
    lost = [
        {**row, "query_id": query, "dialogue_id": f"{query}-d1"}
        for row, (query, _) in zip(lost, queries, strict=False)
    ]
    write_jsonl(dialogues.with_name("gen-dialogues.failures.jsonl"), lost)

    publish(splits, out=tmp_path / "ds", dialogues=dialogues)
    card = (tmp_path / "ds" / "README.md").read_text(encoding="utf-8")
    section = card[card.index("## Dialogues (config `dialogues`)") :]
    section = section[: section.index("\n## ")]
    assert "No dialogue text is published" not in card
    assert "every turn in it is model-written" in card
    assert "the hidden needs and every simulated user turn" in section and "`sim-model`" in section
    assert "Dialogues per language: en 2, zh 1." in section
    assert "ended by: max_turns 3" in section
    assert "2 of 5 not finished, 2 of them lost to the simulator" in section
    assert "| `policy-b` | 3 | 2 | simulator_rules 2 |" in section
    # 9 simulated turns, 2 of them with a reply asked again: 11 replies judged; the LLM check
    # did not run on the 3 turns of the --no-character-check dialogue
    assert "Pass rates over the 11 replies judged, kept and asked again:" in section
    assert re.search(r"no_emotion_number 81\.8%", section)  # 2 of 11 replies failed it
    # the LLM check asks only about a reply every rule passed: the 2 replies refused for
    # no_emotion_number never reached it (counted as judged before: "of 8")
    assert "in_character 100.0% (of 6)" in section and "grounded 100.0% (of 6)" in section
    assert (
        "The LLM check asks only about a reply every rule passed: in_character, grounded did not see "
        "the 2 replies a rule had refused first." in section
    ), section
    assert (
        "Checks relaxed: in_character (not checked on 3 of 11 replies); grounded (not checked on 3 of 11"
        in section
    )
    assert "The replies of 2 lost dialogues are not in these rates" in section
    # how real the seekers are: the 9 simulated turns against the same users' real messages
    assert "### How real the seekers are" in section
    assert re.search(
        r"The simulated user turns \(9, the opening queries left out\) against the same \d+ users'", section
    )
    assert "| words per message |" in section and "| length CV across users |" in section
    assert "hidden need met by supporter turn 2 in 0% of 3 dialogues" in section  # met at turn 3
    assert "(n = 9 turns)" in section
    assert (
        "![Final emotion of the simulated user, per supporter](figures/dialogues_final_emotion.png)"
        in section
    )
    png = (tmp_path / "ds" / "figures" / "dialogues_final_emotion.png").read_bytes()
    assert png.startswith(b"\x89PNG")


def test_a_check_that_never_ran_is_not_checked_not_a_pass(tmp_path, sample_build):
    splits, queries = build_queries(sample_build, tmp_path)
    query, user = queries[0]
    dialogues = write_jsonl(tmp_path / "dialogues.jsonl", [dialogue("policy-b", 5, query, user)])
    publish(splits, out=tmp_path / "ds", dialogues=dialogues)
    card = (tmp_path / "ds" / "README.md").read_text(encoding="utf-8")
    assert "in_character not checked, grounded not checked" in card
    assert "in_character 100" not in card
    # issue 63 item 12: nothing lost, no explanation of losses; every declared check listed
    from personaemp.instruments.simulator_rules import JUDGED, MEANINGS, RULES

    assert "(every dialogue finished):" in card and "lost to the simulator" not in card
    assert set(MEANINGS) == {*RULES, *JUDGED}
    listed = card[card.index("- The simulator's checks") :].split("\n")[0]
    for name in (*RULES, *JUDGED):
        assert f"{name} ({MEANINGS[name]})" in listed, name


def test_push_publishes_every_dialogues_file_given(tmp_path, sample_build):
    """Issue 63: `push --dialogues A --dialogues B` published only B. Two supporters' runs of the
    same queries (the same dialogue ids) go into one `dialogues` config, each row naming its
    supporter; the card's per-supporter table has both, and the lost rows are each run's."""
    import datasets
    from typer.testing import CliRunner

    from personaemp.cli import app

    splits, queries = build_queries(sample_build, tmp_path)
    queries = queries[:3]
    files = []
    for system in ("policy-a", "policy-b"):
        rows = [dialogue(system, n, query, user) for n, (query, user) in zip((1, 2, 3), queries, strict=True)]
        files.append(write_jsonl(tmp_path / system / "dialogues.jsonl", rows))
    lost = [{**row, "query_id": queries[0][0], "dialogue_id": f"{queries[0][0]}-d2"}
            for row in read_jsonl(write_failures(files[1]))][:1]  # fmt: skip
    write_jsonl(files[1].with_name("gen-dialogues.failures.jsonl"), lost)  # policy-b lost one
    out = tmp_path / "ds"
    args = ["push", "--splits", splits, "--dry-run", "--out-dir", out,
            "--dialogues", files[0], "--dialogues", files[1]]  # fmt: skip
    result = CliRunner().invoke(app, [str(a) for a in args], env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    loaded = datasets.load_dataset(str(out), "dialogues", cache_dir=str(tmp_path / "hf"))["test"]
    assert sorted(loaded["supporter_model"]) == ["policy-a"] * 3 + ["policy-b"] * 3
    assert sorted(zip(loaded["supporter_model"], loaded["dialogue_id"], strict=True)) == sorted(
        (system, f"{query}-d1") for system in ("policy-a", "policy-b") for query, _ in queries
    )
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "`policy-a`, `policy-b`" in card
    assert "| `policy-a` | 3 | 0 |" in card and "| `policy-b` | 3 | 1 | simulator_rules 1 |" in card
    # issue 63 item 12: one lost dialogue is one (not "1 lost dialogues")
    assert "(1 of 7 not finished, 1 of them lost to the simulator: it broke its rules" in card
    assert "The replies of 1 lost dialogue are not in these rates" in card
    # the same file twice, or one run's dialogue twice, is refused in one line
    again = [*args[:-2], "--dialogues", files[0]]
    result = CliRunner().invoke(app, [str(a) for a in again], env={"NO_COLOR": "1"})
    assert result.exit_code == 2 and "given twice" in result.output, result.output
