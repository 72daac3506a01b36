"""Persistence: nothing a run does may outlive it or reach the next run on the same slot.

Catalogue items P1-P7 of research/isolation.md §4.3. Runs on a slot are sequential and share its
zygote, its reusable work tmpfs and (since the per-slot network namespace) its loopback, so
"same slot" is what matters: each probe is run once per slot, and the follow-up run is matched
to the earlier one by the uid it reports (one uid per slot).
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

import pytest
from sec_helpers import (
    MARKER,
    PoolInfo,
    attack,
    leftover_work_files,
    limits,
    mount_table,
    procs_of_uids,
    report,
    sandloop_cgroups,
)

from sandloop.sandbox.models import ExecResult, Limits, Program, Status
from sandloop.sandbox.pool import SandboxPool

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def per_slot(pool: SandboxPool, program: Program, lim: Limits | None = None,
                   ) -> dict[int, ExecResult]:
    """Run ``program`` once on every slot (sequential runs rotate through the free queue);
    key the results by the uid each run printed on its first stdout line."""
    out: dict[int, ExecResult] = {}
    for _ in range(pool.size):
        r = await pool.run(program, lim or limits())
        assert r.status is Status.OK, (r.status, r.stdout[-500:], r.stderr[-1500:])
        out[int(r.stdout.split()[0])] = r
    assert len(out) == pool.size, "the runs did not cover every slot"
    return out


def no_slot_processes_now(sandbox: PoolInfo) -> None:
    # No grace period: when run() returns, the run's whole process tree must already be gone.
    assert procs_of_uids(sandbox.uids) == []


# -- daemons and held pipes --------------------------------------------------------------------


async def test_double_fork_daemon_python(sandbox: PoolInfo) -> None:
    src = """
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        fd = os.open("/dev/null", os.O_RDWR)
        for i in (0, 1, 2):
            os.dup2(fd, i)
        time.sleep(60)
        os._exit(0)
    os._exit(0)
os.wait()
print("parent done")
"""
    r = await attack(sandbox.pool, src, lim=limits(time_s=10))
    assert r.status is Status.OK and r.stdout == "parent done\n"
    assert r.wall_time_s < 2.0  # the run ends with its main process, not with the daemon
    no_slot_processes_now(sandbox)


async def test_nohup_background_job_bash(sandbox: PoolInfo) -> None:
    src = "nohup sleep 60 >/dev/null 2>&1 &\ndisown\necho started\n"
    r = await attack(sandbox.pool, src, "bash", lim=limits(time_s=10))
    assert r.status is Status.OK and r.stdout == "started\n"
    assert r.wall_time_s < 2.0
    no_slot_processes_now(sandbox)


async def test_setsid_background_job_bash(sandbox: PoolInfo) -> None:
    src = "setsid sleep 60 </dev/null >/dev/null 2>&1 &\nsetsid -f sleep 61\necho started\n"
    r = await attack(sandbox.pool, src, "bash", lim=limits(time_s=10))
    assert r.status is Status.OK and r.stdout == "started\n", (r.stdout, r.stderr)
    assert r.wall_time_s < 2.0
    no_slot_processes_now(sandbox)


async def test_daemon_c(sandbox: PoolInfo) -> None:
    src = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(void) {
    printf("forking\n"); fflush(stdout);
    if (fork() == 0) { if (daemon(0, 0) == 0) { for (;;) sleep(100); } _exit(1); }
    sleep(1);  /* give the daemon time to detach */
    return 0;
}
"""
    r = await attack(sandbox.pool, src, "c", lim=limits(time_s=10))
    assert r.status is Status.OK, (r.status, r.compile)
    assert r.wall_time_s < 3.0
    no_slot_processes_now(sandbox)


async def test_double_fork_holding_the_pipes(sandbox: PoolInfo) -> None:
    # The grandchild keeps stdout and stderr open; a harness that waits for EOF would hang.
    src = """
import os, sys, time
if os.fork() == 0:
    if os.fork() == 0:
        time.sleep(60)
        sys.stdout.write("late\\n")
        os._exit(0)
    os._exit(0)
os.wait()
print("done", flush=True)
"""
    r = await attack(sandbox.pool, src, lim=limits(time_s=10))
    assert r.status is Status.OK and r.stdout == "done\n"
    assert r.wall_time_s < 2.0
    no_slot_processes_now(sandbox)


async def test_background_job_holding_the_pipes_bash(sandbox: PoolInfo) -> None:
    src = "(sleep 60; echo late) &\n(trap '' HUP TERM; sleep 60) 2>&1 &\necho done\n"
    r = await attack(sandbox.pool, src, "bash", lim=limits(time_s=10))
    assert r.status is Status.OK and r.stdout == "done\n"
    assert r.wall_time_s < 2.0
    no_slot_processes_now(sandbox)


async def test_zombies(sandbox: PoolInfo) -> None:
    src = """
import json, os, time
kids = []
for _ in range(10):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    kids.append(pid)
time.sleep(0.3)
states = [open(f"/proc/{p}/stat").read().split()[2] for p in kids]
print(json.dumps({"states": states}))
"""
    r = await attack(sandbox.pool, src)
    assert r.status is Status.OK
    assert report(r)["states"] == ["Z"] * 10  # the zombies really existed inside
    no_slot_processes_now(sandbox)
    for pid in sandbox.zygotes.values():  # and the zygotes are not left with zombies either
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    st = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                assert not (st[1] == str(pid) and st[0] == "Z"), f"zombie {entry} under zygote"


# -- files and IPC objects left for the next run -----------------------------------------------

PLANT = f"""
import os, stat, sys
tok = sys.stdin.read()
print(os.getuid())
for d in ("/sandbox", "/tmp", "/dev/shm", "/sandbox/.config", "/sandbox/deep/a/b/c"):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "{MARKER}_" + tok), "w") as f:
        f.write(tok)
with open("/sandbox/.{MARKER}_hidden_" + tok, "w") as f:
    f.write(tok)
os.makedirs("/sandbox/locked/inner")
with open("/sandbox/locked/inner/{MARKER}_" + tok, "w") as f:
    f.write(tok)
os.chmod("/sandbox/locked/inner", 0)
os.chmod("/sandbox/locked", 0)
os.mkfifo("/sandbox/{MARKER}_fifo_" + tok)
os.symlink("/etc/passwd", "/sandbox/{MARKER}_link_" + tok)
os.makedirs("/sandbox/.local/lib/python3.11/site-packages", exist_ok=True)
with open("/sandbox/.local/lib/python3.11/site-packages/usercustomize.py", "w") as f:
    f.write("print('PWNED-' + {{tok!r}})".replace("{{tok!r}}", repr(tok)))
with open("/sandbox/sitecustomize.py", "w") as f:
    f.write("print('PWNED')")
os.chmod("/sandbox", 0o777)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
key = int(tok[:6], 16)
shm = libc.shmget(key, 4096, 0o1666)
msq = libc.msgget(key, 0o1666)
sem = libc.semget(key, 1, 0o1666)
print(shm >= 0, msq >= 0, sem >= 0)
"""

FIND = """
import ctypes, json, os, stat, sys
tok = sys.stdin.read()
print(os.getuid())
hits = []
for top in ("/sandbox", "/tmp", "/dev/shm"):
    for dp, dn, fn in os.walk(top):
        hits += [os.path.join(dp, n) for n in fn + dn if tok in n or "customize" in n]
libc = ctypes.CDLL(None, use_errno=True)
key = int(tok[:6], 16)
ipc = {"shm": libc.shmget(key, 0, 0), "msg": libc.msgget(key, 0), "sem": libc.semget(key, 0, 0)}
mode = stat.S_IMODE(os.stat("/sandbox").st_mode)
print(json.dumps({"hits": hits, "ipc": ipc, "sandbox_mode": oct(mode),
                   "listing": sorted(os.listdir("/sandbox"))}))
"""


async def test_files_and_ipc_left_for_the_next_run(sandbox: PoolInfo) -> None:
    tok = secrets.token_hex(8)
    planted = await per_slot(sandbox.pool, Program(source=PLANT, stdin=tok))
    for r in planted.values():
        assert r.stdout.split()[1:] == ["True", "True", "True"], r.stdout  # all planted
    found = await per_slot(sandbox.pool, Program(source=FIND, stdin=tok))
    assert set(found) == set(planted)
    for uid, r in found.items():
        seen = report(r)
        assert seen["hits"] == [], (uid, seen["hits"])
        assert seen["ipc"] == {"shm": -1, "msg": -1, "sem": -1}, seen["ipc"]
        assert seen["sandbox_mode"] == "0o755"  # the run's chmod of its work dir was undone
        assert seen["listing"] == ["main.py"]
        assert "PWNED" not in r.stdout + r.stderr


async def test_interpreter_and_site_packages_read_only(sandbox: PoolInfo) -> None:
    src = f"""
import json, os, site, sys, sysconfig
import json as victim
targets = [victim.__file__, os.__file__,
           os.path.join(os.path.dirname(os.__file__), "sitecustomize.py"),
           os.path.join(sysconfig.get_paths()["purelib"], "sitecustomize.py"),
           os.path.join(sysconfig.get_paths()["purelib"], "{MARKER}.pth"),
           os.path.join(sysconfig.get_paths()["stdlib"], "__pycache__", "{MARKER}.pyc"),
           "/usr/lib/python3/dist-packages/{MARKER}.pth", sys.executable, "/usr/bin/python3",
           "/bin/bash", "/usr/bin/gcc"]
targets += [os.path.join(p, "{MARKER}.pth") for p in site.getsitepackages()]
out = {{}}
for t in targets:
    try:
        with open(t, "a") as f:
            f.write("\\nimport os; os.system('echo PWNED')\\n")
        out[t] = "WRITTEN"
    except OSError as e:
        out[t] = e.errno
for t in (victim.__file__, sys.executable):
    try:
        os.chmod(t, 0o777)
        out["chmod " + t] = "CHANGED"
    except OSError as e:
        out["chmod " + t] = e.errno
    try:
        os.utime(t, (0, 0))
        out["utime " + t] = "CHANGED"
    except OSError as e:
        out["utime " + t] = e.errno
print(json.dumps(out))
"""
    seen = report(await attack(sandbox.pool, src))
    changed = [k for k, v in seen.items() if v in ("WRITTEN", "CHANGED")]
    assert not changed, changed
    import json as host_json  # the host's own copy is untouched too

    text = Path(host_json.__file__).read_text()
    assert "PWNED" not in text


MONKEYPATCH = """
import builtins, collections, json, math, os, random, re, sys, unittest
print(os.getuid())
json.dumps = lambda *a, **k: "PWNED"
math.pi = 3.0
random.random = lambda: 0.5
re.compile = None
collections.Counter = dict
unittest.TestCase.assertEqual = lambda self, a, b, msg=None: None
builtins.sorted = lambda it, **k: list(it)
builtins.PWNED = True
sys.modules["evil_module"] = type(sys)("evil_module")
sys.path.insert(0, "/tmp/evil")
os.environ["PWNED"] = "1"
sys.setrecursionlimit(50)
"""

CHECK_PRISTINE = """
import builtins, collections, json, math, os, random, re, sys, unittest
print(os.getuid())
class T(unittest.TestCase):
    def runTest(self):
        self.assertEqual(1, 2)
res = unittest.TestResult()
T().run(res)
print(json.dumps({
    "json": json.dumps([1]),
    "pi": math.pi,
    "random": random.random() != random.random(),
    "re": re.compile("a+") is not None,
    "counter": collections.Counter("aab")["a"],
    "assertEqual_fails": len(res.failures) == 1,
    "sorted": sorted([3, 1, 2]),
    "builtins_pwned": hasattr(builtins, "PWNED"),
    "evil_module": "evil_module" in sys.modules,
    "evil_path": "/tmp/evil" in sys.path,
    "env": "PWNED" in os.environ,
    "recursionlimit": sys.getrecursionlimit(),
}))
"""


async def test_monkeypatching_does_not_reach_the_next_run(sandbox: PoolInfo) -> None:
    patched = await per_slot(sandbox.pool, Program(source=MONKEYPATCH))
    clean = await per_slot(sandbox.pool, Program(source=CHECK_PRISTINE))
    assert set(clean) == set(patched)
    for r in clean.values():
        seen = report(r)
        assert seen == {
            "json": "[1]", "pi": 3.141592653589793, "random": True, "re": True, "counter": 2,
            "assertEqual_fails": True, "sorted": [1, 2, 3], "builtins_pwned": False,
            "evil_module": False, "evil_path": False, "env": False, "recursionlimit": 1000,
        }, seen


async def test_random_state_not_shared_between_runs(sandbox: PoolInfo) -> None:
    src = "import os, random\nprint(os.getuid(), random.getrandbits(64))\n"
    draws = [(await attack(sandbox.pool, src)).stdout.split()[1] for _ in range(4)]
    assert len(set(draws)) == 4, draws


# -- cross-run channels through state the slot keeps ------------------------------------------


async def test_previous_runs_argv_not_in_memory(sandbox: PoolInfo) -> None:
    tok = "SBXARGV" + secrets.token_hex(8)
    await per_slot(sandbox.pool, Program(source="import os; print(os.getuid())", argv=[tok]))
    scan = r"""
import ctypes, json, os, re
print(os.getuid())
found = set()
for line in open("/proc/self/maps").read().splitlines():
    f = line.split()
    if not f[1].startswith("r") or (len(f) > 5 and f[5].startswith("/")) or "[v" in line:
        continue
    lo, hi = (int(x, 16) for x in f[0].split("-"))
    try:
        data = ctypes.string_at(lo, hi - lo)
    except Exception:
        continue
    found.update(m.group().decode() for m in re.finditer(rb"SBXARGV[0-9a-f]{16}", data))
print(json.dumps({"found": sorted(found)}))
"""
    scans = await per_slot(sandbox.pool, Program(source=scan), limits(memory_mb=256))
    for r in scans.values():
        assert tok not in report(r)["found"], "a run read an earlier run's argv from memory"


async def test_no_network_state_left_for_the_next_run(sandbox: PoolInfo) -> None:
    port_a, port_b = 20000 + secrets.randbelow(20000), 40000 + secrets.randbelow(20000)
    writer = f"""
import os, socket
print(os.getuid())
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", {port_a})); srv.listen(1)
c = socket.socket(); c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
c.bind(("127.0.0.1", {port_b})); c.connect(("127.0.0.1", {port_a}))
a, _ = srv.accept(); a.close(); c.close(); srv.close()
"""
    reader = f"""
import json, os
print(os.getuid())
tables = "".join(open("/proc/net/" + t).read() for t in ("tcp", "tcp6")
                 if os.path.exists("/proc/net/" + t))  # tcp6: a kernel with IPv6
print(json.dumps({{"seen": [p for p in ({port_a}, {port_b}) if (":%04X" % p) in tables]}}))
"""
    await per_slot(sandbox.pool, Program(source=writer))
    for r in (await per_slot(sandbox.pool, Program(source=reader))).values():
        assert report(r)["seen"] == [], "the next run saw the previous run's sockets"


# A slot's runs take turns in one network namespace, entered only when the previous run left
# no trace in it: no socket in use, identical traffic counters (jail.c and
# zygote.server.Zygote.shared_net). Any trace: the next run gets a fresh namespace.

# The namespace's cookie (SO_NETNS_COOKIE, Linux 5.14+), not the inode number of
# /proc/self/ns/net: a namespace freed as the next one is made can pass its inode number on
# (seen in a User-mode Linux guest), while a cookie is never reused until the host reboots.
NET_NS = """
import os, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
print(os.getuid(), s.getsockopt(socket.SOL_SOCKET, 71, 8).hex())  # SO_NETNS_COOKIE
s.close()
"""


async def test_network_namespace_shared_only_while_untouched(sandbox: PoolInfo) -> None:
    """The mechanism the tests below attack: quiet runs share the slot's namespace (what
    saves creating and freeing one per run), a run that used the network is the last in it."""
    first = await per_slot(sandbox.pool, Program(source=NET_NS))
    again = await per_slot(sandbox.pool, Program(source=NET_NS))
    talk = "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', 9))\n"
    used = await per_slot(sandbox.pool, Program(source=talk + NET_NS))
    after = await per_slot(sandbox.pool, Program(source=NET_NS))
    for uid in first:
        ns = first[uid].stdout.split()[1]
        assert again[uid].stdout.split()[1] == ns, "quiet runs did not share the namespace"
        assert used[uid].stdout.split()[1] == ns
        assert after[uid].stdout.split()[1] != ns, "a run that used the network was not the last"


NET_TRACES = """
import socket
print(__import__("os").getuid())
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(b"x" * 1000, ("127.0.0.1", 9))
for dst in (("10.255.255.1", 9), ("2001:db8::1", 9)):  # no route: only counters change
    try:
        socket.socket(socket.AF_INET6 if ":" in dst[0] else socket.AF_INET,
                      socket.SOCK_DGRAM).sendto(b"x", dst)
    except OSError:
        pass
"""

READ_COUNTERS = """
import json, os
print(os.getuid())
lo = open("/proc/net/dev").read().split("lo:")[1].split()
snmp = open("/proc/net/snmp").read().splitlines()
def field(proto, name):
    head, vals = [l.split() for l in snmp if l.startswith(proto + ":")][:2]
    return int(vals[head.index(name)])
snmp6 = {}
if os.path.exists("/proc/net/snmp6"):  # a kernel with IPv6
    snmp6 = dict(l.split() for l in open("/proc/net/snmp6").read().splitlines() if l.strip())
print(json.dumps({"lo_rx_bytes": int(lo[0]), "lo_tx_packets": int(lo[9]),
                  "udp_out": field("Udp", "OutDatagrams"), "no_routes": field("Ip", "OutNoRoutes"),
                  "no_routes6": int(snmp6.get("Ip6OutNoRoutes", 0))}))
"""


async def test_traffic_counters_not_left_for_the_next_run(sandbox: PoolInfo) -> None:
    """A shared namespace's counters would carry bits from run to run: a run that changed them
    (traffic on lo, a send with no route) must be the last one in its namespace."""
    await per_slot(sandbox.pool, Program(source=NET_TRACES))
    for uid, r in (await per_slot(sandbox.pool, Program(source=READ_COUNTERS))).items():
        assert report(r) == {"lo_rx_bytes": 0, "lo_tx_packets": 0, "udp_out": 0, "no_routes": 0,
                             "no_routes6": 0}, (uid, report(r))


SILENT_TRACES = """
import os, socket, struct
print(os.getuid())
# An IPv6 flow label that lingers 60 s after its socket is closed, and a route that a connect
# caches (no packet is sent by either).
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
req = (socket.inet_pton(socket.AF_INET6, "::1") + struct.pack("!I", 0x5A5A5)
       + struct.pack("=BBHHHI", 0, 3, 1, 0, 60, 0))  # IPV6_FL_A_GET, IPV6_FL_S_ANY, CREATE
s.setsockopt(socket.IPPROTO_IPV6, 32, req)  # IPV6_FLOWLABEL_MGR
s.close()
c = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
c.connect(("::1", 9))
c.close()
print(open("/proc/net/ip6_flowlabel").read().lower().count("5a5a5"))
"""

READ_SILENT = """
import json, os
print(os.getuid())
labels = open("/proc/net/ip6_flowlabel").read().splitlines()[1:]
print(json.dumps({"labels": labels, "rt6_alloc": open("/proc/net/rt6_stats").read().split()[2]}))
"""


async def test_silent_network_traces_not_left_for_the_next_run(sandbox: PoolInfo) -> None:
    """State a run leaves in its network namespace without sending anything (a lingering IPv6
    flow label, a route cached by a connect) must not reach the next run."""
    if not os.path.exists("/proc/net/if_inet6"):
        pytest.skip("this kernel has no IPv6, where these traces live")
    for r in (await per_slot(sandbox.pool, Program(source=SILENT_TRACES))).values():
        assert r.stdout.split()[1] == "1", r.stdout  # planted: the label is listed
    for uid, r in (await per_slot(sandbox.pool, Program(source=READ_SILENT))).items():
        assert report(r) == {"labels": [], "rt6_alloc": "0000"}, (uid, report(r))


KEEP_SOCKETS = """
import array, os, socket
print(os.getuid())
tcp = socket.socket(); tcp.bind(("127.0.0.1", {port})); tcp.listen(8)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); udp.bind(("127.0.0.1", {port}))
unix = socket.socket(socket.AF_UNIX); unix.bind(b"\\0{name}"); unix.listen(8)
# Unix sockets in flight, each holding the other and the sockets above: once this process is
# gone, only the kernel's garbage collector (asynchronous) frees them. No packet is sent.
a, b = socket.socketpair()
fds = array.array("i", [a.fileno(), b.fileno(), tcp.fileno(), udp.fileno(), unix.fileno()])
a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
b.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
"""

FIND_SOCKETS = """
import json, os, socket
print(os.getuid())
tables = "".join(open("/proc/net/" + t).read() for t in ("tcp", "tcp6", "udp", "udp6", "unix")
                 if os.path.exists("/proc/net/" + t))  # tcp6, udp6: a kernel with IPv6
seen = [w for w in (":%04X" % {port}, "{name}") if w in tables]
probes = {{}}
for what, family, kind, addr in (("tcp", socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", {port})),
                                 ("unix", socket.AF_UNIX, socket.SOCK_STREAM, b"\\0{name}")):
    s = socket.socket(family, kind)
    try:
        s.connect(addr)
        probes[what] = "connected"
    except OSError as e:
        probes[what] = e.errno
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.bind(("127.0.0.1", {port}))
    probes["udp_bind"] = "free"
except OSError as e:
    probes["udp_bind"] = e.errno
print(json.dumps({{"seen": seen, "probes": probes}}))
"""


async def test_sockets_kept_by_the_kernel_not_left_for_the_next_run(sandbox: PoolInfo) -> None:
    """Listening TCP, bound UDP and abstract unix sockets that outlive their run (unix sockets
    in flight hold them until the kernel's garbage collector runs) must not be reachable, nor
    listed, in the next run: its namespace is a fresh one."""
    port, name = 20000 + secrets.randbelow(40000), f"sl-keep-{secrets.token_hex(6)}"
    await per_slot(sandbox.pool, Program(source=KEEP_SOCKETS.format(port=port, name=name)))
    for uid, r in (await per_slot(sandbox.pool, Program(
            source=FIND_SOCKETS.format(port=port, name=name)))).items():
        seen = report(r)
        assert seen["seen"] == [], (uid, seen)
        assert seen["probes"] == {"tcp": errno.ECONNREFUSED, "unix": errno.ECONNREFUSED,
                                  "udp_bind": "free"}, (uid, seen)


async def test_hostname_change_not_left_for_the_next_run(sandbox: PoolInfo) -> None:
    """Each run has a UTS namespace of its own: a hostname a run manages to set (it cannot:
    no capability) would never reach the next run."""
    setter = """
import ctypes, os
print(os.getuid())
libc = ctypes.CDLL(None, use_errno=True)
print(libc.sethostname(b"pwned-by-run", 12), ctypes.get_errno())
"""
    for r in (await per_slot(sandbox.pool, Program(source=setter))).values():
        assert r.stdout.split()[1:] == ["-1", str(errno.EPERM)], r.stdout
    reader = "import os, socket; print(os.getuid(), socket.gethostname(), os.uname().nodename)"
    for r in (await per_slot(sandbox.pool, Program(source=reader))).values():
        assert r.stdout.split()[1:] == ["sandbox", "sandbox"], r.stdout


async def test_work_dir_inode_numbers_reveal_nothing(sandbox: PoolInfo) -> None:
    probe = """
import os
fd = os.open("/sandbox/probe", os.O_CREAT | os.O_WRONLY, 0o644)
print(os.getuid(), os.fstat(fd).st_ino)
"""
    count = 300 + secrets.randbelow(200)
    writer = f"""
import os
print(os.getuid())
for i in range({count}):
    os.close(os.open("/sandbox/f%d" % i, os.O_CREAT | os.O_WRONLY, 0o644))
"""
    lim = limits(workdir_inodes=1024)
    before = await per_slot(sandbox.pool, Program(source=probe), lim)
    await per_slot(sandbox.pool, Program(source=writer), lim)
    after = await per_slot(sandbox.pool, Program(source=probe), lim)
    for uid in before:
        grew = int(after[uid].stdout.split()[1]) - int(before[uid].stdout.split()[1])
        assert grew < count, f"inode numbers advanced by {grew} after a run made {count} files"


# -- slot-breaking attacks, on a pool of their own ---------------------------------------------


async def test_deep_directory_tree_does_not_crash_the_zygote(sandbox: PoolInfo) -> None:
    src = """
import os
os.chdir("/sandbox")
n = 0
try:
    for _ in range(3000):
        os.mkdir("d"); os.chdir("d"); n += 1
except OSError as e:
    print("stopped:", e)
print("depth", n)
"""
    async with SandboxPool(1) as pool:
        slot = pool._slots[0]
        zygote = slot.zygote_pid
        uids = {pool.uid_base}
        r = await pool.run(Program(source=src), limits(workdir_inodes=4096, time_s=10))
        assert r.status is Status.OK and "depth 3000" in r.stdout, (r.stdout, r.stderr)
        nxt = await pool.run(Program(source="print('next')"), limits())
        assert nxt.status is Status.OK  # the pool hides the restart from the next program
        assert procs_of_uids(uids) == []
        assert leftover_work_files(slot.works_root, wait_s=1.0) == {}
        # The defence that should hold: the fork-server survives its own cleanup.
        assert slot.zygote_pid == zygote and slot.proc is not None and slot.proc.poll() is None


async def test_pool_close_leaves_nothing(sandbox: PoolInfo) -> None:
    host_mounts = mount_table()
    pool = SandboxPool(1)
    await pool.start()
    slot = pool._slots[0]
    name, base, zygote, uids = slot.name, slot.base, slot.zygote_pid, {pool.uid_base}
    assert any(name in groups for groups in sandloop_cgroups().values())
    # Leave as much behind as a run can: a daemon, files, a long sleep killed at the deadline.
    src = """
import os, time
if os.fork() == 0:
    os.setsid()
    time.sleep(60)
open("/sandbox/left", "w").write("x")
open("/tmp/left", "w").write("x")
time.sleep(60)
"""
    r = await pool.run(Program(source=src), Limits(time_s=0.5))
    assert r.status is Status.TIMEOUT
    await pool.close()
    assert procs_of_uids(uids) == []
    assert not Path(f"/proc/{zygote}").exists() or \
        Path(f"/proc/{zygote}/stat").read_text().split()[2] == "Z"
    assert not any(name in groups for groups in sandloop_cgroups().values()), \
        sandloop_cgroups()
    assert not base.exists()
    assert mount_table() == host_mounts
    # Pool closed twice, or used after close, must not resurrect anything behind our back.
    await pool.close()
    assert not any(name in groups for groups in sandloop_cgroups().values())

