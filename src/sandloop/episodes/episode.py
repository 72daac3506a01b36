"""An episode: one repository task in one session, driven by tool calls, graded at the end.

``reset()`` opens a fresh session holding the task's prepared snapshot and returns the first
observation (the problem statement and the file list). Each ``call(tool, arguments)`` returns an
observation; the episode ends on ``submit``, when the turn or time budget runs out, or when the
session is lost; then the hidden tests grade the final state (:mod:`sandloop.episodes.grading`).
Every call is journalled in ``calls`` and, with an :class:`~sandloop.store.episodes.EpisodeLog`,
written to the store as it happens.

The Python API is ``sandloop.episodes.episode(engine, task)`` rather than a method of the engine:
episodes sit above the engine in the layer table (DESIGN.md), and the engine must not import
them, even lazily.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import shlex
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sandloop.engine import (
    Engine,
    EngineClosed,
    Session,
    SessionClosed,
    SessionExpired,
    SessionFull,
    SessionLost,
    WorkspaceWriteError,
)
from sandloop.episodes.fileview import FileView
from sandloop.episodes.grading import Grade, Shaping, grading_program, parse_report, public_counts
from sandloop.episodes.snapshots import Snapshots, session_limits, snapshots_of
from sandloop.episodes.tools import TOOL_NAMES, check_arguments, tool_schemas
from sandloop.errors import EpisodeError, InputError
from sandloop.sandbox.models import ExecResult, Limits, Program, check_relative_path
from sandloop.store.episodes import CallRecord, EpisodeLog
from sandloop.tasks.patches import PatchError, apply_patch, patched_paths
from sandloop.tasks.repo import RepoTask

__all__ = ["Episode", "EpisodeConfig", "EpisodeFinished", "episode"]

_ids = itertools.count(1)
_PROCESS = secrets.token_hex(3)


class EpisodeFinished(EpisodeError, InputError):
    """A tool was called after the episode ended; start a new episode (``reset``)."""


@dataclass(frozen=True)
class EpisodeConfig:
    """Budgets and caps of one episode (defaults suit a small repository)."""

    max_turns: int = 50  # tool calls, submit included; reaching it ends and grades the episode
    max_time_s: float = 1800.0  # wall time since reset; past it the next call ends the episode
    output_bytes: int = 16 << 10  # per stream of run / run_tests (the rest is cut, and flagged)
    read_bytes: int = 256 << 10  # largest read_file answer
    workdir_mb: int | None = None  # the work dir's size (None: the task's limits)
    shaping: Shaping = field(default_factory=Shaping)
    priority: int | str = "interactive"
    client: str = "default"

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_time_s <= 0:
            raise ValueError("max_turns must be >= 1 and max_time_s > 0")

    def to_json(self) -> dict[str, Any]:
        return {"max_turns": self.max_turns, "max_time_s": self.max_time_s,
                "output_bytes": self.output_bytes, "read_bytes": self.read_bytes,
                "workdir_mb": self.workdir_mb, "shaping": self.shaping.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpisodeConfig:
        d = dict(data)
        return cls(shaping=Shaping(**d.pop("shaping", {})), **d)


def _result_obs(r: ExecResult) -> dict[str, Any]:
    return {"status": str(r.status), "exit_code": r.exit_code, "stdout": r.stdout,
            "stderr": r.stderr, "stdout_truncated": r.stdout_truncated,
            "stderr_truncated": r.stderr_truncated, "wall_time_s": round(r.wall_time_s, 4)}


class Episode:
    """One task in one session. Use ``async with episode(engine, task) as ep`` (reset on entry,
    closed on exit), or call ``reset()`` and ``close()`` yourself."""

    def __init__(self, engine: Engine, task: RepoTask, config: EpisodeConfig | None = None, *,
                 log: EpisodeLog | None = None, snapshots: Snapshots | None = None) -> None:
        self.engine = engine
        self.task = task
        self.config = config or EpisodeConfig()
        self.log = log
        self.snapshots = snapshots or snapshots_of(engine)
        self.id = f"ep{next(_ids)}-{_PROCESS}{secrets.token_hex(3)}"
        self.tools = tool_schemas()
        self.observation: dict[str, Any] = {}
        self.calls: list[CallRecord] = []
        self.grade: Grade | None = None
        self.ended_by: str | None = None
        self.reset_s: float | None = None
        self._session: Session | None = None
        self._files: FileView | None = None
        self._started = 0.0
        self._lock = asyncio.Lock()  # one call at a time: calls see each other's effects
        self._limits: Limits = session_limits(task, workdir_mb=self.config.workdir_mb,
                                              output_bytes=self.config.output_bytes)

    # -- state ------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.ended_by is not None

    @property
    def turns(self) -> int:
        return len(self.calls)

    @property
    def reward(self) -> float | None:
        return self.grade.reward if self.grade is not None else None

    @property
    def verdict(self) -> str | None:
        return self.grade.verdict if self.grade is not None else None

    def summary(self) -> dict[str, Any]:
        """The episode's state as JSON (``GET /v1/episodes/{id}``)."""
        return {"episode_id": self.id, "task_id": self.task.id, "task_version": self.task.version,
                "turns": self.turns, "max_turns": self.config.max_turns, "done": self.done,
                "ended_by": self.ended_by, "reward": self.reward, "verdict": self.verdict,
                "grade": self.grade.to_json() if self.grade is not None else None,
                "reset_s": self.reset_s}

    # -- lifecycle --------------------------------------------------------------------------
    async def reset(self) -> dict[str, Any]:
        """Start (or restart) the episode from the task's prepared snapshot; the observation
        holds the problem statement and the repository's file list."""
        await self._close_session()
        self.calls, self.grade, self.ended_by = [], None, None
        snap = await self.snapshots.get(self.task)
        t0 = time.perf_counter()
        s = await self.engine.open_session(limits=self._limits, priority=self.config.priority,
                                           client=self.config.client,
                                           environment=self.task.runtime_environment,
                                           files=snap)
        self.reset_s = time.perf_counter() - t0
        self._session = s
        self._files = FileView(s, snap)
        self._started = time.monotonic()
        self.observation = {"problem_statement": self.task.problem_statement,
                            "files": sorted(snap), "max_turns": self.config.max_turns}
        if self.log is not None:
            self.log.begin(self.id, self.task.id, self.task.to_json(), self.config.to_json(),
                           time.time())
        return self.observation

    async def close(self) -> None:
        """Delete the episode's session (idempotent); an unfinished episode ends ungraded."""
        if not self.done and self._session is not None:
            self._end("closed", None)
            if self.log is not None:
                self._log_end()
        await self._close_session()

    async def _close_session(self) -> None:
        s, self._session, self._files = self._session, None, None
        if s is not None:
            await s.close()

    async def __aenter__(self) -> Episode:
        await self.reset()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- tool calls -------------------------------------------------------------------------
    async def call(self, tool: str, arguments: dict[str, Any] | None = None,
                   **kwargs: Any) -> dict[str, Any]:
        """Call ``tool`` (arguments as a dict or keywords); returns its observation.

        A malformed call is an observation with ``error`` (and costs a turn). When this call
        ends the episode, the observation also holds ``ended_by``, ``reward``, ``verdict`` and
        per-test ``tests``. Raises EpisodeFinished after the end.
        """
        async with self._lock:
            return await self._call(tool, arguments, kwargs)

    async def _call(self, tool: str, arguments: dict[str, Any] | None,
                    kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.done:
            raise EpisodeFinished(f"episode {self.id} ended ({self.ended_by}); reset() or start "
                                  "a new episode")
        if self._session is None:
            raise EpisodeError(f"episode {self.id} has no session: call reset() first")
        args = dict(arguments or {}, **kwargs)
        started, t0 = time.time(), time.perf_counter()
        if time.monotonic() - self._started > self.config.max_time_s:
            obs = {"error": f"time budget of {self.config.max_time_s:g} s is spent"}
            obs.update(await self._finish("max_time"))
        else:
            try:
                obs = await self._dispatch(tool, args)
            except (SessionLost, SessionExpired, SessionClosed, EngineClosed) as e:
                # Fatal for the episode, not for the caller: it ends as a verdict.
                obs = {"error": f"the episode's sandbox is gone: {e}"}
                self._end("lost", Grade("sandbox_error", None, detail=str(e)))
                obs.update(self._ending())
            else:
                if not self.done and len(self.calls) + 1 >= self.config.max_turns:
                    obs.update(await self._finish("max_turns"))
        rec = CallRecord(len(self.calls), tool, args, obs, started, time.perf_counter() - t0)
        self.calls.append(rec)
        if self.log is not None:
            self.log.call(self.id, rec)
            if self.done:
                self._log_end()
        return obs

    async def _dispatch(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        problem = check_arguments(tool, args)
        if problem is not None:
            return {"error": problem}
        if tool == "submit":
            return await self._finish("submit")
        if tool == "run":
            r, lost = await self._run(args["command"])
            return lost if r is None else _result_obs(r)
        if tool == "run_tests":
            r, lost = await self._run(self.task.test_command)
            if r is None:
                return lost
            passed, failed = public_counts(r.stdout + r.stderr)
            return {"status": str(r.status), "exit_code": r.exit_code, "passed": passed,
                    "failed": failed, "output": (r.stdout + r.stderr)[-self.config.output_bytes:],
                    "truncated": r.stdout_truncated or r.stderr_truncated}
        if tool == "list_dir":
            return await self._list_dir(args.get("path", "."))
        if tool == "read_file":
            return await self._read_file(args["path"])
        if tool == "write_file":
            return await self._write({args["path"]: args["content"]}, [])
        if tool == "apply_patch":
            return await self._apply_patch(args["patch"])
        raise AssertionError(f"tool {tool} in TOOL_NAMES {TOOL_NAMES} without a handler")

    @staticmethod
    def _path_error(path: str) -> str | None:
        try:
            check_relative_path(path)
        except ValueError as e:
            return str(e)
        return None

    async def _run(self, command: str, limits: Limits | None = None,
                   program: Program | None = None) -> tuple[ExecResult | None, dict[str, Any]]:
        """Flush buffered writes, run in the work dir, forget what was known. A flush that
        does not fit returns (None, an observation with the error) and runs nothing."""
        s, view = self._session, self._files
        assert s is not None and view is not None
        try:
            await view.flush()
        except SessionFull as e:
            return None, {"error": f"files written since the last command did not fit and were "
                                   f"dropped; nothing ran: {e}"}
        except WorkspaceWriteError as e:  # a path the work dir's state refuses (a file where
            # a directory is needed, ...): the model's doing, so an observation, not a failure
            return None, {"error": f"files written since the last command could not be "
                                   f"written and were dropped; nothing ran: {e}"}
        try:
            if program is not None:
                return await s.run_program(program, limits or self._limits), {}
            return await s.run(command, limits=limits or self._limits), {}
        finally:
            view.forget()

    async def _read_file(self, path: str) -> dict[str, Any]:
        bad = self._path_error(path)
        if bad is not None:
            return {"error": bad}
        assert self._files is not None
        got = await self._files.read([path])
        if path not in got:
            return {"error": f"{path}: no such regular file"}
        data = got[path]
        cap = self.config.read_bytes
        return {"path": path, "content": data[:cap].decode(errors="replace"),
                "size": len(data), "truncated": len(data) > cap}

    async def _write(self, files: dict[str, str], delete: list[str]) -> dict[str, Any]:
        for p in [*files, *delete]:
            bad = self._path_error(p)
            if bad is not None:
                return {"error": bad}
        assert self._files is not None
        encoded: dict[str, bytes] = {}
        for p, c in files.items():
            try:
                encoded[p] = c.encode()
            except UnicodeEncodeError as e:  # a lone surrogate: no UTF-8 text can hold it
                return {"error": f"{p}: content is not valid Unicode text (character "
                                 f"{e.start}: {e.reason})"}
        try:
            if encoded:
                await self._files.write(encoded)
        except SessionFull as e:
            return {"error": str(e)}
        if delete:
            r, lost = await self._run("rm -f -- " + " ".join(shlex.quote(p) for p in delete))
            if r is None:
                return lost
            if r.exit_code != 0:
                return {"error": f"cannot delete {delete}: {r.stderr[-500:]}"}
        return {"ok": True, "written": sorted(files), "deleted": sorted(delete)}

    async def _apply_patch(self, patch: str) -> dict[str, Any]:
        try:
            paths = patched_paths(patch)
        except PatchError as e:
            return {"error": str(e)}
        for p in paths:
            bad = self._path_error(p)
            if bad is not None:
                return {"error": bad}
        assert self._files is not None
        got = await self._files.read(paths)
        try:
            current = {p: b.decode() for p, b in got.items()}
            changed = apply_patch(current, patch)
        except (PatchError, UnicodeDecodeError) as e:
            return {"error": f"the patch does not apply (nothing changed): {e}"}
        return await self._write({p: c for p, c in changed.items() if c is not None},
                                 [p for p, c in changed.items() if c is None])

    async def _list_dir(self, path: str) -> dict[str, Any]:
        if path not in (".", ""):
            bad = self._path_error(path.rstrip("/"))
            if bad is not None:
                return {"error": bad}
        r, lost = await self._run(f"cd -- {shlex.quote(path or '.')} && ls -1Ap")
        if r is None:
            return lost
        if r.exit_code != 0:
            return {"error": f"{path}: not a directory ({r.stderr.strip()[-300:]})"}
        return {"path": path or ".", "entries": [e for e in r.stdout.splitlines() if e]}

    # -- the end ----------------------------------------------------------------------------
    async def _finish(self, ended_by: str) -> dict[str, Any]:
        g = grading_program(self.task)
        lim = self._limits.model_copy(update={"time_s": self.task.limits.test_time_s,
                                              "stdout_bytes": 1 << 20})
        note: dict[str, Any] = {}
        try:
            r, note = await self._run("", lim, Program(language="python", source=g.source))
            if r is None:  # the last edits did not fit: grade what the work dir holds
                r, _ = await self._run("", lim, Program(language="python", source=g.source))
            assert r is not None
            grade = parse_report(self.task, r, g.nonce, self.config.shaping, len(self.calls) + 1)
        except (SessionLost, SessionExpired, SessionClosed) as e:
            grade = Grade("sandbox_error", None, detail=f"the episode's sandbox is gone: {e}")
        self._end(ended_by, grade)
        await self._close_session()
        return {**note, **self._ending()}

    def _end(self, ended_by: str, grade: Grade | None) -> None:
        self.ended_by, self.grade = ended_by, grade

    def _ending(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ended_by": self.ended_by}
        if self.grade is not None:
            out.update(self.grade.to_json())
        return out

    def _log_end(self) -> None:
        assert self.log is not None
        self.log.end(self.id, ended_at=time.time(), ended_by=self.ended_by or "",
                     reward=self.reward, verdict=self.verdict,
                     outcome=self.grade.to_json() if self.grade is not None else None)


@contextlib.asynccontextmanager
async def episode(engine: Engine, task: RepoTask, config: EpisodeConfig | None = None, *,
                  log: EpisodeLog | None = None, **overrides: Any) -> AsyncIterator[Episode]:
    """``async with episode(engine, task) as ep:`` — reset on entry (``ep.observation``),
    closed on exit. Keyword ``overrides`` replace fields of ``config`` (e.g. ``max_turns=5``)."""
    if overrides:
        base = (config or EpisodeConfig()).__dict__ | overrides
        config = EpisodeConfig(**base)
    ep = Episode(engine, task, config, log=log)
    await ep.reset()
    try:
        yield ep
    finally:
        await ep.close()
