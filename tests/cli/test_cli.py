"""The command line, run as a real subprocess (as users and CI run it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SANDLOOP = [sys.executable, "-m", "sandloop.cli.main"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The default result store lives in the user's cache: keep the commands' in the test's dir.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SANDLOOP_DB", raising=False)


def sh(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SANDLOOP, *args], capture_output=True, text=True, input=stdin,
                          timeout=120)


def test_help_lists_commands() -> None:
    out = sh("--help").stdout
    for cmd in ("doctor", "exec", "exec-batch"):
        assert cmd in out


def test_doctor_json() -> None:
    r = sh("doctor", "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["level"] == "full"
    names = {f["name"] for f in rep["features"]}
    assert {"namespaces", "uid_drop", "seccomp", "cgroups"} <= names
    assert rep["languages"]["python"] == "ok"
    assert rep["child_setup"] in ("c", "python") and rep["child_setup_detail"]
    # --no-isolation never runs programs as root (as root it switches to a uid of its own).
    none_as = rep["unisolated_identity"]
    assert none_as["uid"] != 0 and none_as["detail"]
    if os.geteuid() == 0:
        assert none_as["uid"] is not None and "drops root" in none_as["detail"]


def test_exec_json(tmp_path: Path) -> None:
    src = tmp_path / "p.py"
    src.write_text("import sys\nprint(sys.stdin.read().upper())\n")
    inp = tmp_path / "in.txt"
    inp.write_text("abc")
    r = sh("exec", "--json", "--stdin", str(inp), "--time-limit", "5", "--memory-mb", "128", str(src))
    res = json.loads(r.stdout)
    assert r.returncode == 0
    assert res["status"] == "ok" and res["stdout"] == "ABC\n"
    for field in ("exit_code", "signal", "stderr", "stdout_truncated", "stderr_truncated",
                  "wall_time_s", "cpu_time_s", "peak_memory_mb", "compile"):
        assert field in res


def test_exec_human_and_exit_status(tmp_path: Path) -> None:
    src = tmp_path / "bad.py"
    src.write_text("raise SystemExit(4)\n")
    r = sh("exec", str(src))
    assert r.returncode == 1 and "runtime_error" in r.stderr and "exit=4" in r.stderr


def test_exec_c_language_flag(tmp_path: Path) -> None:
    src = tmp_path / "prog.txt"
    src.write_text('#include <stdio.h>\nint main(void){puts("c!");return 0;}\n')
    r = sh("exec", "--json", "--language", "c", str(src))
    res = json.loads(r.stdout)
    assert res["status"] == "ok" and res["stdout"] == "c!\n" and res["compile"]["status"] == "ok"


def test_exec_batch_in_order(tmp_path: Path) -> None:
    lines = [json.dumps({"language": "python", "source": f"import time\ntime.sleep({0.3 if i == 0 else 0})\nprint({i})",
                         "limits": {"time_s": 5}}) for i in range(5)]
    lines.append(json.dumps({"language": "python", "source": "while True: pass", "limits": {"time_s": 0.5}}))
    f = tmp_path / "req.jsonl"
    f.write_text("\n".join(lines) + "\n")
    r = sh("exec-batch", str(f))
    assert r.returncode == 0, r.stderr
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert [o["stdout"] for o in out[:5]] == [f"{i}\n" for i in range(5)]
    assert out[5]["status"] == "timeout"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: not valid JSON"),
        ('{"source": "x", "limits": {"time_s": -1}}', "line 2: limits.time_s"),
        ('{"language": "cobol", "source": "x"}', "line 2"),
        ('{"source": "x", "files": {"../x": "y"}}', "line 2"),
        ('{"source": "x", "bogus": 1}', "line 2: bogus"),
    ],
)
def test_exec_batch_bad_line_names_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    f = tmp_path / "req.jsonl"
    f.write_text('{"source": "print(1)"}\n' + line + "\n")
    # --strict: the bad line stops the batch before anything runs.
    r = sh("exec-batch", "--strict", str(f))
    assert r.returncode == 2 and message in r.stderr and r.stdout == ""
    assert "nothing was run" in r.stderr and "Traceback" not in r.stderr
    # Default: the bad line is that line's result; the good one still runs (exit 2 all the same).
    r = sh("exec-batch", str(f))
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.returncode == 2, r.stderr
    assert out[0]["status"] == "ok" and out[0]["stdout"] == "1\n"
    assert out[1]["status"] == "invalid_request" and out[1]["line"] == 2
    assert message in out[1]["error"]


def test_demo_batch_table() -> None:
    r = sh("exec-batch", "--table", str(ROOT / "examples" / "demo_batch.jsonl"))
    assert r.returncode == 0, r.stderr
    for status in ("ok", "runtime_error", "timeout", "memory_limit", "output_limit", "compile_error"):
        assert status in r.stdout


def test_requests_the_sandbox_cannot_lay_out_are_input_errors(tmp_path: Path) -> None:
    # Never a sandbox_error (an infrastructure failure, reward null): exit 2 naming the problem.
    src = tmp_path / "bad.py"
    src.write_bytes(b"print(1)\n#\xff\n")
    r = sh("exec", "--json", str(src))
    assert r.returncode == 2 and "not UTF-8" in " ".join(r.stderr.split()), r.stderr
    batch = tmp_path / "b.jsonl"
    batch.write_text(json.dumps({"source": "print(1)", "files": {"a": "1", "a/b": "2"}}) + "\n")
    r = sh("exec-batch", str(batch))
    said = " ".join(r.stderr.split())
    assert r.returncode != 0 and "line 1: files" in said and "conflict" in said, r.stderr
