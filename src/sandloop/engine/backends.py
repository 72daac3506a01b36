"""Where the engine's jobs run: the backend protocol and the local slot-pool backend.

The engine schedules; a backend executes. ``LocalBackend`` wraps one ``SandboxPool`` on this
machine. A cluster backend (one pool per node, e.g. Ray actors) implements the same protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from sandloop.sandbox.languages import spec_for
from sandloop.sandbox.models import ExecResult, Limits, Program
from sandloop.sandbox.pool import SandboxPool, WorkspaceLost

__all__ = ["Backend", "Capacity", "ElasticBackend", "Executor", "LocalBackend", "WorkspaceLost",
           "Workspaces", "copy_base_in", "declared_memory_mb"]

_COMPILED: dict[str, bool] = {}
_W = TypeVar("_W")


def _compiled(language: str) -> bool:
    compiled = _COMPILED.get(language)
    if compiled is None:
        try:
            compiled = spec_for(language, ()).compile is not None
        except Exception:  # unavailable language: the backend reports it as the result
            compiled = False
        _COMPILED[language] = compiled
    return compiled


def declared_memory_mb(program: Program, limits: Limits) -> int:
    """The memory a run of ``program`` may use at its peak, as admission counts it.

    A compiled language's compile step runs under its own (usually larger) memory limit.
    """
    if _compiled(program.language):
        return max(limits.memory_mb, limits.compile_memory_limit_mb)
    return limits.memory_mb


def declared_wall_s(program: Program, limits: Limits) -> float:
    """The longest a run of ``program`` may take once it starts: its wall limit, plus its
    compile step's for a compiled language."""
    if _compiled(program.language):
        return limits.time_s + limits.compile_time_limit_s
    return limits.time_s


async def copy_base_in(backend: Workspaces, workspace: _W,
                       base: Mapping[str, bytes] | None) -> _W:
    """``workspace`` with ``base`` written in, for backends with no copy-on-write bases
    (remote nodes: the files go over the wire); a workspace the files do not fit is closed
    before the error propagates, so that a failed open holds nothing."""
    if base:
        try:
            await backend.write_files(workspace, base)
        except BaseException:
            await backend.close_workspace(workspace)
            raise
    return workspace


@runtime_checkable
class Executor(Protocol):
    """Execution: what the engine needs to run one-shot jobs.

    ``execute`` returns an ExecResult for every program it ran, including the program's own
    failures; it reports infrastructure failures as ``status == "sandbox_error"`` (or raises),
    which the engine retries (it is the only layer that does, see engine/retry.py).
    """

    @property
    def slots(self) -> int:
        """How many runs can execute at once."""
        ...

    @property
    def retryable(self) -> bool:
        """False when every run would fail the same way (e.g. the host cannot isolate)."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def execute(self, program: Program, limits: Limits, *,
                      on_end: Callable[[], None] | None = None) -> ExecResult:
        """Run ``program``; call ``on_end`` (if given) when it has stopped using the CPU and
        only cleanup is left: the engine admits the next job's CPU then. A backend may call it
        late or never (the engine releases everything when the result comes)."""
        ...


@runtime_checkable
class Workspaces(Protocol):
    """Workspaces: work dirs whose files persist between runs (engine sessions, episodes).

    Every method raises ``WorkspaceLost`` when the workspace's files are gone (its slot
    restarted, its node left).
    """

    async def open_workspace(self, limits: Limits, *, environment: str | None = None,
                             base: Mapping[str, bytes] | None = None) -> Any:
        """A work dir whose files persist, in ``environment`` (None: the default one), with
        ``base``'s files in it (a backend may share them copy-on-write between workspaces)."""
        ...

    async def run_in(self, workspace: Any, program: Program, limits: Limits) -> ExecResult: ...

    async def write_files(self, workspace: Any, files: Mapping[str, str | bytes]) -> None: ...

    async def read_files(self, workspace: Any, paths: Sequence[str]) -> dict[str, bytes]: ...

    async def close_workspace(self, workspace: Any) -> None: ...


@runtime_checkable
class Backend(Executor, Workspaces, Protocol):
    """What the engine needs from a backend: execution and workspaces (``LocalBackend``, the
    cluster backends, and ``engine.testing.ScriptedBackend`` for tests without sandboxes)."""


@dataclass(frozen=True)
class Capacity:
    """What a backend offers now: totals over its nodes, and the largest one node offers
    (one job runs on one node, so it can never declare more than that)."""

    slots: int
    memory_mb: int
    cpus: float
    node_memory_mb: int
    node_cpus: float


@runtime_checkable
class ElasticBackend(Backend, Protocol):
    """A backend whose capacity changes while it runs (a cluster: nodes join and leave).

    The engine admits jobs by ``capacity()`` instead of its local defaults, and calls it again
    whenever the backend signals a change through the callback given to ``on_capacity``.
    """

    def capacity(self) -> Capacity: ...

    def on_capacity(self, callback: Callable[[], None]) -> None: ...


class LocalBackend:
    """A ``SandboxPool`` of warm fork-server slots on this machine."""

    def __init__(self, pool: SandboxPool) -> None:
        self.pool = pool

    @property
    def slots(self) -> int:
        return self.pool.max_size  # the pool grows to this under demand

    @property
    def retryable(self) -> bool:
        return self.pool.isolation_level != "unavailable"

    async def start(self) -> None:
        await self.pool.start()

    async def close(self) -> None:
        await self.pool.close()

    async def execute(self, program: Program, limits: Limits, *,
                      on_end: Callable[[], None] | None = None) -> ExecResult:
        return await self.pool.run(program, limits, on_end=on_end)

    async def open_workspace(self, limits: Limits, *, environment: str | None = None,
                             base: Mapping[str, bytes] | None = None) -> Any:
        return await self.pool.open_workspace(limits, environment=environment, base=base)

    async def run_in(self, workspace: Any, program: Program, limits: Limits) -> ExecResult:
        return await self.pool.run_in(workspace, program, limits)

    async def write_files(self, workspace: Any, files: Mapping[str, str | bytes]) -> None:
        await self.pool.write_files(workspace, dict(files))

    async def read_files(self, workspace: Any, paths: Sequence[str]) -> dict[str, bytes]:
        return await self.pool.read_files(workspace, list(paths))

    async def close_workspace(self, workspace: Any) -> None:
        await self.pool.close_workspace(workspace)
