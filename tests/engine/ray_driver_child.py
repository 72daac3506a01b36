"""Run by test_cluster_ray: a driver with a journal working through a batch on the Ray cluster at
argv[1], until SIGKILLed."""

from __future__ import annotations

import asyncio
import sys

from sandloop import Limits, Program
from sandloop.engine import Engine

N = 120


async def main(address: str, journal: str) -> None:
    programs = [Program(source=f"import time\ntime.sleep(0.1)\nprint({i})") for i in range(N)]
    async with Engine(cluster="ray", address=address, journal=journal) as engine:
        keys = [f"job{i}" for i in range(N)]
        async for i, r in engine.stream(programs, Limits(time_s=10), keys=keys):
            print(i, r.status, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
