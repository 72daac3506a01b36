"""Tenants are kept apart: idempotency keys, session results, session memory and counts; and the
service's edges (clients that hang up mid-body, what answers without a key). Real servers on
127.0.0.1, real HTTP clients, real sandboxes."""

from __future__ import annotations

import concurrent.futures
import logging
import re
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from live import LiveServer

from sandloop.server import ServerConfig, add_key

# A fresh random token in every output: a result answered from another run is told apart.
SAYS = "import os\nprint({!r}, os.urandom(8).hex())"


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[tuple[LiveServer, dict[str, dict[str, str]]]]:
    """Keys alice and bob (and carol, allowed one session), a journal, 2 sessions per key."""
    d = tmp_path_factory.mktemp("tenants")
    path = d / "keys.json"
    tokens = {n: add_key(path, n) for n in ("alice", "bob")}
    tokens["carol"] = add_key(path, "carol", max_sessions=1)
    config = ServerConfig(slots=2, journal=d / "jobs.db", db=d / "results.db",
                          max_sessions_per_key=2)
    with LiveServer(config, keys_file=path) as s:
        yield s, {n: {"Authorization": f"Bearer {t}"} for n, t in tokens.items()}


def _run(url: str, who: dict[str, str], source: str, key: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/run", headers=who, timeout=60,
                      json={"source": source, "key": key, "limits": {"time_s": 10}})


def test_idempotency_keys_are_per_tenant_in_both_orders(
        tenants: tuple[LiveServer, dict[str, dict[str, str]]]) -> None:
    srv, h = tenants
    alice, bob = SAYS.format("alice"), SAYS.format("bob")
    # alice first, then bob with the same key and his own program.
    a = _run(srv.url, h["alice"], alice, "k1")
    b = _run(srv.url, h["bob"], bob, "k1")
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    assert a.json()["stdout"].startswith("alice") and b.json()["stdout"].startswith("bob")
    # bob first this time: alice still gets her own output.
    b2 = _run(srv.url, h["bob"], bob, "k2")
    a2 = _run(srv.url, h["alice"], alice, "k2")
    assert a2.json()["stdout"].startswith("alice") and b2.json()["stdout"].startswith("bob")
    # Both at once.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        fa = pool.submit(_run, srv.url, h["alice"], alice, "k3")
        fb = pool.submit(_run, srv.url, h["bob"], bob, "k3")
        assert fa.result().json()["stdout"].startswith("alice")
        assert fb.result().json()["stdout"].startswith("bob")
    # A true retry is answered from the journal (the same random token), for each tenant.
    assert _run(srv.url, h["alice"], alice, "k1").json()["stdout"] == a.json()["stdout"]
    assert _run(srv.url, h["bob"], bob, "k1").json()["stdout"] == b.json()["stdout"]


def test_stored_scores_are_per_tenant(
        tenants: tuple[LiveServer, dict[str, dict[str, str]]]) -> None:
    # Threat: the result store answered bob with alice's record of the same completion (her
    # timings: he learns what she scored; for a completion that reads the clock or a random
    # number, her verdict). Records are shared within one key only.
    srv, h = tenants
    # Passes or fails at random: two tenants' records of it are told apart by their verdicts.
    coin = ("import os\ndef f(x):\n    return x + 1 if os.urandom(1)[0] % 2 else x\n")
    body = {"items": [{"task": {"inputs": [[1]], "outputs": [2], "fn_name": "f"},
                       "completion": coin}]}

    def score(who: str) -> dict[str, object]:
        r = httpx.post(f"{srv.url}/v1/score", headers=h[who], json=body, timeout=60)
        assert r.status_code == 200, r.text  # a journaled server takes call-based tasks too
        out: dict[str, object] = r.json()["results"][0]
        return out

    first = score("alice")
    assert score("alice") == first  # alice's own record answers her again
    seen = {str(score(who)) for who in ("bob", "carol")}
    assert str(first) not in seen  # her record (its timings, at least) reached no one else


def test_binary_files_run_on_a_journaled_server(
        tenants: tuple[LiveServer, dict[str, dict[str, str]]]) -> None:
    # Bytes that are not UTF-8 made the journal's JSON fail: a 500 for any binary input file.
    srv, h = tenants
    r = httpx.post(f"{srv.url}/run_code", headers=h["alice"], timeout=60, json={
        "code": "print(open('a', 'rb').read())", "language": "python", "files": {"a": "/w=="}})
    assert r.status_code == 200 and r.json()["run_result"]["stdout"] == "b'\\xff'\n", r.text


def test_a_key_reused_for_another_program_is_409(
        tenants: tuple[LiveServer, dict[str, dict[str, str]]]) -> None:
    srv, h = tenants
    first = _run(srv.url, h["alice"], SAYS.format("one"), "reused")
    assert first.status_code == 200
    again = _run(srv.url, h["alice"], SAYS.format("two"), "reused")
    assert again.status_code == 409 and "different program" in again.json()["error"]
    assert _run(srv.url, h["alice"], SAYS.format("one"), "reused").json() == first.json()


def test_session_runs_see_the_current_files(
        tenants: tuple[LiveServer, dict[str, dict[str, str]]]) -> None:
    srv, h = tenants
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        def session(who: str) -> str:
            r = c.post("/v1/sessions", headers=h[who], json={})
            assert r.status_code == 201, r.text
            return str(r.json()["id"])

        def put(who: str, sid: str, text: str) -> None:
            r = c.put(f"/v1/sessions/{sid}/files", headers=h[who], json={"files": {"f": text}})
            assert r.status_code == 200, r.text

        def cat(who: str, sid: str) -> str:
            r = c.post(f"/v1/sessions/{sid}/run", headers=h[who], json={"command": "cat f"})
            assert r.status_code == 200, r.text
            return str(r.json()["stdout"])

        sa, sb = session("alice"), session("bob")
        put("alice", sa, "first")
        assert cat("alice", sa) == "first"
        put("alice", sa, "second")  # same command, same limits, new state: a new run
        assert cat("alice", sa) == "second"
        put("bob", sb, "bob's")
        assert cat("bob", sb) == "bob's"
        for who, sid in (("alice", sa), ("bob", sb)):
            assert c.delete(f"/v1/sessions/{sid}", headers=h[who]).status_code == 200


def test_sessions_per_key_are_capped(
        tenants: tuple[LiveServer, dict[str, dict[str, str]]]) -> None:
    srv, h = tenants
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        mine = [c.post("/v1/sessions", headers=h["alice"], json={}) for _ in range(3)]
        assert [r.status_code for r in mine] == [201, 201, 429]
        assert "holds 2 open sessions" in mine[2].json()["error"]
        other = c.post("/v1/sessions", headers=h["bob"], json={})  # bob is not alice
        assert other.status_code == 201
        sid = mine[0].json()["id"]
        assert c.delete(f"/v1/sessions/{sid}", headers=h["alice"]).status_code == 200
        again = c.post("/v1/sessions", headers=h["alice"], json={})
        assert again.status_code == 201
        carol = [c.post("/v1/sessions", headers=h["carol"], json={}) for _ in range(2)]
        assert [r.status_code for r in carol] == [201, 429]  # her key's own max_sessions
        for who, r in (("alice", mine[1]), ("alice", again), ("bob", other),
                       ("carol", carol[0])):
            assert c.delete(f"/v1/sessions/{r.json()['id']}", headers=h[who]).status_code == 200


def test_session_files_are_bounded_by_its_memory_limit(
        tenants: tuple[LiveServer, dict[str, dict[str, str]]]) -> None:
    srv, h = tenants
    with httpx.Client(base_url=srv.url, timeout=60, headers=h["alice"]) as c:
        sid = c.post("/v1/sessions", json={
            "limits": {"memory_mb": 64, "workdir_mb": 1024}}).json()["id"]
        r = c.post(f"/v1/sessions/{sid}/run", json={"command": "head -c 200M /dev/zero > big"})
        assert r.json()["status"] in ("runtime_error", "memory_limit"), r.text
        assert c.post(f"/v1/sessions/{sid}/run",
                      json={"command": "rm -f big"}).json()["status"] == "ok"
        codes = []
        for i in range(7):  # 12 MiB a request: the 6th cannot fit in 64 MiB
            w = c.put(f"/v1/sessions/{sid}/files", json={"files": {f"f{i}": "x" * (12 << 20)}})
            codes.append(w.status_code)
            if w.status_code != 200:
                assert w.status_code == 413 and "do not fit" in w.json()["error"], w.text
                break
        assert codes[-1] == 413 and len(codes) <= 6, codes
        du = c.post(f"/v1/sessions/{sid}/run", json={"command": "du -sm . | cut -f1"})
        assert int(du.json()["stdout"]) <= 64
        assert c.delete(f"/v1/sessions/{sid}").status_code == 200


def _metrics(url: str, headers: dict[str, str] | None = None) -> str:
    return httpx.get(f"{url}/metrics", headers=headers, timeout=30).text


def test_client_hanging_up_mid_body_is_not_a_server_error(
        tenants: tuple[LiveServer, dict[str, dict[str, str]]],
        caplog: pytest.LogCaptureFixture) -> None:
    srv, h = tenants
    port = int(srv.url.rsplit(":", 1)[1])
    token = h["alice"]["Authorization"]
    # /v1/run goes through FastAPI, /run_code through the direct lane (server/direct.py).
    for path in ("/v1/run", "/run_code"):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Authorization: {token}\r\nContent-Length: 1000\r\n\r\n"
                  '{"source": "print(1)", "code": "pri'.encode())
        time.sleep(0.2)
        s.close()
    caplog.set_level(logging.INFO)
    deadline = time.monotonic() + 10
    pattern = r'sandloop_http_requests_total\{{code="{}",method="POST",route="{}"\}}'
    while time.monotonic() < deadline:
        text = _metrics(srv.url, h["alice"])
        if all(re.search(pattern.format("499", re.escape(p)), text)
               for p in ("/v1/run", "/run_code")):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"no 499 counted:\n{text}")
    assert not re.search(r'code="5\d\d"', text), text
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory: pytest.TempPathFactory,
                ) -> Iterator[tuple[LiveServer, LiveServer, dict[str, str]]]:
    """The same key on a default server and on one with --public-docs --public-metrics."""
    path = tmp_path_factory.mktemp("pub") / "keys.json"
    token = add_key(path, "ops")
    with LiveServer(ServerConfig(slots=1), keys_file=path) as closed, \
            LiveServer(ServerConfig(slots=1, public_docs=True, public_metrics=True),
                       keys_file=path) as public:
        yield closed, public, {"Authorization": f"Bearer {token}"}


def test_docs_and_metrics_need_a_key_unless_opened(
        two_servers: tuple[LiveServer, LiveServer, dict[str, str]]) -> None:
    closed, public, h = two_servers
    token = h["Authorization"].split()[1]
    for path in ("/openapi.json", "/docs", "/redoc", "/metrics"):
        assert httpx.get(closed.url + path).status_code == 401, path
        assert httpx.get(closed.url + path, headers=h).status_code == 200, path
        assert httpx.get(f"{closed.url}{path}?api_key={token}").status_code == 200, path
        assert httpx.get(public.url + path).status_code == 200, path
    assert "/v1/run" in httpx.get(closed.url + "/openapi.json", headers=h).json()["paths"]
    # The docs page fetches the description with the key it was given.
    page = httpx.get(f"{closed.url}/docs?api_key={token}").text
    assert f"/openapi.json?api_key={token}" in page
    # Health probes stay open on both; the API itself never is.
    assert httpx.get(closed.url + "/healthz").status_code == 200
    assert httpx.post(public.url + "/v1/run", json={"source": "print(1)"}).status_code == 401


def test_cli_flags() -> None:
    from typer.testing import CliRunner

    from sandloop.cli.main import app

    out = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    for flag in ("--public-docs", "--public-metrics", "--max-sessions-per-key",
                 "--max-sessions", "--session-memory-mb"):
        assert flag in out, flag


def test_the_live_monitor_keeps_each_keys_runs_apart(
        tenants: tuple[LiveServer, dict[str, dict[str, str]]]) -> None:
    # Threat: runs were keyed by run_id alone: bob listed alice's runs on /dashboard/data, read
    # their statistics, and posted alerts into them.
    srv, h = tenants
    rollouts = [{"step": s, "task_id": "t", "completion": f"c{s}", "reward": 1.0}
                for s in range(3)]
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.post("/v1/monitor/rollouts", headers=h["alice"],
                   json={"run_id": "private", "rollouts": rollouts, "final": True})
        assert r.status_code == 200, r.text
        mine = c.get("/dashboard/data", headers=h["alice"], params={"run": "private"}).json()
        assert [s["step"] for s in mine["steps"]] == [0, 1, 2] and mine["alerts"] == []
        assert c.get("/dashboard/data", headers=h["alice"]).json()["run"] == mine["run"]
        seen = c.get("/dashboard/data", headers=h["bob"]).json()
        assert seen["runs"] == [] and seen["steps"] == []
        theirs = c.get("/dashboard/data", headers=h["bob"], params={"run": "private"}).json()
        assert theirs["steps"] == [] and theirs["alerts"] == []
        injected = {"code": "reward_hack_suspected", "step": 0, "detail": "from bob"}
        r = c.post("/v1/monitor/rollouts", headers=h["bob"],
                   json={"run_id": "private", "alerts": [injected]})
        assert r.status_code == 200, r.text
        mine = c.get("/dashboard/data", headers=h["alice"], params={"run": "private"}).json()
        assert mine["alerts"] == [] and len(mine["runs"]) == 1
        # The page cannot send headers: its own ?api_key= goes on to its data requests.
        token = h["alice"]["Authorization"].removeprefix("Bearer ")
        assert c.get("/dashboard/data").status_code == 401
        by_url = c.get("/dashboard/data", params={"run": "private", "api_key": token}).json()
        assert [s["step"] for s in by_url["steps"]] == [0, 1, 2]
        assert "api_key" in c.get("/dashboard").text


@pytest.mark.parametrize("step", ["-1", "100000000000000000000", "abc"])
def test_a_bad_step_header_is_a_400_before_any_scoring(
        tenants: tuple[LiveServer, dict[str, dict[str, str]]], step: str) -> None:
    srv, h = tenants
    body = {"items": [{"task": {"inputs": [[1]], "outputs": [2], "fn_name": "f"},
                       "completion": "def f(x):\n    return x + 1\n"}]}
    r = httpx.post(f"{srv.url}/v1/score", headers={**h["carol"], "X-Sandloop-Step": step},
                   json=body, timeout=60)
    assert r.status_code == 400 and "X-Sandloop-Step" in r.json()["error"], r.text
    r = httpx.post(f"{srv.url}/v1/score", headers=h["carol"], timeout=60,
                   json={**body, "step": 2**63})
    assert r.status_code == 422, r.text
