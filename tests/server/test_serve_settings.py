"""`sandloop serve` takes the per-request and per-run limits from the project's settings:
sandloop.toml (or [tool.sandloop]) < SANDLOOP_* variables < its own flags. A real server
process, started in a project directory, refuses what is over the limits it was given."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
from live import free_port, serve_process, stop_process

from sandloop.server import ServerConfig
from sandloop.settings import Settings


def test_limits_come_from_file_env_and_flags(tmp_path: Path) -> None:
    # The file sets all three; the environment overrides max_time_s; the flag max_memory_mb.
    (tmp_path / "sandloop.toml").write_text(
        "max_batch = 2\nmax_time_s = 50\nmax_memory_mb = 5000\n")
    port = free_port()
    server = serve_process(port, "--slots", "1", "--max-memory-mb", "100", cwd=tmp_path,
                           env={"SANDLOOP_MAX_TIME_S": "7", "XDG_CACHE_HOME": str(tmp_path)})
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            # Explicit compile limits: the derived ones (10 s, 1024 MiB) would be over these.
            limits = {"time_s": 5, "memory_mb": 64, "compile_time_s": 5, "compile_memory_mb": 64}
            prog = {"source": "print(1)", "limits": limits}
            r = c.post("/v1/batch", json={"requests": [prog] * 3})
            assert r.status_code == 400 and "at most 2 programs" in r.json()["error"], r.text
            r = c.post("/v1/batch", json={"requests": [prog] * 2})
            assert r.status_code == 200 and [x["stdout"] for x in r.json()["results"]] == [
                "1\n", "1\n"], r.text
            r = c.post("/v1/run", json={**prog, "limits": {**limits, "time_s": 8}})
            assert r.status_code == 400 and "at most 7" in r.json()["error"], r.text
            r = c.post("/v1/run", json={**prog, "limits": {**limits, "memory_mb": 200}})
            assert r.status_code == 400 and "at most 100" in r.json()["error"], r.text
            assert c.post("/v1/run", json=prog).json()["status"] == "ok"
    finally:
        stop_process(server)


def test_bad_project_limits_stop_serve_before_it_starts(tmp_path: Path) -> None:
    (tmp_path / "sandloop.toml").write_text("max_batch = 0\n")
    r = subprocess.run([sys.executable, "-m", "sandloop", "serve", "--port", str(free_port())],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("sandloop: error: ") and "sandloop.toml" in r.stderr
    assert "max_batch" in r.stderr and "Traceback" not in r.stderr


def test_server_config_defaults_are_the_settings_defaults() -> None:
    # One default for each limit a project may set, whichever way a server is built.
    for name in ("max_batch", "max_time_s", "max_memory_mb"):
        assert getattr(ServerConfig(), name) == Settings.model_fields[name].default, name
