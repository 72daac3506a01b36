"""Rollouts from scored completions: what the server, the trainer adapters and ``sandloop
score --step`` record about each completion they score with a training step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sandloop.monitor.records import Rollout
from sandloop.reward.verifier import CompletionResult

__all__ = ["rollouts_of"]


def rollouts_of(results: Sequence[CompletionResult], completions: Sequence[str], *, step: int,
                groups: Sequence[str | None] | None = None, run_id: str | None = None,
                tasks: Mapping[str, Any] | None = None) -> list[Rollout]:
    """One rollout per result (same order as ``completions`` and ``groups``).

    A group of None leaves the rollout's group to its task id; ``tasks`` (id -> Task) supplies
    each task's difficulty and data source when known.
    """
    if step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step}")
    gs = groups if groups is not None else [None] * len(results)
    out = []
    for res, text, group in zip(results, completions, gs, strict=True):
        task = (tasks or {}).get(res.task_id)
        out.append(Rollout(
            step=step, task_id=res.task_id, completion=text, reward=res.reward,
            group=group, verdict=res.verdict.value, public_passed=res.public.passed,
            public_total=res.public.total, hidden_passed=res.hidden.passed,
            hidden_total=res.hidden.total, wall_time_s=res.timings.get("total_s"),
            run_id=run_id, completion_id=res.completion_id,
            difficulty=getattr(task, "difficulty", None),
            source=getattr(task, "source", None)))
    return out
