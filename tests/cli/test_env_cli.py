"""``sandloop env``: build / ls / show / verify / rm through the real CLI, and ``env check``
on a real pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, store: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDLOOP_ENV_DIR": str(store),
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "sandloop", "env", *args], capture_output=True,
                          text=True, env=env, timeout=600)


def test_env_lifecycle(tmp_path: Path) -> None:
    store = tmp_path / "store"
    spec = tmp_path / "tiny.toml"
    spec.write_text('name = "tiny"\n[files]\n"hello.txt" = "hi"\n[env]\nGREETING = "hi"\n')
    r = cli("build", str(spec), "--json", store=store)
    assert r.returncode == 0, r.stderr
    built = json.loads(r.stdout)
    env_id = built["id"]
    assert built["name"] == "tiny" and (store / env_id / "tree" / "hello.txt").is_file()

    r = cli("ls", "--json", store=store)
    assert [json.loads(line)["names"] for line in r.stdout.splitlines()] == [["tiny"]]

    shown = json.loads(cli("show", env_id[:8], store=store).stdout)
    assert shown["mount"]["target"] == "/opt/env"
    assert shown["mount"]["env"]["GREETING"] == "hi"
    assert shown["mount"]["env"]["PYTHONHASHSEED"] == "0"

    assert cli("verify", store=store).returncode == 0
    target = store / env_id / "tree" / "hello.txt"
    os.chmod(target.parent, 0o755)
    os.chmod(target, 0o644)
    target.write_text("tampered")
    r = cli("verify", "tiny", store=store)
    assert r.returncode == 1 and "MODIFIED" in r.stdout and "hello.txt" in r.stdout

    assert cli("rm", "tiny", store=store).returncode == 0
    r = cli("show", "tiny", store=store)
    assert r.returncode == 2 and "no environment 'tiny'" in r.stderr


def test_build_errors_are_exit_2_with_the_fix(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text('name = "bad"\n[python]\npackages = ["numpy>=2"]\n')
    r = cli("build", str(spec), store=tmp_path / "s")
    assert r.returncode == 2 and "exact pin" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="full isolation needs root")
def test_check_reports_every_probe(tmp_path: Path) -> None:
    r = cli("check", "--repeat", "1", "--slots", "2", "--json", "--env", "python", store=tmp_path)
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    by_name = {x["probe"]: x for x in lines}
    assert {"set_order", "str_hash", "locale", "timezone", "environ", "shell_python"} <= set(by_name)
    assert all(sum(v["count"] for v in x["variants"]) == 2 for x in lines)
    assert all(v["status"] == "ok" for x in lines for v in x["variants"])
    # Pinned already by the sandbox's own environment: locale and time zone.
    assert by_name["locale"]["deterministic"] and by_name["timezone"]["deterministic"]
    assert r.returncode == (0 if all(x["deterministic"] for x in lines) else 1)


def sandloop(*args: str, store: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDLOOP_ENV_DIR": str(store),
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "sandloop", *args], capture_output=True,
                          text=True, env=env, timeout=600)


@pytest.mark.skipif(os.geteuid() != 0, reason="full isolation needs root")
def test_requests_name_their_environment(tmp_path: Path) -> None:
    """`sandloop exec --env` and an exec-batch line's "environment" field name the environment
    a run needs (issue 17: "a task (or a request) names the environment"); the result records
    it; an unknown one is the caller's error (exit 2), not a crash."""
    store = Path(os.environ["SANDLOOP_ENV_DIR"])  # the session's, where `python` is built
    prog = tmp_path / "p.py"
    prog.write_text("import sys\nprint(sys.prefix)\n")
    r = sandloop("exec", "--json", "--env", "python", str(prog), store=store)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    python_id = json.loads(sandloop("env", "show", "python", store=store).stdout)["id"]
    assert res["stdout"] == "/opt/env/python\n" and res["environment"] == python_id
    r = sandloop("exec", "--env", "no-such-env", str(prog), store=store)
    assert r.returncode == 2 and "no environment 'no-such-env'" in r.stderr, r.stderr
    batch = tmp_path / "b.jsonl"
    batch.write_text(json.dumps({"source": "print(1)", "environment": python_id[:12]}) + "\n"
                     + json.dumps({"source": "print(2)", "environment": "no-such-env"}) + "\n")
    r = sandloop("exec-batch", "--no-db", str(batch), store=store)
    first, second = (json.loads(line) for line in r.stdout.splitlines())
    assert first["status"] == "ok" and first["environment"] == python_id
    assert second["status"] == "invalid_request" and "no-such-env" in second["error"], second


@pytest.mark.skipif(os.geteuid() != 0, reason="full isolation needs root")
def test_exec_tells_the_new_languages_by_their_extension(tmp_path: Path) -> None:
    import shutil
    if shutil.which("go", path="/usr/bin:/bin") is None:
        pytest.skip("go not installed")
    src = tmp_path / "hello.go"
    src.write_text('package main\nimport "fmt"\nfunc main() { fmt.Println("hi go") }\n')
    r = sandloop("exec", "--json", str(src), store=Path(os.environ["SANDLOOP_ENV_DIR"]))
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["stdout"] == "hi go\n" and res["compile"]["status"] == "ok"


def test_check_of_an_unknown_environment_is_exit_2(tmp_path: Path) -> None:
    r = cli("check", "--repeat", "1", "--env", "no-such-env", store=tmp_path)
    assert r.returncode == 2 and "no environment 'no-such-env'" in r.stderr, r.stderr
