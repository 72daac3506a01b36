"""Run by test_durability: an engine with a journal working through a batch, until SIGKILLed."""

from __future__ import annotations

import asyncio
import sys

from sandloop import Limits, Program
from sandloop.engine import Engine

N = 24
PROGRAM = Program(source="import os, time\ntime.sleep(0.25)\nprint(os.urandom(8).hex())")


async def main(db: str) -> None:
    async with Engine(slots=2, journal=db) as engine:
        keys = [f"job{i}" for i in range(N)]
        async for i, r in engine.stream([PROGRAM] * N, Limits(time_s=10), keys=keys):
            print(i, r.status, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
