"""The fork-server (zygote) of one slot, and the isolation steps of every child it spawns.

This file runs as its own process under the runtime's Python interpreter (``python -I zygote.py``),
so it imports only the standard library. It is started as root by the slot supervisor, holds no
secrets, and never runs untrusted code itself. It lives in its own mount namespace and in the
slot's network namespace (loopback only); each run is a fresh child created with ``clone`` into
new pid, mount, ipc and uts namespaces, which then

  1. is born inside the slot's cgroups (memory, pids, cpu), which the zygote joined at start,
  2. pivots into a minimal read-only root (runtime directories bound read-only, a fresh
     size-limited tmpfs for /tmp, the slot's work tmpfs at /sandbox, a new /proc, a few devices),
  3. sets rlimits, drops every capability, switches to the slot's unprivileged uid/gid,
     sets no_new_privs and loads the seccomp filter the supervisor compiled,
  4. and only then runs the program (exec, or for Python, in this already-warm interpreter).

The zygote waits for each child and reports its exit status and rusage on the run's status pipe.

Protocol (SOCK_SEQPACKET, one JSON message per packet, file descriptors with SCM_RIGHTS):
  supervisor -> zygote: {"op": "run", ...} + fds [stdin, files, stdout, stderr, channel, status]
                        {"op": "rmwork", "work": id}   {"op": "ping"}
  zygote -> supervisor: {"ok": true, "pid": host_pid} or {"ok": false, "error": "..."}
  zygote -> status pipe: "E<message>\\n" on a setup failure (from the child),
                         "X<json>\\n" when the child has exited (from the zygote).
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import platform
import resource
import select
import shutil
import signal
import socket
import struct
import sys

# Modules commonly imported by model-written programs, imported once here so that children
# start with them warm. None of them holds secrets or starts threads at import.
PRELOAD = (
    "collections", "itertools", "functools", "math", "re", "heapq", "bisect", "string",
    "random", "typing", "dataclasses", "fractions", "decimal", "datetime", "copy",
    "statistics", "operator", "io", "traceback", "atexit", "threading", "hashlib",
    "unittest", "textwrap", "enum", "array", "cmath", "numbers",
)

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
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
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

SYS_CLONE = {"x86_64": 56, "aarch64": 220, "ppc64le": 120, "s390x": 120}
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}

SCRATCH = "scratch"  # the slot's reusable work dir for one-shot runs
SETUP_FAILED_EXIT = 125  # exit code of a child whose isolation setup failed (reported as "E")
WORK_DIR = "/sandbox"

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
# PyDLL keeps the GIL across the call: clone() must return in the child holding it.
_libc_gil = ctypes.PyDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
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


# ----------------------------------------------------------------------------------------------
# Zygote state: a private mount namespace holding the read-only root and the work dirs.


class Zygote:
    def __init__(self, config: dict) -> None:  # type: ignore[type-arg]
        self.base: str = config["base"]
        self.uid: int = config["uid"]
        self.gid: int = config["gid"]
        self.bpf: bytes = bytes.fromhex(config["bpf"]) if config.get("bpf") else b""
        self.binds: list[str] = config["binds"]
        self.symlinks: dict[str, str] = config["symlinks"]
        self.cgroups: list[str] = config["cgroups"]
        self.root = os.path.join(self.base, "root")
        self.works = os.path.join(self.base, "work")
        self.status_fds: dict[int, int] = {}
        self.discard: dict[int, str] = {}  # child pid -> work dir to remove once it has exited
        self.work_opts: dict[str, str] = {}  # mounted work dirs -> their tmpfs size options
        self.spare: Spare | None = None
        self.last_key: tuple[str, str] | None = None

    # -- one-time setup -------------------------------------------------------------------------
    def setup(self) -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the supervisor is already gone
            os._exit(0)
        # Join the slot's cgroups: every run is born inside them, so none is migrated later.
        for procs in self.cgroups:
            with open(procs, "w") as f:
                f.write("0")
        # Shield the zygote from the OOM killer where the host lets us (CAP_SYS_RESOURCE);
        # each child also volunteers itself (+1000), which needs no privilege.
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("-1000")
        except PermissionError:
            pass
        # The slot's own network namespace: only a loopback interface, no route anywhere.
        # It is shared by the slot's runs, which are strictly sequential and leave no process
        # (hence no socket) behind, and unprivileged runs cannot reconfigure it. Creating one
        # per run cost ~1 ms of kernel time per run here, plus asynchronous cleanup.
        _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare(CLONE_NEWNS | CLONE_NEWNET)")
        loopback_up()
        # Nothing we mount may propagate back to the host.
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount("tmpfs", self.base, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0700")
        os.mkdir(self.root, 0o755)
        os.mkdir(self.works, 0o700)
        mount("tmpfs", self.root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        self._build_root()
        # The runtime and the skeleton are read-only for every run.
        mount(None, self.root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)

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
        etc = os.path.join(r, "etc")
        with open(os.path.join(etc, "passwd"), "w") as f:
            f.write(f"root:x:0:0::/:/bin/false\nsandbox:x:{self.uid}:{self.gid}::{WORK_DIR}:/bin/sh\n"
                    "nobody:x:65534:65534::/:/bin/false\n")
        with open(os.path.join(etc, "group"), "w") as f:
            f.write(f"root:x:0:\nsandbox:x:{self.gid}:\nnogroup:x:65534:\n")
        with open(os.path.join(etc, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost sandbox\n::1 localhost\n")

    # -- work dirs ------------------------------------------------------------------------------
    def work_path(self, work: str) -> str:
        if not work.isalnum():
            raise SetupError(f"bad work id {work!r}")
        return os.path.join(self.works, work)

    def ensure_work(self, work: str, size_mb: int, inodes: int, fresh: bool) -> str:
        """Mount the work tmpfs once, and resize it (empty) when a run asks for other limits.

        Work dirs are reused rather than unmounted after every run: an unmount waits for an
        RCU grace period (1-5 ms here), a wipe of a freshly used tmpfs takes microseconds.
        """
        path = self.work_path(work)
        opts = f"size={size_mb}m,nr_inodes={inodes}"
        if work not in self.work_opts:
            os.makedirs(path, 0o700, exist_ok=True)
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV,
                  f"{opts},mode=0755,uid={self.uid},gid={self.gid}")
            self.work_opts[work] = opts
        elif self.work_opts[work] != opts:
            if fresh:
                self.wipe_work(work)
            mount(None, path, None, MS_REMOUNT | MS_NOSUID | MS_NODEV, opts)
            self.work_opts[work] = opts
        return path

    def wipe_work(self, work: str) -> None:
        """Empty a work dir and reset its root, leaving nothing for the next run to find.

        Every process of the previous run is dead, so nothing races with the removal; the
        removal itself never follows symlinks (shutil.rmtree's fd-based walk).
        """
        path = self.work_path(work)
        with os.scandir(path) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        for name, is_dir in entries:
            full = os.path.join(path, name)
            if is_dir:
                shutil.rmtree(full)
            else:
                os.unlink(full)
        # The run owned the root of its work dir: undo mode, owner and extended attributes.
        os.chmod(path, 0o755)
        os.chown(path, self.uid, self.gid)
        for attr in os.listxattr(path):
            with contextlib.suppress(OSError):
                os.removexattr(path, attr)

    def remove_work(self, work: str) -> None:
        path = self.work_path(work)
        if work == SCRATCH:
            self.wipe_work(work)
        elif work in self.work_opts:
            umount(path, MNT_DETACH)
            os.rmdir(path)
            del self.work_opts[work]

    # -- the loop -------------------------------------------------------------------------------
    def serve(self, sock: socket.socket) -> None:
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wfd)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        while True:
            try:
                ready, _, _ = select.select([sock.fileno(), rfd], [], [])
            except InterruptedError:
                continue
            if rfd in ready:
                try:
                    while os.read(rfd, 512):
                        pass
                except BlockingIOError:
                    pass
                self.reap()
            if sock.fileno() in ready:
                try:
                    msg, fds = recv_msg(sock)
                except ConnectionError:
                    return
                if msg is None:
                    return
                try:
                    reply = self.handle(msg, fds)
                except Exception as e:  # reported to the supervisor, which fails the run
                    reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                finally:
                    for fd in fds:
                        with contextlib.suppress(OSError):
                            os.close(fd)
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
            fd = self.status_fds.pop(pid, None)
            if fd is None:
                continue
            rec = {"status": status, "utime": ru.ru_utime, "stime": ru.ru_stime,
                   "maxrss_kb": ru.ru_maxrss}
            with contextlib.suppress(OSError):
                os.write(fd, b"X" + json.dumps(rec).encode() + b"\n")
            os.close(fd)
            # The run is over: its work dir goes now, while the supervisor reads the result.
            work = self.discard.pop(pid, None)
            if work is not None:
                self.remove_work(work)
            self.prespawn()

    def handle(self, msg: dict, fds: list[int]) -> dict:  # type: ignore[type-arg]
        op = msg.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid()}
        if op == "rmwork":
            self.remove_work(msg["work"])
            return {"ok": True}
        if op != "run":
            return {"ok": False, "error": f"unknown op {op!r}"}
        if len(fds) != 6:
            return {"ok": False, "error": f"run needs 6 fds, got {len(fds)}"}
        work = self.ensure_work(msg["work"], msg["workdir_mb"], msg["workdir_inodes"],
                                bool(msg.get("fresh_work")))
        if msg.get("fresh_work") and os.listdir(work):
            self.wipe_work(msg["work"])  # left over only if a previous run was not discarded
        key = (msg["work"], tmp_options(msg["workdir_mb"], msg["workdir_inodes"]))
        spare = self.spare
        self.spare = None
        if spare is not None and spare.key != key:
            spare.discard()
            spare = None
        try:
            if spare is not None:
                try:
                    spare.wait_ready()
                except SetupError:  # it died idle (killed, or failed): make a new one
                    spare.discard()
                    spare = None
            if spare is None:
                spare = self.spawn(*key)
                spare.wait_ready()
            spare.dispatch(msg, fds)
        except SetupError as e:
            if spare is not None:
                spare.discard()
            return {"ok": False, "error": str(e)}
        self.status_fds[spare.pid] = os.dup(fds[5])
        if msg.get("discard_work"):
            self.discard[spare.pid] = msg["work"]
        self.last_key = key
        # Hand the child's mount namespace to the supervisor: while it holds a reference, the
        # child's exit does not wait for the namespace's unmounts (an RCU grace period, several
        # ms here); the supervisor drops it off the critical path.
        reply: dict = {"ok": True, "pid": spare.pid}  # type: ignore[type-arg]
        if spare.mntns is not None:
            reply["_fds"] = [spare.mntns]
            spare.mntns = None
        spare.ctl.close()
        return reply

    def spawn(self, work: str, tmp_opts: str) -> Spare:
        """Clone a child and let it isolate itself; it then waits for its one request."""
        path = self.work_path(work)
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = clone_fork(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS)
        if pid == 0:
            parent_end.close()
            try:
                prepare_child(self, path, tmp_opts)
            except BaseException as e:  # any failure is a setup failure, reported on dispatch
                with contextlib.suppress(OSError):
                    child_end.send(b"E" + f"{type(e).__name__}: {e}".encode()[:4000])
                os._exit(SETUP_FAILED_EXIT)
            child_end.send(b"R")
            serve_one(self, child_end)  # never returns
            os._exit(SETUP_FAILED_EXIT)
        child_end.close()
        mntns: int | None
        try:
            mntns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            mntns = None
        return Spare(pid, parent_end, (work, tmp_opts), mntns)

    def prespawn(self) -> None:
        """Prepare the next run's child while the slot is idle, so a run skips clone + setup."""
        if self.spare is None and self.last_key is not None and not self.status_fds:
            try:
                self.spare = self.spawn(*self.last_key)
            except (OSError, SetupError):
                self.spare = None


def tmp_options(size_mb: int, inodes: int) -> str:
    return f"size={size_mb}m,nr_inodes={inodes},mode=1777"


class Spare:
    """A child that has finished isolating itself and waits for its request on ``ctl``."""

    def __init__(self, pid: int, ctl: socket.socket, key: tuple[str, str], mntns: int | None) -> None:
        self.pid = pid
        self.ctl = ctl
        self.key = key
        self.mntns = mntns
        self.is_ready = False

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until the child reports that its isolation is complete, or say why it failed."""
        if self.is_ready:
            # Still alive? Anything readable now is EOF: the idle child died.
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

    def dispatch(self, msg: dict, fds: list[int]) -> None:  # type: ignore[type-arg]
        try:
            self.ctl.sendmsg([json.dumps(msg).encode()],
                             [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        except OSError as e:
            raise SetupError(f"sandbox child died before its run: {e}") from e

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


# ----------------------------------------------------------------------------------------------
# The child: pid 1 of its own pid namespace. Every step before the program is security-relevant.


def prepare_child(z: Zygote, work: str, tmp_opts: str) -> None:
    """Isolate this fresh child before it knows what it will run."""
    # When the slot's memory runs out, the OOM killer must pick the run, never the zygote.
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    r = z.root
    # The work tmpfs at /sandbox, a fresh bounded /tmp, a /proc of this pid namespace only.
    mount(work, r + WORK_DIR, None, MS_BIND)
    mount("tmpfs", r + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, tmp_opts)
    mount("proc", r + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # pivot_root(".", ".") stacks the old root under the new one; detaching it leaves only the
    # minimal tree, so no host path is reachable even by name.
    os.chdir(r)
    pivot_root(".", ".")
    umount(".", MNT_DETACH)
    os.chdir("/")
    _check(_libc.sethostname(b"sandbox", 7), "sethostname")
    # Drop every capability from the bounding set now; ids, no_new_privs and seccomp follow
    # when the request arrives (an idle prepared child stays root, so no process of the
    # slot's uid ever exists between runs).
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 and ctypes.get_errno() == errno.EINVAL:
            break


def drop_privileges(z: Zygote) -> None:
    """Become the slot's unprivileged user for good, then lock the process down."""
    os.setgroups([])
    os.setresgid(z.gid, z.gid, z.gid)
    os.setresuid(z.uid, z.uid, z.uid)
    if os.getuid() != z.uid or os.geteuid() != z.uid or os.getegid() != z.gid:
        raise SetupError("uid/gid drop did not take effect")
    # Credential changes clear the parent-death signal, so set it now: if the zygote dies, so
    # does the whole pid namespace.
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_DUMPABLE, 0)
    os.chdir(WORK_DIR)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if z.bpf:
        load_seccomp(z.bpf)


def serve_one(z: Zygote, ctl: socket.socket) -> None:
    """Receive the one request (already unprivileged and filtered), then become the program."""
    while True:
        try:
            msg, fds = recv_msg(ctl)
            break
        except InterruptedError:
            continue
    if msg is None or len(fds) != 6:
        os._exit(SETUP_FAILED_EXIT)
    stdin_fd, files_fd, out_fd, err_fd, chan_fd, status_fd = fds
    try:
        for name, value in msg["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (value, value))
        drop_privileges(z)
        _write_files(files_fd)  # as the slot user, inside the jail: no symlink can escape
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.write(status_fd, b"E" + f"{type(e).__name__}: {e}".encode()[:4000] + b"\n")
        os._exit(SETUP_FAILED_EXIT)
    # Standard streams: stdin is a sealed memfd, out/err and the result channel are pipes.
    os.dup2(stdin_fd, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.dup2(chan_fd, 3)
    os.set_inheritable(3, True)
    os.closerange(4, 1 << 20)  # drops the zygote's sockets, the status pipe and every other fd
    env = msg["env"]
    spec = msg["exec"]
    if spec["mode"] == "exec":
        argv = spec["argv"]
        os.execve(argv[0], argv, env)
    run_python(spec["path"], spec["argv"], env)


def _write_files(files_fd: int) -> None:
    """Create the request's files, as the slot user, inside the already-pivoted work dir."""
    with os.fdopen(files_fd, "rb", closefd=False) as f:
        f.seek(0)
        data = f.read()
    pos = 0
    while pos < len(data):
        nlen, dlen, mode = struct.unpack_from("<IQH", data, pos)
        pos += 14
        name = data[pos:pos + nlen].decode()
        pos += nlen
        body = data[pos:pos + dlen]
        pos += dlen
        d = os.path.dirname(name)
        if d:
            os.makedirs(d, exist_ok=True)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        try:
            view = memoryview(body)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        finally:
            os.close(fd)


def run_python(path: str, argv: list[str], env: dict[str, str]) -> None:
    """Run a Python file as ``python path argv...`` would, in this pre-warmed interpreter."""
    import atexit
    import builtins
    import io
    import random
    import threading
    import traceback
    import types

    os.environ.clear()
    os.environ.update(env)
    sys.argv = [path, *argv]
    sys.path[0] = os.path.dirname(os.path.abspath(path))
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                 encoding="utf-8", errors="surrogateescape")
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                                  encoding="utf-8", errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                  encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
    random.seed()  # every child would otherwise share the zygote's random state
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
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
        for t in threading.enumerate():
            if t is not threading.main_thread() and not t.daemon:
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


def recv_msg(sock: socket.socket) -> tuple[dict | None, list[int]]:  # type: ignore[type-arg]
    fds = array.array("i")
    data, anc, _flags, _addr = sock.recvmsg(1 << 20, socket.CMSG_SPACE(16 * fds.itemsize))
    for level, typ, cdata in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            fds.frombytes(cdata[: len(cdata) - (len(cdata) % fds.itemsize)])
    if not data:
        return None, list(fds)
    return json.loads(data), list(fds)


def main() -> None:
    config = json.loads(sys.argv[1])
    sock = socket.socket(fileno=int(sys.argv[2]))
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    z = Zygote(config)
    try:
        z.setup()
    except Exception as e:
        sock.send(json.dumps({"ok": False, "error": f"zygote setup failed: {e}"}).encode())
        return
    sock.send(json.dumps({"ok": True, "pid": os.getpid()}).encode())
    z.serve(sock)


if __name__ == "__main__":
    main()
