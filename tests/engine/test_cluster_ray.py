"""The engine on a real local Ray cluster (3 Ray nodes on this host): same results as the local
engine, node loss mid-batch loses and duplicates nothing, a node that joins gets work, sessions
pinned to a node end with SessionLost when it goes, a driver restart resumes from the journal,
and `sandloop exec-batch --ray` prints exactly what the local path prints.

Skipped when the optional `ray` package is absent (pip install 'sandloop[ray]').
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandloop import Limits, Program
from sandloop.engine import Engine, SessionLost

# Ray resolves 127.0.0.1 to the host's public address unless told the cluster is on one host;
# it reads this when first imported, so before the import below (the cluster stays on loopback).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
pytest.importorskip("ray", reason="the Ray tests need: pip install 'sandloop[ray]'")

from ray_cluster import LocalRayCluster

pytestmark = pytest.mark.timeout(600)

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    c = LocalRayCluster(nodes=3)
    try:
        yield c
    finally:
        c.shutdown()


def _mixed(n: int) -> list[Program]:
    """Deterministic programs with different outcomes: output, exit codes, exceptions."""
    out = []
    for i in range(n):
        if i % 10 == 7:
            out.append(Program(source=f"import sys\nprint({i})\nsys.exit(3)"))
        elif i % 10 == 8:
            out.append(Program(source=f"raise ValueError({i})"))
        else:
            out.append(Program(source=f"print({i} * {i})"))
    return out


def _key(r: object) -> tuple[object, ...]:
    return (r.status, r.exit_code, r.stdout, r.stderr.strip().splitlines()[-1:])  # type: ignore[attr-defined]


def _sleepers(n: int, s: float) -> list[Program]:
    return [Program(source=f"import time\ntime.sleep({s})\nprint({i})") for i in range(n)]


async def _same_as_local(eng: Engine, programs: list[Program]) -> list[object]:
    """Run ``programs`` on the cluster (once all three pools are up, so the batch spreads over
    them: min_nodes is 1), check they give the local engine's results, return the nodes'
    status."""
    async with eng:
        for _ in range(100):
            if eng.backend.slots >= 6:  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.2)
        remote = {i: r async for i, r in eng.stream(programs)}
        status = eng.backend.status()  # type: ignore[attr-defined]
    async with Engine(slots=2) as local_eng:
        local = {i: r async for i, r in local_eng.stream(programs)}
    assert sorted(remote) == list(range(len(programs)))
    assert [_key(remote[i]) for i in remote] == [_key(local[i]) for i in remote]
    return status


async def test_thousand_programs_over_three_nodes_match_a_local_run(
        cluster: LocalRayCluster) -> None:
    status = await _same_as_local(Engine(cluster="ray", address=cluster.address),
                                  _mixed(1000))
    spread = [s.runs for s in status]  # type: ignore[attr-defined]
    assert len(spread) == 3 and all(n > 0 for n in spread), spread
    assert all(s.transport == "channel" for s in status)  # type: ignore[attr-defined]


async def test_without_the_channel_every_run_is_a_ray_call_with_the_same_results(
        cluster: LocalRayCluster) -> None:
    from sandloop.engine.ray_backend import RayBackend

    status = await _same_as_local(Engine(RayBackend(cluster.address, channel=False)),
                                  _mixed(60))
    assert status and all(s.transport == "ray" for s in status)  # type: ignore[attr-defined]


async def test_sandloop_exec_batch_with_ray_prints_what_the_local_path_prints(
        cluster: LocalRayCluster, tmp_path: Path) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps({"language": "python", "source": p.source}) + "\n"
                             for p in _mixed(40)))
    cmd = [sys.executable, "-m", "sandloop", "exec-batch", str(batch)]
    ray_run = subprocess.run([*cmd, "--ray", cluster.address], capture_output=True, text=True,
                             timeout=300)
    local_run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert ray_run.returncode == 0, ray_run.stderr[-2000:]
    got = [json.loads(line) for line in ray_run.stdout.splitlines()]  # nothing but JSON lines
    want = [json.loads(line) for line in local_run.stdout.splitlines()]
    assert len(got) == len(want) == 40

    def same(d: dict[str, object]) -> tuple[object, ...]:
        return (d["status"], d["exit_code"], d["stdout"])

    assert [same(d) for d in got] == [same(d) for d in want]


def test_exec_batch_with_ray_streams_only_the_local_json_lines_through_a_node_loss(
        cluster: LocalRayCluster, tmp_path: Path) -> None:
    # Ray's driver prints cluster events ("node ... marked dead") and raylet log tails; none
    # of it may reach stdout, which carries the results only, in input order, each line as
    # soon as it and all before it are done, the same lines as a local run, node loss or not.
    n = 400
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps({"language": "python", "source": p.source,
                                         "limits": {"time_s": 10}}) + "\n"
                             for p in _sleepers(n, 0.05)))
    cmd = [sys.executable, "-m", "sandloop", "exec-batch", str(batch)]
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen([*cmd, "--ray", cluster.address], stdout=subprocess.PIPE,
                                stderr=err, text=True)
        assert proc.stdout is not None
        got: list[str] = []
        killed = False
        try:
            for line in proc.stdout:
                got.append(line)
                if len(got) == 30:
                    assert proc.poll() is None  # streamed: lines came while it still ran
                    cluster.kill(next(iter(cluster.nodes)))
                    killed = True
            assert proc.wait(300) == 0, (tmp_path / "stderr.txt").read_text()[-2000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    cluster.add()  # back to three nodes for the next tests
    assert killed
    local = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    want = [json.loads(line) for line in local.stdout.splitlines()]
    rows = [json.loads(line) for line in got]  # every stdout line is a result's JSON
    assert len(rows) == len(want) == n

    def same(d: dict[str, object]) -> tuple[object, ...]:
        return (d["status"], d["exit_code"], d["stdout"])

    assert [same(d) for d in rows] == [same(d) for d in want]
    assert [d["stdout"] for d in rows] == [f"{i}\n" for i in range(n)]


async def test_a_node_killed_mid_batch_loses_and_duplicates_nothing(
        cluster: LocalRayCluster) -> None:
    n = 300
    async with Engine(cluster="ray", address=cluster.address) as eng:
        backend = eng.backend
        while backend.slots < 6:  # type: ignore[attr-defined]
            await asyncio.sleep(0.2)
        seen: list[int] = []
        results = {}
        killed = ""
        async for i, r in eng.stream(_sleepers(n, 0.05), Limits(time_s=10)):
            seen.append(i)
            results[i] = r
            if len(seen) == 60:
                busy = max(backend.status(), key=lambda s: s.running)  # type: ignore[attr-defined]
                assert busy.running > 0
                killed = busy.node_id
                await asyncio.to_thread(cluster.kill, killed)
        stats = eng.snapshot()
        status = {s.node_id: s for s in backend.status()}  # type: ignore[attr-defined]
    cluster.add()  # back to three nodes for the next tests
    assert sorted(seen) == list(range(n))  # each job exactly one result
    assert all(results[i].status == "ok" and results[i].stdout == f"{i}\n" for i in range(n))
    assert backend.lost_nodes == 1 and status[killed].state == "lost"  # type: ignore[attr-defined]
    assert stats.retried >= 1 and stats.infra_failures == 0


async def test_a_node_that_joins_mid_batch_gets_work(cluster: LocalRayCluster) -> None:
    async with Engine(cluster="ray", address=cluster.address) as eng:
        backend = eng.backend
        while backend.slots < 6:  # type: ignore[attr-defined]
            await asyncio.sleep(0.2)
        added = ""
        t_added = 0.0
        first_run_s = None
        done = 0
        async for _i, _r in eng.stream(_sleepers(800, 0.05), Limits(time_s=10)):
            done += 1
            if done == 60:
                # Blocks the loop for the node's start (Ray sets signal handlers: main thread
                # only); runs in flight carry on on the nodes meanwhile.
                added = cluster.add()
                t_added = time.monotonic()
            if added and first_run_s is None:
                st = {s.node_id: s for s in backend.status()}  # type: ignore[attr-defined]
                if added in st and st[added].runs > 0:
                    first_run_s = time.monotonic() - t_added
        runs = {s.node_id: s.runs for s in backend.status()}  # type: ignore[attr-defined]
        left = done
    cluster.kill(added)
    assert left == 800
    assert runs.get(added, 0) > 0, runs
    assert first_run_s is not None and first_run_s < 15


async def test_a_session_is_pinned_and_ends_with_session_lost_when_its_node_goes(
        cluster: LocalRayCluster) -> None:
    async with Engine(cluster="ray", address=cluster.address) as eng:
        s = await eng.open_session()
        await s.write_files({"state.txt": "41"})
        r = await s.run_program(Program(source="print(int(open('state.txt').read()) + 1)"))
        assert r.stdout == "42\n"
        node = s.workspace.node_id
        await asyncio.to_thread(cluster.kill, node)
        # The node's orphaned worker may answer a moment longer; once Ray reports the node
        # dead (health checks, ~1.5 s here) the engine has dropped it.
        for _ in range(100):
            st = {x.node_id: x for x in eng.backend.status()}  # type: ignore[attr-defined]
            if st[node].state == "lost":
                break
            await asyncio.sleep(0.2)
        with pytest.raises(SessionLost, match="left the cluster"):
            await s.run_program(Program(source="print(open('state.txt').read())"))
        # Other work goes on, on the other nodes.
        assert (await eng.run(Program(source="print(7)"))).stdout == "7\n"
    cluster.add()


def test_a_driver_restart_resumes_from_the_journal_exactly_once(
        cluster: LocalRayCluster, tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    child = subprocess.Popen(
        [sys.executable, str(HERE / "ray_driver_child.py"), cluster.address, str(journal)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    first: list[int] = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            first.append(int(line.split()[0]))
            if len(first) == 40:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)

    async def resume() -> tuple[dict[str, str], int, int]:
        async with Engine(cluster="ray", address=cluster.address, journal=journal) as eng:
            pending = len(await asyncio.to_thread(eng.journal.pending))  # type: ignore[union-attr]
            got = {k: r.stdout async for k, r in eng.resume()}
            return got, pending, eng.snapshot().executed

    resumed, pending, executed = asyncio.run(resume())
    from sandloop.engine import Journal

    j = Journal(journal)
    try:
        done = {f"job{i}": j.find("default", f"job{i}") for i in range(120)}
    finally:
        j.close()
    assert all(e is not None and e.result is not None for e in done.values())
    assert all(done[f"job{i}"].result.stdout == f"{i}\n" for i in range(120))  # type: ignore[union-attr]
    # Finished before the kill: not run again; unfinished: run once each.
    assert not {f"job{i}" for i in first} & set(resumed)
    assert executed == pending == len(resumed) and len(resumed) + len(first) <= 120


async def test_large_inputs_ship_once_per_node_and_cluster_status_reports_each_pool(
        cluster: LocalRayCluster) -> None:
    from sandloop.cli.cluster import cluster_nodes

    big = "x" * (300 << 10)  # above SHIP_MIN_BYTES: goes through Ray's object store
    prog = Program(source="print(len(open('big.txt').read()))", files={"big.txt": big})
    async with Engine(cluster="ray", address=cluster.address) as eng:
        while eng.backend.slots < 6:  # type: ignore[attr-defined]
            await asyncio.sleep(0.2)
        results = [r async for _, r in eng.stream([prog] * 60)]
        rows = await asyncio.to_thread(cluster_nodes, cluster.address)
    assert all(r.status == "ok" and r.stdout == f"{300 << 10}\n" for r in results)
    pools = [r for r in rows if r["pool"] == "ready"]
    assert len(pools) == 3 and sum(r["runs"] for r in pools) == 60
    # Each node fetched the file once, however many of the 60 runs it took.
    assert all(r["shipped_fetches"] <= 1 for r in pools), pools
    assert all({"slots", "running", "queued", "runs_per_s", "failures"} <= set(r) for r in pools)
    # Each pool serves the direct channel, and nobody failed to present its secret.
    assert all(r["channel"] == "serving" and r["channel_refused"] == 0 for r in pools), pools


def test_sandloop_score_with_ray_gives_the_local_rewards(
        cluster: LocalRayCluster, tmp_path: Path) -> None:
    from sandloop.cli.score import demo_completions_path

    completions = tmp_path / "c.jsonl"
    completions.write_text("".join(demo_completions_path().read_text().splitlines(True)[:30]))
    outs = []
    for extra in (["--ray", cluster.address], []):
        out = tmp_path / f"out{len(outs)}.jsonl"
        run = subprocess.run(
            [sys.executable, "-m", "sandloop", "score", "--tasks", "humaneval", "--completions",
             str(completions), "--no-db", "--json", "--out", str(out), *extra],
            capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        json.loads(run.stdout)  # stdout: the summary object only
        outs.append([(d["completion_id"], d["reward"], d["verdict"])
                     for d in map(json.loads, out.read_text().splitlines())])
    assert outs[0] == outs[1] and len(outs[0]) == 30


def test_sandloop_serve_with_ray_runs_on_the_cluster_and_shows_nodes_on_metrics(
        cluster: LocalRayCluster) -> None:
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandloop", "serve", "--port", str(port), "--ray",
         cluster.address], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        r = httpx.post(f"{url}/v1/run", json={"language": "python", "source": "print(6 * 7)"},
                       timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["stdout"] == "42\n"
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        runs = [ln for ln in metrics.splitlines()
                if ln.startswith("sandloop_cluster_node_runs{")]
        assert runs and sum(float(ln.rsplit(" ", 1)[1]) for ln in runs) >= 1
        assert 'sandloop_cluster_nodes{state="ready"}' in metrics
        channel = [ln for ln in metrics.splitlines()
                   if ln.startswith("sandloop_cluster_node_channel{")]
        assert channel and all(ln.endswith(" 1.0") for ln in channel)  # the fast path
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_sandloop_cluster_status_lists_the_sandloop_nodes(cluster: LocalRayCluster) -> None:
    run = subprocess.run([sys.executable, "-m", "sandloop", "cluster", "status", "--json",
                          cluster.address], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(rows) == 3 and all(r["alive"] and r["cpus"] == 1.0 for r in rows)


def test_an_address_that_would_start_a_private_ray_is_refused() -> None:
    from sandloop.engine.cluster import ClusterUnavailable

    async def go(address: str) -> None:
        async with Engine(cluster="ray", address=address):
            pass

    for address in ("auto", "local", "ray://127.0.0.1:10001"):
        with pytest.raises(ClusterUnavailable, match="never starts a private Ray"):
            asyncio.run(go(address))


async def test_a_drained_node_finishes_its_runs_and_gets_no_new_ones(
        cluster: LocalRayCluster) -> None:
    import ray
    from ray.core.generated import autoscaler_pb2

    async with Engine(cluster="ray", address=cluster.address) as eng:
        backend = eng.backend
        while backend.slots < 6:  # type: ignore[attr-defined]
            await asyncio.sleep(0.2)
        seen: list[int] = []
        drained = ""
        runs_at_drain = 0
        async for i, r in eng.stream(_sleepers(300, 0.05), Limits(time_s=10)):
            assert r.status == "ok" and r.stdout == f"{i}\n"
            seen.append(i)
            if len(seen) == 40:
                busy = max(backend.status(), key=lambda s: s.running)  # type: ignore[attr-defined]
                drained = busy.node_id
                gcs = ray._raylet.GcsClient(address=cluster.address)
                accepted, why = gcs.drain_node(
                    drained, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                    "test: drained mid-batch", 0)
                assert accepted, why
                runs_at_drain = busy.runs + busy.running
        stats = eng.snapshot()
        status = {s.node_id: s for s in backend.status()}  # type: ignore[attr-defined]
    cluster.kill(drained)
    cluster.add()
    assert sorted(seen) == list(range(300))
    assert stats.retried == 0  # its runs in flight finished there: nothing to run again
    # No new work after the next refresh (~1 s: at most a few runs per slot meanwhile).
    assert status[drained].runs <= runs_at_drain + 2 * 20, (status[drained], runs_at_drain)
    assert status[drained].state in ("lost", "retiring")


def test_exec_batch_with_an_unreachable_ray_address_fails_fast_with_a_clear_error(
        tmp_path: Path) -> None:
    batch = tmp_path / "b.jsonl"
    batch.write_text(json.dumps({"language": "python", "source": "print(1)"}) + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "sandloop", "exec-batch", "--ray",
                          f"127.0.0.1:{port}", str(batch)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert "cannot reach a Ray head" in run.stderr and time.monotonic() - t0 < 30


async def test_a_named_environment_is_shipped_to_a_node_that_lacks_it(
        cluster: LocalRayCluster, tmp_path: Path) -> None:
    from sandloop.cli.cluster import cluster_nodes
    from sandloop.envs import EnvStore, parse_spec

    # The driver's build, in the session's store (which the module's three nodes share).
    spec = parse_spec({"name": "shipped-e2e", "python": {},
                       "files": {"data/answer.txt": "42\n"}}, tmp_path)
    info = await asyncio.to_thread(EnvStore().build, spec)
    node_envs = tmp_path / "node-envs"  # a fourth node with a store of its own, empty
    node_envs.mkdir(mode=0o755)
    fourth = cluster.add({"SANDLOOP_ENV_DIR": str(node_envs)})  # main thread: Ray sets signals
    prog = Program(source="print(open('/opt/env/data/answer.txt').read().strip())",
                   environment="shipped-e2e")
    try:
        async with Engine(cluster="ray", address=cluster.address) as eng:
            while eng.backend.slots < 8:  # type: ignore[attr-defined]
                await asyncio.sleep(0.2)
            results = [r async for _, r in eng.stream([prog] * 40, Limits(time_s=20))]
            rows = await asyncio.to_thread(cluster_nodes, cluster.address)
    finally:
        await asyncio.to_thread(cluster.kill, fourth)
    assert all(r.status == "ok" and r.stdout == "42\n" for r in results), results[0]
    assert all(r.environment == info.id for r in results)
    by_node = {r["node_id"]: r for r in rows if r["pool"] == "ready"}
    assert by_node[fourth]["runs"] > 0 and by_node[fourth]["envs_installed"] == 1
    assert all(r["envs_installed"] == 0 for n, r in by_node.items() if n != fourth)  # had it
    assert EnvStore(node_envs).verify(info.id).ok  # the node holds the driver's exact build
