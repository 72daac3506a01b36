"""``sandloop exec-batch`` of N trivial Python programs under full isolation, beside the same N
programs run bare (``python prog_i.py``, no isolation) from a thread pool, end to end.

Both sides are timed from the outside and include their start-up: the exec-batch side is the wall
of the whole ``python -m sandloop --quiet exec-batch --no-db FILE`` subprocess (imports, slots
warming, every run, the JSONL out); the bare side is the wall of a ``ThreadPoolExecutor(threads)``
running ``subprocess.run([python, prog_i.py])`` for every program. They alternate for ``--rounds``
rounds (exec-batch, bare, exec-batch, ...), so that a burst of load on a shared machine weighs on
both alike, and every round checks its results: exec-batch must exit 0 and print exactly N lines,
each ``"status": "ok"``; every bare run must exit 0. Printed: each round's two walls, then the
median wall, runs/s and the ratio exec-batch / bare (issue 22's target: <= 0.35), the least
ratio of a round, and the CPU of each side's process tree per run (``getrusage`` of the waited-for
children: less noisy than the wall where other jobs share the machine).

sandloop's own modules are compiled to bytecode first (``compileall``), as an installed package
is: with ``PYTHONDONTWRITEBYTECODE=1`` and no ``__pycache__`` (a source checkout here), every
start would compile them again (~0.1 s), and that is not what users run.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_exec_batch.py [--n 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TARGET_RATIO = 0.35
SOURCE = "pass\n"


def compile_sandloop() -> None:
    spec = importlib.util.find_spec("sandloop")
    assert spec is not None and spec.submodule_search_locations, "sandloop is not importable"
    compileall.compile_dir(next(iter(spec.submodule_search_locations)), quiet=1)


def children_cpu() -> float:
    """CPU seconds (user + system) of every waited-for child process so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def exec_batch(batch: Path, n: int, slots: int | None) -> tuple[float, float]:
    """Wall and CPU of one exec-batch subprocess over ``batch``; checks every result is ok."""
    cmd = [sys.executable, "-m", "sandloop", "--quiet", "exec-batch", "--no-db", str(batch)]
    if slots is not None:
        cmd += ["--slots", str(slots)]
    c, t = children_cpu(), time.perf_counter()
    r = subprocess.run(cmd, capture_output=True)
    wall, cpu = time.perf_counter() - t, children_cpu() - c
    assert r.returncode == 0, (r.returncode, r.stderr.decode()[-2000:])
    lines = r.stdout.decode().splitlines()
    assert len(lines) == n, f"exec-batch printed {len(lines)} results for {n} programs"
    bad = [ln for ln in lines if json.loads(ln)["status"] != "ok"]
    assert not bad, f"{len(bad)} results not ok, e.g. {bad[0][:500]}"
    return wall, cpu


def bare(progs: list[Path], threads: int) -> tuple[float, float]:
    """Wall and CPU of running every program bare (``python prog.py``) from ``threads``
    threads."""
    def one(p: Path) -> int:
        return subprocess.run([sys.executable, str(p)], capture_output=True).returncode

    c, t = children_cpu(), time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        codes = list(ex.map(one, progs))
    wall, cpu = time.perf_counter() - t, children_cpu() - c
    assert codes == [0] * len(progs), f"{sum(c != 0 for c in codes)} bare runs failed"
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="programs per side and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="the bare side's thread pool (default: cores)")
    ap.add_argument("--slots", type=int, default=None, help="exec-batch --slots (default: its own)")
    args = ap.parse_args()
    compile_sandloop()
    with tempfile.TemporaryDirectory(prefix="bench-exec-batch-") as tmp:
        d = Path(tmp)
        progs = []
        for i in range(args.n):
            p = d / f"prog_{i}.py"
            p.write_text(SOURCE)
            progs.append(p)
        batch = d / "batch.jsonl"
        batch.write_text("".join(json.dumps({"source": SOURCE}) + "\n" for _ in range(args.n)))
        print(f"exec-batch of {args.n} trivial Python programs (full isolation) vs bare "
              f"`python prog.py` from {args.threads} threads; {args.rounds} alternating rounds, "
              f"start-up included\n")
        walls: list[tuple[float, float]] = []
        cpus: list[tuple[float, float]] = []
        for r in range(args.rounds):
            iso, iso_cpu = exec_batch(batch, args.n, args.slots)
            raw, raw_cpu = bare(progs, args.threads)
            walls.append((iso, raw))
            cpus.append((iso_cpu, raw_cpu))
            print(f"round {r + 1}: exec-batch {iso:6.2f} s (CPU {iso_cpu:5.2f} s)   "
                  f"bare {raw:6.2f} s (CPU {raw_cpu:5.2f} s)   ratio {iso / raw:.3f}")
    iso_m = statistics.median(w[0] for w in walls)
    raw_m = statistics.median(w[1] for w in walls)
    ratio = iso_m / raw_m
    best = min(w[0] / w[1] for w in walls)
    iso_c = statistics.median(c[0] for c in cpus)
    raw_c = statistics.median(c[1] for c in cpus)
    print(f"\n{'':12}{'median wall':>12}{'runs/s':>10}{'CPU per run':>14}")
    print(f"{'exec-batch':12}{iso_m:10.2f} s{args.n / iso_m:10.0f}{1000 * iso_c / args.n:11.2f} ms")
    print(f"{'bare':12}{raw_m:10.2f} s{args.n / raw_m:10.0f}{1000 * raw_c / args.n:11.2f} ms")
    verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
    print(f"\nratio exec-batch / bare (medians): {ratio:.3f} (target <= {TARGET_RATIO}: {verdict});"
          f" best round {best:.3f}; CPU ratio {iso_c / raw_c:.3f} (steadier where the machine is"
          " shared)")


if __name__ == "__main__":
    main()
