"""The exception-to-status table is complete, and every error reply has the one shape."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from live import LiveServer, free_port

import sandloop
import sandloop.errors
from sandloop.server import ServerConfig
from sandloop.server.errors import STATUS, http_error

# Layers whose exceptions can reach a route. Integrations are trainer-side clients of this
# server (and may not be imported by it: same layer); the CLI answers on a terminal.
SERVED = ("sandloop.engine", "sandloop.sandbox", "sandloop.tasks", "sandloop.reward",
          "sandloop.store", "sandloop.monitor", "sandloop.episodes", "sandloop.curation",
          "sandloop.envs", "sandloop.server", "sandloop.errors",
          "sandloop.jsonl")
# The layers' bases: a new class must not get its status by merely inheriting one of these.
BASES = {c for _, c in inspect.getmembers(sandloop.errors, inspect.isclass)}


def _served_exceptions() -> list[type[BaseException]]:
    found = []
    for mod in pkgutil.walk_packages(sandloop.__path__, "sandloop."):
        if not mod.name.startswith(SERVED) or mod.name.endswith("__main__"):
            continue
        module = importlib.import_module(mod.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, sandloop.errors.SandloopError) and obj.__module__ == module.__name__:
                found.append(obj)
    return found


def test_every_exception_the_server_can_meet_has_a_deliberate_status() -> None:
    classes = _served_exceptions()
    assert len(classes) > 30  # the walk found the package's exceptions
    missing = []
    for cls in classes:
        mapped = [c for c in cls.__mro__ if c in STATUS]
        if cls in STATUS or (mapped and mapped[0] not in BASES):
            continue
        missing.append(f"{cls.__module__}.{cls.__qualname__}")
    assert missing == [], f"give these an entry in sandloop.server.errors.STATUS: {missing}"


def test_the_callers_mistakes_are_4xx_and_bugs_are_500() -> None:
    from sandloop.engine import IdempotencyConflict, QueueFull, SessionFull
    from sandloop.sandbox.models import ProgramInputError

    for cls in _served_exceptions():
        entry = http_error(cls.__new__(cls))
        assert 400 <= entry.status < 600 and entry.code, cls
    assert http_error(ValueError("a bug")).status == 500  # not the client's fault
    assert http_error(KeyError("x")).status == 500
    assert http_error(ProgramInputError("x")).status == 400
    assert http_error(IdempotencyConflict.__new__(IdempotencyConflict)).status == 409
    assert http_error(SessionFull("x")).status == 413
    assert http_error(QueueFull("x")).status == 503


@pytest.fixture(scope="module")
def srv() -> LiveServer:
    with LiveServer(ServerConfig(slots=1, max_body_bytes=1 << 16)) as s:
        yield s


def _shaped(r: httpx.Response, status: int, code: str | None = None) -> dict[str, object]:
    assert r.status_code == status, r.text
    body = r.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    assert isinstance(body.get("code"), str), body
    if code is not None:
        assert body["code"] == code, body
    return body


def test_every_http_error_has_the_one_shape(srv: LiveServer) -> None:
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        _shaped(c.get("/nope"), 404, "not_found")
        _shaped(c.get("/v1/run"), 405, "method_not_allowed")
        _shaped(c.post("/v1/run", content=b"{not json",
                       headers={"content-type": "application/json"}), 422, "validation_error")
        body = _shaped(c.post("/v1/run", json={"source": 3}), 422, "validation_error")
        assert body["details"]
        _shaped(c.post("/v1/run", content=b"x" * (1 << 17)), 413, "body_too_large")
        _shaped(c.post("/run_code", content=b"{not json",
                       headers={"content-type": "application/json"}), 422)
        _shaped(c.post("/v1/run", json={"source": "1", "limits": {"time_s": 3000}}), 400,
                "bad_request")
        _shaped(c.post("/v1/sessions/nope/run", json={"command": "ls"}), 404,
                "session_not_found")
        _shaped(c.get("/v1/tasksets/nope/tasks"), 400, "bad_request")


def test_a_nul_byte_in_source_shows_no_host_path(srv: LiveServer) -> None:
    src_dir = str(Path(sandloop.__file__).parent)
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for r in (c.post("/v1/run", json={"source": "print(1)\0"}),
                  c.post("/run_code", json={"code": "print(1)\0", "language": "python"})):
            assert r.status_code == 200 and src_dir not in r.text and "/work/" not in r.text


def test_docs_load_with_no_external_url(srv: LiveServer) -> None:
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for page in ("/docs", "/redoc"):
            html = c.get(page).text
            assert "://" not in html, html  # every asset from this server
            for src in [p.split('"')[0] for p in html.split('src="')[1:]] + \
                    [p.split('"')[0] for p in html.split('href="')[1:]]:
                r = c.get(src)
                assert r.status_code == 200 and len(r.content) > 1000, src
        assert c.get("/openapi.json").json()["components"]["schemas"]["ErrorBody"]
        _shaped(c.get("/docs/assets/../../etc/passwd"), 404)
        _shaped(c.get("/docs/assets/nope.js"), 404)


@pytest.mark.parametrize(("args", "says"), [
    (["--port", "70000"], "65535"),
    (["--task-set", "nope"], "task set 'nope'"),
    (["--max-body-mb", "-1"], "--max-body-mb"),
])
def test_serve_refuses_bad_settings_before_starting(args: list[str], says: str) -> None:
    p = subprocess.run([sys.executable, "-m", "sandloop", "serve", *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and says in p.stderr and '"ready"' not in p.stderr, p.stderr


def test_serve_on_a_taken_port_fails_without_saying_ready() -> None:
    import socket

    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        p = subprocess.run([sys.executable, "-m", "sandloop", "serve", "--port", str(port)],
                           capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "in use" in p.stderr and '"ready"' not in p.stderr, p.stderr
