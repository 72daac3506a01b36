"""Score many completions against a task set, reusing stored results (the engine of ``score``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from sandloop.errors import InputError, RewardError
from sandloop.reward.verifier import CompletionResult, Verifier, completion_hash
from sandloop.sandbox.models import canonical_language
from sandloop.store import ResultKey, ResultStore
from sandloop.tasks import Task, TaskFormatError
from sandloop.tasks.loaders import read_records

__all__ = ["Completion", "CompletionFileError", "read_completions", "score_all"]


class CompletionFileError(RewardError, InputError):
    """A completions file is malformed; names the file and line."""


class Completion(BaseModel):
    """One model completion to score. ``language`` (optional) names the completion's language
    when it differs from the task's: allowed for stdin/stdout tasks, whose tests any language
    can take. ``step`` and ``group``: the training step and rollout group it came from, when
    the file says (for the reward monitor's rollout log)."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    completion: str
    completion_id: str
    language: str | None = None
    step: int | None = None
    group: str | None = None


def _as_language(task: Task, language: str | None) -> Task:
    """``task`` as seen by a completion in ``language`` (the same task when it names none)."""
    if language is None or canonical_language(language) == task.language:
        return task
    # Only the language differs; the version stays (the store key adds the language instead).
    return task.model_copy(update={"language": canonical_language(language)})


def _key_hash(c: Completion, task: Task) -> str:
    lang = None if c.language is None else canonical_language(c.language)
    if lang is None or lang == task.language:
        return completion_hash(c.completion)
    return completion_hash(f"{lang}\0{c.completion}")


def read_completions(path: Path, tasks: dict[str, Task]) -> list[Completion]:
    """Read ``{"task_id", "completion"[, "completion_id"][, "language"][, "step", "group"]}``
    records from JSONL (``.gz`` too) or Parquet. A missing completion_id becomes the
    completion's ordinal among those of its task ("0", "1", ...)."""
    out: list[Completion] = []
    per_task: dict[str, int] = {}
    try:
        records = list(read_records(path))
    except TaskFormatError as e:
        raise CompletionFileError(str(e)) from None
    for lineno, rec in records:
        where = f"{path}:{lineno}"
        tid, text = rec.get("task_id"), rec.get("completion")
        if not isinstance(tid, str):
            raise CompletionFileError(f"{where}: field 'task_id': missing or not a string")
        if not isinstance(text, str):
            raise CompletionFileError(f"{where}: field 'completion': missing or not a string")
        if tid not in tasks:
            raise CompletionFileError(
                f"{where}: field 'task_id': {tid!r} is not in the task set"
            )
        lang = rec.get("language")
        if lang is not None:
            task = tasks[tid]
            try:
                lang = canonical_language(str(lang))
            except ValueError as e:
                raise CompletionFileError(f"{where}: field 'language': {e}") from None
            if lang != task.language and task.test_kind != "stdio":
                raise CompletionFileError(
                    f"{where}: field 'language': {tid!r} is a {task.language} "
                    f"{task.test_kind} task; only stdin/stdout tasks take other languages")
        step, group = rec.get("step"), rec.get("group")
        if step is not None and (not isinstance(step, int) or isinstance(step, bool)
                                 or step < 0):
            raise CompletionFileError(f"{where}: field 'step': not a non-negative integer")
        if group is not None and (not isinstance(group, str | int) or isinstance(group, bool)):
            raise CompletionFileError(f"{where}: field 'group': not a string or integer")
        n = per_task.get(tid, 0)
        per_task[tid] = n + 1
        cid = rec.get("completion_id")
        out.append(Completion(task_id=tid, completion=text, language=lang,
                              completion_id=str(cid) if cid is not None else str(n),
                              step=step, group=None if group is None else str(group)))
    return out


async def score_all(
    tasks: Mapping[str, Task] | Sequence[Task],
    completions: Sequence[Completion],
    verifier: Verifier,
    *,
    store: ResultStore | None = None,
    concurrency: int = 8,
    on_result: Callable[[CompletionResult, bool], None] | None = None,
) -> list[CompletionResult]:
    """Score ``completions`` (results in input order), at most ``concurrency`` at once.

    ``tasks``: the tasks by id, or the task of each completion (in order: for callers whose
    completions may name two versions of one task id, like the trainer adapters' inline tests).
    Results already in ``store`` are returned without running anything (``on_result`` gets
    ``cached=True``); each new result is committed to the store as soon as it is known.
    """
    if isinstance(tasks, Mapping):
        of = [tasks[c.task_id] for c in completions]
    else:
        of = list(tasks)
        if len(of) != len(completions):
            raise ValueError(f"{len(of)} tasks for {len(completions)} completions: give one "
                             "task per completion, or a mapping by task id")
    cfg = verifier.config_hash()
    keys = [ResultKey(c.task_id, t.version, _key_hash(c, t), cfg)
            for c, t in zip(completions, of, strict=True)]
    cached = store.get_many(keys) if store is not None else {}
    results: list[CompletionResult | None] = [None] * len(completions)
    todo: list[int] = []
    for i, (c, key) in enumerate(zip(completions, keys, strict=True)):
        rec = cached.get(key)
        if rec is None:
            todo.append(i)
            continue
        res = CompletionResult.model_validate({**rec, "completion_id": c.completion_id})
        results[i] = res
        if on_result:
            on_result(res, True)
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        c = completions[i]
        async with sem:
            res = await verifier.verify(_as_language(of[i], c.language),
                                        c.completion, c.completion_id)
        if store is not None:
            # A thread keeps the event loop free while SQLite commits.
            await asyncio.to_thread(store.put, keys[i], _record(res))
        results[i] = res
        if on_result:
            on_result(res, False)

    await asyncio.gather(*(one(i) for i in todo))
    return [r for r in results if r is not None]


def _record(res: CompletionResult) -> dict[str, Any]:
    return res.model_dump(mode="json")
