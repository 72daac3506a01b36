"""Where a training step's time goes: generation, sandbox (verification), update.

Runs the closed loop (tiny model, toy curriculum) for a few GRPO steps at ``--completions`` per
step and prints the median of each part and the sandbox share of the step; the target is
verification ≤ 10% of the step at 256 completions per step. The first step is left out (warm-up:
slots starting, first compilation of the model's kernels). Needs the train extra:

    OMP_NUM_THREADS=1 .venv-train/bin/python benchmarks/bench_train.py [--completions 256] [--steps 4]

On a CPU the tiny model's generation and update are so cheap that the sandbox share is far above
a GPU run's; the figure that carries over is the sandbox seconds per completion. ``--hidden`` and
``--layers`` make the tiny model wider and deeper (its generation and update dearer, the sandbox's
work the same) to show how the share falls with the model's cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--completions", type=int, default=256, help="per step (8 per task)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--slots", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=128, help="the tiny model's width")
    ap.add_argument("--layers", type=int, default=2, help="the tiny model's depth")
    ap.add_argument("--temperature", type=float, default=None,
                    help="sampling temperature (default: TrainConfig's)")
    args = ap.parse_args()
    from sandloop.train.loop import TrainConfig, run_training

    gens = 8
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        run_training(TrainConfig(out=out, steps=args.steps, seed=0, sft_steps=160,
                                 prompts_per_step=max(1, args.completions // gens),
                                 num_generations=gens, eval_samples=1, eval_limit=4,
                                 save_checkpoints=False, slots=args.slots,
                                 tiny_hidden=args.hidden, tiny_layers=args.layers,
                                 **({} if args.temperature is None
                                    else {"temperature": args.temperature})))
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    per = max(1, args.completions // gens) * gens
    # The steps timed are the steps asked for, each scoring ``per`` completions, none lost to
    # the infrastructure (a failed verification is fast and would flatter the sandbox share).
    steps = sorted({r["step"] for r in rows})
    per_step = {s: sum(r["step"] == s for r in rollouts) for s in steps}
    problems = [f"{len(rows)} metric rows for {args.steps} steps"] if len(rows) != args.steps \
        else []
    problems += [f"step {s}: {c} rollouts, not {per}" for s, c in per_step.items() if c != per]
    problems += [f"step {r['step']}: {r['infra_failures']} infrastructure failures"
                 for r in rows if r["infra_failures"]]
    if problems:
        raise SystemExit("benchmark invalid: " + "; ".join(problems))
    # What the scorer had to run: distinct completions of a step (one run each), and of those
    # the ones no earlier step had scored (the cache answers the rest).
    seen: set[tuple[str, str]] = set()
    runs: dict[int, tuple[int, int]] = {}
    for s in steps:
        distinct = {(r["task_id"], r["completion"]) for r in rollouts if r["step"] == s}
        runs[s] = (len(distinct), len(distinct - seen))
        seen |= distinct
    rows = rows[1:] or rows
    med = {k: statistics.median(r[k] for r in rows)
           for k in ("generation_s", "sandbox_s", "update_s", "step_s")}
    print(f"completions per step: {per}, steps measured: {len(rows)}; tiny model hidden "
          f"{args.hidden}, layers {args.layers}")
    print("  distinct / not seen in an earlier step, per step: "
          + ", ".join(f"{d}/{n}" for d, n in runs.values()))
    for k, v in med.items():
        print(f"  {k:<13} {v:8.3f} s")
    # (A checkout from before the field: every completion ran.)
    runs_med = statistics.median(r.get("sandbox_runs", per) for r in rows)
    print(f"  sandbox runs   {runs_med:8.0f}   (of {per} completions: duplicates and completions "
          "scored in an earlier step are not run again)")
    share = med["sandbox_s"] / med["step_s"]
    print(f"  sandbox share of the step: {share:.1%} (target ≤ 10%)")
    print(f"  sandbox per completion:    {1000 * med['sandbox_s'] / per:.2f} ms "
          f"({1000 * med['sandbox_s'] / max(runs_med, 1):.2f} ms per run)")


if __name__ == "__main__":
    main()
