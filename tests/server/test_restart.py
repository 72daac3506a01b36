"""A server killed mid-load and restarted on the same journal loses no accepted job."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
from live import free_port, serve_process

N_JOBS = 8
# Each run prints a fresh random token: a result recomputed after the restart would differ.
SOURCE = "import os, time\ntime.sleep(0.6)\nprint(os.urandom(8).hex())\n"


def _start(port: int, journal: Path) -> subprocess.Popen[bytes]:
    return serve_process(port, "--slots", "2", "--journal", str(journal))


def _run(port: int, key: str) -> dict[str, object] | None:
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/run", timeout=60,
                       json={"source": SOURCE, "key": key, "limits": {"time_s": 10}})
    except httpx.HTTPError:
        return None  # the server died under us: the client will retry with the same key
    return r.json() if r.status_code == 200 else None


def test_server_killed_mid_load_loses_no_accepted_job(tmp_path: Path) -> None:
    journal = tmp_path / "jobs.db"
    port = free_port()
    keys = [f"job-{i}" for i in range(N_JOBS)]
    server = _start(port, journal)
    try:
        with concurrent.futures.ThreadPoolExecutor(N_JOBS) as pool:
            futures = {k: pool.submit(_run, port, k) for k in keys}
            time.sleep(1.0)  # some finished, some running, the rest queued
            os.killpg(server.pid, signal.SIGKILL)  # the whole server, fork-servers included
            server.wait()
            first = {k: f.result() for k, f in futures.items()}
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
    finished_first = {k: r for k, r in first.items() if r is not None}
    assert 0 < len(finished_first) < N_JOBS, "the kill should land mid-load"

    server = _start(port, journal)  # resumes the journal's unfinished jobs
    try:
        with concurrent.futures.ThreadPoolExecutor(N_JOBS) as pool:
            second = dict(zip(keys, pool.map(lambda k: _run(port, k), keys), strict=True))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    # Every accepted job has a result after the restart...
    assert all(r is not None and r["status"] == "ok" for r in second.values()), second
    # ...and a result a client already received is answered from the journal, not recomputed.
    for k, r in finished_first.items():
        assert second[k]["stdout"] == r["stdout"], k  # type: ignore[index]
    # The killed server's fork-servers and runs died with it (parent-death signals).
    deadline = time.monotonic() + 5
    while _sandbox_uid_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _sandbox_uid_processes() == []


def _sandbox_uid_processes() -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid >= 61000:
                out.append(int(pid))
        except OSError:
            continue
    return out
