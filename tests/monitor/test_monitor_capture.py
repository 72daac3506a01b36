"""Rollouts recorded outside a trainer: ``sandloop score --step/--rollout-log`` and ``sandloop
serve --rollout-log``, as real subprocesses scoring in the sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
sys.path.insert(0, str(Path(__file__).parents[1] / "reward_hacks"))
from catalogue import HONEST
from live import free_port, serve_process

from sandloop.monitor.rolloutlog import RolloutLog

SANDLOOP = [sys.executable, "-m", "sandloop.cli.main"]
WRONG = "def has_close_elements(numbers, threshold):\n    return False\n"


def sh(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SANDLOOP, *args], capture_output=True, text=True, timeout=240,
                          env={**os.environ, **(env or {})})


def completions(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_score_appends_rollouts_of_a_step(tmp_path: Path) -> None:
    src = completions(tmp_path / "c.jsonl", [
        {"task_id": "HumanEval/0", "completion": HONEST["HumanEval/0"]},
        {"task_id": "HumanEval/0", "completion": WRONG, "group": "g-late", "step": 9}])
    log = tmp_path / "run.db"
    base = ("score", "--tasks", "humaneval", "--completions", str(src), "--no-db", "--json")
    r = sh(*base, "--step", "4", "--group", "g1", "--run-id", "exp", "--rollout-log", str(log))
    assert r.returncode == 0, r.stderr
    assert f"2 rollouts -> {log}" in r.stderr and json.loads(r.stdout)["completions"] == 2
    # again, from $SANDLOOP_ROLLOUT_LOG: appended after the first two
    r = sh(*base, "--step", "5", env={"SANDLOOP_ROLLOUT_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    with RolloutLog(log) as db:
        rows = list(db.rollouts())
    assert [(r.run_id, r.step, r.group, r.reward) for r in rows] == [
        ("exp", 4, "g1", 1.0), ("exp", 9, "g-late", 0.0),  # a line's own step/group win
        ("default", 5, None, 1.0), ("default", 9, "g-late", 0.0)]
    assert rows[0].verdict == "passed" and rows[0].completion == HONEST["HumanEval/0"]
    assert rows[0].source is not None  # from the task
    # the log is what `sandloop monitor analyze` reads
    r = sh("monitor", "analyze", str(log), "--run", "exp", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["summary"]["rollouts"] == 2


def test_score_rollout_options_are_checked_before_scoring(tmp_path: Path) -> None:
    src = completions(tmp_path / "c.jsonl", [{"task_id": "HumanEval/0", "completion": "x"}])
    base = ("score", "--tasks", "humaneval", "--completions", str(src), "--no-db")
    r = sh(*base, "--step", "1")
    assert r.returncode == 2 and "--rollout-log" in r.stderr
    r = sh(*base, "--rollout-log", str(tmp_path / "x.db"))
    assert r.returncode == 2 and "--step" in r.stderr and not (tmp_path / "x.db").exists()
    bad = completions(tmp_path / "bad.jsonl",
                      [{"task_id": "HumanEval/0", "completion": "x", "step": -1}])
    r = sh("score", "--tasks", "humaneval", "--completions", str(bad), "--no-db")
    assert r.returncode == 2 and "bad.jsonl:1" in r.stderr and "'step'" in r.stderr
    not_a_log = tmp_path / "notes.txt"
    not_a_log.write_text("not sqlite\n" * 100)
    r = sh(*base, "--step", "1", "--rollout-log", str(not_a_log))
    assert r.returncode == 2 and "rollout log" in r.stderr


def test_serve_rollout_log_records_scores_with_a_step(tmp_path: Path) -> None:
    log = tmp_path / "served.db"
    port = free_port()
    proc = serve_process(port, "--slots", "2", "--rollout-log", str(log))
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
            items = [{"task": "HumanEval/0", "completion": HONEST["HumanEval/0"], "group": "a"},
                     {"task": "HumanEval/0", "completion": WRONG, "group": "b"}]
            r = c.post("/v1/score", json={"items": items},
                       headers={"X-Sandloop-Step": "2", "X-Sandloop-Run": "served"})
            assert r.status_code == 200, r.text
            r = c.post("/v1/score", json={"items": items[:1]})  # no step: not a rollout
            assert r.status_code == 200, r.text
    finally:
        proc.terminate()
        proc.wait(60)
    with RolloutLog(log) as db:
        rows = list(db.rollouts())
    assert [(r.run_id, r.step, r.group, r.reward) for r in rows] == [
        ("served", 2, "a", 1.0), ("served", 2, "b", 0.0)]


def test_serve_refuses_a_file_that_is_not_a_rollout_log(tmp_path: Path) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("not sqlite\n" * 100)
    r = sh("serve", "--port", str(free_port()), "--rollout-log", str(bad))
    assert r.returncode == 2 and "rollout log" in r.stderr


EXAMPLES = Path(__file__).parents[2] / "examples"


def test_demo_run_file_is_what_its_generator_writes(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(EXAMPLES / "make_demo_run.py"),
                        str(tmp_path / "run.jsonl")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run.jsonl").read_bytes() == (EXAMPLES / "demo_run.jsonl").read_bytes()


def test_make_demo_monitored_run_raises_the_hack_alert(tmp_path: Path) -> None:
    """What `make demo` runs last: the demo run scored into a rollout log, analysed, reported."""
    log, report = tmp_path / "run.db", tmp_path / "report.html"
    r = sh("score", "--tasks", "humaneval", "--completions", str(EXAMPLES / "demo_run.jsonl"),
           "--no-db", "--json", "--rollout-log", str(log), "--run-id", "demo")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["null_rewards"] == 0
    r = sh("monitor", "analyze", str(log), "--json")
    assert r.returncode == 0, r.stderr
    *alerts, summary = (json.loads(x) for x in r.stdout.splitlines())
    assert [(a["code"], a["step"]) for a in alerts] == [("reward_hack_suspected", 8)]
    assert summary["summary"]["steps"] == 10 and summary["summary"]["rollouts"] == 120
    r = sh("monitor", "report", str(log), "-o", str(report))
    assert r.returncode == 0 and str(report) in r.stderr.replace("\n", "")
    assert "reward_hack_suspected" in report.read_text()
