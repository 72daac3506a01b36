"""Python stdin/stdout tasks: one plain sandbox run per test, or the harness's one run for all.

For tasks of 1 to ``--max-tests`` tests, scores ``--completions`` distinct correct completions
both ways, in alternating rounds, and prints the CPU each path costs per completion: the runs'
own (their cgroups, ``timings.sandbox_cpu_s``) and this process's (the supervisor, verifier and
engine side). ``reward.verifier.PLAIN_STDIO_MAX_TESTS`` (the Verifier's default
``plain_stdio_max_tests``) is about the largest test count for which the plain runs are cheaper;
this benchmark is where that number comes from. Checks first that
every completion passed on both paths.

    .venv/bin/python benchmarks/bench_stdio_paths.py [--completions 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import sandloop.reward.verifier as verifier
from sandloop.reward import Verdict, Verifier
from sandloop.sandbox.pool import SandboxPool
from sandloop.tasks import IOTest, Task, TaskLimits

GOOD = "a, b = map(int, input().split())\nprint(a + b)\n"


def _task(n: int) -> Task:
    tests = [IOTest(name=f"t{i}", stdin=f"{i} {i + 1}\n", expected_stdout=f"{2 * i + 1}\n")
             for i in range(n)]
    return Task(id=f"sum{n}", test_kind="stdio", limits=TaskLimits(time_s=2.0),
                public_tests=tests[:1], hidden_tests=tests[1:])


async def _score(pool: SandboxPool, task: Task, count: int, direct: bool,
                 tag: str) -> tuple[float, float]:
    """(in-sandbox CPU, supervisor-side CPU) per completion, seconds."""
    v = Verifier(pool.run, plain_stdio_max_tests=1 << 30 if direct else 0)
    t0 = time.process_time()
    results = await asyncio.gather(*(v.verify(task, GOOD + f"# {tag} {i}\n")
                                     for i in range(count)))
    outside = time.process_time() - t0
    bad = [r.verdict for r in results if r.verdict is not Verdict.PASSED]
    if bad:
        raise SystemExit(f"benchmark invalid: {len(bad)} completions did not pass ({bad[:3]})")
    inside = sum(r.timings["sandbox_cpu_s"] for r in results)
    return inside / count, outside / count


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--completions", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tests", type=int, default=4)
    args = ap.parse_args()
    async with SandboxPool() as pool:
        await _score(pool, _task(1), 20, True, "warm")
        await _score(pool, _task(1), 20, False, "warm")
        print(f"CPU per completion (ms), median of {args.rounds} alternating rounds of "
              f"{args.completions}: in the sandbox + outside it")
        for n in sorted({1, 2, 4, 8, args.max_tests}):
            rows: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            for r in range(args.rounds):
                for direct in (True, False):
                    rows[direct].append(await _score(pool, _task(n), args.completions, direct,
                                                     f"{r}{direct}"))
            cost = {d: (statistics.median(x for x, _ in v), statistics.median(y for _, y in v))
                    for d, v in rows.items()}
            total = {d: sum(c) for d, c in cost.items()}
            print(f"  {n} test{'s' if n > 1 else ' '}: plain runs {1e3 * cost[True][0]:5.2f} + "
                  f"{1e3 * cost[True][1]:4.2f} = {1e3 * total[True]:5.2f}   harness "
                  f"{1e3 * cost[False][0]:5.2f} + {1e3 * cost[False][1]:4.2f} = "
                  f"{1e3 * total[False]:5.2f}   plain/harness {total[True] / total[False]:.2f}")
    print(f"PLAIN_STDIO_MAX_TESTS is {verifier.PLAIN_STDIO_MAX_TESTS}")


if __name__ == "__main__":
    asyncio.run(main())
