"""Cluster benchmark: the Ray path against the local engine, and a 50-node simulation.

All figures come from one run:
  1. ray-vs-local: trivial isolated Python runs through the local engine (one pool, CORES
     cores) and through a local Ray cluster of CORES nodes x 1 CPU (the same total cores; nodes
     on this host, started by the benchmark), start-up excluded, alternating rounds:
     - wall per run: runs one at a time (each run's own wall, submit to result: the Ray path's
       per-call cost is all in it), median over the runs; target Ray <= 1.3x local;
     - throughput: a batch that keeps every slot busy; target Ray >= 80 % of local.
     Runs take each node's direct channel (engine.channel); --no-channel: a Ray actor call
     each (the path before it, and the one a node falls back to). Needs `pip install 'sandloop[ray]'`; skipped without it.
  2. simulation: 50 FAKE in-process nodes (ScriptedNodes: no Ray, no sandboxes; each run is an
     asyncio sleep) behind the real ClusterBackend and engine, 10,000 slots, 30,000 jobs with
     10,000 in flight at once: dispatch rate (placements + completions per second of the
     driver) and the driver's memory.

    .venv/bin/python benchmarks/bench_cluster.py [--quick] [--no-ray] [--no-channel]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

from sandloop import Limits, Program, Status
from sandloop.engine import Engine
from sandloop.engine.cluster import ClusterBackend
from sandloop.engine.ray_backend import RayBackend
from sandloop.engine.testing import ScriptedBackend, ScriptedNodes
from sandloop.sandbox.models import ExecResult

CORES = os.cpu_count() or 1
# The benchmark's Ray nodes stay on 127.0.0.1 (Ray reads this when first imported).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


async def _batch(engine: Engine, n: int) -> float:
    programs = [Program(source=f"print({i})") for i in range(n)]
    t0 = time.perf_counter()
    ok = 0
    async for i, r in engine.stream(programs, Limits(time_s=10)):
        ok += r.status is Status.OK and r.stdout == f"{i}\n"
    wall = time.perf_counter() - t0
    assert ok == n, f"{n - ok} runs failed"
    return wall


async def _one_at_a_time(engine: Engine, n: int) -> list[float]:
    """Each run's wall, submit to result, with nothing else in flight."""
    walls = []
    for i in range(n):
        t0 = time.perf_counter()
        r = await engine.run(Program(source=f"print({i})"), Limits(time_s=10))
        walls.append(time.perf_counter() - t0)
        assert r.status is Status.OK and r.stdout == f"{i}\n", r
    return walls


async def bench_ray_vs_local(n: int, rounds: int, singles: int, channel: bool) -> None:
    transport = "channel" if channel else "ray"
    print(f"== 1. {n:,} trivial isolated runs: local engine vs Ray cluster, {CORES} cores each, "
          f"{rounds} alternating rounds (medians); runs reach the nodes by: {transport}")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "engine"))
    from ray_cluster import LocalRayCluster  # the tests' cluster: nodes of 1 CPU on 127.0.0.1

    t0 = time.perf_counter()
    cluster = LocalRayCluster(nodes=CORES)
    local_walls: list[float] = []
    ray_walls: list[float] = []
    try:
        async with Engine(slots=2 * CORES, cpus=CORES) as local, \
                Engine(RayBackend(cluster.address, channel=channel)) as eng:
            while eng.backend.slots < 2 * CORES:
                await asyncio.sleep(0.2)
            print(f"   cluster of {CORES} nodes up in {time.perf_counter() - t0:.1f} s")
            await _batch(local, min(200, n))  # warm-up
            await _batch(eng, min(200, n))
            # Alternating, so a change in the machine's load hits both paths alike.
            local_one: list[float] = []
            ray_one: list[float] = []
            for _ in range(rounds):
                local_one += await _one_at_a_time(local, singles)
                ray_one += await _one_at_a_time(eng, singles)
                local_walls.append(await _batch(local, n))
                ray_walls.append(await _batch(eng, n))
            # What the figures claim: the Ray path's runs ran on the cluster's nodes, every
            # one (warm-up, singles, batches), over the transport named above.
            status = eng.backend.status()  # type: ignore[attr-defined]
            ran = sum(s.runs for s in status)
            assert ran == min(200, n) + rounds * (singles + n), (ran, status)
            assert len(status) == CORES and all(s.transport == transport for s in status), status
    finally:
        cluster.shutdown()
    lo, ro = statistics.median(local_one), statistics.median(ray_one)
    print(f"   one at a time ({len(local_one)} runs each, medians): local {lo * 1000:.2f} ms, "
          f"ray {ro * 1000:.2f} ms per run: ray/local wall per run {ro / lo:.2f}x "
          f"(target <= 1.3x); p90 local {_p90(local_one) * 1000:.2f} ms, "
          f"ray {_p90(ray_one) * 1000:.2f} ms")
    lw, rw = statistics.median(local_walls), statistics.median(ray_walls)
    print(f"   local : {lw:6.2f} s  {n / lw:7.1f} runs/s  {lw / n * 1000:6.2f} ms/run  "
          f"(rounds: {', '.join(f'{w:.2f}' for w in local_walls)})")
    print(f"   ray   : {rw:6.2f} s  {n / rw:7.1f} runs/s  {rw / n * 1000:6.2f} ms/run  "
          f"(rounds: {', '.join(f'{w:.2f}' for w in ray_walls)})")
    print(f"   saturated batch: ray throughput {lw / rw * 100:.0f} % of local (target >= 80 %); "
          f"batch wall per run ray/local {rw / lw:.2f}x")


def _p90(xs: list[float]) -> float:
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


async def bench_simulation(nodes: int, jobs: int, slots_per_node: int, run_s: float) -> None:
    print(f"== 2. simulation: {nodes} FAKE nodes x {slots_per_node} slots, {jobs:,} jobs of "
          f"{run_s:.1f} s (asyncio sleep, no sandbox)")
    running = [0, 0]

    async def script(program: Program, limits: Limits) -> ExecResult:
        running[0] += 1
        running[1] = max(running[1], running[0])
        try:
            await asyncio.sleep(run_s)
        finally:
            running[0] -= 1
        return ExecResult(status=Status.OK)

    source = ScriptedNodes(script, nodes=nodes, cpus=slots_per_node, slots_per_cpu=1.0,
                           memory_mb=256 << 10)
    backend = ClusterBackend(source, refresh_s=1.0, min_nodes=nodes)
    prog, lim = Program(source="pass"), Limits(time_s=60)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    async with Engine(backend, max_queued=jobs) as eng:
        gc.collect()
        tracemalloc.start()  # the queued jobs' memory (tracing only while submitting: it is slow)
        t0 = time.perf_counter()
        handles = [eng.submit_nowait(prog, lim) for _ in range(jobs)]
        t_submit = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        t0 = time.perf_counter()
        results = await asyncio.gather(*(h.result() for h in handles))
        wall = time.perf_counter() - t0 + t_submit
        frag = backend.fragmentation()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Every job ran once, each on a slot of its own: the figures below are of that.
    assert len(results) == jobs and all(r.status is Status.OK for r in results)
    assert eng.stats.completed == jobs and eng.stats.retried == 0, eng.stats
    assert 0 < running[1] <= nodes * slots_per_node, running
    # The same jobs through the engine over ONE scripted backend of the same total slots: the
    # engine's and the fake runs' own cost, so the difference is the cluster layer's.
    async with Engine(ScriptedBackend(script, slots=nodes * slots_per_node),
                      cpus=nodes * slots_per_node, memory_mb=1 << 30, max_queued=jobs) as one:
        t0 = time.perf_counter()
        hs = [one.submit_nowait(prog, lim) for _ in range(jobs)]
        one_results = await asyncio.gather(*(h.result() for h in hs))
        one_wall = time.perf_counter() - t0
        assert all(r.status is Status.OK for r in one_results) and one.stats.retried == 0
    assert len(one_results) == jobs
    floor = jobs / (nodes * slots_per_node) * run_s  # waves of runs if dispatch cost nothing
    print(f"   submit {jobs:,} jobs: {t_submit:.2f} s ({jobs / t_submit:,.0f} jobs/s)")
    print(f"   all done in {wall:.2f} s (floor {floor:.2f} s: dispatch overhead "
          f"{wall - floor:.2f} s); {jobs / wall:,.0f} jobs/s end to end; "
          f"peak {running[1]:,} runs in flight")
    print(f"   same jobs, one FAKE backend of {nodes * slots_per_node:,} slots (no cluster layer): "
          f"{one_wall:.2f} s ({jobs / one_wall:,.0f} jobs/s): the cluster layer costs "
          f"{(wall - one_wall) / jobs * 1e6:.0f} us/job")
    print(f"   driver memory: {peak / 2**20:.1f} MiB with all jobs submitted "
          f"({peak / jobs:.0f} B/job), max RSS {rss0 / 1024:.0f} -> {rss1 / 1024:.0f} MiB; "
          f"fragmentation at the end {frag:.2f}")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller batches")
    ap.add_argument("--no-ray", action="store_true", help="only the simulation")
    ap.add_argument("--no-channel", action="store_true",
                    help="runs as Ray actor calls, not over the nodes' direct channels")
    args = ap.parse_args()
    # A shared machine's load skews both paths: say what it was (figures are same-run ratios).
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"{CORES} cores")
    if not args.no_ray:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("== 1. skipped: pip install 'sandloop[ray]'")
        else:
            await bench_ray_vs_local(300 if args.quick else 1000, 2 if args.quick else 3,
                                     50 if args.quick else 100, not args.no_channel)
    await bench_simulation(50, 10_000 if args.quick else 30_000, 200, 1.0)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    asyncio.run(main())
