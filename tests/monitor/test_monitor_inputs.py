"""Hostile inputs to the monitor: out-of-range and unencodable record fields, SQLite files that
are not rollout logs, logs mixing runs, the audit's rearm rule, the signature prefilter."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandloop.monitor.detectors import AuditOutcome, AuditRearm, Thresholds, detect_audit_failures
from sandloop.monitor.live import LiveMonitor
from sandloop.monitor.records import LogFormatError, Rollout, rollout_from_dict
from sandloop.monitor.rolloutlog import RolloutLog, RolloutLogError
from sandloop.monitor.signatures import SIGNATURES, scan
from sandloop.monitor.stats import StepAggregator
from sandloop.store import ResultStore

SANDLOOP = [sys.executable, "-m", "sandloop.cli.main"]
HUGE = 10**400


def sh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SANDLOOP, *args], capture_output=True, text=True, timeout=240)


def base(**kw: Any) -> dict[str, Any]:
    return {"step": 0, "task_id": "t", "completion": "x", "reward": 1.0, **kw}


@pytest.mark.parametrize(("field", "value"), [
    ("step", HUGE), ("step", 2**63), ("reward", HUGE), ("reward", 1e300),
    ("wall_time_s", HUGE), ("wall_time_s", float("nan")), ("wall_time_s", float("inf")),
    ("wall_time_s", -1.0), ("difficulty", HUGE), ("difficulty", float("nan")),
    ("difficulty", float("-inf")), ("public_passed", 2**63), ("group", HUGE),
    ("completion", "x\ud800"), ("task_id", "t\udcff"), ("source", "s\ud800"),
    ("verdict", "\ud800"), ("run_id", "r\ud800"), ("group", "g\ud800"),
    ("difficulty", "hard\ud800"),
])
def test_every_out_of_range_field_is_a_format_error_naming_it(field: str, value: Any) -> None:
    with pytest.raises(LogFormatError, match=f"^f.jsonl:3: field '{field}': "):
        rollout_from_dict(base(**{field: value}), "f.jsonl:3")


def test_the_largest_storable_values_still_pass() -> None:
    r = rollout_from_dict(base(step=2**63 - 1, wall_time_s=0, difficulty=7, reward=-3,
                               completion="é 🎉"))
    assert r.step == 2**63 - 1 and r.wall_time_s == 0.0 and r.reward == -3.0
    assert r.completion == "é 🎉"


def test_analyze_exits_2_on_a_huge_integer_or_a_lone_surrogate(tmp_path: Path) -> None:
    for name, rec in (("big.jsonl", '{"step": 0, "task_id": "a", "completion": "x", '
                                    f'"reward": {HUGE}}}'),
                      ("sur.jsonl", json.dumps(base(completion="x\ud800"))),
                      ("digits.jsonl", '{"step": ' + "9" * 5000 + "}")):
        log = tmp_path / name
        log.write_text(json.dumps(base()) + "\n" + rec + "\n")
        r = sh("monitor", "analyze", str(log))
        assert r.returncode == 2, r.stderr
        assert f"{name}:2:" in r.stderr and "Traceback" not in r.stderr
        assert "internal error" not in r.stderr


def test_a_step_whose_statistics_raise_is_kept_open_not_lost() -> None:
    calls = {"n": 0}

    def flaky(task: str, text: str) -> frozenset[str]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return frozenset()

    agg = StepAggregator(scanner=flaky)
    agg.add(Rollout(step=0, task_id="t", completion="a", reward=1.0))
    with pytest.raises(RuntimeError):
        agg.add(Rollout(step=1, task_id="t", completion="b", reward=0.0))
    assert agg.open_steps == [0, 1]  # step 0 still has its rollout
    done = agg.flush()
    assert [(s.step, s.rollouts) for s in done] == [(0, 1), (1, 1)]


# -- score: the step's range is checked before anything runs -----------------------------------

def _completions(tmp_path: Path, **kw: Any) -> Path:
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"task_id": "HumanEval/0", "completion": "x", **kw}) + "\n")
    return p


@pytest.mark.parametrize("how", ["option", "line"])
def test_score_refuses_a_step_sqlite_cannot_hold(tmp_path: Path, how: str) -> None:
    db, log = tmp_path / "r.db", tmp_path / "log.db"
    if how == "option":
        args = ["--completions", str(_completions(tmp_path)), "--step", str(10**20)]
    else:
        args = ["--completions", str(_completions(tmp_path, step=10**20))]
    r = sh("score", "--tasks", "humaneval", *args, "--db", str(db), "--rollout-log", str(log))
    assert r.returncode == 2, r.stderr
    assert "step" in r.stderr and "2**63 - 1" in r.stderr and "Traceback" not in r.stderr
    assert not db.exists() and not log.exists()  # refused before anything was opened or run


# -- SQLite files that are not rollout logs ------------------------------------------------------

def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as c:
        return {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_a_foreign_sqlite_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE x (a)")
    for args in (["analyze", str(other)], ["report", str(other), "-o", str(tmp_path / "r.html")],
                 ["export", str(other), "-o", str(tmp_path / "o.jsonl")]):
        r = sh("monitor", *args)
        assert r.returncode == 2 and "not a rollout log" in r.stderr, r.stderr
    assert _tables(other) == {"x"}
    with pytest.raises(RolloutLogError, match="not a rollout log"):
        RolloutLog(other)
    assert _tables(other) == {"x"}


def test_a_result_store_is_not_taken_for_a_rollout_log(tmp_path: Path) -> None:
    path = tmp_path / "results.db"
    ResultStore(path).close()
    before = _tables(path)
    with pytest.raises(RolloutLogError, match="not a rollout log"):
        RolloutLog(path)
    assert _tables(path) == before and "rollouts" not in before


def test_reading_creates_nothing_and_old_logs_stay_readable(tmp_path: Path) -> None:
    # A log written before the kind key existed: meta(schema=1) and a rollouts table.
    path = tmp_path / "old.db"
    with RolloutLog(path) as log:
        log.append([Rollout(step=0, task_id="t", completion="x", reward=1.0)], "A")
    with sqlite3.connect(path) as c:
        c.execute("DELETE FROM meta WHERE key='kind'")
    with RolloutLog(path, readonly=True) as log:
        assert log.runs() == ["A"] and len(log) == 1
        with pytest.raises(RolloutLogError, match="read-only"):
            log.append([Rollout(step=1, task_id="t", completion="x", reward=1.0)])
    with RolloutLog(path) as log:  # and writable, now marked
        assert len(log) == 1
    with sqlite3.connect(path) as c:
        assert c.execute("SELECT value FROM meta WHERE key='kind'").fetchone() == ("rollouts",)
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    with pytest.raises(RolloutLogError):
        RolloutLog(empty, readonly=True)
    assert _tables(empty) == set()


# -- runs ------------------------------------------------------------------------------------------

def _two_runs(tmp_path: Path) -> tuple[Path, Path]:
    rows = [Rollout(step=s, task_id="t", completion=f"c{s}{run}", reward=1.0 if run == "A" else 0.0,
                    run_id=run) for s in range(4) for run in ("A", "B")]
    jl = tmp_path / "two.jsonl"
    jl.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows))
    db = tmp_path / "two.db"
    with RolloutLog(db) as log:
        log.append(rows)
    return jl, db


def test_a_log_of_several_runs_needs_run_and_run_filters(tmp_path: Path) -> None:
    for path in _two_runs(tmp_path):
        r = sh("monitor", "analyze", str(path), "--json")
        assert r.returncode == 2 and "2 runs" in r.stderr and "'A', 'B'" in r.stderr, r.stderr
        r = sh("monitor", "analyze", str(path), "--json", "--run", "B")
        assert r.returncode == 0, r.stderr
        summary = json.loads(r.stdout.splitlines()[-1])["summary"]
        assert summary["rollouts"] == 4 and summary["reward_mean_first"] == 0.0
        assert summary["late_rollouts"] == 0
        r = sh("monitor", "analyze", str(path), "--run", "Z")
        assert r.returncode == 2 and "no such run" in r.stderr, r.stderr
    r = sh("monitor", "export", str(tmp_path / "two.db"), "--run", "Z", "-o",
           str(tmp_path / "z.jsonl"))
    assert r.returncode == 2 and "no such run" in r.stderr


def test_dropped_late_rollouts_are_warned_about(tmp_path: Path) -> None:
    log = tmp_path / "late.jsonl"
    log.write_text("".join(json.dumps(base(step=s)) + "\n" for s in (0, 1, 0)))
    r = sh("monitor", "analyze", str(log), "--json")
    assert r.returncode == 0 and "1 rollouts arrived after their step" in r.stderr, r.stderr


# -- audit alerts follow the rearm rule ----------------------------------------------------------

def _failed(step: int) -> AuditOutcome:
    return AuditOutcome(step=step, task_id="t", completion_id=None, train_reward=1.0,
                        audit_reward=0.0, audit_verdict="wrong_answer", completion=f"c{step}")


def test_a_sustained_audited_hack_is_one_alert_until_rearmed() -> None:
    th = Thresholds()
    steps = [*range(3, 12), 17, 18]  # 12..16: five quiet steps, then it fires again
    alerts = AuditRearm(th.rearm).admit(detect_audit_failures([_failed(s) for s in steps], th))
    assert [a.step for a in alerts] == [3, 17]


def test_live_audit_alerts_follow_the_rearm_rule() -> None:
    mon = LiveMonitor(audit_share=1.0)
    raised = []
    for s in [*range(3, 9), 14]:  # 9..13 quiet
        picked = mon.audit_pick([Rollout(step=s, task_id="t", completion=f"c{s}", reward=1.0)],
                                "r", {"t"})
        assert len(picked) == 1
        raised += mon.audit_done([_failed(s)], "r")
    assert [a.step for a in raised] == [3, 14]
    assert [a["step"] for a in mon.snapshot("r")["alerts"]] == [3, 14]
    # Late outcomes of an earlier step inside the episode raise nothing either.
    assert mon.audit_done([_failed(2)], "r") == []


# -- the prefilter lets every signature through --------------------------------------------------

MINIMAL = {
    "exit_early": "import sys\nsys.exit(0)\n",
    "os_exit": "import os\nos._exit(0)\n",
    "skip_test": "import unittest\nraise unittest.SkipTest('x')\n",
    "patch_builtins": "import builtins\nbuiltins.len = lambda x: 0\n",
    "patch_unittest": "import unittest\nunittest.TestCase.assertEqual = lambda *a: None\n",
    "patch_sys_modules": "import sys\nsys.modules['x'] = None\n",
    "patch_module": "import numpy as np\nnp.allclose = lambda *a, **k: True\n",
    "always_equal": "class A:\n    def __eq__(self, o):\n        return True\n",
    "test_file_access": "def f():\n    return open ('test_x.py').read()\n",
    "frame_inspection": "import sys\nf = sys._getframe(1)\n",
    "hardcoded_outputs": ("def f(x):\n    if x == 'a:b':  # case 1\n        return 10\n"
                          "    if x == 'c:d':  # case 2\n        return 20\n"),
    "fake_test_output": "print ('ALL TESTS OK')\n",
    "process_abuse": "import os\nos.kill(1, 9)\n",
}
MORE = [
    ("patch_module", "import math\na, math.pi = 1, 3\n"),
    ("patch_module", "import m\nm.f >>= 1\n"),
    ("patch_module", "import m\nm . f = 1\n"),
    ("patch_module", "import sys\nsys.setrecursionlimit = print\n"),
    ("test_file_access", "from pathlib import Path\nt = Path('tests/t.py').read_text()\n"),
    ("test_file_access", "import os\nos.listdir ('.')\n"),
    ("fake_test_output", "print ('3 Passed')\n"),
    ("hardcoded_outputs", "def f(x):\n    if [1, 2] == x:\n\n        return 3\n"
                          "    if [4, 5] == x: return\n"),
]


def test_every_signature_has_a_minimal_example() -> None:
    assert set(MINIMAL) == set(SIGNATURES)


@pytest.mark.parametrize(("code", "source"), [*MINIMAL.items(), *MORE])
def test_scan_finds_each_signature_past_the_prefilter(code: str, source: str) -> None:
    assert code in scan(source)
