"""Episode benchmark: reset time, many live episodes, memory per idle episode.

All figures come from one run, real sandboxes, on this machine's cores:
  1. reset: a 1,000-file repository task (no set-up), episodes reset one after another: p50/p99
     of ``Episode.reset_s`` (open a session + copy the prepared snapshot in; target p50 <= 50 ms).
  2. live: N episodes (default 128) reset and kept open at once; each then acts like a model —
     a ``read_file`` or ``write_file`` call, then "thinking" 0.5-1.5 s (the model's generation),
     for R rounds. Reports p50/p99 latency of those calls (target p99 <= 200 ms) and calls/s.
     The same calls back to back with no think time are reported as saturation throughput.
     Then each episode writes, runs a command, and reads its output (think time between): the
     read after a run must ask the work dir (a jailed step), and the run flushes the write.
  3. memory: what the N idle episodes hold: the supervisor's RSS growth and the host's tmpfs
     growth (their files), per episode.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_episodes.py [--quick] [--episodes N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time

from sandloop.engine import Engine
from sandloop.episodes import Episode, EpisodeConfig
from sandloop.tasks.repo import RepoLimits, RepoTask

CORES = os.cpu_count() or 1


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def repo_task(files: int) -> RepoTask:
    content = {f"pkg/mod{i // 50}/m{i}.py": f"def f{i}(x):\n    return x + {i}\n" * 4
               for i in range(files - 1)}
    content["tests/test_pkg.py"] = "def test_ok():\n    assert True\n"
    return RepoTask(id=f"bench-{files}", problem_statement="benchmark repository", files=content,
                    fail_to_pass=("tests/test_pkg.py::test_ok",),
                    limits=RepoLimits(workdir_mb=32, workdir_inodes=4096))


def meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def bench_reset(engine: Engine, task: RepoTask, n: int) -> None:
    times = []
    for _ in range(n):
        ep = Episode(engine, task, EpisodeConfig(workdir_mb=32))
        await ep.reset()
        assert ep.reset_s is not None
        times.append(ep.reset_s)
        # The repository is in the work dir (a reset that fails fast is no reset): asked of
        # the work dir itself, not of the episode's view of the files.
        obs = await ep.call("run", command="find . -type f | wc -l; head -c 11 tests/test_pkg.py")
        assert obs.get("stdout") == f"{len(task.files)}\ndef test_ok", obs
        await ep.close()
    pool = getattr(engine.backend, "pool", None)
    # The pool that served them: the task's environment has its own (bases are per slot).
    bases = pool.workspace_bases() if pool is not None else {}
    used = [(cow, n) for cow, n in bases.values() if cow is not None]
    assert pool is None or len(used) == 1, bases
    how = f"copy-on-write: {used[0][0]}, {used[0][1]} base(s) written" if used else ""
    # The first reset also starts the environment's pool and writes each slot's base once.
    cold, warm = times[0], times[1:]
    print(f"reset ({len(task.files)} files, {n} episodes): p50 {pct(warm, 50) * 1e3:.1f} ms, "
          f"p99 {pct(warm, 99) * 1e3:.1f} ms, first {cold * 1e3:.0f} ms  "
          f"(target p50 <= 50 ms; {how})")


async def bench_live(engine: Engine, task: RepoTask, n: int, rounds: int) -> None:
    rss0, shm0 = rss(), meminfo("Shmem")
    eps = [Episode(engine, task, EpisodeConfig(workdir_mb=32, max_turns=10_000))
           for _ in range(n)]
    t0 = time.perf_counter()
    await asyncio.gather(*(ep.reset() for ep in eps))
    opened = time.perf_counter() - t0
    rss1, shm1 = rss(), meminfo("Shmem")
    print(f"live: {n} episodes reset at once in {opened:.1f} s; idle memory per episode: "
          f"supervisor RSS {(rss1 - rss0) / n / 1024:.0f} KiB, files (tmpfs) "
          f"{(shm1 - shm0) / n / 1024:.0f} KiB")
    assert all(ep.reset_s is not None for ep in eps)
    lat: list[float] = []

    async def act(ep: Episode, think: bool) -> None:
        rnd = random.Random(ep.id)
        for r in range(rounds):
            if think:
                await asyncio.sleep(rnd.uniform(0.5, 1.5))
            i = rnd.randrange(999)
            path = f"pkg/mod{i // 50}/m{i}.py"
            t = time.perf_counter()
            if r % 2:
                obs = await ep.call("write_file", path="notes.txt", content=f"round {r}\n" * 20)
                ok = obs.get("ok") is True
            else:
                obs = await ep.call("read_file", path=path)
                ok = obs.get("content", "").startswith(f"def f{i}(x):")
            lat.append(time.perf_counter() - t)
            assert ok, obs  # a timed call did its work (an error observation is fast)

    t0 = time.perf_counter()
    await asyncio.gather(*(act(ep, True) for ep in eps))
    wall = time.perf_counter() - t0
    assert len(lat) == n * rounds, len(lat)
    print(f"live, paced (think 0.5-1.5 s): {len(lat)} read_file/write_file calls over {n} "
          f"episodes: p50 {pct(lat, 50) * 1e3:.0f} ms, p99 {pct(lat, 99) * 1e3:.0f} ms, "
          f"{len(lat) / wall:.0f} calls/s  (target p99 <= 200 ms)")
    lat.clear()
    t0 = time.perf_counter()
    await asyncio.gather(*(act(ep, False) for ep in eps))
    wall = time.perf_counter() - t0
    assert len(lat) == n * rounds, len(lat)
    print(f"live, saturated (no think time): {len(lat) / wall:.0f} calls/s, p50 "
          f"{statistics.median(lat) * 1e3:.0f} ms, p99 {pct(lat, 99) * 1e3:.0f} ms")
    per_tool: dict[str, list[float]] = {"write_file": [], "run": [], "read_file": []}

    async def with_runs(ep: Episode) -> None:
        rnd = random.Random(ep.id + "runs")
        for r in range(max(1, rounds // 2)):
            for tool, args in (("write_file", {"path": "notes.txt", "content": f"{r}\n"}),
                               ("run", {"command": "cat notes.txt >> log.txt"}),
                               ("read_file", {"path": "log.txt"})):
                await asyncio.sleep(rnd.uniform(0.5, 1.5))
                t = time.perf_counter()
                obs = await ep.call(tool, args)
                per_tool[tool].append(time.perf_counter() - t)
                assert "error" not in obs and obs.get("exit_code", 0) == 0, (tool, obs)
                if tool == "read_file":  # it saw the run's append: one line per round so far
                    assert obs["content"].splitlines()[-1] == str(r), obs

    await asyncio.gather(*(with_runs(ep) for ep in eps))
    assert all(len(v) == n * max(1, rounds // 2) for v in per_tool.values()), \
        {k: len(v) for k, v in per_tool.items()}
    print("live, paced, each read after a run (it must ask the work dir): " + ", ".join(
        f"{k} p50 {pct(v, 50) * 1e3:.0f} ms p99 {pct(v, 99) * 1e3:.0f} ms"
        for k, v in per_tool.items()))
    await asyncio.gather(*(ep.close() for ep in eps))


async def main(quick: bool, episodes: int) -> None:
    task = repo_task(1000)
    async with Engine() as engine:
        print(f"{CORES} cores, {engine.backend.slots} slots")
        await bench_reset(engine, task, 10 if quick else 40)
        await bench_live(engine, task, episodes, 4 if quick else 10)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer resets and rounds")
    ap.add_argument("--episodes", type=int, default=128, help="live episodes at once")
    a = ap.parse_args()
    asyncio.run(main(a.quick, a.episodes))
