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
import inspect
import itertools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sandloop.engine.backends import Backend, WorkspaceLost, copy_base_in
from sandloop.engine.cluster import NodeInfo, NodeLost
from sandloop.sandbox.models import ExecResult, Limits, Program, Status

__all__ = ["ScriptedBackend", "ScriptedNodes", "ScriptedWorkspace"]

T = TypeVar("T")

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

    async def open_workspace(self, limits: Limits, *, environment: str | None = None,
                             base: Mapping[str, bytes] | None = None) -> ScriptedWorkspace:
        ws = ScriptedWorkspace(limits)
        self.workspaces.append(ws)
        return await copy_base_in(self, ws, base)

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


def _implements_backend(backend: ScriptedBackend) -> Backend:
    # Never called. mypy checks here that ScriptedBackend implements Backend with the same
    # signatures (isinstance on the runtime-checkable protocol compares only names): a double
    # that loses step with the protocol fails `make test`, not its users at run time.
    return backend


class _ScriptedNode:
    __slots__ = ("backend", "dead", "frozen", "inflight", "info", "isolation")

    def __init__(self, info: NodeInfo, backend: ScriptedBackend, isolation: str) -> None:
        self.info = info
        self.backend = backend
        self.isolation = isolation
        self.dead = False
        self.frozen = False
        self.inflight: set[asyncio.Future[Any]] = set()


class _ScriptedNodeClient:
    """A NodeClient over one scripted node; raises NodeLost once the node is removed."""

    def __init__(self, node: _ScriptedNode) -> None:
        self._node = node

    @property
    def isolation(self) -> str:
        return self._node.isolation

    @property
    def transport(self) -> str:
        return "in-process"

    async def _guard(self, coro: Awaitable[T]) -> T:
        node = self._node
        if node.dead:
            if inspect.iscoroutine(coro):
                coro.close()
            raise NodeLost(f"node {node.info.node_id} is gone")
        if node.frozen:  # alive, never answering: the call waits until it is cancelled
            if inspect.iscoroutine(coro):
                coro.close()
            await asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(coro)
        node.inflight.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if node.dead and (me is None or not me.cancelling()):
                raise NodeLost(f"node {node.info.node_id} died during the call") from None
            raise
        finally:
            node.inflight.discard(task)

    async def execute(self, program: Program, limits: Limits) -> ExecResult:
        return await self._guard(self._node.backend.execute(program, limits))

    async def open_workspace(self, limits: Limits, *, environment: str | None = None
                             ) -> ScriptedWorkspace:
        return await self._guard(self._node.backend.open_workspace(limits,
                                                                   environment=environment))

    async def run_in(self, workspace: Any, program: Program, limits: Limits) -> ExecResult:
        return await self._guard(self._node.backend.run_in(workspace, program, limits))

    async def write_files(self, workspace: Any, files: Mapping[str, str | bytes]) -> None:
        await self._guard(self._node.backend.write_files(workspace, files))

    async def read_files(self, workspace: Any, paths: Sequence[str]) -> dict[str, bytes]:
        return await self._guard(self._node.backend.read_files(workspace, paths))

    async def close_workspace(self, workspace: Any) -> None:
        await self._guard(self._node.backend.close_workspace(workspace))

    async def close(self) -> None:
        await self._node.backend.close()


class ScriptedNodes:
    """A ``cluster.NodeSource`` of in-process nodes, each answered by a ``ScriptedBackend``.

    For testing ``ClusterBackend`` (placement, joins, node loss, pinned sessions) and simulating
    large clusters without machines: ``add`` a node (it is discovered at the next refresh),
    ``kill`` one (calls in flight on it raise ``NodeLost``, an injected fault, and it is gone
    from discovery). ``isolation="unavailable"`` adds a node that cannot isolate.
    """

    def __init__(self, script: Script = _always_ok, *, nodes: int = 0, cpus: float = 1.0,
                 memory_mb: int = 4096, slots_per_cpu: float = 2.0) -> None:
        self._script = script
        self._cpus = cpus
        self._memory_mb = memory_mb
        self._slots_per_cpu = slots_per_cpu
        self._ids = itertools.count(1)
        self.nodes: dict[str, _ScriptedNode] = {}
        self.attached: list[str] = []
        for _ in range(nodes):
            self.add()

    def add(self, *, cpus: float | None = None, memory_mb: int | None = None,
            isolation: str = "full", address: str = "127.0.0.1") -> str:
        cpus = self._cpus if cpus is None else cpus
        nid = f"node{next(self._ids):04d}"
        slots = max(1, int(cpus * self._slots_per_cpu))
        info = NodeInfo(nid, address, cpus,
                        self._memory_mb if memory_mb is None else memory_mb, slots)
        self.nodes[nid] = _ScriptedNode(info, ScriptedBackend(self._script, slots=slots),
                                        isolation)
        return nid

    def drain(self, node_id: str) -> None:
        """The node leaves discovery (no new work) while its runs in flight finish."""
        self.nodes.pop(node_id)

    def freeze(self, node_id: str) -> None:
        """The node stays in discovery and alive, and never answers a call again (a stopped
        process, a wedged loop): a fault neither Ray nor TCP reports."""
        self.nodes[node_id].frozen = True

    def kill(self, node_id: str) -> None:
        node = self.nodes.pop(node_id)
        node.dead = True
        for task in list(node.inflight):
            task.cancel()

    async def connect(self) -> None:
        return None

    async def discover(self) -> list[NodeInfo]:
        return [n.info for n in self.nodes.values()]

    async def attach(self, node: NodeInfo) -> _ScriptedNodeClient:
        self.attached.append(node.node_id)
        return _ScriptedNodeClient(self.nodes[node.node_id])

    async def disconnect(self) -> None:
        return None
