"""Repository tasks as data: unified diffs, the repo task record, its loaders, the bundled set."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from bundled_repo_source import render

from sandloop.tasks.loaders import TaskFormatError
from sandloop.tasks.patches import PatchError, apply_patch, make_patch, parse_patch
from sandloop.tasks.repo import (
    bundled_repo_path,
    is_repo_set,
    is_test_path,
    load_repo_tasks,
    parse_repo_record,
    read_snapshot,
)

BEFORE = {"a.py": "x = 1\ny = 2\nz = 3\n", "gone.txt": "bye\n", "raw": "no newline"}
AFTER = {"a.py": "x = 1\ny = 20\nz = 3\nw = 4\n", "gone.txt": None, "new/b.py": "hi\n",
         "raw": "still none"}


def test_make_then_apply_round_trips() -> None:
    patch = make_patch(BEFORE, AFTER)
    assert apply_patch(BEFORE, patch) == AFTER
    assert [fp.path for fp in parse_patch(patch)] == ["a.py", "gone.txt", "new/b.py", "raw"]


def test_apply_tolerates_drifted_line_numbers() -> None:
    patch = make_patch(BEFORE, {"a.py": AFTER["a.py"]})
    shifted = {"a.py": "# header\n# more\n" + BEFORE["a.py"]}
    assert apply_patch(shifted, patch)["a.py"] == "# header\n# more\n" + AFTER["a.py"]


def test_a_patch_that_does_not_apply_changes_nothing() -> None:
    patch = make_patch(BEFORE, {"a.py": AFTER["a.py"], "new/b.py": "hi\n"})
    with pytest.raises(PatchError, match=r"a\.py: hunk 1"):
        apply_patch({"a.py": "something else\n"}, patch)
    with pytest.raises(PatchError, match="no file patches"):
        parse_patch("just prose, no diff")
    with pytest.raises(PatchError, match="ends early"):
        parse_patch("--- a/a.py\n+++ b/a.py\n@@ -1,3 +1,3 @@\n x = 1\n")


def test_test_paths() -> None:
    assert is_test_path("tests/test_x.py") and is_test_path("pkg/conftest.py")
    assert is_test_path("test_top.py") and is_test_path("pytest.ini")
    assert not is_test_path("pkg/testing_utils.py") and not is_test_path("src/core.py")


def _record(**over: object) -> dict[str, object]:
    patch = make_patch({"m.py": "def f():\n    return 1\n"}, {"m.py": "def f():\n    return 2\n"})
    tests = make_patch({}, {"tests/test_m.py": "from m import f\n\ndef test_f():\n"
                                               "    assert f() == 2\n"})
    rec: dict[str, object] = {
        "instance_id": "org__m-1", "problem_statement": "f returns 1",
        "files": {"m.py": "def f():\n    return 1\n"}, "patch": patch, "test_patch": tests,
        "FAIL_TO_PASS": json.dumps(["tests/test_m.py::test_f"]), "PASS_TO_PASS": "[]"}
    rec.update(over)
    return rec


def test_swebench_records_load(tmp_path: Path) -> None:
    f = tmp_path / "swe.jsonl"
    f.write_text(json.dumps(_record()) + "\n" + json.dumps(_record(instance_id="org__m-2",
                                                                   setup="true")) + "\n")
    a, b = load_repo_tasks(f)
    assert a.id == "org__m-1" and a.fail_to_pass == ("tests/test_m.py::test_f",)
    assert a.hidden_files() == {"tests/test_m.py": "from m import f\n\ndef test_f():\n"
                                                   "    assert f() == 2\n"}
    assert "tests/test_m.py" in a.graded_files() and b.setup == "true"
    assert parse_repo_record(json.loads(a.to_json())) == a  # the native form round-trips


def test_bad_records_name_line_and_field(tmp_path: Path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(_record()) + "\n" + json.dumps(_record(FAIL_TO_PASS=5)) + "\n")
    with pytest.raises(TaskFormatError, match=r"bad.jsonl:2: field 'FAIL_TO_PASS'"):
        load_repo_tasks(f)
    f.write_text(json.dumps(_record(files={"../escape.py": "x"})) + "\n")
    with pytest.raises(TaskFormatError, match="stay inside"):
        load_repo_tasks(f)
    f.write_text(json.dumps(_record(patch="--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-zzz\n+y\n"))
                 + "\n")
    with pytest.raises(TaskFormatError, match="does not apply"):
        load_repo_tasks(f)


def test_snapshot_from_directory_and_tarball(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "m.py").write_text("x = 1\n")
    (repo / ".git").mkdir()
    (repo / ".git" / "HEAD").write_text("ref")
    (repo / "blob.bin").write_bytes(b"\xff\xfe\x00")
    assert read_snapshot(repo) == {"pkg/m.py": "x = 1\n"}
    tar = tmp_path / "repo.tar.gz"
    with tarfile.open(tar, "w:gz") as t:
        data = b"y = 2\n"
        info = tarfile.TarInfo("./lib/y.py")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    assert read_snapshot(tar) == {"lib/y.py": "y = 2\n"}
    f = tmp_path / "t.jsonl"
    rec = _record(repo_path="repo.tar.gz", test_patch="")
    del rec["files"]
    rec["patch"] = None
    f.write_text(json.dumps(rec) + "\n")
    assert load_repo_tasks(f)[0].files == {"lib/y.py": "y = 2\n"}


def test_bundled_set_matches_its_source() -> None:
    assert bundled_repo_path().read_text() == render()
    tasks = load_repo_tasks("repo-demo")
    assert len(tasks) >= 4 and all(t.patch and t.test_patch for t in tasks)


def test_is_repo_set_tells_the_kinds_apart(tmp_path: Path) -> None:
    from sandloop.tasks.loaders import humaneval_path

    assert is_repo_set("repo-demo") and is_repo_set(bundled_repo_path())
    assert not is_repo_set("humaneval") and not is_repo_set(str(humaneval_path()))
    swe = tmp_path / "swe.jsonl"
    swe.write_text("\n" + json.dumps({"instance_id": "a", "FAIL_TO_PASS": "[]"}) + "\n")
    assert is_repo_set(str(swe))
    for name, data in {"garbage.jsonl": b"\xff{", "empty.jsonl": b"", "arr.jsonl": b"[1]\n"
                       }.items():
        (tmp_path / name).write_bytes(data)
        assert not is_repo_set(str(tmp_path / name)), name  # the loader says what is wrong
    assert not is_repo_set(str(tmp_path / "missing.jsonl")) and not is_repo_set(str(tmp_path))
