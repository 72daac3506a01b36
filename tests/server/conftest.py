from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from live import LiveServer

from sandloop.server import ServerConfig, add_key


@pytest.fixture(scope="session")
def server() -> Iterator[LiveServer]:
    """An anonymous (no keys) server on loopback, 2 slots, full isolation."""
    with LiveServer(ServerConfig(slots=2)) as s:
        yield s


@pytest.fixture(scope="session")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    """A server with API keys: 'open' (no limits), 'slow' (rate 1/s, burst 2), 'quota' (3 runs)."""
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    tokens = {
        "open": add_key(path, "open"),
        "slow": add_key(path, "slow", rate=1.0, burst=2.0),
        "quota": add_key(path, "quota", max_runs=3),
    }
    with LiveServer(ServerConfig(slots=2), keys_file=path) as s:
        yield s, tokens
