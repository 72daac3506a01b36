"""The CLI at its edges (issue 20): bad files and options are one line and exit 2, checks come
before work, nothing computed is lost, progress is visible without a terminal. Real processes,
real sandboxes, real SQLite files; the user's cache is redirected into the test's directory."""

from __future__ import annotations

import gzip
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer

SANDLOOP = [sys.executable, "-m", "sandloop"]
ROOT = Path(__file__).resolve().parents[2]
GARBAGE = bytes(range(256)) * 4  # not UTF-8, not JSON, not gzip


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SANDLOOP_DB", raising=False)
    monkeypatch.chdir(tmp_path)  # no sandloop.toml of the checkout applies


def sh(*args: str, stdin: str | None = None, env: dict[str, str] | None = None,
       cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SANDLOOP, *args], capture_output=True, text=True, input=stdin,
                          timeout=180, env={**os.environ, **(env or {})}, cwd=cwd)


def one_error(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """Exit ``code``, no traceback, and an error line naming every needle."""
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("sandloop: error:")]
    assert len(errors) == 1, r.stderr
    for n in needles:
        assert n in errors[0], (n, errors[0])


def completions(tmp_path: Path, per_task: int = 1, tasks: int = 1) -> Path:
    f = tmp_path / "c.jsonl"
    f.write_text("".join(json.dumps({"task_id": f"HumanEval/{t}", "completion": "    return 0\n"})
                         + "\n" for t in range(tasks) for _ in range(per_task)))
    return f


# -- non-UTF-8 and binary input ----------------------------------------------------------------
def test_binary_inputs_are_input_errors(tmp_path: Path) -> None:
    (tmp_path / "garbage.py").write_bytes(GARBAGE)
    (tmp_path / "garbage.bin").write_bytes(GARBAGE)
    (tmp_path / "garbage.jsonl.gz").write_bytes(gzip.compress(GARBAGE))
    (tmp_path / "truncated.jsonl.gz").write_bytes(gzip.compress(b'{"task_id": 1}\n' * 50)[:40])
    one_error(sh("exec", "garbage.py"), 2, "garbage.py", "not UTF-8")
    one_error(sh("exec-batch", "garbage.bin"), 2, "garbage.bin", "line 1", "nothing was run")
    for f in ("garbage.bin", "garbage.jsonl.gz", "truncated.jsonl.gz"):
        one_error(sh("score", "--tasks", "humaneval", "--completions", f, "--no-db"), 2, f)


# -- out-of-range options ----------------------------------------------------------------------
@pytest.mark.parametrize(("options", "names"), [
    (["--slots", "-1"], "--slots"),
    (["--slots", "0"], "--slots"),
    (["--k", "0"], "--k"),
    (["--time-scale", "-1"], "--time-scale"),
    (["--time-scale", "0"], "--time-scale"),
    (["--time-scale", "nan"], "--time-scale"),
    (["--preload", "nonexistent_module_xyz"], "nonexistent_module_xyz"),
    (["--preload", "os;rm"], "--preload"),
    # In the supervisor's venv, not in the python environment the slots run on: refused.
    (["--preload", "pydantic"], "pydantic"),
    (["--k", "10"], "--k 10"),  # two completions per task: pass@10 is undefined
])
def test_score_options_out_of_range(tmp_path: Path, options: list[str], names: str) -> None:
    c = completions(tmp_path, per_task=2)
    one_error(sh("score", "--tasks", "humaneval", "--completions", str(c), "--no-db", *options),
              2, names)


@pytest.mark.parametrize("options", [
    ["--max-runs", "0"], ["--max-concurrent", "0"], ["--rate", "0"], ["--burst", "-1"],
    ["--max-sessions", "0"],
])
def test_add_key_limits_out_of_range(tmp_path: Path, options: list[str]) -> None:
    r = sh("add-key", "--keys-file", str(tmp_path / "k.json"), "--id", "a", *options)
    one_error(r, 2, options[0])
    assert not (tmp_path / "k.json").exists()


@pytest.mark.parametrize("options", [["--port", "0"], ["--port", "70000"], ["--slots", "0"],
                                     ["--max-body-mb", "0"], ["--log-level", "loud"]])
def test_serve_options_out_of_range(options: list[str]) -> None:
    one_error(sh("serve", *options), 2, options[0])


def test_exec_options_out_of_range(tmp_path: Path) -> None:
    (tmp_path / "one.py").write_text("print(1)\n")
    one_error(sh("exec", "one.py", "--time-limit", "0"), 2, "--time-limit")
    one_error(sh("exec", "one.py", "--memory-mb", "-5"), 2, "--memory-mb")
    one_error(sh("exec", "one.py", "--memory-mb", "60000"), 2, "max_memory_mb")


def test_pass_at_k_defaults_follow_the_completions(tmp_path: Path) -> None:
    # No --k: the default ks that the completions allow (pass@1 here), never an empty {}.
    r = sh("score", "--tasks", "humaneval", "--completions", str(completions(tmp_path, 2)),
           "--no-db", "--json")
    assert r.returncode == 0, r.stderr
    assert list(json.loads(r.stdout)["pass_at_k"]) == ["pass@1"]


# -- exec-batch: every line vetted before anything runs, bad lines are results -------------------
def test_exec_batch_line_over_the_engine_budget_is_that_lines_result(tmp_path: Path) -> None:
    f = tmp_path / "b.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in [
        {"source": "print(1)"},
        {"source": "print(2)", "limits": {"memory_mb": 60000}},
        {"source": "print(3)"},
    ]) + "\n")
    r = sh("exec-batch", str(f))
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.returncode == 2, r.stderr
    assert [o["status"] for o in out] == ["ok", "invalid_request", "ok"]
    assert out[1]["line"] == 2 and "limits.memory_mb" in out[1]["error"]
    assert [out[0]["stdout"], out[2]["stdout"]] == ["1\n", "3\n"]
    # --strict: nothing runs at all.
    r = sh("exec-batch", "--strict", str(f))
    one_error(r, 2, "line 2", "limits.memory_mb", "nothing was run")
    assert r.stdout == ""
    # --strict with a line that does not parse too: the first bad line is still line 2 (the
    # project's maxima are checked with the parse, before any engine starts).
    f.write_text(f.read_text() + '{"source": 5}\n')
    one_error(sh("exec-batch", "--strict", str(f)), 2, "line 2", "limits.memory_mb",
              "and 1 more bad lines")


def test_exec_batch_resume_takes_stored_results(tmp_path: Path) -> None:
    f = tmp_path / "b.jsonl"
    f.write_text(json.dumps({"source": "import time; print(time.time_ns())"}) + "\n")
    db = str(tmp_path / "r.db")
    first = sh("exec-batch", "--db", db, str(f))
    again = sh("exec-batch", "--db", db, "--resume", str(f))
    fresh = sh("exec-batch", "--db", db, str(f))
    assert first.returncode == again.returncode == fresh.returncode == 0
    assert json.loads(again.stdout)["stdout"] == json.loads(first.stdout)["stdout"]
    assert "taken from" in again.stderr
    assert json.loads(fresh.stdout)["stdout"] != json.loads(first.stdout)["stdout"]


def test_exec_batch_table_survives_ctrl_c(tmp_path: Path) -> None:
    f = tmp_path / "b.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in [
        {"source": "print('quick')", "name": "quick"},
        {"source": "import time; time.sleep(60)", "limits": {"time_s": 90}, "name": "slow"},
    ]) + "\n")
    p = subprocess.Popen([*SANDLOOP, "exec-batch", "--table", "--slots", "2", str(f)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "SANDLOOP_PROGRESS_INTERVAL_S": "0.2"})
    assert p.stderr is not None
    deadline = time.monotonic() + 120
    seen = ""
    while "1/2" not in seen and time.monotonic() < deadline:  # the quick one has finished
        if select.select([p.stderr], [], [], 1)[0]:
            seen += p.stderr.readline()
    assert "1/2" in seen, seen
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "quick" in out and "not run" in out and "1 of 2 programs run" in out
    assert "Traceback" not in err


# -- checks before work --------------------------------------------------------------------------
@pytest.mark.parametrize("out", ["/sys/x.jsonl", "{tmp}", "/proc/version/x.jsonl"])
def test_score_out_path_checked_before_scoring(tmp_path: Path, out: str) -> None:
    db = tmp_path / "r.db"
    r = sh("score", "--tasks", "humaneval", "--completions", str(completions(tmp_path)),
           "--db", str(db), "--out", out.format(tmp=tmp_path))
    one_error(r, 2, "--out")
    assert not db.exists()  # refused before the store was even opened


@pytest.mark.parametrize("log", ["/sys/x.db", "notalog.db"])
def test_score_rollout_log_checked_before_scoring(tmp_path: Path, log: str) -> None:
    (tmp_path / "notalog.db").write_text("not a database\n")
    db = tmp_path / "r.db"
    r = sh("score", "--tasks", "humaneval", "--completions", str(completions(tmp_path)),
           "--db", str(db), "--rollout-log", log, "--step", "0",
           env={"SANDLOOP_PROGRESS_INTERVAL_S": "0.01"})
    one_error(r, 2, "--rollout-log", log)
    assert "scoring" not in r.stderr and not db.exists()  # nothing was scored


def test_score_out_follows_the_umask(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "scored.jsonl"
    r = subprocess.run(["sh", "-c", 'umask 022 && exec "$@"', "sh", *SANDLOOP, "score",
                        "--tasks", "humaneval", "--completions", str(completions(tmp_path)),
                        "--no-db", "--out", str(out)], capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_mode & 0o777 == 0o644


# -- progress ----------------------------------------------------------------------------------
def test_score_progress_lines_without_a_tty(tmp_path: Path) -> None:
    c = completions(tmp_path, per_task=3, tasks=8)
    # A tick well under the run's length: 24 completions (8 distinct runs) on a warm pool can
    # take under 50 ms, and a run shorter than one tick prints no line at all.
    r = sh("score", "--tasks", "humaneval", "--completions", str(c), "--no-db",
           env={"SANDLOOP_PROGRESS_INTERVAL_S": "0.002"})
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("scoring: ")]
    assert lines, r.stderr
    assert any("/s, ETA " in ln and "/24 (" in ln for ln in lines), lines
    assert lines[-1].startswith("scoring: 24/24 in ")
    quiet = sh("--quiet", "score", "--tasks", "humaneval", "--completions", str(c), "--no-db",
               env={"SANDLOOP_PROGRESS_INTERVAL_S": "0.05"})
    assert quiet.returncode == 0 and "scoring:" not in quiet.stderr


def test_progress_line_has_rate_and_eta() -> None:
    import io

    from sandloop.cli.output import Progress

    buf = io.StringIO()
    with Progress("work", 10, stream=buf, tty=False, enabled=True, interval_s=60) as p:
        p.started -= 2.0  # two seconds in
        p.advance(4)
        line = p.line()
    assert line.startswith("work: 4/10 (40%), 2.0/s, ETA 0:00:03"), line


# -- version, module, config -------------------------------------------------------------------
def test_version_and_python_m() -> None:
    from sandloop import __version__

    for cmd in (["--version"],):
        r = sh(*cmd)
        assert r.returncode == 0 and r.stdout.strip() == f"sandloop {__version__}"
    r = sh("--help")
    assert r.returncode == 0 and "exec-batch" in r.stdout and "--quiet" in r.stdout


def test_config_file_sets_limits(tmp_path: Path) -> None:
    (tmp_path / "one.py").write_text("print(1)\n")
    (tmp_path / "sandloop.toml").write_text("max_memory_mb = 100\n")
    one_error(sh("exec", "one.py", "--memory-mb", "200", cwd=tmp_path), 2, "max_memory_mb=100")
    (tmp_path / "sandloop.toml").write_text("max_memory_mb = -3\n")
    one_error(sh("exec", "one.py", cwd=tmp_path), 2, "sandloop.toml", "max_memory_mb")
    (tmp_path / "sandloop.toml").write_text("max_memroy_mb = 3\n")
    one_error(sh("exec", "one.py", cwd=tmp_path), 2, "sandloop.toml", "max_memroy_mb")
    (tmp_path / "sandloop.toml").unlink()
    (tmp_path / "pyproject.toml").write_text("[tool.sandloop]\nmax_time_s = 1\n")
    one_error(sh("exec", "one.py", "--time-limit", "5", cwd=tmp_path), 2, "max_time_s=1")
    r = sh("exec", "one.py", "--time-limit", "5", cwd=tmp_path, env={"SANDLOOP_MAX_TIME_S": "9"})
    assert r.returncode == 0, r.stderr  # the environment overrides the file


def test_score_time_scale_checked_against_max_time_s(tmp_path: Path) -> None:
    # HumanEval tasks allow 3 s per test (limits.time_s); x 200 = 600 s, over the default
    # max_time_s of 300: refused before any run, naming the task and the limit.
    c = completions(tmp_path, tasks=2)
    r = sh("score", "--tasks", "humaneval", "--completions", str(c), "--no-db",
           "--time-scale", "200")
    one_error(r, 2, "task HumanEval/0", "max_time_s=300", "--time-scale 200")
    assert "scoring" not in r.stderr  # nothing started
    (tmp_path / "sandloop.toml").write_text("max_time_s = 5\n")
    one_error(sh("score", "--tasks", "humaneval", "--completions", str(c), "--no-db",
                 "--time-scale", "2"), 2, "HumanEval/0", "6 s", "max_time_s=5")
    # Within the limit it scores (exit 0 whatever the rewards).
    r = sh("score", "--tasks", "humaneval", "--completions", str(c), "--no-db", "--json",
           "--time-scale", "1.5", "--slots", "1")
    assert r.returncode == 0, r.stderr


def test_default_store_is_per_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandloop.settings import default_db_path

    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        (d / "sub").mkdir(parents=True)
        (d / "pyproject.toml").write_text("[tool.sandloop]\n")
    pa, pb = default_db_path(start=a / "sub"), default_db_path(start=b)
    assert pa != pb and pa == default_db_path(start=a)
    assert pa.is_relative_to(tmp_path / "cache" / "sandloop" / "projects")
    (a / "sandloop.toml").write_text('db = "store/r.db"\n')
    assert default_db_path(start=a / "sub") == a / "store" / "r.db"
    monkeypatch.setenv("SANDLOOP_DB", str(tmp_path / "env.db"))
    assert default_db_path(start=a) == tmp_path / "env.db"


def test_license_matches_pyproject() -> None:
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


# -- exit codes of what escapes a command --------------------------------------------------------
def test_run_guarded_maps_escaping_errors(capsys: pytest.CaptureFixture[str]) -> None:
    import typer

    from sandloop.cli import output
    from sandloop.cli.exits import run_guarded
    from sandloop.errors import InputError, StoreError

    raised: list[BaseException] = []
    app = typer.Typer()

    @app.command()
    def boom() -> None:
        raise raised[0]

    @app.command()
    def other() -> None:
        pass

    for exc, code in [(InputError("field x: bad"), 2), (StoreError("disk gone"), 3),
                      (KeyError("oops"), 3), (OSError(28, "No space left"), 3)]:
        raised[:] = [exc]
        assert run_guarded(app, ["boom"]) == code
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("sandloop: error:"), err
    raised[:] = [KeyError("oops")]
    output.state.verbose = True
    try:
        assert run_guarded(app, ["boom"]) == 3
    finally:
        output.state.verbose = False
    assert "Traceback" in capsys.readouterr().err


def test_preload_checks_the_environment_not_the_supervisor() -> None:
    # check_preload asks the python environment's interpreter, isolated: a standard module is
    # there, sandloop's own dependencies (its venv) are not.
    from sandloop.cli.options import check_preload

    assert check_preload(["json", "unittest"]) == ["json", "unittest"]
    with pytest.raises(typer.BadParameter, match="fastapi, pydantic: no such module"):
        check_preload(["json", "fastapi", "pydantic"])


@pytest.mark.parametrize("args", [["tasks", "show", "humaneval", "HumanEval/0"],
                                  ["tasks", "ls", "humaneval"],
                                  ["exec-batch", str(ROOT / "examples" / "demo_batch.jsonl")]],
                         ids=["rich_show", "plain_ls", "exec_batch"])
def test_a_reader_that_stops_early_is_not_a_failure(args: list[str]) -> None:
    # `sandloop ... | head -1`: the reader closes the pipe after one line. rich and typer turn
    # the broken pipe into exit 1 ("the work found failures") unless sandloop says otherwise.
    proc = subprocess.Popen([*SANDLOOP, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(120) == 0, err
    assert "Traceback" not in err and "error" not in err, err


def test_a_failing_program_with_stdout_to_dev_null_still_exits_1(tmp_path: Path) -> None:
    prog = tmp_path / "fail.py"
    prog.write_text("import sys\nsys.exit(1)\n")
    with open(os.devnull, "w") as null:
        r = subprocess.run([*SANDLOOP, "exec", str(prog)], stdout=null, timeout=120)
    assert r.returncode == 1
