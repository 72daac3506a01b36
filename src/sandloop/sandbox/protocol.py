"""The zygote protocol: every constant, record kind, message and descriptor order that the
supervisor (``slot.py``), the zygote (``zygote/``) and the C helper (``jail.c``) share.

One place, so that the three cannot drift: ``tests/sandbox/test_protocol.py`` parses jail.c's
``#define``s and its ``file_errno`` and compares them with the values here, and the Python sides
import them from here.

The zygote loads this file too (through ``zygote.BOOTSTRAP``, under the runtime's interpreter,
which may be any CPython >= 3.9 running with ``-I``): standard library only, no 3.10+ syntax at
run time, nothing that names the host.

Channels and what travels on them:

- supervisor <-> zygote: a SOCK_SEQPACKET socket, one message per packet, descriptors with
  SCM_RIGHTS. A run request is binary (``encode_run``: jail.c's loop reads it); the other
  requests are JSON objects with an ``op`` (``MkworkRequest``, ``RmworkRequest``,
  ``PingRequest``). Replies are JSON (``Reply``), a run's with the child's mount namespace fd.
  A run request carries ``N_RUN_FDS`` descriptors in ``RunFd`` order, then ``ncg``
  ``cgroup.procs`` files of the run's groups.
- zygote -> prepared child: a socketpair. The child sends ``CTL_READY`` once isolated (or
  ``CTL_FAILED`` + why); the zygote sends ``CHILD_RUN`` + the session work dir to bind (or
  nothing) with the ``N_RUN_FDS`` descriptors.
- child/zygote -> supervisor: the status pipe (``RunFd.STATUS``), records of one ``Record``
  kind byte, a u32 little-endian length and the payload (``write_record``).
- The spec memfd (``RunFd.SPEC``): ``SPEC_MAGIC``, u32 n, n x (i32 resource, u64 limit) for
  jail.c, then the ``RunSpec``, marshalled (``marshal``: parsing JSON cost each child ~25
  copy-on-write faults).
"""

from __future__ import annotations

import array
import enum
import errno
import json
import marshal
import os
import socket
import struct
from typing import Any, Literal, NamedTuple, TypedDict

# -- paths inside the sandbox root (jail.c: WORK_DIR; languages.py re-exports them) -------------
WORK_DIR = "/sandbox"  # the run's work dir, its cwd
TOOLS_DIR = "/.sandloop/bin"  # `python`/`python3` -> the pool's interpreter (zygote builds it)
PRIVATE = "/.zygote"  # the zygote's own area in the root: session work dirs, a host-pid /proc

# -- numbers jail.c shares (tests/sandbox/test_protocol.py compares them) ---------------------
SETUP_FAILED_EXIT = 125  # exit code of a child whose isolation setup failed
SL_MAX_RUNNING = 16  # runs the C loop can track at once (more: the Python loop serves)
SL_MAX_FDS = 16  # descriptors the C loop receives with one message
SL_NET_SNAP = 32768  # room for a network namespace's observable state (jail.c net_snapshot)
SL_NET_FILES = 8  # the files it is read from (zygote.syscalls.NET_FILES)
N_RUN_FDS = 7  # descriptors of a run request before its cgroup.procs files
SPEC_MAGIC = b"SLS1"
RUN_MAGIC = b"RUN1"
RUN_HEAD = struct.Struct("<qqi")  # after RUN_MAGIC: i64 work dir MiB, i64 inodes, i32 cgroups
RUN_HEAD_SIZE = len(RUN_MAGIC) + RUN_HEAD.size  # jail.c: RUN_HEAD
CHILD_RUN = b"run"  # zygote -> child: the request (+ the session work dir, or nothing)
CTL_READY = b"R"  # child -> zygote: isolated, waiting for its request
CTL_FAILED = b"E"  # child -> zygote: its setup failed (+ why)


class RunFd(enum.IntEnum):
    """Where each descriptor of a run request sits (the supervisor keeps the read ends)."""

    STDIN = 0  # sealed memfd
    FILES = 1  # sealed memfd: the files to write (safefs.pack_files)
    SPEC = 2  # sealed memfd: rlimits + RunSpec
    STDOUT = 3  # pipe, write end
    STDERR = 4  # pipe, write end
    CHANNEL = 5  # pipe, write end: fd 3 of the program (the reward harness's results)
    STATUS = 6  # pipe, write end: Record stream


class RunFds(NamedTuple):
    """A run request's descriptors, by name (``RunFds(*fds)``; order: ``RunFd``)."""

    stdin: int
    files: int
    spec: int
    stdout: int
    stderr: int
    channel: int
    status: int


class Record(bytes, enum.Enum):
    """Kinds of status records (the first byte of each)."""

    STARTED = b"S"  # child: the request reached it (a child lost before this is not the run's)
    SETUP_FAILED = b"E"  # child: an isolation step failed, before any untrusted code
    FILES_FAILED = b"W"  # child: the run's files could not be written (FILE_ERRNOS): a verdict
    EXIT = b"X"  # zygote: the child's wait status and rusage (ExitRecord)
    PROGRAM = b"P"  # trusted pid 1: the program's wait status and rusage (ExitRecord)
    FILE = b"F"  # trusted pid 1: a collected file (u16 name length, name, bytes)
    COLLECTED = b"C"  # trusted pid 1: collection complete (JSON list of the absent names)


class ExitRecord(TypedDict):
    """Payload of ``Record.EXIT`` and ``Record.PROGRAM``."""

    status: int
    utime: float
    stime: float
    maxrss_kb: int


Op = Literal["run", "mkwork", "rmwork", "ping"]


class RunRequest(TypedDict):
    """A decoded run request (travels binary: ``encode_run``/``decode_msg``)."""

    op: Literal["run"]
    work: str  # a session's work dir id, or "" for a fresh one
    workdir_mb: int
    workdir_inodes: int
    ncg: int  # cgroup.procs descriptors after the N_RUN_FDS run descriptors


class MkworkRequest(TypedDict):
    op: Literal["mkwork"]
    work: str
    workdir_mb: int
    workdir_inodes: int


class RmworkRequest(TypedDict):
    op: Literal["rmwork"]
    work: str


class PingRequest(TypedDict):
    op: Literal["ping"]


class Reply(TypedDict, total=False):
    """The zygote's answer to any request (and its hello once set up)."""

    ok: bool
    pid: int  # run: the child's host pid; ping and hello: the zygote's
    error: str
    fast_runs: int  # ping: runs jail.c's loop served


ExecMode = Literal["exec", "python"]


class ExecSpec(TypedDict, total=False):
    mode: ExecMode
    argv: list[str]
    path: str  # mode "python": the file to run


class RunSpec(TypedDict, total=False):
    """The marshalled part of the spec memfd, read by the child only."""

    env: dict[str, str]
    exec: ExecSpec
    collect: list[str]  # files the trusted pid 1 reads back after the program
    collect_max: int


class ZygoteConfig(TypedDict, total=False):
    """What the supervisor writes on the zygote's stdin (never on its command line).

    With an environment (``exec`` set), the zygote starts on the supervisor's interpreter only
    to build and enter its root, where the environment's tree is bound (``mounts``), and then
    re-executes itself as ``exec`` (the environment's interpreter, at its path inside the root)
    with the complete environment ``exec_env`` (``PYTHONHASHSEED`` included): nothing of the
    host's interpreter is left in it. The zygote's own code travels along (``modules``, read
    before the pivot), since its files are not in the root. See docs/environments.md.
    """

    python: str  # what `python`/`python3` in TOOLS_DIR point to, inside the root
    cgroups: list[str]
    base: str
    uid: int
    gid: int
    bpf: str  # hex
    binds: list[str]
    symlinks: dict[str, str]
    preload: list[str]
    # [module name, source, source hash, cache tag, code]: warm.py's modules, their code
    # compiled by the supervisor (marshal, hex), for an interpreter of that cache tag
    warm: list[list[str]]
    jail: str | None  # the C helper's path, or None: the Python steps
    mounts: list[list[str]]  # [host directory, path inside the root]: environment trees
    exec: str | None  # the environment's interpreter inside the root (None: stay on this one)
    exec_env: dict[str, str]  # its whole environment
    bootstrap: str  # zygote.BOOTSTRAP, which the re-executed interpreter runs
    modules: list[list[str]]  # the zygote modules and their files (zygote.MODULES)
    # Set by the zygote for its re-executed self (never by the supervisor):
    stage: int  # 2: the root is built and entered; only the lock-down is left
    tmp_binds: list[list[str]]  # (kept copy, path under /tmp): Zygote.tmp_binds
    jail_fd: int  # the C helper, copied into a memfd (its host path is gone)


# Supervisor-side vocabularies (slot.py, outcome.py, models.ExecResult).
KilledFor = Literal["wall", "cpu", "output", "cancelled"]  # why the supervisor killed a run
Isolation = Literal["full", "none", "unavailable"]  # ExecResult.isolation

# Why writing the run's files fails when the request or an earlier program of the session is
# to blame: too big for the work dir (ENOSPC, EFBIG, EDQUOT, ENOMEM: the run's memory limit
# charges tmpfs pages), or the path made unusable (a file where a directory goes, a directory,
# symlink or read-only directory where a file goes). Requests are validated first
# (models.check_file_names), so on a fresh work dir only the sizes are left. jail.c: file_errno.
FILE_ERRNO_NAMES = (
    "ENOSPC", "EFBIG", "EDQUOT", "ENOMEM", "ENOTDIR", "EISDIR", "EEXIST", "EACCES", "EPERM",
    "ELOOP", "EROFS", "ENAMETOOLONG", "EMLINK", "ETXTBSY",
)
FILE_ERRNOS: frozenset[int] = frozenset(getattr(errno, name) for name in FILE_ERRNO_NAMES)


# -- framing ------------------------------------------------------------------------------------


def encode_run(work: str, workdir_mb: int, workdir_inodes: int, ncg: int) -> bytes:
    """A run request, binary so that jail.c's loop can read it."""
    return RUN_MAGIC + RUN_HEAD.pack(workdir_mb, workdir_inodes, ncg) + work.encode()


def decode_msg(data: bytes) -> dict[str, Any] | None:
    """A supervisor message as a dict (None: the supervisor hung up)."""
    if not data:
        return None
    if data[:4] == RUN_MAGIC:
        mb, inodes, ncg = RUN_HEAD.unpack_from(data, 4)
        return {"op": "run", "work": data[RUN_HEAD_SIZE:].decode(), "workdir_mb": mb,
                "workdir_inodes": inodes, "ncg": ncg}
    msg: dict[str, Any] = json.loads(data)
    return msg


def pack_spec(rlimits: tuple[tuple[int, int], ...], spec: RunSpec) -> bytes:
    """The spec memfd's content (read by ``read_spec``, and by jail.c for the rlimits)."""
    head = SPEC_MAGIC + struct.pack("<I", len(rlimits))
    return head + b"".join(struct.pack("<iQ", r, v) for r, v in rlimits) + marshal.dumps(dict(spec))


def unpack_spec(data: bytes) -> tuple[list[tuple[int, int]], RunSpec] | None:
    """``pack_spec`` reversed; None if the magic is wrong."""
    if data[:4] != SPEC_MAGIC:
        return None
    (n,) = struct.unpack_from("<I", data, 4)
    rlimits = [struct.unpack_from("<iQ", data, 8 + 12 * i) for i in range(n)]
    spec: RunSpec = marshal.loads(data[8 + 12 * n:])
    return rlimits, spec


def write_record(fd: int, kind: bytes, payload: bytes) -> None:
    """One status record: the kind byte, u32 little-endian length, the payload."""
    data = memoryview(kind + struct.pack("<I", len(payload)) + payload)
    while data:
        n = os.write(fd, data)
        data = data[n:]


def iter_records(buf: bytes) -> list[tuple[bytes, bytes]]:
    """The complete records in ``buf`` as (kind, payload); a truncated tail is dropped."""
    out = []
    pos = 0
    while pos + 5 <= len(buf):
        kind = buf[pos:pos + 1]
        (n,) = struct.unpack_from("<I", buf, pos + 1)
        out.append((kind, buf[pos + 5:pos + 5 + n]))
        pos += 5 + n
    return out


def recv_raw(sock: socket.socket, size: int = 4096) -> tuple[bytes, list[int]]:
    """One packet and the descriptors that came with it (at most SL_MAX_FDS)."""
    fds = array.array("i")
    data, anc, _flags, _addr = sock.recvmsg(size, socket.CMSG_SPACE(SL_MAX_FDS * fds.itemsize))
    for level, typ, cdata in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            fds.frombytes(cdata[: len(cdata) - (len(cdata) % fds.itemsize)])
    return data, list(fds)


def recv_msg(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    data, fds = recv_raw(sock, 1 << 16)
    return decode_msg(data), fds
