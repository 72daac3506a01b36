"""The engine from a plain script (no asyncio): run, map in input order, a session.

    python examples/engine_sync.py
"""

from sandloop import Limits, Program, SyncEngine

with SyncEngine() as engine:
    print("run:", engine.run(Program(source="print('hi')"), Limits(time_s=2)).stdout.strip())
    results = engine.map([Program(source=f"print({i})") for i in range(3)])
    print("map:", [r.stdout.strip() for r in results])          # input order
    with engine.session(language="python") as s:
        s.write_files({"data.txt": "3 4"})
        r = s.run("python -c 'print(sum(map(int, open(\"data.txt\").read().split())))'")
        print("session:", r.stdout.strip())
