"""Episode endpoints over a real server on 127.0.0.1 with real sandboxes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from live import LiveServer

from sandloop.server import ServerConfig
from sandloop.store.episodes import EpisodeLog
from sandloop.tasks.repo import load_repo_tasks

TASK = next(t for t in load_repo_tasks("repo-demo") if t.id == "spanlib-touching-intervals")


@pytest.fixture(scope="module")
def repo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Path]]:
    db = tmp_path_factory.mktemp("ep") / "results.db"
    with LiveServer(ServerConfig(slots=2, task_sets=("repo-demo", "humaneval"), db=db)) as s:
        yield s, db


def test_an_episode_over_http(repo_server: tuple[LiveServer, Path]) -> None:
    server, db = repo_server
    with httpx.Client(base_url=server.url, timeout=120) as c:
        r = c.post("/v1/episodes", json={"task_set": "repo-demo", "task_id": TASK.id,
                                         "max_turns": 10})
        assert r.status_code == 201, r.text
        body = r.json()
        eid = body["episode_id"]
        assert "spanlib/core.py" in body["observation"]["files"]
        assert {t["function"]["name"] for t in body["tools"]} >= {"run_tests", "submit"}

        def call(tool: str, **args: object) -> dict[str, object]:
            r = c.post(f"/v1/episodes/{eid}/call", json={"tool": tool, "arguments": args})
            assert r.status_code == 200, r.text
            return dict(r.json())

        tests = call("run_tests")
        assert not tests["done"] and tests["observation"]["failed"] >= 1  # type: ignore[index]
        assert call("apply_patch", patch=TASK.patch)["observation"]["ok"]  # type: ignore[index]
        ran = call("run", command="echo hi")["observation"]
        assert ran["stdout"] == "hi\n" and ran["exit_code"] == 0  # type: ignore[index]
        final = call("submit")
        assert final["done"] is True
        obs = final["observation"]
        assert obs["reward"] == 1.0 and obs["verdict"] == "resolved"  # type: ignore[index]
        state = c.get(f"/v1/episodes/{eid}").json()
        assert state["done"] and state["turns"] == 4 and state["reward"] == 1.0
        again = c.post(f"/v1/episodes/{eid}/call", json={"tool": "run_tests"})
        assert again.status_code == 409 and again.json()["code"] == "episode_finished"
        assert c.delete(f"/v1/episodes/{eid}").status_code == 200
        gone = c.get(f"/v1/episodes/{eid}")
        assert gone.status_code == 404 and gone.json()["code"] == "episode_not_found"
    rec = EpisodeLog(db).get(eid)  # recorded with --db
    assert rec is not None and rec.reward == 1.0 and [x.tool for x in rec.calls] == [
        "run_tests", "apply_patch", "run", "submit"]


def test_episode_requests_are_checked(repo_server: tuple[LiveServer, Path]) -> None:
    server, _ = repo_server
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.post("/v1/episodes", json={"task_set": "nope", "task_id": "x"}).status_code == 400
        nope = c.post("/v1/episodes", json={"task_set": "repo-demo", "task_id": "nope"})
        assert nope.status_code == 404 and nope.json()["code"] == "task_not_found"
        bad = c.post("/v1/episodes", json={"task_set": "humaneval", "task_id": "HumanEval/0"})
        assert bad.status_code == 400 and "no repository tasks" in bad.json()["error"]
        assert c.post("/v1/episodes/nope/call", json={"tool": "submit"}).status_code == 404


def test_score_without_a_task_set_skips_the_repo_set(
        repo_server: tuple[LiveServer, Path]) -> None:
    # Every served set is merged for a task id without task_set; the repo set is episodes',
    # not scoring's, and used to make every such request fail.
    from sandloop.tasks import load_tasks

    he0 = load_tasks("humaneval")[0]
    server, _ = repo_server
    with httpx.Client(base_url=server.url, timeout=120) as c:
        r = c.post("/v1/score", json={"items": [
            {"task": he0.id, "completion": he0.reference_solution or ""}]})
        assert r.status_code == 200, r.text
        assert r.json()["results"][0]["reward"] == 1.0, r.text
        named = c.post("/v1/score", json={"items": [{"task": TASK.id, "completion": "x"}],
                                          "task_set": "repo-demo"})
        assert named.status_code == 400 and "/v1/episodes" in named.json()["error"], named.text
        unknown = c.post("/v1/score", json={"items": [{"task": TASK.id, "completion": "x"}]})
        assert unknown.status_code == 400, unknown.text  # a repo task id is no scoring task


@pytest.fixture(scope="module")
def quota_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, str]]:
    from sandloop.server import add_key

    keys = tmp_path_factory.mktemp("epkeys") / "keys.json"
    token = add_key(keys, "q", max_runs=4)
    with LiveServer(ServerConfig(slots=2, task_sets=("repo-demo",)), keys_file=keys) as s:
        yield s, token


def test_episode_runs_are_charged_to_the_key(quota_server: tuple[LiveServer, str]) -> None:
    # A key with max_runs 4: the start (its reset) and each run, run_tests and submit count
    # as one run; reading and writing files do not. The fifth running call is a 429.
    server, token = quota_server
    with httpx.Client(base_url=server.url, timeout=120,
                      headers={"Authorization": f"Bearer {token}"}) as c:
        r = c.post("/v1/episodes", json={"task_set": "repo-demo", "task_id": TASK.id})
        assert r.status_code == 201, r.text  # 1
        eid = r.json()["episode_id"]

        def call(tool: str, **args: object) -> httpx.Response:
            return c.post(f"/v1/episodes/{eid}/call", json={"tool": tool, "arguments": args})

        assert call("read_file", path="spanlib/core.py").status_code == 200  # free
        assert call("write_file", path="notes.txt", content="x").status_code == 200  # free
        assert call("run_tests").status_code == 200  # 2
        assert call("run", command="true").status_code == 200  # 3
        assert call("run", command="echo hi").status_code == 200  # 4
        for tool, args in (("run", {"command": "echo over"}), ("run_tests", {}), ("submit", {})):
            over = call(tool, **args)
            assert over.status_code == 429, (tool, over.text)
            assert over.json()["code"] == "quota_exceeded", over.text
        assert call("list_dir").status_code == 200  # reading is still allowed
        again = c.post("/v1/episodes", json={"task_set": "repo-demo", "task_id": TASK.id})
        assert again.status_code == 429 and again.json()["code"] == "quota_exceeded"
        state = c.get(f"/v1/episodes/{eid}").json()
        assert not state["done"] and state["turns"] == 6  # refused calls were no turns
    assert server.state.keys.policies()[0].runs == 4


@pytest.mark.parametrize("flags", [(), ("--no-episode-log",)], ids=["default", "no_log"])
def test_serve_records_episodes_in_the_projects_store_by_default(
        tmp_path: Path, flags: tuple[str, ...]) -> None:
    # `sandloop serve` with no --db still records every episode (in the project's result
    # store, under XDG_CACHE_HOME), and `sandloop episodes list` finds them there unasked.
    import os
    import subprocess
    import sys

    from live import free_port, serve_process, stop_process

    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    port = free_port()
    server = serve_process(port, "--slots", "1", "--task-set", "repo-demo", *flags,
                           cwd=tmp_path, env=env)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
            r = c.post("/v1/episodes", json={"task_set": "repo-demo", "task_id": TASK.id})
            assert r.status_code == 201, r.text
            eid = r.json()["episode_id"]
            r = c.post(f"/v1/episodes/{eid}/call", json={"tool": "submit", "arguments": {}})
            assert r.json()["done"] is True, r.text
    finally:
        stop_process(server)
    listed = subprocess.run([sys.executable, "-m", "sandloop", "episodes", "list"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path,
                            env={**os.environ, **env})
    if flags:
        assert listed.returncode == 2 and "no episodes recorded" in listed.stderr, listed
    else:
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.startswith(f"{eid}\t{TASK.id}\t1 calls\tsubmit\t0.0"), listed.stdout
