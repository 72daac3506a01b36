"""Versioned task sets: manifests, changelogs, diffs, make-up statistics and decontaminated
train/eval splits (pure; files are read and written by the CLI).

A set's version is the hash of its tasks' ids and content versions (``task_set_hash``): any
change to any task, or to which tasks are in, gives a new version.
"""

from __future__ import annotations

import datetime
import hashlib
import random
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandloop.curation.difficulty import Difficulty
from sandloop.curation.fingerprints import contamination, fingerprint, near_duplicates
from sandloop.curation.problems import TaskReport
from sandloop.tasks import Task

__all__ = [
    "MANIFEST_SCHEMA",
    "Manifest",
    "SetDiff",
    "diff_sets",
    "make_manifest",
    "make_up",
    "released",
    "set_version",
    "split_tasks",
    "tier_of_task",
]

MANIFEST_SCHEMA = "sandloop.taskset-manifest/v1"


def set_version(tasks: Sequence[Task]) -> str:
    """Hash of the set's task ids and versions, in order."""
    blob = "\n".join(f"{t.id}@{t.version}" for t in tasks)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def tier_of_task(task: Task, grades: Mapping[str, Difficulty] | None = None) -> str:
    """The task's tier: from ``grades``, else its ``difficulty`` when that names a tier,
    else ``ungraded``."""
    if grades and task.id in grades:
        return grades[task.id].tier
    if isinstance(task.difficulty, str) and task.difficulty:
        return task.difficulty
    return "ungraded"


def make_up(tasks: Sequence[Task], grades: Mapping[str, Difficulty] | None = None
            ) -> dict[str, Any]:
    """Counts per split, tier, tag, language, test kind, and hidden/public test counts."""
    hidden = [len(t.hidden_tests) for t in tasks]
    public = [len(t.public_tests) for t in tasks]

    def dist(xs: list[int]) -> dict[str, float]:
        if not xs:
            return {}
        return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "total": sum(xs)}

    return {
        "tasks": len(tasks),
        "split": dict(Counter(t.split for t in tasks)),
        "tier": dict(Counter(tier_of_task(t, grades) for t in tasks)),
        "tag": dict(Counter(tag for t in tasks for tag in t.tags).most_common()),
        "language": dict(Counter(t.language for t in tasks)),
        "test_kind": dict(Counter(t.test_kind for t in tasks)),
        "with_reference": sum(t.reference_solution is not None for t in tasks),
        "hidden_tests": dist(hidden),
        "public_tests": dist(public),
    }


class Removal(BaseModel):
    """One task left out of a curated set, and why."""

    model_config = ConfigDict(frozen=True)

    id: str
    version: str
    codes: list[str]
    details: list[str]


class Manifest(BaseModel):
    """What a curated set is: its version, make-up, and what was removed from its source."""

    model_config = ConfigDict(frozen=True)

    schema_: str = Field(MANIFEST_SCHEMA, alias="schema")
    set_version: str
    source: str
    source_version: str
    counts: dict[str, Any]
    kept: int
    removed: list[Removal]
    review: list[str] = Field(default_factory=list, description="kept, but marked for review")
    validation: dict[str, Any] = Field(default_factory=dict, description="the checks' options")


def make_manifest(source: str, source_tasks: Sequence[Task], reports: Sequence[TaskReport],
                  *, drop_review: bool = False,
                  grades: Mapping[str, Difficulty] | None = None,
                  validation: Mapping[str, Any] | None = None) -> tuple[list[Task], Manifest]:
    """The kept tasks (not rejected; with ``drop_review`` also not under review) and the
    manifest describing them and the removals."""
    by_id = {r.id: r for r in reports}
    drop = {"reject", "review"} if drop_review else {"reject"}
    kept = [t for t in source_tasks if by_id[t.id].verdict not in drop]
    removed = [
        Removal(id=r.id, version=r.version, codes=sorted(r.codes),
                details=[f"{p.code.value}: {p.detail}" for p in r.problems])
        for r in reports if r.verdict in drop
    ]
    review = [r.id for r in reports if r.verdict == "review" and not drop_review]
    manifest = Manifest(set_version=set_version(kept), source=source,
                        source_version=set_version(source_tasks),
                        counts=make_up(kept, grades), kept=len(kept), removed=removed,
                        review=review, validation=dict(validation or {}))
    return kept, manifest


class SetDiff(BaseModel):
    """What changed between two versions of a task set."""

    model_config = ConfigDict(frozen=True)

    a_version: str
    b_version: str
    added: list[str]
    removed: list[str]
    changed: list[str] = Field(description="same id, different content version")
    unchanged: int


def diff_sets(a: Sequence[Task], b: Sequence[Task]) -> SetDiff:
    """Ids added, removed and changed from ``a`` to ``b``."""
    va, vb = {t.id: t.version for t in a}, {t.id: t.version for t in b}
    return SetDiff(
        a_version=set_version(a), b_version=set_version(b),
        added=[i for i in vb if i not in va], removed=[i for i in va if i not in vb],
        changed=[i for i in vb if i in va and va[i] != vb[i]],
        unchanged=sum(1 for i in vb if va.get(i) == vb[i]),
    )


def _clusters(tasks: Sequence[Task], *, n: int, overlap: float) -> list[list[int]]:
    """Groups of tasks linked by near-duplication or shared long n-grams (union-find)."""
    parent = list(range(len(tasks)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    index = {t.id: i for i, t in enumerate(tasks)}
    prints = [fingerprint(t) for t in tasks]
    links = [(m.id, m.other) for m in near_duplicates(prints)]
    links += [(m.id, m.other) for m in contamination(prints, prints, n=n, overlap=overlap)]
    for x, y in links:
        parent[find(index[x])] = find(index[y])
    groups: dict[int, list[int]] = {}
    for i in range(len(tasks)):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


def released(task: Task) -> str | None:
    """The task's release date (``YYYY-MM-DD``) from its ``released:`` tag, if any."""
    return next((t.removeprefix("released:") for t in task.tags if t.startswith("released:")),
                None)


def _date(text: str, what: str) -> datetime.date:
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a YYYY-MM-DD date") from None


def split_tasks(tasks: Sequence[Task], eval_fraction: float | None = None, *, seed: int = 0,
                grades: Mapping[str, Difficulty] | None = None, ngram: int = 13,
                overlap: float = 0.2, released_after: str | None = None
                ) -> tuple[list[Task], list[Task]]:
    """``(train, eval)``: about ``eval_fraction`` of the tasks in eval, stratified by tier and
    first tag, with near-duplicates and n-gram-sharing tasks kept on one side together — or,
    with ``released_after``, the tasks released on or after that date in eval (tasks without a
    date go to train). Either way no eval task is left contaminated by a train task (such tasks
    move to train). Tasks get their ``split`` field set (and so new versions); order within each
    side follows the input."""
    if released_after is not None:
        # Dates, not strings: "2024-1-5" sorts after "2024-10-01" as text.
        after = _date(released_after, "released_after")
        recent = {i for i, t in enumerate(tasks)
                  if (day := released(t)) is not None and _date(day, t.id) >= after}
        return _finish(tasks, recent, ngram, overlap)
    if eval_fraction is None or not 0 < eval_fraction < 1:
        raise ValueError(f"eval fraction must be between 0 and 1, got {eval_fraction}")
    clusters = _clusters(tasks, n=ngram, overlap=overlap)
    strata: dict[tuple[str, str], list[list[int]]] = {}
    for c in clusters:
        t = tasks[c[0]]
        strata.setdefault((tier_of_task(t, grades), t.tags[0] if t.tags else ""), []).append(c)
    rng = random.Random(seed)
    chosen: set[int] = set()
    seen = 0
    for key in sorted(strata):
        group = strata[key]
        rng.shuffle(group)
        seen += sum(len(c) for c in group)
        # Cumulative rounding: small strata's remainders add up instead of all rounding to 0.
        want = round(seen * eval_fraction) - len(chosen)
        got = 0
        for c in group:
            if got >= want:
                break
            if got + len(c) > want and got > 0:
                continue
            chosen.update(c)
            got += len(c)
    return _finish(tasks, chosen, ngram, overlap)


def _finish(tasks: Sequence[Task], chosen: set[int], ngram: int, overlap: float
            ) -> tuple[list[Task], list[Task]]:
    ev = [t.model_copy(update={"split": "eval"}) for i, t in enumerate(tasks) if i in chosen]
    tr = [t.model_copy(update={"split": "train"}) for i, t in enumerate(tasks) if i not in chosen]
    # A final check (clusters link each task to its best match only): move stragglers to train.
    while True:
        bad = {m.id for m in contamination([fingerprint(t) for t in ev],
                                            [fingerprint(t) for t in tr], n=ngram,
                                            overlap=overlap)}
        if not bad:
            break
        tr += [t for t in ev if t.id in bad]
        ev = [t for t in ev if t.id not in bad]
    order = {t.id: i for i, t in enumerate(tasks)}
    # New content (the split field) means a new version: rebuild through validation.
    train = sorted((Task.model_validate({**t.model_dump(), "version": ""}) for t in tr),
                   key=lambda t: order[t.id])
    evals = sorted((Task.model_validate({**t.model_dump(), "version": ""}) for t in ev),
                   key=lambda t: order[t.id])
    return train, evals
