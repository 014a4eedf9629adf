"""`personaemp split`: random and KModes OOD user splits, on hand-made JSONL under tmp_path.

Users are drawn around a few Big Five "prototype" profiles (with seeded noise), so the
right clustering is known in advance: a test can say which users must end up together.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import read_jsonl, write_jsonl
from typer.testing import CliRunner

from personaemp.cli import app
from personaemp.dataset.split import LEFT_OUT_REASONS, cluster_profiles, elbow, split_users
from personaemp.errors import InputError
from personaemp.manifest import read_manifest
from personaemp.records import BIG_FIVE
from personaemp.splits import LEVELS, REPORT_FILE, profile_of

LOW, MEDIUM, HIGH = ("low",) * 5, ("medium",) * 5, ("high",) * 5
MIXED = ("low", "high", "medium", "low", "high")  # 3 or 4 traits away from the others
PROTOS3 = [LOW, MEDIUM, HIGH]
PROTOS4 = [LOW, HIGH, MEDIUM, MIXED]


# --- builders ---------------------------------------------------------------------------------


def big_five(profile) -> dict:
    return {
        trait: {"level": level, "evidence": [], "rationale": "", "thin_evidence": True}
        for trait, level in zip(BIG_FIVE, profile, strict=True)
    }


def user(user_id: str, profile=MEDIUM, queries: int = 2, **extra) -> dict:
    """A queries row with what split and push read (the rest of a real row is carried along)."""
    row = {
        "user_id": user_id,
        "eligible": True,
        "memories": [{"memory_id": f"{user_id}-m1", "label": "Family", "value": "argued with a sister"}],
        "big_five": big_five(profile),
        "queries": [
            {
                "query_id": f"{user_id}-q{i}",
                "category": "ES",
                "query": f"query {i} of {user_id}",
                "situation": {"topic": "family", "text": f"situation {i}", "memory_ids": [f"{user_id}-m1"]},
                "memory_ids": [f"{user_id}-m1"],
            }
            for i in range(queries)
        ],
    }
    row.update(extra)
    return row


def prototype_users(prototypes, sizes, noise: float = 0.1, seed: int = 0) -> list[dict]:
    """`sizes[i]` users around `prototypes[i]`; each level flips to another with `noise`."""
    rng = random.Random(seed)
    rows = []
    for p, (proto, size) in enumerate(zip(prototypes, sizes, strict=True)):
        for i in range(size):
            profile = [
                level if rng.random() >= noise else rng.choice([x for x in LEVELS if x != level])
                for level in proto
            ]
            rows.append(user(f"p{p}-u{i:03d}", profile, queries=1 + rng.randrange(3)))
    return rows


def write_users(path: Path, rows: list) -> Path:
    return write_jsonl(path, rows)


def ids(out: Path, setting: str, name: str) -> list[str]:
    return [row["user_id"] for row in read_jsonl(out / setting / f"{name}.jsonl")]


def report_of(out: Path) -> dict:
    return json.loads((out / REPORT_FILE).read_text(encoding="utf-8"))


def split(tmp_path: Path, rows: list, *, name: str = "in", **options):
    """Write `rows`, split them into tmp_path/<name>-out, return (report, out dir)."""
    path = write_users(tmp_path / f"{name}.jsonl", rows)
    out = tmp_path / f"{name}-out"
    options.setdefault("seeds", 2)
    options.setdefault("ood", False)  # the random split alone, unless a test asks for both
    return split_users(path, out, **options).report, out


def level_index(mode: dict) -> tuple[int, ...]:
    return tuple(LEVELS.index(mode[trait]) for trait in BIG_FIVE)


def gap(setting: dict, trait: str) -> float:
    """Largest train/test difference of the share of one level of `trait`."""
    train, test = setting["levels_train"][trait], setting["levels_test"][trait]
    return max(abs(train[level] - test[level]) for level in LEVELS)


# --- leakage and coverage ---------------------------------------------------------------------


def test_every_user_in_exactly_one_split_per_setting(tmp_path):
    rows = prototype_users(PROTOS3, [20, 20, 20], seed=1)
    left_out = [user("ineligible", eligible=False), user("no-queries", queries=0)]
    report, out = split(tmp_path, rows + left_out, ood=True, seed=5)

    by_id = {row["user_id"]: row for row in rows}
    all_queries = sum(len(row["queries"]) for row in rows)
    for setting in ("random", "ood"):
        train, test = ids(out, setting, "train"), ids(out, setting, "test")
        assert len(train) == len(set(train)) and len(test) == len(set(test))
        assert not set(train) & set(test)
        assert set(train) | set(test) == set(by_id)
        assert train and test
        summary = report.settings[setting]
        assert (summary["train_users"], summary["test_users"]) == (len(train), len(test))
        train_queries = sum(len(by_id[u]["queries"]) for u in train)
        test_queries = sum(len(by_id[u]["queries"]) for u in test)
        assert (summary["train_queries"], summary["test_queries"]) == (train_queries, test_queries)
        assert train_queries + test_queries == all_queries
        # each row is written as it was read (the file is self-contained)
        for name in ("train", "test"):
            for row in read_jsonl(out / setting / f"{name}.jsonl"):
                assert row == by_id[row["user_id"]]
    assert report_of(out) == {**report.as_dict(), "input": "../in.jsonl"}  # relative: the build can move


# --- random -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "test_size", "expected"),
    [
        (40, 0.1, 4),
        (40, 0.25, 10),
        (10, 0.5, 5),
        (7, 0.01, 1),  # rounds to 0: at least one test user
        (7, 0.99, 6),  # rounds to 7: at least one train user
        (2, 0.1, 1),
    ],
)
def test_random_test_size(tmp_path, n, test_size, expected):
    rows = [user(f"u{i:02d}") for i in range(n)]
    report, out = split(tmp_path, rows, test_size=test_size)
    assert len(ids(out, "random", "test")) == expected
    assert len(ids(out, "random", "train")) == n - expected
    assert report.settings["random"]["test_users"] == expected
    assert report.settings["random"]["test_size"] == test_size


def test_random_is_byte_identical_across_runs(tmp_path):
    rows = prototype_users(PROTOS3, [10, 10, 10], seed=2)
    path = write_users(tmp_path / "in.jsonl", rows)
    first, second = tmp_path / "a", tmp_path / "b"
    split_users(path, first, seed=7, ood=False)
    split_users(path, second, seed=7, ood=False)
    for name in ("train.jsonl", "test.jsonl"):
        assert (first / "random" / name).read_bytes() == (second / "random" / name).read_bytes()
    assert (first / REPORT_FILE).read_bytes() == (second / REPORT_FILE).read_bytes()


def test_random_seed_changes_the_test_set(tmp_path):
    rows = [user(f"u{i:02d}") for i in range(40)]
    path = write_users(tmp_path / "in.jsonl", rows)
    split_users(path, tmp_path / "s1", seed=1, ood=False)
    split_users(path, tmp_path / "s2", seed=2, ood=False)
    one, two = set(ids(tmp_path / "s1", "random", "test")), set(ids(tmp_path / "s2", "random", "test"))
    assert len(one) == len(two) == 4
    assert one != two


def test_random_ignores_input_order(tmp_path):
    rows = prototype_users(PROTOS3, [10, 10, 10], seed=3)
    shuffled = rows[:]
    random.Random(42).shuffle(shuffled)
    assert shuffled != rows
    _, first = split(tmp_path, rows, name="ordered", seed=11)
    _, second = split(tmp_path, shuffled, name="shuffled", seed=11)
    for name in ("train.jsonl", "test.jsonl"):
        assert (first / "random" / name).read_bytes() == (second / "random" / name).read_bytes()


# --- OOD --------------------------------------------------------------------------------------


def test_ood_test_set_is_one_whole_cluster(tmp_path):
    rows = prototype_users(PROTOS3, [20, 20, 20], noise=0.15, seed=4)
    report, out = split(tmp_path, rows, ood=True, seed=3)
    ood = report.settings["ood"]

    # the same clustering, per user, in input order
    clustering = cluster_profiles([profile_of(r) for r in rows], None, (2, 8), 2, 3)
    assert clustering.k == ood["k"]
    cluster_of = {row["user_id"]: label for row, label in zip(rows, clustering.labels, strict=True)}
    held = ood["holdout_cluster"]
    test, train = ids(out, "ood", "test"), ids(out, "ood", "train")
    assert {cluster_of[u] for u in test} == {held}
    assert held not in {cluster_of[u] for u in train}
    assert set(test) == {u for u, c in cluster_of.items() if c == held}
    sizes = {c["id"]: c["users"] for c in ood["clusters"]}
    assert sizes[held] == len(test) == ood["test_users"]
    assert sum(sizes.values()) == len(rows)


def test_ood_noise_free_prototypes_hold_out_exactly_one_prototype(tmp_path):
    rows = prototype_users(PROTOS3, [12, 12, 12], noise=0.0)
    report, out = split(tmp_path, rows, ood=True, k=3)
    test = set(ids(out, "ood", "test"))
    prototypes = {u.split("-")[0] for u in test}
    assert len(prototypes) == 1
    held = prototypes.pop()
    assert test == {r["user_id"] for r in rows if r["user_id"].split("-")[0] == held}
    assert len(test) == 12


@pytest.mark.parametrize("prototypes", [PROTOS3, PROTOS4], ids=["3 prototypes", "4 prototypes"])
def test_elbow_finds_the_prototype_count(tmp_path, prototypes):
    rows = prototype_users(prototypes, [15] * len(prototypes), noise=0.1, seed=5)
    report, _ = split(tmp_path, rows, ood=True, seed=5, seeds=3)
    ood = report.settings["ood"]
    assert ood["k"] == len(prototypes)
    assert ood["k_fixed"] is False
    assert list(ood["cost_curve"]) == [str(k) for k in range(2, 9)]
    # the clusters are the prototypes, ordered by profile
    modes = [tuple(c["mode"][t] for t in BIG_FIVE) for c in ood["clusters"]]
    assert modes == sorted(prototypes, key=lambda p: tuple(LEVELS.index(v) for v in p))


@pytest.mark.parametrize("prototypes", [PROTOS3, PROTOS4], ids=["3 profiles", "4 profiles"])
def test_elbow_with_exactly_the_prototype_profiles(tmp_path, prototypes):
    """BUG: when the sweep is cut at the number of distinct profiles, the last k fits
    perfectly (cost 0) but `elbow` can never return the last point of a curve: 3 exact
    profiles give k=2 (curve {2: 50, 3: 0}), 4 give k=3 (curve {2: 70, 3: 30, 4: 0})."""
    rows = prototype_users(prototypes, [10] * len(prototypes), noise=0.0)
    report, _ = split(tmp_path, rows, ood=True)
    ood = report.settings["ood"]
    assert ood["cost_curve"][str(len(prototypes))] == 0.0
    assert ood["k"] == len(prototypes), ood["cost_curve"]


@pytest.mark.parametrize("k", [2, 4])
def test_fixed_k_is_used(tmp_path, k):
    rows = prototype_users(PROTOS3, [15, 15, 15], seed=6)
    report, out = split(tmp_path, rows, ood=True, k=k)
    ood = report.settings["ood"]
    assert ood["k"] == k
    assert ood["k_fixed"] is True
    assert list(ood["cost_curve"]) == [str(k)]
    assert [c["id"] for c in ood["clusters"]] == list(range(k))
    assert all(c["users"] > 0 for c in ood["clusters"])
    assert ood["holdout_cluster"] in range(k)


@pytest.mark.parametrize("holdout", [0, 1, 2])
def test_holdout_picks_that_cluster(tmp_path, holdout):
    rows = prototype_users(PROTOS3, [12, 6, 9], noise=0.0)
    report, out = split(tmp_path, rows, ood=True, k=3, holdout=holdout)
    ood = report.settings["ood"]
    assert ood["holdout_cluster"] == holdout
    # stable id order is LOW < MEDIUM < HIGH, i.e. the prototype index here
    assert set(ids(out, "ood", "test")) == {
        r["user_id"] for r in rows if r["user_id"].startswith(f"p{holdout}-")
    }
    assert ood["test_users"] == [12, 6, 9][holdout]


@pytest.mark.parametrize(
    ("sizes", "test_size", "expected"),
    [
        ((12, 4, 8), 0.25, 1),  # target 6: 4 and 8 tie -> the lower id
        ((12, 8, 4), 0.25, 1),  # the same tie, the lower id is now the larger cluster
        ((4, 12, 8), 0.25, 0),  # tie between ids 0 and 2
        ((10, 3, 7), 0.3, 2),  # target 6: 7 is closest, not the smallest
        ((2, 3, 15), 0.6, 2),  # target 12: the largest
    ],
)
def test_automatic_holdout_is_closest_to_test_size(tmp_path, sizes, test_size, expected):
    rows = prototype_users(PROTOS3, list(sizes), noise=0.0)
    report, out = split(tmp_path, rows, ood=True, k=3, test_size=test_size)
    ood = report.settings["ood"]
    assert [c["users"] for c in ood["clusters"]] == list(sizes)
    assert ood["holdout_cluster"] == expected
    assert len(ids(out, "ood", "test")) == sizes[expected]


def test_cluster_ids_are_ordered_by_mode(tmp_path):
    rows = prototype_users(PROTOS4, [10, 10, 10, 10], noise=0.0)
    report, _ = split(tmp_path, rows, ood=True, k=4)
    modes = [level_index(c["mode"]) for c in report.settings["ood"]["clusters"]]
    assert modes == sorted(modes) and len(set(modes)) == 4
    assert modes == [(0, 0, 0, 0, 0), (0, 2, 1, 0, 2), (1, 1, 1, 1, 1), (2, 2, 2, 2, 2)]


def test_ood_is_reproducible_for_a_seed(tmp_path):
    rows = prototype_users(PROTOS4, [12, 12, 12, 12], noise=0.15, seed=7)
    path = write_users(tmp_path / "in.jsonl", rows)
    first, second = tmp_path / "a", tmp_path / "b"
    split_users(path, first, ood=True, seed=9, seeds=2)
    split_users(path, second, ood=True, seed=9, seeds=2)
    for name in ("train.jsonl", "test.jsonl"):
        assert (first / "ood" / name).read_bytes() == (second / "ood" / name).read_bytes()
    assert (first / REPORT_FILE).read_bytes() == (second / REPORT_FILE).read_bytes()


def test_cost_curve_is_limited_by_distinct_profiles(tmp_path):
    rows = prototype_users(PROTOS4, [5, 5, 5, 5], noise=0.0)  # 4 distinct profiles
    report, _ = split(tmp_path, rows, ood=True)
    ood = report.settings["ood"]
    assert list(ood["cost_curve"]) == ["2", "3", "4"]
    assert ood["cost_curve"]["4"] == 0.0  # one cluster per profile fits exactly
    assert ood["cost_curve"]["2"] > ood["cost_curve"]["3"] > 0
    assert ood["k_fixed"] is False


def test_cost_curve_follows_the_k_range(tmp_path):
    rows = prototype_users(PROTOS4, [12, 12, 12, 12], seed=8)
    report, _ = split(tmp_path, rows, ood=True, k_range=(3, 5), seeds=3)
    ood = report.settings["ood"]
    assert list(ood["cost_curve"]) == ["3", "4", "5"]
    assert ood["k"] in (3, 4, 5)
    assert all(cost >= 0 for cost in ood["cost_curve"].values())


def test_ood_levels_differ_and_random_levels_do_not(tmp_path):
    rows = prototype_users(PROTOS3, [60, 60, 60], noise=0.1, seed=1)
    report, _ = split(tmp_path, rows, ood=True, seed=1, test_size=0.3)
    ood, rand = report.settings["ood"], report.settings["random"]
    held = ood["clusters"][ood["holdout_cluster"]]
    for trait in BIG_FIVE:
        level = held["mode"][trait]
        # the held-out profile dominates test and is rare in train
        assert ood["levels_test"][trait][level] > 0.75
        assert ood["levels_train"][trait][level] < 0.2
        assert gap(ood, trait) > 0.6
        assert gap(rand, trait) < 0.2
        for setting in (ood, rand):
            for shares in (setting["levels_train"][trait], setting["levels_test"][trait]):
                assert sum(shares.values()) == pytest.approx(1.0, abs=0.005)


# --- left out ---------------------------------------------------------------------------------


def test_users_that_cannot_be_split_are_left_out_and_counted(tmp_path):
    good = prototype_users(PROTOS3, [4, 4, 4], noise=0.0)
    no_trait = user("missing-trait")
    del no_trait["big_five"]["neuroticism"]
    bad_level = user("bad-level")
    bad_level["big_five"]["openness"]["level"] = "very high"
    no_levels = user("no-big-five")
    del no_levels["big_five"]
    null_levels = user("null-big-five", big_five=None)
    left = [
        user("ineligible-1", eligible=False),
        user("ineligible-2", eligible=False, big_five=None),
        no_trait,
        bad_level,
        no_levels,
        null_levels,
        user("no-queries-1", queries=0),
        user("no-queries-2", queries=0),
    ]
    rows = left[:3] + good + left[3:]
    report, out = split(tmp_path, rows, ood=True, k=3)

    assert report.left_out == {"ineligible": 2, "no_big_five": 4, "no_accepted_query": 2}
    assert report.users_in == len(rows)
    assert report_of(out)["left_out"] == report.left_out
    written = set()
    for setting in ("random", "ood"):
        for name in ("train", "test"):
            written |= set(ids(out, setting, name))
    assert written == {r["user_id"] for r in good}


# --- tiny inputs --------------------------------------------------------------------------------


def test_two_users_split_one_one(tmp_path):
    report, out = split(tmp_path, [user("a", LOW), user("b", HIGH)], ood=True)
    for setting in ("random", "ood"):
        assert len(ids(out, setting, "train")) == len(ids(out, setting, "test")) == 1
        assert set(ids(out, setting, "train") + ids(out, setting, "test")) == {"a", "b"}
    assert report.settings["ood"]["k"] == 2


@pytest.mark.parametrize("k", [5, None])
def test_fewer_distinct_profiles_than_k(tmp_path, k):
    rows = [user("a", LOW), user("b", LOW), user("c", HIGH)]
    report, out = split(tmp_path, rows, ood=True, k=k)
    ood = report.settings["ood"]
    assert ood["k"] == 2
    assert list(ood["cost_curve"]) == ["2"]
    assert ood["cost_curve"]["2"] == 0.0
    assert [c["users"] for c in ood["clusters"]] == [2, 1]
    assert [level_index(c["mode"]) for c in ood["clusters"]] == [(0,) * 5, (2,) * 5]
    test = ids(out, "ood", "test")
    assert test in (["a", "b"], ["c"])
    assert sorted(test + ids(out, "ood", "train")) == ["a", "b", "c"]


def test_one_profile_cannot_be_split_ood(tmp_path):
    rows = [user(f"u{i}", MEDIUM) for i in range(6)]
    with pytest.raises(InputError, match="at least 2 different Big Five profiles"):
        split(tmp_path, rows, ood=True)
    report, _ = split(tmp_path, rows, name="random-only")  # the random split still works
    assert report.settings["random"]["test_users"] == 1


@pytest.mark.parametrize("splittable", [0, 1])
def test_fewer_than_two_splittable_users(tmp_path, splittable):
    rows = [user(f"u{i}") for i in range(splittable)] + [user("x", eligible=False), user("y", queries=0)]
    with pytest.raises(InputError, match=f"{splittable} user\\(s\\) can be split; at least 2"):
        split(tmp_path, rows)
    assert not (tmp_path / "in-out").exists()


def test_duplicate_user_ids(tmp_path):
    rows = [user("a", LOW), user("b", HIGH), user("c"), user("b", MEDIUM)]
    with pytest.raises(InputError, match="'b' appears more than once"):
        split(tmp_path, rows)
    assert not (tmp_path / "in-out").exists()


def test_row_without_user_id(tmp_path):
    rows = [user("a", LOW), {"eligible": True}, user("b", HIGH)]
    with pytest.raises(InputError, match=r"in\.jsonl:2: not a queries row \(user_id: "):
        split(tmp_path, rows)


# --- bad options --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"test_size": 0}, "--test-size"),
        ({"test_size": 1}, "--test-size"),
        ({"test_size": 1.5}, "--test-size"),
        ({"test_size": -0.1}, "--test-size"),
        ({"k": 1, "ood": True}, "--k must be at least 2"),
        ({"k_range": (5, 3), "ood": True}, "--k-min"),
        ({"k_range": (1, 4), "ood": True}, "--k-min"),
        ({"holdout": 3, "k": 3, "ood": True}, "--holdout must be a cluster id from 0 to 2"),
        ({"holdout": -1, "k": 3, "ood": True}, "--holdout"),
    ],
)
def test_bad_options(tmp_path, options, message):
    rows = prototype_users(PROTOS3, [5, 5, 5], noise=0.0)
    with pytest.raises(InputError, match=message):
        split(tmp_path, rows, **options)


def test_zero_kmodes_runs_per_k_is_a_bad_option(tmp_path):
    """BUG: seeds=0 leaves `fit` returning None -> TypeError instead of an InputError."""
    rows = prototype_users(PROTOS3, [5, 5, 5], noise=0.0)
    with pytest.raises(InputError):
        split(tmp_path, rows, ood=True, seeds=0)


# --- CLI ----------------------------------------------------------------------------------------


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def invoke(runner, *args):
    return runner.invoke(app, ["split", *(str(a) for a in args)])


def test_cli_good_run(runner, tmp_path):
    rows = prototype_users(PROTOS3, [20, 20, 20], seed=9) + [user("gone", eligible=False)]
    path = write_users(tmp_path / "queries.jsonl", rows)
    out = tmp_path / "splits"
    result = invoke(runner, "--input", path, "--out-dir", out, "--ood", "--seeds", 2, "--seed", 3)
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    err = result.stderr
    report = report_of(out)
    rand, ood = report["settings"]["random"], report["settings"]["ood"]
    assert "users read: 61 · left out: ineligible 1" in err
    for name, setting in (("random", rand), ("ood", ood)):
        assert (
            f"{name}: train {setting['train_users']} users / {setting['train_queries']} queries · "
            f"test {setting['test_users']} users / {setting['test_queries']} queries"
        ) in err
        assert f"{name}: share of users per level, train → test" in err
    assert rand["test_users"] == 6
    assert f"k = {ood['k']} (elbow); cost curve: k=2: " in err
    assert f"{ood['holdout_cluster']} (test)" in err
    lines = err.splitlines()
    header = next(line for line in lines if "cluster" in line and "users" in line)
    assert all(column in header for column in ("O", "C", "E", "A", "N"))
    assert any("openness" in line and "→" in line for line in lines)
    assert f"wrote {out}" in err
    assert sorted(p.name for p in out.iterdir()) == ["ood", "random", REPORT_FILE]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--test-size", 0], "--test-size"),
        (["--test-size", 1], "--test-size"),
        (["--test-size", 1.5], "--test-size"),
        (["--ood", "--k", 1], "--k must be at least 2"),
        (["--ood", "--k-min", 5, "--k-max", 3], "--k-min"),
    ],
)
def test_cli_bad_options_exit_2(runner, tmp_path, args, message):
    path = write_users(tmp_path / "in.jsonl", prototype_users(PROTOS3, [5, 5, 5], noise=0.0))
    out = tmp_path / "splits"
    result = invoke(runner, "--input", path, "--out-dir", out, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().startswith("Error: ")
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)
    assert not out.exists()


@pytest.mark.parametrize(
    ("rows", "args", "message"),
    [
        ([user(f"u{i}", MEDIUM) for i in range(4)], ["--ood"], "at least 2 different Big Five profiles"),
        ([user("a"), user("a")], [], "appears more than once"),
        ([user("a")], [], "at least 2 are needed"),
        (prototype_users(PROTOS3, [5, 5, 5], noise=0.0), ["--ood", "--k", 3, "--holdout", 3], "--holdout"),
    ],
    ids=["one profile", "duplicate", "one user", "holdout"],
)
def test_cli_bad_input_exit_2(runner, tmp_path, rows, args, message):
    path = write_users(tmp_path / "in.jsonl", rows)
    result = invoke(runner, "--input", path, "--out-dir", tmp_path / "splits", "--seeds", 2, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().startswith("Error: ")
    assert message in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("seed", [-1, 2**32 - 1])
def test_cli_seed_at_the_edges_is_used_or_refused_cleanly(runner, tmp_path, seed):
    """BUG: numpy refuses KModes random_state outside [0, 2**32-1] (seed + offset): ValueError."""
    path = write_users(tmp_path / "in.jsonl", prototype_users(PROTOS3, [5, 5, 5], noise=0.0))
    result = invoke(runner, "--input", path, "--out-dir", tmp_path / "splits", "--ood", "--seed", seed)
    assert result.exit_code in (0, 2), repr(result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    if result.exit_code == 2:
        assert result.stderr.strip().startswith("Error: ") and "--seed" in result.stderr


def test_cli_zero_seeds_exits_2(runner, tmp_path):
    """BUG: `--seeds 0` crashes with a TypeError traceback."""
    path = write_users(tmp_path / "in.jsonl", prototype_users(PROTOS3, [5, 5, 5], noise=0.0))
    result = invoke(runner, "--input", path, "--out-dir", tmp_path / "splits", "--ood", "--seeds", 0)
    assert result.exit_code == 2, repr(result.exception)
    assert result.stderr.strip().startswith("Error: ")


# --- re-runs ------------------------------------------------------------------------------------


def test_run_without_ood_removes_stale_ood_files(tmp_path):
    path = write_users(tmp_path / "in.jsonl", prototype_users(PROTOS3, [10, 10, 10], seed=10))
    out = tmp_path / "splits"
    split_users(path, out, ood=True, seeds=2)
    assert (out / "ood" / "train.jsonl").is_file() and (out / "ood" / "test.jsonl").is_file()
    assert list(report_of(out)["settings"]) == ["random", "ood"]

    split_users(path, out, seeds=2, ood=False)
    assert not (out / "ood" / "train.jsonl").exists()
    assert not (out / "ood" / "test.jsonl").exists()
    assert list(report_of(out)["settings"]) == ["random"]
    assert (out / "random" / "test.jsonl").is_file()


@pytest.mark.parametrize(
    ("second_rows", "options"),
    [
        ([user(f"v{i}", MEDIUM) for i in range(20)], {}),  # a single profile: OOD impossible
        (None, {"seed": 99, "k": 3, "holdout": 7}),  # holdout out of range
    ],
    ids=["one profile", "holdout"],
)
def test_failed_run_leaves_earlier_outputs_consistent(tmp_path, second_rows, options):
    """BUG: the random split is written before the OOD step can fail, so a failed run
    replaces random/{train,test}.jsonl while split_report.json (and ood/) still describe
    the earlier run."""
    first_rows = prototype_users(PROTOS3, [10, 10, 10], seed=11)
    first = write_users(tmp_path / "first.jsonl", first_rows)
    out = tmp_path / "splits"
    split_users(first, out, ood=True, seeds=2, seed=1)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    second = write_users(tmp_path / "second.jsonl", second_rows or first_rows)
    with pytest.raises(InputError):
        split_users(second, out, ood=True, seeds=2, **{"seed": 1, **options})

    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before


# --- elbow ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("costs", "expected"),
    [
        ({2: 100.0, 3: 40.0, 4: 30.0, 5: 25.0, 6: 22.0}, 3),
        ({2: 100.0, 3: 90.0, 4: 20.0, 5: 18.0, 6: 17.0, 7: 16.0}, 4),
        ({4: 30.0, 2: 100.0, 6: 22.0, 3: 40.0, 5: 25.0}, 3),  # key order does not matter
        ({3: 50.0, 4: 10.0, 5: 9.0, 6: 8.5}, 4),  # the curve need not start at 2
    ],
)
def test_elbow_finds_the_knee(costs, expected):
    assert elbow(costs) == expected


@pytest.mark.parametrize(
    "costs",
    [
        {2: 10.0, 3: 10.0, 4: 10.0, 5: 10.0},  # flat
        {2: 40.0, 3: 30.0, 4: 20.0, 5: 10.0},  # a straight line has no knee
        {3: 7.0},  # a single point
    ],
)
def test_elbow_without_a_knee_is_the_first_k(costs):
    assert elbow(costs) == min(costs)


# --- what split accepts -------------------------------------------------------------------------


def persona_row(user_id: str, profile=MEDIUM) -> dict:
    """An infer-persona row: everything a queries row has, but no `queries`."""
    row = user(user_id, profile)
    del row["queries"]
    return row


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_rows_without_queries_are_refused_with_file_line_and_field(tmp_path):
    """BUG: split took personas.jsonl (no `queries`) and wrote users with 0 queries."""
    path = write_users(tmp_path / "personas.jsonl", [persona_row("a", LOW), persona_row("b", HIGH)])
    with pytest.raises(InputError) as caught:
        split_users(path, tmp_path / "out", ood=False)
    text = str(caught.value)
    assert text.startswith(f"{path}:1: not a queries row (queries: ")
    assert "required" in text.lower()
    assert text.endswith("pass the output of gen-queries")
    assert not (tmp_path / "out").exists()


def test_a_row_without_queries_after_good_rows_names_its_line(tmp_path):
    rows = [user("a", LOW), user("b", HIGH), persona_row("c")]
    path = write_users(tmp_path / "in.jsonl", rows)
    with pytest.raises(InputError, match=r"in\.jsonl:3: not a queries row \(queries: "):
        split_users(path, tmp_path / "out", ood=False)


@pytest.mark.parametrize(
    ("breakage", "field"),
    [
        (lambda row: row["queries"][1].pop("situation"), "queries.1.situation"),
        (lambda row: row["queries"][0].update(category="XX"), "queries.0.category"),
        (lambda row: row.pop("memories"), "memories"),
        (lambda row: row["memories"][0].pop("value"), "memories.0.value"),
        (lambda row: row.update(user_id=None), "user_id"),
        (lambda row: row.update(queries="none"), "queries"),
    ],
    ids=["situation", "category", "memories", "memory value", "user_id", "queries not a list"],
)
def test_validation_errors_name_the_field(tmp_path, breakage, field):
    """The message names the field (first_problem), not "1 validation error for X"."""
    bad = user("c")
    breakage(bad)
    path = write_users(tmp_path / "in.jsonl", [user("a", LOW), bad, user("b", HIGH)])
    with pytest.raises(InputError) as caught:
        split_users(path, tmp_path / "out", ood=False)
    text = str(caught.value)
    assert text.startswith(f"{path}:2: not a queries row ({field}: "), text
    assert "validation error" not in text
    assert not (tmp_path / "out").exists()


def test_a_broken_line_names_it_without_a_hint_to_an_option_split_lacks(tmp_path):
    """BUG: the hint said "pass --on-error skip", which `split` does not accept."""
    path = write_users(tmp_path / "in.jsonl", [user("a", LOW), '{"user_id": "x",', user("b", HIGH)])
    with pytest.raises(InputError) as caught:
        split_users(path, tmp_path / "out", ood=False)
    text = str(caught.value)
    assert text.startswith(f"{path}:2: not valid JSON")
    assert "--on-error" not in text and "gen-queries" in text
    assert not (tmp_path / "out").exists()


def test_a_row_that_is_not_an_object_is_refused(tmp_path):
    path = write_users(tmp_path / "in.jsonl", [user("a", LOW), [1, 2], user("b", HIGH)])
    with pytest.raises(InputError, match=r"in\.jsonl:2: not a queries row \(a JSON object is expected\)"):
        split_users(path, tmp_path / "out", ood=False)


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"], ids=["empty", "blank lines"])
def test_empty_input_leaves_previous_outputs_untouched(tmp_path, content):
    path = write_users(tmp_path / "in.jsonl", [user("a", LOW), user("b", HIGH)])
    out = tmp_path / "out"
    split_users(path, out, ood=True, seeds=2)
    before = snapshot(tmp_path)

    path.write_bytes(content)
    before[path.name] = content
    with pytest.raises(
        InputError, match=r"in\.jsonl: the file holds no rows — pass the output of gen-queries"
    ):
        split_users(path, out, ood=False)
    assert snapshot(tmp_path) == before


def test_refused_input_leaves_previous_outputs_untouched(tmp_path):
    good = write_users(tmp_path / "queries.jsonl", [user("a", LOW), user("b", HIGH)])
    out = tmp_path / "splits"
    split_users(good, out, ood=True, seeds=2)
    personas = tmp_path / "other" / "personas.jsonl"
    write_users(personas, [persona_row("a", LOW), persona_row("b", HIGH)])
    before = snapshot(tmp_path)
    with pytest.raises(InputError):
        split_users(personas, out, ood=False)
    assert snapshot(tmp_path) == before


def test_a_big_five_of_the_wrong_shape_is_left_out_not_a_crash(tmp_path):
    """BUG: `big_five: "high"` or a trait that is not an object raised AttributeError."""
    text_profile = user("text-profile", big_five="high")
    list_trait = user("list-trait")
    list_trait["big_five"]["openness"] = ["high"]
    report, out = split(tmp_path, [user("a", LOW), user("b", HIGH), text_profile, list_trait])
    assert report.left_out == {"no_big_five": 2}
    assert sorted(ids(out, "random", "train") + ids(out, "random", "test")) == ["a", "b"]


def test_the_report_names_its_input_and_explains_what_was_left_out(tmp_path):
    rows = [user("a", LOW), user("b", HIGH), user("c", queries=0), user("d", eligible=False)]
    report, out = split(tmp_path, rows)
    written = report_of(out)
    assert written["input"] == "../in.jsonl"  # from the report's folder: a moved build reads its own
    assert report.input == str((tmp_path / "in.jsonl").resolve())
    assert written["left_out"] == {"no_accepted_query": 1, "ineligible": 1}
    # users with 0 accepted queries are left out, counted and explained in the report
    assert written["left_out_reasons"] == {
        "ineligible": LEFT_OUT_REASONS["ineligible"],
        "no_accepted_query": LEFT_OUT_REASONS["no_accepted_query"],
    }
    for name in ("train", "test"):
        assert all(row["queries"] for row in read_jsonl(out / "random" / f"{name}.jsonl"))


def test_split_records_itself_in_the_manifest(tmp_path):
    path = write_users(tmp_path / "data" / "queries.jsonl", [user("a", LOW), user("b", HIGH)])
    out = tmp_path / "data" / "splits"
    split_users(path, out, ood=False)
    entry = read_manifest(tmp_path / "data")["split"]
    assert entry["output"] == str(out)
    assert entry["input"] == str(path)
    assert entry["report"] == str(out / REPORT_FILE)
    assert entry["failures"] is None
    assert entry["full"] is True
    assert entry["finished_at"]
    stored = json.loads((tmp_path / "data" / "manifest.json").read_text(encoding="utf-8"))
    assert stored["split"]["output"] == "splits"  # inside the folder: relative, movable


def test_cli_split_of_a_personas_file_exits_2_with_one_line(runner, tmp_path):
    path = write_users(tmp_path / "personas.jsonl", [persona_row("a", LOW), persona_row("b", HIGH)])
    result = invoke(runner, "--input", path, "--out-dir", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().startswith("Error:")
    assert len(result.stderr.strip().splitlines()) == 1
    assert f"{path}:1" in result.stderr and "queries" in result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_the_elbow_sweep_over_forked_workers_clusters_as_one_process_does(monkeypatch):
    """Large splits spread the sweep's seeded fits over the cores: same clusters, same costs."""
    import random as stdlib_random

    from personaemp.dataset import split as split_stage

    rng = stdlib_random.Random(3)
    profiles = [tuple(rng.choice(split_stage.LEVELS) for _ in range(5)) for _ in range(600)]
    monkeypatch.setattr(split_stage, "PARALLEL_FITS", 10**9)
    alone = split_stage.cluster_profiles(profiles, None, (2, 5), 2, 11)
    monkeypatch.setattr(split_stage, "PARALLEL_FITS", 0)
    spread = split_stage.cluster_profiles(profiles, None, (2, 5), 2, 11)
    assert (spread.k, spread.labels, spread.modes, spread.costs) == (
        alone.k,
        alone.labels,
        alone.modes,
        alone.costs,
    )


def test_the_remembered_dissimilarity_fits_exactly_what_kmodes_alone_fits():
    """split._fit hands KModes a memo of its matching dissimilarity (for speed): the fits,
    and so the splits, must be the ones kmodes' own function gives."""
    import random as stdlib_random

    import numpy as np
    from kmodes.kmodes import KModes

    from personaemp.dataset.split import _fit

    rng = stdlib_random.Random(3)
    data = np.array([[rng.choice((0, 1, 2)) for _ in range(5)] for _ in range(400)])
    for k in (2, 4, 7):
        cost, model = _fit(data, 3, 11, k)
        plain = [KModes(n_clusters=k, init="Huang", n_init=1, random_state=s).fit(data) for s in (11, 12, 13)]
        best = min(plain, key=lambda m: m.cost_)  # the first of equal costs, as _fit keeps
        assert cost == best.cost_
        assert model.labels_.tolist() == best.labels_.tolist()
        assert model.cluster_centroids_.tolist() == best.cluster_centroids_.tolist()
        assert model.predict(data).tolist() == best.predict(data).tolist()


def test_an_input_rewritten_while_split_decides_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    """split reads the rows a second time, by offset, to write them: a file changed in
    between would put other rows (or half lines) into the splits."""
    from personaemp.dataset import split as split_stage

    path = write_users(tmp_path / "in.jsonl", [user(f"u{i:02d}") for i in range(10)])
    decide = split_stage.random_split

    def rewritten_meanwhile(*args):
        write_users(path, [user(f"other-{i:02d}") for i in range(10)])  # another size
        return decide(*args)

    monkeypatch.setattr(split_stage, "random_split", rewritten_meanwhile)
    with pytest.raises(InputError, match="changed while split was reading it"):
        split_users(path, tmp_path / "out", ood=False)
    assert not (tmp_path / "out").exists()


def test_split_holds_five_levels_per_user_not_the_rows(tmp_path):
    """What the split decides on is a Splittable per user (id, offset, levels, count)."""
    from personaemp.dataset.split import Splittable, read_users

    rows = [user(f"u{i:02d}", queries=1 + i % 3) for i in range(5)]
    path = write_users(tmp_path / "in.jsonl", rows)
    users, left_out = read_users(path)
    offsets = [0]
    for line in path.read_bytes().splitlines(keepends=True)[:-1]:
        offsets.append(offsets[-1] + len(line))
    assert not left_out
    assert users == [
        Splittable(r["user_id"], o, MEDIUM, 1 + i % 3)
        for i, (r, o) in enumerate(zip(rows, offsets, strict=True))
    ]
