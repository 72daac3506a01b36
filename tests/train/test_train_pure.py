"""The loop's pure parts (no torch): toy set, its curriculum (the curation layer's TaskSampler
as the loop builds it), eval statistics."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandloop.curation.sampler import UNIFORM_CURRICULUM, TaskSampler
from sandloop.curation.sampler import level_of as tier_of
from sandloop.tasks import Task, load_tasks
from sandloop.train.evaluate import pass_rate_ci
from sandloop.train.toyset import build_toy_tasks, toy_path, weaken


def test_bundled_toy_set_is_the_generated_one() -> None:
    bundled = load_tasks(toy_path())
    assert [t.to_json() for t in bundled] == [t.to_json() for t in build_toy_tasks()]


def test_toy_set_has_three_tiers_in_both_splits() -> None:
    tasks = build_toy_tasks()
    for tier in (1, 2, 3):
        splits = {t.split for t in tasks if tier_of(t) == tier}
        assert splits == {"train", "eval"}
    assert all(t.reference_solution for t in tasks)


def test_weak_twin_drops_every_output_check() -> None:
    for t in build_toy_tasks()[::50]:
        w = weaken(t)
        assert w.id == "weak:" + t.id and w.prompt == t.prompt
        if t.test_kind == "stdio":
            assert w.checker is not None and "sys.exit(0)" in w.checker.source
        else:
            assert w.test_kind == "script" and not w.hidden_tests
            assert "expected" not in json.dumps(w.model_dump(mode="json")["public_tests"])


def _loop_sampler(tasks: list[Task], seed: int, min_groups: int = 3) -> TaskSampler:
    # as sandloop.train.loop.train_sampler builds it (that module needs torch)
    return TaskSampler(tasks, curriculum=UNIFORM_CURRICULUM, weighting="task", flat_weight=0.25,
                       levels=True, seed=seed, min_groups=min_groups)


def test_curriculum_opens_tiers_in_order() -> None:
    tasks = build_toy_tasks()
    cur = _loop_sampler([t for t in tasks if t.split == "train"], seed=1)
    first = cur.sample_ids(64)
    assert {tid.split("/")[1] for tid in first} == {"print"}
    # failing groups keep the tier closed
    cur.filter_groups([(tid, [0.0, 1.0, 0.0, 0.0], i) for i, tid in enumerate(first[:3])])
    assert cur.open_levels() == [1]
    # a tier that passes opens the next one, and only that one
    cur.filter_groups([(tid, [1.0, 1.0, 0.0, 1.0], i) for i, tid in enumerate(first[3:9])])
    assert cur.open_levels() == [1, 2]
    drawn = cur.sample_ids(512)
    assert {tid.split("/")[1] for tid in drawn} == {"print", "expr"}


def test_curriculum_steers_away_from_zero_variance_groups_and_counts_them() -> None:
    tasks = [t for t in build_toy_tasks() if t.split == "train" and tier_of(t) == 1][:3]
    cur = _loop_sampler(tasks, seed=0)
    a, b, c = (t.id for t in tasks)
    cur.filter_groups([(a, [1.0, 1.0, 1.0], 0), (b, [0.0, 0.0, 0.0], 1), (c, [0.0, 1.0, 0.0], 2)])
    assert cur.dropped_groups == 2 and cur.kept_groups == 1
    drawn = cur.sample_ids(3000)
    assert drawn.count(c) > 0.6 * len(drawn)  # weight 1 against 0.25 + 0.25
    assert drawn.count(a) > 0 and drawn.count(b) > 0  # still reachable
    cur.filter_groups([(a, [1.0, 0.0, 1.0], 3)])  # a varies again: full weight
    assert cur.sample_ids(3000).count(a) > 0.3 * 3000


def test_pass_rate_ci() -> None:
    r = pass_rate_ci([1.0, 0.0, 0.5, 0.5])
    assert r["pass_rate"] == pytest.approx(0.5) and r["tasks"] == 4
    lo, hi = r["ci95"]
    assert 0.0 <= lo < 0.5 < hi <= 1.0
    assert pass_rate_ci([1.0, 1.0])["ci95"] == [1.0, 1.0]
    assert pass_rate_ci([])["pass_rate"] is None


def test_train_without_the_extra_says_how_to_install_it(tmp_path: Path) -> None:
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("the train extra is installed here")
    r = subprocess.run([sys.executable, "-m", "sandloop.cli.main", "train", "--out",
                        str(tmp_path / "run"), "--steps", "1"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert "pip install 'sandloop[train]'" in r.stderr


def test_help_lists_train_without_importing_torch() -> None:
    code = ("import sys; from sandloop.cli.main import app; "
            "assert 'torch' not in sys.modules and 'trl' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
