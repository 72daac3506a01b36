"""Multi-turn state on the pool: a workspace's /sandbox persists between runs; every run is
still a fresh, fully isolated process.

    python examples/workspaces.py
"""

import asyncio

from sandloop import Limits, Program, SandboxPool

CODE = "import sys\nopen('out.txt', 'w').write(sys.stdin.read().upper())\n"


async def main() -> None:
    async with SandboxPool(1) as pool:
        ws = await pool.open_workspace(Limits(workdir_mb=64))   # lives in one slot
        try:
            await pool.write_files(ws, {"sol.py": CODE, "in.txt": "hello\n"})
            r = await pool.run_in(ws, Program(language="bash", source="python3 sol.py < in.txt"))
            files = await pool.read_files(ws, ["out.txt"])      # regular files only
            print(r.status.value, files["out.txt"].decode().strip())
        finally:
            await pool.close_workspace(ws)


if __name__ == "__main__":
    asyncio.run(main())
