"""What the command line imports to start: `--help` and `exec` stay clear of the heavy modules.

Start-up time is noisy on a shared machine, so these check its cause instead (the modules a
command loads, in a real subprocess); benchmarks/bench_startup.py measures the time itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Runs the CLI as the `sandloop` script does, then writes the modules it loaded to the file
# named first (so that the command's own output stays as it is).
_PROBE = """
import json, sys
report, sys.argv = sys.argv[1], ["sandloop", *sys.argv[2:]]
from sandloop.cli.main import main
try:
    main()
except SystemExit as e:
    code = e.code
with open(report, "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""

# Never needed to print help or run one program.
_HEAVY = ("fastapi", "starlette", "uvicorn", "httpx", "torch", "transformers", "trl", "ray",
          "pydantic_settings", "sandloop.server", "sandloop.engine", "sandloop.reward",
          "sandloop.tasks", "sandloop.store", "sandloop.monitor", "sandloop.curation",
          "sandloop.cli.env", "sandloop.cli.tasks", "sandloop.cli.monitor",
          "sandloop.cli.episodes", "sandloop.cli.cluster", "sandloop.cli.score")


def loaded(tmp_path: Path, *args: str) -> tuple[int, set[str]]:
    out = tmp_path / "modules.json"
    p = subprocess.run([sys.executable, "-c", _PROBE, str(out), *args], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    report = json.loads(out.read_text())
    assert p.stderr == "" or report["code"] != 0, p.stderr
    return report["code"], set(report["modules"])


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in _HEAVY))


def test_help_loads_no_command_modules_nor_pydantic(tmp_path: Path) -> None:
    code, modules = loaded(tmp_path, "--help")
    assert code == 0
    assert heavy(modules) == []
    # Nothing of the sandbox or its data models either, nor typer: help is names and texts
    # (cli/root_help.py).
    assert not {m for m in modules if m.startswith(("pydantic", "sandloop.sandbox", "typer",
                                                    "sandloop.envs", "asyncio"))}


def test_exec_loads_only_what_one_run_needs(tmp_path: Path) -> None:
    (tmp_path / "one.py").write_text("print(1)\n")
    code, modules = loaded(tmp_path, "exec", "--json", "one.py")
    assert code == 0
    assert heavy(modules) == [] and "typer" not in modules  # cli/exec_one.py read the line
    assert "sandloop.sandbox.pool" in modules  # it did run the program


def test_exec_batch_loads_no_scorer_monitor_nor_rich(tmp_path: Path) -> None:
    # exec-batch opens its store and picks its results stream from small modules: importing
    # them from cli/score and cli/cluster pulled the scorer, the monitor, numpy and rich into
    # every batch's start-up (~0.3 s of a 1,000-run batch's ~2.5 s).
    (tmp_path / "b.jsonl").write_text('{"source": "pass"}\n')
    code, modules = loaded(tmp_path, "--quiet", "exec-batch", "--no-db", "b.jsonl")
    assert code == 0
    assert "sandloop.engine" in modules  # it did run the batch
    assert not {m for m in modules if m.startswith(("sandloop.reward", "sandloop.monitor",
                                                    "sandloop.cli.score", "sandloop.cli.cluster",
                                                    "sandloop.tasks", "numpy", "rich"))}


def test_a_group_loads_when_it_runs(tmp_path: Path) -> None:
    code, modules = loaded(tmp_path, "tasks", "--help")
    assert code == 0 and "sandloop.cli.tasks" in modules and "sandloop.cli.env" not in modules


def test_lazy_groups_list_as_the_real_ones(capsys: pytest.CaptureFixture[str]) -> None:
    # The root's help lists each group from a stand-in (cli/lazy.py): its name and help text
    # must be the real group's, so the listing is the same with the real groups in place.
    import typer.main

    from sandloop.cli.commands import _Root, app

    group = typer.main.get_command(app)
    assert isinstance(group, _Root)
    ctx = group.make_context("sandloop", ["--verbose"])
    group.get_help(ctx)  # typer's rich help prints itself
    with_stubs = capsys.readouterr().out
    assert "monitor" in with_stubs and "Runtime environments" in with_stubs
    for name in _Root.lazy:
        real = group.get_command(ctx, name)
        assert real is not None and real.name == name and real.help == _Root.lazy[name].help
        assert real.params or real.commands  # the loaded group, not the stand-in
    group.get_help(ctx)
    assert capsys.readouterr().out == with_stubs
    assert list(group.commands)[-len(_Root.lazy):] == list(_Root.lazy)


# -- the plain `exec` parser (cli/exec_one.py) reads what typer reads -------------------------
_PLAIN = [
    ["exec", "a.py"],
    ["exec", "--json", "a.py"],
    ["exec", "a.py", "--json", "--no-isolation"],
    ["-q", "exec", "a.py"],
    ["--verbose", "exec", "-l", "python", "--time-limit", "2.5", "--memory-mb", "64",
     "--stdin", "in.txt", "--no-isolation", "a.py"],
    ["--quiet", "exec", "--language=c", "--time-limit=3", "--memory-mb=128", "--stdin=in.txt",
     "a.py"],
    ["exec", "-l", "", "a.py"],
    ["exec", "--env", "py-numpy", "a.py"],
    ["exec", "--env=python", "--json", "a.py"],
]
# Forms it leaves to typer (help, errors, and whatever needs typer's judgement).
_TYPERS = [
    [], ["--help"], ["exec"], ["exec", "--help"], ["exec", "-"], ["exec", "dir"],
    ["exec", "a.py", "in.txt"], ["exec", "--time-limit", "0", "a.py"],
    ["exec", "--time-limit=1e3", "a.py"], ["exec", "--time-limit", "nan", "a.py"],
    ["exec", "--memory-mb", "0", "a.py"], ["exec", "--memory-mb", "0x10", "a.py"],
    ["exec", "--json", "--json", "a.py"], ["-qv", "exec", "a.py"], ["-q", "-v", "exec", "a.py"],
    ["exec", "-l=python", "a.py"], ["exec", "-lpython", "a.py"], ["exec", "--unknown", "a.py"],
    ["exec", "--language"], ["exec", "--language", "-q", "a.py"], ["exec", "--", "a.py"],
    ["exec", "--stdin", "dir", "a.py"], ["exec", "missing.py"], ["exec-batch", "a.py"],
    ["--version"], ["doctor"],
]


def test_plain_exec_lines_parse_as_typer_parses_them(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from sandloop.cli import exec_one, output
    from sandloop.cli.commands import app
    from sandloop.cli.exits import run_guarded

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.py").write_text("print(1)\n")
    (tmp_path / "in.txt").write_text("x")
    (tmp_path / "dir").mkdir()
    seen: list[exec_one.ExecArgs] = []

    def record(args: exec_one.ExecArgs) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr(exec_one, "exec_command", record)
    for argv in _PLAIN:
        plain = exec_one.parse_plain(argv)
        assert plain is not None, argv
        seen.clear()
        output.state.quiet = output.state.verbose = False
        assert run_guarded(app, argv) == 0, argv
        assert seen == [plain.args], argv
        assert (output.state.quiet, output.state.verbose) == (plain.quiet, plain.verbose), argv
    for argv in _TYPERS:
        assert exec_one.parse_plain(argv) is None, argv
    output.state.quiet = output.state.verbose = False


# -- `sandloop --help` drawn without typer (cli/root_help.py) is typer's, byte for byte -------
_TYPER_HELP = ("import sys; from sandloop.cli.commands import app; "
               "from sandloop.cli.exits import run_guarded; sys.exit(run_guarded(app, ['--help']))")


@pytest.mark.parametrize("env", [
    {}, {"COLUMNS": "40"}, {"COLUMNS": "61"}, {"COLUMNS": "200"}, {"FORCE_COLOR": "1"},
    {"FORCE_COLOR": "1", "COLUMNS": "100"}, {"NO_COLOR": "1", "FORCE_COLOR": "1"},
    {"TERMINAL_WIDTH": "70"}, {"_TYPER_FORCE_DISABLE_TERMINAL": "1", "FORCE_COLOR": "1"},
])
def test_root_help_is_typers(env: dict[str, str]) -> None:
    import os

    base = {k: v for k, v in os.environ.items()
            if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TERMINAL_WIDTH",
                         "PY_COLORS", "GITHUB_ACTIONS", "_TYPER_FORCE_DISABLE_TERMINAL")}
    run = {**base, **env}
    ours = subprocess.run([sys.executable, "-m", "sandloop", "--help"], capture_output=True,
                          env=run, timeout=120)
    typers = subprocess.run([sys.executable, "-c", _TYPER_HELP], capture_output=True, env=run,
                            timeout=120)
    assert ours.returncode == typers.returncode == 0
    assert ours.stderr == typers.stderr == b""
    assert ours.stdout == typers.stdout
    assert b"exec-batch" in ours.stdout


def test_root_help_lists_every_command() -> None:
    import typer.main

    from sandloop.cli.commands import app
    from sandloop.cli.root_help import COMMANDS

    group = typer.main.get_command(app)
    ctx = group.make_context("sandloop", ["--verbose"])
    assert [name for name, _ in COMMANDS] == group.list_commands(ctx)  # type: ignore[attr-defined]


def test_version_without_typer(tmp_path: Path) -> None:
    from sandloop import __version__

    typers = subprocess.run([sys.executable, "-c", _TYPER_HELP.replace("'--help'", "'--version'")],
                            capture_output=True, text=True, timeout=120)
    ours = subprocess.run([sys.executable, "-m", "sandloop", "--version"], capture_output=True,
                          text=True, timeout=120)
    assert ours.returncode == typers.returncode == 0
    assert ours.stdout == typers.stdout == f"sandloop {__version__}\n"
    code, modules = loaded(tmp_path, "--version")
    assert code == 0 and "typer" not in modules


# -- the script's exit (cli/main.py: script) -----------------------------------------------------
# The script with an atexit hook that says so when the interpreter's own tear-down runs.
_SCRIPT = """
import atexit, sys
atexit.register(lambda: sys.stderr.write("<torn down>"))
sys.argv = ["sandloop", *sys.argv[1:]]
from sandloop.cli.main import script
script()
"""


def _script(tmp_path: Path, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _SCRIPT, *args], text=True, timeout=120,
                          cwd=tmp_path,
                          **({"stdout": subprocess.PIPE, "stderr": subprocess.PIPE} | kw))


@pytest.mark.parametrize(("source", "code", "out"), [("print(1)\n", 0, "1\n"),
                                                     ("print(2); exit(3)\n", 1, "2\n")])
def test_a_plain_exec_ends_without_the_tear_down(tmp_path: Path, source: str, code: int,
                                                 out: str) -> None:
    (tmp_path / "one.py").write_text(source)
    p = _script(tmp_path, "exec", "--json", "one.py")
    assert p.returncode == code, p.stderr
    assert json.loads(p.stdout)["stdout"] == out  # the result was flushed before the exit
    assert "<torn down>" not in p.stderr
    # Where main() may still hold something (typer's commands), the interpreter ends as usual.
    p = _script(tmp_path, "exec", "--time-limit", "0", "one.py")
    assert p.returncode == 2 and p.stderr.endswith("<torn down>"), p.stderr


def test_a_reader_gone_before_the_flush_ends_quietly(tmp_path: Path) -> None:
    # stdout is a pipe whose reader has closed: the result, buffered, fails only at the flush,
    # which the script now does itself. Like every other reader that stops early, a quiet 0
    # (no "Exception ignored ... BrokenPipeError", no exit 120).
    import os

    (tmp_path / "one.py").write_text("print(1)\n")
    r, w = os.pipe()
    os.close(r)
    try:
        p = _script(tmp_path, "exec", "--json", "one.py", stdout=w, stderr=subprocess.PIPE)
    finally:
        os.close(w)
    assert (p.returncode, p.stderr) == (0, ""), p.stderr
