"""Score (label, completion) pairs: in this process (an embedded engine) or via ``sandloop serve``.

The embedded engine lives on its own event-loop thread (``_aio.LoopThread``, the bridge
``SyncEngine`` uses too), so one ``Scorer`` serves sync callers
(verl's ``compute_score``, OpenRLHF's ``reward_func``) and async ones (TRL's async reward
functions) from any thread or loop.

Scores that come with a training ``step`` are rollouts for the reward monitor: the server is told
the step, run and each item's group (headers ``X-Sandloop-Step``/``-Run``, item field ``group``),
and with ``rollout_log`` they are also appended to a SQLite rollout log here.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandloop import _aio as aio
from sandloop.engine import Engine
from sandloop.errors import IntegrationError
from sandloop.monitor.capture import rollouts_of
from sandloop.monitor.rolloutlog import RolloutLog
from sandloop.reward import CompletionResult, RewardConfig, Verifier, completion_hash
from sandloop.reward.scoring import Completion, ResultCache, score_all
from sandloop.tasks import Task, load_tasks, resolve_task

logger = logging.getLogger(__name__)


class RemoteScoringError(IntegrationError, RuntimeError):
    """A remote sandloop server could not be reached or did not answer with results; the
    message names the URL and what to check (an infrastructure failure, not a reward)."""

__all__ = ["RemoteScoringError", "ScoreItem", "Scorer"]

@dataclass(frozen=True)
class ScoreItem:
    """One completion and the label (task id, task record or tests) it is scored against.

    ``group``: the rollouts of one prompt in one training step (for the reward monitor; default:
    the task id)."""

    label: Any
    completion: str
    completion_id: str | None = None
    language: str | None = None
    group: str | None = None


class Scorer:
    """Scores completions with sandloop's verifiers.

    ``url``: a ``sandloop serve`` base URL (``http://host:8080``); without it an engine runs in
    this process (``slots``, ``isolation``). ``task_sets``: task sets whose ids labels may name
    (built-in names or JSONL paths; local mode); ``tasks``: extra tasks. ``reward``: how tests
    become a reward (binary by default; ``RewardConfig(mode="fraction")`` for partial credit).
    ``rollout_log``: a SQLite rollout log that scores with a ``step`` are appended to, under
    ``run_id`` (default ``"default"``; also sent to the server).
    ``cache_size``: results kept in memory (local mode), so a completion seen again, in the same
    batch or a later step, is not run again (0: none; identical completions of one batch still
    run once).
    """

    def __init__(self, *, url: str | None = None, api_key: str | None = None,
                 task_sets: Sequence[str] = (), tasks: Iterable[Task] = (),
                 reward: RewardConfig | None = None, slots: int | None = None,
                 isolation: str = "full", priority: str | int = "train",
                 client: str = "trainer", concurrency: int = 64,
                 request_timeout_s: float = 600.0, rollout_log: str | Path | None = None,
                 run_id: str | None = None, cache_size: int = 4096) -> None:
        self.url = url.rstrip("/") if url else None
        self.api_key = api_key
        self.reward = reward or RewardConfig()
        self.slots = slots
        self.isolation = isolation
        self.priority = priority
        self.client = client
        self.concurrency = concurrency
        self.request_timeout_s = request_timeout_s
        self.task_sets = tuple(task_sets)
        self._tasks: dict[str, Task] = {t.id: t for t in tasks}
        self._sets_loaded = False
        self._loop = aio.LoopThread("sandloop-scorer")
        self._engine: Engine | None = None
        self._verifier: Verifier | None = None
        self._engine_lock: asyncio.Lock | None = None
        self._lock = threading.Lock()
        self.rollout_log = Path(rollout_log) if rollout_log is not None else None
        self.run_id = run_id
        self._log: RolloutLog | None = None
        self._cache = ResultCache(cache_size) if cache_size > 0 else None

    @property
    def runs(self) -> int:
        """Sandbox runs the embedded engine has executed so far (retries included; 0 before the
        first local score): what scoring cost once duplicates and cached results are left out."""
        return self._engine.stats.executed if self._engine is not None else 0

    # -- tasks -----------------------------------------------------------------------------
    @property
    def tasks(self) -> Mapping[str, Task]:
        if not self._sets_loaded:
            with self._lock:
                if not self._sets_loaded:
                    for name in self.task_sets:
                        for t in load_tasks(name):
                            self._tasks.setdefault(t.id, t)
                    self._sets_loaded = True
        return self._tasks

    # -- the engine's loop thread -----------------------------------------------------------
    async def _start_engine(self) -> Verifier:
        if self._verifier is None:
            # Concurrent first calls (OpenRLHF scores each sample on its own thread) must not
            # each start an engine: the extra ones would hold slots and never be closed.
            if self._engine_lock is None:  # made on the loop thread, where it is used
                self._engine_lock = asyncio.Lock()
            async with self._engine_lock:
                if self._verifier is None:
                    engine = Engine(slots=self.slots, isolation=self.isolation)
                    await engine.start()
                    self._engine = engine
                    self._verifier = Verifier(
                        engine.runner(priority=self.priority, client=self.client),
                        reward=self.reward)
        return self._verifier

    async def _score_local(self, pairs: list[tuple[Task, ScoreItem]]) -> list[CompletionResult]:
        verifier = await self._start_engine()
        # The one batch-scoring path (``sandloop score``'s and the server's); no result store
        # here, but an in-memory cache (a small policy repeats itself within and across
        # steps). The id is the one Verifier would give.
        comps = [Completion(task_id=t.id, completion=i.completion,
                            completion_id=i.completion_id or completion_hash(i.completion)[:12])
                 for t, i in pairs]
        return await score_all([t for t, _ in pairs], comps, verifier, cache=self._cache,
                               concurrency=self.concurrency)

    # -- remote ------------------------------------------------------------------------------
    async def _score_remote(self, items: Sequence[ScoreItem],
                            step: int | None = None) -> list[CompletionResult]:
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        if step is not None:  # the server's monitor records the rollouts of a training step
            headers["X-Sandloop-Step"] = str(step)
            if self.run_id:
                headers["X-Sandloop-Run"] = self.run_id
        body = {
            "items": [{"task": i.label, "completion": i.completion,
                       "completion_id": i.completion_id, "language": i.language,
                       **({"group": i.group} if i.group is not None else {})}
                      for i in items],
            "reward": self.reward.model_dump(mode="json"),
            "priority": self.priority,
        }
        url = f"{self.url}/v1/score"
        try:
            async with httpx.AsyncClient(timeout=self.request_timeout_s) as client:
                for attempt in range(5):
                    resp = await client.post(url, json=body, headers=headers)
                    # 429/503: the server refused admission (quota, full queue) and ran
                    # nothing, so waiting as told is back-pressure, not a retry of a failed run
                    # (those are the engine's alone, engine/retry.py).
                    if resp.status_code in (429, 503) and attempt < 4:
                        await asyncio.sleep(_retry_after_s(resp.headers.get("Retry-After")))
                        continue
                    break
        except httpx.HTTPError as e:
            # A server that is down or unreachable: one line saying so, not httpx's traceback.
            detail = str(e) or "no answer"
            raise RemoteScoringError(
                f"cannot reach the sandloop server at {url}: {type(e).__name__}: {detail}; is "
                "`sandloop serve` running there (and the URL right)?") from e
        if resp.status_code != 200:
            raise RemoteScoringError(
                f"sandloop server at {url} answered {resp.status_code}: {resp.text[:500]}")
        try:
            return [CompletionResult.model_validate(r) for r in resp.json()["results"]]
        except (ValueError, KeyError, TypeError) as e:
            raise RemoteScoringError(f"sandloop server at {url} answered 200 without valid "
                                     f"results ({e}); is that URL a sandloop server?") from e

    # -- the rollout log ---------------------------------------------------------------------
    def _record(self, items: Sequence[ScoreItem], results: Sequence[CompletionResult],
                step: int | None, pairs: Sequence[tuple[Task, ScoreItem]] = ()) -> None:
        if step is None or self.rollout_log is None:
            return
        with self._lock:
            if self._log is None:
                self._log = RolloutLog(self.rollout_log)
            log = self._log
        log.append(rollouts_of(results, [i.completion for i in items], step=step,
                               groups=[i.group for i in items], run_id=self.run_id,
                               tasks={t.id: t for t, _ in pairs}),
                   self.run_id or "default")

    # -- public ------------------------------------------------------------------------------
    async def ascore(self, items: Sequence[ScoreItem], *,
                     step: int | None = None) -> list[CompletionResult]:
        """Score ``items`` (results in order); usable from any event loop. With ``step`` (the
        training step) the scores are rollouts for the reward monitor."""
        if self.url is not None:
            results = await self._score_remote(items, step)
            await asyncio.to_thread(self._record, items, results, step)
            return results
        tasks = self.tasks
        pairs = [(resolve_task(i.label, tasks, language=i.language), i) for i in items]
        results = await self._loop.acall(self._score_local(pairs))
        await asyncio.to_thread(self._record, items, results, step, pairs)
        return results

    def score(self, items: Sequence[ScoreItem], *,
              step: int | None = None) -> list[CompletionResult]:
        """Blocking form of :meth:`ascore` (not from inside the engine's own loop)."""
        if self.url is not None:
            # The one sync bridge (not asyncio.run, which fails under a caller's running loop).
            results = self._loop.call(self._score_remote(items, step))
            self._record(items, results, step)
            return results
        tasks = self.tasks
        pairs = [(resolve_task(i.label, tasks, language=i.language), i) for i in items]
        results = self._loop.call(self._score_local(pairs))
        self._record(items, results, step, pairs)
        return results

    def close(self) -> None:
        """Stop the embedded engine (its slots) and its loop thread; close the rollout log."""
        with self._lock:
            log, self._log = self._log, None
        if log is not None:
            log.close()
        if not self._loop.started:
            return
        if self._engine is not None:
            try:
                self._loop.call(self._engine.close(), timeout=60)
            except Exception as e:  # closing anyway: the loop and its slots' processes go below
                logger.debug("scorer's engine did not close cleanly: %r", e)
        self._loop.stop(timeout=10)
        self._engine = self._verifier = None
        self._engine_lock = None

    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _retry_after_s(header: str | None) -> float:
    """Seconds to wait from a Retry-After header: its delay-seconds form, bounded to [0, 30];
    1 s when absent or in the HTTP-date form (sandloop's server sends seconds)."""
    try:
        seconds = float(header or "1")
    except ValueError:
        return 1.0
    return min(max(seconds, 0.0), 30.0) if math.isfinite(seconds) else 1.0
