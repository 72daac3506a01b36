"""Drive SandboxFusion's /run_code on a live `sandloop serve` with the 164 HumanEval reference
programs (prompt + canonical solution + tests + check) at concurrency 1, 8 and 32.

Prints runs/s and p50/p99 latency per concurrency (full isolation). The server runs in its own
process (python -m sandloop.server serve) on 127.0.0.1; the client is httpx (async), on the same
cores. So that the figures can be read without the client, it also prints the machine's CPU time
per request minus the client's own ("server CPU/req": HTTP, engine, sandbox and kernel work) and
the throughput that implies for a machine of this size that runs only the server.

This VM's speed drifts between days, and SandboxFusion cannot be run here again, so the run
ends with a calibration: the same programs as bare ``python file.py`` processes at concurrency
8, which ../shared/research/measured-here.md measured at ~120 runs/s on the day SandboxFusion
did ~55. Scaling 55 by today's bare rate estimates SandboxFusion's rate today.

    .venv/bin/python benchmarks/bench_server.py [--rounds 2] [--concurrency 1 8 32]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gzip
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

from sandloop.tasks.loaders import humaneval_path


def programs() -> list[str]:
    out = []
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        for line in f:
            t = json.loads(line)
            out.append(t["prompt"] + t["canonical_solution"] + "\n" + t["test"] +
                       f"\ncheck({t['entry_point']})\n")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def drive(url: str, codes: list[str], concurrency: int) -> tuple[float, list[float], int]:
    lat: list[float] = []
    bad = 0
    it = iter(codes)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def worker() -> None:
            nonlocal bad
            for code in it:
                t0 = time.perf_counter()
                r = await client.post(url, json={"code": code, "language": "python",
                                                 "run_timeout": 10, "memory_limit_MB": 1024})
                lat.append(time.perf_counter() - t0)
                if r.status_code != 200 or r.json()["status"] != "Success":
                    bad += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0, lat, bad


SF_RUNS_PER_S = 55.0  # SandboxFusion /run_code, no isolation, c=2..32 (measured-here.md)
BARE_THEN_RUNS_PER_S = 120.0  # plain `python file.py` per program at c=8, same day


def bare_python(codes: list[str], concurrency: int) -> float:
    """Runs/s of ``python file.py`` per program, ``concurrency`` at a time, no isolation."""
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for k, code in enumerate(codes):
            path = os.path.join(d, f"p{k}.py")
            with open(path, "w") as f:
                f.write(code)
            paths.append(path)

        def one(path: str) -> None:
            subprocess.run([sys.executable, path], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
            list(ex.map(one, paths))
        return len(paths) / (time.perf_counter() - t0)


def busy_cpu_s() -> float:
    """Non-idle CPU seconds of the whole machine so far (all cores)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs)) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2, help="passes over the 164 programs")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--slots", type=int, default=None)
    a = ap.parse_args()
    port = free_port()
    cmd = [sys.executable, "-m", "sandloop.server", "serve", "--port", str(port),
           "--log-level", "warning"]
    if a.slots:
        cmd += ["--slots", str(a.slots)]
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rates: dict[int, float] = {}
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("server did not become ready")
            time.sleep(0.1)
        codes = programs() * a.rounds
        asyncio.run(drive(f"{base}/run_code", programs()[:16], 4))  # warm-up
        print(f"sandloop serve /run_code, HumanEval references ({len(codes)} runs per level), "
              f"full isolation, {os.cpu_count()} cores")
        print(f"{'concurrency':>11} {'runs/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'failed':>6} "
              f"{'server CPU/req':>15} {'client CPU/req':>15} {'server-only runs/s':>19}")
        cores = os.cpu_count() or 1
        for c in a.concurrency:
            m0, c0 = busy_cpu_s(), own_cpu_s()
            wall, lat, bad = asyncio.run(drive(f"{base}/run_code", codes, c))
            client = (own_cpu_s() - c0) / len(codes)
            server = (busy_cpu_s() - m0) / len(codes) - client
            rates[c] = len(codes) / wall
            print(f"{c:>11} {len(codes) / wall:>8.1f} {statistics.median(lat) * 1e3:>8.1f} "
                  f"{pct(lat, 99) * 1e3:>8.1f} {bad:>6} {server * 1e3:>12.1f} ms "
                  f"{client * 1e3:>12.1f} ms {cores / server:>19.0f}")
    finally:
        srv.terminate()
        srv.wait(30)
    bare = bare_python(programs(), 8)
    sf_today = SF_RUNS_PER_S * bare / BARE_THEN_RUNS_PER_S
    print(f"calibration: bare `python file.py` at concurrency 8: {bare:.0f} runs/s "
          f"(~{BARE_THEN_RUNS_PER_S:.0f} when SandboxFusion did ~{SF_RUNS_PER_S:.0f}): "
          f"SandboxFusion today ~{sf_today:.0f} runs/s")
    if 8 in a.concurrency:
        print(f"  /run_code at concurrency 8 against that estimate: {rates[8] / sf_today:.2f}x; "
              f"against the figure measured that day: {rates[8] / SF_RUNS_PER_S:.2f}x "
              "(target 3x)")


if __name__ == "__main__":
    main()
