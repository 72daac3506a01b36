"""Prepared snapshots: a repository task's files after its set-up command, made once per task.

Set-up (``RepoTask.setup``: generating files, building an extension) runs once per task version
in a scratch session; its result — every regular file of the work dir — is kept in the
supervisor's memory, shared read-only by every episode of that task. An episode's reset then
opens its fresh session from the snapshot (``engine.open_session(files=...)``: on the local
backend a copy-on-write overlay on one copy per slot, elsewhere a copy): no set-up per
episode, and nothing an earlier episode did can leak into the next (each gets its own work
dir, or its own upper layer).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping

from sandloop._aio import single_flight
from sandloop.engine import Engine
from sandloop.errors import EpisodeError
from sandloop.sandbox.models import Limits, Status
from sandloop.tasks.repo import RepoTask

__all__ = ["SetupFailed", "Snapshots", "session_limits", "snapshots_of"]


class SetupFailed(EpisodeError):
    """The task's set-up command failed; the message has its output. Fix the task's ``setup``."""


def session_limits(task: RepoTask, *, workdir_mb: int | None = None,
                   output_bytes: int = 16 << 10) -> Limits:
    """The limits of an episode's session and of its ``run`` calls."""
    lim = task.limits
    return Limits(time_s=lim.command_time_s, memory_mb=lim.memory_mb,
                  max_processes=lim.max_processes, workdir_mb=workdir_mb or lim.workdir_mb,
                  workdir_inodes=lim.workdir_inodes, stdout_bytes=output_bytes,
                  stderr_bytes=output_bytes)


class Snapshots:
    """Per-engine cache of prepared snapshots, keyed by task id and version."""

    def __init__(self, engine: Engine, max_tasks: int = 256) -> None:
        self.engine = engine
        self.max_tasks = max_tasks
        self._cache: dict[tuple[str, str], Mapping[str, bytes]] = {}
        self._making: dict[tuple[str, str], asyncio.Task[Mapping[str, bytes]]] = {}
        self.setups_run = 0

    async def get(self, task: RepoTask) -> Mapping[str, bytes]:
        """The task's files after set-up (set-up runs at most once per task version), encoded
        once: a reset copies them as they are."""
        key = (task.id, task.version)
        got = self._cache.get(key)
        if got is not None:
            return got
        # Shared by every episode of the task that resets meanwhile; one episode withdrawn
        # mid set-up does not cancel the set-up the others wait on.
        return await single_flight(self._making, key, lambda: self._prepare_and_keep(task),
                                   keep=False)

    async def _prepare_and_keep(self, task: RepoTask) -> Mapping[str, bytes]:
        snap = await self._prepare(task)
        if len(self._cache) >= self.max_tasks:
            self._cache.pop(next(iter(self._cache)))
        self._cache[(task.id, task.version)] = snap
        return snap

    async def _prepare(self, task: RepoTask) -> Mapping[str, bytes]:
        if task.setup is None:
            return {p: c.encode() for p, c in task.files.items()}
        limits = session_limits(task)
        async with self.engine.session(limits=limits,
                                       environment=task.runtime_environment) as s:
            await s.write_files(task.files)
            self.setups_run += 1  # counted when it starts: a failed set-up ran too
            r = await s.run(task.setup, limits=limits.model_copy(
                update={"time_s": task.limits.test_time_s}))
            if r.status is not Status.OK:
                raise SetupFailed(f"task {task.id}: set-up {task.setup!r} ended {r.status} "
                                  f"(exit {r.exit_code}): {(r.stderr or r.stdout)[-2000:]}")
            listing = await s.run("find . -type f ! -path '*/__pycache__/*' -printf '%P\\0'",
                                  limits=limits.model_copy(update={"stdout_bytes": 8 << 20}))
            if listing.status is not Status.OK or listing.stdout_truncated:
                raise SetupFailed(f"task {task.id}: cannot list the files after set-up: "
                                  f"{listing.stderr[-500:]}")
            paths = [p for p in listing.stdout.split("\0") if p]
            return await s.read_files(paths)


_PER_ENGINE: weakref.WeakKeyDictionary[Engine, Snapshots] = weakref.WeakKeyDictionary()


def snapshots_of(engine: Engine) -> Snapshots:
    """The engine's snapshot cache (created on first use; lives as long as the engine)."""
    snaps = _PER_ENGINE.get(engine)
    if snaps is None:
        snaps = _PER_ENGINE[engine] = Snapshots(engine)
    return snaps
