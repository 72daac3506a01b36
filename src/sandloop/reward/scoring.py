"""Score many completions against a task set, reusing stored results (the engine of ``score``)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
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

__all__ = ["Completion", "CompletionFileError", "ResultCache", "read_completions", "score_all"]


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


class ResultCache:
    """The newest ``size`` results in memory, by store key (task id and version, completion
    hash, verifier configuration): a trainer that scores the same completions step after step
    (a small model repeats itself) runs each once. Null rewards (infrastructure failures) are
    not kept, so they are retried. Not shared between tenants: one per Scorer."""

    def __init__(self, size: int = 4096) -> None:
        if size < 1:
            raise ValueError(f"ResultCache size must be >= 1, got {size}")
        self.size = size
        self._items: OrderedDict[ResultKey, CompletionResult] = OrderedDict()
        self.hits = 0

    def get(self, key: ResultKey) -> CompletionResult | None:
        res = self._items.get(key)
        if res is not None:
            self._items.move_to_end(key)
            self.hits += 1
        return res

    def put(self, key: ResultKey, res: CompletionResult) -> None:
        if res.reward is None:
            return
        self._items[key] = res
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


async def score_all(
    tasks: Mapping[str, Task] | Sequence[Task],
    completions: Sequence[Completion],
    verifier: Verifier,
    *,
    store: ResultStore | None = None,
    cache: ResultCache | None = None,
    concurrency: int = 8,
    on_result: Callable[[CompletionResult, bool], None] | None = None,
    scope: str | None = None,
) -> list[CompletionResult]:
    """Score ``completions`` (results in input order), at most ``concurrency`` at once.

    ``tasks``: the tasks by id, or the task of each completion (in order: for callers whose
    completions may name two versions of one task id, like the trainer adapters' inline tests).
    Results already in ``store`` are returned without running anything (``on_result`` gets
    ``cached=True``); new results are committed to the store in group commits as they come.
    Identical completions of one task version (same store key) are verified once per call, the
    copies answered with their own ``completion_id``; with ``cache`` also once across calls
    (``on_result`` gets ``cached=True`` for those too).

    ``scope``: stored results are shared only within it (the server passes the API key's id:
    one tenant never receives, nor learns of, another's record, whose timings and, for a
    nondeterministic completion, verdict would be the other's).
    """
    if isinstance(tasks, Mapping):
        of = [tasks[c.task_id] for c in completions]
    else:
        of = list(tasks)
        if len(of) != len(completions):
            raise ValueError(f"{len(of)} tasks for {len(completions)} completions: give one "
                             "task per completion, or a mapping by task id")
    cfg = verifier.config_hash() if scope is None else f"{verifier.config_hash()}@{scope}"
    keys = [ResultKey(c.task_id, t.version, _key_hash(c, t), cfg)
            for c, t in zip(completions, of, strict=True)]
    cached = store.get_many(keys) if store is not None else {}
    results: list[CompletionResult | None] = [None] * len(completions)
    # Identical completions of one task version (a GRPO group of a small model repeats itself)
    # run once: the key is the store's, content-addressed, so a copy is exactly what a second
    # run would have scored. The first index of each key runs; the others wait for it.
    first: dict[ResultKey, int] = {}
    copies: dict[int, list[int]] = {}
    for i, (c, key) in enumerate(zip(completions, keys, strict=True)):
        hit = cache.get(key) if cache is not None else None
        if hit is not None:
            res = hit.model_copy(update={"completion_id": c.completion_id})
            results[i] = res
            if on_result:
                on_result(res, True)
            continue
        rec = cached.get(key)
        if rec is not None:
            res = CompletionResult.model_validate({**rec, "completion_id": c.completion_id})
            results[i] = res
            if on_result:
                on_result(res, True)
            continue
        j = first.setdefault(key, i)
        if j != i:
            copies.setdefault(j, []).append(i)
    sem = asyncio.Semaphore(concurrency)
    writer = _StoreWriter(store) if store is not None else None

    def settle(i: int, res: CompletionResult) -> None:
        if cache is not None:
            cache.put(keys[i], res)
        results[i] = res
        if on_result:
            on_result(res, False)
        for k in copies.get(i, ()):
            dup = res.model_copy(update={"completion_id": completions[k].completion_id})
            results[k] = dup
            if on_result:
                on_result(dup, False)

    async def one(i: int) -> None:
        c = completions[i]
        async with sem:
            res = await verifier.verify(_as_language(of[i], c.language),
                                        c.completion, c.completion_id)
        if writer is not None:
            writer.add(keys[i], res)
        settle(i, res)

    try:
        await asyncio.gather(*(one(i) for i in first.values()))
    finally:
        if writer is not None:
            await writer.flush()
    return [r for r in results if r is not None]


class _StoreWriter:
    """Group commit of new results: those that finish while a commit runs go into the next one,
    so a batch costs a few SQLite transactions (off the event loop), not one per result, and a
    result is still committed moments after it is known (an interrupted run keeps it)."""

    def __init__(self, store: ResultStore) -> None:
        self.store = store
        self._pending: list[tuple[ResultKey, dict[str, Any]]] = []
        self._task: asyncio.Task[None] | None = None

    def add(self, key: ResultKey, res: CompletionResult) -> None:
        self._pending.append((key, _record(res)))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._commit())

    async def _commit(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                await asyncio.to_thread(self.store.put_many, batch)
        finally:
            self._task = None

    async def flush(self) -> None:
        """Wait until every added result is committed (also when the scoring was cancelled:
        finished results are kept)."""
        while self._task is not None or self._pending:
            if self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._commit())
            await asyncio.shield(self._task)


def _record(res: CompletionResult) -> dict[str, Any]:
    return res.model_dump(mode="json")
