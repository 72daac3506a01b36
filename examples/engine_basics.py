"""Run programs through the engine: one run, a stream, a multi-turn session (README, "Run programs").

    python examples/engine_basics.py

The engine is what `sandloop score`, `exec-batch` and `serve` use: priorities, fair shares
between clients, admission by memory, retries of infrastructure failures (docs/engine.md).
"""

import asyncio

from sandloop import Engine, Limits, Program


async def main() -> None:
    async with Engine() as engine:                              # embedded defaults
        r = await engine.run(Program(source="print(1)"), Limits(time_s=2), priority="eval")
        print("run:", r.status.value, r.stdout.strip())

        programs = [Program(source=f"print({i} * {i})") for i in range(4)]
        async for i, r in engine.stream(programs, priority="train", client="grpo-run-7"):
            print("stream:", i, r.stdout.strip())                # (index, result) as each finishes

        async with engine.session(language="python") as s:      # multi-turn: files persist
            await s.write_files({"sol.py": "print(sum(range(10)))"})
            r = await s.run("python sol.py")
            print("session:", r.stdout.strip())


if __name__ == "__main__":
    asyncio.run(main())
