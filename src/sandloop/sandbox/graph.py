"""Job graphs: runs that depend on other runs (``compile -> [test 1..n] -> checker``).

The typed model of a DAG of sandbox runs, and ``execute_graph``, which runs one over any runner
``async (Program, Limits) -> ExecResult``: each node starts as soon as all its parents ended
``ok``; a parent's collected files become the child's input files; a node whose parent failed
(any other status, or a declared file missing) is *cancelled*, with the reason and the status
that started the failure, and so are its descendants. The engine's ``Engine.run_graph`` admits,
prioritises and journals a whole graph as one job on top of this; the reward layer uses it
through a runner callable (it never imports the engine).

Artifacts are inputs by value: each child gets its own copy of a parent's file in its own
fresh work dir, so nothing one child does reaches another child or the parent's result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandloop.sandbox.models import (
    ExecResult,
    Limits,
    Program,
    Status,
    check_file_names,
    check_relative_path,
)

__all__ = ["Graph", "GraphResult", "GraphRunner", "Input", "Node", "NodeResult", "NodeRunner",
           "NodeState", "execute_graph", "execute_nodes"]

Runner = Callable[[Program, Limits], Awaitable[ExecResult]]


class Input(BaseModel):
    """What one node passes to another: ``node``'s collected ``file``, or with ``stdout=True``
    its standard output (e.g. a test's output for a checker), becomes the child's file ``to``
    (default: the same name as ``file``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str
    file: str | None = None
    stdout: bool = False
    to: str | None = None

    @model_validator(mode="after")
    def _source(self) -> Input:
        if (self.file is None) == (not self.stdout):
            raise ValueError("an input takes either a collected file (file=...) or the "
                             "parent's output (stdout=True), not both or neither")
        if self.stdout and self.to is None:
            raise ValueError("an input from stdout needs a file name: to=...")
        return self

    @property
    def target(self) -> str:
        target = self.to or self.file
        assert target is not None
        return target


class Node(BaseModel):
    """One run of a graph: a program, its limits, and what it waits for.

    ``after`` lists the parents that must end ``ok`` first; the nodes named by ``inputs`` are
    parents too (implicitly). Input files join the program's own ``files``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, max_length=256)
    program: Program
    limits: Limits = Field(default_factory=Limits)
    after: tuple[str, ...] = ()
    inputs: tuple[Input, ...] = ()

    @property
    def parents(self) -> tuple[str, ...]:
        seen = dict.fromkeys((*self.after, *(i.node for i in self.inputs)))
        return tuple(seen)


class Graph(BaseModel):
    """A DAG of nodes, checked on construction (unique ids, known parents, no cycle, inputs
    that their parent collects, input names that fit the child's files)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nodes: tuple[Node, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _dag(self) -> Graph:
        by_id: dict[str, Node] = {}
        for n in self.nodes:
            if n.id in by_id:
                raise ValueError(f"node id {n.id!r} is used twice; node ids must be unique")
            by_id[n.id] = n
        for n in self.nodes:
            for p in n.parents:
                if p not in by_id:
                    raise ValueError(f"node {n.id!r} depends on {p!r}, which is not a node")
                if p == n.id:
                    raise ValueError(f"node {n.id!r} depends on itself")
            for i in n.inputs:
                if i.file is not None and i.file not in by_id[i.node].program.collect:
                    raise ValueError(f"node {n.id!r} takes {i.file!r} from {i.node!r}, which "
                                     f"does not collect it: add it to that program's collect")
                check_relative_path(i.target)
                if i.target in n.program.files:
                    raise ValueError(f"node {n.id!r}: input {i.target!r} would replace one of "
                                     "its own files; choose another name with 'to'")
            # The files the node will get must be laid out together (no 'a' and 'a/b').
            targets = [i.target for i in n.inputs]
            if len(set(targets)) != len(targets):
                raise ValueError(f"node {n.id!r} takes two inputs under one name")
            check_file_names([*n.program.files, *targets])
        self.order()  # raises on a cycle
        return self

    def order(self) -> list[Node]:
        """The nodes in a topological order (parents first; ties in declaration order)."""
        by_id = {n.id: n for n in self.nodes}
        done: set[str] = set()
        out: list[Node] = []
        visiting: set[str] = set()

        def visit(n: Node) -> None:
            if n.id in done:
                return
            if n.id in visiting:
                raise ValueError(f"the graph has a cycle through {n.id!r}")
            visiting.add(n.id)
            for p in n.parents:
                visit(by_id[p])
            visiting.discard(n.id)
            done.add(n.id)
            out.append(n)

        for n in self.nodes:
            visit(n)
        return out


class NodeState(StrEnum):
    DONE = "done"  # it ran; ``result`` says how it ended
    CANCELLED = "cancelled"  # it never ran: a parent failed (``reason``, ``cause``)


class NodeResult(BaseModel):
    """What became of one node. A cancelled node's ``cause`` is the status of the run whose
    failure cancelled it (``sandbox_error``: the infrastructure's fault, passed down)."""

    model_config = ConfigDict(frozen=True)

    id: str
    state: NodeState
    result: ExecResult | None = None
    reason: str | None = None
    cause: Status | None = None

    @property
    def ok(self) -> bool:
        return self.state is NodeState.DONE and self.result is not None and self.result.ok


class GraphResult(BaseModel):
    """Every node's outcome, by node id, in the graph's declaration order."""

    model_config = ConfigDict(frozen=True)

    nodes: dict[str, NodeResult]

    def __getitem__(self, node_id: str) -> NodeResult:
        return self.nodes[node_id]

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes.values())


GraphRunner = Callable[[Graph], Awaitable[GraphResult]]


def _failure(node_id: str, r: NodeResult, child: Node) -> tuple[str, Status | None] | None:
    """Why ``child`` cannot run after parent ``r`` (None: it can, as far as ``r`` goes)."""
    if r.state is NodeState.CANCELLED:
        return f"parent {node_id!r} was cancelled: {r.reason}", r.cause
    assert r.result is not None
    if r.result.status is not Status.OK:
        return f"parent {node_id!r} ended {r.result.status.value}", r.result.status
    for i in child.inputs:
        if i.node == node_id and i.file is not None and i.file not in r.result.files:
            return (f"parent {node_id!r} left no file {i.file!r}",
                    Status.RUNTIME_ERROR)
    return None


NodeRunner = Callable[[Node, Program], Awaitable[ExecResult]]


async def execute_graph(graph: Graph, run: Runner) -> GraphResult:
    """Run ``graph`` with ``run``: each node as soon as its parents ended ``ok``, independent
    nodes concurrently; a failed parent cancels its descendants. Exceptions of ``run`` (the
    engine's DeadlineExceeded, cancellation) propagate and cancel the nodes still running."""

    async def run_node(n: Node, program: Program) -> ExecResult:
        return await run(program, n.limits)

    return await execute_nodes(graph, run_node)


async def execute_nodes(graph: Graph, run: NodeRunner) -> GraphResult:
    """``execute_graph`` with a runner that is told which node it runs (``run(node,
    program)``, ``program`` being the node's with its inputs added): the engine keys each
    node's job by it."""
    by_id = {n.id: n for n in graph.nodes}
    done: dict[str, asyncio.Future[NodeResult]] = {}
    loop = asyncio.get_running_loop()
    for n in graph.nodes:
        done[n.id] = loop.create_future()

    async def one(n: Node) -> None:
        parents = {p: await done[p] for p in n.parents}
        for p, r in parents.items():
            why = _failure(p, r, n)
            if why is not None:
                done[n.id].set_result(NodeResult(id=n.id, state=NodeState.CANCELLED,
                                                 reason=why[0], cause=why[1]))
                return
        files = dict(n.program.files)
        for i in n.inputs:
            res = parents[i.node].result
            assert res is not None
            files[i.target] = (res.stdout.encode("utf-8", "surrogateescape") if i.file is None
                               else res.files[i.file])
        program = n.program.model_copy(update={"files": files}) if n.inputs else n.program
        result = await run(n, program)
        done[n.id].set_result(NodeResult(id=n.id, state=NodeState.DONE, result=result))

    async with asyncio.TaskGroup() as tg:
        for n in graph.order():
            tg.create_task(one(by_id[n.id]))
    return GraphResult(nodes={n.id: done[n.id].result() for n in graph.nodes})
