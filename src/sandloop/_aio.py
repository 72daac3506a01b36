"""The event loop sandloop's own entry points run on (CLI commands, the sync APIs), the one
bridge from sync code to async code (:class:`LoopThread`), and :func:`single_flight`, work that
many waiters share.

uvloop when it is installed (a dependency; it takes about a tenth of the supervisor's CPU per
run off compared with the default loop), else asyncio's own. Library calls made from the
caller's loop (``SandboxPool``, ``Engine``) run on whatever loop the caller chose.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on :func:`new_event_loop`."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)


class LoopThread:
    """An event loop on its own daemon thread: how sync callers, and callers on other event
    loops, use async objects that must stay on one loop (an Engine and its slots).

    Thread-safe (OpenRLHF scores samples from many threads at once); the loop starts on first
    use, and after :meth:`stop` the next use starts a fresh one.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        """Whether the loop is running (started and not stopped)."""
        return self._loop is not None

    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop (started if it is not)."""
        with self._lock:
            if self._loop is None:
                loop = new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def in_thread(self) -> bool:
        """Whether the caller runs on the loop's own thread (where blocking would deadlock)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; its result comes back through the future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop())

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and block until its result (or ``timeout`` seconds)."""
        if self.in_thread():
            coro.close()
            raise RuntimeError(f"a blocking call from {self.name}'s own loop would wait for "
                               "itself forever; await the coroutine there instead")
        return self.submit(coro).result(timeout)

    async def acall(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and await its result from the caller's own event loop."""
        return await asyncio.wrap_future(self.submit(coro))

    def stop(self, timeout: float | None = None) -> None:
        """Stop the loop and wait (up to ``timeout`` seconds) for its thread to end."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if thread is None or not thread.is_alive():
            loop.close()


def single_flight(cache: dict[K, asyncio.Task[T]], key: K,
                  make: Callable[[], Coroutine[Any, Any, T]], *,
                  keep: bool = True) -> Awaitable[T]:
    """``make()`` for ``key``, run once by a task of its own that every caller awaits.

    Run by the first caller instead, that caller's cancellation (a withdrawn job) would reach
    the others waiting on it as a CancelledError, which the engine takes for their own
    withdrawal: their results never came. Each caller here can only cancel itself. ``keep``:
    the result stays in ``cache`` (else only while it is made); a failure never does, so the
    next caller tries again.
    """
    task = cache.get(key)
    if task is None:
        task = cache[key] = asyncio.get_running_loop().create_task(make())
        task.add_done_callback(functools.partial(_settle_flight, cache, key, keep))
    return asyncio.shield(task)


def _settle_flight(cache: dict[K, asyncio.Task[T]], key: K, keep: bool,
                   task: asyncio.Task[T]) -> None:
    failed = task.cancelled() or task.exception() is not None  # retrieved even if none waits
    if (failed or not keep) and cache.get(key) is task:
        del cache[key]
