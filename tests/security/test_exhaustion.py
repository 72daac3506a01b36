"""Resource exhaustion: every bomb ends with its own status, within its limits, host untouched.

Catalogue items R1-R13 of research/isolation.md §4.1. Destructive attacks (fork bombs, disk
fills) are never run unisolated; the host audit (conftest.host_audit) runs after each test.
"""

from __future__ import annotations

import errno

import pytest
from sec_helpers import PoolInfo, attack, limits, report

from sandloop.sandbox.models import Status

pytestmark = pytest.mark.asyncio(loop_scope="session")


# -- processes and threads ---------------------------------------------------------------------


async def test_fork_bomb_python(sandbox: PoolInfo) -> None:
    src = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
    r = await attack(sandbox.pool, src, lim=limits(time_s=1.5, max_processes=16))
    assert r.status is Status.TIMEOUT, (r.status, r.stderr[-500:])
    assert r.wall_time_s < 4.0


async def test_fork_bomb_bash(sandbox: PoolInfo) -> None:
    src = "bomb() { bomb | bomb & }\nbomb\nsleep 30\n"
    r = await attack(sandbox.pool, src, "bash", lim=limits(time_s=1.5, max_processes=16))
    assert r.status is Status.TIMEOUT, (r.status, r.stderr[-500:])
    assert r.wall_time_s < 4.0


async def test_fork_bomb_c_reports_pid_limit(sandbox: PoolInfo) -> None:
    # Each fork that fails prints once; the cap is visible from inside as EAGAIN.
    src = r"""
#include <stdio.h>
#include <unistd.h>
#include <errno.h>
#include <string.h>
int main(void) {
    int made = 0;
    for (;;) {
        pid_t p = fork();
        if (p == 0) { for (;;) pause(); }
        if (p < 0) { printf("{\"made\": %d, \"errno\": %d}\n", made, errno); fflush(stdout); break; }
        made++;
    }
    for (;;) pause();
}
"""
    r = await attack(sandbox.pool, src, "c", lim=limits(time_s=1.5, max_processes=16))
    assert r.status is Status.TIMEOUT, (r.status, r.stderr[-500:], r.compile)
    seen = report(r)
    assert seen["errno"] == errno.EAGAIN
    assert int(seen["made"]) < 16  # pids.max counts every process of the run


async def test_thread_bomb(sandbox: PoolInfo) -> None:
    src = """
import json, os, threading, time
n = 0
err = None
try:
    while True:
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        n += 1
except Exception as e:
    err = repr(e)
print(json.dumps({"threads": n, "err": err}), flush=True)
os._exit(0)
"""
    r = await attack(sandbox.pool, src, lim=limits(max_processes=16))
    assert r.status is Status.OK, (r.status, r.stderr[-500:])
    seen = report(r)
    assert seen["err"] is not None and int(seen["threads"]) < 16  # threads count as pids


# -- memory ------------------------------------------------------------------------------------


async def test_memory_bomb_python(sandbox: PoolInfo) -> None:
    src = """
chunks = []
while True:
    chunks.append(bytearray(8 << 20))
"""
    r = await attack(sandbox.pool, src, lim=limits(memory_mb=64))
    assert r.status is Status.MEMORY_LIMIT, (r.status, r.stderr[-500:])
    assert r.peak_memory_mb <= 64 + 8


async def test_memory_bomb_c(sandbox: PoolInfo) -> None:
    src = r"""
#include <stdlib.h>
#include <string.h>
int main(void) {
    for (;;) { char *p = malloc(4 << 20); if (!p) return 3; memset(p, 1, 4 << 20); }
}
"""
    r = await attack(sandbox.pool, src, "c", lim=limits(memory_mb=64))
    assert r.status is Status.MEMORY_LIMIT, (r.status, r.stderr[-500:], r.compile)
    assert r.peak_memory_mb <= 64 + 8


async def test_memory_bomb_spread_over_processes(sandbox: PoolInfo) -> None:
    # Each child stays under the limit; together they exceed it (the cgroup counts the run).
    src = """
import os, time
for _ in range(6):
    if os.fork() == 0:
        b = bytearray(20 << 20)
        for i in range(0, len(b), 4096):
            b[i] = 1
        time.sleep(0.5)
        os._exit(0)
for _ in range(6):
    os.wait()
"""
    r = await attack(sandbox.pool, src, lim=limits(memory_mb=64, time_s=3))
    # A child was OOM-killed, even though the main process then exits 0 by itself.
    assert r.status is Status.MEMORY_LIMIT, (r.status, r.stderr[-500:])
    assert r.peak_memory_mb <= 64 + 8


async def test_memory_bomb_via_tmpfs_is_bounded(sandbox: PoolInfo) -> None:
    # tmpfs pages are memory: filling /tmp and /sandbox must stop at the work dir size.
    src = """
import json, os
total = 0
for d in ("/tmp", "/sandbox", "/dev/shm"):
    try:
        with open(d + "/ballast", "ab") as f:
            while True:
                f.write(b"x" * (1 << 20)); f.flush(); total += 1 << 20
    except OSError as e:
        pass
print(json.dumps({"total_mb": total >> 20}))
"""
    r = await attack(sandbox.pool, src, lim=limits(memory_mb=64, workdir_mb=8))
    assert r.status is Status.OK, (r.status, r.stderr[-500:])
    assert report(r)["total_mb"] <= 2 * 8  # /tmp and /sandbox (and /dev/shm is /tmp)


# -- disk and inodes ---------------------------------------------------------------------------

FILL_ONE = """
import errno, json
written, err = 0, None
try:
    with open("{path}", "wb") as f:
        while True:
            f.write(b"x" * (1 << 20)); f.flush(); written += 1 << 20
except OSError as e:
    err = e.errno
print(json.dumps({{"written": written, "errno": err}}))
"""


@pytest.mark.parametrize("path", ["/sandbox/fill.bin", "/tmp/fill.bin"])
async def test_disk_fill(sandbox: PoolInfo, path: str) -> None:
    r = await attack(sandbox.pool, FILL_ONE.format(path=path), lim=limits(workdir_mb=8))
    assert r.status is Status.OK, (r.status, r.stderr[-500:])
    seen = report(r)
    assert seen["errno"] in (errno.ENOSPC, errno.EFBIG)
    assert int(seen["written"]) <= 8 << 20


@pytest.mark.parametrize("where", ["/sandbox", "/tmp"])
async def test_disk_fill_many_files_under_fsize(sandbox: PoolInfo, where: str) -> None:
    # RLIMIT_FSIZE is per file; only a size-limited filesystem bounds the total (R4).
    src = f"""
import json, os
total, err = 0, None
try:
    for i in range(1000):
        with open("{where}/part%d" % i, "wb") as f:
            for _ in range(2):
                f.write(b"y" * (1 << 20)); f.flush(); total += 1 << 20
except OSError as e:
    err = e.errno
print(json.dumps({{"total": total, "errno": err}}))
"""
    r = await attack(sandbox.pool, src, lim=limits(workdir_mb=8))
    assert r.status is Status.OK, (r.status, r.stderr[-500:])
    seen = report(r)
    assert seen["errno"] == errno.ENOSPC
    assert int(seen["total"]) <= 8 << 20


@pytest.mark.parametrize("where", ["/sandbox", "/tmp"])
async def test_inode_fill(sandbox: PoolInfo, where: str) -> None:
    src = f"""
import json, os
n, err = 0, None
try:
    while True:
        os.close(os.open("{where}/i%d" % n, os.O_CREAT | os.O_WRONLY, 0o644)); n += 1
except OSError as e:
    err = e.errno
print(json.dumps({{"files": n, "errno": err}}))
"""
    r = await attack(sandbox.pool, src, lim=limits(workdir_inodes=128))
    assert r.status is Status.OK, (r.status, r.stderr[-500:])
    seen = report(r)
    assert seen["errno"] == errno.ENOSPC
    assert int(seen["files"]) <= 128


# -- output ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
async def test_output_flood(sandbox: PoolInfo, stream: str) -> None:
    src = f"""
import sys
line = "PASSED " * 1000 + "\\n"
while True:
    sys.{stream}.write(line)
"""
    lim = limits(time_s=10, stdout_bytes=4096, stderr_bytes=4096, output_limit_bytes=1 << 20)
    r = await attack(sandbox.pool, src, lim=lim)
    assert r.status is Status.OUTPUT_LIMIT, (r.status, r.stderr[-300:])
    assert r.wall_time_s < 5.0  # killed at the byte cap, not at the deadline
    kept = r.stdout if stream == "stdout" else r.stderr
    assert len(kept.encode()) <= 4096
    assert (r.stdout_truncated if stream == "stdout" else r.stderr_truncated)


async def test_output_flood_c_both_streams(sandbox: PoolInfo) -> None:
    src = r"""
#include <unistd.h>
#include <string.h>
int main(void) {
    static char buf[65536];
    memset(buf, 'A', sizeof buf);
    for (;;) { write(1, buf, sizeof buf); write(2, buf, sizeof buf); }
}
"""
    lim = limits(time_s=10, stdout_bytes=4096, stderr_bytes=4096, output_limit_bytes=2 << 20)
    r = await attack(sandbox.pool, src, "c", lim=lim)
    assert r.status is Status.OUTPUT_LIMIT, (r.status, r.compile)
    assert r.wall_time_s < 5.0
    assert len(r.stdout) <= 4096 and len(r.stderr) <= 4096


async def test_result_channel_flood(sandbox: PoolInfo) -> None:
    # fd 3 is the trusted harness's result channel; flooding it counts as output too.
    src = """
import os
buf = b"{" * 65536
while True:
    os.write(3, buf)
"""
    lim = limits(time_s=10, stdout_bytes=4096, stderr_bytes=4096, output_limit_bytes=1 << 20)
    r = await attack(sandbox.pool, src, lim=lim)
    assert r.status is Status.OUTPUT_LIMIT, (r.status, r.stderr[-300:])
    assert r.wall_time_s < 5.0


async def test_output_slow_drip_never_closing(sandbox: PoolInfo) -> None:
    src = """
import sys, time
while True:
    sys.stdout.write("."); sys.stdout.flush(); time.sleep(0.05)
"""
    r = await attack(sandbox.pool, src, lim=limits(time_s=1))
    assert r.status is Status.TIMEOUT
    assert 0.9 <= r.wall_time_s < 2.5
    assert r.stdout.startswith("....")


# -- descriptors -------------------------------------------------------------------------------


async def test_fd_exhaustion(sandbox: PoolInfo) -> None:
    src = """
import json, os
fds, err = [], None
try:
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
        r, w = os.pipe(); fds += [r, w]
except OSError as e:
    err = e.errno
print(json.dumps({"open": len(fds), "errno": err}))
"""
    r = await attack(sandbox.pool, src, lim=limits(open_files=64))
    assert r.status is Status.OK, (r.status, r.stderr[-500:])
    seen = report(r)
    assert seen["errno"] == errno.EMFILE
    assert int(seen["open"]) <= 64


# -- CPU and time ------------------------------------------------------------------------------


async def test_cpu_spin_in_many_processes(sandbox: PoolInfo) -> None:
    # 8 spinning processes under a 1-core quota and a 1 s CPU budget for the whole run.
    src = """
import os
for _ in range(7):
    if os.fork() == 0:
        break
while True:
    pass
"""
    lim = limits(time_s=30, cpu_time_s=1.0, cpus=1.0)
    r = await attack(sandbox.pool, src, lim=lim)
    assert r.status is Status.TIMEOUT
    # Killed on CPU time: its 1 s was spent, and well before the 30 s deadline. (Not a fixed
    # wall bound: at load 9 on 2 cores the run got ~0.2 of a core, and 1 s of CPU took 5.3 s.)
    assert r.wall_time_s < 20.0, r.wall_time_s
    assert 0.9 <= r.cpu_time_s < 1.6, r.cpu_time_s
    assert r.cpu_time_s <= 1.3 * r.wall_time_s + 0.1  # the quota held it to ~1 core


async def test_sleep_past_deadline(sandbox: PoolInfo) -> None:
    r = await attack(sandbox.pool, "import time\ntime.sleep(100)\n", lim=limits(time_s=1))
    assert r.status is Status.TIMEOUT
    assert 0.95 <= r.wall_time_s < 2.0
    assert r.cpu_time_s < 0.3  # sleeping, not slow


async def test_sleep_in_c_ignoring_signals(sandbox: PoolInfo) -> None:
    src = r"""
#include <signal.h>
#include <unistd.h>
int main(void) {
    for (int s = 1; s < 32; s++) signal(s, SIG_IGN);
    for (;;) sleep(100);
}
"""
    r = await attack(sandbox.pool, src, "c", lim=limits(time_s=1))
    assert r.status is Status.TIMEOUT, (r.status, r.compile)
    assert r.wall_time_s < 2.0


async def test_busy_loop_past_cpu_limit(sandbox: PoolInfo) -> None:
    src = """
import signal
signal.signal(signal.SIGXCPU, signal.SIG_IGN)
while True:
    pass
"""
    r = await attack(sandbox.pool, src, lim=limits(time_s=10, cpu_time_s=0.5))
    assert r.status is Status.TIMEOUT
    assert r.wall_time_s < 5.0  # killed on CPU time, not at the 10 s deadline
    assert r.cpu_time_s < 1.2


async def test_compile_bomb_include_urandom(sandbox: PoolInfo) -> None:
    src = '#include "/dev/urandom"\nint main(void){return 0;}\n'
    r = await attack(sandbox.pool, src, "c", lim=limits(compile_time_s=2, compile_memory_mb=256))
    assert r.status is Status.COMPILE_ERROR, (r.status, r.error)
    assert r.compile is not None
    assert r.compile.wall_time_s < 4.0
