"""Knobs a run must not turn, and side channels between runs and to the host (docs/sandbox.md,
"Known side channels"): what is closed is attacked here; what remains is pinned down as measured,
so that closing it (or a change that widens it) shows."""

from __future__ import annotations

import asyncio
import errno

import pytest
from sec_helpers import PoolInfo, attack, limits, report

from sandloop.sandbox.models import Status

pytestmark = pytest.mark.asyncio(loop_scope="session")

OOM_PROBE_SH = """
before=$(cat /proc/self/oom_score_adj)
echo 0 > /proc/self/oom_score_adj 2>/dev/null; a=$?
echo -17 > /proc/self/oom_adj 2>/dev/null; b=$?
printf '{"before": %s, "score_adj_rc": %s, "adj_rc": %s, "after": %s}\\n' \\
    "$before" "$a" "$b" "$(cat /proc/self/oom_score_adj)"
"""

OOM_PROBE_PY = """
import json, os
out = {"before": int(open("/proc/self/oom_score_adj").read())}
for path, value in (("/proc/self/oom_score_adj", "0"), ("/proc/self/oom_adj", "-17")):
    try:
        with open(path, "w") as f:
            f.write(value)
        out[path] = "WRITTEN"
    except OSError as e:
        out[path] = e.errno
out["after"] = int(open("/proc/self/oom_score_adj").read())
print(json.dumps(out))
"""


async def test_program_cannot_lower_its_oom_score_adj(sandbox: PoolInfo) -> None:
    # The run volunteers for the OOM killer (1000). An exec'd program is dumpable again and owns
    # its /proc files; without CAP_SYS_RESOURCE at the time 1000 was written (container roots
    # lack it, as here) the kernel does not pin it: only the read-only /proc does.
    sh = report(await attack(sandbox.pool, OOM_PROBE_SH, "bash"))
    assert sh["before"] == 1000 and sh["after"] == 1000, sh
    assert sh["score_adj_rc"] != 0 and sh["adj_rc"] != 0
    py = report(await attack(sandbox.pool, OOM_PROBE_PY))
    assert py["before"] == py["after"] == 1000, py
    assert py["/proc/self/oom_score_adj"] in (errno.EROFS, errno.EACCES)


INOTIFY_PROBE = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for name, call in (("inotify_init1", lambda: libc.inotify_init1(0)),
                   ("inotify_init", lambda: libc.inotify_init()),
                   ("inotify_add_watch", lambda: libc.inotify_add_watch(0, b"/usr/bin", 0x20)),
                   ("fanotify_init", lambda: libc.fanotify_init(0, 0))):
    r = call()
    out[name] = "OK" if r >= 0 else ctypes.get_errno()
print(json.dumps(out))
"""


async def test_watching_host_inodes_is_denied(sandbox: PoolInfo) -> None:
    # /usr is the host's own: a watch on it would report what the host and the other tenants
    # open and run (IN_OPEN, IN_ACCESS).
    seen = report(await attack(sandbox.pool, INOTIFY_PROBE))
    assert seen == {"inotify_init1": errno.ENOSYS, "inotify_init": errno.ENOSYS,
                    "inotify_add_watch": errno.ENOSYS, "fanotify_init": errno.ENOSYS}, seen
    # Programs that can do without fall back: GNU tail -f polls.
    r = await attack(sandbox.pool, "echo a > f; timeout 0.5 tail -f f; echo rc=$?", "bash")
    assert r.stdout.startswith("a\n") and "rc=124" in r.stdout, (r.stdout, r.stderr)


async def test_inotify_works_unisolated(sandbox: PoolInfo) -> None:
    seen = report(await attack(sandbox.unisolated, INOTIFY_PROBE))
    assert seen["inotify_init1"] == "OK"


FLOCK_HOLD = """
import fcntl, os, time
fd = os.open("/usr/bin/env", os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(1.5)
"""

FLOCK_TRY = """
import fcntl, json, os, time
time.sleep(0.5)
out = {}
for path in ("/usr/bin/env", "/tmp/own"):
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out[path] = "LOCKED"
    except OSError as e:
        out[path] = e.errno
print(json.dumps(out))
"""


async def test_flock_on_shared_runtime_files_is_a_known_channel(sandbox: PoolInfo) -> None:
    # Known and documented (docs/sandbox.md): flock() works on a file opened read-only, and the
    # runtime binds are the host's inodes, so two concurrent runs can signal each other bits
    # (one holds the lock, the other sees EWOULDBLOCK). Denying flock would break programs
    # that lock their own files; the channel carries nothing but what two colluding programs
    # agree to send. If this starts failing, the channel closed: update the docs.
    a, b = await asyncio.gather(
        attack(sandbox.pool, FLOCK_HOLD, lim=limits(time_s=5)),
        attack(sandbox.pool, FLOCK_TRY, lim=limits(time_s=5)),
    )
    assert a.status is Status.OK and b.status is Status.OK, (a.stderr, b.stderr)
    seen = report(b)
    assert seen["/usr/bin/env"] == errno.EWOULDBLOCK, seen
    assert seen["/tmp/own"] == "LOCKED"  # a run's own files: locking works as usual
