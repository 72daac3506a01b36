"""Engine test helpers: find sandbox processes, assert none is left behind."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

ZYGOTE = b"sandloop/sandbox/zygote"  # the package dir on its command line (BOOTSTRAP)
SLOT_UIDS = range(61000, 61000 + 64 * 256)  # every pool's slot uid range (pool.py)


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Wait until ``condition()`` holds, checked every 5 ms: tests synchronise on the state they
    need (a job running, a session reaped), not on a guess of how long it takes to get there.
    Fails the test, saying ``what`` was awaited, after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        await asyncio.sleep(0.005)


def _table() -> dict[int, tuple[int, bool]]:
    """pid -> (parent pid, is a sandbox process: a fork-server or runs as a slot uid)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes()
            uid = os.stat(d).st_uid
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out[int(d.name)] = (ppid, ZYGOTE in cmd or uid in SLOT_UIDS)
    return out


def _ancestors(pid: int, table: dict[int, tuple[int, bool]]) -> list[int]:
    out, p = [], table.get(pid, (0, False))[0]
    while p > 1 and len(out) < 64:
        out.append(p)
        p = table.get(p, (0, False))[0]
    return out


def sandbox_processes() -> set[int]:
    """Sandbox processes that this test process owns (its descendants), plus orphaned ones
    (reparented to init: leaked by someone). Other concurrent test runs' pools are ignored."""
    table = _table()
    me = os.getpid()
    return {pid for pid, (ppid, sandboxy) in table.items()
            if sandboxy and (ppid == 1 or me in _ancestors(pid, table))}


def assert_none_left(before: set[int], timeout_s: float = 5.0) -> None:
    """No sandbox process exists beyond those in ``before`` (pools still open) and their
    children (an open pool's fork-server keeps a prepared child between runs)."""
    end = time.monotonic() + timeout_s
    while True:
        table = _table()
        extra = {p for p in sandbox_processes() - before
                 if not before.intersection(_ancestors(p, table))}
        if not extra or time.monotonic() > end:
            break
        time.sleep(0.05)
    assert not extra, f"processes left behind: {sorted(extra)}"
