"""`sandloop tasks validate` on repository sets: the bundled repo-demo set passes, and broken
repo tasks get the validate vocabulary's codes (gold patch that fixes nothing ->
reference_fails, fail-to-pass tests that pass without a fix -> trivial_pass / weak_tests). Real
episodes in the sandbox, through the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sandloop.cli.repo_validate import is_repo_set, repo_report
from sandloop.curation.problems import ProblemCode
from sandloop.episodes.check import RepoProblem
from sandloop.tasks.repo import load_repo_tasks

SPANLIB = next(t for t in load_repo_tasks("repo-demo") if t.id.startswith("spanlib"))


def _validate(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    return subprocess.run([sys.executable, "-m", "sandloop", "tasks", "validate", *args],
                          capture_output=True, text=True, env=env, timeout=600)


def test_repo_demo_passes() -> None:
    r = _validate("repo-demo", "--json")
    assert r.returncode == 0, r.stderr
    reports = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(reports) == 4 and {x["verdict"] for x in reports} == {"keep"}
    assert all(x["problems"] == [] and x["skipped"] == [] for x in reports)


def test_broken_repo_tasks_are_rejected_with_the_validate_codes(tmp_path: Path) -> None:
    data = SPANLIB.model_dump(mode="json", exclude={"version"})
    no_fix = {**data, "id": "broken/gold-fixes-nothing",
              "patch": (SPANLIB.patch or "").replace("<=", "<")}
    doing_nothing = {**data, "id": "broken/empty-passes",
                     "fail_to_pass": ["tests/test_merge.py::test_disjoint"],
                     "pass_to_pass": ["tests/test_span.py::test_contains"]}
    half = {**data, "id": "broken/one-test-decides-nothing",
            "fail_to_pass": [*SPANLIB.fail_to_pass, "tests/test_merge.py::test_disjoint"],
            "pass_to_pass": ["tests/test_span.py::test_contains"]}
    path = tmp_path / "broken.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in (data, no_fix, doing_nothing, half)))
    assert is_repo_set(str(path))
    r = _validate(str(path), "--json")
    assert r.returncode == 1, r.stderr  # something is rejected
    got = {x["id"]: x for x in map(json.loads, r.stdout.splitlines())}
    assert got[SPANLIB.id]["verdict"] == "keep"
    fixes_nothing = got["broken/gold-fixes-nothing"]
    assert fixes_nothing["verdict"] == "reject"
    assert {p["code"] for p in fixes_nothing["problems"]} == {"reference_fails"}
    assert all("gold_fails_fail_to_pass" in p["detail"] for p in fixes_nothing["problems"])
    assert got["broken/empty-passes"]["verdict"] == "reject"
    assert [p["code"] for p in got["broken/empty-passes"]["problems"]] == ["trivial_pass"]
    decides_nothing = got["broken/one-test-decides-nothing"]
    assert decides_nothing["verdict"] == "review"
    assert [p["code"] for p in decides_nothing["problems"]] == ["weak_tests"]
    assert "test_disjoint" in decides_nothing["problems"][0]["detail"]


def test_code_task_options_are_refused_for_repo_sets() -> None:
    r = _validate("repo-demo", "--check", "flaky")
    assert r.returncode == 2 and "repository set" in r.stderr


def test_findings_map_to_the_vocabulary() -> None:
    found = [RepoProblem("gold_breaks_pass_to_pass", "t breaks", test="t"),
             RepoProblem("sandbox_error", "retry"), RepoProblem("no_gold_patch", "none")]
    rep = repo_report(SPANLIB, found)
    assert [p.code for p in rep.problems] == [ProblemCode.REFERENCE_FAILS]
    assert rep.verdict == "reject" and len(rep.skipped) == 2
    assert rep.skipped[0].startswith("run: ") and rep.skipped[1].startswith("gold patch: ")
    assert not is_repo_set("humaneval") and is_repo_set("repo-demo")
