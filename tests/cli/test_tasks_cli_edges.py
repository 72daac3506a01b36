"""``sandloop tasks ...`` on hostile inputs: markup in task data, bad output paths, file names
with several dots, bad dates, slots and rewards. Real subprocesses, tiny sets, --no-db."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SANDLOOP = [sys.executable, "-m", "sandloop.cli.main"]
# Wide enough that rich does not wrap a table cell in the middle of what a test looks for.
ENV = {**os.environ, "COLUMNS": "250"}


def sh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SANDLOOP, *args], capture_output=True, text=True, timeout=300,
                          env=ENV)


def call(name: str, args: list[Any], expected: Any) -> dict[str, Any]:
    return {"kind": "call", "name": name, "args": args, "kwargs": {}, "expected": expected}


def task(tid: str, ref: str, tests: list[dict[str, Any]], prompt: str | None = None,
         **kw: Any) -> dict[str, Any]:
    return {"schema": "sandloop.task/v1", "id": tid, "language": "python",
            "prompt": prompt or f"Write f for task {tid} doing a specific computation.",
            "entry_point": "f", "reference_solution": ref, "test_kind": "function",
            "hidden_tests": tests, **kw}


def write(path: Path, *tasks: dict[str, Any]) -> str:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return str(path)


ADD = task("t/add", "def f(a, b):\n    return a + b\n",
           [call("h1", [1, 2], 3), call("h2", [2, 2], 4), call("h3", [0, 5], 5)],
           prompt="Return the arithmetic sum of the two integers a and b.")
FAST = ("--repeat", "2", "--hash-seed", "1", "--env-repeat", "1", "--max-mutants", "0",
        "--no-db")


def ok(r: subprocess.CompletedProcess[str], code: int) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_markup_in_task_data_is_printed_as_written(tmp_path: Path) -> None:
    inst = task("t/[/]", "def f(a):\n    return a\n",
                [call("h1", ["[/]"], "[/]"), call("[b]h2", [1], 1)],
                prompt="<s>[INST] Echo a :smile: [bold]x[/bold] [/INST]", tags=["[/]", "[red]"])
    f = write(tmp_path / "m.jsonl", inst)
    r = sh("tasks", "show", f, "t/[/]")
    ok(r, 0)
    assert "<s>[INST] Echo a :smile: [bold]x[/bold] [/INST]" in r.stdout
    assert "t/[/]" in r.stdout and "[/], [red]" in r.stdout and "[b]h2" in r.stdout
    r = sh("tasks", "stats", f)
    ok(r, 0)
    assert "[/] 1" in r.stdout and "[red] 1" in r.stdout
    # Problem details quote what the reference returned: '[x]a' must not lose its '[x]'.
    (tmp_path / "bad[").mkdir()
    bad = write(tmp_path / "bad[" / "x].jsonl",
                task("t/mf", "def f(a):\n    return '[/]'\n", [call("h1", [1], "x"),
                                                             call("h2", [2], "y")]),
                task("t/sw", "def f(a):\n    return '[x]' + a\n", [call("h1", ["a"], "a"),
                                                                 call("h2", ["b"], "b")]))
    report = tmp_path / "out[" / "x].html"
    r = sh("tasks", "validate", bad, *FAST, "--check", "reference_fails", "--report", str(report))
    ok(r, 1)
    assert "returned '[/]'" in r.stdout and "returned '[x]a'" in r.stdout
    assert "bad[/x].jsonl" in r.stdout and f"report written to {report}" in r.stderr
    assert report.is_file()


def test_output_paths_and_grades_are_checked_before_any_work(tmp_path: Path) -> None:
    f = write(tmp_path / "tiny.jsonl", ADD)
    db = tmp_path / "store.db"  # opened only once validation starts: it must stay absent
    (tmp_path / "adir").mkdir()
    (tmp_path / "clean.manifest.json").mkdir()
    for args in (("validate", f, "--report", str(tmp_path)),
                 ("curate", f, "-o", str(tmp_path / "adir")),
                 ("curate", f, "-o", str(tmp_path / "clean.jsonl")),
                 ("curate", f, "-o", str(tmp_path / "x.jsonl"), "--grades",
                  str(tmp_path / "nope.json"))):
        r = sh("tasks", *args, "--repeat", "2", "--db", str(db))
        ok(r, 2)
        assert r.stdout == "" and r.stderr.count("\n") == 1, (args, r.stderr)
        assert r.stderr.startswith("sandloop: error: ")
        assert not db.exists(), args
    r = sh("tasks", "grade", f, "--rollouts", f, "-o", str(tmp_path / "adir"))
    ok(r, 2)
    (tmp_path / "sp").mkdir()
    (tmp_path / "sp" / "eval.jsonl").mkdir()
    r = sh("tasks", "split", f, "--eval-fraction", "0.5", "-o", str(tmp_path / "sp"))
    ok(r, 2)
    assert "eval.jsonl" in r.stderr and not (tmp_path / "sp" / "train.jsonl").exists()


def test_grades_and_manifests_of_dotted_names_do_not_collide(tmp_path: Path) -> None:
    rows = tmp_path / "r.jsonl"
    rows.write_text("".join(json.dumps({"task_id": "t/add", "reward": 1.0}) + "\n"
                            for _ in range(8)))
    train = write(tmp_path / "mbpp.train.jsonl", ADD)
    ev = write(tmp_path / "mbpp.eval.jsonl", ADD)
    ok(sh("tasks", "grade", train, "--rollouts", str(rows)), 0)
    ok(sh("tasks", "grade", ev, "--rollouts", str(tmp_path / "r.jsonl")), 0)
    assert (tmp_path / "mbpp.train.grades.json").is_file()
    assert (tmp_path / "mbpp.eval.grades.json").is_file()
    assert not (tmp_path / "mbpp.grades.json").exists()
    # A single-dot name keeps its sidecar name.
    ok(sh("tasks", "grade", write(tmp_path / "set.jsonl", ADD), "--rollouts", str(rows)), 0)
    assert (tmp_path / "set.grades.json").is_file()

    copy = {**ADD, "id": "t/add_copy"}
    pair = write(tmp_path / "pair.jsonl", ADD, copy)
    v1, v2 = tmp_path / "clean.v1.jsonl", tmp_path / "clean.v2.jsonl"
    pure = ("--check", "duplicate", "--no-db")
    ok(sh("tasks", "curate", pair, "-o", str(v1), *pure), 0)
    ok(sh("tasks", "curate", train, "-o", str(v2), *pure), 0)
    assert (tmp_path / "clean.v1.manifest.json").is_file()
    assert (tmp_path / "clean.v2.manifest.json").is_file()
    r = sh("tasks", "diff", pair, str(v1), "--json")
    ok(r, 0)
    assert json.loads(r.stdout)["removal_reasons"] == {"t/add_copy": ["duplicate"]}


def test_split_released_after_is_a_date(tmp_path: Path) -> None:
    sep = task("t/sep", "def f(a):\n    return a\n", [call("h1", [1], 1), call("h2", [2], 2)],
               prompt="Give back the single argument unchanged please.",
               tags=["released:2024-09-30"])
    octo = task("t/oct", "def f(a):\n    return -a\n", [call("h1", [1], -1), call("h2", [2], -2)],
                prompt="Negate the number that was passed in.", tags=["released:2024-10-01"])
    f = write(tmp_path / "dated.jsonl", sep, octo)
    for bad in ("garbage", "2024-1-5", "2024-13-01"):
        r = sh("tasks", "split", f, "--released-after", bad, "-o", str(tmp_path / "x"))
        ok(r, 2)
        assert "--released-after" in r.stderr
    assert not (tmp_path / "x").exists()
    for day, evals in (("2024-01-05", {"t/sep", "t/oct"}), ("20241001", {"t/oct"})):
        out = tmp_path / day
        ok(sh("tasks", "split", f, "--released-after", day, "-o", str(out)), 0)
        assert set(sh("tasks", "ls", str(out / "eval.jsonl")).stdout.split()) == evals
    assert json.loads((tmp_path / "20241001" / "split.json").read_text())[
        "released_after"] == "2024-10-01"
    odd = write(tmp_path / "odd.jsonl", {**sep, "tags": ["released:2024-1-5"]}, octo)
    r = sh("tasks", "split", odd, "--released-after", "2024-01-05", "-o", str(tmp_path / "y"))
    ok(r, 2)
    assert "released:2024-1-5" in r.stderr


@pytest.mark.parametrize("command", ["validate", "curate"])
@pytest.mark.parametrize("slots", ["-1", "0"])
def test_slots_below_one_is_bad_input(tmp_path: Path, command: str, slots: str) -> None:
    f = write(tmp_path / "tiny.jsonl", ADD)
    extra = ("-o", str(tmp_path / "o.jsonl")) if command == "curate" else ()
    r = sh("tasks", command, f, *extra, "--slots", slots, "--no-db")
    ok(r, 2)
    assert "--slots" in r.stderr


def test_grade_rejects_rewards_outside_0_1(tmp_path: Path) -> None:
    f = write(tmp_path / "tiny.jsonl", ADD)
    rows = tmp_path / "r.jsonl"
    for bad in ("NaN", "Infinity", "-Infinity", "5", "-3", "1.0000001"):
        rows.write_text('{"task_id": "t/add", "reward": 1}\n'
                        f'{{"task_id": "t/add", "reward": {bad}}}\n')
        r = sh("tasks", "grade", f, "--rollouts", str(rows), "-o", str(tmp_path / "g.json"))
        ok(r, 2)
        assert f"{rows}:2:" in r.stderr, (bad, r.stderr)
    assert not (tmp_path / "g.json").exists()
    rows.write_text('{"task_id": "t/add", "reward": 0}\n{"task_id": "t/add", "reward": 1}\n'
                    '{"task_id": "t/add", "reward": 0.5}\n{"task_id": "t/add", "reward": null}\n')
    ok(sh("tasks", "grade", f, "--rollouts", str(rows), "-o", str(tmp_path / "g.json")), 0)
    assert json.loads((tmp_path / "g.json").read_text())["tasks"]["t/add"]["trials"] == 3


def test_unknown_set_names_the_built_in_sets() -> None:
    r = sh("tasks", "ls", "no-such-set")
    ok(r, 2)
    assert "humaneval" in r.stderr and "curation-demo" in r.stderr
    r = sh("tasks", "ls", "repo-demo")
    ok(r, 2)
    assert "validate" in r.stderr
    assert sh("tasks", "ls", "curation-demo").returncode == 0
