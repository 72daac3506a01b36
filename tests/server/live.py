"""Run a real sandloop server on 127.0.0.1 in a thread (uvicorn), for tests and benchmarks."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import httpx
import uvicorn

from sandloop.sandbox.pool import UID_RANGE_STRIDE
from sandloop.server import KeyStore, ServerConfig, create_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveApp:
    """Any ASGI app served by uvicorn on a free 127.0.0.1 port, in a thread."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        port = port or free_port()
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._server = uvicorn.Server(uvicorn.Config(
            app, host="127.0.0.1", port=port, log_config=None, access_log=False,
            log_level="warning", timeout_graceful_shutdown=10))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(30)


class LiveServer(LiveApp):
    """A sandloop server (create_app) served by :class:`LiveApp`."""

    def __init__(self, config: ServerConfig | None = None, keys_file: Path | None = None) -> None:
        port = free_port()
        base = config or ServerConfig()
        self.config = ServerConfig(**{**vars(base), "port": port, "keys_file": keys_file})
        self.app = create_app(self.config, keys=KeyStore.load(keys_file))
        super().__init__(self.app, port)

    @property
    def state(self):  # type: ignore[no-untyped-def]
        return self.app.state.sandloop


def serve_process(port: int, *args: str, cwd: Path | None = None,
                  env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`sandloop serve ARGS` on ``port`` as its own process group, once it answers /readyz
    (``env``: variables added to this process's)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandloop", "serve", "--port", str(port), *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        cwd=cwd, env={**os.environ, **env} if env else None)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not become ready")


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 30) -> None:
    """SIGTERM ``proc``'s process group (a graceful shutdown), SIGKILL it after ``grace_s``."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


# -- the sandbox processes of one server ---------------------------------------------------------
# Every pool claims its own range of slot uids (a flock on <run dir>/uids/<first uid>.lock held
# while it lives; sandbox/pool.py _claim_uid_range), and every process a run leaves runs as one
# of them. Counting only the ranges of the server under test keeps these checks true while
# other sandloop servers or test workers run sandboxes on the same host.
_UID_LOCK = re.compile(r"/uids/(\d+)\.lock$")


def uid_ranges_of(pid: int) -> list[range]:
    """The slot uid ranges the process ``pid`` holds now (from its open uid-range locks)."""
    out = []
    fds = f"/proc/{pid}/fd"
    for fd in os.listdir(fds):
        try:
            m = _UID_LOCK.search(os.readlink(f"{fds}/{fd}"))
        except OSError:
            continue  # closed meanwhile
        if m:
            first = int(m.group(1))
            out.append(range(first, first + UID_RANGE_STRIDE))
    return out


def pool_uid_range(first: int) -> range:
    """The range a pool whose ``uid_base`` is ``first`` holds."""
    return range(first, first + UID_RANGE_STRIDE)


def boot_ticks() -> int:
    """Now, in the unit of /proc/PID/stat's start time (clock ticks since boot)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def processes_in(uids: Sequence[range], started_before: int | None = None) -> list[int]:
    """Processes whose real or effective uid is in ``uids``; with ``started_before`` (boot
    ticks) only those started earlier: a range released by a dead server may be claimed by
    another pool, whose processes start later."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                ids = next(ln for ln in f if ln.startswith("Uid:")).split()[1:3]
            if started_before is not None:
                with open(f"/proc/{pid}/stat") as f:
                    # Field 22, counted after the command's closing parenthesis.
                    start = int(f.read().rsplit(")", 1)[1].split()[19])
                if start > started_before:
                    continue
        except (OSError, StopIteration, IndexError, ValueError):
            continue  # gone meanwhile
        if any(int(u) in r for u in ids for r in uids):
            out.append(int(pid))
    return out
