"""Run programs directly on the sandbox pool (no scheduling), and the one-call script API.

    python examples/pool_basics.py
"""

import asyncio

import sandloop
from sandloop import Limits, Program, SandboxPool

SOURCES = ['#include <cstdio>\nint main() { std::puts("c++ ok"); }']


async def main() -> None:
    async with SandboxPool() as pool:            # warm slots, one per core by default
        r = await pool.run(Program(language="python", source="print(input()[::-1])", stdin="abc"),
                           Limits(time_s=2, memory_mb=256))
        print(r.status.value, r.stdout.strip(), f"{r.wall_time_s:.3f}s",
              f"{r.peak_memory_mb:.1f}MiB")
        results = await pool.run_batch([Program(language="cpp", source=src) for src in SOURCES])
        print("batch:", [(x.status.value, x.stdout.strip()) for x in results])


if __name__ == "__main__":
    asyncio.run(main())
    # or, in a script:
    print(sandloop.run(sandloop.Program(language="bash", source="echo hi")).stdout.strip())
