"""Drive SandboxFusion's /run_code on a live `sandloop serve` with the 164 HumanEval reference
programs (prompt + canonical solution + tests + check) at concurrency 1, 8 and 32.

Prints runs/s and p50/p99 latency per concurrency (full isolation). The server runs in its own
process (python -m sandloop serve) on 127.0.0.1. The load generator runs on the same
cores, and every millisecond of CPU it spends per request is one the server under test does not
get, so it is as small as a load generator can be: one keep-alive HTTP/1.1 connection per
worker, the request bodies serialised beforehand, the reply's status checked, on uvloop. That
costs ~0.4 ms of CPU per request here, where aiohttp takes ~1.2 ms and httpx ~4 ms; in
production the trainer's client runs on other machines. The table also prints the machine's CPU
time per request minus the client's own ("server CPU/req": HTTP, engine, sandbox and kernel
work).

The comparison is measured in the same run when a SandboxFusion server is given
(``--sandboxfusion http://127.0.0.1:8089``; how to start one: docs/server.md): each level is
driven on both with the same client and programs, in alternating blocks (``--blocks``, default
4: sandloop, SandboxFusion, sandloop, ...) so that the VM's drift within minutes weighs on both
alike, and the ratios are printed. Without one, the figures are set against SandboxFusion's from
../shared/research/measured-here.md, which this VM's day-to-day drift makes rough (on
2026-11-30 it did 33-37 runs/s side by side, not the ~55 of that day).

    .venv/bin/python benchmarks/bench_server.py [--rounds 4] [--concurrency 1 8 32]
        [--sandboxfusion URL]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field

import httpx

from sandloop._aio import run
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


class _Conn:
    """One keep-alive HTTP/1.1 connection that POSTs JSON and reads the reply: all a load
    generator needs, at ~1/4 of aiohttp's CPU per request (see the module docstring)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n%s"
                          % (path.encode(), self.host.encode(), self.port, len(body), body))
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in
                   (ln.partition(b":") for ln in lines[1:] if ln)}
        if b"content-length" in headers:
            data = await self.reader.readexactly(int(headers[b"content-length"]))
        else:  # chunked
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                parts.append(await self.reader.readexactly(size + 2))
                if size == 0:
                    break
            data = b"".join(p[:-2] for p in parts)
        if headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return status, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = self.reader = None


async def drive(url: str, codes: list[str], concurrency: int,
                done: list[float] | None = None) -> tuple[float, list[float], int]:
    """POST every program to ``url`` with ``concurrency`` requests in flight, one keep-alive
    connection each; returns the wall time, each request's latency and how many did not come
    back as a "Success". ``done``, if given, gets each request's completion time
    (time.perf_counter)."""
    u = urllib.parse.urlsplit(url)
    assert u.hostname is not None and u.port is not None
    host, port, path = u.hostname, u.port, u.path or "/"
    lat: list[float] = []
    bad = 0
    it = iter([json.dumps({"code": code, "language": "python", "run_timeout": 10,
                           "memory_limit_MB": 1024}).encode() for code in codes])

    async def worker() -> None:
        nonlocal bad
        conn = _Conn(host, port)
        try:
            for body in it:
                t0 = time.perf_counter()
                status, data = await conn.post(path, body)
                lat.append(time.perf_counter() - t0)
                if done is not None:
                    done.append(time.perf_counter())
                if status != 200 or json.loads(data).get("status") != "Success":
                    bad += 1
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0, lat, bad


# SandboxFusion /run_code with no isolation, by concurrency, on the day it was measured here
# (../shared/research/measured-here.md); used only when no server is given to measure.
SF_THEN_RUNS_PER_S = {1: 27.0, 2: 55.0, 8: 55.0, 32: 55.0}


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


@dataclass
class Level:
    concurrency: int
    runs_per_s: float
    p50_ms: float
    p99_ms: float
    failed: int
    runs: int  # requests that came back (with an answer, whatever it was)
    server_cpu_ms: float  # machine CPU per request minus the client's
    client_cpu_ms: float


@dataclass
class Tally:
    """One server's measurements at one level, summed over its blocks."""

    runs: int = 0
    steady_runs: int = 0  # completions while the full concurrency was in flight ...
    steady_s: float = 0.0  # ... and the time they took: runs/s without ramp-up and drain
    bad: int = 0
    machine_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    lat: list[float] = field(default_factory=list)

    def drive_block(self, url: str, codes: list[str], concurrency: int) -> None:
        m0, c0 = busy_cpu_s(), own_cpu_s()
        done: list[float] = []
        wall, lat, bad = run(drive(url, codes, concurrency, done))
        self.client_cpu_s += own_cpu_s() - c0
        self.machine_cpu_s += busy_cpu_s() - m0
        self.runs += len(codes)
        # From the first to the last completion that still had every worker busy: the ramp-up
        # and the drain at the ends of a block run below the concurrency asked for.
        first, last = (concurrency - 1, len(done) - concurrency) if concurrency > 1 else (0, len(done) - 1)
        if last > first:
            self.steady_runs += last - first
            self.steady_s += done[last] - done[first]
        else:  # too few runs for a steady state: the whole block
            self.steady_runs += len(codes)
            self.steady_s += wall
        self.bad += bad
        self.lat.extend(lat)

    def level(self, concurrency: int) -> Level:
        lat = self.lat or [0.0]  # (none only if no block ran)
        client = self.client_cpu_s / self.runs
        return Level(concurrency, self.steady_runs / self.steady_s, statistics.median(lat) * 1e3,
                     pct(lat, 99) * 1e3, self.bad, len(self.lat),
                     (self.machine_cpu_s / self.runs - client) * 1e3, client * 1e3)


def measure(urls: list[str], codes: list[str], concurrency: int, blocks: int) -> list[Level]:
    """Drive each server with ``codes`` at ``concurrency``, in ``blocks`` turns each, the
    servers alternating block by block: this VM's speed drifts by 10-20 % within minutes, and
    alternating makes the drift weigh on every server alike."""
    tallies = [Tally() for _ in urls]
    size = -(-len(codes) // blocks)
    for b in range(blocks):
        part = codes[b * size:(b + 1) * size]
        for url, tally in zip(urls, tallies, strict=True):
            tally.drive_block(url, part, concurrency)
    return [t.level(concurrency) for t in tallies]


def print_table(title: str, levels: list[Level]) -> None:
    print(title)
    print(f"{'concurrency':>11} {'runs/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'failed':>6} "
          f"{'server CPU/req':>15} {'client CPU/req':>15}")
    for v in levels:
        print(f"{v.concurrency:>11} {v.runs_per_s:>8.1f} {v.p50_ms:>8.1f} {v.p99_ms:>8.1f} "
              f"{v.failed:>6} {v.server_cpu_ms:>12.1f} ms {v.client_cpu_ms:>12.1f} ms")


def wait_ready(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not answer 200 within {timeout_s:.0f} s")
        time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4, help="passes over the 164 programs")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--slots", type=int, default=None)
    ap.add_argument("--sandboxfusion", metavar="URL", default=None,
                    help="a running SandboxFusion server to measure side by side")
    ap.add_argument("--blocks", type=int, default=4,
                    help="with --sandboxfusion: turns per level, the servers alternating")
    a = ap.parse_args()
    port = free_port()
    # Its default logging (one JSON line per request), as SandboxFusion keeps its own.
    cmd = [sys.executable, "-m", "sandloop", "serve", "--port", str(port)]
    if a.slots:
        cmd += ["--slots", str(a.slots)]
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ours: list[Level] = []
    theirs: list[Level] = []
    base = f"http://127.0.0.1:{port}"
    sf = a.sandboxfusion.rstrip("/") if a.sandboxfusion else None
    codes = programs() * a.rounds
    try:
        wait_ready(f"{base}/readyz")
        run(drive(f"{base}/run_code", programs()[:16], 4))  # warm-up
        if sf:
            wait_ready(f"{sf}/v1/ping")
            run(drive(f"{sf}/run_code", programs()[:16], 4))
        urls = [f"{base}/run_code"] + ([f"{sf}/run_code"] if sf else [])
        for c in a.concurrency:
            levels = measure(urls, codes, c, a.blocks if sf else 1)
            ours.append(levels[0])
            theirs.extend(levels[1:])
    finally:
        srv.terminate()
        srv.wait(30)
    # The figures are of what they say: every reference program ran and passed, on each server,
    # at each level (a fast failure is no run/s).
    wrong = [f"{name} c={v.concurrency}: {v.failed} of {v.runs} not Success"
             for name, levels in (("sandloop", ours), ("SandboxFusion", theirs))
             for v in levels if v.failed or v.runs != len(codes)]
    if wrong:
        raise SystemExit("benchmark invalid: " + "; ".join(wrong))
    print_table(f"sandloop serve /run_code, HumanEval references ({len(codes)} runs per level), "
                f"full isolation, {os.cpu_count()} cores, the client on the same cores",
                ours)
    if theirs:
        print_table(f"SandboxFusion /run_code at {sf}, same programs and client", theirs)
        for o, t in zip(ours, theirs, strict=True):
            print(f"  concurrency {o.concurrency:>2}: sandloop/SandboxFusion throughput "
                  f"{o.runs_per_s / t.runs_per_s:.2f}x; sandloop p99 "
                  f"{o.p99_ms:.0f} ms vs SandboxFusion p50 {t.p50_ms:.0f} ms")
        best_o = max(ours, key=lambda v: v.runs_per_s)
        best_t = max(theirs, key=lambda v: v.runs_per_s)
        print(f"  best level against best level: {best_o.runs_per_s:.1f} runs/s (c={best_o.concurrency}) "
              f"/ {best_t.runs_per_s:.1f} (c={best_t.concurrency}) = "
              f"{best_o.runs_per_s / best_t.runs_per_s:.2f}x (target 3x)")
        return
    print("no --sandboxfusion: against its figures from measured-here.md instead (this VM's "
          "speed drifts between days; measure side by side for a ratio that means something)")
    for o in ours:
        then = SF_THEN_RUNS_PER_S.get(o.concurrency, max(SF_THEN_RUNS_PER_S.values()))
        print(f"  concurrency {o.concurrency:>2}: {o.runs_per_s / then:.2f}x its {then:.0f} runs/s "
              "of that day (target 3x)")

if __name__ == "__main__":
    main()
