"""Validate HumanEval (all nine checks) and print tasks validated per second and mutants run
per second, with no result store (nothing is reused).

Before printing, it checks that the run is what it claims: every task got a report, every
reference-checked task got at least 10 mutants (the mutation testing really ran), the mutant
count printed is the number of mutant runs the reports account for, and a second validation of
a sample against a fresh store recomputes nothing the second time.

    .venv/bin/python benchmarks/bench_tasks.py [--tasks humaneval] [--slots N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from sandloop.curation.validate import ValidationRun, validate_tasks
from sandloop.engine import Engine
from sandloop.store import ResultStore
from sandloop.tasks import Task, load_tasks


async def _validate(tasks: list[Task], slots: int | None, store: ResultStore | None
                    ) -> tuple[ValidationRun, float]:
    async with Engine(slots=slots, max_attempts=1) as engine:
        start = time.perf_counter()
        res = await validate_tasks(tasks, engine.runner(client="bench"), store=store,
                                   concurrency=4 * engine.backend.slots)
        return res, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tasks", default="humaneval")
    ap.add_argument("--slots", type=int, default=None)
    args = ap.parse_args()
    tasks = load_tasks(args.tasks)
    load_before = os.getloadavg()[0]
    cpu0 = os.times()
    res, wall = asyncio.run(_validate(tasks, args.slots, None))
    cpu1 = os.times()

    # -- the run is what it claims -------------------------------------------------------------
    problems: list[str] = []
    if len(res.reports) != len(tasks):
        problems.append(f"{len(res.reports)} reports for {len(tasks)} tasks")
    mutated = [r for r in res.reports if r.mutants]
    few = [r.id for r in mutated if r.mutants < 10]
    if few:
        problems.append(f"fewer than 10 mutants for {few[:5]}")
    if sum(r.mutants for r in res.reports) != res.mutants:
        problems.append(f"reports account for {sum(r.mutants for r in res.reports)} mutants, "
                        f"the run for {res.mutants}")
    if res.cached:
        problems.append(f"{res.cached} results came from a store that should not exist")
    sample = tasks[:8]
    with tempfile.TemporaryDirectory() as tmp, ResultStore(Path(tmp) / "r.db") as store:
        first, _ = asyncio.run(_validate(sample, args.slots, store))
        second, _ = asyncio.run(_validate(sample, args.slots, store))
    if second.runs or second.cached != first.runs:
        problems.append(f"a re-run computed {second.runs} results again")
    if problems:
        sys.exit("benchmark invalid: " + "; ".join(problems))

    codes: dict[str, int] = {}
    for r in res.reports:
        for p in r.problems:
            codes[p.code.value] = codes.get(p.code.value, 0) + 1
    child_cpu = (cpu1.children_user - cpu0.children_user) + (cpu1.children_system -
                                                             cpu0.children_system)
    own_cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    print(f"tasks: {len(tasks)} ({args.tasks}), slots: {args.slots or os.cpu_count()}, "
          f"load average before: {load_before:.1f}, after: {os.getloadavg()[0]:.1f}")
    print(f"validated in {wall:.1f} s: {len(tasks) / wall:.2f} tasks/s")
    print(f"sandbox runs: {res.runs} ({res.runs / wall:.0f} runs/s), of which mutants: "
          f"{res.mutants} ({res.mutants / wall:.0f} mutants/s)")
    print(f"supervisor CPU {own_cpu:.1f} s, reaped children CPU {child_cpu:.1f} s")
    print("verdicts: " + ", ".join(
        f"{v} {sum(r.verdict == v for r in res.reports)}" for v in ("keep", "review", "reject")))
    print("problems: " + (", ".join(f"{c} {n}" for c, n in sorted(codes.items())) or "none"))


if __name__ == "__main__":
    main()
