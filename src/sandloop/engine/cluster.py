"""One backend over many nodes: placement, elasticity and node loss (see docs/cluster.md).

``ClusterBackend`` implements the engine's ``Backend`` protocol over a set of nodes, each with
its own slot pool. It does not know how nodes are found or reached: a ``NodeSource`` discovers
them and attaches a ``NodeClient`` to each (``ray_backend.RayNodes``: one Ray actor per node;
tests and the 50-node simulation use in-process clients). What it owns:

- placement: a job goes to a node with a free slot and enough free declared memory, the one
  left least loaded by its dominant resource (slots or memory) — balancing both keeps a node
  from having free slots but no memory, or memory but no slots (stranded capacity);
- elasticity: the node set is refreshed every ``refresh_s``; a node that joins gets work as soon
  as its pool is up, one that leaves gets none, and the engine is told the new capacity;
- node loss: a run whose node died comes back as ``sandbox_error`` naming the node (an
  infrastructure failure: the engine, the one owner of retries, runs it again elsewhere);
  sessions are pinned to their node and end with ``WorkspaceLost`` when it goes. A node that
  is alive but does not answer a run within that run's deadline (``run_deadline_s``: a stuck or
  stopped node, which neither Ray nor TCP reports) counts as lost the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sandloop.engine.backends import (
    Capacity,
    WorkspaceLost,
    copy_base_in,
    declared_memory_mb,
    declared_wall_s,
)
from sandloop.errors import EngineError
from sandloop.sandbox.models import ExecResult, Limits, Program, Status

__all__ = [
    "ClusterBackend",
    "ClusterUnavailable",
    "NodeClient",
    "NodeInfo",
    "NodeLost",
    "NodeSource",
    "NodeStatus",
    "choose_node",
    "fragmentation",
]

log = logging.getLogger("sandloop.cluster")

T = TypeVar("T")

RATE_WINDOW_S = 10.0  # runs/s is measured over this trailing window
# A run's answer is due within twice its own limits (it may wait on its node for one other run's
# CPU) plus this: room for a node's first-use environment build and a shipped environment. A
# liveness backstop for a node that neither dies nor answers, not a performance timer.
RUN_GRACE_S = 120.0


class ClusterUnavailable(EngineError, RuntimeError):
    """No node of the cluster can run sandloop jobs (none offers the ``sandloop`` resource,
    or none started its pool in time)."""


class NodeLost(EngineError, RuntimeError):
    """A node (or its pool) died while a call to it was in flight; raised by a NodeClient."""


@dataclass(frozen=True)
class NodeInfo:
    """A node as discovered: its identity and what it offers sandloop."""

    node_id: str
    address: str  # several nodes may share one address: pools are keyed by node_id
    cpus: float
    memory_mb: int
    slots: int


class NodeClient(Protocol):
    """Calls into one node's slot pool. Raises ``NodeLost`` when the node is gone."""

    @property
    def isolation(self) -> str:
        """The node's pool isolation level (``unavailable``: it cannot run untrusted code)."""
        ...

    @property
    def transport(self) -> str:
        """How runs reach the node now (``channel``, ``ray``: for status and metrics)."""
        ...

    async def execute(self, program: Program, limits: Limits) -> ExecResult: ...

    async def open_workspace(self, limits: Limits, *, environment: str | None = None
                             ) -> Any: ...

    async def run_in(self, workspace: Any, program: Program, limits: Limits) -> ExecResult: ...

    async def write_files(self, workspace: Any, files: Mapping[str, str | bytes]) -> None: ...

    async def read_files(self, workspace: Any, paths: Sequence[str]) -> dict[str, bytes]: ...

    async def close_workspace(self, workspace: Any) -> None: ...

    async def close(self) -> None: ...


class NodeSource(Protocol):
    """Finds the nodes that offer sandloop and starts a pool on each."""

    async def connect(self) -> None: ...

    async def discover(self) -> list[NodeInfo]:
        """The nodes alive now that offer sandloop."""
        ...

    async def attach(self, node: NodeInfo) -> NodeClient:
        """Start ``node``'s pool and return a client for it (may take seconds)."""
        ...

    async def disconnect(self) -> None: ...


@dataclass
class NodeStatus:
    """One node's state, for ``/metrics`` and ``sandloop cluster status``."""

    node_id: str
    address: str
    state: str  # "ready", "starting", "refused" (cannot isolate), "retiring" (left, runs
    # still in flight there: a drained node) or "lost"
    slots: int
    cpus: float
    memory_mb: int
    running: int = 0
    queued: int = 0  # session runs waiting for a slot of this (their pinned) node
    free_memory_mb: int = 0
    runs: int = 0
    failures: int = 0
    runs_per_s: float = 0.0
    reason: str = ""
    transport: str = ""  # how runs reach the node: "channel" (direct), "ray" (actor calls)


@dataclass
class _Node:
    info: NodeInfo
    client: NodeClient
    free_slots: int = 0
    free_memory_mb: int = 0
    running: int = 0
    queued: int = 0
    runs: int = 0
    failures: int = 0
    lost: bool = False
    done_at: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))

    def __post_init__(self) -> None:
        self.free_slots = self.info.slots
        self.free_memory_mb = self.info.memory_mb


def choose_node(nodes: Iterable[_Node], memory_mb: int) -> _Node | None:
    """The node to run a job declaring ``memory_mb`` on, or None when none fits now.

    Least dominant share after placement: the fuller of its slots and its memory once the job
    runs (ties: more free slots). Spreading this way keeps every node's free slots and free
    memory in proportion, so neither is stranded (slots without memory, or memory without
    slots).
    """
    best: _Node | None = None
    best_share = 2.0
    best_free = 0
    for n in nodes:  # inlined: this runs once per job over every node
        free = n.free_slots
        if free <= 0 or n.free_memory_mb < memory_mb or n.lost:
            continue
        info = n.info
        share = (info.slots - free + 1) / info.slots
        mem = (info.memory_mb - n.free_memory_mb + memory_mb) / info.memory_mb \
            if info.memory_mb > 0 else 1.0
        if mem > share:
            share = mem
        if share < best_share or (share == best_share and free > best_free):
            best, best_share, best_free = n, share, free
    return best


def fragmentation(free: Iterable[tuple[int, int]]) -> float:
    """The share of free memory no job can use now, over nodes given as
    ``(free_slots, free_memory_mb)``: memory on nodes without a free slot is stranded until a
    run there ends. 0: every free MiB is usable; 1: all of it is stranded.
    """
    total = 0
    stranded = 0
    for slots, mem in free:
        mem = max(0, mem)
        total += mem
        if slots <= 0:
            stranded += mem
    return 0.0 if total == 0 else stranded / total


@dataclass
class ClusterWorkspace:
    """A session's work dir on one node (pinned there: its files live in that node's pool)."""

    node_id: str
    handle: Any


class ClusterBackend:
    """The engine's backend over a cluster's nodes (see the module docstring).

    ``min_nodes``: ``start`` waits (up to ``start_timeout_s``) until that many nodes are ready.
    ``nodes_limit_cpu``: each node keeps its own CPU budget (Ray's pool actors do: a run's CPU
    goes to the next one on that node as soon as its program ends, which the driver learns only
    with the result); the engine then admits by slots alone, and one job by a node's cores.
    """

    def __init__(self, source: NodeSource, *, refresh_s: float = 1.0, min_nodes: int = 1,
                 start_timeout_s: float = 120.0, nodes_limit_cpu: bool = False,
                 run_grace_s: float = RUN_GRACE_S) -> None:
        self.source = source
        self.run_grace_s = run_grace_s
        self.nodes_limit_cpu = nodes_limit_cpu
        self.refresh_s = refresh_s
        self.min_nodes = min_nodes
        self.start_timeout_s = start_timeout_s
        self._nodes: dict[str, _Node] = {}
        self._retiring: list[_Node] = []  # gone from the cluster, runs still in flight there
        self._attaching: dict[str, asyncio.Task[None]] = {}
        self._refused: dict[str, NodeStatus] = {}
        self._lost: dict[str, NodeStatus] = {}
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._listeners: list[Callable[[], None]] = []
        self._refresher: asyncio.Task[None] | None = None
        self._changed: asyncio.Event | None = None
        self._closed = False
        self.lost_nodes = 0
        self.joined_nodes = 0

    # -- Backend protocol -------------------------------------------------------------------
    @property
    def slots(self) -> int:
        return sum(n.info.slots for n in self._nodes.values() if not n.lost)

    @property
    def retryable(self) -> bool:
        return True  # a failed run may succeed on another node

    def capacity(self) -> Capacity:
        live = [n.info for n in self._nodes.values() if not n.lost]
        return Capacity(
            slots=sum(i.slots for i in live),
            memory_mb=sum(i.memory_mb for i in live),
            cpus=float(sum(i.slots for i in live)) if self.nodes_limit_cpu
            else sum(i.cpus for i in live),
            node_memory_mb=max((i.memory_mb for i in live), default=0),
            node_cpus=max((i.cpus for i in live), default=0.0))

    def on_capacity(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    async def start(self) -> None:
        self._changed = asyncio.Event()
        await self.source.connect()
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while True:
                await self._refresh()
                if self._attaching:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(self._changed.wait()),
                                               self.refresh_s)
                    self._changed.clear()
                ready = sum(1 for n in self._nodes.values() if not n.lost)
                if ready >= self.min_nodes:
                    break
                if time.monotonic() > deadline:
                    refused = "; ".join(f"{s.node_id[:12]}: {s.reason}"
                                        for s in self._refused.values())
                    raise ClusterUnavailable(
                        f"{ready} of the {self.min_nodes} nodes needed are ready after "
                        f"{self.start_timeout_s:.0f} s"
                        + (f" (refused: {refused})" if refused else "")
                        + "; start nodes offering the resource, e.g. "
                        "ray start --address=HEAD:PORT --resources='{\"sandloop\": 1}', "
                        "and see docs/cluster.md")
                if not self._attaching:
                    await asyncio.sleep(self.refresh_s)
        except BaseException:
            await self.close()
            raise
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        for task in list(self._attaching.values()):
            task.cancel()
        if self._attaching:
            await asyncio.gather(*self._attaching.values(), return_exceptions=True)
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        await asyncio.gather(*(n.client.close() for n in self._nodes.values() if not n.lost),
                             *(n.client.close() for n in self._retiring),
                             return_exceptions=True)
        self._retiring.clear()
        self._nodes.clear()
        await self.source.disconnect()

    async def execute(self, program: Program, limits: Limits, *,
                      on_end: Callable[[], None] | None = None) -> ExecResult:
        memory = declared_memory_mb(program, limits)
        node = await self._place(memory)
        if node is None:
            return ExecResult.sandbox_error(
                "no node of the cluster can take this job now (every node left, or none has "
                f"{memory} MiB free); it is retried when nodes join")
        try:
            result = await self._answered(node, node.client.execute(program, limits),
                                          self.run_deadline_s(program, limits))
        except NodeLost as e:
            self._lose(node, str(e))
            return ExecResult.sandbox_error(
                f"node {node.info.node_id[:12]} ({node.info.address}) was lost during the run: "
                f"{e}")
        finally:
            self._release(node, memory)
        if result.status is Status.SANDBOX_ERROR:
            node.failures += 1
        return result

    async def open_workspace(self, limits: Limits, *, environment: str | None = None,
                             base: Mapping[str, bytes] | None = None) -> ClusterWorkspace:
        # A session holds storage, not a slot: the node with the most free memory holds it.
        live = [n for n in self._nodes.values() if not n.lost]
        if not live:
            raise WorkspaceLost("no node of the cluster is ready to hold a session")
        node = max(live, key=lambda n: (n.free_memory_mb, n.free_slots))
        try:
            handle = await node.client.open_workspace(limits, environment=environment)
        except NodeLost as e:
            self._lose(node, str(e))
            raise WorkspaceLost(f"node {node.info.node_id[:12]} was lost: {e}") from e
        # Copied in: nodes share no copy-on-write bases (yet).
        return await copy_base_in(self, ClusterWorkspace(node.info.node_id, handle), base)

    async def run_in(self, workspace: Any, program: Program, limits: Limits) -> ExecResult:
        node = self._pinned(workspace)
        memory = declared_memory_mb(program, limits)
        placed = await self._place(memory, only=node)
        if placed is None:
            raise WorkspaceLost(self._gone_message(node))
        try:
            return await self._answered(node, node.client.run_in(workspace.handle, program,
                                                                 limits),
                                        self.run_deadline_s(program, limits))
        except NodeLost as e:
            self._lose(node, str(e))
            raise WorkspaceLost(self._gone_message(node)) from e
        finally:
            self._release(node, memory)

    async def write_files(self, workspace: Any, files: Mapping[str, str | bytes]) -> None:
        node = self._pinned(workspace)
        try:
            await node.client.write_files(workspace.handle, files)
        except NodeLost as e:
            self._lose(node, str(e))
            raise WorkspaceLost(self._gone_message(node)) from e

    async def read_files(self, workspace: Any, paths: Sequence[str]) -> dict[str, bytes]:
        node = self._pinned(workspace)
        try:
            return await node.client.read_files(workspace.handle, paths)
        except NodeLost as e:
            self._lose(node, str(e))
            raise WorkspaceLost(self._gone_message(node)) from e

    async def close_workspace(self, workspace: Any) -> None:
        node = self._nodes.get(workspace.node_id)
        if node is None or node.lost:
            return  # its files went with the node
        try:
            await node.client.close_workspace(workspace.handle)
        except NodeLost as e:
            self._lose(node, str(e))

    def run_deadline_s(self, program: Program, limits: Limits) -> float:
        """How long a node may take to answer a run of ``program`` before it counts as lost."""
        return 2.0 * declared_wall_s(program, limits) + self.run_grace_s

    @staticmethod
    async def _answered(node: _Node, call: Coroutine[Any, Any, T], deadline_s: float) -> T:
        cm = asyncio.timeout(deadline_s)
        try:
            async with cm:
                return await call
        except TimeoutError:
            if not cm.expired():
                raise  # the call's own
            raise NodeLost(f"node {node.info.node_id[:12]} ({node.info.address}) did not answer "
                           f"a run within {deadline_s:.0f} s, twice its limits and "
                           "run_grace_s: stuck or stopped") from None

    # -- introspection ------------------------------------------------------------------------
    def status(self) -> list[NodeStatus]:
        """Every node known: ready ones with their load, starting, refused and lost ones."""
        now = time.monotonic()
        out = []
        for n in self._nodes.values():
            recent = sum(1 for t in n.done_at if t >= now - RATE_WINDOW_S)
            out.append(NodeStatus(
                n.info.node_id, n.info.address, "lost" if n.lost else "ready", n.info.slots,
                n.info.cpus, n.info.memory_mb, n.running, n.queued, n.free_memory_mb, n.runs,
                n.failures, round(recent / RATE_WINDOW_S, 3), transport=n.client.transport))
        for n in self._retiring:
            out.append(NodeStatus(
                n.info.node_id, n.info.address, "retiring", n.info.slots, n.info.cpus,
                n.info.memory_mb, n.running, n.queued, n.free_memory_mb, n.runs, n.failures,
                reason="left the cluster; finishing its runs in flight"))
        retiring = {n.info.node_id for n in self._retiring}
        for nid in self._attaching:
            if nid not in self._nodes:
                out.append(NodeStatus(nid, "", "starting", 0, 0.0, 0))
        out.extend(self._refused.values())
        out.extend(s for s in self._lost.values()
                   if s.node_id not in self._nodes and s.node_id not in retiring)
        return out

    def fragmentation(self) -> float:
        """The share of free memory stranded on nodes without a free slot, now."""
        return fragmentation((n.free_slots, n.free_memory_mb)
                             for n in self._nodes.values() if not n.lost)

    def stranded_memory_mb(self) -> int:
        """Free memory on nodes with no free slot: no job can use it until a run ends."""
        return sum(max(0, n.free_memory_mb) for n in self._nodes.values()
                   if not n.lost and n.free_slots <= 0)

    # -- placement ----------------------------------------------------------------------------
    async def _place(self, memory_mb: int, *, only: _Node | None = None) -> _Node | None:
        """Take a slot and ``memory_mb`` on the best node (or on ``only``), waiting while none
        fits. None when no node could ever take it (all gone, or ``only`` is lost)."""
        loop = asyncio.get_running_loop()
        while True:
            if only is not None:
                if only.lost or self._closed:
                    return None
                node = only if only.free_slots > 0 and only.free_memory_mb >= memory_mb \
                    else None
            else:
                node = choose_node(self._nodes.values(), memory_mb)
                live = [n for n in self._nodes.values() if not n.lost]
                if node is None and (self._closed or (not live and not self._attaching) or
                                     (all(n.info.memory_mb < memory_mb for n in live)
                                     and not self._attaching)):
                    return None
            if node is not None:
                node.free_slots -= 1
                node.free_memory_mb -= memory_mb
                node.running += 1
                return node
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append(fut)
            if only is not None:
                only.queued += 1
            try:
                await fut
            finally:
                if only is not None:
                    only.queued -= 1
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)

    def _release(self, node: _Node, memory_mb: int) -> None:
        node.free_slots += 1
        node.free_memory_mb += memory_mb
        node.running -= 1
        node.runs += 1
        node.done_at.append(time.monotonic())
        self._wake()

    def _wake(self) -> None:
        # Few waiters (the engine admits by the cluster's totals; a job waits here only when
        # free memory is scattered or it is pinned to a busy node): wake all, they re-check.
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    def _pinned(self, workspace: Any) -> _Node:
        if not isinstance(workspace, ClusterWorkspace):
            raise TypeError(f"not a ClusterWorkspace: {workspace!r}")
        node = self._nodes.get(workspace.node_id)
        if node is None or node.lost:
            raise WorkspaceLost(self._gone_message(node, workspace.node_id))
        return node

    @staticmethod
    def _gone_message(node: _Node | None, node_id: str = "") -> str:
        where = f"node {node.info.node_id[:12]} ({node.info.address})" if node is not None \
            else f"node {node_id[:12]}"
        return f"{where} left the cluster, and the session's files with it"

    # -- membership ---------------------------------------------------------------------------
    def _lose(self, node: _Node, reason: str) -> None:
        if node.lost:
            return
        node.lost = True
        node.failures += 1
        self.lost_nodes += 1
        info = node.info
        self._lost[info.node_id] = NodeStatus(info.node_id, info.address, "lost", info.slots,
                                              info.cpus, info.memory_mb, runs=node.runs,
                                              failures=node.failures, reason=reason[:200])
        log.warning("cluster node lost", extra={"node_id": info.node_id, "reason": reason})
        self._capacity_changed()

    def _capacity_changed(self) -> None:
        for cb in self._listeners:
            cb()
        self._wake()
        if self._changed is not None:
            self._changed.set()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self._refresh()
            except Exception as e:  # a flaky control plane must not stop the engine
                log.warning("cluster refresh failed", extra={"error": str(e)})

    async def _refresh(self) -> None:
        nodes = await self.source.discover()
        alive = {n.node_id for n in nodes}
        gone = False
        for nid, node in list(self._nodes.items()):
            if nid not in alive or node.lost:
                del self._nodes[nid]
                if not node.lost:
                    self._lose(node, "the node left the cluster (drained or stopped)")
                gone = True
                # No new work goes there; runs still in flight (a draining node's) finish.
                self._retiring.append(node)
        still: list[_Node] = []
        for node in self._retiring:
            if node.running > 0:
                still.append(node)
            else:
                try:
                    await node.client.close()
                except Exception as e:  # the node is gone already: nothing to release there
                    log.debug("closing retired node %s: %s: %s", node.info.node_id, type(e).__name__, e)
        self._retiring = still
        for nid in list(self._refused):
            if nid not in alive:
                del self._refused[nid]
        for info in nodes:
            nid = info.node_id
            if nid in self._nodes or nid in self._attaching or nid in self._refused:
                continue
            task = asyncio.get_running_loop().create_task(self._attach(info))
            self._attaching[nid] = task
        if gone:
            self._capacity_changed()

    async def _attach(self, info: NodeInfo) -> None:
        try:
            client = await self.source.attach(info)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("cluster node did not start", extra={"node_id": info.node_id,
                                                            "error": str(e)})
            return  # tried again at the next refresh
        finally:
            self._attaching.pop(info.node_id, None)
        if self._closed:
            await client.close()
            return
        if client.isolation == "unavailable":
            # Untrusted code never runs with less isolation than asked: such a node gets no
            # work (it shows as "refused" with the reason).
            self._refused[info.node_id] = NodeStatus(
                info.node_id, info.address, "refused", info.slots, info.cpus, info.memory_mb,
                reason="its sandbox pool cannot isolate (run sandloop doctor on that node)")
            await client.close()
            return
        self._lost.pop(info.node_id, None)
        self._nodes[info.node_id] = _Node(info, client)
        self.joined_nodes += 1
        log.info("cluster node joined", extra={"node_id": info.node_id, "slots": info.slots})
        self._capacity_changed()
