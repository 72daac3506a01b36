"""The engine is the one owner of infrastructure retries, end to end through the server.

Issue 21 counted up to 9 attempts of one verifier run through the server (pool x2, engine x3,
verifier x2). Here the server's engine runs on a backend whose every execution is an
infrastructure failure, and the backend counts what reaches it: each request's run is
attempted exactly ``RetryPolicy().max_attempts`` times, whichever surface it came through, and
the answer says the infrastructure failed (a null reward, never 0).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from live import LiveServer

import sandloop.server.app as server_app
from sandloop.engine import Engine, RetryPolicy
from sandloop.engine.testing import ScriptedBackend
from sandloop.server import ServerConfig

ATTEMPTS = RetryPolicy().max_attempts


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LiveServer, ScriptedBackend]]:
    backend = ScriptedBackend(fail_first=10**9)

    def engine(**kwargs: Any) -> Engine:
        # The server's own engine settings, on the failing backend; the default retry policy
        # (no backoff, so the test is quick: the count is what matters).
        return Engine(backend, max_sessions=kwargs["max_sessions"],
                      retry=RetryPolicy(max_attempts=ATTEMPTS, backoff_s=0.0))

    monkeypatch.setattr(server_app, "Engine", engine)
    with LiveServer(ServerConfig(slots=1)) as srv:
        yield srv, backend


def test_one_verifier_run_is_attempted_max_attempts_times(
        broken: tuple[LiveServer, ScriptedBackend]) -> None:
    srv, backend = broken
    task = {"inputs": ["1\n"], "outputs": ["1\n"]}  # a stdin/stdout task given inline
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.post("/v1/score", json={"items": [{"task": task, "completion": "print(input())"}]})
        assert r.status_code == 200, r.text
        (result,) = r.json()["results"]
        assert result["reward"] is None and result["verdict"] == "sandbox_error", result
        assert backend.calls == ATTEMPTS, backend.calls  # not 9: no layer but the engine retries

        for path, body in (("/v1/run", {"source": "print(1)"}),
                           ("/run_code", {"code": "print(1)", "language": "python"})):
            before = backend.calls
            r = c.post(path, json=body)
            assert r.status_code == 200, (path, r.text)
            assert backend.calls - before == ATTEMPTS, path
