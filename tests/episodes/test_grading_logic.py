"""Pure parts of episodes: reward shaping, report parsing, tool argument checks."""

from __future__ import annotations

import json

import pytest

from sandloop.episodes import Shaping, check_arguments, shape_reward, tool_schemas
from sandloop.episodes.grading import parse_report, public_counts
from sandloop.sandbox.models import ExecResult, Status
from sandloop.tasks.repo import load_repo_tasks

TASK = load_repo_tasks("repo-demo")[0]
NONCE = "SANDLOOP-GRADE-abc:"


def _result(stdout: str, status: Status = Status.OK) -> ExecResult:
    return ExecResult(status=status, exit_code=0, stdout=stdout, wall_time_s=0.1)


def test_shaping() -> None:
    plain = Shaping()
    assert shape_reward(3, 3, 4, 4, plain, 10) == 1.0
    assert shape_reward(2, 3, 4, 4, plain, 10) == 0.0
    partial = Shaping(partial_credit=True)
    assert shape_reward(2, 4, 4, 4, partial, 1) == 0.5
    assert shape_reward(4, 4, 3, 4, partial, 1) == 0.0  # a broken pass-to-pass test zeroes it
    assert shape_reward(4, 4, 3, 4, Shaping(pass_to_pass_required=False), 1) == 1.0
    assert shape_reward(3, 3, 4, 4, Shaping(turn_penalty=0.01), 10) == pytest.approx(0.9)
    assert shape_reward(3, 3, 4, 4, Shaping(turn_penalty=0.5), 10) == 0.0


def test_report_parsing() -> None:
    results = {t: "passed" for t in TASK.tests}
    results[TASK.fail_to_pass[0]] = "failed"
    fake = NONCE.replace("abc", "xyz") + json.dumps({"results": {t: "passed" for t in TASK.tests}})
    out = f"noise\n{fake}\n{NONCE}{json.dumps({'results': results, 'exit': 1})}\n"
    g = parse_report(TASK, _result(out), NONCE, Shaping(), 3)
    assert g.verdict == "unresolved" and g.reward == 0.0
    assert g.tests[TASK.fail_to_pass[0]] == "wrong_answer"
    assert g.fail_to_pass == (len(TASK.fail_to_pass) - 1, len(TASK.fail_to_pass))


def test_no_report_is_an_error_verdict_and_infra_failure_is_masked() -> None:
    g = parse_report(TASK, _result("killed", Status.TIMEOUT), NONCE, Shaping(), 1)
    assert g.verdict == "error" and g.reward == 0.0
    assert set(g.tests.values()) == {"timeout"}
    infra = parse_report(TASK, _result("", Status.SANDBOX_ERROR), NONCE, Shaping(), 1)
    assert infra.verdict == "sandbox_error" and infra.reward is None


def test_public_counts() -> None:
    assert public_counts("== 1 failed, 4 passed in 0.1s ==") == (4, 1)
    assert public_counts("== 2 passed, 1 error in 0.1s ==") == (2, 1)


def test_tool_schemas_and_arguments() -> None:
    names = [t["function"]["name"] for t in tool_schemas()]
    assert names == ["read_file", "write_file", "apply_patch", "list_dir", "run", "run_tests",
                     "submit"]
    assert check_arguments("read_file", {"path": "a.py"}) is None
    assert "missing" in (check_arguments("write_file", {"path": "a"}) or "")
    assert "must be a string" in (check_arguments("run", {"command": 3}) or "")
    assert "unknown argument" in (check_arguments("submit", {"x": 1}) or "")
    assert "unknown tool" in (check_arguments("nope", {}) or "")
