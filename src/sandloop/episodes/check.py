"""Checking a repository task by running it: the gold patch resolves it, the empty patch does not.

``check_repo_task`` is what ``sandloop tasks validate`` (curation) calls for tasks of kind
``repo``: a task whose gold patch leaves a fail-to-pass test failing or breaks a pass-to-pass
test rewards nobody for the right fix; a task whose fail-to-pass tests already pass without any
change rewards doing nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from sandloop.engine import Engine
from sandloop.episodes.episode import Episode, EpisodeConfig
from sandloop.episodes.grading import Grade
from sandloop.tasks.repo import RepoTask

__all__ = ["RepoProblem", "check_repo_task"]


@dataclass(frozen=True)
class RepoProblem:
    """One finding. ``code``: ``no_gold_patch``, ``gold_patch_does_not_apply``,
    ``gold_fails_fail_to_pass``, ``gold_breaks_pass_to_pass``, ``empty_passes`` (errors: the
    task is unusable); ``fail_to_pass_passes_before`` (warning: that test decides nothing);
    ``sandbox_error`` (the check could not run: retry)."""

    code: str
    message: str
    severity: Literal["error", "warning"] = "error"
    test: str | None = None


async def _grade(engine: Engine, task: RepoTask, patch: str | None) -> tuple[Grade | None, str]:
    ep = Episode(engine, task, EpisodeConfig(max_turns=3))
    await ep.reset()
    try:
        if patch:
            obs = await ep.call("apply_patch", patch=patch)
            if "error" in obs:
                return None, str(obs["error"])
        await ep.call("submit")
        return ep.grade, ""
    finally:
        await ep.close()


async def check_repo_task(engine: Engine, task: RepoTask) -> list[RepoProblem]:
    """Run the task with its gold patch and with no patch; return what is wrong (empty: fine)."""
    problems: list[RepoProblem] = []
    if not task.patch:
        problems.append(RepoProblem("no_gold_patch", f"{task.id}: no gold patch to check "
                                    "against; add 'patch' (a unified diff of the fix)"))
    gold_run = _grade(engine, task, task.patch) if task.patch else None
    empty, gold = await asyncio.gather(_grade(engine, task, None),
                                       gold_run if gold_run is not None else _none())
    for what, (grade, err) in (("empty", empty), ("gold", gold)):
        if what == "gold" and gold_run is None:
            continue
        if grade is None:
            problems.append(RepoProblem("gold_patch_does_not_apply",
                                        f"{task.id}: the gold patch does not apply: {err}"))
            continue
        if grade.verdict == "sandbox_error":
            problems.append(RepoProblem("sandbox_error", f"{task.id}: the {what} run failed in "
                                        f"the infrastructure ({grade.detail}); run the check "
                                        "again"))
            continue
        if what == "gold":
            for t in task.fail_to_pass:
                if grade.tests.get(t) != "passed":
                    problems.append(RepoProblem(
                        "gold_fails_fail_to_pass", f"{task.id}: with the gold patch, "
                        f"fail-to-pass test {t} is {grade.tests.get(t)}", test=t))
            for t in task.pass_to_pass:
                if grade.tests.get(t) != "passed":
                    problems.append(RepoProblem(
                        "gold_breaks_pass_to_pass", f"{task.id}: with the gold patch, "
                        f"pass-to-pass test {t} is {grade.tests.get(t)}", test=t))
        else:
            passing = [t for t in task.fail_to_pass if grade.tests.get(t) == "passed"]
            if len(passing) == len(task.fail_to_pass):
                problems.append(RepoProblem(
                    "empty_passes", f"{task.id}: without any change every fail-to-pass test "
                    "passes: the task rewards doing nothing"))
            else:
                problems.extend(RepoProblem(
                    "fail_to_pass_passes_before", f"{task.id}: fail-to-pass test {t} already "
                    "passes without the fix; move it to pass_to_pass", "warning", t)
                    for t in passing)
    return problems


async def _none() -> tuple[Grade | None, str]:
    return None, ""
