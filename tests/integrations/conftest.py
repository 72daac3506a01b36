from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))

from live import LiveServer

from sandloop.server import ServerConfig


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with LiveServer(ServerConfig(slots=2)) as s:
        yield s
