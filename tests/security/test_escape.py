"""Escape and isolation: host files, other runs, network, sockets, signals, kernel surface.

Catalogue items E1-E24 of research/isolation.md §4.2. Each probe reports what it observed from
inside as JSON; where it is safe, the same probe is run with ``isolation="none"`` to show that
the attack works when the defence is off (so the assertion can fail).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import socket
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest
from sec_helpers import (
    MARKER,
    TIGHT,
    HostWorld,
    Listener,
    PoolInfo,
    abstract_listener,
    alive,
    attack,
    kill_quietly,
    limits,
    report,
    tcp_listener,
)

from sandloop.sandbox.host import runtime_binds
from sandloop.sandbox.languages import WORK_DIR, sandbox_env, spec_for
from sandloop.sandbox.models import Program, Status
from sandloop.sandbox.pool import SandboxPool, _step_limits

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.asyncio(loop_scope="session")

# A probe that tries to read one file and reports what happened.
READ_FILE = """
import json, sys
path = sys.stdin.read()
try:
    with open(path, "rb") as f:
        data = f.read(1 << 16)
    print(json.dumps({"read": True, "data": data.decode(errors="replace")}))
except OSError as e:
    print(json.dumps({"read": False, "errno": e.errno}))
"""


# -- host files --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/hostname",
        "/root/.npmrc",
        "/root/.bashrc",
        "/root/.gitconfig",
        str(REPO / "pyproject.toml"),
        str(REPO / "src/sandloop/sandbox/pool.py"),
        str(REPO.parent / "shared/DESIGN.md"),
        "/proc/1/root/etc/shadow",
        "/proc/1/environ",
        "SENTINEL",
    ],
)
async def test_read_host_file(sandbox: PoolInfo, host_world: HostWorld, path: str) -> None:
    target = str(host_world.sentinel) if path == "SENTINEL" else path
    r = await attack(sandbox.pool, READ_FILE, stdin=target)
    seen = report(r)
    assert seen["read"] is False, f"sandbox read host file {target}: {seen}"
    assert seen["errno"] in (errno.ENOENT, errno.EACCES, errno.ENOTDIR)


async def test_read_sentinel_works_unisolated(sandbox: PoolInfo, host_world: HostWorld) -> None:
    r = await attack(sandbox.unisolated, READ_FILE, stdin=str(host_world.sentinel))
    seen = report(r)
    assert seen["read"] is True and seen["data"] == host_world.sentinel_text


LIST_DIRS = """
import json, os, sys
out = {}
for d in json.load(sys.stdin):
    try:
        out[d] = sorted(os.listdir(d))
    except OSError as e:
        out[d] = e.errno
try:
    out["passwd"] = open("/etc/passwd").read()
except OSError as e:
    out["passwd"] = str(e)
print(json.dumps(out))
"""


def _visible_tree(binds: tuple[str, ...]) -> dict[str, set[str]]:
    """What each directory on the way to a runtime bind may show: only the next component."""
    tree: dict[str, set[str]] = {}
    for b in binds:
        parts = Path(b).parts[1:]
        for i in range(len(parts)):
            parent = "/" + "/".join(parts[:i]) if i else "/"
            tree.setdefault(parent, set()).add(parts[i])
    return tree


async def test_host_directories_invisible(sandbox: PoolInfo) -> None:
    # The pool binds the host's runtime without its Python (runtime_binds(None)) and the
    # environment's tree at /opt/env: no host interpreter prefix, no venv, no checkout.
    binds, symlinks = runtime_binds(None)
    binds = (*binds, "/opt/env")
    tree = _visible_tree(binds)
    # Directories leading to a bind show only the path to it; everything else of the host
    # does not exist at all.
    probe = sorted({*tree, "/root", "/home", "/etc", "/var", "/run", "/mnt", "/opt", "/srv",
                    "/boot", "/var/tmp", "/dev", str(REPO), str(REPO.parent)})
    seen = report(await attack(sandbox.pool, LIST_DIRS, stdin=json.dumps(probe)))
    allowed_root = {"usr", "etc", "tmp", "sandbox", "dev", "proc",
                    ".zygote",  # the zygote's private area: an empty, root-only mount point
                    ".sandloop",  # bin/python -> the pool's interpreter
                    *(Path(x).parts[1] for x in (*binds, *symlinks))}
    assert set(seen["/"]) <= allowed_root, seen["/"]
    for d, allowed in tree.items():
        if d in ("/", "/etc"):
            continue
        assert set(seen[d]) <= allowed, (d, seen[d])
    # /etc/java-<version>: Debian's JDK configuration (jvm.cfg, java.security), no secrets.
    jdk_conf = {Path(b).name for b in binds if b.startswith("/etc/java-")}
    assert set(seen["/etc"]) <= {"passwd", "group", "hosts", "alternatives", "ld.so.cache",
                                 "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf",
                                 "ssl", *jdk_conf}, seen["/etc"]
    bound = {d for b in binds for d in (b, *map(str, Path(b).parents))}
    # A checkout under a directory the sandbox has of its own (/tmp: a fresh tmpfs) must not
    # show in it; anywhere else its parent must not exist at all.
    own = {"/", *(f"/{x}" for x in allowed_root)}
    if str(REPO.parent) in own:
        assert REPO.name not in seen[str(REPO.parent)], seen[str(REPO.parent)]
    for d in ("/home", "/var", "/run", "/mnt", "/opt", "/srv", "/boot", "/var/tmp",
              str(REPO), *([] if str(REPO.parent) in own else [str(REPO.parent)])):
        if d not in bound:
            assert seen[d] == errno.ENOENT, (d, seen[d])
        else:  # the repo holds the venv: only that is visible
            assert set(seen[d]) <= tree.get(d, set()), (d, seen[d])
    assert set(seen["/dev"]) <= {"null", "zero", "full", "random", "urandom", "fd", "stdin",
                                 "stdout", "stderr", "shm"}, seen["/dev"]
    host_users = {ln.split(":")[0] for ln in Path("/etc/passwd").read_text().splitlines() if ln}
    sandbox_users = {ln.split(":")[0] for ln in str(seen["passwd"]).splitlines() if ln}
    assert sandbox_users <= {"root", "sandbox", "nobody"}
    assert host_users - sandbox_users  # the host has users the sandbox must not learn about


async def test_host_directories_visible_unisolated(sandbox: PoolInfo) -> None:
    # Unisolated, the host's tree is there (not root, the run cannot enter /root, mode 0700).
    seen = report(await attack(sandbox.unisolated, LIST_DIRS,
                               stdin=json.dumps(["/root", "/etc", str(REPO)])))
    assert "passwd" in seen["/etc"] and "pyproject.toml" in seen[str(REPO)]
    if os.stat("/root").st_mode & 0o005 == 0:
        assert seen["/root"] == errno.EACCES


async def test_compile_time_include_of_host_file(sandbox: PoolInfo, host_world: HostWorld) -> None:
    # gcc echoes the offending line of an included file: a classic judge leak (kjudge#82).
    src = f'#include "{host_world.sentinel}"\n#include "/etc/shadow"\nint main(void){{return 0;}}\n'
    r = await attack(sandbox.pool, src, "c")
    assert r.status is Status.COMPILE_ERROR
    assert r.compile is not None
    blob = r.compile.stdout + r.compile.stderr
    assert "HOST-SENTINEL" not in blob
    assert "No such file" in blob
    # Without isolation the compiler prints the host file's contents back.
    bare = await attack(sandbox.unisolated, src.replace('#include "/etc/shadow"\n', ""), "c")
    assert bare.compile is not None
    assert "HOST-SENTINEL" in bare.compile.stdout + bare.compile.stderr


# -- writing outside the work dir --------------------------------------------------------------

WRITE_OUTSIDE = f"""
import json, os, sys, sysconfig
paths = ["/{MARKER}", "/etc/{MARKER}", "/usr/{MARKER}", "/usr/bin/{MARKER}",
         "/usr/local/bin/{MARKER}", "/root/{MARKER}", sys.prefix + "/{MARKER}",
         os.path.dirname(sys.prefix) + "/{MARKER}", "/dev/{MARKER}", "/proc/{MARKER}", "/lib/{MARKER}",
         os.path.join(sysconfig.get_paths()["purelib"], "{MARKER}.pth"),
         os.path.join(os.path.dirname(os.__file__), "{MARKER}.py")]
out = {{}}
for p in paths:
    try:
        with open(p, "w") as f:
            f.write("import os; os.system('id')\\n")
        out[p] = "WRITTEN"
    except OSError as e:
        out[p] = e.errno
for p in ("/sandbox/ok", "/tmp/ok"):
    with open(p, "w") as f:
        f.write("fine")
    out[p] = "WRITTEN"
print(json.dumps(out))
"""


async def test_write_outside_workdir(sandbox: PoolInfo) -> None:
    seen = report(await attack(sandbox.pool, WRITE_OUTSIDE))
    written = [p for p, v in seen.items() if v == "WRITTEN" and p not in ("/sandbox/ok", "/tmp/ok")]
    assert not written, f"wrote outside the work dir: {written}"
    assert seen["/sandbox/ok"] == seen["/tmp/ok"] == "WRITTEN"
    for p, v in seen.items():
        if v != "WRITTEN":
            assert v in (errno.EROFS, errno.EACCES, errno.ENOENT, errno.EPERM), (p, v)


async def test_proc_sys_and_sysrq_not_writable(sandbox: PoolInfo) -> None:
    src = """
import json
out = {}
for p, v in (("/proc/sys/kernel/hostname", "pwned"), ("/proc/sys/vm/drop_caches", "3"),
             ("/proc/sysrq-trigger", "h"), ("/proc/sys/kernel/core_pattern", "|/tmp/x"),
             ("/proc/sys/kernel/pid_max", "4194304"), ("/proc/self/oom_score_adj", "-1000")):
    try:
        with open(p, "w") as f:
            f.write(v)
        out[p] = "WRITTEN"
    except OSError as e:
        out[p] = e.errno
print(json.dumps(out))
"""
    seen = report(await attack(sandbox.pool, src))
    assert all(v != "WRITTEN" for v in seen.values()), seen


# -- other runs --------------------------------------------------------------------------------

HOLDER = f"""
import os, sys, time
tok = sys.stdin.read()
for d in {{dirs}}:
    with open(os.path.join(d, "{MARKER}_" + tok), "w") as f:
        f.write("other run's secret")
print(os.getuid(), os.getcwd(), flush=True)
time.sleep({{hold_s}})
"""

SEARCHER = """
import glob, json, os, sys, time
args = json.loads(sys.stdin.read())
tok = args["tok"]
time.sleep(0.4)
hits = []
pats = ["/sandbox/*", "/tmp/*", "/tmp/*/*", "/dev/shm/*", "/run/**", "/var/tmp/*/*",
        "/proc/*/root/sandbox/*", "/proc/*/cwd/*", "/proc/*/root/tmp/*", "/proc/*/root/*/*"]
for pat in pats:
    hits += [p for p in glob.glob(pat, recursive=True) if tok in p]
# Then the rest of the file system, for as long as the holder surely lives (unisolated, that is
# the whole host: a shared one's /tmp alone can take longer than the run may).
deadline = time.monotonic() + 1.5
for top in os.listdir("/"):
    if top in ("usr", "proc", "root", "work", "lib", "lib64", "bin", "sbin"):
        continue
    for dp, dn, fn in os.walk("/" + top):
        hits += [os.path.join(dp, f) for f in fn if tok in f]
        if time.monotonic() > deadline:
            break
explicit = {}
for p in args["paths"]:
    try:
        explicit[p] = sorted(os.listdir(p))
    except OSError as e:
        explicit[p] = e.errno
print(json.dumps({"uid": os.getuid(), "hits": sorted(set(hits)), "explicit": explicit}))
"""


async def test_other_runs_work_dirs_invisible(sandbox: PoolInfo) -> None:
    tok = os.urandom(8).hex()
    slot_dirs = [f"{s.base}/work" for s in sandbox.pool._slots]
    explicit = [*slot_dirs, "/.zygote", "/.zygote/work", "/.zygote/proc",
                *[f"/proc/{pid}/root/.zygote/work" for pid in sandbox.zygotes.values()]]
    holder = HOLDER.replace("{dirs}", repr(["/sandbox", "/tmp"])).replace("{hold_s}", "1.5")
    a, b = await asyncio.gather(
        attack(sandbox.pool, holder, stdin=tok, lim=limits(time_s=4)),
        attack(sandbox.pool, SEARCHER, stdin=json.dumps({"tok": tok, "paths": explicit}),
               lim=limits(time_s=4)),
    )
    assert a.status is Status.OK and b.status is Status.OK, (a.stderr, b.stderr)
    seen = report(b)
    assert int(a.stdout.split()[0]) != seen["uid"], "both runs landed on the same slot"
    assert seen["hits"] == [], seen["hits"]
    assert all(v in (errno.ENOENT, errno.EACCES) for v in seen["explicit"].values()), seen


async def test_other_runs_work_dirs_unreadable_unisolated(sandbox: PoolInfo) -> None:
    # Unisolated, another run's work dir is on the host's file system in plain sight; what
    # keeps its files out of reach is the run's own uid (one per concurrent run) and the dir's
    # mode 0700.
    tok = os.urandom(8).hex()
    # The holder keeps its file until the searcher surely looked (its globs take well under a
    # second; the rest of its walk stops after 1.5 s): on a loaded machine a holder gone
    # before the search would make the test pass without the defence.
    holder = HOLDER.replace("{dirs}", repr(["."])).replace("{hold_s}", "6")  # never /tmp itself
    tmp = tempfile.gettempdir()  # where unisolated runs get their work dirs
    a, b = await asyncio.gather(
        attack(sandbox.unisolated, holder, stdin=tok, lim=limits(time_s=12)),
        attack(sandbox.unisolated, SEARCHER, stdin=json.dumps({"tok": tok, "paths": [tmp]}),
               lim=limits(time_s=12)),
    )
    assert a.status is Status.OK and b.status is Status.OK, (a.stderr, b.stderr)
    seen = report(b)
    holder_uid, holder_dir = a.stdout.split()
    assert int(holder_uid) != seen["uid"] != 0, "both runs had the same uid"
    # The search did reach the holder's work dir (its name, in the temp dir): only its mode
    # and owner kept the file inside out of sight.
    assert os.path.dirname(holder_dir) == tmp, holder_dir
    assert os.path.basename(holder_dir) in seen["explicit"][tmp], holder_dir
    assert seen["hits"] == [], seen["hits"]


# -- network -----------------------------------------------------------------------------------

NET_PROBE = """
import json, socket, sys
args = json.loads(sys.stdin.read())
out = {"ifaces": [n for _, n in socket.if_nameindex()]}
def tcp(host, port):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect((host, port))
        s.sendall(b"pwned from the sandbox")
        return "CONNECTED"
    except OSError as e:
        return e.errno if e.errno is not None else repr(e)
    finally:
        s.close()
for host, port in args["targets"]:
    out[f"{host}:{port}"] = tcp(host, port)
try:
    socket.getaddrinfo("example.com", 80)
    out["dns"] = "RESOLVED"
except OSError as e:
    out["dns"] = str(e)
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b"x", ("8.8.8.8", 53))
    out["udp"] = "SENT"
except OSError as e:
    out["udp"] = e.errno
# A server of its own on the sandbox's loopback works (lo is up), but is the sandbox's own.
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
c = socket.create_connection(srv.getsockname(), timeout=1); c.close()
out["own_loopback"] = "OK"
print(json.dumps(out))
"""


async def test_network_to_internet_unreachable(sandbox: PoolInfo) -> None:
    stdin = json.dumps({"targets": [["8.8.8.8", 53], ["1.1.1.1", 443], ["169.254.169.254", 80],
                                    ["2001:4860:4860::8888", 53]]})
    seen = report(await attack(sandbox.pool, NET_PROBE, stdin=stdin))
    assert seen["ifaces"] == ["lo"]
    for target in ("8.8.8.8:53", "1.1.1.1:443", "169.254.169.254:80", "2001:4860:4860::8888:53"):
        assert seen[target] in (errno.ENETUNREACH, errno.EHOSTUNREACH), (target, seen[target])
    assert seen["dns"] != "RESOLVED"
    assert seen["udp"] == errno.ENETUNREACH
    assert seen["own_loopback"] == "OK"


async def test_host_loopback_service_unreachable(sandbox: PoolInfo, host_world: HostWorld) -> None:
    port = host_world.tcp.port
    stdin = json.dumps({"targets": [["127.0.0.1", port], ["::1", port], ["localhost", port]]})
    seen = report(await attack(sandbox.pool, NET_PROBE, stdin=stdin))
    for key in (f"127.0.0.1:{port}", f"::1:{port}", f"localhost:{port}"):
        assert seen[key] in (errno.ECONNREFUSED, errno.EADDRNOTAVAIL), (key, seen[key])
    assert host_world.tcp.wait_for(1, timeout=0.2) == 0


async def test_host_loopback_service_reachable_unisolated(sandbox: PoolInfo) -> None:
    with tcp_listener() as demo:
        stdin = json.dumps({"targets": [["127.0.0.1", demo.port]]})
        seen = report(await attack(sandbox.unisolated, NET_PROBE, stdin=stdin))
        assert seen[f"127.0.0.1:{demo.port}"] == "CONNECTED"
        assert demo.wait_for(1) == 1


UNIX_PROBE = """
import json, socket, sys
args = json.loads(sys.stdin.read())
out = {}
for label, addr in (("abstract", "\\0" + args["abstract"]), ("path", args["path"])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(addr)
        s.sendall(b"pwned")
        out[label] = "CONNECTED"
    except OSError as e:
        out[label] = e.errno
    finally:
        s.close()
print(json.dumps(out))
"""


async def test_unix_and_abstract_sockets_unreachable(sandbox: PoolInfo,
                                                     host_world: HostWorld) -> None:
    stdin = json.dumps({"abstract": host_world.abstract_name, "path": host_world.unix_path})
    seen = report(await attack(sandbox.pool, UNIX_PROBE, stdin=stdin))
    assert seen["abstract"] == errno.ECONNREFUSED  # the abstract namespace is per netns
    assert seen["path"] == errno.ENOENT  # the host's directories are not mounted
    assert host_world.abstract.accepted == 0 and host_world.unix.accepted == 0


async def test_unix_and_abstract_sockets_reachable_unisolated(sandbox: PoolInfo) -> None:
    with abstract_listener() as (abstract, name), tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)  # open to every user, as a service's socket directory would be
        path = os.path.join(d, "demo.sock")
        unix = Listener(socket.AF_UNIX, path)
        os.chmod(path, 0o777)
        try:
            stdin = json.dumps({"abstract": name, "path": path})
            seen = report(await attack(sandbox.unisolated, UNIX_PROBE, stdin=stdin))
            assert seen == {"abstract": "CONNECTED", "path": "CONNECTED"}
            assert abstract.wait_for(1) == 1 and unix.wait_for(1) == 1
        finally:
            unix.close()


VSOCK_PROBE = """
import json, socket
try:
    s = socket.socket(40, socket.SOCK_STREAM)  # AF_VSOCK
    s.close()
    out = {"socket": "CREATED"}
except OSError as e:
    out = {"socket": e.errno}
for typ in (socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):
    try:
        socket.socket(40, typ).close()
        out[str(typ)] = "CREATED"
    except OSError as e:
        out[str(typ)] = e.errno
print(json.dumps(out))
"""


async def test_vsock_denied(sandbox: PoolInfo) -> None:
    seen = report(await attack(sandbox.pool, VSOCK_PROBE))
    assert all(v == errno.EAFNOSUPPORT for v in seen.values()), seen


async def test_vsock_available_unisolated(sandbox: PoolInfo) -> None:
    if not os.path.exists("/dev/vsock"):
        pytest.skip("this host has no vsock transport")
    assert report(await attack(sandbox.unisolated, VSOCK_PROBE))["socket"] == "CREATED"


# -- processes: ptrace, signals, /proc ---------------------------------------------------------

PTRACE_PROBE = """
import ctypes, json, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
out = {}
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
r = libc.ptrace(16, child, None, None)  # PTRACE_ATTACH
out["attach"] = "ATTACHED" if r == 0 else ctypes.get_errno()
if r == 0:
    os.waitpid(child, 0)
    libc.ptrace(17, child, None, None)  # PTRACE_DETACH
r = libc.ptrace(0x4206, child, None, None)  # PTRACE_SEIZE
out["seize"] = "SEIZED" if r == 0 else ctypes.get_errno()
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(64)
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
remote = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
libc.process_vm_readv.restype = ctypes.c_ssize_t
r = libc.process_vm_readv(child, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
out["process_vm_readv"] = "READ" if r >= 0 else ctypes.get_errno()
try:
    with open(f"/proc/{child}/mem", "rb") as f:
        out["proc_mem"] = "OPENED"
except OSError as e:
    out["proc_mem"] = e.errno
os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)
print(json.dumps(out))
"""


async def test_ptrace_and_process_vm_denied(sandbox: PoolInfo) -> None:
    seen = report(await attack(sandbox.pool, PTRACE_PROBE))
    assert seen["attach"] == errno.EPERM
    assert seen["seize"] == errno.EPERM
    assert seen["process_vm_readv"] == errno.EPERM
    assert seen["proc_mem"] in (errno.EACCES, errno.EPERM)


async def test_ptrace_works_unisolated(sandbox: PoolInfo) -> None:
    seen = report(await attack(sandbox.unisolated, PTRACE_PROBE))
    assert seen["attach"] == "ATTACHED" and seen["process_vm_readv"] == "READ"


KILL_PROBE = """
import json, os, sys
args = json.loads(sys.stdin.read())
out = {"targets": {}}
for pid in args["targets"]:
    try:
        os.kill(pid, 9)
        out["targets"][str(pid)] = "KILLED"
    except OSError as e:
        out["targets"][str(pid)] = e.errno
killed = []
if args["sweep"]:
    for pid in range(2, args["pid_max"]):
        try:
            os.kill(pid, 9)
            killed.append(pid)
        except OSError:
            pass
    for call in (lambda: os.kill(-1, 9), lambda: os.killpg(1, 9), lambda: os.kill(1, 9)):
        try:
            call()
        except OSError:
            pass
out["killed"] = killed
print(json.dumps(out))
"""


async def test_signal_supervisor_zygote_and_host(sandbox: PoolInfo, host_world: HostWorld) -> None:
    targets = [os.getpid(), os.getppid(), 1, host_world.service.pid, *sandbox.zygotes.values()]
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    stdin = json.dumps({"targets": targets, "sweep": True, "pid_max": min(pid_max, 1 << 16)})
    r = await attack(sandbox.pool, KILL_PROBE, stdin=stdin, lim=limits(time_s=10))
    assert r.status is Status.OK, (r.status, r.stderr[-500:])
    seen = report(r)
    # pid 1 is the sandbox's own init (itself): a signal from inside its namespace is ignored.
    for pid, res in seen["targets"].items():
        if pid != "1":
            assert res == errno.ESRCH, (pid, res)
    assert seen["killed"] == [], "the sandbox could signal processes outside its own tree"
    assert host_world.service.poll() is None
    for pid in sandbox.zygotes.values():
        assert alive(pid)
    # The slot still serves runs.
    again = await attack(sandbox.pool, "print('alive')")
    assert again.status is Status.OK and again.stdout == "alive\n"


async def test_host_process_found_but_not_killed_unisolated(sandbox: PoolInfo) -> None:
    # Without the pid namespace a host process is there to be signalled (EPERM, not ESRCH as
    # above); only the unprivileged uid that unisolated runs get keeps this root one alive.
    decoy = subprocess.Popen(["sleep", "1000"])
    try:
        stdin = json.dumps({"targets": [decoy.pid], "sweep": False, "pid_max": 0})
        seen = report(await attack(sandbox.unisolated, KILL_PROBE, stdin=stdin))
        assert seen["targets"][str(decoy.pid)] == errno.EPERM
        assert decoy.poll() is None
    finally:
        kill_quietly(decoy)


PROC_PROBE = """
import json, os, sys, time
args = json.loads(sys.stdin.read())
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
tcp = open("/proc/net/tcp").read() + open("/proc/net/tcp6").read()
unix = open("/proc/net/unix").read()
port_hex = ":%04X" % args["port"]
out = {
    "pids": pids, "child": child,
    "host_pids_visible": [p for p in args["host_pids"] if os.path.exists(f"/proc/{p}")],
    "listener_in_proc_net": port_hex in tcp,
    "abstract_in_proc_net": args["abstract"] in unix,
    "sys": os.path.exists("/sys/class/net"),
    "sys_kernel": os.path.exists("/sys/kernel"),
    "cmdlines": [],
}
for p in pids:
    try:
        out["cmdlines"].append(open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace"))
    except OSError:
        pass
os.kill(child, 9)
print(json.dumps(out))
"""


async def test_proc_and_sys_show_only_the_sandbox(sandbox: PoolInfo,
                                                  host_world: HostWorld) -> None:
    host_pids = [os.getpid(), host_world.service.pid, *sandbox.zygotes.values()]
    stdin = json.dumps({"port": host_world.tcp.port, "abstract": host_world.abstract_name,
                        "host_pids": host_pids})
    seen = report(await attack(sandbox.pool, PROC_PROBE, stdin=stdin))
    assert seen["pids"] == [1, seen["child"]]
    assert seen["child"] == 2
    assert seen["host_pids_visible"] == [] or all(p in (1, 2) for p in seen["host_pids_visible"])
    assert not seen["listener_in_proc_net"]
    assert not seen["abstract_in_proc_net"]
    assert not seen["sys"] and not seen["sys_kernel"]
    assert not any(host_world.secret in c for c in seen["cmdlines"])


async def test_proc_and_sys_leak_unisolated(sandbox: PoolInfo, host_world: HostWorld) -> None:
    stdin = json.dumps({"port": host_world.tcp.port, "abstract": host_world.abstract_name,
                        "host_pids": [host_world.service.pid]})
    # The host's every command line comes back: more than TIGHT's 64 KiB on a busy host.
    seen = report(await attack(sandbox.unisolated, PROC_PROBE, stdin=stdin,
                               lim=limits(stdout_bytes=8 << 20)))
    assert seen["host_pids_visible"] == [host_world.service.pid]
    assert seen["listener_in_proc_net"] and seen["abstract_in_proc_net"] and seen["sys"]


# -- environment, identity, hostname -----------------------------------------------------------

ENV_PROBE = """
import json, os, sys
secret = sys.stdin.read()
out = {"environ": dict(os.environ), "found": []}
for p in os.listdir("/proc"):
    if not p.isdigit() and p not in ("self", "thread-self"):
        continue
    for leaf in ("environ", "cmdline"):
        try:
            data = open(f"/proc/{p}/{leaf}", "rb").read().decode(errors="replace")
        except OSError:
            continue
        if secret in data:
            out["found"].append(f"/proc/{p}/{leaf}")
if any(secret in v for v in os.environ.values()):
    out["found"].append("os.environ")
print(json.dumps(out))
"""


async def test_environment_secrets_not_inherited(sandbox: PoolInfo,
                                                 host_world: HostWorld) -> None:
    assert os.environ[host_world.secret_env] == host_world.secret  # set before the pool started
    seen = report(await attack(sandbox.pool, ENV_PROBE, stdin=host_world.secret))
    assert seen["found"] == []
    assert host_world.secret_env not in seen["environ"]
    assert set(seen["environ"]) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "USER",
                                    "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING",
                                    "PYTHONHASHSEED", "TZ"}  # the environment's determinism
    sh = await attack(sandbox.pool, f'env; cat /proc/self/environ; echo "${host_world.secret_env}"',
                      "bash")
    assert sh.status is Status.OK
    assert host_world.secret not in sh.stdout and host_world.secret_env not in sh.stdout


async def test_environment_secrets_of_root_unreadable_unisolated(sandbox: PoolInfo,
                                                                 host_world: HostWorld) -> None:
    # Unisolated, the host service is in plain sight in /proc (no pid namespace); its secret
    # stays out of reach only because the run is not root (its environ is the owner's alone).
    seen = report(await attack(sandbox.unisolated, ENV_PROBE, stdin=host_world.secret))
    assert seen["found"] == []
    seen = report(await attack(sandbox.unisolated, "import os, json\n"
                               "print(json.dumps({'proc': os.listdir('/proc')}))\n"))
    assert str(host_world.service.pid) in seen["proc"]  # type: ignore[operator]


# The sethostname attempt sets the name the host has now (stdin): were a defence gone and the
# call reached the host, it would still change nothing there.
ID_PROBE = """
import json, os, socket, sys
current = sys.stdin.read().encode()
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
out = {k: status[k].strip() for k in ("Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd",
                                       "CapAmb", "NoNewPrivs", "Seccomp")}
out["groups"] = os.getgroups()
out["hostname"] = socket.gethostname()
out["nodename"] = os.uname().nodename
try:
    out["proc_hostname"] = open("/proc/sys/kernel/hostname").read().strip()
except OSError as e:
    out["proc_hostname"] = e.errno
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
r = libc.sethostname(current, len(current))
out["sethostname"] = "SET" if r == 0 else ctypes.get_errno()
out["dumpable"] = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
for name, call in (("setuid0", lambda: os.setuid(0)), ("setresuid0", lambda: os.setresuid(0, 0, 0)),
                   ("setgid0", lambda: os.setgid(0)), ("setgroups", lambda: os.setgroups([0]))):
    try:
        call()
        out[name] = "OK"
    except OSError as e:
        out[name] = e.errno
print(json.dumps(out))
"""


async def test_unprivileged_identity(sandbox: PoolInfo) -> None:
    seen = report(await attack(sandbox.pool, ID_PROBE, stdin=socket.gethostname()))
    uids = {int(x) for x in seen["Uid"].split()}
    assert len(uids) == 1 and next(iter(uids)) in sandbox.uids and 0 not in uids
    assert {int(x) for x in seen["Gid"].split()} == uids
    assert seen["groups"] in ([], [next(iter(uids))])
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(seen[cap], 16) == 0, (cap, seen[cap])
    assert seen["NoNewPrivs"] == "1"
    assert seen["Seccomp"] == "2"
    # Not dumpable: no process of the slot's uid may open this one's /proc/<pid>/mem or fds.
    assert seen["dumpable"] == 0
    for name in ("setuid0", "setresuid0", "setgid0", "setgroups"):
        assert seen[name] == errno.EPERM, (name, seen[name])


async def test_supervisor_groups_do_not_reach_runs(sandbox: PoolInfo) -> None:
    # A supervisor started with supplementary groups (a daemon in "docker", "disk", ...) must
    # not pass them on: the zygote inherits them, each run must drop them.
    before = os.getgroups()
    os.setgroups([6, 4242])
    try:
        pool = SandboxPool(1)
        await pool.start()
    finally:
        os.setgroups(before)
    try:
        seen = report(await attack(pool, ID_PROBE, stdin=socket.gethostname()))
    finally:
        await pool.close()
    assert 6 not in seen["groups"] and 4242 not in seen["groups"], seen["groups"]


async def test_file_table_cannot_name_host_paths(sandbox: PoolInfo) -> None:
    # The API refuses absolute names before they reach a run; the child refuses them again,
    # in case a table ever reaches it unchecked (here, hand-made, below the API).
    slot = sandbox.pool._slots[0]
    await sandbox.pool._free.acquire(slot)  # type: ignore[union-attr]
    try:
        spec = spec_for("python", main_dir=WORK_DIR)
        raw = b"/etc/sandloop-planted"
        table = struct.pack("<IQH", len(raw), 1, 0o644) + raw + b"x"
        main = spec.main_file.encode()
        table += struct.pack("<IQH", len(main), 5, 0o644) + main + b"pass\n"
        o = await slot.execute(spec.run, _step_limits(TIGHT, compile_step=False), stdin=b"",
                               files=table, env=sandbox_env("python"))
    finally:
        sandbox.pool._free.release(slot)  # type: ignore[union-attr]
    assert o.setup_error is not None and "outside" in o.setup_error, o
    assert not os.path.exists("/etc/sandloop-planted")


async def test_run_without_its_cgroups_is_refused_fault_injected(
        sandbox: PoolInfo, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fault injection: a supervisor bug that sends a run without its cgroup files. The run
    # would stay in the slot's group, which has no limits; the zygote refuses it instead.
    from sandloop.sandbox import cgroups

    monkeypatch.setattr(cgroups.Cgroup, "procs_files", property(lambda self: []))
    monkeypatch.setattr(cgroups.Cgroup, "procs_fds", lambda self: [])
    slot = sandbox.pool._slots[0]
    await sandbox.pool._free.acquire(slot)  # type: ignore[union-attr]
    try:
        spec = spec_for("python", main_dir=WORK_DIR)
        main = spec.main_file.encode()
        src = b"print('ran unlimited')\n"
        table = struct.pack("<IQH", len(main), len(src), 0o644) + main + src
        o = await slot.execute(spec.run, _step_limits(TIGHT, compile_step=False), stdin=b"",
                               files=table, env=sandbox_env("python"))
    finally:
        sandbox.pool._free.release(slot)  # type: ignore[union-attr]
    assert o.infra_error is not None and "cgroups" in o.infra_error, o
    assert o.wait_status is None and b"ran" not in o.stdout


async def test_hostname_isolated(sandbox: PoolInfo, host_world: HostWorld) -> None:
    seen = report(await attack(sandbox.pool, ID_PROBE, stdin=socket.gethostname()))
    assert seen["hostname"] == seen["nodename"] == seen["proc_hostname"] == "sandbox"
    assert seen["sethostname"] == errno.EPERM
    assert socket.gethostname() == host_world.hostname  # the host's name is unchanged


async def test_identity_and_hostname_unisolated(sandbox: PoolInfo, host_world: HostWorld) -> None:
    # Unisolated is never root: a program that runs as root with the host's UTS namespace
    # renames the machine (this test did, before runs dropped root).
    seen = report(await attack(sandbox.unisolated, ID_PROBE, stdin=socket.gethostname()))
    uids = {int(x) for x in seen["Uid"].split()}
    assert len(uids) == 1 and 0 not in uids, seen["Uid"]
    assert uids == {int(x) for x in seen["Gid"].split()}
    assert seen["groups"] in ([], [next(iter(uids))])
    assert int(seen["CapEff"], 16) == 0 and int(seen["CapPrm"], 16) == 0
    assert seen["sethostname"] == errno.EPERM
    assert seen["setuid0"] == errno.EPERM
    assert seen["nodename"] == host_world.hostname  # the host's own UTS namespace


SETUID_PROBE = f"""
set +e
ls -l /usr/bin/su /usr/bin/mount /usr/bin/passwd 2>&1 | head -3
su root -c "touch /tmp/{MARKER}_su" </dev/null; echo "su_rc=$?"
mount -t tmpfs none /tmp </dev/null; echo "mount_rc=$?"
umount /proc </dev/null; echo "umount_rc=$?"
test -e /tmp/{MARKER}_su && echo SU_WORKED
grep -c ' /tmp ' /proc/self/mountinfo
grep NoNewPrivs /proc/self/status
grep ' /usr ' /proc/self/mountinfo
"""


async def test_setuid_binaries_give_no_privilege(sandbox: PoolInfo) -> None:
    r = await attack(sandbox.pool, SETUID_PROBE, "bash")
    out = r.stdout
    assert "umount_rc=" in out and " /usr " in out, (r.status, out, r.stderr)
    assert "SU_WORKED" not in out
    for tool in ("su", "mount", "umount"):
        line = next(ln for ln in out.splitlines() if ln.startswith(f"{tool}_rc="))
        assert line != f"{tool}_rc=0", out
    assert "NoNewPrivs:\t1" in out
    usr_line = next(ln for ln in out.splitlines() if " /usr " in ln)
    assert "nosuid" in usr_line and " ro," in usr_line


MOUNT_PROBE = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
def sc(name, *args):
    r = libc.syscall(*args)
    out[name] = "OK" if r >= 0 else ctypes.get_errno()
os.makedirs("/tmp/m", exist_ok=True)
sc("mount", 165, b"none", b"/tmp/m", b"tmpfs", 0, None)
sc("umount2", 166, b"/proc", 2)
sc("unshare_user", 272, 0x10000000)
sc("unshare_mnt", 272, 0x00020000)
sc("unshare_net", 272, 0x40000000)
fd = os.open("/proc/self/ns/net", os.O_RDONLY)
sc("setns", 308, fd, 0)
sc("chroot", 161, b"/tmp")
sc("pivot_root", 155, b"/tmp", b"/tmp/m")
sc("fsopen", 430, b"tmpfs", 0)
sc("open_tree", 428, -100, b"/", 0)
sc("open_by_handle_at", 304, -100, None, 0)
sc("clone_newuser", 56, 0x10000000 | 17, 0, 0, 0, 0)
sc("clone3", 435, None, 0)
sc("mknod", 133, b"/tmp/kmem", 0o20600, os.makedev(1, 2))
sc("init_module", 175, None, 0, b"")
sc("reboot", 169, 0xfee1dead, 0, 0, None)
sc("swapoff", 168, b"/tmp/m")
sc("syslog", 103, 3, None, 0)
print(json.dumps(out))
"""


async def test_mount_unshare_chroot_setns_denied(sandbox: PoolInfo) -> None:
    seen = report(await attack(sandbox.pool, MOUNT_PROBE))
    expected_enosys = {"clone3"}
    for name, res in seen.items():
        if name in expected_enosys:
            assert res == errno.ENOSYS, (name, res)
        else:
            assert res == errno.EPERM, (name, res)


async def test_unshare_works_unisolated(sandbox: PoolInfo) -> None:
    # Creating namespaces is harmless for the host (the probe's own process only); not root,
    # the program needs a user namespace for them, which seccomp denies isolated runs.
    src = """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
r = libc.unshare(0x10000000 | 0x00020000 | 0x04000000)
print(json.dumps({"unshare": "OK" if r == 0 else ctypes.get_errno()}))
"""
    assert report(await attack(sandbox.unisolated, src))["unshare"] == "OK"


# -- kernel attack surface ---------------------------------------------------------------------

# name -> (x86_64 syscall number, args): bogus arguments, so natively the kernel answers with
# EINVAL/EFAULT/ENOKEY... and only the seccomp filter answers EPERM.
KERNEL_SURFACE = {
    "keyctl": (250, (0, -3, 0)),  # KEYCTL_GET_KEYRING_ID(session, create=0)
    "add_key": (248, (b"sbx-no-such-type", b"d", None, 0, -2)),
    "request_key": (249, (b"sbx-no-such-type", b"d", None, 0)),
    "bpf": (321, (0, None, 0)),
    "io_uring_setup": (425, (0, None)),
    "io_uring_enter": (426, (-1, 0, 0, 0, None, 0)),
    "perf_event_open": (298, (None, 0, -1, -1, 0)),
    "userfaultfd": (323, (0xFFFF,)),
    "kcmp": (312, (1, 1, 0, 0, 0)),
    "pidfd_getfd": (438, (-1, 0, 0)),
}

SURFACE_PROBE = """
import ctypes, json, sys
nr, args = json.loads(sys.stdin.read())
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
conv = [a.encode("latin-1") if isinstance(a, str) else a for a in args]
r = libc.syscall(nr, *conv)
print(json.dumps({"ret": r, "errno": ctypes.get_errno() if r < 0 else 0}))
"""


def _surface_stdin(name: str) -> str:
    nr, args = KERNEL_SURFACE[name]
    return json.dumps([nr, [a.decode("latin-1") if isinstance(a, bytes) else a for a in args]])


@pytest.mark.parametrize("name", sorted(KERNEL_SURFACE))
async def test_kernel_surface_syscall_denied(sandbox: PoolInfo, name: str) -> None:
    seen = report(await attack(sandbox.pool, SURFACE_PROBE, stdin=_surface_stdin(name)))
    assert seen["ret"] == -1 and seen["errno"] == errno.EPERM, (name, seen)


@pytest.mark.parametrize("name", ["keyctl", "bpf", "io_uring_setup", "perf_event_open",
                                  "userfaultfd"])
async def test_kernel_surface_syscall_reaches_kernel_unisolated(sandbox: PoolInfo,
                                                                name: str) -> None:
    seen = report(await attack(sandbox.unisolated, SURFACE_PROBE, stdin=_surface_stdin(name)))
    assert seen["errno"] != errno.EPERM, (name, seen)


INT80 = r"""
#include <stdio.h>
#include <unistd.h>
int main(void) {
    long r;
    write(1, "before\n", 7);
    __asm__ volatile("int $0x80" : "=a"(r) : "a"(20L) : "memory");  /* i386 getpid */
    printf("after %ld\n", r);
    return 0;
}
"""


async def test_int80_32bit_syscalls_killed(sandbox: PoolInfo) -> None:
    r = await attack(sandbox.pool, INT80, "c")
    assert r.compile is not None and r.compile.status is Status.OK, r.compile
    assert r.stdout.startswith("before")
    assert "after" not in r.stdout
    assert r.status is Status.RUNTIME_ERROR and r.signal == signal.SIGSYS, (r.status, r.signal)


async def test_int80_32bit_syscalls_work_unisolated(sandbox: PoolInfo) -> None:
    r = await attack(sandbox.unisolated, INT80, "c")
    if r.status is not Status.OK:
        pytest.skip(f"this kernel has no 32-bit emulation: {r.status} {r.signal}")
    assert "after" in r.stdout


async def test_x32_abi_syscalls_denied(sandbox: PoolInfo) -> None:
    # x32 syscall numbers (bit 30) alias the native table; a denylist must not be bypassable.
    src = r"""
#include <stdio.h>
#include <unistd.h>
#include <errno.h>
#include <sys/syscall.h>
int main(void) {
    write(1, "before\n", 7);
    long r = syscall(0x40000000L | 101, 16, 1, 0, 0);  /* x32 ptrace(PTRACE_ATTACH, 1) */
    printf("x32 ptrace %ld errno %d\n", r, errno);
    r = syscall(0x40000000L | 272, 0x10000000);  /* x32 unshare(CLONE_NEWUSER) */
    printf("x32 unshare %ld errno %d\n", r, errno);
    return 0;
}
"""
    r = await attack(sandbox.pool, src, "c")
    assert r.stdout.startswith("before")
    for line in r.stdout.splitlines()[1:]:
        assert " 0 errno" not in line, line  # never succeeded
    assert r.signal == signal.SIGSYS or "errno 38" in r.stdout, (r.status, r.signal, r.stdout)


TIOCSTI_PROBE = """
import ctypes, fcntl, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
for name, cmd in (("TIOCSTI", 0x5412), ("TIOCSTI_high_bits", 0x5412 | (1 << 32)),
                  ("TIOCLINUX", 0x541C)):
    for fd in (0, 1, 2):
        r = libc.syscall(16, fd, ctypes.c_ulong(cmd), ctypes.c_char_p(b"x"))
        out[f"{name}:{fd}"] = "INJECTED" if r == 0 else ctypes.get_errno()
for dev in ("/dev/tty", "/dev/console", "/dev/ptmx", "/dev/tty0"):
    try:
        os.close(os.open(dev, os.O_RDWR | os.O_NOCTTY))
        out[dev] = "OPENED"
    except OSError as e:
        out[dev] = e.errno
print(json.dumps(out))
"""


async def test_tiocsti_denied(sandbox: PoolInfo) -> None:
    seen = report(await attack(sandbox.pool, TIOCSTI_PROBE))
    for key, res in seen.items():
        if key.startswith("/dev/"):
            assert res == errno.ENOENT, (key, res)
        else:  # the filter answers, not the (absent) terminal: EPERM, never ENOTTY
            assert res == errno.EPERM, (key, res)


async def test_tiocsti_reaches_kernel_unisolated(sandbox: PoolInfo) -> None:
    seen = report(await attack(sandbox.unisolated, TIOCSTI_PROBE))
    assert seen["TIOCSTI:0"] == errno.ENOTTY  # no filter: the ioctl reaches the pipe


async def test_host_devices_absent(sandbox: PoolInfo) -> None:
    src = """
import json, os
out = {}
for d in ("/dev/kvm", "/dev/vda", "/dev/mem", "/dev/kmsg", "/dev/vsock", "/dev/net/tun",
          "/dev/vhost-vsock", "/dev/loop0", "/dev/fuse", "/dev/userfaultfd"):
    out[d] = os.path.exists(d)
print(json.dumps(out))
"""
    seen = report(await attack(sandbox.pool, src))
    assert not any(seen.values()), seen


async def test_zygote_private_area_absent(sandbox: PoolInfo) -> None:
    # The zygote keeps the host's /proc and every session's work dir under /.zygote; a run's
    # mount namespace must not even contain it (file modes alone would be the only wall).
    src = """
import json, os
try:
    listed = sorted(os.listdir("/.zygote"))
except OSError as e:
    listed = e.errno
print(json.dumps({"mounts": open("/proc/self/mountinfo").read(), "listed": listed}))
"""
    seen = report(await attack(sandbox.pool, src))
    assert " /sandbox " in seen["mounts"]
    assert "/.zygote" not in seen["mounts"], seen["mounts"]
    assert seen["listed"] in ([], errno.EACCES, errno.ENOENT), seen["listed"]


# -- the supervisor reading back files ---------------------------------------------------------


async def test_symlinks_planted_for_the_supervisor(sandbox: PoolInfo,
                                                   host_world: HostWorld) -> None:
    src = f"""
import os
os.symlink({str(host_world.sentinel)!r}, "leak.txt")
os.symlink("/etc/shadow", "shadow.txt")
os.symlink("/proc/self/environ", "env.txt")
os.symlink({str(host_world.sentinel_dir)!r}, "d")
os.symlink("/", "rootlink")
os.mkdir("sub")
os.symlink({str(host_world.sentinel)!r}, "sub/x")
os.mkfifo("fifo")
try:
    os.link({str(host_world.sentinel)!r}, "hard")
except OSError:
    pass
with open("real.txt", "w") as f:
    f.write("fine")
"""
    collect = ["leak.txt", "shadow.txt", "env.txt", "d/sentinel.txt", "rootlink/etc/shadow",
               f"rootlink{host_world.sentinel}", "sub/x", "fifo", "hard", "real.txt"]
    r = await attack(sandbox.pool, src, collect=collect, lim=limits(time_s=5))
    assert r.status is Status.OK, (r.status, r.stderr)
    assert r.wall_time_s < 2.0  # the FIFO did not block the supervisor
    assert r.files == {"real.txt": b"fine"}
    blob = b"".join(r.files.values())
    assert host_world.sentinel_text.encode() not in blob


async def test_collected_files_are_capped(sandbox: PoolInfo) -> None:
    # A huge output file must not become a memory bomb for the supervisor that reads it back.
    src = "with open('big.bin', 'wb') as f:\n    f.write(b'z' * (6 << 20))\n"
    r = await attack(sandbox.pool, src, collect=["big.bin"],
                     lim=limits(stdout_bytes=4096, workdir_mb=8))
    assert r.status is Status.OK, (r.status, r.stderr)
    assert r.files == {"big.bin": b"z" * 4096}


async def test_collect_cannot_name_paths_outside(sandbox: PoolInfo) -> None:
    for bad in ("../../etc/shadow", "/etc/shadow", "a/../../x", ""):
        with pytest.raises(ValueError):
            Program(source="pass", collect=[bad])


# -- JavaScript and bash runtimes (exec mode) --------------------------------------------------


async def test_javascript_probe(sandbox: PoolInfo, host_world: HostWorld) -> None:
    src = f"""
const fs = require('fs'), net = require('net');
const out = {{}};
try {{ out.sentinel = fs.readFileSync({json.dumps(str(host_world.sentinel))}, 'utf8'); }}
catch (e) {{ out.sentinel = e.code; }}
try {{ out.shadow = fs.readFileSync('/etc/shadow', 'utf8'); }} catch (e) {{ out.shadow = e.code; }}
try {{ fs.writeFileSync('/usr/{MARKER}_js', 'x'); out.write = 'WRITTEN'; }}
catch (e) {{ out.write = e.code; }}
out.secret = JSON.stringify(process.env).includes({json.dumps(host_world.secret)});
const s = net.connect({host_world.tcp.port}, '127.0.0.1');
s.on('connect', () => {{ out.tcp = 'CONNECTED'; s.destroy(); done(); }});
s.on('error', (e) => {{ out.tcp = e.code; done(); }});
function done() {{ console.log(JSON.stringify(out)); }}
"""
    r = await attack(sandbox.pool, src, "javascript", lim=limits(memory_mb=512, time_s=5))
    assert r.status is Status.OK, (r.status, r.stderr[-1000:])
    seen = report(r)
    assert seen == {"sentinel": "ENOENT", "shadow": "ENOENT", "write": "EROFS", "secret": False,
                    "tcp": "ECONNREFUSED"}, seen


async def test_uid_base_is_ours(sandbox: PoolInfo) -> None:
    # Guard for the audit: our pool's runs carry the uids the audit watches.
    r = await attack(sandbox.pool, "import os; print(os.getuid())")
    assert int(r.stdout) in sandbox.uids and int(r.stdout) >= 61000
