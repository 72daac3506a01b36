"""The server's JSON logging: one handler however often it is configured, written to the
``sys.stderr`` of the moment (never a stream that was swapped out and closed since), and undone
when ``sandloop serve`` returns, so an in-process ``serve`` (a test, a tool) leaves nothing
behind. Before, ``serve`` on a taken port, run under pytest's capture, left a handler on the
captured stream: every later request of any in-process server printed ``--- Logging error ---``.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import sys
from collections.abc import Iterator

import pytest

from sandloop.cli.exits import run_guarded
from sandloop.cli.main import app
from sandloop.server.observability import (
    StderrHandler,
    configure_logging,
    log,
    logging_configured,
)

LOGGERS = ("sandloop.server", "uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


def _state() -> list[tuple[list[logging.Handler], int, bool]]:
    return [(list(lg.handlers), lg.level, lg.propagate) for lg in map(logging.getLogger, LOGGERS)]


@pytest.fixture
def restored() -> Iterator[None]:
    """configure_logging changes process-wide loggers: put them back after the test."""
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate)
             for lg in map(logging.getLogger, LOGGERS)]
    yield
    for lg, handlers, level, propagate in saved:
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate


def test_configuring_twice_leaves_one_handler(restored: None) -> None:
    configure_logging("info")
    configure_logging("debug")
    for name in LOGGERS:
        lg = logging.getLogger(name)
        assert sum(isinstance(h, StderrHandler) for h in lg.handlers) == 1, name
        assert lg.level == logging.DEBUG and not lg.propagate


def test_records_go_to_the_stderr_of_the_moment(restored: None,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    configure_logging("info")
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    log.info("request", extra={"route": "/a"})
    first.close()  # as pytest closes a test's captured stream
    monkeypatch.setattr(sys, "stderr", second)
    log.info("request", extra={"route": "/b"})  # no "--- Logging error ---"
    line = json.loads(second.getvalue())
    assert line["msg"] == "request" and line["route"] == "/b"
    assert "Logging error" not in second.getvalue()


def test_logging_configured_restores_the_loggers() -> None:
    before = _state()
    with logging_configured("warning"):
        assert logging.getLogger("sandloop.server").level == logging.WARNING
        assert _state() != before
    assert _state() == before


def test_serve_in_process_on_a_taken_port_leaves_logging_as_it_was(
        capsys: pytest.CaptureFixture[str]) -> None:
    before = _state()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert run_guarded(app, ["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert "in use" in err and '"ready"' not in err, err
    assert _state() == before
