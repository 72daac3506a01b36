"""The one sync-over-async bridge (_aio.LoopThread) that SyncEngine and the Scorer stand on."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sandloop._aio import LoopThread


async def loop_thread_name() -> str:
    await asyncio.sleep(0)
    return threading.current_thread().name


def test_many_threads_share_one_loop_started_on_first_use() -> None:
    bridge = LoopThread("bridge-test")
    assert not bridge.started
    try:
        with ThreadPoolExecutor(8) as pool:  # OpenRLHF scores samples on many threads
            names = list(pool.map(lambda _: bridge.call(loop_thread_name()), range(32)))
        assert set(names) == {"bridge-test"}
        loop = bridge.loop()
        assert all(bridge.loop() is loop for _ in range(3))
    finally:
        bridge.stop(timeout=10)
    assert not bridge.started and loop.is_closed()


def test_awaitable_from_inside_another_running_loop() -> None:
    # TRL awaits its reward function on its own loop: the work still runs on the bridge's.
    bridge = LoopThread("bridge-test")
    try:
        assert asyncio.run(bridge.acall(loop_thread_name())) == "bridge-test"
    finally:
        bridge.stop(timeout=10)


def test_a_blocking_call_from_the_loop_itself_is_refused_not_deadlocked() -> None:
    bridge = LoopThread("bridge-test")

    async def nested() -> None:
        bridge.call(loop_thread_name())

    try:
        with pytest.raises(RuntimeError, match="wait for itself"):
            bridge.call(nested(), timeout=10)
    finally:
        bridge.stop(timeout=10)


def test_restarts_after_stop() -> None:
    bridge = LoopThread("bridge-test")
    bridge.call(loop_thread_name())
    first = bridge.loop()
    bridge.stop(timeout=10)
    try:
        assert bridge.call(loop_thread_name()) == "bridge-test" and bridge.loop() is not first
    finally:
        bridge.stop(timeout=10)
