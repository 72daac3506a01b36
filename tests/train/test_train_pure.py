"""The loop's pure parts (no torch): toy set, curriculum, audit decision, eval statistics."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandloop.tasks import load_tasks
from sandloop.train.audit import audit_verdict
from sandloop.train.curriculum import Curriculum, TieredCurriculum, tier_of
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


def test_curriculum_opens_tiers_in_order() -> None:
    tasks = build_toy_tasks()
    cur = TieredCurriculum([t for t in tasks if t.split == "train"], seed=1, min_groups=3)
    assert isinstance(cur, Curriculum)
    first = cur.draw(64, {})
    assert {tid.split("/")[1] for tid in first} == {"print"}
    # failing groups keep the tier closed
    cur.update(0, {tid: [0.0, 1.0, 0.0, 0.0] for tid in first[:3]})
    assert cur.open_tiers() == [1]
    # a tier that passes opens the next one, and only that one
    cur.update(1, {tid: [1.0, 1.0, 0.0, 1.0] for tid in first[3:9]})
    assert cur.open_tiers() == [1, 2]
    drawn = cur.draw(512, {})
    assert {tid.split("/")[1] for tid in drawn} == {"print", "expr"}


def test_curriculum_steers_away_from_zero_variance_groups_and_counts_them() -> None:
    tasks = [t for t in build_toy_tasks() if t.split == "train" and tier_of(t) == 1][:3]
    cur = TieredCurriculum(tasks, seed=0)
    a, b, c = (t.id for t in tasks)
    cur.update(0, {a: [1.0, 1.0, 1.0], b: [0.0, 0.0, 0.0], c: [0.0, 1.0, 0.0]})
    assert cur.dropped() == 2 and cur.groups() == 3
    drawn = cur.draw(3000, {})
    assert drawn.count(c) > 0.6 * len(drawn)  # weight 1 against 0.25 + 0.25
    assert drawn.count(a) > 0 and drawn.count(b) > 0  # still reachable
    cur.update(1, {a: [1.0, 0.0, 1.0], b: [0.0, None, None]})  # one known reward: no variance
    assert cur.dropped() == 2
    assert cur.draw(3000, {}).count(a) > 0.3 * 3000


def test_audit_verdict() -> None:
    # trained high, audited low: alert
    assert audit_verdict(0.9, [1.0] * 4, [0.0, 0.0, 1.0, None], train_high=0.6, gap=0.4)[0]
    # the proper reward: audit agrees with training
    assert not audit_verdict(0.9, [1.0] * 4, [1.0] * 4, train_high=0.6, gap=0.4)[0]
    # training reward not high yet: no alert
    assert not audit_verdict(0.3, [1.0] * 4, [0.0] * 4, train_high=0.6, gap=0.4)[0]
    # nothing could be audited (infrastructure failed): no verdict
    assert audit_verdict(0.9, [1.0], [None], train_high=0.6, gap=0.4) == (False, None)
    # too few audited completions to tell a hack from noise
    assert not audit_verdict(0.9, [1.0] * 4, [0.0] * 4, train_high=0.6, gap=0.4,
                             min_audited=8)[0]


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
