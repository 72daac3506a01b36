"""Multi-turn sessions: a persistent work dir that keeps files between runs.

A session's files live in one sandbox slot (a tmpfs in that slot's fork-server); between runs it
holds no process, so an idle session costs only its files. Runs go through the engine's scheduler
like any job (priority, fairness, admission), then execute in that slot with ``/sandbox`` = the
session's work dir. The engine's reaper deletes sessions idle longer than ``idle_timeout_s`` or
older than ``ttl_s``.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sandloop.engine.errors import SessionClosed, SessionExpired, SessionFull, SessionLost
from sandloop.sandbox.models import ExecResult, Limits, Program, check_relative_path
from sandloop.sandbox.pool import WorkspaceFull, WorkspaceLost, workspace_mb

logger = logging.getLogger(__name__)

T = TypeVar("T")

if TYPE_CHECKING:
    from sandloop.engine.engine import Engine

__all__ = ["Session"]

_ids = itertools.count(1)
# Ids never repeat across processes: after a restart, an old session's id names no session
# (404), not a new session of the same client that a retrying client would then write into.
_PROCESS = secrets.token_hex(4)


class Session:
    """A multi-turn sandbox: files written or created by runs persist until it closes.

    Obtain one with ``Engine.session(...)`` (closed on exit) or ``Engine.open_session(...)``.
    Every method raises SessionExpired after the reaper took it, SessionClosed after ``close()``,
    SessionLost if its sandbox slot died.
    """

    def __init__(self, engine: Engine, workspace: Any, *, language: str, limits: Limits,
                 ttl_s: float, idle_timeout_s: float, priority: int, client: str) -> None:
        self.id = f"s{next(_ids)}-{_PROCESS}"
        self.engine = engine
        self.workspace = workspace
        self.language = Program(language=language, source="").language
        self.limits = limits
        # What its files may take (the work dir's size), counted against the engine's
        # session_memory_mb while it is open.
        self.storage_mb = workspace_mb(limits)
        self.ttl_s = ttl_s
        self.idle_timeout_s = idle_timeout_s
        self.priority = priority
        self.client = client
        self.created_at = time.monotonic()
        self.last_used = self.created_at
        self.runs = 0
        self._busy = 0
        self._ended: str | None = None  # "closed" | why it expired | "lost"

    # -- state ----------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once closed, expired or lost."""
        return self._ended is not None

    def _expiry(self, now: float) -> str | None:
        """Why the session should be reaped now, or None (never while an operation runs)."""
        if self._ended is not None or self._busy:
            return None
        if now - self.created_at > self.ttl_s:
            return f"expired: older than its ttl_s={self.ttl_s:g}"
        if now - self.last_used > self.idle_timeout_s:
            return f"expired: idle longer than idle_timeout_s={self.idle_timeout_s:g}"
        return None

    def _enter(self) -> None:
        # Expiry is decided here too, not only by the reaper's next pass, so a session is never
        # usable past its deadline (the reaper deletes the files).
        reason = self._ended or self._expiry(time.monotonic())
        if reason is not None:
            if reason == "closed":
                raise SessionClosed(f"session {self.id} is closed")
            if reason.startswith("lost"):
                raise SessionLost(f"session {self.id} was {reason}; open a new session")
            raise SessionExpired(f"session {self.id} {reason}; its files are gone: open a new "
                                 "session (or raise ttl_s / idle_timeout_s)")
        self._busy += 1

    def _leave(self) -> None:
        self._busy -= 1
        self.last_used = time.monotonic()

    # -- operations -----------------------------------------------------------------------------
    async def run(self, command: str, *, stdin: str | bytes | None = None,
                  limits: Limits | None = None, timeout_s: float | None = None) -> ExecResult:
        """Run a shell (bash) command in the session's work dir, e.g. ``"python sol.py"``."""
        return await self.run_program(Program(language="bash", source=command, stdin=stdin),
                                      limits, timeout_s=timeout_s)

    async def run_code(self, source: str, *, stdin: str | bytes | None = None,
                       limits: Limits | None = None,
                       timeout_s: float | None = None) -> ExecResult:
        """Run ``source`` in the session's language, in the session's work dir."""
        return await self.run_program(Program(language=self.language, source=source,
                                              stdin=stdin), limits, timeout_s=timeout_s)

    async def run_program(self, program: Program, limits: Limits | None = None, *,
                          timeout_s: float | None = None) -> ExecResult:
        """Run ``program`` with the session's work dir as ``/sandbox``; its files persist.

        ``program.files`` are written first (and stay), as in a plain run.
        """
        self._enter()
        try:
            self.runs += 1
            return await self.engine._run_in_session(self, program, limits or self.limits,
                                                     timeout_s)
        except SessionLost:
            self._ended = "lost: its sandbox slot died"
            self.engine._session_gone(self)
            raise
        finally:
            self._leave()

    async def write_files(self, files: Mapping[str, str | bytes]) -> None:
        """Create or replace files (paths relative to the work dir); raises SessionFull when
        they do not fit (the work dir holds at most ``storage_mb``)."""
        for name in files:
            check_relative_path(name)
        try:
            await self._on_workspace(self.engine.backend.write_files(self.workspace, files))
        except WorkspaceFull as e:
            raise SessionFull(f"session {self.id}: {e}") from None

    async def read_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        """Regular files among ``paths`` (missing files, symlinks and specials are left out)."""
        for name in paths:
            check_relative_path(name)
        files: dict[str, bytes] = await self._on_workspace(
            self.engine.backend.read_files(self.workspace, paths))
        return files

    async def _on_workspace(self, op: Awaitable[T]) -> T:
        """Run a file operation on the session's workspace; a lost workspace ends the session."""
        try:
            self._enter()
        except BaseException:
            if inspect.iscoroutine(op):
                op.close()  # never started: no "never awaited" warning
            raise
        try:
            return await op
        except WorkspaceLost as e:
            self._ended = "lost: its sandbox slot died"
            self.engine._session_gone(self)
            raise SessionLost(f"session {self.id} lost its files: {e}") from e
        finally:
            self._leave()

    async def close(self) -> None:
        """Delete the session and its files (idempotent)."""
        if self._ended is None:
            await self._shutdown("closed")

    async def _shutdown(self, reason: str) -> None:
        if self._ended is None:
            self._ended = reason
        self.engine._session_gone(self)
        try:
            await self.engine.backend.close_workspace(self.workspace)
        except WorkspaceLost as e:  # already gone with its slot
            logger.debug("session %s: workspace already gone: %s", self.id, e)

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
