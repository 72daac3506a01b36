"""Sandbox throughput and latency: full isolation vs a bare, unisolated subprocess, in one run.

Prints per-run median and p99 wall time and runs/s at concurrency = cores for
  (a) a trivial Python program, (b) a 30-line solution with 5 asserts, (c) a C program
      (compile + run, isolated only),
each under full isolation (SandboxPool) and as ``subprocess.run([sys.executable, file])``,
and the ratio isolated/bare of the median wall time (target: <= 0.5). The two are measured in
alternating blocks (isolated, bare, isolated, ...), so that the drift of a shared machine's speed
over the run weighs on both sides alike instead of on whichever went second.

    .venv/bin/python benchmarks/bench_sandbox.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

from sandloop import Limits, Program, SandboxPool, Status

TRIVIAL = "pass\n"

SOLUTION = '''\
from collections import Counter


def top_k_frequent(words, k):
    """Return the k most frequent words, ties broken alphabetically."""
    counts = Counter(words)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [w for w, _ in ranked[:k]]


def is_palindrome(s):
    cleaned = [c.lower() for c in s if c.isalnum()]
    return cleaned == cleaned[::-1]


def merge_intervals(intervals):
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


assert top_k_frequent(["a", "b", "a", "c", "b", "a"], 2) == ["a", "b"]
assert is_palindrome("A man, a plan, a canal: Panama")
assert not is_palindrome("sandloop")
assert merge_intervals([[1, 3], [2, 6], [8, 10]]) == [[1, 6], [8, 10]]
assert merge_intervals([]) == []
'''

C_PROGRAM = """\
#include <stdio.h>
int main(void) {
    long s = 0;
    for (int i = 0; i < 1000000; i++) s += i % 7;
    printf("%ld\\n", s);
    return 0;
}
"""


C_STDOUT = "2999997\n"  # sum(i % 7 for i in range(1_000_000))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def measure(n: int, conc: int, one: Callable[[], Awaitable[float]]) -> tuple[list[float], float]:
    lat: list[float] = []
    sem = asyncio.Semaphore(conc)

    async def job() -> None:
        async with sem:
            lat.append(await one())

    t = time.perf_counter()
    await asyncio.gather(*(job() for _ in range(n)))
    return lat, n / (time.perf_counter() - t)


async def interleaved(n: int, conc: int, blocks: int,
                      sides: list[Callable[[], Awaitable[float]]]) -> list[tuple[list[float], float]]:
    """``n`` runs of each side, in ``blocks`` alternating blocks; (latencies, runs/s) per side."""
    lats: list[list[float]] = [[] for _ in sides]
    spent = [0.0 for _ in sides]
    per = max(1, n // blocks)
    for _ in range(blocks):
        for i, one in enumerate(sides):
            t = time.perf_counter()
            lat, _ = await measure(per, conc, one)
            spent[i] += time.perf_counter() - t
            lats[i] += lat
    return [(lat, len(lat) / sec) for lat, sec in zip(lats, spent, strict=True)]


def bare_runner(source: str, tmp: str) -> Callable[[], Awaitable[float]]:
    path = os.path.join(tmp, f"prog{abs(hash(source))}.py")
    with open(path, "w") as f:
        f.write(source)

    async def one() -> float:
        def go() -> float:
            t = time.perf_counter()
            r = subprocess.run([sys.executable, path], capture_output=True)
            assert r.returncode == 0, r.stderr
            return time.perf_counter() - t

        return await asyncio.get_running_loop().run_in_executor(None, go)

    return one


def isolated_runner(pool: SandboxPool, program: Program,
                    stdout: str = "") -> Callable[[], Awaitable[float]]:
    """Times one run, which must succeed and print ``stdout`` (what is timed is the program)."""
    async def one() -> float:
        t = time.perf_counter()
        r = await pool.run(program, Limits(time_s=10))
        assert r.status is Status.OK, (r.status, r.stderr, r.error)
        assert r.stdout == stdout, (r.stdout[:200], r.stderr[-500:])
        return time.perf_counter() - t

    return one


def row(name: str, lat: list[float], rps: float) -> str:
    return (f"{name:<34} median {statistics.median(lat) * 1000:7.2f} ms   "
            f"p99 {pct(lat, 0.99) * 1000:7.2f} ms   {rps:7.1f} runs/s")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    n = args.runs
    print(f"sandloop sandbox benchmark: {n} runs each, concurrency = {cores} (cores)\n")
    async with SandboxPool(int(os.environ.get("BENCH_SLOTS", cores))) as pool:
        with tempfile.TemporaryDirectory() as tmp:
            ratios = {}
            for label, src in (("trivial", TRIVIAL), ("30-line solution + 5 asserts", SOLUTION)):
                prog = Program(language="python", source=src)
                await measure(10, cores, isolated_runner(pool, prog))  # warm-up
                await measure(5, cores, bare_runner(src, tmp))
                (lat_i, rps_i), (lat_b, rps_b) = await interleaved(
                    n, cores, 10, [isolated_runner(pool, prog), bare_runner(src, tmp)])
                # Both sides ran as many programs as the figures below are of.
                assert len(lat_i) == len(lat_b) == max(1, n // 10) * 10, (len(lat_i), len(lat_b))
                print(f"({label})")
                print("  " + row("full isolation (sandloop)", lat_i, rps_i))
                print("  " + row("bare subprocess.run, no isolation", lat_b, rps_b))
                ratio = statistics.median(lat_i) / statistics.median(lat_b)
                ratios[label] = ratio
                print(f"  ratio isolated/bare median wall: {ratio:.2f}  "
                      f"(target <= 0.50)   throughput x{rps_i / rps_b:.2f}\n")
            cprog = Program(language="c", source=C_PROGRAM)
            n_c = max(10, n // 10)
            lat_c, rps_c = await measure(n_c, cores, isolated_runner(pool, cprog, C_STDOUT))
            assert len(lat_c) == n_c, len(lat_c)
            print("(C program, compile + run, full isolation)")
            print("  " + row("gcc -O2 + run (sandloop)", lat_c, rps_c))


if __name__ == "__main__":
    asyncio.run(main())
