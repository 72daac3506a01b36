"""Fuzz of the command line (issue 20): garbage files and option values for every command; every
run ends with exit 0, 1, 2 or 3, without a traceback and without an "internal error" (a bug),
and every error is the one ``sandloop: error: ...`` line (no ``error:`` of a command's own).

In-process through the same entry as the script (``run_guarded``), so that hundreds of cases run
in seconds; tests/cli/test_cli_edges.py checks the real subprocess on the same kinds of input.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandloop.cli import output
from sandloop.cli.exits import run_guarded
from sandloop.cli.main import app

# Each command with its options: "flag" (no value), "int", "float", "path", "text", or a list
# of plausible words. Paths are drawn from the files the fixture makes (garbage of every kind).
COMMANDS: dict[tuple[str, ...], dict[str, object]] = {
    ("doctor",): {"--json": "flag"},
    ("exec",): {"@": "path", "--language": ["python", "c", "bash", "cobol"], "--time-limit": "float",
                "--memory-mb": "int", "--stdin": "path", "--json": "flag"},
    ("exec-batch",): {"@": "path", "--slots": "int", "--table": "flag", "--strict": "flag",
                      "--resume": "flag", "--db": "path", "--no-db": "flag"},
    ("score",): {"--tasks": ["humaneval", "PATH"], "--completions": "path", "--out": "path",
                 "--format": ["native", "mbpp", "bogus"], "--k": "int", "--time-scale": "float",
                 "--slots": "int", "--preload": "text", "--reward": ["binary", "x"],
                 "--reward-on": ["hidden", "x"], "--json": "flag", "--no-db": "flag",
                 "--db": "path"},
    ("add-key",): {"--keys-file": "path", "--id": "text", "--rate": "float", "--burst": "float",
                   "--max-runs": "int", "--max-concurrent": "int", "--max-sessions": "int"},
    ("tasks", "ls"): {"@": "path"},
    ("tasks", "show"): {"@": "path"},
    ("tasks", "stats"): {"@": "path"},
    ("tasks", "validate"): {"@": "path", "--no-db": "flag"},
    ("tasks", "curate"): {"@": "path", "-o": "path", "--no-db": "flag", "--repeat": "int",
                          "--max-mutants": "int", "--slots": "int"},
    ("tasks", "diff"): {"@": "path"},
    ("tasks", "grade"): {"@": "path"},
    ("tasks", "split"): {"@": "path"},
    ("monitor", "analyze"): {"@": "path", "--json": "flag"},
    ("monitor", "report"): {"@": "path"},
    ("monitor", "export"): {"@": "path"},
    ("episodes", "list"): {"--db": "path", "--limit": "int"},
    ("episodes", "replay"): {"@": "text", "--db": "path", "--json": "flag", "--slots": "int"},
    ("env", "build"): {"@": "path", "--store": "path", "--json": "flag"},
    ("env", "ls"): {"--store": "path", "--json": "flag"},
    ("env", "show"): {"@": "text", "--store": "path"},
    ("env", "rm"): {"@": "text", "--store": "path"},
    ("env", "verify"): {"@": "text", "--store": "path", "--json": "flag"},
    ("cluster", "status"): {"@": ["127.0.0.1:1", "local", "nohost.invalid:1", "", ":x",
                                  "127.0.0.1:99999999"], "--json": "flag"},
    # Always with a keys file drawn from the garbage ones (REQUIRED): it is read before
    # anything binds or starts, so no draw can start a server.
    ("serve",): {"--api-keys-file": "file", "--port": "int", "--slots": "int",
                 "--max-body-mb": "int", "--task-set": "path", "--usage-db": "path",
                 "--log-level": ["info", "loud"], "--max-sessions": "int"},
}
REQUIRED: dict[tuple[str, ...], tuple[str, ...]] = {("serve",): ("--api-keys-file",),
                                                   ("tasks", "curate"): ("-o",)}
# Without torch `train` stops at its import (exit 2, the message asserted below); with torch a
# draw of plausible options would start a real training run, so it is fuzzed only without.
if importlib.util.find_spec("torch") is None:
    COMMANDS[("train",)] = {"--out": "path", "--model": "text", "--steps": "int",
                            "--tasks": ["toy", "PATH"], "--reward": ["proper", "weak", "x"],
                            "--slots": "int", "--lr": "float", "--temperature": "float"}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    d = tmp_path_factory.mktemp("fuzz")
    made = {
        "binary.bin": bytes(range(256)) * 8,
        "garbage.py": b"\xff\xfe\x00print(1)\n",
        "empty.jsonl": b"",
        "blank.jsonl": b"\n\n  \n",
        "array.jsonl": b"[1, 2, 3]\n",
        "nested.jsonl": json.dumps({"a": {"b": [None] * 50}}).encode() + b"\n",
        "deep.json": b"[" * 5000 + b"]" * 5000 + b"\n",
        "halfjson.jsonl": b'{"task_id": "HumanEval/0", "completion": \n',
        "wrongtypes.jsonl": b'{"task_id": 5, "completion": ["x"], "source": 7, "limits": "big"}\n',
        "gz.jsonl.gz": gzip.compress(bytes(range(256)) * 4),
        "truncated.jsonl.gz": gzip.compress(b'{"task_id": "x"}\n' * 100)[:30],
        "ok.py": b"print('ok')\n",
        "huge_limits.jsonl": json.dumps({"source": "print(1)", "limits": {
            "memory_mb": 10**9, "time_s": 10**9, "cpus": 10**6}}).encode() + b"\n",
        "toml.jsonl": b'[tool.sandloop]\nx = 1\n',
    }
    for name, data in made.items():
        (d / name).write_bytes(data)
    (d / "adir").mkdir()
    return [str(d / n) for n in made] + [str(d / "adir"), str(d / "missing.jsonl"),
                                         "/proc/self/status", "/dev/null", "-"]


def _value(kind: object, files: list[str]) -> st.SearchStrategy[str]:
    text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
                   max_size=30)
    if kind == "int":
        return st.one_of(st.integers(-10**12, 10**12), st.sampled_from([0, -1, 1, 2**63])
                         ).map(str) | text
    if kind == "float":
        return st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(str),
                         st.sampled_from(["0", "-0", "1e309", "nan", "-inf", "0.001"]), text)
    if kind == "path":
        return st.sampled_from(files) | text
    if kind == "file":
        return st.sampled_from(files)
    if kind == "text":
        return st.sampled_from(["unittest", "os.path", "a b", "", "-x"]) | text
    assert isinstance(kind, list)
    return st.sampled_from([files[0] if k == "PATH" else k for k in kind]) | text


@st.composite
def invocations(draw: st.DrawFn, files: list[str]) -> list[str]:
    cmd = draw(st.sampled_from(sorted(COMMANDS)))
    spec = COMMANDS[cmd]
    argv = [*draw(st.lists(st.sampled_from(["--quiet", "--verbose", "-q"]), max_size=1)), *cmd]
    if "@" in spec:
        argv.append(draw(_value(spec["@"], files)))
    options = [k for k in spec if k != "@"]
    names = draw(st.lists(st.sampled_from(options), max_size=4)) if options else []
    names = [*REQUIRED.get(cmd, ()), *names]
    for name in names:
        argv.append(name)
        if spec[name] != "flag":
            argv.append(draw(_value(spec[name], files)))
    return argv


@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_every_command_survives_garbage(files: list[str], data: st.DataObject,
                                        capsys: pytest.CaptureFixture[str],
                                        tmp_path_factory: pytest.TempPathFactory,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setenv("SANDLOOP_ENV_DIR", str(cache / "envs"))  # never the host's store
    monkeypatch.chdir(cache)
    argv = data.draw(invocations(files))
    output.state.quiet = output.state.verbose = False
    code = run_guarded(app, argv)
    _out, err = capsys.readouterr()
    assert code in (0, 1, 2, 3), (argv, code, err)
    assert _no_traceback_but_the_programs(err), (argv, err)
    assert "internal error" not in err, (argv, err)
    assert _only_sandloop_errors(_the_clis(argv, err)), (argv, err)


def _the_clis(argv: list[str], err: str) -> str:
    """What on stderr the CLI wrote: for ``exec``, the program's (or its compiler's) stderr
    comes before the result line (``<status> wall=...``), and is a result, not the CLI's."""
    if "exec" not in argv:
        return err
    lines = err.splitlines()
    last = max((i for i, ln in enumerate(lines) if re.match(r"^\w+( \w+=\S+)* wall=", ln)),
               default=-1)
    return "\n".join(lines[last + 1:])


def _no_traceback_but_the_programs(err: str) -> bool:
    """No traceback on stderr, except a sandboxed program's own: ``exec`` of a garbage file with
    ``--language python`` runs it, and its traceback (frames in /sandbox or the zygote) is its
    stderr, a result. A traceback with any other frame is the CLI's."""
    frames = re.findall(r'^\s*File "([^"]*)"', err, re.MULTILINE)
    if "Traceback" in err and not frames:
        return False
    return all(f.startswith("/sandbox/") or f == "<sandloop zygote>" for f in frames)


def _only_sandloop_errors(err: str) -> bool:
    """Every error line on stderr is the CLI's one form (``sandloop: error: ...``)."""
    return not any("error:" in ln and not ln.startswith("sandloop: error: ")
                   for ln in err.splitlines())


def _path_argv(cmd: tuple[str, ...], path: str) -> list[str]:
    """``cmd`` with ``path`` in every path-taking place (the other required options plausible)."""
    spec = COMMANDS[cmd]
    argv = [*cmd]
    for name, kind in spec.items():
        if kind in ("path", "file"):
            argv += [path] if name == "@" else [name, path]
    if cmd == ("score",):
        argv += ["--tasks", "humaneval", "--no-db"]
    if cmd == ("add-key",):
        argv += ["--id", "fuzz"]
    if cmd[0] == "monitor" and cmd[1] != "analyze":
        argv += ["-o", "out.html"]
    if cmd == ("tasks", "diff"):
        argv.append(path)
    if cmd == ("episodes", "replay"):
        argv.insert(2, "some-episode")
    if cmd == ("train",):
        argv += ["--steps", "1"]
    return argv


def test_every_command_on_every_garbage_file(files: list[str], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # The systematic half: each command with each kind of bad file in each of its file places.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("SANDLOOP_ENV_DIR", str(tmp_path / "envs"))
    monkeypatch.chdir(tmp_path)
    bad: list[tuple[list[str], int, str]] = []
    for cmd in sorted(COMMANDS):
        takes_a_path = any(kind in ("path", "file") for kind in COMMANDS[cmd].values())
        for path in files if takes_a_path else files[:1]:  # doctor: one run is enough
            if path.endswith("ok.py") and cmd == ("exec",):
                continue  # a real program: covered by test_cli.py
            argv = _path_argv(cmd, path)
            code = run_guarded(app, argv)
            err = capsys.readouterr().err
            if (code not in (0, 1, 2, 3) or "Traceback" in err or "internal error" in err
                    or not _only_sandloop_errors(_the_clis(argv, err))):
                bad.append((argv, code, err[-300:]))
    assert not bad, "\n".join(f"{' '.join(a)} -> {c}: {e}" for a, c, e in bad)


@pytest.mark.parametrize("argv", [
    ["env", "check", "--slots", "0"], ["env", "check", "--slots", "-1"],
    ["env", "check", "--repeat", "0"], ["env", "check", "--repeat", "x"],
    ["episodes", "replay", "x", "--db", "missing.db"], ["episodes", "list", "--db", "."],
    ["env", "show", "nothing-here"], ["cluster", "status", "127.0.0.1:1"],
    ["serve", "--api-keys-file", "missing.json"],
])
def test_sub_commands_print_the_one_error_line(argv: list[str], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Option values out of range (env check would otherwise start a pool) and inputs that do
    # not exist: exit 2, and stderr is exactly one line in the CLI's form.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("SANDLOOP_ENV_DIR", str(tmp_path / "envs"))
    monkeypatch.chdir(tmp_path)
    code = run_guarded(app, argv)
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sandloop: error: "), err


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_train_without_torch_says_what_to_install(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code = run_guarded(app, ["train", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("sandloop: error: sandloop train needs the train extra"), err
    assert "pip install 'sandloop[train]'" in err and len(err.strip().splitlines()) == 1
