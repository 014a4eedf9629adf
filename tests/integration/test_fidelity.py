"""`personaemp fidelity` against the test server: no leakage (a marker planted in the held-out
turns and the memories citing them reaches no request), the cuts, the controls, the
discriminator in both orders, the report's figures, resume and --estimate, bad input; and the
metrics' rules (instruments/realism.py) and the voice's rule (instruments/voice.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.fidelity import VARIANTS, FidelityOptionsUsed, measure_fidelity
from personaemp.dataset.fidelity_cuts import Skipped, make_cuts, split_memories
from personaemp.errors import InputError
from personaemp.instruments import realism
from personaemp.instruments.voice import pick_voice
from personaemp.llm.settings import LLMSettings

MARKER = "ZEBRAQUARTZ"  # planted in what must never reach a prompt


def turns_of(session: str, pairs: list[tuple[str, str]]) -> list[dict]:
    out = []
    for n, (user, assistant) in enumerate(pairs):
        out.append({"role": "user", "text": user, "session_id": session, "index": 2 * n})
        if assistant is not None:
            out.append({"role": "assistant", "text": assistant, "session_id": session, "index": 2 * n + 1})
    return out


def user(user_id: str, language: str = "en", marker: bool = False) -> dict:
    """Two sessions; the last user message of the second (the default cut) and the memory
    citing it carry MARKER when `marker`."""
    held = f"ok but {MARKER} what about my sister then" if marker else "ok but what about my sister then"
    first = turns_of(f"{user_id}-s1", [
        (f"i feel tired after work at the bakery {user_id}", "That sounds exhausting. What happens then?"),
        ("my sister keeps calling me every evening", "Does that weigh on you?"),
    ])  # fmt: skip
    second = turns_of(f"{user_id}-s2", [
        (f"hey can you help me plan a quiet weekend {user_id}", "Sure. What would make it restful for you?"),
        (held, None),
    ])  # fmt: skip
    memories = [
        {"memory_id": "m1", "label": "Work", "value": "Works at a bakery and is tired after work.",
         "evidence_text": f"i feel tired after work at the bakery {user_id}"},
        {"memory_id": "m2", "label": "Family", "value": f"Worries about the sister {MARKER * marker}.",
         "evidence_text": "my sister keeps calling me | " + (f"{MARKER} what about my sister" if marker else
                                                            "what about my sister then")},
        {"memory_id": "m3", "label": "Rest", "value": "Wants quiet weekends.", "evidence_text": None},
    ]  # fmt: skip
    return {
        "user_id": user_id, "source": {"format": "task1", "path": "x"}, "language": language,
        "turns": first + second, "memories": memories,
    }  # fmt: skip


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def settings_for(server: FakeOpenAI, work: Path, **extra) -> LLMSettings:
    return LLMSettings(base_urls=[server.base_url], model="fake", work_dir=work, api_key="sk-test", **extra)


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# --- no leakage ---------------------------------------------------------------------------------------


def test_nothing_from_the_cut_on_reaches_a_request(tmp_path):
    users = write_rows(tmp_path / "users.jsonl", [user("u1", marker=True), user("u2"), user("u3")])
    output = tmp_path / "fidelity.jsonl"
    with FakeOpenAI() as server:
        summary = measure_fidelity(users, output, settings_for(server, tmp_path / "work")).summary
        bodies = [json.dumps(r.body, ensure_ascii=False) for r in server.chat_requests]
    assert len(bodies) >= 3 * len(VARIANTS)  # the variants' requests and the personas'
    assert not [body for body in bodies if MARKER in body]
    persona_requests = [b for b in bodies if "Big Five" in b and "fidelity" not in b]
    assert persona_requests  # the persona was inferred again, from before the cut
    rows = {row["cut_id"]: row for row in rows_of(output)}
    marked = rows["u1-t6"]
    assert MARKER in marked["real"]  # the held-out message is the marked one ...
    # ... and the memory citing it was withheld; the one without evidence too (unplaced)
    assert marked["memories_given"] == ["m1"]
    assert (marked["memories_withheld"], marked["memories_unplaced"]) == (1, 1)
    assert summary["leakage"]["memories_withheld_per_cut"]["n"] == 3
    assert "re-inferred" in summary["leakage"]["rule"] or "inferred again" in summary["leakage"]["rule"]


def test_the_discriminator_sees_the_real_message_and_nothing_else_does(tmp_path):
    users = write_rows(tmp_path / "users.jsonl", [user("u1", marker=True), user("u2")])
    with FakeOpenAI() as server:
        measure_fidelity(users, tmp_path / "f.jsonl", settings_for(server, tmp_path / "work"),
                         options=FidelityOptionsUsed(discriminator=True))  # fmt: skip
        bodies = [json.dumps(r.body, ensure_ascii=False) for r in server.chat_requests]
    leaked = [body for body in bodies if MARKER in body]
    assert leaked and all("Candidate A" in body for body in leaked)


def test_split_memories_withholds_evidence_from_the_cut_on():
    memories = [
        {"memory_id": "a", "evidence_text": "like tea"},
        {"memory_id": "b", "evidence_text": "like tea | hate ... mornings"},
        {"memory_id": "c", "evidence_text": "hate … mornings"},
        {"memory_id": "d", "evidence_text": "never said"},
    ]
    kept, withheld, unplaced = split_memories(memories, ["I like  TEA a lot"], ["i hate early mornings"])
    assert [m["memory_id"] for m in kept] == ["a"]
    assert (withheld, unplaced) == (2, 1)


# --- the cuts and the controls ------------------------------------------------------------------------


def test_cuts_take_the_last_message_after_a_reply_or_k_seeded():
    rows = [user("u1"), user("u2"), user("u3", language="zh")]
    skipped = Skipped()
    units = make_cuts(rows, cuts=None, seed=0, voice=5, skipped=skipped)
    assert [u["cut_id"] for u in units] == ["u1-t6", "u2-t6", "u3-t6"]
    one = units[0]
    assert one["reply"].startswith("Sure.") and "quiet weekend" in one["dialogue"]
    assert "sister keeps calling" not in one["dialogue"]  # another session: not this conversation
    assert all("what about my sister" not in v for v in one["voice"])  # the voice: from before the cut
    assert one["self"] != one["real"] and one["other"] is not None and one["other_user"] != "u1"
    assert units[2]["other"] is None  # no other zh user: counted
    assert skipped.counts["cuts without an `other` control (no other user in their language)"] == 1
    twice = make_cuts(rows, cuts=2, seed=7, voice=5, skipped=Skipped())
    again = make_cuts(rows, cuts=2, seed=7, voice=5, skipped=Skipped())
    assert [u["cut_id"] for u in twice] == [u["cut_id"] for u in again] and len(twice) == 6


def test_bad_input_is_a_clear_error_or_a_counted_skip(tmp_path):
    no_sessions = user("u1")
    no_sessions["turns"] = [t for t in no_sessions["turns"] if t["role"] == "user"]
    path = write_rows(tmp_path / "users.jsonl", [no_sessions])
    result = CliRunner().invoke(app, ["fidelity", "-i", str(path), "-o", str(tmp_path / "f.jsonl"),
                                      "--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
                                env={"OPENAI_API_KEY": "sk-x"})  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "filter --turns all" in result.output and "Traceback" not in result.output
    single = user("u2")
    single["turns"] = single["turns"][:2]
    skipped = Skipped()
    assert make_cuts([single, user("u3")], cuts=None, seed=0, voice=5, skipped=skipped)
    assert skipped.counts["users with a single message (no self control)"] == 1


def test_the_command_writes_the_rows_the_report_and_a_table_then_resumes(tmp_path):
    rows = [user(f"u{n}") for n in range(1, 5)] + [user("z1", "zh"), user("z2", "zh")]
    users = write_rows(tmp_path / "users.jsonl", rows)
    output = tmp_path / "fidelity.jsonl"
    args = ["fidelity", "-i", str(users), "-o", str(output), "--work-dir", str(tmp_path / "w"),
            "--context", "none,full,full-novoice", "--discriminator", "--model", "fake"]  # fmt: skip
    with FakeOpenAI() as server:
        env = {"OPENAI_API_KEY": "sk-x", "PERSONAEMP_BASE_URL": server.base_url}
        first = CliRunner().invoke(app, [*args, "--base-url", server.base_url], env=env)
        assert first.exit_code == 0, first.output
        sent = server.count
        estimate = CliRunner().invoke(
            app, [*args, "--base-url", server.base_url, "--estimate", "--cuts", "2"], env=env
        )
        assert estimate.exit_code == 0, estimate.output
        assert server.count == sent  # --estimate sends nothing
        again = CliRunner().invoke(app, [*args, "--base-url", server.base_url], env=env)
        assert again.exit_code == 0 and server.count == sent  # resumed: every cut done
    assert "other" in first.output and "self" in first.output and "discriminator" in first.output
    report = json.loads(output.with_suffix(".json").read_text())
    assert report["cuts"]["measured"] == 6 and set(report["languages"]) == {"en", "zh"}
    length = report["metrics"]["log_length"]
    assert set(length["overall"]) == {"other", "self", "none", "full", "full-novoice"}
    assert length["by_language"]["zh"]["self"]["n"] == 2
    assert report["between_controls"]["full"]["log_length"] is not None
    assert set(report["voice"]["effect"]) >= {"log_length", "question", "ending"}
    picked = report["discriminator"]
    # the test server always answers "A": right whenever the real message comes first, so
    # exactly half over both orders
    for source in ("none", "full", "self"):
        assert picked[source]["share"] == 0.5 and picked[source]["n"] == 12
        assert picked[source]["real_first"]["share"] == 1.0 and picked[source]["real_second"]["share"] == 0.0
    assert "Wasserstein" in report["population"]["distance"]
    assert "the voice (full minus full-novoice" in first.output
    assert set(report["not_applicable"]) == {m.name for m in realism.METRICS}  # counted per metric
    assert set(report["population"]["length_cv_across_users"]) >= {"real", "full", "self"}


def test_a_variant_that_only_copies_the_reply_is_recorded_and_the_others_are_measured(tmp_path):
    """A model that copies the assistant's reply whenever it is not shown the memories (the
    embedded 0.5B model did, on 23 of 32 cuts for some variant): those variants end as `failed`
    in the cut's row, the other variants are measured on the same cut, the report gives each
    variant's share answered, and no cut fails (before: the whole cut went to the failures file
    and every variant's message was lost)."""
    users = write_rows(tmp_path / "users.jsonl", [user(f"u{n}") for n in range(1, 4)])
    output = tmp_path / "fidelity.jsonl"

    def responder(body, number):
        text = json.dumps(body["messages"])
        if '"thought"' not in json.dumps(body.get("response_format")):
            return None  # the persona step: the schema's default instance
        if "Works at a bakery" in text:  # memories shown: memories, full, full-novoice
            return {"thought": "t", "end": False, "text": "fine, thanks"}
        return {"thought": "t", "end": False, "text": "Sure. What would make it restful for you?"}

    context = ("none", "memories", "full")
    with FakeOpenAI(responder=responder) as server:
        result = measure_fidelity(
            users, output, settings_for(server, tmp_path / "work", max_reasks=1),
            options=FidelityOptionsUsed(variants=context, cuts=None, seed=0, voice=5, discriminator=True),
        )  # fmt: skip
    assert result.report.outcome.failed == 0
    assert not (tmp_path / "fidelity.failures.jsonl").read_text().strip()
    rows = rows_of(output)
    assert len(rows) == 3
    for row in rows:
        assert row["simulated"]["none"]["text"] is None
        assert row["simulated"]["none"]["failed"].startswith("invalid: ")  # with the reason
        assert "repeats" in row["simulated"]["none"]["failed"]
        assert row["simulated"]["memories"]["text"] == "fine, thanks"
        assert row["scores"]["none"] is None and row["scores"]["memories"] is not None
        assert "none" not in row["discriminator"] and len(row["discriminator"]["memories"]) == 2
    summary = result.summary
    assert summary["answered"]["none"]["share"] == 0.0 and summary["answered"]["memories"]["share"] == 1.0
    assert summary["all_answered"] == 0
    assert summary["metrics"]["log_length"]["overall"]["none"]["n"] == 0
    assert summary["metrics"]["log_length"]["overall"]["memories"]["n"] == 3
    assert summary["between_controls"]["none"]["log_length"] is None
    assert summary["between_controls"]["memories"]["log_length"] is not None
    from personaemp.review.fidelity import read_fidelity_items

    pairs = {item["_source"] for item in read_fidelity_items(output)}
    assert pairs == {"memories", "full", "self"}  # review --fidelity: no pair without a message


# --- the metrics --------------------------------------------------------------------------------------


def test_metric_rules():
    feats = realism.features("thanks!! could you please fix my code?\n```x = 1```", "en")
    assert feats["question"] and feats["gratitude"] and feats["politeness"] and feats["code_markdown"]
    assert feats["lower_start"] and not feats["final_punctuation"]
    assert feats["first_person"] == pytest.approx(1 / 9)  # "my" of 9 tokens
    assert realism.features("谢谢你，我明白了。", "zh")["gratitude"] is True
    assert realism.features("谢谢你，我明白了。", "zh")["lower_start"] is None  # no case
    # a language without marker lists, a message with no token: None, not a guess
    assert realism.features("شكرا لك", "ar")["politeness"] is None
    assert realism.features("🙂🙂", "en")["log_length"] is None
    assert realism.mattr("a b a b") == 0.5
    assert realism.agreement("number", math.log1p(3), math.log1p(3)) == 0.0
    assert realism.agreement("bool", True, None) is None


def test_figures():
    assert realism.wasserstein([0, 0, 1], [0, 1, 1]) == pytest.approx(1 / 3)
    assert realism.wasserstein([1, 2, 3], [1, 2, 3]) == 0
    ci = realism.mean_ci([1, 2, 3, 4])
    assert ci["mean"] == 2.5 and ci["n"] == 4 and 1 <= ci["low"] <= 2.5 <= ci["high"] <= 4
    assert realism.mean_ci([1, 2, 3, 4]) == ci  # seeded
    w = realism.wilson(5, 10)
    assert w["share"] == 0.5 and w["low"] == pytest.approx(0.2366, abs=1e-3)
    assert realism.variation([2, 2, 2]) == 0


def test_voice_rule_is_recent_distinct_and_trimmed():
    messages = ["first one here", "```code```", "x" * 2000, "hello there my friend", "hello there my friend!",
                "last " + "word " * 100]  # fmt: skip
    voice = pick_voice(messages, 3)
    assert voice[0] == "first one here" and voice[1].startswith("hello there") and len(voice) == 3
    assert len(voice[2]) == 200 and voice[2].endswith("…")
    assert pick_voice(messages, 0) == []


def test_bad_variant_is_refused():
    with pytest.raises(InputError, match="--context takes"):
        FidelityOptionsUsed(variants=("none", "all"))


def test_seeker_realism_by_hand():
    """Two users, one dialogue each: the figures worked out by hand."""

    def turn(text, change):
        return {"role": "user", "text": text, "change": change}

    dialogues = [
        {"user_id": "a", "language": "en", "need_met_at_turn": 2, "turns": [
            {"role": "user", "text": "opening query left out"}, {"role": "assistant", "text": "r"},
            turn("thank you so much, could you please say more?", 6), {"role": "assistant", "text": "r"},
            turn("please go on", 4)]},
        {"user_id": "b", "language": "en", "need_met_at_turn": None, "turns": [
            {"role": "user", "text": "q"}, {"role": "assistant", "text": "r"}, turn("ok fine", -2)]},
    ]  # fmt: skip
    real = {"a": ["hi", "why so"], "b": ["no", "what now?"]}
    found = realism.seeker_realism(dialogues, real)
    assert found["users"] == 2 and found["dialogues"] == 2 and found["turns_with_change"] == 3
    sim, own = found["simulated"], found["real"]
    assert sim["messages"] == 3 and own["messages"] == 4
    assert sim["words"] == pytest.approx((9 + 3 + 2) / 3) and own["words"] == pytest.approx(6 / 4)
    assert found["length_ratio"] == pytest.approx((14 / 3) / 1.5)
    assert sim["politeness"] == pytest.approx(2 / 3) and own["politeness"] == 0
    assert sim["question_rate"] == pytest.approx(1 / 3) and own["question_rate"] == 0.25
    assert found["relief_by_turn_2"] == 0.5 and found["mean_change_per_turn"] == pytest.approx(8 / 3)
    assert own["length_cv_across_users"] == 0  # both users 1.5 words a message: alike
    assert sim["length_cv_across_users"] == pytest.approx(0.5)  # 6 and 2 words: sd 2 over mean 4
