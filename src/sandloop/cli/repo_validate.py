"""``sandloop tasks validate`` for repository task sets (kind ``repo``): the episodes layer's
``check_repo_task`` (gold patch and empty patch, run), its findings in the curation layer's
problem vocabulary.

Curation and episodes are sibling layers that must not import each other; the command line is
where they meet, so the translation lives here:

| episodes finding | problem code (severity) | why |
|---|---|---|
| ``gold_fails_fail_to_pass``, ``gold_breaks_pass_to_pass``, ``gold_patch_does_not_apply`` | ``reference_fails`` (reject) | the gold patch is the task's reference solution |
| ``empty_passes`` | ``trivial_pass`` (reject) | doing nothing, the degenerate answer, is rewarded |
| ``fail_to_pass_passes_before`` | ``weak_tests`` (review) | that test cannot tell a fix from no fix |
| ``no_gold_patch``, ``sandbox_error`` | ``skipped`` | nothing to check against / run it again |
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from pathlib import Path

from sandloop.curation.problems import Problem, ProblemCode, Severity, TaskReport
from sandloop.curation.validate import ValidationRun
from sandloop.engine import Engine
from sandloop.episodes.check import RepoProblem, check_repo_task
from sandloop.tasks.repo import REPO_BUILTIN_SETS, RepoTask, load_repo_tasks

__all__ = ["REPO_CODES", "is_repo_set", "repo_report", "run_repo_validation",
           "validate_repo_set"]

REPO_CODES: Mapping[str, ProblemCode] = {
    "gold_fails_fail_to_pass": ProblemCode.REFERENCE_FAILS,
    "gold_breaks_pass_to_pass": ProblemCode.REFERENCE_FAILS,
    "gold_patch_does_not_apply": ProblemCode.REFERENCE_FAILS,
    "empty_passes": ProblemCode.TRIVIAL_PASS,
    "fail_to_pass_passes_before": ProblemCode.WEAK_TESTS,
}
SKIPPED = {"no_gold_patch": "gold patch", "sandbox_error": "run"}


def is_repo_set(source: str) -> bool:
    """A built-in repo set, or a JSONL file whose first record is a repo task (``kind: repo``,
    or SWE-bench's ``FAIL_TO_PASS``)."""
    if source in REPO_BUILTIN_SETS:
        return True
    path = Path(source)
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    try:
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    rec = json.loads(line)
                    return isinstance(rec, dict) and (rec.get("kind") == "repo"
                                                      or "FAIL_TO_PASS" in rec)
    except (OSError, ValueError, RecursionError):
        return False
    return False


def repo_report(task: RepoTask, found: list[RepoProblem],
                severity: Mapping[ProblemCode, Severity] | None = None) -> TaskReport:
    """One task's report from ``check_repo_task``'s findings."""
    problems: list[Problem] = []
    skipped: list[str] = []
    for p in found:
        code = REPO_CODES.get(p.code)
        if code is None:
            skipped.append(f"{SKIPPED.get(p.code, p.code)}: {p.message}")
        else:
            problems.append(Problem.of(code, f"{p.code}: {p.message}", severity))
    return TaskReport.build(id=task.id, version=task.version, problems=problems,
                            skipped=skipped, tags=list(task.tags),
                            time_limit_s=task.limits.test_time_s)


async def validate_repo_set(tasks: list[RepoTask], engine: Engine) -> ValidationRun:
    """Check every task (two episodes each, all at once: the engine queues them)."""
    started = time.perf_counter()
    found = await asyncio.gather(*(check_repo_task(engine, t) for t in tasks))
    reports = [repo_report(t, f) for t, f in zip(tasks, found, strict=True)]
    return ValidationRun(reports=reports, runs=sum(2 if t.patch else 1 for t in tasks),
                         cached=0, mutants=0, elapsed_s=time.perf_counter() - started)


def run_repo_validation(source: str, slots: int | None, no_isolation: bool) -> ValidationRun:
    """Load the repo set ``source`` and check it on a fresh engine (TaskFormatError: bad
    input)."""
    from sandloop import _aio as aio

    tasks = load_repo_tasks(source)

    async def run() -> ValidationRun:
        async with Engine(slots=slots, isolation="none" if no_isolation else "full") as engine:
            return await validate_repo_set(tasks, engine)

    return aio.run(run())
