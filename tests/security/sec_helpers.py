"""Helpers of the adversarial suite: host listeners, host-state probes and the attack runner."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sandloop.sandbox.models import ExecResult, Limits, Program
from sandloop.sandbox.pool import SandboxPool

# The pool claims a uid range no other live pool on this host uses (a flock per range), so
# the audit's uids are ours alone even when other test runs share the machine.
SLOTS = 2
CGROUP_ROOT = Path("/sys/fs/cgroup")
REPO = Path(__file__).resolve().parents[2]
MARKER = "SBXMARK"  # every file an attack tries to leave on the host carries this in its name

# -- host-side listeners ---------------------------------------------------------------------


class Listener:
    """A real listening socket on the host that counts every connection it accepts."""

    def __init__(self, family: int, address: object) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)  # type: ignore[arg-type]
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.address = self.sock.getsockname()
        self.accepted = 0
        self.payloads: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self.address[1])  # type: ignore[index]

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            with conn:
                conn.settimeout(0.2)
                with contextlib.suppress(OSError):
                    self.payloads.append(conn.recv(4096))

    def wait_for(self, n: int, timeout: float = 2.0) -> int:
        deadline = time.monotonic() + timeout
        while self.accepted < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.accepted

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@contextlib.contextmanager
def tcp_listener() -> Iterator[Listener]:
    lst = Listener(socket.AF_INET, ("127.0.0.1", 0))
    try:
        yield lst
    finally:
        lst.close()


@contextlib.contextmanager
def abstract_listener() -> Iterator[tuple[Listener, str]]:
    name = f"sandloop-sec-demo-{secrets.token_hex(6)}"
    lst = Listener(socket.AF_UNIX, "\0" + name)
    try:
        yield lst, name
    finally:
        lst.close()


# -- the host world the attacks aim at ---------------------------------------------------------


@dataclass
class HostWorld:
    secret: str
    secret_env: str
    sentinel_dir: Path
    sentinel: Path
    sentinel_text: str
    tcp: Listener
    abstract: Listener
    abstract_name: str
    unix_path: str
    unix: Listener
    service: subprocess.Popen[bytes]
    hostname: str = field(default_factory=socket.gethostname)

    def sentinel_state(self) -> tuple[str, int, int, int]:
        st = self.sentinel.stat()
        digest = hashlib.sha256(self.sentinel.read_bytes()).hexdigest()
        return digest, st.st_size, st.st_mtime_ns, st.st_ctime_ns


# -- host state probes -------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def procs_of_uids(uids: set[int]) -> list[str]:
    """Every process (zombies included) whose real or effective uid is one of ``uids``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        status = _read(f"/proc/{entry}/status")
        uid_line = next((ln for ln in status.splitlines() if ln.startswith("Uid:")), "")
        ids = {int(x) for x in uid_line.split()[1:]}
        if ids & uids:
            name = next((ln for ln in status.splitlines() if ln.startswith("Name:")), "")
            state = next((ln for ln in status.splitlines() if ln.startswith("State:")), "")
            found.append(f"pid {entry} {name.split(':', 1)[-1].strip()} "
                         f"{state.split(':', 1)[-1].strip()} uids {sorted(ids)}")
    return found


def mount_table(pid: str = "self") -> list[str]:
    """Mount points, filesystem types and sources (ids, peer groups and size options of the
    slot's reusable work tmpfs legitimately change between runs)."""
    rows = []
    for line in _read(f"/proc/{pid}/mountinfo").splitlines():
        parts = line.split()
        if len(parts) > 5:
            fs = line.split(" - ", 1)[-1].split()
            rows.append(f"{parts[3]} {parts[4]} {' '.join(fs[:2])}")
    return sorted(rows)


def leftover_work_files(works: str, wait_s: float = 0.0) -> dict[str, list[str]]:
    """Work dirs (and their entries) still held by a slot's zygote, seen from the host.

    One-shot runs get a fresh tmpfs that dies with them, so none may remain; only sessions
    keep work dirs there."""
    deadline = time.monotonic() + wait_s
    while True:
        found: dict[str, list[str]] = {}
        try:
            for work in os.listdir(works):
                found[work] = sorted(os.listdir(os.path.join(works, work)))[:10]
        except OSError as e:
            found["?"] = [f"cannot inspect: {e}"]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def proc_info(pid: int) -> dict[str, str]:
    status = _read(f"/proc/{pid}/status")
    return {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in status.splitlines())}


def _hierarchies() -> dict[str, Path]:
    """name -> hierarchy root: each v1 controller's, or the one v2 hierarchy ("unified")."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return {"unified": CGROUP_ROOT}
    return {d.name: d for d in CGROUP_ROOT.iterdir()} if CGROUP_ROOT.is_dir() else {}


def sandloop_cgroups() -> dict[str, list[str]]:
    """hierarchy -> slot group names under /sys/fs/cgroup/<controller>/sandloop (v1) or
    /sys/fs/cgroup/sandloop (v2)."""
    out: dict[str, list[str]] = {}
    for name, root in _hierarchies().items():
        base = root / "sandloop"
        if base.is_dir():
            out[name] = sorted(p.name for p in base.iterdir() if p.is_dir())
    return out


def cgroup_procs(group: str) -> dict[str, list[int]]:
    out = {}
    for name, root in _hierarchies().items():
        procs = root / "sandloop" / group / "cgroup.procs"
        if procs.exists():
            out[name] = sorted(int(x) for x in _read(str(procs)).split())
    return out


def _pool_owner_pid(group: str) -> int | None:
    if group.startswith("p") and "x" in group:
        txt = group[1:].split("x", 1)[0]
        if txt.isdigit():
            return int(txt)
    return None


def host_markers() -> list[str]:
    """Files named with MARKER that an attack managed to create where the host can see them."""
    hits = []
    for d in ("/", "/tmp", "/var/tmp", "/dev/shm", "/etc", "/usr", "/usr/bin", "/usr/local/bin",
              "/root", "/run", str(REPO), str(REPO / ".venv"), sys.prefix):
        with contextlib.suppress(OSError):
            hits.extend(os.path.join(d, n) for n in os.listdir(d) if MARKER in n)
    return hits


# Host-global state no test may change: every sysctl of the host (hostname and domainname are
# kernel.hostname and kernel.domainname), its network interfaces and routes, its loaded kernel
# modules and the /etc files that name it. Counters that move on their own are left out.
SYSCTL_TREES = ("kernel", "net", "vm", "fs", "user", "abi", "dev", "debug")
VOLATILE_SYSCTLS = frozenset({
    "kernel/ns_last_pid", "kernel/random/uuid", "kernel/random/entropy_avail", "kernel/pty/nr",
    "fs/dentry-state", "fs/file-nr", "fs/inode-nr", "fs/inode-state", "fs/aio-nr",
    "fs/dquot-nr", "net/netfilter/nf_conntrack_count",
})
# Whole trees of read-only statistics (fs/quota/syncs counts the host's sync() calls).
VOLATILE_SYSCTL_TREES = ("fs/quota/",)
HOST_FILES = ("/etc/hostname", "/etc/hosts", "/etc/passwd", "/etc/group", "/etc/shadow",
              "/etc/resolv.conf", "/proc/net/route", "/proc/net/ipv6_route")


def host_global_state() -> dict[str, str]:
    """A snapshot of host-global state, key -> value (see VOLATILE_SYSCTLS for what is left out;
    ``stable_keys`` drops what else moved by itself)."""
    out: dict[str, str] = {}
    for top in SYSCTL_TREES:
        for dirpath, _dirs, files in os.walk(f"/proc/sys/{top}"):
            for name in files:
                path = os.path.join(dirpath, name)
                key = path.removeprefix("/proc/sys/")
                if key in VOLATILE_SYSCTLS or key.startswith(VOLATILE_SYSCTL_TREES):
                    continue
                try:
                    with open(path, "rb") as f:
                        out["sysctl " + key] = f.read(8192).decode(errors="replace").strip()
                except OSError:
                    continue
    uname = os.uname()
    out["uname nodename"] = uname.nodename
    for path in HOST_FILES:
        with contextlib.suppress(OSError):
            out["file " + path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    with contextlib.suppress(OSError):
        for iface in sorted(os.listdir("/sys/class/net")):
            for attr in ("flags", "mtu", "address", "operstate"):
                with contextlib.suppress(OSError):
                    out[f"net {iface} {attr}"] = _read(f"/sys/class/net/{iface}/{attr}").strip()
    with contextlib.suppress(OSError):
        out["kernel modules"] = " ".join(sorted(ln.split()[0] for ln in
                                                _read("/proc/modules").splitlines() if ln))
    return out


def stable_keys(first: dict[str, str], again: dict[str, str]) -> dict[str, str]:
    """``first`` without the keys that changed by themselves until ``again`` was taken."""
    return {k: v for k, v in first.items() if again.get(k) == v}


def host_state_changes(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """What changed since ``before`` (only its keys: a volatile entry was dropped from it)."""
    return [f"{k}: {before[k]!r} -> {now.get(k, '<gone>')!r}"
            for k in sorted(before) if now.get(k) != before[k]]


# -- the pool ----------------------------------------------------------------------------------


@dataclass
class PoolInfo:
    pool: SandboxPool
    unisolated: SandboxPool
    uids: set[int]
    zygotes: dict[int, int]  # slot index -> zygote pid
    zygote_mounts: dict[int, list[str]]
    host_mounts: list[str]
    host_proc_mounts: str
    preexisting: set[str]  # sandloop cgroups that existed before this suite's pool
    host_state: dict[str, str] = field(default_factory=dict)  # host_global_state() before


async def unisolated_pool(slots: int) -> SandboxPool:
    """The opt-out pool of the demonstrations. As root it runs programs as an unprivileged uid,
    which must be able to run the pool's interpreter: one under /root (mode 0700, as the
    project's venv here) cannot, so the system's python3 (stdlib only) is used then."""
    pool = SandboxPool(slots, isolation="none")
    await pool.start()
    if pool.unisolated is not None and pool.unisolated.python_error and \
            os.path.exists("/usr/bin/python3"):
        await pool.close()
        pool = SandboxPool(slots, isolation="none", python="/usr/bin/python3")
        await pool.start()
    assert pool.unisolated is not None and not pool.unisolated.python_error, pool.unisolated
    return pool


# -- the audit around every test ---------------------------------------------------------------


def wait_no_slot_procs(uids: set[int], timeout: float = 1.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = procs_of_uids(uids)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


# -- running attacks ---------------------------------------------------------------------------

TIGHT = Limits(time_s=2, memory_mb=64, max_processes=32, workdir_mb=8, workdir_inodes=256,
               open_files=64, stdout_bytes=1 << 16, stderr_bytes=1 << 16)


def limits(**overrides: object) -> Limits:
    return TIGHT.model_copy(update=overrides)


async def attack(pool: SandboxPool, source: str, language: str = "python", *,
                 lim: Limits | None = None, **program: object) -> ExecResult:
    return await pool.run(Program(language=language, source=source, **program), lim or TIGHT)


def report(result: ExecResult) -> dict[str, object]:
    """The JSON object the attack printed as its last stdout line (what it observed inside)."""
    lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
    assert lines, f"attack printed nothing: status={result.status} stderr={result.stderr[-2000:]!r}"
    # The JVM's unified logging writes to stdout, and a starved JVM logs
    # "[0.1s][warning][os,thread] Failed to start thread" from its own threads
    # after main has printed the report: those lines are the limit holding,
    # not the attack's answer.
    lines = [ln for ln in lines if not ln.startswith("[") or "][warning]" not in ln] or lines
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise AssertionError(f"bad report {lines[-1][:500]!r}; stderr={result.stderr[-2000:]!r}") from e
    assert isinstance(data, dict)
    return data


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    st = _read(f"/proc/{pid}/stat").split()
    return not (len(st) > 2 and st[2] == "Z")


def kill_quietly(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGKILL)
    proc.wait()
