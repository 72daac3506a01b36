"""Episode fixtures: a real engine over real sandbox slots, and the bundled repository tasks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from sandloop.engine import Engine
from sandloop.tasks.repo import RepoTask, load_repo_tasks


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[Engine]:
    async with Engine(slots=2) as e:
        yield e


@pytest.fixture(scope="session")
def demo() -> dict[str, RepoTask]:
    return {t.id: t for t in load_repo_tasks("repo-demo")}


@pytest.fixture(scope="session")
def spanlib(demo: dict[str, RepoTask]) -> RepoTask:
    return demo["spanlib-touching-intervals"]
