"""Task schema and loaders: real HumanEval data, MBPP/contest/native shapes, precise errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from sandloop.tasks import (
    CallTest,
    IOTest,
    ScriptTest,
    Task,
    TaskFormatError,
    detect_format,
    load_tasks,
)
from sandloop.tasks.convert import expand_script, split_check
from sandloop.tasks.values import decode


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_humaneval_builtin_loads_all_164() -> None:
    tasks = load_tasks("humaneval")
    assert len(tasks) == 164
    assert len({t.id for t in tasks}) == 164
    t0 = tasks[0]
    assert t0.id == "HumanEval/0" and t0.entry_point == "has_close_elements"
    assert t0.starter_code == t0.prompt and t0.reference_solution
    # The check's asserts became call tests whose expected values stay outside the sandbox.
    assert all(isinstance(t, CallTest) for t in t0.hidden_tests)
    assert len(t0.hidden_tests) == 7
    assert t0.public_tests and all(isinstance(t, CallTest) for t in t0.public_tests)
    assert t0.comparison.values == "python"


def test_humaneval_unconvertible_asserts_stay_a_script() -> None:
    t32 = load_tasks("humaneval")[32]
    scripts = [t for t in t32.hidden_tests if isinstance(t, ScriptTest)]
    assert len(scripts) == 1 and scripts[0].call == "check"
    assert "poly(coeffs, solution)" in scripts[0].source


def test_split_check_converts_literal_asserts_only() -> None:
    src = (
        "def check(candidate):\n"
        "    assert candidate([1, 2], k=3) == (3, 'x')\n"
        "    assert 5 == candidate(2)\n"
        "    assert True, 'noise'\n"
        "    assert abs(candidate(1.0) - 0.5) < 1e-6\n"
    )
    calls, scripts = split_check(src)
    assert [decode(c.expected) for c in calls] == [(3, "x"), 5]
    assert calls[0].args == [[1, 2]] and calls[0].kwargs == {"k": 3}
    assert len(scripts) == 1
    assert "abs(candidate(1.0) - 0.5)" in scripts[0].source
    assert "candidate([1, 2], k=3)" not in scripts[0].source


def test_split_check_without_check_keeps_whole_source() -> None:
    calls, scripts = split_check("assert f(1) == 2\n")
    assert calls == [] and scripts[0].source == "assert f(1) == 2\n"


def test_expand_script_finds_every_test() -> None:
    src = (
        "import unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_a(self): pass\n"
        "    def test_b(self): pass\n"
        "    def helper(self): pass\n"
        "def test_c():\n    pass\n"
    )
    assert [t.call for t in expand_script(src)] == ["T.test_a", "T.test_b", "test_c"]


def test_version_is_a_content_hash() -> None:
    base = dict(id="t", entry_point="f", hidden_tests=[CallTest(name="a", args=[1], expected=2)])
    a, b = Task(**base), Task(**base)  # type: ignore[arg-type]
    assert a.version == b.version and len(a.version) == 16
    c = Task(**{**base, "prompt": "changed"})  # type: ignore[arg-type]
    assert c.version != a.version
    with pytest.raises(ValueError, match="does not match the content hash"):
        Task(**{**base, "version": "0" * 16})  # type: ignore[arg-type]


def test_native_round_trip(tmp_path: Path) -> None:
    task = Task(
        id="native/1", entry_point="add", prompt="add two numbers",
        public_tests=(CallTest(name="p0", args=[1, 2], expected=3),),
        hidden_tests=(CallTest(name="h0", args=[{"$tuple": [1]}, 2], expected=3),
                      ScriptTest(name="s0", source="assert candidate(2, 2) == 4\n")),
        tags=("math",), split="train", difficulty=0.2,
    )
    path = tmp_path / "tasks.jsonl"
    path.write_text(task.to_json() + "\n")
    (loaded,) = load_tasks(path)
    assert loaded == task


def test_mbpp_shape(tmp_path: Path) -> None:
    rec = {
        "task_id": 2, "text": "Write a function to add.", "code": "def add(a, b):\n    return a + b\n",
        "test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4",
                      "assert set([add(1, 1)]) == {2}"],
        "test_setup_code": "", "challenge_test_list": [],
    }
    (task,) = load_tasks(_write(tmp_path / "mbpp.jsonl", [rec]))
    assert task.id == "mbpp/2" and task.entry_point == "add"
    assert [t.name for t in task.public_tests] == ["public0"]
    assert [type(t) for t in task.hidden_tests] == [CallTest, ScriptTest]
    assert "assert add(1, 2) == 3" in task.prompt


def test_codecontests_shape(tmp_path: Path) -> None:
    rec = {
        "name": "1A. Sum", "description": "Print a+b.",
        "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
        "private_tests": {"input": ["5 5\n"], "output": ["10\n"]},
        "generated_tests": {"input": ["0 0\n"], "output": ["0\n"]},
        "solutions": {"language": [2, 3], "solution": ["int main(){}", "print(sum(map(int, input().split())))"]},
        "time_limit": {"seconds": 2, "nanos": 0}, "memory_limit_bytes": 256 << 20, "difficulty": 7,
    }
    (task,) = load_tasks(_write(tmp_path / "cc.jsonl", [rec]))
    assert task.test_kind == "stdio" and task.limits.time_s == 2.0 and task.limits.memory_mb == 256
    assert len(task.public_tests) == 1 and len(task.hidden_tests) == 2
    assert task.reference_solution is not None and task.reference_solution.startswith("print")


def test_apps_shapes(tmp_path: Path) -> None:
    stdio = {"problem_id": 7, "question": "q", "solutions": json.dumps(["print(1)"]),
             "input_output": json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]}),
             "difficulty": "interview", "starter_code": ""}
    call = {"problem_id": 8, "question": "q", "solutions": "[]", "starter_code": "class Solution:",
            "input_output": json.dumps({"fn_name": "f", "inputs": [[1, 2]], "outputs": [[3]]})}
    a, b = load_tasks(_write(tmp_path / "apps.jsonl", [stdio, call]), "apps")
    assert a.test_kind == "stdio" and isinstance(a.hidden_tests[0], IOTest)
    assert b.test_kind == "function" and b.entry_point == "f"
    assert isinstance(b.hidden_tests[0], CallTest) and b.hidden_tests[0].expected == 3


def test_detect_format() -> None:
    assert detect_format({"prompt": "", "test": "", "entry_point": "f", "task_id": "x"}) == "humaneval"
    assert detect_format({"text": "", "code": "", "test_list": []}) == "mbpp"
    assert detect_format({"inputs": [], "outputs": []}) == "stdio"
    with pytest.raises(TaskFormatError, match="--format"):
        detect_format({"foo": 1})


def test_errors_name_file_line_and_field(tmp_path: Path) -> None:
    good = {"id": "a", "entry_point": "f", "hidden_tests": [{"kind": "call", "name": "t", "args": [1], "expected": 1}]}
    bad = {"id": "b", "entry_point": "f", "hidden_tests": [{"kind": "call", "name": "t", "args": [1], "expected": {"$bad": 1}}]}
    path = _write(tmp_path / "t.jsonl", [good, bad])
    with pytest.raises(TaskFormatError) as e:
        load_tasks(path, "native")
    assert e.value.line == 2 and e.value.field == "hidden_tests.0.call.expected"
    assert str(path) in str(e.value)


def test_invalid_json_and_duplicates(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_text('{"inputs": ["1"], "outputs": ["1"]}\n{oops\n')
    with pytest.raises(TaskFormatError, match=r"x.jsonl:2: not valid JSON"):
        load_tasks(p)
    rec = {"id": "same", "inputs": ["1"], "outputs": ["1"]}
    with pytest.raises(TaskFormatError, match="duplicate task id 'same'") as e:
        load_tasks(_write(tmp_path / "d.jsonl", [rec, rec]))
    assert e.value.line == 2


def test_gzip_and_missing_file(tmp_path: Path) -> None:
    gz = tmp_path / "t.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(json.dumps({"inputs": ["1"], "outputs": ["1"]}) + "\n")
    assert len(load_tasks(gz)) == 1
    with pytest.raises(TaskFormatError, match="not a built-in set"):
        load_tasks(tmp_path / "nope.jsonl")


def test_stdio_tasks_reject_call_tests() -> None:
    with pytest.raises(ValueError, match="only tests of kind 'io'"):
        Task(id="x", test_kind="stdio", hidden_tests=(CallTest(name="a", expected=1),))
    with pytest.raises(ValueError, match="at least one"):
        Task(id="x", entry_point="f")
