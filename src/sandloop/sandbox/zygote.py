"""The fork-server (zygote) of one slot, and the isolation steps of every child it spawns.

This file runs as its own process under the runtime's Python interpreter (started through
``BOOTSTRAP``), so it imports only the standard library. It is started as root by the slot
supervisor, holds no secrets, never runs untrusted code, and never reads a request's program,
arguments, stdin or files (they travel in memfds that only the child opens), so no child can
find an earlier run's data in the memory it inherits. Each run is a fresh child cloned into new
pid, mount, net, ipc and uts namespaces, which

  1. is born inside the slot's (limit-free) cgroups, which the zygote joined at start,
     lives in the zygote's minimal read-only root (runtime directories bound read-only, a few
     devices) and has an empty capability bounding set, both inherited from the zygote,
  2. mounts a fresh size- and inode-limited tmpfs at /tmp and a /proc of its own pid namespace,
     brings up loopback and reports ready. A child prepared while the slot is idle waits here,
     still root, so that a run skips clone and namespace setup;
  3. is moved by the zygote into the run's own cgroups (made by the supervisor with the run's
     limits), and then, on its request: mounts /sandbox (a fresh tmpfs, or a session's work dir), detaches the
     zygote's private area, sets rlimits, switches to the slot's unprivileged uid/gid, sets
     no_new_privs, loads the seccomp filter, writes the files, and becomes the program (exec, or
     Python in this already-warm interpreter). When files must be collected after the run, it
     instead forks the program and stays as a trusted pid 1 that reports its status and files.

Steps 2 and 3 up to the files run in C (jail.c, see Jail) when the pool could build it, else in
Python here (prepare_child, enter_work_dir, drop_privileges, _write_files): the same steps.

Protocol (SOCK_SEQPACKET, one JSON message per packet, file descriptors with SCM_RIGHTS):
  supervisor -> zygote: {"op": "run", "work", "workdir_mb", "workdir_inodes", "ncg"}
                           + fds [stdin, files, spec, stdout, stderr, channel, status]
                           + ncg cgroup.procs files of the run's groups
  zygote -> child:      b"run" + the session work dir to bind (or nothing), + the same fds
                        {"op": "mkwork"|"rmwork", "work": id, ...}   {"op": "ping"}
  zygote -> supervisor: {"ok": true, "pid": host_pid} (+ the child's mount-namespace fd)
                        or {"ok": false, "error": "..."}
  status pipe: records of 1 type byte + 4-byte little-endian length + payload:
      E  setup failure (child, before any untrusted code)   X  exit record (zygote, JSON)
      P  the program's wait status (trusted pid 1, JSON)    F  a collected file (name, bytes)
      C  the collection is complete (trusted pid 1, JSON list of the names that were absent)
      W  the run's files could not be written (the request's or an earlier program's doing:
         FILE_ERRNOS), a program verdict, not an infrastructure failure
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import errno
import gc
import json
import os
import platform
import resource
import select
import signal
import socket
import struct
import sys
from typing import Any, NoReturn

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CHILD_CLONE_FLAGS = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
RUN_TCP_HASH_BUCKETS = 128  # a run's own TCP hash table: loopback only, a few sockets
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
PR_SET_DUMPABLE = 4
PR_SET_NAME = 15
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

SYS_CLONE = {"x86_64": 56, "aarch64": 220, "ppc64le": 120, "s390x": 120}
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}

SETUP_FAILED_EXIT = 125
TOOLS_DIR = "/.sandloop/bin"  # must match languages.TOOLS_DIR
PRIVATE = "/.zygote"  # the zygote's own area inside the sandbox root (see Zygote.setup)  # exit code of a child whose isolation setup failed (reported as "E")
WORK_DIR = "/sandbox"

# libc through the interpreter's own symbols: ctypes.util.find_library would import subprocess
# and with it threading, whose at-fork hook costs every child ~0.4 ms (see DEFAULT_PRELOAD).
_libc = ctypes.CDLL(None, use_errno=True)
# PyDLL keeps the GIL across the call: clone() must return in the child holding it.
_libc_gil = ctypes.PyDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                        ctypes.c_ulong]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_libc_gil.syscall.restype = ctypes.c_long


class SetupError(Exception):
    """An isolation step failed; the child must not run the program."""


class FilesError(Exception):
    """A file of the request could not be written, for a reason in FILE_ERRNOS."""


# Why writing the run's files fails when the request or an earlier program of the session is
# to blame: too big for the work dir (ENOSPC, EFBIG, EDQUOT, ENOMEM: the run's memory limit
# charges tmpfs pages), or the path made unusable (a file where a directory goes, a directory,
# symlink or read-only directory where a file goes). Requests are validated first
# (models.check_file_names), so on a fresh work dir only the sizes are left. Must match
# jail.c's file_errno.
FILE_ERRNOS = frozenset({
    errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.ENOMEM, errno.ENOTDIR, errno.EISDIR,
    errno.EEXIST, errno.EACCES, errno.EPERM, errno.ELOOP, errno.EROFS, errno.ENAMETOOLONG,
    errno.EMLINK, errno.ETXTBSY,
})


class SpareGone(SetupError):
    """The prepared child died before its request reached it (a fresh one can serve it)."""


def _check(ret: int, what: str) -> int:
    if ret < 0:
        e = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(e)} (errno {e})")
    return ret


def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(src.encode() if src else None, target.encode(),
                       fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {target}")


def umount(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(target.encode(), flags), f"umount {target}")


def prctl(option: int, arg2: int = 0, arg3: int = 0) -> None:
    _check(_libc.prctl(option, arg2, arg3, 0, 0), f"prctl({option})")


def pivot_root(new_root: str, put_old: str) -> None:
    nr = SYS_PIVOT_ROOT[platform.machine()]
    _check(_libc.syscall(nr, new_root.encode(), put_old.encode()), "pivot_root")


def clone_fork(flags: int) -> int:
    """fork() into new namespaces: a raw clone with fork semantics plus CPython's fork hooks.

    ``os.fork`` cannot pass namespace flags, and ``unshare(CLONE_NEWPID)`` can only be done once
    per process, so the zygote clones directly; the hooks keep the interpreter consistent exactly
    as ``os.fork`` does (the zygote is single-threaded).
    """
    nr = SYS_CLONE[platform.machine()]
    ctypes.pythonapi.PyOS_BeforeFork()
    pid = _libc_gil.syscall(nr, ctypes.c_ulong(flags | signal.SIGCHLD), None, None, None, None)
    if pid == 0:
        ctypes.pythonapi.PyOS_AfterFork_Child()
        return 0
    err = ctypes.get_errno()
    ctypes.pythonapi.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, f"clone: {os.strerror(err)}")
    return int(pid)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_seccomp(bpf: bytes) -> None:
    """Install a classic-BPF seccomp program (8-byte instructions) built by the supervisor."""
    if len(bpf) % 8 or not bpf:
        raise SetupError("seccomp program has a bad length")
    buf = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _SockFprog(len(bpf) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0),
           "seccomp")


def loopback_up() -> None:
    """Bring up ``lo`` in the fresh network namespace: local servers work, nothing is reachable."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        import fcntl

        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
    finally:
        s.close()


class _SlChild(ctypes.Structure):
    """``struct sl_child`` of jail.c."""

    _fields_ = [
        ("ctl_fd", ctypes.c_int), ("parent_fd", ctypes.c_int), ("work_opts", ctypes.c_char_p),
        ("tmp_opts", ctypes.c_char_p), ("tmp_binds", ctypes.POINTER(ctypes.c_char_p)),
        ("n_tmp_binds", ctypes.c_int), ("private_dir", ctypes.c_char_p),
        ("uid", ctypes.c_uint), ("gid", ctypes.c_uint),
        ("bpf", ctypes.c_char_p), ("bpf_len", ctypes.c_uint), ("detach_early", ctypes.c_int),
    ]


SL_MAX_RUNNING = 16  # must match jail.c


class _SlZygote(ctypes.Structure):
    """jail.c's ``struct sl_zygote``: the zygote loop's state while the C loop runs it."""

    _fields_ = [
        ("sock", ctypes.c_int),
        ("spare_pid", ctypes.c_int), ("spare_ctl", ctypes.c_int),
        ("spare_pidfd", ctypes.c_int), ("spare_mntns", ctypes.c_int),
        ("spare_ready", ctypes.c_int),
        ("n_running", ctypes.c_int),
        ("run_pid", ctypes.c_int * SL_MAX_RUNNING), ("run_status", ctypes.c_int * SL_MAX_RUNNING),
        ("run_pidfd", ctypes.c_int * SL_MAX_RUNNING),
        ("clone_flags", ctypes.c_ulong),
        ("child", ctypes.c_void_p), ("proc_dir", ctypes.c_char_p),
        ("before_fork", ctypes.c_void_p), ("after_fork_parent", ctypes.c_void_p),
        ("after_fork_child", ctypes.c_void_p),
        ("key", ctypes.c_char * 128), ("spare_key", ctypes.c_char * 128),
        ("child_fds", ctypes.c_int * 7),
        ("fast_runs", ctypes.c_ulong),
        ("n_fds", ctypes.c_int), ("fds", ctypes.c_int * 16),
        ("msg_len", ctypes.c_int), ("msg", ctypes.c_char * (1 << 16)),
    ]


class Jail:
    """The C fast path (jail.c) of prepare_child + drop_privileges + _write_files, and of the
    zygote's steady-state loop."""

    def __init__(self, path: str) -> None:
        # PyDLL keeps the GIL across the call, as clone_fork needs.
        self.lib = ctypes.PyDLL(path, use_errno=True)
        self.lib._name = "sandloop-jail"  # not the host path
        self.lib.sl_spawn.restype = ctypes.c_long
        self.lib.sl_spawn.argtypes = [ctypes.c_ulong, ctypes.POINTER(_SlChild),
                                      ctypes.POINTER(ctypes.c_int)]
        self.lib.sl_serve.restype = ctypes.c_int
        self.lib.sl_serve.argtypes = [ctypes.POINTER(_SlZygote)]
        self.state = _SlZygote()
        self.state.proc_dir = f"{PRIVATE}/proc".encode()
        api = ctypes.pythonapi
        for field, fn in (("before_fork", api.PyOS_BeforeFork),
                          ("after_fork_parent", api.PyOS_AfterFork_Parent),
                          ("after_fork_child", api.PyOS_AfterFork_Child)):
            setattr(self.state, field, ctypes.cast(fn, ctypes.c_void_p).value)
        # One prepared struct per tmpfs options (SpareKey); the objects it points into stay
        # referenced here for as long as it does.
        self._structs: dict[SpareKey, tuple[_SlChild, Any, list[bytes]]] = {}

    def _struct(self, z: Zygote, key: SpareKey) -> _SlChild:
        """The child's configuration for these tmpfs sizes, as of now (see prepare_child for
        detach_early)."""
        if key not in self._structs:
            opts = key
            binds = [x.encode() for pair in z.tmp_binds for x in pair]
            arr = (ctypes.c_char_p * max(1, len(binds)))(*binds)
            c = _SlChild(
                work_opts=f"{opts},mode=0755,uid={z.uid},gid={z.gid}".encode(),
                tmp_opts=f"{opts},mode=1777".encode(), tmp_binds=arr,
                n_tmp_binds=len(binds) // 2, private_dir=PRIVATE.encode(), uid=z.uid,
                gid=z.gid, bpf=z.bpf or None, bpf_len=len(z.bpf),
            )
            if len(self._structs) > 64:  # only the sizes of requests' work dirs vary
                self._structs.clear()
            self._structs[key] = (c, arr, binds)
        c = self._structs[key][0]
        c.detach_early = int(not z.work_opts)
        return c

    def spawn(self, z: Zygote, key: SpareKey, flags: int, ctl: int, parent: int) -> int:
        """Clone a child that isolates itself in C. Returns the pid in the zygote; in the child,
        returns 0 once the request has arrived and the child is locked down (see jail.c)."""
        c = self._struct(z, key)
        c.ctl_fd, c.parent_fd = ctl, parent
        ctypes.pythonapi.PyOS_BeforeFork()
        pid = int(self.lib.sl_spawn(ctypes.c_ulong(flags), ctypes.byref(c), self.state.child_fds))
        if pid == 0:
            ctypes.pythonapi.PyOS_AfterFork_Child()
            return 0
        ctypes.pythonapi.PyOS_AfterFork_Parent()
        if pid < 0:
            raise OSError(-pid, f"clone: {os.strerror(-pid)}")
        return pid


# ----------------------------------------------------------------------------------------------
# Zygote state: a private mount namespace holding the read-only root and the work dirs.


class Zygote:
    def __init__(self, config: dict[str, Any]) -> None:
        self.base: str = config["base"]
        self.uid: int = config["uid"]
        self.gid: int = config["gid"]
        self.bpf: bytes = bytes.fromhex(config["bpf"]) if config.get("bpf") else b""
        self.binds: list[str] = config["binds"]
        self.symlinks: dict[str, str] = config["symlinks"]
        self.cgroups: list[str] = config["cgroups"]
        self.python: str = config["python"]
        self.preload: list[str] = config.get("preload", [])
        # Loaded before setup() pivots away from the host's file system.
        self.jail: Jail | None = Jail(config["jail"]) if config.get("jail") else None
        self.root = os.path.join(self.base, "root")  # until setup() pivots into it: then "/"
        self.works = PRIVATE + "/work"  # persistent (session) work dirs, root-only
        # Running children: pid -> (status pipe, pidfd). A pidfd turns readable when its
        # process exits, so the loop needs no SIGCHLD handler (children inherit none to undo).
        self.running: dict[int, tuple[int, int]] = {}
        self.work_opts: dict[str, str] = {}  # persistent (session) work dirs -> tmpfs options
        self.spare: Spare | None = None
        self.last_key: SpareKey | None = None
        self.tmp_binds: list[tuple[str, str]] = []  # (kept copy, path under /tmp)

    # -- one-time setup -------------------------------------------------------------------------
    def setup(self) -> None:
        # "sl-zygote" in ps/top (children inherit it until they exec).
        name = ctypes.create_string_buffer(b"sl-zygote")
        _libc.prctl(PR_SET_NAME, ctypes.addressof(name), 0, 0, 0)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the supervisor is already gone
            os._exit(0)
        # Join the slot's cgroups (children are born inside them, then moved to their run's).
        for procs in self.cgroups:
            with open(procs, "w") as f:
                f.write("0")
        # Shield the zygote from the OOM killer where the host lets us (CAP_SYS_RESOURCE);
        # each child also volunteers itself (+1000), which needs no privilege.
        with contextlib.suppress(PermissionError), open("/proc/self/oom_score_adj", "w") as f:
            f.write("-1000")
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        # A network namespace of the zygote's own (it needs none), so that the runs' ones,
        # created from it, get a small TCP hash each (tcp_child_ehash_entries, Linux 6.1+)
        # rather than sharing the host's: freeing a run's namespace then no longer walks the
        # host's whole hash (262,144 buckets here) for its TIME_WAIT sockets, ~0.1 ms per run.
        _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        with contextlib.suppress(FileNotFoundError), \
                open("/proc/sys/net/ipv4/tcp_child_ehash_entries", "w") as f:
            f.write(str(RUN_TCP_HASH_BUCKETS))
        # Nothing we mount may propagate back to the host.
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount("tmpfs", self.base, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0700")
        os.mkdir(self.root, 0o755)
        mount("tmpfs", self.root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        self._build_root()
        # The zygote's private area inside the new root: session work dirs and a host-pid /proc
        # (to hand children's namespaces to the supervisor). Children detach it at once.
        private = self.root + PRIVATE
        os.mkdir(private, 0o700)
        mount("tmpfs", private, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0700")
        os.mkdir(private + "/work", 0o700)
        os.mkdir(private + "/proc", 0o555)
        mount("proc", private + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        # A runtime under /tmp (a venv in a checkout there) would vanish under each run's fresh
        # /tmp: keep a second binding here, which children re-attach over their /tmp.
        for i, src in enumerate(b for b in self.binds if b.startswith("/tmp/")):
            keep = f"{private}/rt{i}"
            os.mkdir(keep, 0o755)
            mount(src, keep, None, MS_BIND | MS_REC)
            mount(None, keep, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
            self.tmp_binds.append((f"{PRIVATE}/rt{i}", src))
        # Empty the capability bounding set: no descendant can ever gain a capability by exec
        # (the zygote keeps its effective set for mounts, and never execs).
        for cap in range(64):
            if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0:
                if ctypes.get_errno() == errno.EINVAL:
                    break
                _check(-1, f"drop capability {cap} from the bounding set")
        # The runtime and the skeleton are read-only for every run.
        mount(None, self.root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        # Live in that root: a child's copy of this mount namespace is then a dozen mounts, not
        # every mount of the host, and it needs no pivot of its own (clone and exit got cheaper).
        os.chdir(self.root)
        pivot_root(".", ".")
        umount(".", MNT_DETACH)
        os.chdir("/")
        self.root = "/"
        # Forget the host's layout (the slot's directory, the cgroup paths, the runtime's
        # paths): the zygote needs none of it any more, and what it holds, its children inherit.
        self.base, self.python, self.binds, self.symlinks, self.cgroups = "", "", [], {}, []

    def _build_root(self) -> None:
        r = self.root
        for d in ("proc", "dev", "tmp", WORK_DIR.lstrip("/"), "etc"):
            os.makedirs(os.path.join(r, d), exist_ok=True)
        for link, target in self.symlinks.items():
            os.symlink(target, os.path.join(r, link.lstrip("/")))
        for src in self.binds:
            dst = os.path.join(r, src.lstrip("/"))
            if os.path.isdir(src):
                os.makedirs(dst, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                if not os.path.exists(dst):
                    open(dst, "wb").close()
            mount(src, dst, None, MS_BIND | MS_REC)
            mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        for dev in ("null", "zero", "full", "random", "urandom"):
            dst = os.path.join(r, "dev", dev)
            open(dst, "wb").close()
            mount("/dev/" + dev, dst, None, MS_BIND)
            mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NOEXEC)
        os.symlink("/proc/self/fd", os.path.join(r, "dev", "fd"))
        for i, name in enumerate(("stdin", "stdout", "stderr")):
            os.symlink(f"/proc/self/fd/{i}", os.path.join(r, "dev", name))
        os.symlink("/tmp", os.path.join(r, "dev", "shm"))
        # `python` and `python3` in a shell run are the pool's own interpreter.
        tools = os.path.join(r, TOOLS_DIR.lstrip("/"))
        os.makedirs(tools, 0o755)
        for name in ("python", "python3"):
            os.symlink(self.python, os.path.join(tools, name))
        etc = os.path.join(r, "etc")
        with open(os.path.join(etc, "passwd"), "w") as f:
            f.write(f"root:x:0:0::/:/bin/false\nsandbox:x:{self.uid}:{self.gid}::{WORK_DIR}:/bin/sh\n"
                    "nobody:x:65534:65534::/:/bin/false\n")
        with open(os.path.join(etc, "group"), "w") as f:
            f.write(f"root:x:0:\nsandbox:x:{self.gid}:\nnogroup:x:65534:\n")
        with open(os.path.join(etc, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost sandbox\n::1 localhost\n")

    # -- persistent work dirs (sessions) ------------------------------------------------------
    def work_path(self, work: str) -> str:
        if not work.isalnum():
            raise SetupError(f"bad work id {work!r}")
        return os.path.join(self.works, work)

    def ensure_work(self, work: str, opts: str) -> None:
        """Mount a named work tmpfs once; every run that names it gets it bound at /sandbox."""
        if work not in self.work_opts:
            path = self.work_path(work)
            os.makedirs(path, 0o700, exist_ok=True)
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV,
                  f"{opts},mode=0755,uid={self.uid},gid={self.gid}")
            self.work_opts[work] = opts

    def remove_work(self, work: str) -> None:
        if work in self.work_opts:
            path = self.work_path(work)
            umount(path, MNT_DETACH)
            os.rmdir(path)
            del self.work_opts[work]

    # -- the loop -------------------------------------------------------------------------------
    def serve(self, sock: socket.socket) -> None:
        """Answer the supervisor until it hangs up: in jail.c's loop when it is there (it hands
        back what it does not serve: see sl_serve), else here."""
        while True:
            if self.jail is not None and len(self.running) <= SL_MAX_RUNNING:
                if not self._serve_c(self.jail, sock):
                    return
            elif not self._serve_once(sock):
                return

    def _serve_c(self, jail: Jail, sock: socket.socket) -> bool:
        z = jail.state
        kept = (self.spare.pid, self.spare.works) if self.spare is not None else (0, frozenset())
        keep = self._to_c(z, jail, sock)
        code = jail.lib.sl_serve(ctypes.byref(z))
        if code == 2:  # a child prepared by the C loop, locked down with its request
            _child_after_c(list(z.child_fds))
        del keep
        self._from_c(z, kept)
        if code < 0:
            raise OSError(-code, f"zygote loop: {os.strerror(-code)}")
        if code == 0:
            return False
        fds = list(z.fds[:z.n_fds])
        msg = decode_msg(ctypes.string_at(ctypes.addressof(z) + _SlZygote.msg.offset, z.msg_len))
        if msg is None:
            _close_all(fds)
            return False
        self._answer(sock, msg, fds)
        return True

    def _to_c(self, z: _SlZygote, jail: Jail, sock: socket.socket) -> _SlChild | None:
        """Hand the loop's state, and every descriptor in it, to the C loop."""
        z.sock = sock.fileno()
        spare, self.spare = self.spare, None
        if spare is None:
            z.spare_pid, z.spare_ctl, z.spare_pidfd, z.spare_mntns = 0, -1, -1, -1
        else:
            z.spare_pid, z.spare_ctl, z.spare_pidfd = spare.pid, spare.ctl.detach(), spare.pidfd
            z.spare_mntns = spare.mntns if spare.mntns is not None else -1
            z.spare_ready, z.spare_key = int(spare.is_ready), spare.key.encode()
        z.n_running = len(self.running)
        for i, (pid, (status, pidfd)) in enumerate(self.running.items()):
            z.run_pid[i], z.run_status[i], z.run_pidfd[i] = pid, status, pidfd
        self.running = {}
        z.clone_flags = CHILD_CLONE_FLAGS
        child = jail._struct(self, self.last_key) if self.last_key is not None else None
        z.child = ctypes.addressof(child) if child is not None else None
        z.key = (self.last_key or "").encode()
        return child  # referenced by the caller while the C loop may use it

    def _from_c(self, z: _SlZygote, kept: tuple[int, frozenset[str]]) -> None:
        """Take the state back from the C loop. ``kept``: the prepared child handed to it and
        the session work dirs it was cloned with; one the C loop made has those of now (only
        the Python loop mounts them)."""
        self.running = {z.run_pid[i]: (z.run_status[i], z.run_pidfd[i])
                        for i in range(z.n_running)}
        if z.spare_pid:
            works = kept[1] if z.spare_pid == kept[0] else frozenset(self.work_opts)
            spare = Spare(z.spare_pid, socket.socket(fileno=z.spare_ctl), z.spare_key.decode(),
                          z.spare_mntns if z.spare_mntns >= 0 else None, z.spare_pidfd, works)
            spare.is_ready = bool(z.spare_ready)
            self.spare = spare

    def _serve_once(self, sock: socket.socket) -> bool:
        """One turn of the Python loop: wait, reap, answer at most one message."""
        while True:
            watch = [sock.fileno(), *(pidfd for _, pidfd in self.running.values())]
            if self.spare is not None:
                watch.append(self.spare.pidfd)
            try:
                ready, _, _ = select.select(watch, [], [])
            except InterruptedError:
                continue
            if len(ready) > 1 or ready[0] != sock.fileno():
                self.reap()
            if sock.fileno() in ready:
                try:
                    msg, fds = recv_msg(sock)
                except ConnectionError:
                    return False
                if msg is None:
                    _close_all(fds)
                    return False
                self._answer(sock, msg, fds)
                return True

    def _answer(self, sock: socket.socket, msg: dict[str, Any], fds: list[int]) -> None:
        try:
            reply = self.handle(msg, fds)
        except Exception as e:  # reported to the supervisor, which fails the run
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        # Not in a finally: a child unwinding from handle() (_RunProgram) may hold its own
        # descriptors under these numbers.
        _close_all(fds)
        out_fds = reply.pop("_fds", [])
        anc = ([(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", out_fds))]
               if out_fds else [])
        sock.sendmsg([json.dumps(reply).encode()], anc)
        for fd in out_fds:
            os.close(fd)
        self.reap()

    def reap(self) -> None:
        while True:
            try:
                pid, status, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.spare is not None and pid == self.spare.pid:
                self.spare.close()  # died before its request: replaced on the next run
                self.spare = None
            entry = self.running.pop(pid, None)
            if entry is None:
                continue
            fd, pidfd = entry
            os.close(pidfd)
            rec = {"status": status, "utime": ru.ru_utime, "stime": ru.ru_stime,
                   "maxrss_kb": ru.ru_maxrss}
            with contextlib.suppress(OSError):
                write_record(fd, b"X", json.dumps(rec).encode())
            os.close(fd)
            self.prespawn()

    def handle(self, msg: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        op = msg.get("op")
        if op == "ping":  # fast_runs: runs the C loop served (tests check it is in use)
            fast = self.jail.state.fast_runs if self.jail is not None else 0
            return {"ok": True, "pid": os.getpid(), "fast_runs": fast}
        if op == "rmwork":
            self.remove_work(msg["work"])
            return {"ok": True}
        if op == "mkwork":
            self.ensure_work(msg["work"], tmpfs_options(msg["workdir_mb"], msg["workdir_inodes"]))
            return {"ok": True}
        if op != "run":
            return {"ok": False, "error": f"unknown op {op!r}"}
        # After the 7 run fds: the run's cgroup.procs files. Without them the run would stay in
        # the slot's group, which has no limits: refuse rather than run with less isolation.
        ncg = int(msg.get("ncg", 0))
        if ncg < 1 or len(fds) != 7 + ncg:
            return {"ok": False, "error": f"run needs 7 fds + its cgroups ({ncg}), got {len(fds)}"}
        opts = tmpfs_options(msg["workdir_mb"], msg["workdir_inodes"])
        work = msg.get("work") or ""
        if work:
            self.ensure_work(work, opts)
        key: SpareKey = opts
        spare = self.spare
        self.spare = None
        # A prepared child serves any run with its tmpfs sizes, with or without a session work
        # dir, provided that dir was mounted before the child was cloned (its mount namespace
        # is a copy taken then).
        if spare is not None and (spare.key != key or (work and work not in spare.works)):
            spare.discard()
            spare = None
        try:
            for last in (False, True):
                if spare is not None:
                    try:
                        spare.wait_ready()
                    except SetupError:  # it died while idle (killed, or failed): make a new one
                        spare.discard()
                        spare = None
                if spare is None:
                    spare = self.spawn(key)
                    spare.wait_ready()
                try:
                    self._hand_over(spare, fds, self.work_path(work) if work else "")
                    break
                except SpareGone:
                    # Killed between the check and the hand-over (the OOM killer prefers idle
                    # children): once more with a fresh one.
                    spare.discard()
                    spare = None
                    if last:
                        raise
        except SetupError as e:
            if spare is not None:
                spare.discard()
            return {"ok": False, "error": str(e)}
        assert spare is not None  # handed over (the loop breaks) or raised
        self.running[spare.pid] = (os.dup(fds[6]), spare.pidfd)
        spare.pidfd = -1  # now owned by self.running
        self.last_key = key
        # Hand the child's mount namespace to the supervisor: while it holds a reference, the
        # child's exit does not wait for the namespace's unmounts (an RCU grace period, several
        # ms here); the supervisor drops it off the critical path.
        reply: dict[str, Any] = {"ok": True, "pid": spare.pid}
        if spare.mntns is not None:
            reply["_fds"] = [spare.mntns]
            spare.mntns = None
        spare.close()
        return reply

    @staticmethod
    def _hand_over(spare: Spare, fds: list[int], work_path: str) -> None:
        """Move the prepared child into the run's own groups while it still waits for its
        request (everything the run does is charged to them, and its processes are found
        there), then hand it the request. SpareGone: the child had died."""
        for procs in fds[7:]:
            try:
                os.write(procs, str(spare.pid).encode())
            except ProcessLookupError as e:
                raise SpareGone(f"sandbox child died before its run: {e}") from e
            except OSError as e:
                raise SetupError(f"cannot move the child into the run's cgroup: {e}") from e
        spare.dispatch(fds[:7], work_path)

    def spawn(self, key: SpareKey) -> Spare:
        """Clone a child and let it isolate itself; it then waits for its one request."""
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        flags = CHILD_CLONE_FLAGS
        if self.jail is not None:
            pid = self.jail.spawn(self, key, flags, child_end.fileno(), parent_end.fileno())
            if pid == 0:  # isolated, requested and locked down in C
                # jail.c closed both ends (their numbers may be the run's descriptors now):
                # forget them, or unwinding (_RunProgram) would close those.
                parent_end.detach()
                child_end.detach()
                _child_after_c(list(self.jail.state.child_fds))
        else:
            pid = clone_fork(flags)
        if pid == 0:
            # The child must never resume the zygote's work, whatever happens: it leaves only
            # by _RunProgram (see there), once locked down.
            try:
                parent_end.close()
                try:
                    prepare_child(self, key)
                except BaseException as e:  # reported when the zygote waits for readiness
                    with contextlib.suppress(OSError):
                        child_end.send(b"E" + f"{type(e).__name__}: {e}".encode()[:4000])
                    os._exit(SETUP_FAILED_EXIT)
                child_end.send(b"R")
                run = serve_one(self, child_end, key)
            except BaseException:
                os._exit(SETUP_FAILED_EXIT)
            raise _RunProgram(run)
        child_end.close()
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            parent_end.close()
            raise
        mntns: int | None
        try:
            mntns = os.open(f"{PRIVATE}/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            mntns = None
        return Spare(pid, parent_end, key, mntns, pidfd, frozenset(self.work_opts))

    def prespawn(self) -> None:
        """Prepare the next run's child while the slot is idle, so a run skips clone + setup."""
        if self.spare is None and self.last_key is not None and not self.running:
            try:
                self.spare = self.spawn(self.last_key)
            except (OSError, SetupError):
                self.spare = None


SpareKey = str  # the tmpfs options of /tmp (and of /sandbox when no session dir is bound)


def tmpfs_options(size_mb: int, inodes: int) -> str:
    return f"size={int(size_mb)}m,nr_inodes={int(inodes)}"


class Spare:
    """A child that has isolated itself and waits for its request on ``ctl``."""

    def __init__(self, pid: int, ctl: socket.socket, key: SpareKey, mntns: int | None,
                 pidfd: int, works: frozenset[str]) -> None:
        self.pid = pid
        self.ctl = ctl
        self.key = key
        self.works = works  # session work dirs mounted when it was cloned
        self.mntns = mntns
        self.pidfd = pidfd  # readable once the child exits; -1 once handed to the run table
        self.is_ready = False

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until the child reports that its isolation is complete, or say why it failed."""
        if self.is_ready:
            # Anything readable now is EOF: the idle child died.
            r, _, _ = select.select([self.ctl.fileno()], [], [], 0)
            if r:
                raise SetupError("the prepared sandbox child died while idle")
            return
        r, _, _ = select.select([self.ctl.fileno()], [], [], timeout)
        if not r:
            raise SetupError(f"the sandbox child did not finish its setup within {timeout} s")
        data = self.ctl.recv(4096)
        if data != b"R":
            detail = data[1:].decode(errors="replace") if data else "it exited"
            raise SetupError(f"sandbox setup failed: {detail}")
        self.is_ready = True

    def dispatch(self, fds: list[int], work_path: str) -> None:
        """Send the run's descriptors, and the session work dir to bind at /sandbox (or "")."""
        try:
            self.ctl.sendmsg([b"run" + work_path.encode()],
                             [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        except OSError as e:
            raise SpareGone(f"sandbox child died before its run: {e}") from e

    def discard(self) -> None:
        """Kill the child and wait for it, so it is gone from the slot before the next run."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self.close()

    def close(self) -> None:
        self.ctl.close()
        if self.mntns is not None:
            os.close(self.mntns)
            self.mntns = None
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


def write_record(fd: int, kind: bytes, payload: bytes) -> None:
    data = memoryview(kind + struct.pack("<I", len(payload)) + payload)
    while data:
        n = os.write(fd, data)
        data = data[n:]


# ----------------------------------------------------------------------------------------------
# The child: pid 1 of its own pid namespace. Every step before the program is security-relevant.


def prepare_child(z: Zygote, opts: SpareKey) -> None:
    """Isolate this fresh child before it knows what it will run."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # an idle child dies with the zygote
    # /tmp: a fresh bounded tmpfs; /proc: this pid namespace only. /sandbox follows with the
    # request (enter_work_dir).
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"{opts},mode=1777")
    for kept, path in z.tmp_binds:  # root-owned directories in a sticky /tmp: not removable
        os.makedirs(path, 0o755, exist_ok=True)
        mount(kept, path, None, MS_BIND | MS_REC)
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # When the slot's memory runs out, the OOM killer must pick the run, never the zygote.
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    try:
        os.write(fd, b"1000")
    finally:
        os.close(fd)
    # Then /proc turns read-only, so that the program cannot write 0 back (see jail.c prepare).
    mount(None, "/proc", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _check(_libc.sethostname(b"sandbox", 7), "sethostname")
    loopback_up()
    if not z.work_opts:
        # Cloned while the zygote held no session dir, this child can only serve a run without
        # one (the zygote makes a new child for a session run): detach the private area now.
        # The unmount waits for an RCU grace period (~0.4 ms on average here, over 1 ms at
        # times), which then delays no run.
        umount(PRIVATE, MNT_DETACH)
    # The capability bounding set is already empty (inherited from the zygote); ids,
    # no_new_privs and seccomp follow when the request arrives (an idle prepared child stays
    # root, so no process of the slot's uid ever exists between runs).


def enter_work_dir(z: Zygote, opts: SpareKey, work_path: str) -> None:
    """Mount /sandbox: a session's work dir, or a fresh tmpfs that no earlier run touched; then
    detach the zygote's private area (other sessions' work dirs, the host's /proc).

    First, the run's own cgroups (the zygote moved this child into them before the request)
    become the root of a cgroup namespace: the run sees "/", not the host's group names."""
    _check(_libc.unshare(CLONE_NEWCGROUP), "unshare(CLONE_NEWCGROUP)")
    if work_path:
        if not z.work_opts:  # detached in prepare_child: cannot be (the zygote checks it)
            raise SetupError(f"work dir {work_path} is not mounted in this child")
        if not work_path.startswith(z.works + "/") or not work_path[len(z.works) + 1:].isalnum():
            raise SetupError(f"bad work dir {work_path!r}")
        # Only a mounted session dir: a bare directory would be the zygote's own tmpfs.
        if os.stat(work_path).st_dev == os.stat(z.works).st_dev:
            raise SetupError(f"work dir {work_path} is not mounted in this child")
        mount(work_path, WORK_DIR, None, MS_BIND)
    else:
        mount("tmpfs", WORK_DIR, "tmpfs", MS_NOSUID | MS_NODEV,
              f"{opts},mode=0755,uid={z.uid},gid={z.gid}")
    if z.work_opts:
        umount(PRIVATE, MNT_DETACH)


def drop_privileges(z: Zygote) -> None:
    """Become the slot's unprivileged user for good, then lock the process down."""
    os.setgroups([])
    os.setresgid(z.gid, z.gid, z.gid)
    os.setresuid(z.uid, z.uid, z.uid)
    if os.getuid() != z.uid or os.geteuid() != z.uid or os.getegid() != z.gid:
        raise SetupError("uid/gid drop did not take effect")
    # Credential changes clear the parent-death signal, so set it again: if the zygote dies,
    # so does the whole pid namespace.
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_DUMPABLE, 0)
    _own_work_dir()
    os.chdir(WORK_DIR)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if z.bpf:
        load_seccomp(z.bpf)


def _own_work_dir() -> None:
    """Give the slot user (who owns /sandbox) back its rwx on it, if a session's earlier
    program took them away (``chmod 000 .``): otherwise this run could not even enter it, and a
    program could make every later run of its session an infrastructure failure."""
    mode = os.stat(WORK_DIR).st_mode
    if mode & 0o700 != 0o700:
        os.chmod(WORK_DIR, (mode & 0o7777) | 0o700)


def serve_one(z: Zygote, ctl: socket.socket, opts: SpareKey) -> ProgramRun:
    """Receive the one request and lock down; return what runs the program (see _RunProgram)."""
    while True:
        try:
            msg, fds = recv_raw(ctl)
            break
        except InterruptedError:
            continue
    if not msg.startswith(b"run") or len(fds) != 7:
        os._exit(SETUP_FAILED_EXIT)
    stdin_fd, files_fd, spec_fd, out_fd, err_fd, chan_fd, status_fd = fds
    ctl.close()
    try:
        write_record(status_fd, b"S", b"")  # the request arrived (see jail.c sl_spawn)
    except OSError:
        os._exit(SETUP_FAILED_EXIT)
    try:
        enter_work_dir(z, opts, msg[3:].decode())
        rlimits, spec = read_spec(spec_fd)
        os.close(spec_fd)
        for res, value in rlimits:
            resource.setrlimit(res, (value, value))
        drop_privileges(z)
        _write_files(files_fd)  # as the slot user, inside the jail: no symlink can escape
        os.close(files_fd)
    except BaseException as e:
        _setup_failed(status_fd, e)
    return (stdin_fd, spec, out_fd, err_fd, chan_fd, status_fd)


def _setup_failed(status_fd: int, e: BaseException) -> NoReturn:
    """Report a setup failure (before any untrusted code ran) on the status pipe and exit."""
    with contextlib.suppress(OSError):
        if isinstance(e, FilesError):
            write_record(status_fd, b"W", str(e).encode()[:4000])
        else:
            write_record(status_fd, b"E", f"{type(e).__name__}: {e}".encode()[:4000])
    os._exit(SETUP_FAILED_EXIT)


SPEC_MAGIC = b"SLS1"


def read_spec(spec_fd: int) -> tuple[list[tuple[int, int]], dict[str, Any]]:
    """The run spec: b"SLS1", u32 n, n x (i32 resource, u64 limit) for jail.c, then JSON."""
    data = _read_fd(spec_fd)
    if data[:4] != SPEC_MAGIC:
        raise SetupError("bad run spec")
    (n,) = struct.unpack_from("<I", data, 4)
    rlimits = [struct.unpack_from("<iQ", data, 8 + 12 * i) for i in range(n)]
    return rlimits, json.loads(data[8 + 12 * n:])


ProgramRun = tuple[int, dict[str, Any], int, int, int, int]  # run_locked_down's arguments


class _RunProgram(BaseException):
    """Raised in a locked-down child to unwind every frame of the zygote before the program
    starts (``main`` catches it and returns ``run`` to ``BOOTSTRAP``, which calls
    ``program_entry``). A Python program runs in this process: from its first frame,
    ``sys._getframe().f_back`` would otherwise walk up into the zygote's frames and reach its
    state (the slot's host directory, its host cgroup paths, the jail
    library's path), which is the host layout the mount and cgroup namespaces hide.

    The frames it unwinds must not clean up (no ``finally`` or ``with`` between ``main`` and
    a ``spawn``): in the child, their descriptors' numbers may be the child's own by now.
    """

    def __init__(self, run: ProgramRun) -> None:
        super().__init__()
        self.run = run


def _child_after_c(child_fds: list[int]) -> NoReturn:
    """A child that jail.c locked down, with its request: read the spec (jail.c used only its
    rlimits), then unwind (_RunProgram). Any failure ends the child, never the zygote's loop."""
    try:
        stdin_fd, _, spec_fd, out_fd, err_fd, chan_fd, status_fd = child_fds
        try:
            _, spec = read_spec(spec_fd)
            os.close(spec_fd)
        except BaseException as e:
            _setup_failed(status_fd, e)
        run: ProgramRun = (stdin_fd, spec, out_fd, err_fd, chan_fd, status_fd)
    except BaseException:
        os._exit(SETUP_FAILED_EXIT)
    raise _RunProgram(run)


def program_entry(run: ProgramRun) -> NoReturn:
    """The child's life after the zygote's frames are gone (BOOTSTRAP calls it): forget what
    is left of the zygote that names host paths, then become or run the program."""
    try:
        sys.modules.pop(__name__, None)
        # The command line the zygote was started with names this file on the host.
        sys.argv = [""]
        if hasattr(sys, "orig_argv"):
            sys.orig_argv = [sys.executable]
        # No gc.collect() here (~0.25 ms of copy-on-write faults per run): the cycles the
        # unwinding leaves (the jail's ctypes handle and types) name nothing of the host (see
        # Jail and Zygote.setup), and the program's first collection takes them.
        run_locked_down(*run)
    finally:
        os._exit(SETUP_FAILED_EXIT)


def run_locked_down(stdin_fd: int, spec: dict[str, Any], out_fd: int, err_fd: int, chan_fd: int,
                    status_fd: int) -> None:
    """The locked-down child (slot uid, seccomp, files written) becomes or runs the program."""
    collect: list[str] = spec.get("collect") or []
    if collect:
        # Stay as a trusted pid 1: fork the program, report its status and collect its files
        # (inside the jail, as the slot user, so the files cannot point at anything of the host).
        # The program runs as the same uid and can signal pid 1: every signal stays blocked
        # across the fork, until pid 1 ignores them all (see _ignore_signals).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKABLE)
        pid = os.fork()
        if pid == 0:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(status_fd)
            _become_program(stdin_fd, out_fd, err_fd, chan_fd, spec)
        _ignore_signals()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for fd in (stdin_fd, out_fd, err_fd, chan_fd):
            os.close(fd)
        _supervise_and_collect(pid, status_fd, collect, int(spec.get("collect_max", 1 << 20)))
    os.close(status_fd)
    _become_program(stdin_fd, out_fd, err_fd, chan_fd, spec)


def _become_program(stdin_fd: int, out_fd: int, err_fd: int, chan_fd: int,
                    spec: dict[str, Any]) -> None:
    # Standard streams: stdin is a sealed memfd, out/err and the result channel are pipes.
    os.dup2(stdin_fd, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.dup2(chan_fd, 3)
    os.set_inheritable(3, True)
    os.closerange(4, 1 << 20)  # drops the zygote's sockets, the status pipe and every other fd
    env = spec["env"]
    run = spec["exec"]
    if run["mode"] == "exec":
        argv = run["argv"]
        try:
            os.execve(argv[0], argv, env)
        except OSError as e:  # e.g. a compiled program that is not executable
            os.write(2, f"cannot execute {argv[0]}: {e.strerror}\n".encode())
            os._exit(126)
    run_python(run["path"], run["argv"], env)


_BLOCKABLE = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}


def _ignore_signals() -> None:
    """Make the collecting pid 1 deaf to the program, which runs as the same uid in its pid
    namespace. The kernel already drops a signal sent to a namespace's init from inside unless
    init handles it, but this process is a fork of the interpreter and handles SIGINT
    (KeyboardInterrupt): one ``kill(1, SIGINT)`` from the program interrupted the collection, and
    a file the caller asked for was silently missing. SIGCHLD keeps its default: ignoring it
    would make the kernel reap the program before pid 1 could read its status."""
    for sig in _BLOCKABLE - {signal.SIGCHLD}:
        with contextlib.suppress(OSError, ValueError):  # glibc's reserved real-time signals
            signal.signal(sig, signal.SIG_IGN)


def _supervise_and_collect(pid: int, status_fd: int, collect: list[str], cap: int) -> None:
    """pid 1's loop: wait for the program (reaping orphans), then report status and files,
    and last a ``C`` record naming the files that were not there: without it the supervisor
    knows the collection did not finish and says so (a sandbox_error), rather than return a
    result that silently lacks a file."""
    while True:
        try:
            got, status, ru = os.wait4(-1, 0)
        except ChildProcessError:
            os._exit(SETUP_FAILED_EXIT)
        except InterruptedError:
            continue
        if got == pid:
            break
    rec = {"status": status, "utime": ru.ru_utime, "stime": ru.ru_stime, "maxrss_kb": ru.ru_maxrss}
    write_record(status_fd, b"P", json.dumps(rec).encode())
    missing = []
    for name in collect:
        data = _read_collected(name, cap)
        if data is None:
            missing.append(name)
        else:
            raw = name.encode()
            write_record(status_fd, b"F", struct.pack("<H", len(raw)) + raw + data)
    write_record(status_fd, b"C", json.dumps(missing).encode())
    os._exit(0)


def _read_collected(name: str, cap: int) -> bytes | None:
    import stat

    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], cap
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_fd(fd: int) -> bytes:
    """The whole content of a (sealed, fixed-size) memfd."""
    size = os.fstat(fd).st_size
    chunks: list[bytes] = []
    pos = 0
    while pos < size:
        b = os.pread(fd, min(size - pos, 1 << 20), pos)
        if not b:
            break
        chunks.append(b)
        pos += len(b)
    return b"".join(chunks)


def _write_files(files_fd: int) -> None:
    """Create the request's files, as the slot user, inside the already-pivoted work dir."""
    data = _read_fd(files_fd)
    pos = 0
    while pos < len(data):
        nlen, dlen, mode = struct.unpack_from("<IQH", data, pos)
        pos += 14
        name = data[pos:pos + nlen].decode()
        pos += nlen
        if name.startswith("/") and not name.startswith("/tmp/"):
            raise SetupError(f"refusing to write {name!r} outside /sandbox and /tmp")
        body = data[pos:pos + dlen]
        pos += dlen
        try:
            _write_file(name, body, mode)
        except OSError as e:
            if e.errno not in FILE_ERRNOS:
                raise
            raise FilesError(f"cannot write {name}: {os.strerror(e.errno)}") from None


def _write_file(name: str, body: bytes, mode: int) -> None:
    d = os.path.dirname(name)
    if d:
        os.makedirs(d, exist_ok=True)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        view = memoryview(body)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def run_python(path: str, argv: list[str], env: dict[str, str]) -> None:
    """Run a Python file as ``python path argv...`` would, in this pre-warmed interpreter."""
    import atexit
    import builtins
    import traceback
    import types

    # The zygote already runs with the usual sandbox environment: apply only the differences.
    # (The random module needs no reseeding here: its at-fork hook, run by clone_fork, did it.)
    for name in [n for n in os.environ if n not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
    # The zygote started with -I, which ignores the environment: apply what it would have set.
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    sys.argv = [path, *argv]
    sys.path[0] = os.path.dirname(os.path.abspath(path))
    if os.getcwd() != sys.path[0]:  # a workspace run: its files are importable too
        sys.path.insert(1, os.getcwd())
    assert _STREAMS is not None  # built by main() before the first child
    sys.stdin, sys.stdout, sys.stderr = _STREAMS
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
    code = 0
    try:
        # What `python path` does: compile the file and run it as a fresh __main__ module.
        with open(path, "rb") as f:
            source = f.read()
        main = types.ModuleType("__main__")
        main.__file__ = path
        main.__builtins__ = builtins  # type: ignore[attr-defined]
        sys.modules["__main__"] = main
        exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException as e:  # mirror the interpreter's top level
        # Start the traceback at the program's own file, as `python main.py` would print it.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb or e.__traceback__)
        code = 1
    try:
        # Non-daemon threads hold the exit, as in `python main.py` (only a program that
        # imported threading can have any).
        threading = sys.modules.get("threading")
        if threading is not None:
            main_thread = threading.main_thread()
            for t in threading.enumerate():
                if t is not main_thread and not t.daemon:
                    t.join()
        atexit._run_exitfuncs()
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            code = code or 120
    os._exit(code)


def _std_streams() -> tuple[Any, Any, Any]:
    """Text streams over fds 0, 1 and 2, as a run's program sees them."""
    import io

    return (io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                             encoding="utf-8", errors="surrogateescape"),
            io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                             encoding="utf-8", errors="backslashreplace"),
            io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                             encoding="utf-8", errors="backslashreplace", line_buffering=True))


_STREAMS: tuple[Any, Any, Any] | None = None


def _prepare_std_streams() -> None:
    """Build the run's std streams once, here, over fds of the kinds a run gets (a memfd for
    stdin, a pipe for stdout and stderr), so that each child only dup2()s its own fds under
    them instead of building three stream stacks (~0.3 ms of copy-on-write faults per run).
    The pipe's read end stays open (and leaks into children until they close all fds) so that
    a stray write by the zygote never raises EPIPE; it is non-blocking, so it never hangs."""
    global _STREAMS
    stdin = os.memfd_create("stdin", os.MFD_CLOEXEC)
    _keep_read_end, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    os.dup2(stdin, 0)
    os.dup2(w, 1)
    os.dup2(w, 2)
    os.close(stdin)
    os.close(w)
    _STREAMS = _std_streams()


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    with contextlib.suppress(BaseException):
        print(e.code, file=sys.stderr)
    return 1


# ----------------------------------------------------------------------------------------------
# Message framing shared with the supervisor (stdlib only).


# A run request is binary, so that jail.c's loop can read it: magic, i64 work dir MiB, i64 work
# dir inodes, i32 count of cgroup.procs descriptors after the 7 run fds, then the session work
# dir (UTF-8, empty for a fresh one). Every other message is JSON.
RUN_MAGIC = b"RUN1"
_RUN_HEAD = struct.Struct("<qqi")


def encode_run(work: str, workdir_mb: int, workdir_inodes: int, ncg: int) -> bytes:
    return RUN_MAGIC + _RUN_HEAD.pack(workdir_mb, workdir_inodes, ncg) + work.encode()


def decode_msg(data: bytes) -> dict[str, Any] | None:
    """A supervisor message as a dict (None: the supervisor hung up)."""
    if not data:
        return None
    if data[:4] == RUN_MAGIC:
        mb, inodes, ncg = _RUN_HEAD.unpack_from(data, 4)
        return {"op": "run", "work": data[4 + _RUN_HEAD.size:].decode(), "workdir_mb": mb,
                "workdir_inodes": inodes, "ncg": ncg}
    msg: dict[str, Any] = json.loads(data)
    return msg


def recv_msg(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    data, fds = recv_raw(sock, 1 << 16)
    return decode_msg(data), fds


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def recv_raw(sock: socket.socket, size: int = 4096) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data, anc, _flags, _addr = sock.recvmsg(size, socket.CMSG_SPACE(16 * fds.itemsize))
    for level, typ, cdata in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            fds.frombytes(cdata[: len(cdata) - (len(cdata) % fds.itemsize)])
    return data, list(fds)


def main() -> ProgramRun | None:
    """The zygote: returns when the supervisor hangs up (None), or in a locked-down child
    (what runs its program: see _RunProgram)."""
    # The configuration arrives on stdin, not argv: /proc/1/cmdline of a run shows nothing.
    config = json.loads(sys.stdin.buffer.read())
    os.environ.pop("LD_BIND_NOW", None)  # it did its work at start-up; runs do not inherit it
    sock = socket.socket(fileno=int(sys.argv[1]))
    for name in config.get("preload", []):
        with contextlib.suppress(ImportError):
            __import__(name)
    _prepare_std_streams()
    # The compiler builds its AST types on first use (~2 ms): do it once here, not per run.
    compile("pass", "<warm>", "exec", dont_inherit=True)
    # Freeze the warm heap: a child's garbage collections then never touch (and copy) it.
    gc.freeze()
    try:
        z = Zygote(config)
        z.setup()
    except Exception as e:
        sock.send(json.dumps({"ok": False, "error": f"zygote setup failed: {e}"}).encode())
        return None
    del config  # the host's paths (see Zygote.setup)
    # Give back the heap's free pages (what compiling and importing left): every child would
    # otherwise inherit them, resident, like live memory. glibc only; elsewhere a no-op.
    with contextlib.suppress(AttributeError):
        _libc.malloc_trim(0)
    sock.send(json.dumps({"ok": True, "pid": os.getpid()}).encode())
    try:
        z.serve(sock)
    except _RunProgram as e:  # only ever in a child: see _RunProgram
        return e.run
    return None


# How the supervisor starts a zygote: ``python -I -c BOOTSTRAP <socket fd> <this file>``. Not as
# ``python zygote.py``: a script's syntax tree stays alive while its top-level code runs, and
# main() never returns, so every child would inherit ~2 MiB of it, copying its page tables at
# fork and unmapping them at exit. Imported as a module (from its cached bytecode when there is
# one), nothing of the compilation stays. Its code objects are renamed "<sandloop zygote>": a
# program that finds one (a frame, a function) must not learn where sandloop lives on the host.
# In a child, main() returns once the zygote's frames are gone (_RunProgram): the program then
# runs under one frame of the zygote's, this one, whose globals hold only what runs it.
BOOTSTRAP = (
    "def _zygote():\n"
    "    import sys\n"
    "    from importlib.machinery import SourceFileLoader\n"
    "    from types import CodeType, ModuleType\n"
    "    def neutral(code):\n"
    "        consts = tuple(neutral(c) if isinstance(c, CodeType) else c\n"
    "                       for c in code.co_consts)\n"
    "        return code.replace(co_filename='<sandloop zygote>', co_consts=consts)\n"
    "    loader = SourceFileLoader('sandloop_zygote', sys.argv[2])\n"
    "    zygote = sys.modules[loader.name] = ModuleType(loader.name)\n"
    "    exec(neutral(loader.get_code(loader.name)), zygote.__dict__)\n"
    "    run = zygote.main()\n"
    "    return None if run is None else (zygote.program_entry, run)\n"
    "_zygote = _zygote()\n"
    "if _zygote is not None:\n"
    "    _zygote[0](_zygote[1])\n"
)
