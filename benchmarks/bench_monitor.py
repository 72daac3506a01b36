"""Monitor throughput: statistics + detectors over a synthetic run, per-step latency, audit cost.

Targets (DESIGN.md, issue 15): >= 50,000 rollouts/s for the statistics and detectors, <= 100 ms
to analyse one step of 1,024 rollouts, audits <= 10% of the run's own scoring work by default.
The run has a hack starting at a known step; the analysis must alert on it (within 10 steps) and
raise nothing else, and a clean run must raise nothing, before any figure is printed. The
signature cache is cleared before each timed pass, and every completion is unique (a tagged
comment), so the scanner's cache cannot flatter the figures. Times are CPU time of this process
(the analysis is single-threaded), so that other work on a shared host does not count; the
wall-clock rate is printed next to it. Log parsing (JSON lines) is timed
separately: it is I/O format work, not analysis.

    .venv/bin/python benchmarks/bench_monitor.py [--steps 60] [--per-step 1024] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from sandloop.monitor import Monitor, read_log, write_log
from sandloop.monitor import signatures as sig
from sandloop.monitor.audit import AuditSampler
from sandloop.monitor.records import Rollout
from sandloop.monitor.synthetic import synthetic_run


def unique(rs: list[Rollout]) -> list[Rollout]:
    return [replace(r, completion=r.completion + f"# {i}\n") for i, r in enumerate(rs)]


def timed_pass(rs: list[Rollout], clock: Callable[[], float] = time.process_time
               ) -> tuple[float, list[float], Monitor]:
    """(total seconds, per-step seconds, monitor), on ``clock``."""
    sig._cache.clear()
    mon = Monitor()
    per_step: list[float] = []
    t0 = clock()
    step = rs[0].step
    t_step = t0
    for r in rs:
        if r.step != step:  # this rollout completes the previous step: time the whole step
            mon.add(r)
            now = clock()
            per_step.append(now - t_step)
            t_step, step = now, r.step
            continue
        mon.add(r)
    mon.flush()
    end = clock()
    per_step.append(end - t_step)
    return end - t0, per_step, mon


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--per-step", type=int, default=1024)
    ap.add_argument("--hack-from", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    hacked = unique(list(synthetic_run(steps=a.steps, per_step=a.per_step,
                                       hack_from=a.hack_from, seed=1)))
    clean = unique(list(synthetic_run(steps=a.steps, per_step=a.per_step, seed=2)))

    # Correctness first: the figures below are of an analysis that works.
    _, _, mon = timed_pass(hacked)
    codes = [(x.code, x.step) for x in mon.alerts]
    first = next((s for c, s in codes if c == "reward_hack_suspected"), None)
    if first is None or not a.hack_from <= first < a.hack_from + 10 or any(
            s < a.hack_from for _, s in codes):
        print(f"FAIL: hack from step {a.hack_from}, alerts {codes}", file=sys.stderr)
        return 1
    _, _, mon_clean = timed_pass(clean)
    if mon_clean.alerts:
        print(f"FAIL: clean run raised {mon_clean.alerts}", file=sys.stderr)
        return 1

    steps_ms: list[float] = []
    totals, walls, clean_totals = [], [], []
    for _ in range(a.repeat):
        total, per_step, _ = timed_pass(hacked)
        totals.append(total)
        steps_ms.extend(x * 1000 for x in per_step)
        walls.append(timed_pass(hacked, time.perf_counter)[0])
        clean_totals.append(timed_pass(clean)[0])
    n = len(hacked)
    best = min(totals)
    steps_ms.sort()
    p50 = statistics.median(steps_ms)
    p99 = steps_ms[min(len(steps_ms) - 1, int(0.99 * len(steps_ms)))]

    sampler = AuditSampler()
    sampler.add_many(hacked)
    audit = sampler.sample()
    distinct = len({(r.task_id, r.completion) for r in audit})

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "run.jsonl"
        write_log(path, hacked)
        t0 = time.process_time()
        parsed = sum(1 for _ in read_log(path))
        parse_s = time.process_time() - t0
    assert parsed == n == a.steps * a.per_step, (parsed, n)

    print(f"run: {a.steps} steps x {a.per_step} rollouts = {n} rollouts, hack from step "
          f"{a.hack_from}: first alert at step {first} ({codes}); clean run: no alerts")
    print(f"statistics + detectors, hacked run: {n / best:,.0f} rollouts per CPU-second (best of "
          f"{a.repeat}; median {n / statistics.median(totals):,.0f}; wall-clock "
          f"{n / min(walls):,.0f}/s on this host's load); target >= 50,000")
    print(f"statistics + detectors, clean run: {len(clean) / min(clean_totals):,.0f} rollouts "
          f"per CPU-second")
    print(f"per-step analysis at {a.per_step} rollouts/step (CPU time): p50 {p50:.1f} ms, p99 "
          f"{p99:.1f} ms, max {steps_ms[-1]:.1f} ms; target <= 100 ms")
    print(f"audit sample (default share 10%): {len(audit)} completions = "
          f"{len(audit) / n:.1%} of the run's scoring work, {distinct} distinct; target <= 10%")
    print(f"log parsing (JSON lines, validated): {n / parse_s:,.0f} rollouts/s")
    ok = n / best >= 50_000 and p99 <= 100 and len(audit) <= 0.1 * n
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
