"""CPU time and minor page faults per trivial sandboxed run, of this process tree only.

Counts the supervisor, its zygote and every run (``getrusage`` of this process and its reaped
children, once the pool is closed), so that other jobs on a shared machine do not enter the
figure the way they enter ``/proc/stat``. Kernel workers (the runs' network namespaces freed in
``kworker``s) are not counted. Two pools are measured, one with no runs: the difference divided
by the runs is the per-run cost. For an A/B of two checkouts, interleave them:

    for i in 1 2 3; do for src in /path/to/a/src /path/to/b/src; do
        PYTHONPATH=$src .venv/bin/python benchmarks/bench_run_cpu.py --runs 300; done; done

``SANDLOOP_JAIL=python`` measures the Python steps instead of the C helper.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import time

from sandloop import Limits, Program, SandboxPool, Status


async def _pool(runs: int) -> None:
    async with SandboxPool(1) as pool:
        for _ in range(20 + runs):  # 20 to warm up: the first runs go through the Python loop
            r = await pool.run(Program(source="pass"), Limits(time_s=10))
            assert r.status is Status.OK, (r.status, r.error)


def _measure(runs: int) -> tuple[float, int, float]:
    """(CPU seconds, minor faults, wall seconds) of a fresh process doing ``runs`` runs."""
    out = subprocess.run([sys.executable, __file__, "--child", str(runs)], check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0]), int(out[1]), float(out[2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        start = time.monotonic()
        asyncio.run(_pool(args.child))
        wall = time.monotonic() - start
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        print(s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime, s.ru_minflt + c.ru_minflt, wall)
        return
    cpu0, flt0, _ = _measure(0)
    cpu, flt, wall = _measure(args.runs)
    print(f"per trivial run: {(cpu - cpu0) / args.runs * 1e3:.3f} ms CPU, "
          f"{(flt - flt0) / args.runs:.1f} minor faults ({args.runs} runs, "
          f"{wall / args.runs * 1e3:.2f} ms wall each with start-up)")


if __name__ == "__main__":
    main()
