"""Episode endpoints: multi-turn, tool-using episodes over repository tasks (docs/episodes.md).

``POST /v1/episodes`` starts one (a task from a set served with ``--task-set``),
``POST /v1/episodes/{id}/call`` calls a tool, ``GET`` reads its state, ``DELETE`` ends it.
Episodes belong to the API key that started them; each key holds at most
``max_sessions_per_key`` unfinished episodes (they hold sessions). The start (its reset) and
every call of a tool that runs something in the sandbox (``RUNNING_TOOLS``) is charged to the
key like one run: quota (``max_runs``), rate limit and requests in flight. With ``--db``, every
episode is recorded there for ``sandloop episodes replay``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from sandloop.episodes import Episode, EpisodeConfig, EpisodeFinished
from sandloop.server.auth import KeyPolicy, Refused
from sandloop.server.config import ServerConfig
from sandloop.server.dependencies import EngineDep, Key, QuotaDep
from sandloop.server.errors import ERROR_RESPONSES, RequestError
from sandloop.store.episodes import EpisodeLog
from sandloop.tasks.loaders import TaskFormatError
from sandloop.tasks.repo import RepoTask, load_repo_tasks

__all__ = ["RUNNING_TOOLS", "episodes_router"]

# Tools whose call runs a program in the episode's sandbox: each is charged like a run.
# Threat: without it, a key with a quota or a rate limit could run unlimited commands through
# episodes (a `run` is any bash command). The others are answered from the episode's view of
# the files, or are a plain read of the work dir.
RUNNING_TOOLS = frozenset({"run", "run_tests", "submit"})

_KEEP_FINISHED = 4096  # finished episodes kept for GET, oldest dropped first


class EpisodeStartBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task_set: str
    task_id: str
    max_turns: int | None = Field(None, ge=1, le=1000)


class EpisodeCallBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)


def episodes_router(config: ServerConfig) -> APIRouter:
    """The episode routes, with this app's live episodes (one router per app)."""
    router = APIRouter(tags=["episodes"], responses=ERROR_RESPONSES)
    episodes: dict[str, tuple[Episode, str]] = {}
    sets: dict[str, dict[str, RepoTask]] = {}
    lock = asyncio.Lock()
    log: list[EpisodeLog] = []  # opened on first use (config.episode_db, else config.db)

    async def task_of(name: str, task_id: str) -> RepoTask:
        if name not in config.task_sets:
            raise RequestError(f"task set {name!r} is not served here; available: "
                             f"{', '.join(config.task_sets) or '(none)'}")
        async with lock:
            if name not in sets:
                try:
                    loaded = await asyncio.to_thread(load_repo_tasks, name)
                except TaskFormatError as e:
                    raise RequestError(f"task set {name!r} has no repository tasks: {e}") from None
                sets[name] = {t.id: t for t in loaded}
        task = sets[name].get(task_id)
        if task is None:
            raise Refused(404, f"no task {task_id!r} in set {name!r}", code="task_not_found")
        return task

    def episode_of(pol: KeyPolicy, eid: str) -> Episode:
        entry = episodes.get(eid)
        if entry is None or entry[1] != pol.id:
            raise Refused(404, f"no episode {eid!r} (deleted, or not yours)",
                          code="episode_not_found")
        return entry[0]

    def prune() -> None:
        finished = [k for k, (ep, _) in episodes.items() if ep.done]
        for k in finished[:max(0, len(finished) - _KEEP_FINISHED)]:
            episodes.pop(k, None)

    @router.post("/v1/episodes", status_code=201)
    async def start(pol: Key, quota: QuotaDep, engine: EngineDep,
                    body: EpisodeStartBody) -> dict[str, Any]:
        """Start an episode: returns its id, the first observation (problem statement and
        file list) and the tools' JSON schemas."""
        task = await task_of(body.task_set, body.task_id)
        cap = pol.record.max_sessions if pol.record.max_sessions is not None \
            else config.max_sessions_per_key
        live = sum(1 for ep, k in episodes.values() if k == pol.id and not ep.done)
        if live >= cap:
            raise Refused(429, f"key {pol.id!r} already has {live} unfinished episodes (at most "
                               f"{cap}); submit or DELETE /v1/episodes/ID")
        where = config.episode_db if config.episode_db is not None else config.db
        if where is not None and config.record_episodes and not log:
            where.parent.mkdir(parents=True, exist_ok=True)
            log.append(EpisodeLog(where))
        cfg = EpisodeConfig(client=pol.id, max_turns=body.max_turns or EpisodeConfig.max_turns)
        ep = Episode(engine, task, cfg, log=log[0] if log else None)
        with quota.charge(1):  # the reset writes the snapshot in the sandbox: one run
            episodes[ep.id] = (ep, pol.id)  # counted while the reset awaits
            try:
                obs = await ep.reset()
            except BaseException:
                episodes.pop(ep.id, None)
                raise
        prune()
        return {"episode_id": ep.id, "observation": obs, "tools": ep.tools}

    @router.post("/v1/episodes/{eid}/call")
    async def call(pol: Key, quota: QuotaDep, eid: str, body: EpisodeCallBody
                   ) -> dict[str, Any]:
        """Call one tool; ``done`` is true once the episode ended (then the observation holds
        ``reward``, ``verdict`` and per-test ``tests``). ``run``, ``run_tests`` and ``submit``
        are charged to the key like a run (429 once its quota or rate is spent)."""
        ep = episode_of(pol, eid)
        if ep.done:  # refused before charging: a call that cannot run spends nothing
            raise Refused(409, f"episode {eid} ended ({ep.ended_by}); start a new episode",
                          code="episode_finished")
        try:
            if body.tool in RUNNING_TOOLS:
                with quota.charge(1):
                    obs = await ep.call(body.tool, body.arguments)
            else:
                obs = await ep.call(body.tool, body.arguments)
        except EpisodeFinished as e:
            raise Refused(409, str(e), code="episode_finished") from None
        return {"observation": obs, "done": ep.done}

    @router.get("/v1/episodes/{eid}")
    async def get(pol: Key, eid: str) -> dict[str, Any]:
        """The episode's state: turns, whether it ended, and how."""
        return episode_of(pol, eid).summary()

    @router.delete("/v1/episodes/{eid}")
    async def delete(pol: Key, eid: str) -> dict[str, Any]:
        """End the episode (ungraded if unfinished) and delete its session."""
        ep = episode_of(pol, eid)
        await ep.close()
        episodes.pop(eid, None)
        return {"deleted": eid}

    return router
