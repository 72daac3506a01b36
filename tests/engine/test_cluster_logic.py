"""ClusterBackend's logic over in-process scripted nodes (no Ray, no sandboxes): placement,
fragmentation, capacity following joins and leaves, node loss as an infrastructure failure
retried elsewhere (faults injected by ScriptedNodes.kill), pinned sessions, refused nodes."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from sandloop import Limits, Program
from sandloop.engine import Engine, SessionLost
from sandloop.engine.cluster import (
    ClusterBackend,
    ClusterUnavailable,
    NodeInfo,
    _Node,
    choose_node,
    fragmentation,
)
from sandloop.engine.scheduling import ResourceTooLarge
from sandloop.engine.testing import ScriptedNodes
from sandloop.sandbox.models import ExecResult, Status


def _node(nid: str, slots: int, memory_mb: int, used_slots: int = 0, used_mb: int = 0) -> _Node:
    n = _Node(NodeInfo(nid, "127.0.0.1", slots / 2, memory_mb, slots), client=None)  # type: ignore[arg-type]
    n.free_slots -= used_slots
    n.free_memory_mb -= used_mb
    return n


def test_placement_takes_the_node_left_least_loaded_by_its_dominant_resource() -> None:
    a = _node("a", 4, 8000, used_slots=2)  # half the slots used
    b = _node("b", 4, 8000, used_slots=1, used_mb=6000)  # memory nearly full
    c = _node("c", 4, 8000, used_slots=3)
    assert choose_node([a, b, c], 1000) is a
    # Nothing fits a job larger than any node's free memory; a full node is skipped.
    assert choose_node([a, b, c], 9000) is None
    assert choose_node([_node("d", 2, 8000, used_slots=2)], 100) is None


def test_fragmentation_is_the_share_of_free_memory_stranded_on_nodes_without_slots() -> None:
    assert fragmentation([(2, 4000), (2, 0)]) == 0.0
    assert fragmentation([(1, 1000), (1, 1000), (1, 1000), (1, 1000)]) == 0.0
    assert fragmentation([(0, 3000), (1, 1000)]) == pytest.approx(0.75)  # 3000 stranded
    assert fragmentation([]) == 0.0


def _sleep_script(s: float):  # type: ignore[no-untyped-def]
    async def run(program: Program, limits: Limits) -> ExecResult:
        await asyncio.sleep(s)
        return ExecResult(status=Status.OK, stdout=program.source)
    return run


async def test_a_killed_node_fault_injected_is_retried_elsewhere_exactly_once() -> None:
    calls: Counter[str] = Counter()  # runs started, per program

    async def run(program: Program, limits: Limits) -> ExecResult:
        calls[program.source] += 1
        await asyncio.sleep(0.01)
        return ExecResult(status=Status.OK, stdout=program.source)

    nodes = ScriptedNodes(run, nodes=3)
    backend = ClusterBackend(nodes, refresh_s=0.05, min_nodes=3)
    programs = [Program(source=str(i)) for i in range(300)]
    seen: list[int] = []
    lost_in_flight = 0
    async with Engine(backend) as eng:
        async for i, r in eng.stream(programs):
            seen.append(i)
            assert r.status is Status.OK and r.stdout == str(i)
            if len(seen) == 50:
                lost_in_flight = sum(not t.done() for t in nodes.nodes["node0002"].inflight)
                nodes.kill("node0002")
        stats = eng.snapshot()
    assert sorted(seen) == list(range(300))  # one result per job, none lost, none twice
    assert lost_in_flight > 0  # the kill did catch runs in flight there
    # Each job in flight on the lost node was retried once, elsewhere, and no other job: a
    # program started twice at most (some of the lost calls had not started it yet).
    assert stats.retried == lost_in_flight and stats.infra_failures == 0
    assert len(calls) == 300 and set(calls.values()) <= {1, 2}
    assert list(calls.values()).count(2) <= lost_in_flight
    assert backend.lost_nodes == 1


async def test_a_node_that_never_answers_a_run_is_lost_and_the_run_retried_elsewhere() -> None:
    # A stopped node (SIGSTOP, a wedged event loop; fault injected by ScriptedNodes.freeze)
    # neither dies nor answers: without the run deadline the job, and the trainer waiting on
    # it, would wait for ever.
    nodes = ScriptedNodes(_sleep_script(0.0), nodes=2)
    backend = ClusterBackend(nodes, refresh_s=0.05, min_nodes=2, run_grace_s=0.3)
    assert backend.run_deadline_s(Program(source="x"), Limits(time_s=0.1)) == pytest.approx(0.5)
    assert backend.run_deadline_s(Program(language="c", source="x"), Limits(time_s=1)) == \
        pytest.approx(2 * (1 + Limits(time_s=1).compile_time_limit_s) + 0.3)
    async with Engine(backend) as eng:
        nodes.freeze("node0001")
        results = await asyncio.wait_for(asyncio.gather(
            *(eng.run(Program(source=str(i)), Limits(time_s=0.1)) for i in range(4))), 20)
        stats = eng.snapshot()
    assert [r.stdout for r in results] == ["0", "1", "2", "3"]
    assert all(r.status is Status.OK for r in results)
    assert backend.lost_nodes == 1 and stats.retried >= 1 and stats.infra_failures == 0


async def test_admission_follows_nodes_that_join_and_leave() -> None:
    nodes = ScriptedNodes(nodes=1, cpus=2, memory_mb=4000)
    backend = ClusterBackend(nodes, refresh_s=0.02)
    async with Engine(backend) as eng:
        adm = eng._admission
        assert adm is not None and (adm.slots, adm.memory_mb) == (4, 4000)
        nid = nodes.add(cpus=4, memory_mb=16000)
        for _ in range(200):
            if adm.slots == 12:
                break
            await asyncio.sleep(0.01)
        assert (adm.slots, adm.memory_mb, adm.cpus, adm.job_memory_mb) == (12, 20000, 6, 16000)
        assert adm.reserve_slots == 1  # eval's reserve slot appears once there are 4+ slots
        r = await eng.run(Program(source="x"), Limits(memory_mb=8000))  # fits the new node only
        assert r.status is Status.OK
        nodes.kill(nid)
        for _ in range(200):
            if adm.slots == 4:
                break
            await asyncio.sleep(0.01)
        assert adm.slots == 4 and adm.free_slots == 4
        with pytest.raises(ResourceTooLarge):  # no node is that large any more
            await eng.run(Program(source="x"), Limits(memory_mb=8000))


async def test_a_session_is_pinned_to_its_node_and_lost_with_it() -> None:
    nodes = ScriptedNodes(nodes=2)
    async with Engine(ClusterBackend(nodes, refresh_s=0.05, min_nodes=2)) as eng:
        s = await eng.open_session()
        await s.write_files({"a.txt": "1"})
        assert (await s.run_program(Program(source="x"))).status is Status.OK
        nodes.kill(s.workspace.node_id)
        with pytest.raises(SessionLost, match="left the cluster"):
            await s.run_program(Program(source="x"))
        assert (await eng.run(Program(source="y"))).stdout == ""  # other nodes carry on


async def test_a_session_opened_with_files_on_a_node_starts_from_them() -> None:
    # Nodes share no copy-on-write bases: the files are copied into the node's workspace.
    nodes = ScriptedNodes(nodes=2)
    async with Engine(ClusterBackend(nodes, refresh_s=0.05, min_nodes=2)) as eng:
        files = {"README.md": b"hello\n", "pkg/a.py": b"X = 1\n"}
        async with eng.session(files=files) as s:
            assert await s.read_files(list(files)) == files


async def test_a_node_that_cannot_isolate_gets_no_work() -> None:
    nodes = ScriptedNodes(nodes=0)
    bad = nodes.add(isolation="unavailable")
    good = nodes.add()
    backend = ClusterBackend(nodes, refresh_s=0.02)
    async with Engine(backend) as eng:
        await asyncio.gather(*(eng.run(Program(source=str(i))) for i in range(20)))
        status = {s.node_id: s for s in backend.status()}
    assert status[bad].state == "refused" and "isolate" in status[bad].reason
    assert status[good].runs == 20 and nodes.nodes[bad].backend.calls == 0


async def test_no_node_offering_sandloop_is_a_clear_error() -> None:
    backend = ClusterBackend(ScriptedNodes(nodes=0), refresh_s=0.02, start_timeout_s=0.1)
    with pytest.raises(ClusterUnavailable, match="sandloop"):
        async with Engine(backend):
            pass


async def test_metrics_show_per_node_slots_runs_and_fragmentation() -> None:
    from sandloop.server.observability import _EngineCollector

    nodes = ScriptedNodes(nodes=2)
    async with Engine(ClusterBackend(nodes, refresh_s=0.05, min_nodes=2)) as eng:
        await asyncio.gather(*(eng.run(Program(source=str(i))) for i in range(10)))
        metrics = {m.name: m for m in _EngineCollector(lambda: eng).collect()}
    runs = metrics["sandloop_cluster_node_runs"].samples
    assert sorted(s.labels["node"] for s in runs) == ["node0001", "node0002"]
    assert sum(s.value for s in runs) == 10
    assert {s.value for s in metrics["sandloop_cluster_node_slots"].samples} == {2.0}
    assert metrics["sandloop_cluster_fragmentation"].samples[0].value == 0.0
    ready = [s for s in metrics["sandloop_cluster_nodes"].samples if s.labels["state"] == "ready"]
    assert ready[0].value == 2


def test_ray_driver_messages_printed_during_a_ray_command_go_to_stderr(
        capsys: pytest.CaptureFixture[str]) -> None:
    from sandloop.cli.cluster import results_stdout

    with results_stdout(True) as out:
        # What Ray's driver does with cluster events ("node ... marked dead"): print().
        print("(raylet) The node with node id: ... has been marked dead")
        out.write('{"status": "ok"}\n')
    with results_stdout(False) as out:
        out.write('{"status": "ok"}\n')
    got = capsys.readouterr()
    assert got.out == '{"status": "ok"}\n' * 2
    assert "marked dead" in got.err


async def test_a_drained_node_finishes_its_runs_and_gets_no_new_ones() -> None:
    nodes = ScriptedNodes(_sleep_script(0.02), nodes=3)
    backend = ClusterBackend(nodes, refresh_s=0.02, min_nodes=3)
    drained = nodes.nodes["node0001"].backend
    calls_at_drain = 0
    seen = 0
    async with Engine(backend) as eng:
        async for i, r in eng.stream([Program(source=str(i)) for i in range(300)]):
            assert r.status is Status.OK and r.stdout == str(i)
            seen += 1
            if seen == 40:
                nodes.drain("node0001")
                calls_at_drain = drained.calls
        stats = eng.snapshot()
        status = {s.node_id: s for s in backend.status()}
    assert seen == 300 and stats.retried == 0  # nothing lost: in-flight runs finished there
    # Only what was already placed (at most its 2 slots, plus one refresh's worth) ran there.
    assert drained.calls <= calls_at_drain + 2 * 2
    assert "node0001" not in status or status["node0001"].state in ("lost", "retiring")
    assert drained.closed  # its pool closed once its last run was done


def test_admission_resized_below_what_runs_admits_nothing_until_runs_end() -> None:
    from dataclasses import dataclass

    from sandloop.engine.scheduling import Admission

    @dataclass
    class Job:
        memory_mb: int = 100
        cpus: float = 1.0
        priority: int = 0

    adm = Admission(4, 1000, 4.0)
    running = [Job() for _ in range(3)]
    for j in running:
        adm.acquire(j)
    adm.resize(2, 500, 2.0, job_memory_mb=500, job_cpus=2.0)  # a node left mid-run
    assert (adm.free_slots, adm.free_memory_mb, adm.free_cpus) == (-1, 200, -1.0)
    assert not adm.fits(Job())
    for j in running[:2]:
        adm.release(j)
    assert adm.free_slots == 1 and adm.fits(Job())
    with pytest.raises(ResourceTooLarge):
        adm.check(Job(memory_mb=600))  # larger than any node now


async def test_an_episode_on_a_lost_node_ends_with_a_sandbox_error_verdict() -> None:
    from sandloop.episodes import episode
    from sandloop.tasks.repo import load_repo_tasks

    task = next(t for t in load_repo_tasks("repo-demo") if t.setup is None)
    nodes = ScriptedNodes(nodes=2)
    async with Engine(ClusterBackend(nodes, refresh_s=0.05, min_nodes=2)) as eng:
        async with episode(eng, task) as ep:
            assert "error" not in await ep.call("run", command="ls")
            assert ep._session is not None
            nodes.kill(ep._session.workspace.node_id)  # the node holding its files
            obs = await ep.call("run", command="ls")
            # Not a wrong answer (reward 0) and not the caller's exception: a verdict saying
            # the infrastructure failed, with no reward (left out of training).
            assert obs["ended_by"] == "lost" and obs["verdict"] == "sandbox_error", obs
            assert "left the cluster" in obs["error"]
            assert ep.done and ep.reward is None and ep.verdict == "sandbox_error"
        # The engine goes on over the node that is left.
        assert (await eng.run(Program(source="y"))).status is Status.OK
