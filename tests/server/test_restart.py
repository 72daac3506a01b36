"""A server killed mid-load and restarted on the same journal loses no accepted job."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
from live import boot_ticks, free_port, processes_in, serve_process, uid_ranges_of

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
    # The slot uids the first server's pool claimed: its processes, and no other server's.
    uids = uid_ranges_of(server.pid)
    assert uids, "the server holds its uid range once ready"
    try:
        with concurrent.futures.ThreadPoolExecutor(N_JOBS) as pool:
            futures = {k: pool.submit(_run, port, k) for k in keys}
            # Some finish, some run, the rest queue; meanwhile its runs show in its range (so
            # the range counted below is the right one). Killed once the first result is in
            # (the 8 runs take ~2.4 s on 2 slots; a busy machine may take longer to start).
            seen, until = False, time.monotonic() + 60.0
            while time.monotonic() < until and not (
                    seen and any(f.done() for f in futures.values())):
                seen = seen or bool(processes_in(uids))
                time.sleep(0.02)
            assert seen, "the server's runs should show in its uid range"
            killed_at = boot_ticks()
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
    # The killed server's fork-servers and runs died with it (parent-death signals). Its uid
    # range is free since the kill, so only processes started before it are counted (the
    # restarted server, or any other pool, may have claimed the range since).
    def left() -> list[int]:
        return processes_in(uids, started_before=killed_at)

    deadline = time.monotonic() + 5
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left() == []
