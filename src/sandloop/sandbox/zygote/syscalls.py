"""The zygote's raw system calls (through libc with ctypes) and the kernel constants they take.

Standard library only: the zygote loads this under the runtime's interpreter (see BOOTSTRAP).
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import socket
import struct

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


# libc through the interpreter's own symbols: ctypes.util.find_library would import subprocess
# and with it threading, whose at-fork hook costs every child ~0.4 ms (see DEFAULT_PRELOAD).
libc = ctypes.CDLL(None, use_errno=True)
# PyDLL keeps the GIL across the call: clone() must return in the child holding it.
libc_gil = ctypes.PyDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                        ctypes.c_ulong]
libc.unshare.argtypes = [ctypes.c_int]
libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
libc_gil.syscall.restype = ctypes.c_long


class SetupError(Exception):
    """An isolation step failed; the child must not run the program."""



def check(ret: int, what: str) -> int:
    if ret < 0:
        e = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(e)} (errno {e})")
    return ret


def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    check(libc.mount(src.encode() if src else None, target.encode(),
                       fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {target}")


def umount(target: str, flags: int = 0) -> None:
    check(libc.umount2(target.encode(), flags), f"umount {target}")


def prctl(option: int, arg2: int = 0, arg3: int = 0) -> None:
    check(libc.prctl(option, arg2, arg3, 0, 0), f"prctl({option})")


def pivot_root(new_root: str, put_old: str) -> None:
    nr = SYS_PIVOT_ROOT[platform.machine()]
    check(libc.syscall(nr, new_root.encode(), put_old.encode()), "pivot_root")


def clone_fork(flags: int) -> int:
    """fork() into new namespaces: a raw clone with fork semantics plus CPython's fork hooks.

    ``os.fork`` cannot pass namespace flags, and ``unshare(CLONE_NEWPID)`` can only be done once
    per process, so the zygote clones directly; the hooks keep the interpreter consistent exactly
    as ``os.fork`` does (the zygote is single-threaded).
    """
    nr = SYS_CLONE[platform.machine()]
    ctypes.pythonapi.PyOS_BeforeFork()
    pid = libc_gil.syscall(nr, ctypes.c_ulong(flags | signal.SIGCHLD), None, None, None, None)
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
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0),
           "seccomp")


# What a run can observe of a network namespace it shares with the slot's other runs (see
# jail.c shared_net): the sockets in use per protocol and the traffic counters.
NET_FILES = ("protocols", "dev", "snmp", "snmp6", "netstat", "ip6_flowlabel", "ipv6_route",
             "rt6_stats")


def open_net_files(proc_dir: str) -> list[int]:
    """The NET_FILES of the current network namespace, open (-1: absent, as snmp6 without
    IPv6): they keep showing this namespace wherever the zygote goes."""
    fds: list[int] = []
    for name in NET_FILES:
        try:
            fds.append(os.open(f"{proc_dir}/self/net/{name}", os.O_RDONLY | os.O_CLOEXEC))
        except FileNotFoundError:
            fds.append(-1)
    return fds


def net_snapshot(files: list[int]) -> bytes:
    """The observable state of a network namespace (as jail.c net_snapshot) from its NET_FILES
    (open_net_files), of protocols only the columns that belong to the namespace (name, size,
    sockets: its "memory" column is the host's)."""
    parts: list[bytes] = []
    for i, fd in enumerate(files):
        if fd < 0:
            continue
        os.lseek(fd, 0, os.SEEK_SET)  # a seq file: generated again from the start
        chunks = []
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
        data = b"".join(chunks)
        if i == 0:
            data = b"".join(b" ".join(line.split()[:3]) + b"\n" for line in data.splitlines())
        parts.append(data + b"\0")  # NUL ends each file (never in them), as in jail.c
    return b"".join(parts)


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

