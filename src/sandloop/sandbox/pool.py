"""A pool of warm slots: the sandbox layer's entry point (``SandboxPool``, ``run``, ``run_batch``)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import hashlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from sandloop import _aio as aio
from sandloop.envs import Environment, EnvNotFound, EnvStore
from sandloop.errors import EnvError, SandboxError
from sandloop.sandbox import cgroups, host, warm
from sandloop.sandbox.jailbuild import JailBuild, find_jail
from sandloop.sandbox.languages import WORK_DIR, LanguageUnavailable, Step, spec_for
from sandloop.sandbox.models import (
    ExecResult,
    Limits,
    Program,
    Status,
    check_file_names,
    check_text,
    with_compile_limit_note,
)
from sandloop.sandbox.outcome import classify
from sandloop.sandbox.protocol import Isolation
from sandloop.sandbox.runenv import EnvResolver, run_env
from sandloop.sandbox.safefs import pack_files
from sandloop.sandbox.seccomp_policy import compile_filter
from sandloop.sandbox.slot import (
    DEFAULT_PRELOAD,
    CowUnavailable,
    NsReleaser,
    Slot,
    SlotBroken,
    SlotConfig,
    StepLimits,
    StepOutcome,
    default_python,
)
from sandloop.sandbox.unisolated import UnisolatedIdentity, run_unisolated, unisolated_identity
from sandloop.sandbox.warm import WarmModules

logger = logging.getLogger(__name__)

ISOLATION_LEVELS = ("full", "none")
_TOUCH = Step("exec", ("/bin/true",))  # a no-op program: files are written, or collected, around it
DEFAULT_UID_BASE = 61000


class IsolationUnavailable(SandboxError, RuntimeError):
    """Full isolation was requested but the host cannot provide it (see ``sandloop doctor``)."""


def _as_bytes(v: str | bytes | None) -> bytes:
    if v is None:
        return b""
    return v.encode() if isinstance(v, str) else v


def _file_op_limits(workspace: Limits) -> Limits:
    """Limits of the no-op step that writes or reads a workspace's files. Not the session's
    program limits: those are the program's (a session opened with ``time_s=1e-9`` or
    ``memory_mb=8`` must not make its file operations fail as the infrastructure). Its memory
    covers the files it writes, which its cgroup is charged for (at most the work dir)."""
    return Limits(time_s=30, memory_mb=workspace.workdir_mb + 64, max_processes=4,
                  workdir_mb=workspace.workdir_mb, workdir_inodes=workspace.workdir_inodes)


def _step_limits(limits: Limits, *, compile_step: bool) -> StepLimits:
    if compile_step:
        return StepLimits(
            wall_s=limits.compile_time_limit_s, cpu_s=limits.compile_time_limit_s,
            memory_bytes=limits.compile_memory_limit_mb << 20, max_pids=max(64, limits.max_processes),
            cpus=1.0, cpu_weight=limits.cpu_weight, stdout_bytes=1 << 16, stderr_bytes=1 << 16, kill_output_bytes=8 << 20,
            # Scratch space for the toolchain; the artifact alone travels to the run step
            # (collect_max bounds it, and the run's own work dir must hold it).
            workdir_mb=limits.compile_workdir_limit_mb,
            workdir_inodes=limits.compile_workdir_inodes,
            open_files=max(limits.open_files, 256),
        )
    return StepLimits(
        wall_s=limits.time_s, cpu_s=limits.cpu_limit_s, memory_bytes=limits.memory_mb << 20,
        max_pids=limits.max_processes, cpus=limits.cpus, cpu_weight=limits.cpu_weight,
        stdout_bytes=limits.stdout_bytes,
        stderr_bytes=limits.stderr_bytes, kill_output_bytes=limits.kill_output_bytes,
        workdir_mb=limits.workdir_mb, workdir_inodes=limits.workdir_inodes,
        open_files=limits.open_files,
    )


class _SlotHandout:
    """Hands free slots to waiters in FIFO order, with a separate queue per slot for runs that
    must go to one slot (workspaces live in one slot's zygote). O(1) per hand-out, so a batch
    of 100,000 waiting runs costs no more per run than a batch of ten."""

    def __init__(self, slots: list[Slot]) -> None:
        # FIFO: sequential runs rotate over the slots (prepared children stay warm everywhere).
        self.free: collections.deque[Slot] = collections.deque(slots)
        self.any_waiters: collections.deque[asyncio.Future[Slot]] = collections.deque()
        self.slot_waiters: dict[int, collections.deque[asyncio.Future[Slot]]] = {
            s.index: collections.deque() for s in slots}

    async def acquire(self, want: Slot | None = None) -> Slot:
        if want is None and self.free:
            return self.free.popleft()
        if want is not None and want in self.free:
            self.free.remove(want)
            return want
        fut: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        (self.any_waiters if want is None else self.slot_waiters[want.index]).append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # handed over just as we were cancelled
                self.release(fut.result())
            raise

    def add(self, slot: Slot) -> None:
        self.slot_waiters.setdefault(slot.index, collections.deque())
        self.release(slot)

    def remove(self, slot: Slot) -> None:
        self.free.remove(slot)
        self.slot_waiters.pop(slot.index, None)

    def release(self, slot: Slot) -> None:
        slot.idle_since = time.monotonic()
        for queue in (self.slot_waiters[slot.index], self.any_waiters):
            while queue:
                fut = queue.popleft()
                if not fut.done():
                    fut.set_result(slot)
                    return
        self.free.append(slot)


@dataclass
class Workspace:
    """A persistent work dir in one slot (a session's files); see ``SandboxPool.open_workspace``."""

    id: str
    slot: int
    limits: Limits
    closed: bool = False
    generation: int = 0  # the slot's zygote generation it lives in
    owner: SandboxPool | None = None  # the pool of another environment that holds it


class WorkspaceLost(SandboxError, RuntimeError):
    """The workspace's slot was restarted (its zygote died), taking the workspace's files."""


class WorkspaceWriteError(SandboxError, OSError):
    """Files could not be written into a workspace because of what is in it: a program made
    the path a directory, a symlink or read-only, or the files do not fit its size. The
    caller's (or its programs') doing, not the infrastructure's: remove or rename what is in
    the way (with a run), or write less. Files before the failing one may have been written."""


class WorkspaceFull(WorkspaceWriteError):
    """Files to write do not fit in the workspace (its size or inode limit): the caller's
    doing, not an infrastructure failure."""


# How the sandbox reports a write that the work dir's size or inode limit (or the file-size
# rlimit) refused: the libc message of the errno, as its setup error carries it.
_FULL_MESSAGES = tuple(os.strerror(e) for e in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT))


def workspace_mb(limits: Limits) -> int:
    """The size of a session's work dir: ``limits.workdir_mb``, never more than
    ``limits.memory_mb``.

    Threat: a workspace's files stay in memory (tmpfs) between runs, after the run that wrote
    them is gone; the kernel then charges those pages to the slot's cgroup, which has no memory
    limit. Uncapped, an idle session with ``memory_mb=64`` could pin ``workdir_mb`` (up to
    16 GiB) of host memory outside every limit; capped, a session holds at most its own memory
    limit in files.
    """
    return max(1, min(limits.workdir_mb, limits.memory_mb))


async def unisolated_interpreter(
        python: str, uid: int | None, *, given: bool, resolver: EnvResolver | None = None,
        environment: str | Environment | None = None) -> tuple[str, UnisolatedIdentity]:
    """The interpreter isolation='none' runs Python programs on, and the identity it runs as.

    The usual set-up as root puts the checkout (and its .venv) under /root, mode 0700, which
    the unprivileged run uid cannot enter. Rather than fail every Python run, an interpreter
    the caller did not name (``given``) is replaced by the real one behind the venv, else by
    the environment's copy (the one isolated runs use); one the caller named never is."""
    loop = asyncio.get_running_loop()
    who = await loop.run_in_executor(None, unisolated_identity, python, uid)
    if who.python_error is None or given:
        return python, who
    candidates = []
    if os.path.realpath(python) != python:
        candidates.append(os.path.realpath(python))
    try:
        resolver = resolver or EnvResolver()
        if isinstance(environment, Environment):
            env = environment
        else:
            env = resolver.environment(await resolver.info(environment or "python"))
        if env.host_python is not None:
            candidates.append(str(env.host_python))
    except EnvError as e:
        logger.debug("no environment interpreter for unisolated runs: %s", e)
    for alt in candidates:
        alt_who = await loop.run_in_executor(None, unisolated_identity, alt, uid)
        if alt_who.python_error is None:
            logger.info("isolation='none': %s; Python programs run on %s", who.python_error, alt)
            return alt, alt_who
    return python, who


class SandboxPool:
    """Warm fork-server slots that run untrusted programs with every isolation layer on.

    Use as an async context manager::

        async with SandboxPool() as pool:
            result = await pool.run(Program(language="python", source="print(1)"))

    ``slots`` defaults to the number of CPU cores. ``isolation="none"`` is the explicit opt-out
    for hosts that cannot isolate (results then carry ``isolation: "none"``); with the default
    ``"full"``, a host that lacks a required feature makes every run a ``sandbox_error`` that
    names what is missing. ``preload`` names the modules each slot's interpreter imports once
    (default ``DEFAULT_PRELOAD``); add e.g. ``"unittest"`` when most programs import it.
    ``warm_modules`` (name -> source; default what is registered in ``sandbox.warm``, the
    verifier's harness once ``sandloop.reward`` is imported) are sandloop's own modules that
    each zygote loads once for the programs that look for them in ``sys.modules``.

    ``environment`` (a name, an id, or an ``Environment``; default the built-in ``python``,
    built from the host on first use) is what the slots mount at /opt/env and run their
    zygotes on; ``env_store`` is where names are looked up (default ``$SANDLOOP_ENV_DIR``). A
    program naming another environment (``Program.environment``) runs in a pool of that
    environment's own, started on first use. ``python`` is the interpreter that starts each
    zygote before it re-executes itself on the environment's, and that runs Python programs
    with ``isolation="none"`` (which mounts no environment).
    """

    def __init__(
        self,
        slots: int | None = None,
        *,
        isolation: str = "full",
        python: str | None = None,
        uid_base: int = DEFAULT_UID_BASE,
        max_runs_per_slot: int = 5000,
        max_slots: int | None = None,
        idle_shrink_s: float = 30.0,
        max_zygote_rss_mb: int = 256,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        environment: str | Environment | None = None,
        env_store: EnvStore | None = None,
        warm_modules: WarmModules | None = None,
    ) -> None:
        if isolation not in ISOLATION_LEVELS:
            raise ValueError(f"isolation must be one of {ISOLATION_LEVELS}, got {isolation!r}")
        self.size = slots if slots is not None else (os.cpu_count() or 1)
        if self.size < 1:
            raise ValueError("a pool needs at least one slot")
        # Slots start warm at ``size``; under demand (runs waiting, none free) the pool grows to
        # ``max_slots`` and shrinks back after ``idle_shrink_s`` of idleness.
        self.max_size = max(self.size, max_slots or self.size)
        self.idle_shrink_s = idle_shrink_s
        self.max_zygote_rss_mb = max_zygote_rss_mb
        self.preload = tuple(preload)
        self._preload_arg = self.preload  # without the environment's (sub-pools add their own)
        self.warm_modules = dict(warm.registered() if warm_modules is None else warm_modules)
        self._env_ref = environment
        self._envs = EnvResolver(env_store)
        self.environment: Environment | None = None  # resolved at start (full isolation)
        self._env_pools: dict[str, SandboxPool] = {}  # other environments' pools, by id
        self._env_lock: asyncio.Lock | None = None
        self._run_envs: dict[str, dict[str, str]] = {}  # language -> a run's variables
        self._growing = 0
        self._shrinker: asyncio.Task[None] | None = None
        self._bg: set[asyncio.Task[None]] = set()  # slots being added
        self.isolation = isolation
        self._python_given = bool(python or os.environ.get("SANDLOOP_PYTHON"))
        self.python = python or default_python()
        self.uid_base = uid_base
        self.max_runs_per_slot = max_runs_per_slot
        self.pool_id = f"p{os.getpid()}x{secrets.token_hex(3)}"
        self.report: host.HostReport | None = None
        self.jail = JailBuild(None, "not started")  # how children isolate themselves (C or Python)
        self._unavailable: str | None = None
        self._slots: list[Slot] = []
        self._releaser = NsReleaser()  # finished runs' mount namespaces, for all slots
        self._free: _SlotHandout | None = None
        self._config: SlotConfig | None = None
        # Copy-on-write bases of workspaces: (slot, files digest) -> (work id, generation),
        # oldest first; None until a zygote says it cannot (then workspaces get copies).
        self._bases: collections.OrderedDict[tuple[int, str], tuple[str, int]] = \
            collections.OrderedDict()
        self._base_lock = asyncio.Lock()
        self.cow: bool | None = None
        self.bases_built = 0
        self._started = False
        self._unisolated_sem: asyncio.Semaphore | None = None
        # isolation="none" as root: the unprivileged uids its runs take (one per concurrent run).
        self._unisolated_uids: asyncio.Queue[int | None] | None = None
        self.unisolated: UnisolatedIdentity | None = None
        self._uid_lock: int | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.isolation == "none":
            await self._start_unisolated()
            return
        self.report = await asyncio.get_running_loop().run_in_executor(None, host.probe)
        if not self.report.full:
            self._unavailable = self.report.problem()
            return
        try:
            self.environment = await self._own_environment()
        except EnvError as e:
            if self._env_ref is not None:
                raise  # the caller named it: their error to fix
            # The built-in could not be built: the infrastructure's failure, for every run.
            self._unavailable = f"cannot prepare the default Python environment: {e}"
            return
        self.preload = (*self.preload, *(m for m in self.environment.preload
                                         if m not in self.preload))
        backend = cgroups.detect()
        cgroups.sweep_leftovers(backend, alive=set())
        base = host.run_base_dir()
        _sweep_stale_dirs(base)
        self._uid_lock, self.uid_base = _claim_uid_range(base, self.uid_base, self.max_size)
        # Not the host's interpreter: the environment's, at /opt/env (SlotConfig.environment).
        binds, symlinks = host.runtime_binds(None)
        self.jail = await asyncio.get_running_loop().run_in_executor(None, find_jail)
        self._config = SlotConfig(
            python=self.python, base_dir=base, binds=binds, symlinks=symlinks,
            bpf=compile_filter(), cgroups=backend, pool_id=self.pool_id, preload=self.preload,
            warm=warm.zygote_entries(self.warm_modules),
            jail=self.jail.path, environment=self.environment,
        )
        self._slots = [Slot(i, self.uid_base + i, self.uid_base + i, self._config,
                            self._releaser)
                       for i in range(self.size)]
        results = await asyncio.gather(*(s.start() for s in self._slots), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.close()
            raise IsolationUnavailable(f"cannot start sandbox slots: {errors[0]}")
        self._free = _SlotHandout(self._slots)
        if self.max_size > self.size:
            self._shrinker = asyncio.create_task(self._shrink_idle())

    async def _own_environment(self) -> Environment:
        """The environment this pool's slots run in (EnvError when it cannot be had)."""
        if isinstance(self._env_ref, Environment):
            env = self._env_ref
        else:
            env = self._envs.environment(await self._envs.info(self._env_ref or "python"))
        if env.python is None:
            raise EnvNotFound(f"environment {env.name!r} has no Python interpreter, which "
                              "the sandbox's slots run on; add a [python] section to its spec")
        return env

    async def _start_unisolated(self) -> None:
        """Never root, even unisolated: as root, claim a uid range as full isolation does and
        give each concurrent run its own uid (its leftovers are killed by uid after it)."""
        self._unisolated_sem = asyncio.Semaphore(self.size)
        self._unisolated_uids = asyncio.Queue()
        if os.geteuid() != 0:
            self.unisolated = UnisolatedIdentity(None, None)
            for _ in range(self.size):
                self._unisolated_uids.put_nowait(None)
            return
        self._uid_lock, self.uid_base = _claim_uid_range(host.run_base_dir(), self.uid_base,
                                                         self.size)
        for i in range(self.size):
            self._unisolated_uids.put_nowait(self.uid_base + i)
        self.python, self.unisolated = await unisolated_interpreter(
            self.python, self.uid_base, given=self._python_given, resolver=self._envs,
            environment=self._env_ref)

    async def close(self) -> None:
        pools, self._env_pools = list(self._env_pools.values()), {}
        await asyncio.gather(*(p.close() for p in pools), return_exceptions=True)
        if self._shrinker is not None:
            self._shrinker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._shrinker
            self._shrinker = None
        self._started = False  # a slot still starting closes itself instead of joining
        await asyncio.gather(*self._bg, return_exceptions=True)
        await asyncio.gather(*(s.close() for s in self._slots), return_exceptions=True)
        self._releaser.close()
        self._slots = []
        self._started = False
        if self._uid_lock is not None:
            os.close(self._uid_lock)  # releases the flock on the uid range
            self._uid_lock = None

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def isolation_level(self) -> Isolation:
        if self.isolation == "none":
            return "none"
        return "full" if self._unavailable is None else "unavailable"

    # -- running --------------------------------------------------------------------------------
    async def run(self, program: Program, limits: Limits | None = None, *,
                  on_end: Callable[[], None] | None = None) -> ExecResult:
        """Run one program (compiling it first if its language needs it).

        ``on_end``, if given, is called when the program's last step has ended (its processes
        are gone) and only cleanup and the result are left: a scheduler can hand the CPU on
        then. It may be called at most once, or never."""
        if not self._started:
            await self.start()
        limits = limits or Limits()
        try:
            spec = spec_for(program.language, tuple(program.argv))
            spec.check_available()
        except LanguageUnavailable as e:
            return ExecResult.sandbox_error(str(e), isolation=self.isolation_level)
        if self.isolation == "none":
            assert self._unisolated_sem is not None
            assert self._unisolated_uids is not None and self.unisolated is not None
            async with self._unisolated_sem:
                uid = self._unisolated_uids.get_nowait()  # one per run the semaphore admits
                try:
                    who = UnisolatedIdentity(uid, uid, self.unisolated.python_error)
                    return await run_unisolated(program, limits, spec, self.python,
                                                who if uid is not None else self.unisolated)
                finally:
                    self._unisolated_uids.put_nowait(uid)
        if self._unavailable is not None:
            return ExecResult.sandbox_error(self._unavailable, isolation="unavailable")
        # The environment the run is recorded in: the pool's for Python programs, the
        # language's built-in (its toolchain is the host's /usr) for the others.
        assert self.environment is not None
        env_id: str | None = self.environment.id
        if program.environment is not None:
            info = await self._envs.info(program.environment)
            if info.id != env_id:
                env = self._envs.environment(info)
                if env.python is not None or info.files:
                    other = await self._pool_of(env)
                    return await other.run(program, limits, on_end=on_end)
                env_id = info.id  # no files of its own (c, bash, ...): these slots serve it
        elif spec.name != "python":
            env_id = await self._envs.builtin_id(spec.name)
        # A broken zygote is the infrastructure's fault, never the program's verdict: it is a
        # sandbox_error, which the engine (the one owner of retries, engine/retry.py) runs again
        # on another slot. The pool itself does not retry.
        try:
            return await self._run_isolated(program, limits, on_end, env_id)
        except SlotBroken as e:
            return ExecResult.sandbox_error(f"sandbox slot failed: {e}", isolation="full")

    def workspace_bases(self) -> dict[str, tuple[bool | None, int]]:
        """Copy-on-write state per environment this pool serves workspaces in (its own and
        those of the environments' pools it started): environment id -> (``cow``, bases
        written). ``cow`` is None until a workspace with files was opened there."""
        own = self.environment.id if self.environment is not None else "host"
        out = {own: (self.cow, self.bases_built)}
        for env_id, pool in self._env_pools.items():
            out.update(pool.workspace_bases() if env_id != own else {})
        return out

    async def _pool_of(self, env: Environment) -> SandboxPool:
        """The pool of another environment: started on first use, closed with this one."""
        pool = self._env_pools.get(env.id)
        if pool is not None:
            return pool
        if self._env_lock is None:
            self._env_lock = asyncio.Lock()
        async with self._env_lock:
            pool = self._env_pools.get(env.id)
            if pool is None:
                pool = SandboxPool(
                    self.size, isolation=self.isolation, python=self.python,
                    uid_base=DEFAULT_UID_BASE, max_runs_per_slot=self.max_runs_per_slot,
                    max_slots=self.max_size, idle_shrink_s=self.idle_shrink_s,
                    max_zygote_rss_mb=self.max_zygote_rss_mb, preload=self._preload_arg,
                    environment=env, env_store=self._envs.store,
                    warm_modules=self.warm_modules)
                await pool.start()
                self._env_pools[env.id] = pool
        return pool

    def _run_env(self, language: str) -> dict[str, str]:
        env = self._run_envs.get(language)
        if env is None:
            env = self._run_envs[language] = run_env(language, self.environment)
        return env

    async def run_batch(
        self, programs: Sequence[Program], limits: Limits | Sequence[Limits] | None = None
    ) -> list[ExecResult]:
        """Run many programs over all slots; results come back in input order."""
        if isinstance(limits, Sequence):
            if len(limits) != len(programs):
                raise ValueError("limits must be one Limits or one per program")
            per = list(limits)
        else:
            per = [limits or Limits()] * len(programs)
        return list(await asyncio.gather(*(self.run(p, lim) for p, lim in zip(programs, per, strict=True))))

    async def _acquire(self, want: Slot | None = None) -> Slot:
        assert self._free is not None
        if want is None and not self._free.free and not self._growing \
                and len(self._slots) < self.max_size:
            self._growing += 1
            task = asyncio.create_task(self._grow())
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)
        slot = await self._free.acquire(want)
        if slot.proc is not None and slot.proc.poll() is not None:
            # Its zygote died while idle (OOM killer, an operator): restart it before the run
            # rather than lose the run to it. Not a retry: nothing has run yet.
            slot.broken = True
        # Recycle a broken slot, or a worn one that holds no workspace (a restart loses them):
        # after max_runs_per_slot runs, or when the zygote's memory grew (checked every 64 runs).
        worn = slot.runs >= self.max_runs_per_slot or (
            slot.runs % 64 == 63 and slot.zygote_rss_mb() > self.max_zygote_rss_mb)
        if slot.broken or (worn and not slot.workspaces):
            await slot.close()
            try:
                await slot.start()
                slot.runs = 0
            except SlotBroken:
                slot.broken = True
        return slot

    async def _grow(self) -> None:
        """Add one warm slot (demand exceeded the free slots)."""
        assert self._config is not None and self._free is not None
        try:
            used = {s.index for s in self._slots}
            index = next(i for i in range(self.max_size) if i not in used)
            slot = Slot(index, self.uid_base + index, self.uid_base + index, self._config,
                        self._releaser)
            try:
                await slot.start()
            except SlotBroken as e:  # runs keep the slots there are
                logger.debug("pool %s: an extra slot did not start: %s", self.pool_id, e)
                return
            if not self._started:  # closed meanwhile
                await slot.close()
                return
            self._slots.append(slot)
            self._free.add(slot)
        finally:
            self._growing -= 1

    async def _shrink_idle(self) -> None:
        """Close slots beyond ``size`` that stayed idle (and hold no workspace) for a while."""
        assert self._free is not None
        while True:
            await asyncio.sleep(max(0.05, self.idle_shrink_s / 4))
            now = time.monotonic()
            for slot in list(self._free.free):
                if len(self._slots) <= self.size:
                    break
                if slot.workspaces or now - slot.idle_since < self.idle_shrink_s:
                    continue
                self._free.remove(slot)
                self._slots.remove(slot)
                await slot.close()

    @property
    def slots_now(self) -> int:
        """How many slots are running at the moment (between ``size`` and ``max_size``)."""
        return len(self._slots)

    async def _run_isolated(self, program: Program, limits: Limits,
                            on_end: Callable[[], None] | None, env_id: str | None) -> ExecResult:
        """Run on a free slot; raises SlotBroken when the slot failed (the caller retries)."""
        slot = await self._acquire()
        assert self._free is not None
        try:
            if slot.broken:
                raise SlotBroken("sandbox slot could not be restarted")
            result = await self._run_on(slot, program, limits, on_end=on_end, env_id=env_id)
            if slot.broken and result.status is Status.SANDBOX_ERROR:
                raise SlotBroken(result.error or "slot broke during the run")
            return result
        except SlotBroken:
            slot.broken = True
            raise
        finally:
            self._free.release(slot)

    # -- workspaces (persistent work dirs for multi-turn sessions) -----------------------------
    async def open_workspace(self, limits: Limits | None = None, *,
                             environment: str | None = None,
                             base: Mapping[str, bytes] | None = None) -> Workspace:
        """A work dir that keeps its files between runs, in the slot with fewest workspaces.

        Idle, it costs only its files (a tmpfs in that slot's zygote); runs in it wait for that
        slot. Size and inode limits are fixed at creation: ``limits.workdir_mb/_inodes``, the
        size capped at ``limits.memory_mb`` (see ``workspace_mb``).

        ``base``: the files it starts with. Each slot writes a given set of files once, into a
        work dir no run ever sees, and every workspace opened with the same files is a
        copy-on-write overlay on it (opening costs a mount, not a copy; the size and inode
        limits count what the session writes). Where the kernel cannot, the files are copied
        in (``cow`` turns False).
        """
        if not self._started:
            await self.start()
        if self.isolation == "none":
            raise IsolationUnavailable("workspaces need full isolation (isolation='full')")
        if self._unavailable is not None:
            raise IsolationUnavailable(self._unavailable)
        if environment is not None:
            # A workspace lives in one zygote, so in one environment: that environment's pool.
            info = await self._envs.info(environment)
            assert self.environment is not None
            env = self._envs.environment(info)
            if info.id != self.environment.id and (env.python is not None or info.files):
                owner = await self._pool_of(env)
                ws = await owner.open_workspace(limits, base=base)
                ws.owner = owner
                return ws
        limits = limits or Limits()
        limits = limits.model_copy(update={"workdir_mb": workspace_mb(limits)})
        slot = min(self._slots, key=lambda s: len(s.workspaces))
        lower = None
        if base and self.cow is not False:
            lower = await self._base_on(slot, base)
        ws = Workspace(slot.new_work_id(), slot.index, limits, generation=slot.generation)
        acquired = await self._acquire(slot)
        try:
            ws.generation = acquired.generation
            try:
                await acquired.make_work(ws.id, limits.workdir_mb, limits.workdir_inodes,
                                         lower=lower)
            except CowUnavailable as e:
                logger.warning("workspaces get copies of their files, not overlays: %s", e)
                self.cow, lower = False, None
                await acquired.make_work(ws.id, limits.workdir_mb, limits.workdir_inodes)
            except OSError as e:
                if lower is None:
                    raise
                # Its base went meanwhile (evicted, or the slot restarted): a copy, this once.
                logger.debug("workspace %s gets a copy of its files: %s", ws.id, e)
                lower = None
                await acquired.make_work(ws.id, limits.workdir_mb, limits.workdir_inodes)
            acquired.workspaces.add(ws.id)
        except (SlotBroken, OSError) as e:
            raise WorkspaceLost(f"cannot create the workspace: {e}") from e
        finally:
            self._free.release(acquired)  # type: ignore[union-attr]
        if lower is not None:
            self.cow = True
        elif base:
            try:
                await self.write_files(ws, dict(base))
            except BaseException:
                await self.close_workspace(ws)
                raise
        return ws

    _MAX_BASES_PER_SLOT = 8

    async def _base_on(self, slot: Slot, base: Mapping[str, bytes]) -> str | None:
        """The work id of ``base``'s files in ``slot`` (written there the first time); None
        where the zygote cannot make overlays."""
        check_file_names(base)
        h = hashlib.sha256()
        for name in sorted(base):
            data = base[name]
            h.update(b"%d:%s:%d:" % (len(name), name.encode(), len(data)))
            h.update(data)
        key = (slot.index, h.hexdigest())
        async with self._base_lock:  # one writer of a base per slot; rare (once per slot)
            got = self._bases.get(key)
            if got is not None and got[1] == slot.generation:
                self._bases.move_to_end(key)
                return got[0]
            if self.cow is False:
                return None
            total = sum(len(d) for d in base.values())
            size_mb = -(-(total + 4096 * (len(base) + 1)) // (1 << 20)) + 1
            if size_mb > 8192 or 2 * len(base) + 64 > 1 << 20:
                return None  # larger than any work dir: copied in (and refused as too big)
            lim = Limits(workdir_mb=size_mb, memory_mb=max(256, size_mb),
                         workdir_inodes=2 * len(base) + 64)
            tmpl = Workspace(slot.new_work_id(), slot.index, lim, generation=slot.generation)
            acquired = await self._acquire(slot)
            try:
                tmpl.generation = acquired.generation
                await acquired.make_work(tmpl.id, lim.workdir_mb, lim.workdir_inodes)
                # A workspace while it is written (runs check that), never one a caller holds.
                acquired.workspaces.add(tmpl.id)
                evict = [k for k in self._bases if k[0] == slot.index]
                evict = evict[:max(0, len(evict) + 1 - self._MAX_BASES_PER_SLOT)]
                for k in evict:
                    work, gen = self._bases.pop(k)
                    if gen == acquired.generation:
                        # Overlays opened on it keep its files alive until they close.
                        await acquired.remove_work(work)
            except (SlotBroken, OSError) as e:
                raise WorkspaceLost(f"cannot create the workspace's base: {e}") from e
            finally:
                self._free.release(acquired)  # type: ignore[union-attr]
            try:
                packed = {name: _as_bytes(data) for name, data in base.items()}
                r = await self._in_workspace(tmpl, _TOUCH, _file_op_limits(lim), files=packed,
                                             collect=())
                if r.status is not Status.OK:
                    raise OSError(f"cannot write the workspace's base: "
                                  f"{r.error or r.stderr.strip()}")
            except BaseException:
                await self.close_workspace(tmpl)
                raise
            acquired.workspaces.discard(tmpl.id)
            self._bases[key] = (tmpl.id, tmpl.generation)
            self.bases_built += 1
            return tmpl.id

    async def run_in(self, ws: Workspace, program: Program, limits: Limits | None = None) -> ExecResult:
        """Run ``program`` with ``/sandbox`` = the workspace; its files persist afterwards."""
        if ws.owner is not None and ws.owner is not self:
            return await ws.owner.run_in(ws, program, limits)
        limits = (limits or Limits()).model_copy(
            update={"workdir_mb": ws.limits.workdir_mb, "workdir_inodes": ws.limits.workdir_inodes})
        slot = self._slot_of(ws)
        acquired = await self._acquire(slot)
        try:
            self._check_alive(ws, acquired)
            env_id = self.environment.id if self.environment is not None else None
            r = await self._run_on(acquired, program, limits, work=ws.id, env_id=env_id)
            if r.status is Status.SANDBOX_ERROR and acquired.broken:
                # The zygote died while the run was in it (it could not report the exit).
                raise _lost(ws, SlotBroken(r.error or "the slot broke under the run"))
            return r
        except SlotBroken as e:
            raise _lost(ws, e) from e
        finally:
            self._free.release(acquired)  # type: ignore[union-attr]

    async def write_files(self, ws: Workspace, files: dict[str, str | bytes]) -> None:
        """Create or replace files in the workspace (written inside the jail, as its user).

        Raises ``ValueError`` for names that can never be written (``check_file_names``) and
        ``WorkspaceWriteError`` when what is in the workspace is in the way."""
        if ws.owner is not None and ws.owner is not self:
            return await ws.owner.write_files(ws, files)
        check_file_names(files)
        for name, data in files.items():
            if isinstance(data, str):
                check_text(data, f"files[{name!r}]")
        packed = {name: _as_bytes(data) for name, data in files.items()}
        r = await self._in_workspace(ws, _TOUCH, _file_op_limits(ws.limits), files=packed,
                                     collect=())
        if r.status is not Status.OK:
            raise OSError(f"cannot write files into the workspace: {r.error or r.stderr.strip()}")

    async def read_files(self, ws: Workspace, paths: Sequence[str], max_bytes: int = 16 << 20,
                         ) -> dict[str, bytes]:
        """Regular files of the workspace (missing ones, symlinks and specials are left out)."""
        if ws.owner is not None and ws.owner is not self:
            return await ws.owner.read_files(ws, paths, max_bytes)
        lim = _file_op_limits(ws.limits).model_copy(update={"stdout_bytes": max_bytes})
        r = await self._in_workspace(ws, _TOUCH, lim, files={}, collect=tuple(paths))
        if r.status is not Status.OK:
            raise OSError(f"cannot read the workspace: {r.error or r.stderr.strip()}")
        return dict(r.files)

    async def close_workspace(self, ws: Workspace) -> None:
        """Delete the workspace and its files."""
        if ws.owner is not None and ws.owner is not self:
            return await ws.owner.close_workspace(ws)
        if ws.closed:
            return
        ws.closed = True
        slot = self._slots[ws.slot]
        acquired = await self._acquire(slot)
        try:
            if ws.id in acquired.workspaces and ws.generation == acquired.generation:
                try:
                    await acquired.remove_work(ws.id)
                except SlotBroken as e:  # the slot restarts, and its work dirs go with it
                    logger.debug("workspace %s not removed: %s", ws.id, e)
            acquired.workspaces.discard(ws.id)
        finally:
            self._free.release(acquired)  # type: ignore[union-attr]

    def _slot_of(self, ws: Workspace) -> Slot:
        if ws.closed:
            raise WorkspaceLost(f"workspace {ws.id} is closed")
        return self._slots[ws.slot]

    @staticmethod
    def _check_alive(ws: Workspace, slot: Slot) -> None:
        if slot.broken or slot.generation != ws.generation or ws.id not in slot.workspaces:
            raise WorkspaceLost(f"workspace {ws.id} was lost: its sandbox slot restarted")

    async def _in_workspace(self, ws: Workspace, step: Step, limits: Limits, *,
                            files: dict[str, bytes], collect: tuple[str, ...]) -> ExecResult:
        slot = self._slot_of(ws)
        acquired = await self._acquire(slot)
        try:
            self._check_alive(ws, acquired)
            o = await acquired.execute(
                step, _step_limits(limits, compile_step=False), stdin=b"",
                files=pack_files(files), env=self._run_env("bash"), work=ws.id, collect=collect,
                collect_max=limits.stdout_bytes)
            if o.files_error is not None:
                if any(m in o.files_error for m in _FULL_MESSAGES):
                    raise WorkspaceFull(
                        f"the files do not fit in the session's work dir ({ws.limits.workdir_mb} "
                        f"MiB, {ws.limits.workdir_inodes} files; the size is workdir_mb capped "
                        f"at memory_mb): {o.files_error}; delete files or open a session with "
                        "larger limits")
                raise WorkspaceWriteError(f"cannot write into the workspace: {o.files_error}")
            return classify(o, cpu_limit_s=limits.cpu_limit_s, isolation="full")
        except SlotBroken as e:
            raise _lost(ws, e) from e
        finally:
            self._free.release(acquired)  # type: ignore[union-attr]

    async def _run_on(self, slot: Slot, program: Program, limits: Limits,
                      work: str | None = None,
                      on_end: Callable[[], None] | None = None,
                      env_id: str | None = None) -> ExecResult:
        # In a workspace the program's own file goes to the run's /tmp: the workspace keeps
        # only what the user and their programs put there.
        spec = spec_for(program.language, tuple(program.argv),
                        main_dir="/tmp" if work else WORK_DIR, limits=limits)
        files = {name: _as_bytes(v) for name, v in program.files.items()}
        files[spec.main_file] = program.source.encode()
        env = self._run_env(spec.name)
        executable: frozenset[str] = frozenset()
        compile_result: ExecResult | None = None
        if spec.compile is not None:
            # Each step gets a fresh work dir; the binary travels from one to the next.
            c = await slot.execute(
                spec.compile, _step_limits(limits, compile_step=True), stdin=b"",
                files=pack_files({**files, **spec.compile_files}),
                env={**env, **spec.compile_env}, collect=(spec.binary,),
                collect_max=limits.compile_output_mb << 20,
            )
            compile_result = classify(c, cpu_limit_s=limits.compile_time_limit_s,
                                      isolation="full", environment=env_id)
            compile_result = with_compile_limit_note(compile_result, limits)
            binary = c.files.get(spec.binary)
            if compile_result.status is Status.OK and binary is None:
                compile_result = compile_result.model_copy(update={
                    "status": Status.RUNTIME_ERROR,
                    "stderr": compile_result.stderr + "\nthe compiler produced no program\n"})
            compile_result = compile_result.model_copy(update={"files": {}, "missing_files": []})
            if compile_result.status is not Status.OK or binary is None:
                status = (Status.SANDBOX_ERROR if compile_result.status is Status.SANDBOX_ERROR
                          else Status.COMPILE_ERROR)
                return ExecResult(status=status, compile=compile_result, isolation="full",
                                  environment=env_id, error=compile_result.error,
                                  wall_time_s=compile_result.wall_time_s)
            files = {n: d for n, d in files.items() if n != spec.main_file}
            files[spec.binary] = binary
            executable = frozenset({spec.binary}) if spec.native else frozenset()
        own = spec.binary if spec.compile is not None else spec.main_file
        tmp_files = {own: files.pop(own)} if work else {}
        o: StepOutcome = await slot.execute(
            spec.run, _step_limits(limits, compile_step=False),
            stdin=_as_bytes(program.stdin), files=pack_files(files, executable, tmp_files),
            env={**env, **spec.run_env},
            work=work, collect=tuple(program.collect), collect_max=limits.stdout_bytes,
            on_end=on_end,
        )
        result = classify(o, cpu_limit_s=limits.cpu_limit_s, isolation="full",
                          environment=env_id)
        if compile_result is not None:
            result = result.model_copy(update={"compile": compile_result})
        return result


def _lost(ws: Workspace, e: SlotBroken) -> WorkspaceLost:
    """The fork-server holding ``ws`` died under one of its operations: its files died with it.
    Said at once (WorkspaceLost), not as that run's sandbox_error: the session's next call
    would only then find it gone, and an episode took the dead slot's result as feedback."""
    return WorkspaceLost(f"workspace {ws.id} was lost: its sandbox slot failed under it ({e})")


UID_RANGE_STRIDE = 256


def _claim_uid_range(base: Path, first: int, size: int) -> tuple[int, int]:
    """Reserve a range of slot uids no other live pool on this host uses (flock, auto-released).

    Two pools sharing a uid could not see each other's processes (separate pid namespaces), but
    distinct uids keep every run's identity unique on the host: defence in depth.
    """
    import fcntl

    if size > UID_RANGE_STRIDE:
        raise ValueError(f"at most {UID_RANGE_STRIDE} slots per pool")
    locks = base / "uids"
    locks.mkdir(mode=0o700, exist_ok=True)
    for i in range(64):
        start = first + i * UID_RANGE_STRIDE
        fd = os.open(locks / f"{start}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return fd, start
    raise IsolationUnavailable("no free slot uid range: too many sandloop pools on this host")


def _sweep_stale_dirs(base: Path) -> None:
    """Remove slot mount points of pools whose process is gone (after a crash)."""
    for d in base.iterdir():
        name = d.name
        if not name.startswith("p") or "x" not in name:
            continue
        pid_txt = name[1:].split("x", 1)[0]
        if pid_txt.isdigit() and not Path(f"/proc/{pid_txt}").exists():
            try:
                shutil.rmtree(d)
            except OSError as e:
                logger.debug("directory %s of a dead pool not swept: %s", d, e)


# -- sync convenience ----------------------------------------------------------------------------


def run(program: Program, limits: Limits | None = None, *, isolation: str = "full") -> ExecResult:
    """Run one program with a temporary one-slot pool (scripts; use SandboxPool for throughput)."""

    async def go() -> ExecResult:
        async with SandboxPool(1, isolation=isolation) as pool:
            return await pool.run(program, limits)

    return aio.run(go())


def run_batch(
    programs: Sequence[Program], limits: Limits | None = None, *, slots: int | None = None,
    isolation: str = "full",
) -> list[ExecResult]:
    """Run many programs in parallel with a temporary pool; results in input order."""

    async def go() -> list[ExecResult]:
        async with SandboxPool(slots, isolation=isolation) as pool:
            return await pool.run_batch(programs, limits)

    return aio.run(go())
