"""``sandloop tasks ...`` run as a real subprocess, on the bundled set with planted defects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SANDLOOP = [sys.executable, "-m", "sandloop.cli.main"]


def sh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SANDLOOP, *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("store") / "r.db")


def test_ls_show_stats_without_code() -> None:
    ids = sh("tasks", "ls", "curation-demo").stdout.split()
    assert len(ids) == 13 and ids[0] == "demo/add"
    r = sh("tasks", "show", "curation-demo", "demo/weak")
    assert r.returncode == 0 and "letter grade" in r.stdout and "h1" in r.stdout
    assert sh("tasks", "show", "curation-demo", "nope").returncode == 2
    stats = json.loads(sh("tasks", "stats", "curation-demo", "--json").stdout)
    assert stats["tasks"] == 13 and stats["language"] == {"python": 13}
    assert stats["split"] == {"train": 11, "eval": 2} and stats["tag"]["math"] >= 5


def test_validate_json_exit_codes_and_report(db: str, tmp_path: Path) -> None:
    html = tmp_path / "q.html"
    r = sh("tasks", "validate", "curation-demo", "--json", "--db", db, "--report", str(html))
    assert r.returncode == 1, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 13
    for rec in lines:
        assert {"id", "verdict", "problems"} <= rec.keys()
        for p in rec["problems"]:
            assert set(p) == {"code", "severity", "detail"}
    codes = {p["code"] for rec in lines for p in rec["problems"]}
    assert len(codes) == 9
    page = html.read_text()
    assert "<svg" in page and "weak_tests" in page
    # Self-contained: no scripts, nothing fetched.
    assert "<script" not in page and "src=" not in page and "<link" not in page
    # --exit-zero: same report, exit 0; a second run reuses every stored result.
    r = sh("tasks", "validate", "curation-demo", "--exit-zero", "--db", db)
    assert r.returncode == 0 and "reject 7" in r.stdout and "0 sandbox runs" in r.stdout
    # Only the clean tasks: exit 0.
    clean = tmp_path / "clean.jsonl"
    clean.write_text(sh("tasks", "show", "curation-demo", "demo/add", "--json").stdout)
    r = sh("tasks", "validate", str(clean), "--db", db)
    assert r.returncode == 0, r.stdout


def test_curate_manifest_and_diff(db: str, tmp_path: Path) -> None:
    out = tmp_path / "clean.jsonl"
    r = sh("tasks", "curate", "curation-demo", "-o", str(out), "--db", db)
    assert r.returncode == 0, r.stderr
    kept = sh("tasks", "ls", str(out)).stdout.split()
    assert "demo/add" in kept and "demo/weak" in kept and "demo/flaky" not in kept
    manifest = json.loads((tmp_path / "clean.manifest.json").read_text())
    assert manifest["kept"] == len(kept) == 6
    assert {m["id"]: m["codes"] for m in manifest["removed"]}["demo/add_copy"] == ["duplicate"]
    assert manifest["review"] == ["demo/weak", "demo/slow"]
    assert manifest["counts"]["tasks"] == 6 and len(manifest["set_version"]) == 16
    d = json.loads(sh("tasks", "diff", "curation-demo", str(out), "--json").stdout)
    assert len(d["removed"]) == 7 and d["added"] == [] and d["unchanged"] == 6
    assert d["removal_reasons"]["demo/set_order"] == ["nondeterministic"]


def test_grade_and_split(tmp_path: Path) -> None:
    tasks = tmp_path / "set.jsonl"
    src = [json.loads(sh("tasks", "show", "curation-demo", t, "--json").stdout)
           for t in sh("tasks", "ls", "curation-demo").stdout.split()]
    tasks.write_text("".join(json.dumps(t) + "\n" for t in src))
    rollouts = tmp_path / "r.jsonl"
    rows = [{"task_id": "demo/add", "reward": 1.0}] * 8 + [{"task_id": "demo/weak",
                                                             "reward": 0.0}] * 8
    rollouts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = sh("tasks", "grade", str(tasks), "--rollouts", str(rollouts))
    assert r.returncode == 0, r.stderr
    grades = json.loads((tmp_path / "set.grades.json").read_text())["tasks"]
    assert grades["demo/add"]["tier"] == "saturated" and grades["demo/weak"]["tier"] == "unsolved"
    assert grades["demo/clip"]["tier"] == "medium"  # no observations
    stats = json.loads(sh("tasks", "stats", str(tasks), "--json").stdout)
    assert stats["tier"]["saturated"] == 1
    r = sh("tasks", "split", str(tasks), "--eval-fraction", "0.3", "-o", str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr
    info = json.loads((tmp_path / "s" / "split.json").read_text())
    assert info["train"] + info["eval"] == 13 and 2 <= info["eval"] <= 6
    ev = sh("tasks", "ls", str(tmp_path / "s" / "eval.jsonl")).stdout.split()
    tr = sh("tasks", "ls", str(tmp_path / "s" / "train.jsonl")).stdout.split()
    # The copy and its original, and the task quoting another, stay on one side together.
    for a, b in (("demo/add", "demo/add_copy"), ("demo/vowels", "demo/vowel_positions")):
        assert (a in ev) == (b in ev) and (a in tr) == (b in tr)
    assert sh("tasks", "split", str(tasks), "--eval-fraction", "1.5").returncode == 2


def test_every_threshold_and_severity_is_an_option(tmp_path: Path) -> None:
    # Pure checks only (--check): no sandbox runs, so this is quick.
    base = ("tasks", "validate", "curation-demo", "--check", "duplicate", "--no-db", "--json")
    dup = {json.loads(x)["id"]: json.loads(x) for x in sh(*base).stdout.splitlines()}
    assert dup["demo/add_copy"]["verdict"] == "reject"
    r = sh(*base, "--severity", "duplicate=review")
    assert r.returncode == 0, r.stderr  # nothing rejected any more
    rec = next(json.loads(x) for x in r.stdout.splitlines() if "demo/add_copy" in x)
    assert rec["verdict"] == "review" and rec["problems"][0]["severity"] == "review"
    # A reworded, reformatted copy: prompt shingles 0.71 similar (under the 0.8 prompt
    # threshold), the same canonical solution. Flagged by default, not when an identical
    # solution must come with a prompt similarity of 0.9, and on the prompt alone at 0.7.
    add = json.loads(sh("tasks", "show", "curation-demo", "demo/add", "--json").stdout)
    plus = {**add, "id": "demo/plus", "version": "",
            "prompt": "Write add(a, b) that returns the sum of two integers a and b, both of "
                      "them ints.", "reference_solution": "def add(a,b):\n  # sum\n  return a+b\n"}
    pair = tmp_path / "pair.jsonl"
    pair.write_text(json.dumps(add) + "\n" + json.dumps(plus) + "\n")
    only = ("tasks", "validate", str(pair), "--check", "duplicate", "--no-db", "--json")
    flagged = [json.loads(x)["verdict"] for x in sh(*only).stdout.splitlines()]
    assert flagged == ["keep", "reject"]
    r = sh(*only, "--same-solution-threshold", "0.9")
    assert r.returncode == 0 and [json.loads(x)["verdict"] for x in r.stdout.splitlines()] == [
        "keep", "keep"]
    r = sh(*only, "--duplicate-threshold", "0.7")
    assert r.returncode == 1 and "prompt similarity" in r.stdout
    for bad in (("--severity", "duplicate=maybe"), ("--severity", "nope=review"),
                ("--check", "nope"), ("--min-mutants", "0"), ("--mutant-time-factor", "0"),
                ("--shingle", "0")):
        r = sh(*base, *bad)
        assert r.returncode == 2 and "error" in r.stderr, (bad, r.stderr)


def test_grade_reads_gzip_parquet_and_sqlite_rollout_logs(tmp_path: Path) -> None:
    import gzip

    from sandloop.monitor import Rollout
    from sandloop.monitor.rolloutlog import RolloutLog

    rows = [Rollout(step=s, task_id="demo/add", completion="c", reward=1.0) for s in range(8)]
    rows += [Rollout(step=s, task_id="demo/weak", completion="c", reward=0.0) for s in range(8)]
    with RolloutLog(tmp_path / "run.db") as log:
        log.append(rows)
    with gzip.open(tmp_path / "run.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps(r.to_dict()) + "\n" for r in rows))
    logs = [tmp_path / "run.db", tmp_path / "run.jsonl.gz"]
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        pass
    else:
        assert sh("monitor", "export", str(logs[0]), "-o", str(tmp_path / "run.parquet")
                  ).returncode == 0
        logs.append(tmp_path / "run.parquet")
    for log_path in logs:
        out = tmp_path / f"{log_path.name}.grades.json"
        r = sh("tasks", "grade", "curation-demo", "--rollouts", str(log_path), "-o", str(out))
        assert r.returncode == 0, (log_path, r.stderr)
        grades = json.loads(out.read_text())["tasks"]
        assert grades["demo/add"]["trials"] == 8 and grades["demo/add"]["tier"] == "saturated"
        assert grades["demo/weak"]["tier"] == "unsolved"
    (tmp_path / "broken.gz").write_bytes(b"\x1f\x8b\x08\x00broken")
    r = sh("tasks", "grade", "curation-demo", "--rollouts", str(tmp_path / "broken.gz"),
           "-o", str(tmp_path / "x.json"))
    assert r.returncode == 2 and "broken.gz" in r.stderr and "Traceback" not in r.stderr


def test_validate_reports_graded_tiers_as_difficulty(tmp_path: Path) -> None:
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_text("".join(json.dumps({"task_id": "demo/add", "reward": 1.0}) + "\n"
                                for _ in range(8)))
    grades = tmp_path / "g.json"
    assert sh("tasks", "grade", "curation-demo", "--rollouts", str(rollouts), "-o",
              str(grades)).returncode == 0
    html = tmp_path / "q.html"
    r = sh("tasks", "validate", "curation-demo", "--check", "duplicate", "--no-db", "--json",
           "--grades", str(grades), "--report", str(html))
    diff = {json.loads(x)["id"]: json.loads(x)["difficulty"] for x in r.stdout.splitlines()}
    assert diff["demo/add"] == "saturated" and diff["demo/clip"] == "medium"
    page = html.read_text()
    assert ">saturated</text>" in page and ">medium</text>" in page
    r = sh("tasks", "validate", "curation-demo", "--check", "duplicate", "--no-db",
           "--grades", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "no such grades file" in r.stderr
