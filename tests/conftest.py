"""Shared fixtures: real warm SandboxPools (one per module for async tests, one per session for
sync ones), to keep the suite fast."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from sandloop import SandboxPool

requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="full isolation needs root")


def pytest_configure(config: pytest.Config) -> None:
    """Environments the pools build on first use (the built-in ``python``) go to a store in
    the temporary directory, not /var/lib/sandloop/envs: tests change nothing of the host's.
    The store is kept between sessions (one build, 2-6 s here, serves them all; a changed
    host interpreter makes a new one); subprocesses inherit the variable."""
    if not os.environ.get("SANDLOOP_ENV_DIR"):
        os.environ["SANDLOOP_ENV_DIR"] = os.path.join(
            tempfile.gettempdir(), f"sandloop-test-envs-{os.geteuid()}")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool() -> AsyncIterator[SandboxPool]:
    async with SandboxPool(2) as p:
        yield p


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
    """A pool for sync tests (tests/security overrides ``sandbox`` with its own)."""
    p = PoolThread()
    try:
        yield p
    finally:
        p.close()
