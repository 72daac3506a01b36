"""Shared fixtures: real warm SandboxPools (one per module for async tests, one per session for
sync ones), to keep the suite fast."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from sandloop import SandboxPool

requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="full isolation needs root")


_ENV_DIR: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Environments the pools build on first use (the built-in ``python``) go to a store in a
    temporary directory of this session, not /var/lib/sandloop/envs, and it is removed at the
    end: tests leave nothing of theirs on the host (a build takes 2-6 s here). Subprocesses
    inherit the variable."""
    global _ENV_DIR
    if not os.environ.get("SANDLOOP_ENV_DIR"):
        _ENV_DIR = tempfile.mkdtemp(prefix="sandloop-test-envs-")
        # As the real store (/var/lib/sandloop/envs): other users may enter it, so that
        # unisolated runs (an unprivileged uid) can start the environment's interpreter.
        os.chmod(_ENV_DIR, 0o755)
        os.environ["SANDLOOP_ENV_DIR"] = _ENV_DIR


def pytest_unconfigure(config: pytest.Config) -> None:
    if _ENV_DIR is not None:
        def writable(func: Any, path: str, _exc: Any) -> None:  # built trees are read-only
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
            func(path)

        shutil.rmtree(_ENV_DIR, onerror=writable)


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


@pytest.fixture(autouse=True)
def _no_log_handler_left_on_a_closed_stream() -> Iterator[None]:
    """A test must not leave a log handler writing to a stream that is closed by its end (a
    ``StreamHandler`` made while pytest captured ``sys.stderr``): every later record through it
    prints ``--- Logging error ---`` in some other test. Checked after the test's own fixtures
    (capsys included) are torn down; only sandloop's and uvicorn's loggers and the root."""
    yield
    names = [n for n in logging.root.manager.loggerDict if n.split(".")[0] in ("sandloop",
                                                                                "uvicorn")]
    stale = [f"{lg.name}: {h!r}" for lg in [logging.root, *map(logging.getLogger, names)]
             for h in lg.handlers
             if isinstance(h, logging.StreamHandler) and getattr(h.stream, "closed", False)]
    assert not stale, f"log handlers left on a closed stream: {stale}"
