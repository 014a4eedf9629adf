"""`personaemp split`: user-level train/test splits, random and out-of-distribution (OOD).

Random: users shuffled with a seed, `test_size` of them to test (the paper's 9:1).
OOD: users clustered on their five Big Five levels with KModes; one whole cluster is the
test set, so test personalities are profiles the training data never shows. Splitting
is by user, never by query: no user is in two splits.

The input must be gen-queries' output (every row has `queries`). Users that cannot be
split are left out and counted by reason in split_report.json, which also explains each
reason (`left_out_reasons`): ineligible personas, users without a complete Big Five
profile, and users with 0 accepted queries (they would publish no row). The report also
names the input file, so `push` can find the earlier stages' reports (manifest.py).
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
from rich.table import Table

from personaemp import manifest
from personaemp.dataset.options import SplitOptions
from personaemp.errors import InputError, RowError
from personaemp.io import ErrorPolicy, atomic_output, file_stamp, iter_jsonl, read_jsonl_at, write_json_atomic
from personaemp.manifest import record_stage
from personaemp.parallel import fork_map
from personaemp.records import BIG_FIVE
from personaemp.results import StageResult, of_split
from personaemp.splits import (
    LEVELS,
    REPORT_FILE,
    check_queries_row,
    profile_of,
)

STAGE = "split"
# Why a user is left out of every split; written into the report, so it documents itself.
LEFT_OUT_REASONS = {
    "ineligible": "the persona failed infer-persona's depth gate (eligible: false)",
    "no_big_five": "no complete Big Five profile (five levels, each low, medium or high)",
    "no_accepted_query": "no query passed gen-queries' checks: a user is published through "
    "their queries, so a user with none has nothing to train or test on",
}


# --- what a queries row must hold to be split and published ----------------------------------


_DEFAULT = SplitOptions()  # the command's defaults are the function's


@dataclass
class SplitReport:
    users_in: int = 0
    left_out: dict[str, int] = field(default_factory=dict)  # reason -> users
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    input: str = ""  # the queries file read (absolute; the file: relative to it): push follows it back
    unchanged_since: str | None = None  # set when skipped: its one line (manifest.py), not saved

    def as_dict(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "users_in": self.users_in,
            "left_out": self.left_out,
            "left_out_reasons": {reason: LEFT_OUT_REASONS[reason] for reason in sorted(self.left_out)},
            "settings": self.settings,
        }


@dataclass(frozen=True)
class Splittable:
    """What the split decides on, per user: the file holds the rest of the row, read again
    only when it is written (a row is tens of KB; these are five levels and two numbers)."""

    user_id: str
    offset: int  # of the row's line in the input
    profile: tuple[str, ...]  # the five levels in BIG_FIVE order
    queries: int  # accepted queries


def read_users(path: Path) -> tuple[list[Splittable], Counter]:
    """Users that can be split, and the others counted by reason (see LEFT_OUT_REASONS).

    Every row must be a queries row (the output of gen-queries): a persona or filter row,
    which has no `queries`, is refused with its file:line, not split into 0-query users.
    One row at a time: memory holds a `Splittable` per user, not the rows.
    """
    users, left_out, read = [], Counter(), 0
    try:
        for lineno, offset, row in iter_jsonl(path, ErrorPolicy("fail")):
            read += 1
            record = check_queries_row(row, f"{path}:{lineno}", "pass the output of gen-queries")
            profile = profile_of(row)
            if not record.eligible:
                left_out["ineligible"] += 1
            elif profile is None:
                left_out["no_big_five"] += 1
            elif not record.queries:
                left_out["no_accepted_query"] += 1
            else:
                levels = tuple(LEVELS[LEVELS.index(level)] for level in profile)  # shared strings
                users.append(Splittable(str(row["user_id"]), offset, levels, len(record.queries)))
    except RowError as error:  # split has no --on-error: the row's own hint would mislead
        raise InputError(f"{error.location}: {error.reason}", "fix the line or re-run gen-queries") from None
    if not read:
        raise InputError(f"{path}: the file holds no rows", "pass the output of gen-queries")
    ids = Counter(user.user_id for user in users)
    repeated = [uid for uid, count in ids.items() if count > 1]
    if repeated:
        raise InputError(
            f"{path}: user {repeated[0]!r} appears more than once",
            "re-run gen-queries into a fresh --output, or keep one line per user",
        )
    return users, left_out


def random_split(users: Sequence[Splittable], test_size: float, seed: int) -> tuple[list, list]:
    ordered = sorted(users, key=lambda user: user.user_id)
    random.Random(seed).shuffle(ordered)
    test_count = round(len(ordered) * test_size)
    if len(ordered) >= 2:
        test_count = min(max(test_count, 1), len(ordered) - 1)
    return ordered[test_count:], ordered[:test_count]


@dataclass
class Clustering:
    k: int
    labels: list[int]  # stable cluster id per user
    modes: list[tuple[str, ...]]  # per stable id
    costs: dict[int, float]  # k -> best cost over seeds (the elbow curve)


def cluster_profiles(
    profiles: Sequence[tuple[str, ...]], k: int | None, k_range: tuple[int, int], seeds: int, seed: int
) -> Clustering:
    """KModes on the levels; stable ids order clusters by their mode profile."""
    import numpy as np

    data = np.array([[LEVELS.index(level) for level in p] for p in profiles])
    distinct = len({tuple(row) for row in data.tolist()})
    if distinct < 2:
        raise InputError(
            "the OOD split needs users with at least 2 different Big Five profiles",
            "pass --no-ood for the random split alone, or split a build with more users",
        )

    low, high = k_range
    if k is not None:
        candidates = [min(k, distinct)]
    else:
        candidates = list(range(max(2, low), min(high, distinct) + 1)) or [2]
    import kmodes.kmodes  # noqa: F401  (imported before the workers fork)

    # The elbow sweep's 35 fits took 2.5 s of a 1,100-user split; each fit is seeded, so
    # spreading them over the cores changes no result.
    biggest_first = sorted(candidates, reverse=True)  # a fit takes longer the more clusters: no straggler
    fits = fork_map(partial(_fit, data, seeds, seed), biggest_first, worth_it=len(data) >= PARALLEL_FITS)
    fitted = dict(zip(biggest_first, fits, strict=True))
    costs = {n: cost for n, (cost, _) in fitted.items()}
    chosen = candidates[0] if len(candidates) == 1 else elbow(costs)
    model = fitted[chosen][1]
    # kmodes can silently use fewer clusters (labels_ is then None): predict instead.
    raw = model.predict(data).tolist()
    centroids = [tuple(LEVELS[int(v)] for v in row) for row in model.cluster_centroids_]
    used = sorted(set(raw), key=lambda c: tuple(LEVELS.index(v) for v in centroids[c]))
    stable = {old: new for new, old in enumerate(used)}
    return Clustering(
        k=len(used),
        labels=[stable[c] for c in raw],
        modes=[centroids[old] for old in used],
        costs=costs,
    )


def _fit(data, seeds: int, seed: int, n_clusters: int) -> tuple[float, Any]:
    """The lowest-cost KModes fit of `seeds` runs with `n_clusters`."""
    from kmodes.kmodes import KModes
    from kmodes.util.dissim import matching_dissim

    best = None
    for offset in range(seeds):
        # numpy seeds must lie in [0, 2**32): wrap any integer --seed into that range.
        state = (seed + offset) % 2**32
        model = KModes(
            n_clusters=n_clusters,
            init="Huang",
            n_init=1,
            random_state=state,
            cat_dissim=_remembered_matching(),
        )
        model.fit(data)
        model.cat_dissim = matching_dissim  # the same function, without the memo (the model is pickled)
        if best is None or model.cost_ < best[0]:
            best = (float(model.cost_), model)
    return best


def _remembered_matching():
    """kmodes' matching dissimilarity (unequal levels per centroid), remembered per
    (centroids, point): 1,000 users have at most 243 distinct profiles, and kmodes asks
    point by point. The same numbers, so the same fit; 30% less time."""
    import numpy as np

    memo: dict[tuple[bytes, bytes], Any] = {}

    def dissim(centroids, point, **_):
        # As integers: kmodes' centroids may be object arrays, whose bytes are pointers.
        key = (np.asarray(centroids, dtype=np.int64).tobytes(), np.asarray(point, dtype=np.int64).tobytes())
        found = memo.get(key)
        if found is None:
            found = memo[key] = np.sum(centroids != point, axis=1)
        return found

    return dissim


PARALLEL_FITS = 500  # users from which the sweep's fits are spread over the cores


def elbow(costs: dict[int, float]) -> int:
    """The smallest k that fits perfectly (cost 0), else the k farthest below the straight
    line from the first to the last point of the cost curve."""
    ks = sorted(costs)
    perfect = [n for n in ks if costs[n] == 0]
    if perfect:
        return perfect[0]
    first, last = ks[0], ks[-1]
    if costs[first] == costs[last]:
        return first
    slope = (costs[last] - costs[first]) / (last - first)
    return max(ks, key=lambda n: (costs[first] + slope * (n - first)) - costs[n])


def choose_holdout(sizes: Counter, total: int, test_size: float, holdout: int | None, k: int) -> int:
    if holdout is not None:
        if not 0 <= holdout < k:
            raise InputError(
                f"--holdout must be a cluster id from 0 to {k - 1}", "leave --holdout out to pick by size"
            )
        if sizes[holdout] == total:
            raise InputError(
                f"cluster {holdout} holds every user: nothing would be left to train on",
                "raise --k, or leave --holdout out",
            )
        return holdout
    target = test_size * total
    candidates = [c for c in range(k) if 0 < sizes[c] < total]
    return min(candidates, key=lambda c: (abs(sizes[c] - target), c))


def level_distribution(users: Sequence[Splittable]) -> dict[str, dict[str, float]]:
    """Per trait, the share of users at each level."""
    result = {}
    for index, trait in enumerate(BIG_FIVE):
        counts = Counter(user.profile[index] for user in users)
        result[trait] = {level: round(counts[level] / len(users), 3) if users else 0.0 for level in LEVELS}
    return result


def _write(source: Path, folder: Path, train: Sequence[Splittable], test: Sequence[Splittable]) -> None:
    """Each part's rows, read from `source` at their offsets, written as today's decode and
    re-encode of the whole row did (the same bytes)."""
    with source.open("rb") as handle:
        for name, users in (("train", train), ("test", test)):
            with atomic_output(folder / f"{name}.jsonl") as out:
                for user in users:
                    out.write(msgspec.json.encode(read_jsonl_at(handle, user.offset)) + b"\n")


def _summary(train: Sequence[Splittable], test: Sequence[Splittable]) -> dict[str, Any]:
    return {
        "train_users": len(train),
        "test_users": len(test),
        "train_queries": sum(user.queries for user in train),
        "test_queries": sum(user.queries for user in test),
        "levels_train": level_distribution(train),
        "levels_test": level_distribution(test),
    }


def _too_few_hint(input_path: Path, left_out) -> str:
    """What to do: see why the checks rejected the queries, when they did; else build more users."""
    if left_out.get("no_accepted_query"):
        return (
            f"the checks rejected every query of {left_out['no_accepted_query']} user(s): "
            f"{input_path.with_name('rejected.jsonl')} has each rejected query with the checks it "
            "failed (checks.reasons); use a stronger model or other [queries] enforce checks and "
            "re-run gen-queries; `personaemp stats` shows where users drop out"
        )
    return (
        "build more users: raise infer-persona's --limit (or leave it out) and re-run "
        "gen-queries; `personaemp stats` shows where users drop out"
    )


def split_users(
    input_path: Path,
    out_dir: Path,
    *,
    ood: bool = _DEFAULT.ood,
    seed: int = _DEFAULT.seed,
    test_size: float = _DEFAULT.test_size,
    k: int | None = _DEFAULT.k,
    k_range: tuple[int, int] = (_DEFAULT.k_min, _DEFAULT.k_max),
    holdout: int | None = _DEFAULT.holdout,
    seeds: int = _DEFAULT.seeds,
    force: bool = _DEFAULT.force,
) -> StageResult:
    """Write splits/random (and with `ood`, splits/ood) train/test files and the report;
    returns the StageResult (`.report`: the SplitReport), as `pe.split_users` does.
    The defaults are `personaemp split`'s (personaemp.options.SplitOptions). Skipped, the
    last report back with its `unchanged_since` line, when the input, options and code are
    those of the last finished run and its files are as it left them (`force`: never)."""
    if not 0 < test_size < 1:
        raise InputError("--test-size must be between 0 and 1")
    if k is not None and k < 2:
        raise InputError("--k must be at least 2")
    if k_range[0] < 2 or k_range[0] > k_range[1]:
        raise InputError("--k-min must be at least 2 and at most --k-max")
    if seeds < 1:
        raise InputError("--seeds must be at least 1")
    input_path, out_dir = Path(input_path), Path(out_dir)
    options = {"ood": ood, "seed": seed, "test_size": test_size, "k": k, "k_range": k_range,
               "holdout": holdout, "seeds": seeds}  # fmt: skip
    fingerprint = manifest.fingerprint([input_path], options)
    last = manifest.current(STAGE, out_dir, fingerprint, force)
    if last is not None:
        kept = {key: value for key, value in last["result"].items() if key != "left_out_reasons"}
        kept["input"] = manifest.resolved(kept.get("input"), out_dir)
        return of_split(SplitReport(**kept, unchanged_since=manifest.unchanged(STAGE, last)), out_dir)
    stamp = file_stamp(input_path) if input_path.is_file() else None  # else read_users says why
    users, left_out = read_users(input_path)
    users.sort(key=lambda user: user.user_id)  # the input's order must not matter
    if len(users) < 2:
        reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(left_out.items()))
        raise InputError(
            f"{input_path}: {len(users)} user(s) can be split; at least 2 are needed"
            + (f" (left out: {reasons})" if reasons else ""),
            _too_few_hint(Path(input_path), left_out),
        )
    report = SplitReport(
        users_in=len(users) + sum(left_out.values()),
        left_out=dict(left_out),
        input=os.path.abspath(input_path),
    )

    # Everything is computed before anything is written: a run that fails (e.g. on the
    # OOD options) leaves the previous outputs as they were, consistent with each other.
    splits = {"random": random_split(users, test_size, seed)}
    report.settings["random"] = {"seed": seed, "test_size": test_size, **_summary(*splits["random"])}

    if ood:
        clustering = cluster_profiles([user.profile for user in users], k, k_range, seeds, seed)
        sizes = Counter(clustering.labels)
        chosen = choose_holdout(sizes, len(users), test_size, holdout, clustering.k)
        train = [u for u, c in zip(users, clustering.labels, strict=True) if c != chosen]
        test = [u for u, c in zip(users, clustering.labels, strict=True) if c == chosen]
        splits["ood"] = (train, test)
        report.settings["ood"] = {
            "seed": seed,
            "k": clustering.k,
            "k_fixed": k is not None,
            "cost_curve": {str(n): cost for n, cost in sorted(clustering.costs.items())},
            "holdout_cluster": chosen,
            "clusters": [
                {"id": c, "mode": dict(zip(BIG_FIVE, clustering.modes[c], strict=True)), "users": sizes[c]}
                for c in range(clustering.k)
            ],
            **_summary(train, test),
        }
    if file_stamp(input_path) != stamp:  # the rows are read again by offset
        raise InputError(f"{input_path} changed while split was reading it", "run split again")
    for setting, (train, test) in splits.items():
        _write(input_path, out_dir / setting, train, test)
    if not ood:  # an OOD split from an earlier run would no longer match the random one
        for name in ("train", "test"):
            (out_dir / "ood" / f"{name}.jsonl").unlink(missing_ok=True)
    # The input as the report's folder reaches it within the build: a moved build reads its own.
    saved = {**report.as_dict(), "input": manifest.stored(report.input, out_dir, out_dir.parent)}
    write_json_atomic(out_dir / REPORT_FILE, saved)
    record_stage(out_dir, STAGE, report=out_dir / REPORT_FILE, failures=None, full=True, input=input_path)
    written = [out_dir / setting / f"{name}.jsonl" for setting in splits for name in ("train", "test")]
    manifest.record(STAGE, out_dir, fingerprint, [*written, out_dir / REPORT_FILE], saved)
    return of_split(report, out_dir)


# --- from options (the command, pe.* and `run`) ---------------------------------------------------


def from_options(options: SplitOptions, console):
    """`personaemp split` on its options."""
    return split_users(
        options.input, options.out_dir, ood=options.ood, seed=options.seed, test_size=options.test_size,
        k=options.k, k_range=(options.k_min, options.k_max), holdout=options.holdout, seeds=options.seeds,
        force=options.force,
    )  # fmt: skip


def print_summary(result, console) -> None:
    """`personaemp split`'s summary: users per setting and part, the clusters, the levels."""
    report, out_dir = result.report, result.output
    if report.unchanged_since:
        return console.print(report.unchanged_since)
    left = ", ".join(f"{reason} {count}" for reason, count in sorted(report.left_out.items())) or "none"
    console.print(f"users read: {report.users_in} · left out: {left}")
    for name, setting in report.settings.items():
        console.print(
            f"[bold]{name}[/]: train {setting['train_users']} users / {setting['train_queries']} queries · "
            f"test {setting['test_users']} users / {setting['test_queries']} queries"
        )
        if name == "ood":
            curve = ", ".join(f"k={k}: {cost:g}" for k, cost in setting["cost_curve"].items())
            fixed = "fixed" if setting["k_fixed"] else "elbow"
            console.print(f"  k = {setting['k']} ({fixed}); cost curve: {curve}")
            clusters = Table(title_justify="left")
            for column in ("cluster", "users", "O", "C", "E", "A", "N"):
                clusters.add_column(column)
            for cluster in setting["clusters"]:
                held = " (test)" if cluster["id"] == setting["holdout_cluster"] else ""
                clusters.add_row(f"{cluster['id']}{held}", str(cluster["users"]), *cluster["mode"].values())
            console.print(clusters)
        levels = Table(title=f"{name}: share of users per level, train → test", title_justify="left")
        levels.add_column("trait")
        for level in ("low", "medium", "high"):
            levels.add_column(level, justify="right")
        for trait, shares in setting["levels_train"].items():
            test = setting["levels_test"][trait]
            levels.add_row(trait, *(f"{shares[lv]:.2f} → {test[lv]:.2f}" for lv in ("low", "medium", "high")))
        console.print(levels)
    console.print(f"wrote {out_dir}")
