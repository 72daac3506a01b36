"""What isolation this host can provide (``sandloop doctor``), and what the runtime needs visible.

Detection is explicit: each feature is probed, and when one that full isolation needs is
missing, the pool refuses to run untrusted code (every run is a ``sandbox_error`` naming the
missing feature and the fix) unless the caller opted out with ``isolation="none"``.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import resource
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sandloop.sandbox import cgroups

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Feature:
    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class HostReport:
    features: tuple[Feature, ...]
    cgroup_version: int | None
    level: str  # "full" | "unavailable"
    missing: tuple[str, ...] = field(default=())

    @property
    def full(self) -> bool:
        return self.level == "full"

    def problem(self) -> str:
        """One message saying what is missing and how to fix it (for sandbox_error)."""
        parts = [f"{f.name}: {f.detail}" + (f" (fix: {f.fix})" if f.fix else "")
                 for f in self.features if not f.ok and f.name in self.missing]
        return ("full isolation is unavailable on this host — " + "; ".join(parts)
                + ". Run `sandloop doctor` for details, or opt out explicitly with "
                "isolation='none' / --no-isolation (untrusted code then runs unisolated).")


def _probe_namespaces() -> Feature:
    """Fork a child that enters new pid/mount/net/ipc/uts/cgroup namespaces, as each run's
    child will."""
    if os.geteuid() != 0:
        return Feature("namespaces", False, "not running as root",
                       "run sandloop as root (or in a container with CAP_SYS_ADMIN)")
    libc = ctypes.CDLL(None, use_errno=True)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        flags = 0x00020000 | 0x40000000 | 0x08000000 | 0x04000000 | 0x20000000 | 0x02000000
        os._exit(0 if libc.unshare(flags) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    ok = os.waitstatus_to_exitcode(status) == 0
    return Feature("namespaces", ok, "pid, mount, net, ipc, uts, cgroup" if ok else "unshare() failed",
                   "" if ok else "allow namespace creation (kernel.unprivileged_userns_clone, "
                   "container seccomp profile)")


def _probe_seccomp() -> Feature:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        status = ""
    if "Seccomp:" not in status:
        return Feature("seccomp", False, "kernel without seccomp filters",
                       "use a kernel built with CONFIG_SECCOMP_FILTER")
    try:
        from sandloop.sandbox.seccomp_policy import compile_filter

        n = len(compile_filter()) // 8
    except Exception as e:  # libseccomp missing or broken
        return Feature("seccomp", False, f"cannot build the filter: {e}",
                       "apt-get install libseccomp2 && pip install pyseccomp")
    return Feature("seccomp", True, f"denylist compiled ({n} BPF instructions)")


def _probe_cgroups() -> tuple[Feature, int | None]:
    try:
        backend = cgroups.detect()
    except (cgroups.CgroupError, OSError) as e:
        return Feature("cgroups", False, str(e),
                       "mount cgroup v2 with memory, pids and cpu delegated, or cgroup v1 "
                       "memory, pids and cpuacct hierarchies"), None
    extra = ""
    if isinstance(backend, cgroups.CgroupV1):
        extra = f" ({', '.join(backend.controllers)}; swap accounting: {backend.has_memsw})"
    return Feature("cgroups", True, f"v{backend.version}{extra}"), backend.version


def _probe_uid_drop() -> Feature:
    if os.geteuid() != 0:
        return Feature("uid_drop", False, "cannot switch to per-slot uids without root",
                       "run sandloop as root")
    return Feature("uid_drop", True, "per-slot unprivileged uid/gid, no capabilities, no_new_privs")


def probe() -> HostReport:
    """Probe every isolation feature. Cheap enough to run at each pool start (~5 ms)."""
    ns = _probe_namespaces()
    sc = _probe_seccomp()
    cg, version = _probe_cgroups()
    uid = _probe_uid_drop()
    feats = (ns, uid, sc, cg)
    missing = tuple(f.name for f in feats if not f.ok)
    return HostReport(feats, version, "unavailable" if missing else "full", missing)


def runtime_binds(python: str | None) -> tuple[tuple[str, ...], dict[str, str]]:
    """Host paths bound read-only into every sandbox, and root-level symlinks to replicate.

    Only the runtime: /usr (compilers, node, bash, libraries), the few /etc files the dynamic
    linker and toolchains read, and the Python installation ``python`` that hosts the zygote.
    Never /home, /root as a whole, /var, /run or the rest of /etc. ``python`` None: the
    zygote runs on an environment's interpreter, mounted at a neutral path instead (the host's
    interpreter, its prefix and the supervisor's virtualenv are then not bound at all).
    """
    binds: list[str] = ["/usr"]
    symlinks: dict[str, str] = {}
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            symlinks[top] = os.readlink(top)
        elif os.path.isdir(top):
            binds.append(top)
    for etc in ("/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
                "/etc/localtime", "/etc/nsswitch.conf", "/etc/ssl/certs"):
        if os.path.exists(etc):
            binds.append(etc)
    # Debian's JDK keeps its configuration (jvm.cfg, java.security) in /etc/java-<version>,
    # linked from /usr/lib/jvm: without it no JVM starts. Configuration only, no secrets.
    binds.extend(sorted(str(p) for p in Path("/etc").glob("java-*") if p.is_dir()))
    prefixes = _python_prefixes(python) if python is not None else []
    for p in prefixes:
        if not any(p == b or p.startswith(b.rstrip("/") + "/") for b in binds):
            binds.append(p)
    return tuple(binds), symlinks


def _python_prefixes(python: str) -> list[str]:
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    else:
        import subprocess

        out = subprocess.run(
            [python, "-I", "-c",
             "import sys;print(sys.prefix);print(sys.base_prefix);print(sys.exec_prefix)"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.split()
        prefixes = set(out)
    real = sorted({os.path.realpath(p) for p in prefixes} | prefixes)
    # The interpreter binary itself may be a symlink out of its prefix (venvs).
    exe = os.path.realpath(python)
    exe_dir = os.path.dirname(os.path.dirname(exe))
    if exe_dir not in real:
        real.append(exe_dir)
    return [p for p in real if os.path.isdir(p) and p != "/"]


def run_base_dir() -> Path:
    """Where slots keep their (empty, root-only) mount points on the host."""
    for cand in ("/run/sandloop", "/tmp/sandloop-run"):
        p = Path(cand)
        try:
            p.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(p, 0o700)
            return p
        except OSError as e:
            logger.debug("cannot use %s for the slots' directories: %s", p, e)
    raise OSError("cannot create a run directory under /run or /tmp")


@functools.cache
def _hard_limit(res: int) -> int:
    return resource.getrlimit(res)[1]


def host_rlimit(res: int, value: int) -> int:
    """``value`` for resource ``res``, at most the hard limit of this process (which the
    sandbox's processes inherit, and which this host may not let them raise: that needs
    CAP_SYS_RESOURCE). A limit the schema allows but the host cannot give (``open_files``
    65536 under ``ulimit -Hn`` 20000) is clamped to what it gives, never a failed run."""
    hard = _hard_limit(res)
    return value if hard == resource.RLIM_INFINITY else min(value, hard)
