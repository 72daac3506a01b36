"""The child's isolation steps in Python (jail.c holds the same steps in C): pid 1 of its own
pid namespace, from its clone to a locked-down process with its request. Every step before the
program is security-relevant.

No logging here or anywhere a child runs: after the fork it has no handlers, and its fds 1 and
2 become the program's.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import struct
from typing import TYPE_CHECKING, NoReturn

from ..protocol import (
    CHILD_RUN,
    FILE_ERRNOS,
    N_RUN_FDS,
    PRIVATE,
    SETUP_FAILED_EXIT,
    WORK_DIR,
    Record,
        RunSpec,
    recv_raw,
    unpack_spec,
    write_record,
)
from .program import ProgramRun, RunProgram
from .syscalls import (
    CLONE_NEWCGROUP,
    CLONE_NEWNET,
    MNT_DETACH,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    SetupError,
    check,
    libc,
    load_seccomp,
    loopback_up,
    mount,
    prctl,
    umount,
)

if TYPE_CHECKING:
    from .server import SpareKey, Zygote


class FilesError(Exception):
    """A file of the request could not be written, for a reason in FILE_ERRNOS."""


def prepare_child(z: Zygote, opts: SpareKey, net: int) -> None:
    """Isolate this fresh child before it knows what it will run; ``net``: the slot's network
    namespace to join (see Zygote.shared_net), or -1 for the fresh one it was cloned into."""
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
    check(libc.sethostname(b"sandbox", 7), "sethostname")
    if net < 0:
        loopback_up()
    else:
        check(libc.setns(net, CLONE_NEWNET), "setns(net)")
        os.close(net)
    if z.zygote_net >= 0:
        os.close(z.zygote_net)
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
    check(libc.unshare(CLONE_NEWCGROUP), "unshare(CLONE_NEWCGROUP)")
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
    """Receive the one request and lock down; return what runs the program (see RunProgram)."""
    while True:
        try:
            msg, fds = recv_raw(ctl)
            break
        except InterruptedError:
            continue
    if not msg.startswith(CHILD_RUN) or len(fds) != N_RUN_FDS:
        os._exit(SETUP_FAILED_EXIT)
    # In RunFd order (plain unpacking: no object per run in the child).
    stdin_fd, files_fd, spec_fd, out_fd, err_fd, chan_fd, status_fd = fds
    ctl.close()
    try:
        write_record(status_fd, Record.STARTED, b"")  # the request arrived (see jail.c sl_spawn)
    except OSError:
        os._exit(SETUP_FAILED_EXIT)
    try:
        enter_work_dir(z, opts, msg[len(CHILD_RUN):].decode())
        rlimits, spec = read_spec(spec_fd)
        os.close(spec_fd)
        for res, value in rlimits:
            resource.setrlimit(res, (value, value))
        drop_privileges(z)
        write_files(files_fd)  # as the slot user, inside the jail: no symlink can escape
        os.close(files_fd)
    except BaseException as e:
        setup_failed(status_fd, e)
    return (stdin_fd, spec, out_fd, err_fd, chan_fd, status_fd)


def setup_failed(status_fd: int, e: BaseException) -> NoReturn:
    """Report a setup failure (before any untrusted code ran) on the status pipe and exit."""
    try:
        if isinstance(e, FilesError):
            write_record(status_fd, Record.FILES_FAILED, str(e).encode()[:4000])
        else:
            write_record(status_fd, Record.SETUP_FAILED, f"{type(e).__name__}: {e}".encode()[:4000])
    except OSError:
        pass  # the supervisor reads the exit code (SETUP_FAILED_EXIT) without the record
    os._exit(SETUP_FAILED_EXIT)


def read_spec(spec_fd: int) -> tuple[list[tuple[int, int]], RunSpec]:
    """The run spec (protocol.pack_spec): rlimits in binary for jail.c, then marshalled."""
    spec = unpack_spec(_read_fd(spec_fd))
    if spec is None:
        raise SetupError("bad run spec")
    return spec


def child_after_c(child_fds: list[int]) -> NoReturn:
    """A child that jail.c locked down, with its request: read the spec (jail.c used only its
    rlimits), then unwind (RunProgram). Any failure ends the child, never the zygote's loop."""
    try:
        stdin_fd, _, spec_fd, out_fd, err_fd, chan_fd, status_fd = child_fds  # RunFd order
        try:
            _, spec = read_spec(spec_fd)
            os.close(spec_fd)
        except BaseException as e:
            setup_failed(status_fd, e)
        run: ProgramRun = (stdin_fd, spec, out_fd, err_fd, chan_fd, status_fd)
    except BaseException:
        os._exit(SETUP_FAILED_EXIT)
    raise RunProgram(run)


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


def write_files(files_fd: int) -> None:
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
            if e.errno is None or e.errno not in FILE_ERRNOS:
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


