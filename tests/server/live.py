"""Run a real sandloop server on 127.0.0.1 in a thread (uvicorn), for tests and benchmarks."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Self

import httpx
import uvicorn

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


def serve_process(port: int, *args: str) -> subprocess.Popen[bytes]:
    """`sandloop serve ARGS` on ``port`` as its own process group, once it answers /readyz."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandloop", "serve", "--port", str(port), *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
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
