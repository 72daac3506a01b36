"""A shared warm sandbox pool for the integration tests of the reward layer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from sandloop import SandboxPool


class PoolThread:
    """One SandboxPool living on its own event loop, callable from sync tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pool = SandboxPool()
        self.loop.run_until_complete(self.pool.start())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def all(self, coros: Any) -> list[Any]:
        """Run coroutines concurrently on the pool's loop; results in order."""
        async def gather() -> list[Any]:
            return list(await asyncio.gather(*coros))
        return self.loop.run_until_complete(gather())

    def close(self) -> None:
        self.loop.run_until_complete(self.pool.close())
        self.loop.close()


@pytest.fixture(scope="session")
def sandbox() -> Iterator[PoolThread]:
    p = PoolThread()
    try:
        yield p
    finally:
        p.close()
