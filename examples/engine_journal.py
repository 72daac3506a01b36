"""A crash-safe engine: jobs and outcomes recorded in a SQLite journal; after a crash,
``resume()`` runs each unfinished job once and never recomputes a finished one.

    python examples/engine_journal.py [JOURNAL]   # default: a temporary file

``resume()`` is an async iterator of ``(key, result)`` as each job ends (``async for``);
``await engine.resume()`` gives the list of all once they have.
"""

import asyncio
import sys
import tempfile
from pathlib import Path

from sandloop import Engine, Program


async def main(journal: Path) -> None:
    async with Engine(journal=journal) as engine:
        r = await engine.run(Program(source="print('recorded')"))
        print("run:", r.stdout.strip())
        # After a crash, a new engine on the same journal finishes what was in flight:
        async for key, result in engine.resume():
            print("resumed:", key, result.status.value)
        print("nothing was left unfinished")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(Path(sys.argv[1])))
    else:
        with tempfile.TemporaryDirectory() as d:
            asyncio.run(main(Path(d) / "jobs.db"))
