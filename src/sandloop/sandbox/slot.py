"""The supervisor side of one slot: a warm zygote, and the outside enforcement of every run.

The program's own process tree cannot be trusted to report anything, so everything that decides
a status is observed from here: the wall deadline, the output byte counts, CPU time and peak
memory from the run's cgroup, OOM kills from the cgroup's counters, and the exit status from the
zygote (the child's real parent).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandloop.envs import Environment
from sandloop.errors import SandboxError
from sandloop.sandbox import protocol
from sandloop.sandbox import zygote as zygote_module
from sandloop.sandbox.cgroups import (
    Cgroup,
    CgroupBackend,
    CgroupError,
    CgroupLimits,
    CgroupStats,
    SharedRunDirs,
)
from sandloop.sandbox.host import host_rlimit
from sandloop.sandbox.languages import Step, sandbox_env
from sandloop.sandbox.runenv import zygote_config
from sandloop.sandbox.safefs import sealed_memfd

logger = logging.getLogger(__name__)

CHANNEL_MAX_BYTES = 16 << 20
STATUS_MAX_BYTES = 256 << 20  # status records, including collected files
NS_CLOSE_BATCH = 16  # finished runs' mount namespaces released together ...
NS_HOLD_MAX_S = 0.05  # ... or this soon after the first of them ended, whichever comes first
READ_CHUNK = 1 << 16


class SlotBroken(SandboxError, RuntimeError):
    """The slot's zygote died or misbehaved; the pool replaces the slot."""


class CowUnavailable(OSError):
    """The zygote cannot mount a copy-on-write work dir here (no overlayfs, or it refuses
    the file system): the pool copies files into plain work dirs instead."""


# Modules imported once by each slot's zygote, so that runs start with them warm. Every module
# here makes every run's fork and exit dearer (page tables, copy-on-write faults: ~0.25 ms per
# MiB of zygote memory here), so the default holds what model-written solutions import often
# and costs little. unittest (+2.6 MiB), dataclasses (+1.3 MiB, via inspect), statistics and
# hashlib (+4 MiB of libcrypto) are left out: add them for suites that import them in most runs.
# threading (and queue, which imports it) too: its at-fork hook alone costs every child ~0.4 ms.
DEFAULT_PRELOAD: tuple[str, ...] = (
    "collections", "itertools", "functools", "math", "re", "heapq", "bisect", "string",
    "random", "typing", "fractions", "decimal", "datetime", "copy", "operator", "io",
    "traceback", "atexit", "textwrap", "enum", "array", "cmath", "numbers",
)


def preload_with(extra: Sequence[str]) -> tuple[str, ...] | None:
    """``DEFAULT_PRELOAD`` plus ``extra`` (None, meaning the default, when there is none)."""
    return (*DEFAULT_PRELOAD, *extra) if extra else None


@dataclass(frozen=True)
class SlotConfig:
    """What every slot of a pool shares."""

    python: str
    base_dir: Path
    binds: tuple[str, ...]
    symlinks: dict[str, str]
    bpf: bytes
    cgroups: CgroupBackend
    pool_id: str
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    # What each zygote loads (warm.py): protocol.ZygoteConfig's ``warm`` entries.
    warm: tuple[tuple[str, str, str, str, str], ...] = ()
    jail: str | None = None  # the compiled C isolation steps (jailbuild), or None: Python's
    # The environment the zygotes mount and re-execute on (runenv.zygote_config); None: they
    # stay on ``python``, bound at its host path (as before environments).
    environment: Environment | None = None


@dataclass
class StepLimits:
    """The limits of one sandboxed process (a compile step or a run step)."""

    wall_s: float
    cpu_s: float
    memory_bytes: int
    max_pids: int
    cpus: float
    cpu_weight: int
    stdout_bytes: int
    stderr_bytes: int
    kill_output_bytes: int
    workdir_mb: int
    workdir_inodes: int
    open_files: int


@dataclass
class StepOutcome:
    """Raw observations of one step, before they are turned into an ExecResult."""

    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    channel: bytes = b""
    wall_s: float = 0.0
    wait_status: int | None = None
    setup_error: str | None = None
    # The run's files could not be written ("W"): the request's or an earlier program's doing.
    files_error: str | None = None
    killed_for: protocol.KilledFor | None = None
    stats: CgroupStats | None = None
    rusage: dict[str, float] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    infra_error: str | None = None
    started: bool = False  # the child reported that the request reached it ("S")
    collect_expected: bool = False  # files were to be collected: a "C" record must end them
    collect_done: bool = False  # the trusted pid 1 finished collecting ("C")
    missing_files: list[str] = field(default_factory=list)  # collected names that were absent

    @property
    def lost_before_start(self) -> bool:
        """The prepared child died before the request reached it (killed while idle): the run
        never started, so its "exit" is not the program's. Not when the supervisor killed it
        itself: a wall limit that ran out before the program started (``time_s=1e-4``) is that
        request's timeout, not a lost child to retry and then report as a sandbox_error."""
        return (self.wait_status is not None and not self.started and self.setup_error is None
                and self.files_error is None and self.killed_for is None)


class _Capture:
    """Non-blocking reader of one pipe, keeping at most ``cap`` bytes and counting the rest."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd = fd
        self.cap = cap
        self.buf = bytearray()
        self.total = 0
        self.eof = asyncio.get_running_loop().create_future()

    def on_readable(self, on_bytes: Any) -> None:
        try:
            while True:
                chunk = os.read(self.fd, READ_CHUNK)
                if not chunk:
                    self._finish()
                    return
                self.total += len(chunk)
                room = self.cap - len(self.buf)
                if room > 0:
                    self.buf += chunk[:room]
                on_bytes(len(chunk))
                if len(chunk) < READ_CHUNK:
                    return
        except BlockingIOError:
            return
        except OSError:
            self._finish()

    def _finish(self) -> None:
        # At EOF the fd stays readable forever: stop watching it.
        asyncio.get_running_loop().remove_reader(self.fd)
        if not self.eof.done():
            self.eof.set_result(None)

    @property
    def truncated(self) -> bool:
        return self.total > len(self.buf)


_RUN_SEQ = itertools.count(1)  # run group names: unique in the process, whatever the slot


class NsReleaser:
    """Drops finished runs' mount namespaces (the zygote hands each to the supervisor).

    Dropping the last reference unmounts the run's tree (its tmpfs, with what the run wrote, is
    freed then), which waits for an RCU grace period: it happens in a worker thread, a batch at
    a time (a thread hand-off per run costs more than the close), and soon, so that an idle
    pool keeps no finished run's files in memory. One per pool: its slots' runs share batches.
    """

    def __init__(self) -> None:
        self._fds: list[int] = []
        self._timer: asyncio.TimerHandle | None = None

    def hold(self, fds: list[int]) -> None:
        self._fds.extend(fds)
        if len(self._fds) >= NS_CLOSE_BATCH:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(NS_HOLD_MAX_S, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._fds:
            batch, self._fds = self._fds, []
            asyncio.get_running_loop().run_in_executor(None, _close_fds, batch)

    def close(self) -> None:
        """Drop everything held now, in this thread."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        _close_fds(self._fds)
        self._fds = []


class Slot:
    """One warm zygote with its own unprivileged uid/gid; runs one step at a time."""

    _ids = itertools.count(1)

    def __init__(self, index: int, uid: int, gid: int, config: SlotConfig,
                 releaser: NsReleaser | None = None) -> None:
        self.index = index
        self.uid = uid
        self.gid = gid
        self.config = config
        self.name = f"{config.pool_id}-s{index}"
        self.base = config.base_dir / self.name
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.runs = 0
        self.broken = False
        self.cg: Cgroup | None = None  # the zygote's; each run gets its own (execute)
        self._stuck: list[Cgroup] = []  # run groups the kernel would not let go (see close)
        # The next run's group, made while this run is going (a free core does it meanwhile).
        self._ready_cg: tuple[Cgroup, CgroupLimits] | None = None
        # cgroup v1's pids/cpu/cpuacct directories, which the runs take turns in (cgroups.py).
        self._shared: SharedRunDirs | None = None
        self._retired: list[SharedRunDirs] = []  # replaced ones that would not go (see close)
        # Shared by the pool's slots (one hand-off per batch of any slots' runs), else our own.
        self._own_releaser = releaser is None
        self._releaser = releaser if releaser is not None else NsReleaser()
        self.workspaces: set[str] = set()  # persistent work dirs living in this zygote
        self.generation = 0  # bumped at every (re)start: workspaces do not survive one
        self.idle_since = time.monotonic()

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        self.base.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.cg is None:
            self.cg = self.config.cgroups.create(self.name)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cfg = {
            "python": self.config.python,
            "cgroups": self.cg.procs_files,
            "base": str(self.base),
            "uid": self.uid,
            "gid": self.gid,
            "bpf": self.config.bpf.hex(),
            "binds": list(self.config.binds),
            "symlinks": self.config.symlinks,
            "preload": list(self.config.preload),
            "warm": [list(w) for w in self.config.warm],
            "jail": self.config.jail,
        }
        if self.config.environment is not None:
            cfg.update(zygote_config(self.config.environment))
        try:
            self.proc = subprocess.Popen(
                [self.config.python, "-I", "-c", zygote_module.BOOTSTRAP, str(child.fileno()),
                 zygote_module.PACKAGE_DIR],
                pass_fds=[child.fileno()],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                # A Python run's usual environment: its child then changes nothing in it.
                # LD_BIND_NOW (dropped again by the zygote) resolves the interpreter's symbols
                # once here, not lazily in every child, each writing its own copy of the GOT.
                env={**sandbox_env("python"), "LD_BIND_NOW": "1"},
                close_fds=True,
            )
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(cfg).encode())
            self.proc.stdin.close()
        finally:
            child.close()
        parent.setblocking(False)
        self.sock = parent
        self.generation += 1
        self.workspaces.clear()
        hello = await self._recv(timeout=30.0)
        if not hello.get("ok"):
            await self.close()
            raise SlotBroken(str(hello.get("error", "zygote failed to start")))
        self.broken = False

    async def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await asyncio.get_running_loop().run_in_executor(None, self.proc.wait)
            self.proc = None
        if self._own_releaser:
            self._releaser.close()
        if self._ready_cg is not None:
            self._stuck.append(self._ready_cg[0])
            self._ready_cg = None
        for cg in self._stuck:
            try:
                cg.remove()
            except CgroupError as e:
                logger.debug("slot %s: stuck cgroup %s not removed: %s", self.index, cg.name, e)
        self._stuck = []
        for shared in [*self._retired, self._shared]:
            if shared is not None:
                try:
                    shared.close()
                except CgroupError as e:
                    logger.debug("slot %s: shared run groups not removed: %s", self.index, e)
        self._shared, self._retired = None, []
        if self.cg is not None:
            try:
                self.cg.remove()
            except CgroupError as e:
                logger.debug("slot %s: its cgroup not removed: %s", self.index, e)
            self.cg = None
        try:
            self.base.rmdir()
        except OSError as e:
            logger.debug("slot %s: %s not removed: %s", self.index, self.base, e)

    @property
    def zygote_pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def zygote_rss_mb(self) -> float:
        """The zygote's resident memory (it should not grow: it never runs programs)."""
        try:
            with open(f"/proc/{self.zygote_pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except (OSError, AssertionError) as e:
            logger.debug("slot %s: zygote memory unknown: %r", self.index, e)
        return 0.0

    @property
    def works_root(self) -> str:
        """Where the slot's persistent (session) work dirs are, seen from the host."""
        return f"/proc/{self.zygote_pid}/root{protocol.PRIVATE}/work"

    def new_work_id(self) -> str:
        """A name for a persistent work dir (sessions); it lives until ``remove_work``."""
        return f"w{next(self._ids)}"

    # -- messaging ------------------------------------------------------------------------------
    async def _recv(self, timeout: float) -> dict[str, Any]:
        assert self.sock is not None
        loop = asyncio.get_running_loop()
        sock = self.sock
        # Kept as a number: once the socket is closed its fileno() is -1. The reader must go on
        # every exit, cancellation included: a closed fd leaves epoll silently, and the restarted
        # zygote's socket, given the same number, would then be "registered" in asyncio's map
        # but never in epoll, so its replies would go unseen (a 30 s stall per restart).
        fd = sock.fileno()
        fut: asyncio.Future[tuple[bytes, list[int]]] = loop.create_future()

        def readable() -> None:
            try:
                data, fds = _recv_with_fds(sock)
            except BlockingIOError:
                return
            except OSError as e:
                loop.remove_reader(fd)
                if not fut.done():
                    fut.set_exception(e)
                return
            loop.remove_reader(fd)
            if not fut.done():
                fut.set_result((data, fds))

        loop.add_reader(fd, readable)
        try:
            if not await _settled(fut, timeout):
                raise TimeoutError(f"no reply within {timeout} s")
            data, fds = fut.result()
        except (TimeoutError, OSError) as e:
            self.broken = True
            raise SlotBroken(f"zygote of slot {self.index} did not answer: {e!r}") from e
        finally:
            loop.remove_reader(fd)
        if not data:
            self.broken = True
            raise SlotBroken(f"zygote of slot {self.index} exited")
        reply: dict[str, Any] = json.loads(data)
        if fds:
            reply["_fds"] = fds
        return reply

    async def _request(self, msg: dict[str, Any] | bytes, fds: list[int] = (), timeout: float = 10.0) -> dict[str, Any]:  # type: ignore[assignment]
        if self.sock is None or self.broken:
            raise SlotBroken(f"slot {self.index} is not running")
        try:
            return await self._exchange(msg, fds, timeout)
        except asyncio.CancelledError:
            # The zygote's reply would arrive for the next request, and a child it may have
            # started is not watched: end both now; the pool restarts the slot.
            self.abandon()
            raise

    def abandon(self) -> None:
        """Kill the zygote (its children die with it) and mark the slot for a restart."""
        self.broken = True
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def _exchange(self, msg: dict[str, Any] | bytes, fds: list[int] | tuple[int, ...],
                        timeout: float) -> dict[str, Any]:
        assert self.sock is not None
        payload = msg if isinstance(msg, bytes) else json.dumps(msg).encode()
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            self.sock.sendmsg([payload], anc)
        except OSError as e:
            self.broken = True
            raise SlotBroken(f"cannot reach zygote of slot {self.index}: {e}") from e
        return await self._recv(timeout)

    async def make_work(self, work: str, size_mb: int, inodes: int,
                        lower: str | None = None) -> None:
        """Create a persistent work dir (a tmpfs in the zygote's private area; no process);
        with ``lower``, a copy-on-write overlay on that work dir (``CowUnavailable`` where
        the kernel cannot)."""
        msg: dict[str, Any] = {"op": "mkwork", "work": work, "workdir_mb": size_mb,
                               "workdir_inodes": inodes}
        if lower is not None:
            msg["lower"] = lower
        reply = await self._request(msg)
        if reply.get("cow_unavailable"):
            raise CowUnavailable(f"no copy-on-write work dir: {reply.get('error')}")
        if not reply.get("ok"):
            raise OSError(f"cannot create the work dir: {reply.get('error')}")

    async def remove_work(self, work: str) -> None:
        reply = await self._request({"op": "rmwork", "work": work})
        if not reply.get("ok"):
            self.broken = True
            raise SlotBroken(f"cannot remove work dir: {reply.get('error')}")

    # -- one step -------------------------------------------------------------------------------
    async def execute(
        self,
        step: Step,
        limits: StepLimits,
        *,
        stdin: bytes,
        files: bytes,
        env: dict[str, str],
        work: str | None = None,
        collect: tuple[str, ...] = (),
        collect_max: int = 1 << 20,
        on_end: Callable[[], None] | None = None,
    ) -> StepOutcome:
        """Run one step in a fresh child and observe it until every process of it is gone.

        ``work`` names a persistent work dir (sessions); by default the child gets a fresh
        tmpfs that dies with it. ``collect`` names work-dir files to bring back. ``on_end`` is
        called once the step's processes are gone (or it could not start), before the
        measurements are read and its cgroup removed: the CPU is free from then on.
        """
        if collect:
            # The trusted collector stays as the run's pid 1 and forks the program: one process
            # of the run's group that is not the program's. Without it max_processes=1 left the
            # collector unable to fork, a sandbox_error any request could cause.
            limits = dataclasses.replace(limits, max_pids=limits.max_pids + 1)
        for _ in range(2):
            self.runs += 1
            out = StepOutcome()
            try:
                cg = self._run_group(_cgroup_limits(limits))
            except (CgroupError, OSError) as e:
                self.broken = True
                out.infra_error = f"cannot make the run's cgroup: {e}"
                return out
            try:
                await self._execute(cg, step, limits, stdin, files, env, work, collect,
                                    collect_max, out, on_end)
            finally:
                await self._remove_run_group(cg, out)
            if not out.lost_before_start:
                break
            # Once more, with the fresh child the zygote makes (and a fresh memory group, the
            # shared ones ready again: nothing of the first carries).
        return out

    def _run_group(self, want: CgroupLimits) -> Cgroup:
        """An empty group with these limits for the run about to start: the one made ahead
        (its limits changed if need be: it is still empty), else a new one; completed with the
        slot's shared directories where the backend has them."""
        ready, self._ready_cg = self._ready_cg, None
        cg: Cgroup | None = None
        if ready is not None:
            cg, was = ready
            try:
                if was != want:
                    cg.limit(want, was)
            except (CgroupError, OSError):
                try:
                    cg.remove()  # empty, never used
                except CgroupError as e:
                    logger.debug("slot %s: unused run group not removed: %s", self.index, e)
                cg = None
        if cg is None:
            cg = self._new_group(want)
        try:
            self._attach_shared(cg, want)
        except BaseException:
            cg.try_remove()
            raise
        return cg

    def _new_group(self, want: CgroupLimits) -> Cgroup:
        if self._shared is None:
            self._shared = self.config.cgroups.shared_run_dirs(f"{self.name}k")
        leave_out = tuple(self._shared.dirs) if self._shared is not None else ()
        cg = self.config.cgroups.create(f"{self.name}r{next(_RUN_SEQ)}", run=True,
                                        leave_out=leave_out)
        try:
            cg.limit(want)
            cg.procs_fds()
        except BaseException:
            cg.try_remove()
            raise
        return cg

    def _attach_shared(self, cg: Cgroup, want: CgroupLimits) -> None:
        if self._shared is None:  # a backend without shared directories (v2)
            return
        try:
            cg.attach(self._shared, want)
        except (CgroupError, OSError):
            # Never expected (see SharedRunDirs.begin); the run gets new directories, and
            # the old ones are removed when the slot closes.
            self._retired.append(self._shared)
            self._shared = self.config.cgroups.shared_run_dirs(f"{self.name}k{next(_RUN_SEQ)}")
            assert self._shared is not None
            cg.attach(self._shared, want)

    def _make_ready_group(self, want: CgroupLimits) -> None:
        if self._ready_cg is None:
            # A failure here shows again, and is reported, when the next run makes its own.
            try:
                self._ready_cg = (self._new_group(want), want)
            except (CgroupError, OSError) as e:
                logger.debug("slot %s: next run's group not made ahead: %s", self.index, e)

    async def _execute(self, cg: Cgroup, step: Step, limits: StepLimits, stdin: bytes,
                       files: bytes, env: dict[str, str], work: str | None,
                       collect: tuple[str, ...], collect_max: int, out: StepOutcome,
                       on_end: Callable[[], None] | None) -> None:
        rlimits = tuple((r, host_rlimit(r, v)) for r, v in (
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_NOFILE, limits.open_files),
            (resource.RLIMIT_FSIZE, limits.workdir_mb << 20),
            # A per-process backstop; the cgroup total is enforced from here.
            (resource.RLIMIT_CPU, math.ceil(limits.cpu_s) + 1),
            (resource.RLIMIT_STACK, min(limits.memory_bytes, 256 << 20)),
        ))
        spec: protocol.RunSpec = {"env": env, "exec": step.to_wire(), "collect": list(collect),
                                  "collect_max": collect_max}
        out.collect_expected = bool(collect)
        fds = self._make_fds(stdin, files, _pack_spec(rlimits, spec))
        try:
            await self._run_child(limits, work, cg, fds, out)
        finally:
            for fd in fds:
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        if on_end is not None and not out.lost_before_start:  # else it runs again (execute)
            on_end()
            # Let a job that on_end started reach its slot first: this run's measurements,
            # cgroup removal and result can wait, a core meanwhile idle cannot.
            await asyncio.sleep(0)
        try:
            out.stats = cg.stats(failcnt=out.wait_status != 0)
        except OSError as e:
            out.infra_error = f"cannot read cgroup statistics: {e}"

    async def _remove_run_group(self, cg: Cgroup, out: StepOutcome) -> None:
        """Remove the run's group before its result is returned: no cgroup outlives its run.

        The kernel killed every process of the run's pid namespace when its init died, and
        only the run's processes were ever in this group; a survivor would be a kernel bug or
        a broken assumption, so look, and kill if found.
        """
        for attempt in range(200):
            if cg.try_remove():
                return
            cg.kill_all(timeout_s=0.0)  # normally the kernel is only a moment late: no-op
            await asyncio.sleep(0.001 if attempt < 20 else 0.01)
        self.broken = True
        self._stuck.append(cg)  # retried when the slot closes
        out.infra_error = (f"the run's cgroup {cg.name} could not be removed"
                           f" (processes {cg.pids(all_controllers=True)} left)")

    def _make_fds(self, stdin: bytes, files: bytes, spec: bytes) -> list[int]:
        # Order matters: the zygote and the child take them in protocol.RunFd order
        # [stdin, files, spec, stdout(w), stderr(w), channel(w), status(w)]; we keep read ends.
        # Everything run-specific travels in memfds that only the child reads, never the zygote.
        fds = [sealed_memfd("stdin", stdin), sealed_memfd("files", files),
               sealed_memfd("spec", spec)]
        for _ in range(4):
            r, w = os.pipe2(os.O_CLOEXEC)
            fds.append(w)
            fds.append(r)
        # fds = [stdin, files, spec, out_w, out_r, err_w, err_r, chan_w, chan_r, st_w, st_r]
        return fds

    async def _run_child(
        self,
        limits: StepLimits,
        work: str | None,
        cg: Cgroup,
        fds: list[int],
        out: StepOutcome,
    ) -> None:
        loop = asyncio.get_running_loop()
        stdin_fd, files_fd, spec_fd, out_w, out_r, err_w, err_r, chan_w, chan_r, st_w, st_r = fds
        captures = {
            "out": _Capture(out_r, limits.stdout_bytes),
            "err": _Capture(err_r, limits.stderr_bytes),
            "chan": _Capture(chan_r, CHANNEL_MAX_BYTES),
        }
        status = _Capture(st_r, STATUS_MAX_BYTES)
        pid: int | None = None
        pidfd: int | None = None
        total_out = 0

        def kill(reason: protocol.KilledFor) -> None:
            if out.killed_for is None:
                out.killed_for = reason
            if pidfd is not None:
                try:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass  # already gone
                except OSError as e:
                    logger.debug("kill of run pid %s failed (the cgroup sweep follows): %s",
                                 pid, e)
            # The pid namespace dies with its init; the cgroup sweep is the backstop.
            cg.kill_all(timeout_s=0.0)

        def on_out(n: int) -> None:
            nonlocal total_out
            total_out += n
            if total_out > limits.kill_output_bytes:
                kill("output")

        start = time.monotonic()
        for fd in (out_r, err_r, chan_r, st_r):
            os.set_blocking(fd, False)
        try:
            # The zygote moves the child into the run's group before sending it the request.
            procs = cg.procs_fds()
            msg = protocol.encode_run(work or "", limits.workdir_mb, limits.workdir_inodes,
                                           len(procs))
            reply = await self._request(
                msg, [stdin_fd, files_fd, spec_fd, out_w, err_w, chan_w, st_w, *procs],
                timeout=30.0)
        except OSError as e:
            reply = {"ok": False, "error": f"cannot open the run's cgroup: {e}"}
        finally:
            for i in (3, 5, 7, 9):  # our copies of the write ends: EOF must mean the run is over
                os.close(fds[i])
                fds[i] = -1
        if not reply.get("ok"):
            out.infra_error = f"zygote refused the run: {reply.get('error')}"
            return
        pid = int(reply["pid"])
        held_ns = reply.get("_fds", [])
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            pass  # it ended already: nothing to kill
        except OSError as e:
            logger.debug("no pidfd for run pid %s (kills go through its cgroup): %s", pid, e)
        for cap in captures.values():
            loop.add_reader(cap.fd, cap.on_readable, on_out)
        loop.add_reader(status.fd, status.on_readable, lambda n: None)
        self._make_ready_group(_cgroup_limits(limits))
        deadline = start + limits.wall_s
        try:
            try:
                await _watch_run(status, deadline, limits, cg, kill)
            except asyncio.CancelledError:
                # The caller gave up (a client went away): the run must not outlive the request
                # nor share the slot with the next one. Kill it and wait for it, then re-raise.
                kill("cancelled")
                with contextlib.suppress(asyncio.CancelledError):
                    await _settled(status.eof, 5.0)
                if not status.eof.done():
                    self.abandon()
                raise
            # Killed: the zygote reaps the child and closes the status pipe.
            if not await _settled(status.eof, 5.0):
                self.broken = True
                out.infra_error = "the killed run did not exit within 5 s"
            # Every process of the run is dead once the status arrives (pid namespace torn
            # down), so the pipes reach EOF promptly; the timeout is only a backstop.
            for cap in captures.values():
                if not await _settled(cap.eof, 2.0):
                    break
        finally:
            for cap in (*captures.values(), status):
                loop.remove_reader(cap.fd)
            if pidfd is not None:
                os.close(pidfd)
            if held_ns:
                self._releaser.hold(held_ns)
        out.wall_s = time.monotonic() - start
        out.stdout = bytes(captures["out"].buf)
        out.stderr = bytes(captures["err"].buf)
        out.stdout_truncated = captures["out"].truncated
        out.stderr_truncated = captures["err"].truncated
        out.channel = bytes(captures["chan"].buf)
        _parse_status(bytes(status.buf), out)
        if out.wait_status is None and out.infra_error is None:
            self.broken = True
            out.infra_error = "the zygote did not report the run's exit status"
        elif out.lost_before_start and out.infra_error is None:
            out.infra_error = (f"the prepared sandbox child died before the run reached it "
                               f"(wait status {out.wait_status})")


async def _settled(fut: asyncio.Future[Any], timeout: float) -> bool:
    """Wait until ``fut`` is done or ``timeout`` passes (True if done), without cancelling it.

    What ``wait_for(shield(fut))`` does, minus the tasks and wrappers it creates: this runs
    several times per sandbox run, on the event loop that also serves every other run.
    """
    if fut.done():
        return True
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    timer = loop.call_later(timeout, wake)
    fut.add_done_callback(wake)
    try:
        await waiter
    finally:
        timer.cancel()
        fut.remove_done_callback(wake)
    return fut.done()


async def _watch_run(status: _Capture, deadline: float, limits: StepLimits, cg: Cgroup,
                     kill: Callable[[protocol.KilledFor], None]) -> None:
    """Wait for the run to end, killing it at the wall deadline or past its CPU budget."""
    while not status.eof.done():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            kill("wall")
            return
        await _settled(status.eof, min(remaining, 0.1))
        if not status.eof.done():
            try:
                cpu = cg.cpu_s()
            except OSError as e:  # the RLIMIT_CPU backstop and the wall deadline still hold
                logger.debug("cannot read the CPU time of %s: %s", cg.name, e)
                continue
            if cpu > limits.cpu_s:
                kill("cpu")
                return


def _cgroup_limits(limits: StepLimits) -> CgroupLimits:
    return CgroupLimits(limits.memory_bytes, limits.max_pids, limits.cpus, limits.cpu_weight)


def _pack_spec(rlimits: tuple[tuple[int, int], ...], spec: protocol.RunSpec) -> bytes:
    """The run spec as the child reads it (protocol.pack_spec): rlimits in binary, then marshalled."""
    return protocol.pack_spec(rlimits, spec)


def _parse_status(buf: bytes, out: StepOutcome) -> None:
    """Decode the status records (protocol.Record). The trusted pid 1's report of the program
    (PROGRAM) takes precedence over the zygote's report of pid 1 itself (EXIT)."""
    Rec = protocol.Record
    program: dict[str, Any] | None = None
    for kind, payload in protocol.iter_records(buf):
        if kind == Rec.STARTED:
            out.started = True
        elif kind == Rec.SETUP_FAILED:
            out.setup_error = payload.decode(errors="replace")
        elif kind == Rec.FILES_FAILED:
            out.files_error = payload.decode(errors="replace")
        elif kind == Rec.EXIT:
            rec = json.loads(payload)
            out.wait_status = int(rec["status"])
            out.rusage = {k: float(v) for k, v in rec.items() if k != "status"}
        elif kind == Rec.PROGRAM:
            program = json.loads(payload)
        elif kind == Rec.FILE and len(payload) >= 2:
            (nl,) = struct.unpack_from("<H", payload)
            out.files[payload[2:2 + nl].decode(errors="replace")] = payload[2 + nl:]
        elif kind == Rec.COLLECTED:
            out.collect_done = True
            out.missing_files = [str(n) for n in json.loads(payload)]
    if program is not None and out.setup_error is None and out.files_error is None:
        out.wait_status = int(program["status"])
        out.rusage = {k: float(v) for k, v in program.items() if k != "status"}


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _recv_with_fds(sock: socket.socket) -> tuple[bytes, list[int]]:
    return protocol.recv_raw(sock, 1 << 16)


def default_python() -> str:
    """The interpreter that runs Python programs (and hosts the zygote): ``$SANDLOOP_PYTHON``,
    else sandloop's own. Any CPython >= 3.9 works; its site-packages are visible to programs."""
    return os.environ.get("SANDLOOP_PYTHON") or sys.executable
