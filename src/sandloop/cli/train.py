"""``sandloop train``: the closed loop (registered by cli/main.py; needs the ``train`` extra).

torch, transformers and trl are imported only when the command runs, so ``sandloop --help`` and
every other command stay fast and work without the extra.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from sandloop.cli.exits import ExitCode, print_error

__all__ = ["train"]


def train(
    out: Annotated[Path, typer.Option("--out", help="Run directory: config, checkpoints, rollouts.jsonl, metrics.jsonl, eval.json, alerts.jsonl, report.html.")],
    model: Annotated[str, typer.Option("--model", help="'tiny' (built here, SFT on the task set's references) or a local Hugging Face model directory.")] = "tiny",
    steps: Annotated[int, typer.Option("--steps", min=1, help="GRPO steps.")] = 60,
    seed: Annotated[int, typer.Option("--seed", help="Seeds model init, sampling, curriculum.")] = 0,
    tasks: Annotated[str, typer.Option("--tasks", help="'toy' (the bundled curriculum) or a task set (built-in name or JSONL) with train and eval splits.")] = "toy",
    reward: Annotated[str, typer.Option("--reward", help="proper (hidden tests) | weak (exit code 0 only: the hack demonstration).")] = "proper",
    partial_credit: Annotated[bool, typer.Option("--partial-credit", help="Reward the share of tests passed instead of all-or-nothing.")] = False,
    compile_error_reward: Annotated[float, typer.Option("--compile-error-reward", help="Reward of a completion that does not compile (e.g. -0.5).")] = 0.0,
    prompts_per_step: Annotated[int, typer.Option("--prompts-per-step", min=1, help="Tasks per step.")] = 32,
    num_generations: Annotated[int, typer.Option("--num-generations", min=2, help="Completions per task (the GRPO group).")] = 8,
    learning_rate: Annotated[float, typer.Option("--lr", help="GRPO learning rate.")] = 7e-4,
    sft_steps: Annotated[int, typer.Option("--sft-steps", min=0, help="Most warm-up steps of --model tiny.")] = 400,
    sft_target: Annotated[float | None, typer.Option("--sft-target", min=0.0, max=1.0, help="Stop the tiny model's warm-up once it passes this share of a probe of training tasks (checked every 20 steps); --sft-target 1 runs all --sft-steps.")] = 0.15,
    temperature: Annotated[float, typer.Option("--temperature", help="Sampling temperature, in training and eval.")] = 1.5,
    eval_samples: Annotated[int, typer.Option("--eval-samples", min=1, help="Samples per eval task (pass@1 estimate).")] = 4,
    shuffle_rewards: Annotated[bool, typer.Option("--shuffle-rewards", help="Control run: shuffle rewards within each batch.")] = False,
    slots: Annotated[int | None, typer.Option("--slots", help="Sandbox slots; default: cores.")] = None,
    server: Annotated[str | None, typer.Option("--server", help="A running `sandloop serve` (default $SANDLOOP_URL): every step's rollouts go to its /dashboard and /metrics.")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="The run's name on the server's dashboard (default: the --out directory's name).")] = None,
) -> None:
    """Run GRPO with sandloop rewards: execute → reward → update, with curriculum and monitor."""
    if reward not in ("proper", "weak"):
        print_error(f"--reward {reward!r}: choose proper or weak")
        raise typer.Exit(ExitCode.BAD_INPUT)
    try:
        from sandloop.train.loop import TrainConfig, TrainError, run_training
    except ImportError as e:
        print_error(f"sandloop train needs the train extra ({e.name} is missing): "
                    "pip install 'sandloop[train]' (or `make .venv-train`)")
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    cfg = TrainConfig(out=out, model=model, steps=steps, seed=seed, tasks=tasks,
                      reward=reward,  # type: ignore[arg-type]
                      partial_credit=partial_credit, compile_error_reward=compile_error_reward,
                      prompts_per_step=prompts_per_step, num_generations=num_generations,
                      learning_rate=learning_rate, sft_steps=sft_steps, sft_target=sft_target,
                      temperature=temperature,
                      eval_samples=eval_samples, shuffle_rewards=shuffle_rewards, slots=slots,
                      server_url=server or os.environ.get("SANDLOOP_URL") or None,
                      run_id=run_id)
    try:
        summary = run_training(cfg)
    except TrainError as e:
        print_error(e)
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    print(json.dumps(summary))
