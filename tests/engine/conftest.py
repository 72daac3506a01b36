"""Engine fixtures: a real engine over real sandbox slots, checked for leftovers at the end."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from engine_helpers import assert_none_left, sandbox_processes

from sandloop.engine import Engine


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[Engine]:
    before = sandbox_processes()
    async with Engine(slots=2) as e:
        yield e
    assert_none_left(before)
