"""The zygote's serving loop: its one-time setup (the slot's cgroups, a private mount and
network namespace, the read-only root it pivots into), prepared children, the requests of the
supervisor, reaping, and ``main``.

The Python loop serves everything; jail.c's loop (``cjail.Jail``) serves the steady state and
hands the rest back (see ``Zygote.serve``).

No logging here (its ``contextlib.suppress`` sites stay silent): the zygote's stdout and stderr
are /dev/null, and ``logging`` imports ``threading``, whose at-fork hook would cost every child
~0.4 ms. What the supervisor must know travels in replies and status records.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import errno
import gc
import json
import marshal
import os
import select
import signal
import socket
import sys
from typing import Any

from ..protocol import (
    CHILD_RUN,
    CTL_FAILED,
    CTL_READY,
    N_RUN_FDS,
    PRIVATE,
    SETUP_FAILED_EXIT,
    SL_MAX_RUNNING,
    SL_NET_FILES,
    SL_NET_SNAP,
    TOOLS_DIR,
    WORK_DIR,
    Record,
    RunFd,
    ZygoteConfig,
    decode_msg,
    recv_msg,
    write_record,
)
from .child import child_after_c, prepare_child, serve_one
from .cjail import Jail, SlChild, SlZygote
from .program import ProgramRun, RunProgram, prepare_std_streams
from .syscalls import (
    CHILD_CLONE_FLAGS,
    CLONE_NEWNET,
    CLONE_NEWNS,
    MNT_DETACH,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    PR_CAPBSET_DROP,
    PR_SET_NAME,
    PR_SET_PDEATHSIG,
    RUN_TCP_HASH_BUCKETS,
    SetupError,
    check,
    clone_fork,
    libc,
    loopback_up,
    mount,
    net_snapshot,
    open_net_files,
    pivot_root,
    prctl,
    umount,
)


def load_warm(modules: list[list[str]]) -> None:
    """Run each warm module (sandbox/warm.py: sandloop's own, standard library only) into
    ``sys.modules``, marked with its source hash: from the supervisor's compiled code when this
    interpreter reads it (compiling here left ~0.7 MiB more in the heap every child inherits),
    else from the source. One that fails is left out: its programs load their own copy."""
    for name, source, digest, tag, code_hex in modules:
        module = type(sys)(name)
        module.__warm_hash__ = digest  # type: ignore[attr-defined]
        sys.modules[name] = module
        try:
            code = (marshal.loads(bytes.fromhex(code_hex)) if tag == sys.implementation.cache_tag
                    else compile(source, name + ".py", "exec", dont_inherit=True))
            exec(code, module.__dict__)
        except Exception:
            del sys.modules[name]


class SpareGone(SetupError):
    """The prepared child died before its request reached it (a fresh one can serve it)."""


# ----------------------------------------------------------------------------------------------
# Zygote state: a private mount namespace holding the read-only root and the work dirs.


class Zygote:
    def __init__(self, config: ZygoteConfig, load_jail: bool = True) -> None:
        self.base: str = config["base"]
        self.uid: int = config["uid"]
        self.gid: int = config["gid"]
        self.bpf: bytes = bytes.fromhex(config["bpf"]) if config.get("bpf") else b""
        self.binds: list[str] = config["binds"]
        self.symlinks: dict[str, str] = config["symlinks"]
        self.cgroups: list[str] = config["cgroups"]
        self.python: str = config["python"]
        self.preload: list[str] = config.get("preload", [])
        self.mounts: list[list[str]] = config.get("mounts", [])
        self.stage: int = config.get("stage", 1)
        # Loaded before setup() pivots away from the host's file system (or, re-executed on an
        # environment's interpreter, from the memfd copy that crossed the exec: reexec).
        jail = config.get("jail")
        self.jail: Jail | None = Jail(jail) if jail and load_jail else None
        if config.get("jail_fd") is not None:
            os.close(config["jail_fd"])
        self.root = os.path.join(self.base, "root")  # until setup() pivots into it: then "/"
        self.works = PRIVATE + "/work"  # persistent (session) work dirs, root-only
        # Running children: pid -> (status pipe, pidfd). A pidfd turns readable when its
        # process exits, so the loop needs no SIGCHLD handler (children inherit none to undo).
        self.running: dict[int, tuple[int, int]] = {}
        self.work_opts: dict[str, str] = {}  # persistent (session) work dirs -> tmpfs options
        self.cows: set[str] = set()  # those of them that are overlays on another (see mkwork)
        self.spare: Spare | None = None
        self.last_key: SpareKey | None = None
        # (kept copy, path under /tmp); a re-executed zygote gets them from its first stage.
        self.tmp_binds: list[tuple[str, str]] = [
            (a, b) for a, b in config.get("tmp_binds", [])]
        # The network namespace the slot's runs take turns in (see shared_net): the zygote's
        # own (to come back to; -1: runs never share one), the runs' (-1: none yet), and what
        # a run could observe of it when the last child joined it.
        self.zygote_net = -2  # not opened yet
        self.run_net = -1
        self.net_files: list[int] = [-1] * SL_NET_FILES  # its /proc/net files (open_net_files)
        self.net_snap = b""

    # -- one-time setup -------------------------------------------------------------------------
    def setup(self) -> None:
        """Build the read-only root, enter it, and lock the zygote down. A zygote re-executed
        on an environment's interpreter (stage 2) did the first part before its exec."""
        if self.stage != 2:
            self.enter_root()
        self.lock_down()

    def enter_root(self) -> None:
        """Join the slot's groups, make a private mount and network namespace, build the root
        and pivot into it."""
        _set_name()
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
        check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        # A network namespace of the zygote's own (it needs none), so that the runs' ones,
        # created from it, get a small TCP hash each (tcp_child_ehash_entries, Linux 6.1+)
        # rather than sharing the host's: freeing a run's namespace then no longer walks the
        # host's whole hash (262,144 buckets here) for its TIME_WAIT sockets, ~0.1 ms per run.
        check(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
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
        # The runtime and the skeleton are read-only for every run.
        mount(None, self.root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        # Live in that root: a child's copy of this mount namespace is then a dozen mounts, not
        # every mount of the host, and it needs no pivot of its own (clone and exit got cheaper).
        os.chdir(self.root)
        pivot_root(".", ".")
        umount(".", MNT_DETACH)
        os.chdir("/")
        self.root = "/"

    def lock_down(self) -> None:
        """Empty the capability bounding set and forget the host's layout."""
        _set_name()  # again after a re-exec, which named the process after its binary
        # Empty the capability bounding set: no descendant can ever gain a capability by exec
        # (the zygote keeps its effective set for mounts, and never execs once it is set: a
        # re-exec on an environment's interpreter happens before, or root would lose them).
        for cap in range(64):
            if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0:
                if ctypes.get_errno() == errno.EINVAL:
                    break
                check(-1, f"drop capability {cap} from the bounding set")
        # Forget the host's layout (the slot's directory, the cgroup paths, the runtime's
        # paths): the zygote needs none of it any more, and what it holds, its children inherit.
        self.base, self.python, self.binds, self.symlinks, self.cgroups = "", "", [], {}, []
        self.mounts = []

    def reexec(self, config: ZygoteConfig, sock_fd: int) -> None:
        """Become the environment's interpreter (``config["exec"]``, a path inside the root),
        once the root with the environment's tree is built and entered: its ``sys.prefix``,
        ``sys.path`` and modules then name only neutral paths (/opt/env/...), and it starts
        with the environment's PYTHONHASHSEED. The zygote's code, configuration and C helper
        cross the exec in memfds (their host paths are gone). Returns only on failure."""
        jail_fd = None
        # Before the pivot, while the package's files are there (the directory is argv[2]).
        sources, codes = _zygote_code(config["modules"])
        jail = config.get("jail")
        if jail:
            with open(jail, "rb") as f:  # before the pivot: a host path
                jail_fd = _memfd("sl-jail", f.read())
        self.enter_root()
        nxt: dict[str, Any] = {k: v for k, v in config.items()
                               if k not in ("modules", "bootstrap", "exec_env")}
        nxt.update(stage=2, tmp_binds=[list(t) for t in self.tmp_binds], exec=None)
        if jail_fd is not None:
            nxt.update(jail=f"{PRIVATE}/proc/self/fd/{jail_fd}", jail_fd=jail_fd)
        blob = _memfd("sl-zygote", json.dumps({
            "config": nxt, "tag": sys.implementation.cache_tag}).encode())
        code_fd = _memfd("sl-zygote-code", codes)
        source_fd = _memfd("sl-zygote-src", sources)
        os.set_inheritable(sock_fd, True)
        exe = config["exec"]
        assert exe is not None
        os.execve(exe, [exe, "-s", "-c", config["bootstrap"], str(sock_fd),
                        f"fd:{blob}:{code_fd}:{source_fd}"], config["exec_env"])

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
        # Environment trees, at neutral paths (/opt/env), never at their host paths.
        for src, target in self.mounts:
            dst = os.path.join(r, target.lstrip("/"))
            os.makedirs(dst, exist_ok=True)
            if not self._mount_unnamed(src, dst):
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

    def _mount_unnamed(self, src: str, dst: str) -> bool:
        """Mount the directory ``src`` read-only at ``dst`` so that the mount table names no
        host path; False where the kernel cannot (then the caller binds it).

        Threat: a bind mount's line in /proc/self/mountinfo shows its source as a path of the
        host's file system (/var/lib/sandloop/envs/<id>/tree), which every program can read.
        A read-only overlay is a file system of its own (its root field is "/"), and its
        options show its lower layers as given: here /proc/self/fd/N of descriptors that only
        this process held while mounting. Two lower layers, no upper: the kernel refuses a
        single one; the second is an empty directory of the zygote's private tmpfs. Read-only
        and without an upper layer, nothing can be copied up or written."""
        empty = os.path.join(self.base, "empty")  # shared by every such mount: read-only
        with contextlib.suppress(FileExistsError):
            os.mkdir(empty, 0o755)
        fds = []
        try:
            fds = [os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) for d in (src, empty)]
            opts = f"lowerdir=/proc/self/fd/{fds[0]}:/proc/self/fd/{fds[1]}".encode()
            # Not 0: ENODEV (no overlayfs), EINVAL/EPERM (a kernel or a file system that
            # refuses): the caller binds it, as before.
            return bool(libc.mount(b"overlay", dst.encode(), b"overlay",
                                   MS_RDONLY | MS_NOSUID | MS_NODEV, opts) == 0)
        except OSError:
            return False
        finally:
            for fd in fds:
                os.close(fd)

    # -- persistent work dirs (sessions) ------------------------------------------------------
    def work_path(self, work: str) -> str:
        if not work.isalnum():
            raise SetupError(f"bad work id {work!r}")
        return os.path.join(self.works, work)

    def ensure_work(self, work: str, opts: str, lower: str | None = None) -> None:
        """Mount a named work tmpfs once; every run that names it gets it bound at /sandbox.
        With ``lower`` (another work dir, which nobody writes any more), an overlay on it
        instead: its files show through and what the runs change goes to a tmpfs of ``opts``."""
        if work not in self.work_opts:
            path = self.work_path(work)
            os.makedirs(path, 0o700, exist_ok=True)
            if lower is None:
                mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV,
                      f"{opts},mode=0755,uid={self.uid},gid={self.gid}")
            else:
                self._mount_cow(path, work, opts, lower)
                self.cows.add(work)
            self.work_opts[work] = opts

    def _cow_area(self, work: str) -> str:
        return os.path.join(PRIVATE, "cow", work)

    def _mount_cow(self, path: str, work: str, opts: str, lower: str) -> None:
        """Copy-on-write work dir: an overlay of ``lower`` with an upper layer on a tmpfs of
        its own, so one prepared copy of a repository serves every session opened from it.

        The size and inode limits hold for what a session writes (the upper layer); the lower
        layer is shared and read-only (a run that could write it would change every session's
        files: it is never bound into a run). The layers are named by descriptors only this
        process held while mounting, so the mount table shows no work dir names."""
        if lower not in self.work_opts or lower in self.cows:
            raise SetupError(f"lower work dir {lower!r} is not a plain work dir of this zygote")
        area = self._cow_area(work)
        os.makedirs(area, 0o700, exist_ok=True)
        mount("tmpfs", area, "tmpfs", MS_NOSUID | MS_NODEV, f"{opts},mode=0700")
        fds: list[int] = []
        try:
            upper, scratch = os.path.join(area, "upper"), os.path.join(area, "work")
            os.mkdir(upper, 0o755)
            os.chown(upper, self.uid, self.gid)  # the merged root's owner and mode are these
            os.mkdir(scratch, 0o700)
            fds = [os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                   for d in (self.work_path(lower), upper, scratch)]
            fd_dir = PRIVATE + "/proc/self/fd"  # the host's /proc, once setup() pivoted
            layers = (f"lowerdir={fd_dir}/{fds[0]},upperdir={fd_dir}/{fds[1]},"
                      f"workdir={fd_dir}/{fds[2]}")
            # redirect_dir lets a program rename a directory that came from the lower layer
            # (without it: EXDEV); a kernel without it gets the plain overlay.
            for extra in (",redirect_dir=on", ""):
                if libc.mount(b"overlay", path.encode(), b"overlay", MS_NOSUID | MS_NODEV,
                              (layers + extra).encode()) == 0:
                    return
            err = ctypes.get_errno()
            raise OSError(err, f"overlay work dir: {os.strerror(err)}")
        except BaseException:
            umount(area, MNT_DETACH)
            os.rmdir(area)
            raise
        finally:
            for fd in fds:
                os.close(fd)

    def remove_work(self, work: str) -> None:
        if work in self.work_opts:
            path = self.work_path(work)
            # Detached, not unmounted: a lower layer stays alive for the overlays on it.
            umount(path, MNT_DETACH)
            os.rmdir(path)
            if work in self.cows:
                umount(self._cow_area(work), MNT_DETACH)
                os.rmdir(self._cow_area(work))
                self.cows.discard(work)
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
            child_after_c(list(z.child_fds))
        del keep
        self._from_c(z, kept)
        if code < 0:
            raise OSError(-code, f"zygote loop: {os.strerror(-code)}")
        if code == 0:
            return False
        fds = list(z.fds[:z.n_fds])
        msg = decode_msg(ctypes.string_at(ctypes.addressof(z) + SlZygote.msg.offset, z.msg_len))
        if msg is None:
            close_all(fds)
            return False
        self._answer(sock, msg, fds)
        return True

    def _to_c(self, z: SlZygote, jail: Jail, sock: socket.socket) -> SlChild | None:
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
        z.zygote_net = self.zygote_net if self.zygote_net >= 0 else -1
        z.run_net, z.net_snap_len = self.run_net, len(self.net_snap)
        z.net_files[:] = self.net_files
        ctypes.memmove(ctypes.addressof(z) + SlZygote.net_snap.offset, self.net_snap,
                       len(self.net_snap))
        return child  # referenced by the caller while the C loop may use it

    def _from_c(self, z: SlZygote, kept: tuple[int, frozenset[str]]) -> None:
        """Take the state back from the C loop. ``kept``: the prepared child handed to it and
        the session work dirs it was cloned with; one the C loop made has those of now (only
        the Python loop mounts them)."""
        self.running = {z.run_pid[i]: (z.run_status[i], z.run_pidfd[i])
                        for i in range(z.n_running)}
        self.run_net = z.run_net  # the C loop may have made a fresh one
        self.net_files = list(z.net_files)
        self.net_snap = ctypes.string_at(ctypes.addressof(z) + SlZygote.net_snap.offset,
                                         z.net_snap_len)
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
                    close_all(fds)
                    return False
                self._answer(sock, msg, fds)
                return True

    def _answer(self, sock: socket.socket, msg: dict[str, Any], fds: list[int]) -> None:
        try:
            reply = self.handle(msg, fds)
        except Exception as e:  # reported to the supervisor, which fails the run
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        # Not in a finally: a child unwinding from handle() (RunProgram) may hold its own
        # descriptors under these numbers.
        close_all(fds)
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
                write_record(fd, Record.EXIT, json.dumps(rec).encode())
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
            lower = msg.get("lower")
            try:
                self.ensure_work(msg["work"],
                                 tmpfs_options(msg["workdir_mb"], msg["workdir_inodes"]), lower)
            except OSError as e:
                if lower is None:
                    raise
                # No overlayfs here (or it refuses this file system): the supervisor copies.
                return {"ok": False, "cow_unavailable": True, "error": str(e)}
            return {"ok": True}
        if op != "run":
            return {"ok": False, "error": f"unknown op {op!r}"}
        # After the N_RUN_FDS run fds: the run's cgroup.procs files. Without them the run would stay in
        # the slot's group, which has no limits: refuse rather than run with less isolation.
        ncg = int(msg.get("ncg", 0))
        if ncg < 1 or len(fds) != N_RUN_FDS + ncg:
            return {"ok": False,
                    "error": f"run needs {N_RUN_FDS} fds + its cgroups ({ncg}), got {len(fds)}"}
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
        self.running[spare.pid] = (os.dup(fds[RunFd.STATUS]), spare.pidfd)
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
        for procs in fds[N_RUN_FDS:]:
            try:
                os.write(procs, str(spare.pid).encode())
            except ProcessLookupError as e:
                raise SpareGone(f"sandbox child died before its run: {e}") from e
            except OSError as e:
                raise SetupError(f"cannot move the child into the run's cgroup: {e}") from e
        spare.dispatch(fds[:N_RUN_FDS], work_path)

    def spawn(self, key: SpareKey) -> Spare:
        """Clone a child and let it isolate itself; it then waits for its one request."""
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The slot's network namespace only while no run of the slot is alive (see shared_net).
        net = self.shared_net() if not self.running else -1
        flags = CHILD_CLONE_FLAGS & ~CLONE_NEWNET if net >= 0 else CHILD_CLONE_FLAGS
        if self.jail is not None:
            pid = self.jail.spawn(self, key, flags, child_end.fileno(), parent_end.fileno(), net)
            if pid == 0:  # isolated, requested and locked down in C
                # jail.c closed both ends (their numbers may be the run's descriptors now):
                # forget them, or unwinding (RunProgram) would close those.
                parent_end.detach()
                child_end.detach()
                child_after_c(list(self.jail.state.child_fds))
        else:
            pid = clone_fork(flags)
        if pid == 0:
            # The child must never resume the zygote's work, whatever happens: it leaves only
            # by RunProgram (see there), once locked down.
            try:
                parent_end.close()
                try:
                    prepare_child(self, key, net)
                except BaseException as e:  # reported when the zygote waits for readiness
                    with contextlib.suppress(OSError):
                        child_end.send(CTL_FAILED + f"{type(e).__name__}: {e}".encode()[:4000])
                    os._exit(SETUP_FAILED_EXIT)
                child_end.send(CTL_READY)
                run = serve_one(self, child_end, key)
            except BaseException:
                os._exit(SETUP_FAILED_EXIT)
            raise RunProgram(run)
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

    def shared_net(self) -> int:
        """The network namespace the next child joins, or -1: it is cloned into a fresh one.
        Only for a child cloned while no run of the slot is alive. jail.c shared_net is the same
        in C (its comment says why and what is compared)."""
        if self.zygote_net == -2:
            try:
                self.zygote_net = os.open(f"{PRIVATE}/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self.zygote_net = -1
        if self.zygote_net < 0:
            return -1
        if self.run_net >= 0:
            try:
                if net_snapshot(self.net_files) == self.net_snap:
                    return self.run_net
            except OSError:
                pass
            self._drop_net()
        # A fresh one, made from the zygote's own: it gets the small TCP hash (enter_root).
        if libc.unshare(CLONE_NEWNET) < 0:
            return -1
        try:
            loopback_up()
            self.run_net = os.open(f"{PRIVATE}/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            self.net_files = open_net_files(f"{PRIVATE}/proc")
            self.net_snap = net_snapshot(self.net_files)
            if len(self.net_snap) > SL_NET_SNAP:  # more than jail.c keeps: runs do not share it
                raise OSError(errno.E2BIG, "network namespace state too large")
        except OSError:
            self._drop_net()
            return -1
        finally:
            self._net_home()
        return self.run_net

    def _drop_net(self) -> None:
        for fd in (self.run_net, *self.net_files):
            if fd >= 0:
                os.close(fd)
        self.run_net, self.net_files, self.net_snap = -1, [-1] * SL_NET_FILES, b""

    def _net_home(self) -> None:
        """Back to the zygote's own network namespace; a zygote that cannot return leaves."""
        if libc.setns(self.zygote_net, CLONE_NEWNET) < 0:
            os._exit(SETUP_FAILED_EXIT)

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
        if data != CTL_READY:
            detail = data[1:].decode(errors="replace") if data else "it exited"
            raise SetupError(f"sandbox setup failed: {detail}")
        self.is_ready = True

    def dispatch(self, fds: list[int], work_path: str) -> None:
        """Send the run's descriptors, and the session work dir to bind at /sandbox (or "")."""
        try:
            self.ctl.sendmsg([CHILD_RUN + work_path.encode()],
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



def _set_name() -> None:
    """"sl-zygote" in ps/top (children inherit it until they exec)."""
    name = ctypes.create_string_buffer(b"sl-zygote")
    libc.prctl(PR_SET_NAME, ctypes.addressof(name), 0, 0, 0)


def _zygote_code(modules: list[list[str]]) -> tuple[bytes, bytes]:
    """The zygote modules' sources (JSON) and code (marshal), for the re-executed zygote
    (BOOTSTRAP): the code from the package's cached bytecode, as the first stage loaded it,
    under the neutral file name. Compiling the sources costs a zygote start ~50 ms."""
    from importlib.machinery import SourceFileLoader  # the first stage only
    from types import CodeType

    def neutral(code: CodeType) -> CodeType:
        consts = tuple(neutral(c) if isinstance(c, CodeType) else c for c in code.co_consts)
        return code.replace(co_filename="<sandloop zygote>", co_consts=consts)

    sources: dict[str, str] = {}
    codes: dict[str, CodeType] = {}
    for name, rel in modules:
        path = os.path.join(sys.argv[2], rel)
        loader = SourceFileLoader(name, path)
        sources[name] = loader.get_data(path).decode("utf-8")
        code = loader.get_code(name)
        assert code is not None
        codes[name] = neutral(code)
    return json.dumps(sources).encode(), marshal.dumps(codes)


def _memfd(name: str, data: bytes) -> int:
    """An inheritable memfd holding ``data`` (it crosses the zygote's re-exec)."""
    fd = os.memfd_create(name, 0)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    return fd


def close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)



def main() -> ProgramRun | None:
    """The zygote: returns when the supervisor hangs up (None), or in a locked-down child
    (what runs its program: see RunProgram)."""
    # The configuration arrives on stdin, not argv: /proc/1/cmdline of a run shows nothing.
    # A zygote re-executed on an environment's interpreter finds it in a memfd (reexec).
    config: ZygoteConfig
    if sys.argv[2].startswith("fd:"):
        fd = int(sys.argv[2][3:].split(":")[0])
        config = json.loads(os.pread(fd, os.fstat(fd).st_size, 0))["config"]
        os.close(fd)
    else:
        config = json.loads(sys.stdin.buffer.read())
    sock = socket.socket(fileno=int(sys.argv[1]))
    if config.get("exec"):
        try:
            Zygote(config, load_jail=False).reexec(config, sock.fileno())
        except Exception as e:
            sock.send(json.dumps({"ok": False, "error": f"zygote setup failed: {e}"}).encode())
        return None
    # They did their work at start-up (runenv.zygote_config); runs do not inherit them.
    os.environ.pop("LD_BIND_NOW", None)
    os.environ.pop("LD_LIBRARY_PATH", None)
    for name in config.get("preload", []):
        with contextlib.suppress(ImportError):
            __import__(name)
    load_warm(config.get("warm", []))
    prepare_std_streams()
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
        libc.malloc_trim(0)
    sock.send(json.dumps({"ok": True, "pid": os.getpid()}).encode())
    try:
        z.serve(sock)
    except RunProgram as e:  # only ever in a child: see RunProgram
        # Not closed: the program closes every descriptor above 3 anyway, and a socket that
        # is freed open formats a ResourceWarning first (its repr, ~50 copy-on-write faults).
        sock.detach()
        return e.run
    return None
