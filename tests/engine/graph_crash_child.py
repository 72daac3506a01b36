"""Run by test_graph: an engine with a journal working through a graph, until SIGKILLed."""

from __future__ import annotations

import asyncio
import sys

from graph_shapes import crash_graph

from sandloop.engine import Engine


async def main(db: str) -> None:
    async with Engine(slots=2, journal=db) as engine:
        await engine.run_graph(crash_graph(), key="crash-graph")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
