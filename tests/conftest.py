"""Shared fixtures: a real warm SandboxPool (module-scoped, to keep the suite fast)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from sandloop import SandboxPool

requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="full isolation needs root")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool() -> AsyncIterator[SandboxPool]:
    async with SandboxPool(2) as p:
        yield p
