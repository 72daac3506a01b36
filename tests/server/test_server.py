"""The native API, security and operations, against a real server and real sandboxes."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from live import LiveServer, pool_uid_range, processes_in

from sandloop.server import KeyStore, check_bind
from sandloop.server.auth import hash_token
from sandloop.server.config import ConfigError


def test_run_batch_stream(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post("/v1/run", json={"source": "print(input()[::-1])", "stdin": "abc",
                                    "limits": {"time_s": 5}})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "ok" and r.json()["stdout"] == "cba\n"
        assert r.json()["isolation"] == "full" and r.headers["x-request-id"]
        progs = [{"source": f"print({i})"} for i in range(6)] + [{"source": "raise SystemExit(3)"}]
        r = c.post("/v1/batch", json={"requests": progs})
        res = r.json()["results"]
        assert [x["stdout"] for x in res[:6]] == [f"{i}\n" for i in range(6)]
        assert res[6]["status"] == "runtime_error" and res[6]["exit_code"] == 3
        lines = [json.loads(x) for x in c.post("/v1/stream", json={"requests": progs[:3]})
                 .text.splitlines()]
        assert sorted(x["index"] for x in lines) == [0, 1, 2]


def test_sessions(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        sid = c.post("/v1/sessions", json={"language": "python"}).json()["id"]
        assert c.put(f"/v1/sessions/{sid}/files",
                     json={"files": {"a.txt": "hello"}}).status_code == 200
        r = c.post(f"/v1/sessions/{sid}/run",
                   json={"code": "open('b.txt','w').write(open('a.txt').read()+'!')"})
        assert r.json()["status"] == "ok", r.text
        got = c.post(f"/v1/sessions/{sid}/files/read", json={"paths": ["b.txt"]}).json()
        assert base64.b64decode(got["files"]["b.txt"]) == b"hello!"
        assert c.post(f"/v1/sessions/{sid}/run", json={"command": "cat b.txt"}) \
            .json()["stdout"] == "hello!"
        bad = c.put(f"/v1/sessions/{sid}/files", json={"files": {"../x": "no"}})
        assert bad.status_code == 400 and ".." in bad.json()["error"]
        assert c.delete(f"/v1/sessions/{sid}").status_code == 200
        assert c.post(f"/v1/sessions/{sid}/run", json={"command": "ls"}).status_code == 404


def test_bad_input_is_a_clear_4xx(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.post("/v1/run", json={"source": "x", "language": "cobol"})
        assert r.status_code in (400, 422) and "cobol" in r.json()["error"]
        r = c.post("/v1/run", json={"source": "x", "limits": {"time_s": 100000}})
        assert r.status_code == 422
        r = c.post("/v1/run", json={"source": "x", "limits": {"memory_mb": 60000}})
        assert r.status_code == 400 and "maximum" in r.json()["error"]
        r = c.post("/v1/run", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 422
        r = c.post("/run_code", json={"code": "x", "language": "python",
                                      "files": {"/etc/passwd": "eA=="}})
        assert r.status_code == 400 and "relative" in r.json()["error"]
        r = c.post("/v1/score", json={"items": [{"task": "nope/1", "completion": "x"}]})
        assert r.status_code == 400 and "items[0]" in r.json()["error"]
        # An environment that does not exist is the request's fault: answered at once, never
        # retried three times into a sandbox_error (issue 23's "no request yields sandbox_error").
        r = c.post("/v1/run", json={"source": "print(1)", "environment": "nope-env"})
        assert r.status_code == 400 and r.json()["code"] == "unknown_environment", r.text
        big = "x" * (server.config.max_body_bytes + 10)
        r = c.post("/v1/run", json={"source": big})
        assert r.status_code == 413

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts as it reads
            yield b'{"code": "' + big.encode() + b'", "language": "python"}'

        r = c.post("/run_code", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413


def test_operations(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/readyz").json()["status"] == "ready"
        c.post("/v1/run", json={"source": "print(1)"})
        # /run_code takes the direct lane (server/direct.py): still counted under its route,
        # still given a request id.
        r = c.post("/run_code", json={"code": "print(1)", "language": "python"},
                   headers={"x-request-id": "rc-1"})
        assert r.json()["run_result"]["stdout"] == "1\n" and r.headers["x-request-id"] == "rc-1"
        text = c.get("/metrics").text
        assert 'sandloop_http_requests_total{code="200",method="POST",route="/run_code"}' in text
        for name in ("sandloop_queue_depth", "sandloop_slots_busy", "sandloop_run_seconds_bucket",
                     'sandloop_runs_total{status="ok"}', "sandloop_http_requests_total"):
            assert name in text, name
        assert c.get("/openapi.json").json()["paths"]["/run_code"]


def test_auth_rate_and_quota(keyed: tuple[LiveServer, dict[str, str]]) -> None:
    srv, tok = keyed
    prog = {"code": "print(1)", "language": "python"}
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        assert c.post("/v1/run", json={"source": "print(1)"}).status_code == 401
        assert c.post("/run_code", json=prog,
                      headers={"Authorization": "Bearer sl-wrong"}).status_code == 401
        ok = c.post("/run_code", json=prog, headers={"Authorization": f"Bearer {tok['open']}"})
        assert ok.status_code == 200 and ok.json()["status"] == "Success"
        # Key in the URL, for compatibility clients that cannot send headers.
        assert c.post(f"/k/{tok['open']}/run_code", json=prog).json()["status"] == "Success"
        assert c.post(f"/run_code?api_key={tok['open']}", json=prog).status_code == 200
        # Rate limit: burst 2, then 429 with Retry-After.
        h = {"Authorization": f"Bearer {tok['slow']}"}
        codes = [c.post("/run_code", json=prog, headers=h) for _ in range(3)]
        assert [r.status_code for r in codes] == [200, 200, 429]
        assert int(codes[2].headers["retry-after"]) >= 1 and "rate limit" in codes[2].text
        # Quota: 3 runs in all.
        h = {"Authorization": f"Bearer {tok['quota']}"}
        codes2 = [c.post("/run_code", json=prog, headers=h).status_code for _ in range(4)]
        assert codes2 == [200, 200, 200, 429]
        # Keys are stored hashed only.
        assert tok["open"] not in Path(str(srv.config.keys_file)).read_text()
        assert hash_token(tok["open"]) in Path(str(srv.config.keys_file)).read_text()


def test_refuses_non_loopback_without_keys(tmp_path: Path) -> None:
    check_bind("127.0.0.1", False)
    check_bind("::1", False)
    check_bind("0.0.0.0", True)
    for host in ("0.0.0.0", "10.1.2.3", "example.com"):
        try:
            check_bind(host, False)
        except ConfigError as e:
            assert "without API keys" in str(e)
        else:
            raise AssertionError(host)
    p = subprocess.run([sys.executable, "-m", "sandloop", "serve", "--host", "0.0.0.0"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "without API keys" in p.stderr
    assert not KeyStore.load(None).enabled


def _sandbox_processes(server: LiveServer) -> list[int]:
    """Processes running as one of this server's slot uids (its pool's claimed range; not
    those of other sandloop servers on the host)."""
    return processes_in([pool_uid_range(server.state.engine.backend.pool.uid_base)])


def test_client_disconnect_leaves_no_process(server: LiveServer) -> None:
    before = server.state.engine.snapshot().executed
    completed_before = server.state.engine.snapshot().completed
    # The runs would sleep for a minute: only killing them on disconnect ends them in time.
    body = json.dumps({"source": "import time\ntime.sleep(60)", "limits": {"time_s": 90}})
    # Saturate both slots, then queue a third run; disconnect all three mid-run.
    socks = []
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
        s.sendall(f"POST /v1/run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        socks.append(s)
    # Synchronise on the state needed (both slots running), not on a guess of how long it takes.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (server.state.engine.snapshot().running < 2
                                           or not _sandbox_processes(server)):
        time.sleep(0.02)
    assert server.state.engine.snapshot().running == 2 and _sandbox_processes(server), \
        "the runs should be going"
    for s in socks:
        s.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (_sandbox_processes(server)
                                           or server.state.engine.snapshot().running):
        time.sleep(0.1)
    assert _sandbox_processes(server) == []
    assert server.state.engine.snapshot().running == 0
    # None of the three produced a result. The queued third was withdrawn; it may have been
    # dispatched (and killed) in the instant between the first two disconnects and its own.
    snap = server.state.engine.snapshot()
    assert snap.completed == completed_before
    assert snap.executed - before in (2, 3)
