"""An in-memory backend for testing engine logic and trainer integrations without sandboxes.

``ScriptedBackend`` implements both halves of the engine's ``Backend`` protocol (execution and
workspaces) in process: nothing is isolated or executed. Each run's result comes from a function
of the program (by default an ``ok`` result with empty output), so retries, fairness, deadlines,
the journal and session bookkeeping can be exercised in milliseconds, without root or slots.
Faults are injected explicitly (``fail_first``), never at random, so tests stay deterministic.

It is a test double, never a way to run code: the engine refuses nothing it returns, so do not
point a real workload at it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sandloop.engine.backends import WorkspaceLost
from sandloop.sandbox.models import ExecResult, Limits, Program, Status

__all__ = ["ScriptedBackend", "ScriptedWorkspace"]

Script = Callable[[Program, Limits], ExecResult | Awaitable[ExecResult]]

_OK = ExecResult(status=Status.OK)


def _always_ok(program: Program, limits: Limits) -> ExecResult:
    return _OK


@dataclass
class ScriptedWorkspace:
    """A workspace's files, kept in memory."""

    limits: Limits
    files: dict[str, bytes] = field(default_factory=dict)
    closed: bool = False


class ScriptedBackend:
    """A backend whose runs are answered by ``script(program, limits)`` (sync or async).

    ``fail_first=N`` makes the first N ``execute`` calls return ``sandbox_error`` (an injected
    infrastructure failure, for retry tests). An async script is held to ``limits.time_s`` as a
    real run is (``timeout`` past it). ``calls`` counts ``execute``/``run_in`` calls and
    ``max_concurrent`` the most that were in flight at once. Runs in a workspace see its files
    through ``program.files``, merged in for the script's benefit.
    """

    def __init__(self, script: Script = _always_ok, *, slots: int = 4, retryable: bool = True,
                 fail_first: int = 0) -> None:
        self._script = script
        self._slots = slots
        self._retryable = retryable
        self._failures_left = fail_first
        self.calls = 0
        self.running = 0
        self.max_concurrent = 0
        self.started = False
        self.closed = False
        self.workspaces: list[ScriptedWorkspace] = []

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def retryable(self) -> bool:
        return self._retryable

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.closed = True

    async def _answer(self, program: Program, limits: Limits) -> ExecResult:
        self.calls += 1
        self.running += 1
        self.max_concurrent = max(self.max_concurrent, self.running)
        try:
            if self._failures_left > 0:
                self._failures_left -= 1
                return ExecResult.sandbox_error("injected infrastructure failure (ScriptedBackend)")
            out = self._script(program, limits)
            if isinstance(out, ExecResult):
                return out
            try:  # like a real backend, a run never outlives its wall limit
                return await asyncio.wait_for(out, limits.time_s)
            except TimeoutError:
                return ExecResult(status=Status.TIMEOUT, wall_time_s=limits.time_s)
        finally:
            self.running -= 1

    async def execute(self, program: Program, limits: Limits, *,
                      on_end: Callable[[], None] | None = None) -> ExecResult:
        result = await self._answer(program, limits)
        if on_end is not None:
            on_end()
        return result

    async def open_workspace(self, limits: Limits) -> ScriptedWorkspace:
        ws = ScriptedWorkspace(limits)
        self.workspaces.append(ws)
        return ws

    def _live(self, workspace: object) -> ScriptedWorkspace:
        if not isinstance(workspace, ScriptedWorkspace):
            raise TypeError(f"not a ScriptedWorkspace: {workspace!r}")
        if workspace.closed:
            raise WorkspaceLost("the workspace was closed")
        return workspace

    async def run_in(self, workspace: object, program: Program, limits: Limits) -> ExecResult:
        ws = self._live(workspace)
        files: dict[str, str | bytes] = {**ws.files, **program.files}
        return await self._answer(program.model_copy(update={"files": files}), limits)

    async def write_files(self, workspace: object, files: Mapping[str, str | bytes]) -> None:
        ws = self._live(workspace)
        for path, content in files.items():
            ws.files[path] = content.encode() if isinstance(content, str) else content

    async def read_files(self, workspace: object, paths: Sequence[str]) -> dict[str, bytes]:
        ws = self._live(workspace)
        return {p: ws.files[p] for p in paths if p in ws.files}

    async def close_workspace(self, workspace: object) -> None:
        self._live(workspace).closed = True
