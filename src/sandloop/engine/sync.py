"""A blocking wrapper around Engine for scripts and notebooks (no asyncio in the caller).

The engine runs on its own event loop in a background thread (``_aio.LoopThread``, the bridge the
trainer adapters' Scorer uses too); each call blocks until its answer. Safe to use from several
threads at once.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, Coroutine, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from sandloop import _aio as aio
from sandloop.engine.engine import Engine, ProgramItem
from sandloop.engine.repeat import RepeatedResult
from sandloop.engine.session import Session
from sandloop.sandbox.graph import Graph, GraphResult
from sandloop.sandbox.models import ExecResult, Limits, Program

__all__ = ["SyncEngine", "SyncSession"]

R = TypeVar("R")


class SyncEngine:
    """``with SyncEngine() as engine: engine.run(program)``; takes Engine's arguments."""

    def __init__(self, **engine_kwargs: Any) -> None:
        self._kwargs = engine_kwargs
        self._loop = aio.LoopThread("sandloop-engine")
        self._engine: Engine | None = None
        self._start_lock = threading.Lock()  # threads that use it unstarted make one engine

    def _call(self, coro: Coroutine[Any, Any, R]) -> R:
        return self._loop.call(coro)

    @property
    def engine(self) -> Engine:
        """The underlying async Engine (use only from its loop); started on first use, so
        ``SyncEngine().run(...)`` works in a script (``close()`` it, or use ``with``)."""
        if self._engine is None:
            if self._loop.in_thread():
                raise RuntimeError("SyncEngine is not started: use 'with SyncEngine() as engine'")
            self.start()
        assert self._engine is not None
        return self._engine

    def start(self) -> None:
        """Start the background loop and the engine."""

        async def make() -> Engine:
            e = Engine(**self._kwargs)
            await e.start()
            return e

        with self._start_lock:
            if self._engine is None:
                self._engine = self._call(make())

    def close(self) -> None:
        """Close the engine and stop the background loop."""
        if self._engine is not None:
            self._call(self._engine.close())
            self._engine = None
        self._loop.stop()

    def __enter__(self) -> SyncEngine:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def run(self, program: Program, limits: Limits | None = None, **kw: Any) -> ExecResult:
        """Blocking ``Engine.run``."""
        return self._call(self.engine.run(program, limits, **kw))

    def run_repeated(self, program: Program, limits: Limits | None = None,
                     **kw: Any) -> RepeatedResult:
        """Blocking ``Engine.run_repeated``."""
        return self._call(self.engine.run_repeated(program, limits, **kw))

    def run_graph(self, graph: Graph, **kw: Any) -> GraphResult:
        """Blocking ``Engine.run_graph``."""
        return self._call(self.engine.run_graph(graph, **kw))

    def map(self, programs: Iterable[ProgramItem], limits: Limits | None = None,
            **kw: Any) -> list[ExecResult]:
        """Run all ``programs``; results in input order."""
        items = list(programs)
        engine = self.engine

        async def go() -> list[ExecResult]:
            out: list[ExecResult | None] = [None] * len(items)
            async for i, r in engine.stream(items, limits, **kw):
                out[i] = r
            return [r for r in out if r is not None]

        return self._call(go())

    def stream(self, programs: Iterable[ProgramItem], limits: Limits | None = None,
               **kw: Any) -> Iterator[tuple[int, ExecResult]]:
        """Blocking ``Engine.stream``: ``(index, result)`` pairs as they finish."""
        agen = self.engine.stream(programs, limits, **kw)
        try:
            while True:
                try:
                    yield self._call(_next(agen))
                except StopAsyncIteration:
                    return
        finally:
            self._call(agen.aclose())

    def session(self, **kw: Any) -> SyncSession:
        """Blocking ``Engine.open_session``; use as ``with engine.session() as s:``."""
        return SyncSession(self, self._call(self.engine.open_session(**kw)))


class SyncSession:
    """Blocking view of a Session."""

    def __init__(self, owner: SyncEngine, session: Session) -> None:
        self._owner = owner
        self.session = session

    def run(self, command: str, **kw: Any) -> ExecResult:
        return self._owner._call(self.session.run(command, **kw))

    def run_code(self, source: str, **kw: Any) -> ExecResult:
        return self._owner._call(self.session.run_code(source, **kw))

    def run_program(self, program: Program, limits: Limits | None = None,
                    **kw: Any) -> ExecResult:
        return self._owner._call(self.session.run_program(program, limits, **kw))

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        self._owner._call(self.session.write_files(files))

    def read_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        return self._owner._call(self.session.read_files(paths))

    def close(self) -> None:
        self._owner._call(self.session.close())

    def __enter__(self) -> SyncSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _next(agen: AsyncGenerator[tuple[int, ExecResult], None]) -> tuple[int, ExecResult]:
    return await agen.__anext__()
