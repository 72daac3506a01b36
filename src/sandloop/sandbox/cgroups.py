"""Control groups: one group per run with its limits and measurements, one per slot for the zygote.

Every run gets its own fresh group (one v2 directory; on v1 a memory directory, see below),
made by the supervisor with the run's limits before the request; the zygote moves the run's
child into it before handing it the request, so everything the run does is charged to the run
alone, and the group is removed when the run is over. Counters therefore start at zero: peak
memory, OOM kills and pids-limit hits need no baselines, and cgroup v2 needs no resettable
``memory.peak``. A move costs ~0.04 ms per v1 controller here (benchmarks/bench_sandbox.py
shows the whole per-run cost); the freezer is left out of run groups because a run is a pid
namespace, which the kernel tears down atomically when its init dies.

On cgroup v1 the controllers that keep nothing a run could leave to the next one are shared:
pids, cpu and cpuacct hold limits (rewritten when a run's differ), the CPU bandwidth (refilled
as each run begins, so a run that spent its quota does not throttle the next) and one CPU
counter (zeroed as each run begins). They are a slot's ``SharedRunDirs``, which its runs take
turns in; only ``memory``, whose page-cache charges and peak would carry over, is made fresh for
every run. That saves each run three mkdir/rmdir pairs and six opens of control files (~0.4 ms
of the ~17 ms a /run_code request costs here). A run's processes are in all of its groups at
once and cannot leave them (no cgroup file system in the sandbox, no capabilities), so once the
run's memory group could be removed none of them is left in the shared ones either;
``SharedRunDirs.begin`` checks it.

The slot's own group holds the zygote and its prepared (idle, not yet requested) child; it has
no limits and exists so that a slot's processes are found and killed as one. The zygote is
protected from the OOM killer (oom_score_adj -1000), so a memory bomb kills the run, never the
slot.

Two backends with one interface: cgroup v2 (unified) where the host delegates the memory, pids
and cpu controllers, else cgroup v1. Groups left by a crashed pool are swept at the next start.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from sandloop.errors import SandboxError

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_NAME = "sandloop"
V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct", "freezer")
V1_REQUIRED = ("memory", "pids", "cpuacct")
V1_RUN_SKIP = ("freezer",)  # see the module docstring
V1_SHARED = ("pids", "cpu", "cpuacct")  # a slot's runs take turns in these (module docstring)
V2_REQUIRED = ("memory", "pids", "cpu")
CFS_PERIOD_US = 100_000


class CgroupError(SandboxError, RuntimeError):
    """The host's cgroups cannot provide the limits a run needs."""


@dataclass(frozen=True)
class CgroupLimits:
    memory_bytes: int
    max_pids: int
    cpus: float
    weight: int = 100  # cgroup v2 cpu.weight scale; v1 cpu.shares = weight * 1024 / 100


@dataclass(frozen=True)
class CgroupStats:
    cpu_s: float
    peak_memory_bytes: int
    oom_killed: bool
    memory_failcnt: int  # allocations that hit the limit (read only when asked: see stats())


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    """Read through a new open file. (v1 also caches an open ``cgroup.procs``'s pid list for
    up to a second, so a re-read of a kept file could miss a process that just appeared.)"""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


def _read_small(path: str) -> str:
    """A control file of a few lines: one read returns it whole (kernfs fills the buffer)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096).decode()
    finally:
        os.close(fd)


def _kv(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


class Cgroup:
    """One group: a directory per v1 controller, or one v2 directory."""

    def __init__(self, backend: CgroupBackend, name: str, dirs: dict[str, str]) -> None:
        self.backend = backend
        self.name = name
        self.dirs = dirs
        self.shared: SharedRunDirs | None = None  # see attach
        self._own = list(dict.fromkeys(dirs.values()))  # made, and removed, with this group
        self._procs_fds: list[int] = []

    def attach(self, shared: SharedRunDirs, limits: CgroupLimits) -> None:
        """Complete a run group made without ``shared``'s controllers with them, ready for
        this run (``SharedRunDirs.begin``). Done as the run starts: the previous run may be
        in them until then."""
        shared.begin(limits)
        self.shared = shared
        self.dirs = {**self.dirs, **shared.dirs}

    def procs_fds(self) -> list[int]:
        """Its ``cgroup.procs`` files open for writing (kept until the group is removed): the
        zygote moves a run's child in through them."""
        if not self._procs_fds:
            for d in self._own:
                self._procs_fds.append(
                    os.open(os.path.join(d, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC))
        return self._procs_fds + (self.shared.procs_fds if self.shared is not None else [])

    def close_files(self) -> None:
        for fd in self._procs_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._procs_fds = []

    @property
    def procs_files(self) -> list[str]:
        """Files a pid is written to in order to move that process into this group."""
        return [os.path.join(d, "cgroup.procs") for d in dict.fromkeys(self.dirs.values())]

    def pids(self, *, all_controllers: bool = False) -> list[int]:
        """Processes in the group. A process is in all of a group's controllers at once, so
        one read suffices; the sweep at removal reads them all."""
        dirs = list(dict.fromkeys(self.dirs.values()))
        seen: set[int] = set()
        for d in dirs if all_controllers else dirs[:1]:
            with contextlib.suppress(FileNotFoundError):
                seen.update(int(x) for x in _read(os.path.join(d, "cgroup.procs")).split())
        return sorted(seen)

    def limit(self, limits: CgroupLimits, was: CgroupLimits | None = None) -> None:
        """Set the limits of a group no process is in yet: a fresh one, or one set to ``was``."""
        self.backend.limit(self, limits, was)

    def stats(self, *, failcnt: bool = True) -> CgroupStats:
        """What the run used. ``failcnt=False`` skips reading the allocation-failure count
        (it only explains a failed exit), which is then 0."""
        return self.backend.stats(self, failcnt)

    def cpu_s(self) -> float:
        return self.backend.cpu_s(self)

    def kill_all(self, timeout_s: float = 2.0) -> bool:
        """SIGKILL every process in the group; True when none is left."""
        return self.backend.kill_all(self, timeout_s)

    def try_remove(self) -> bool:
        """Remove the group's directories if no process is in them; False if one still is
        (the kernel releases an exited task's group a moment after its parent reaped it)."""
        self.close_files()
        for d in self._own:
            try:
                os.rmdir(d)
            except FileNotFoundError:
                continue
            except OSError:
                return False
        return True

    def remove(self) -> None:
        """Kill what is left inside and remove the group, waiting for the kernel if need be."""
        if self.pids(all_controllers=True) and not self.kill_all():
            raise CgroupError(f"cgroup {self.name} still has processes {self.pids()}")
        for _ in range(400):
            if self.try_remove():
                return
            time.sleep(0.005)
        raise CgroupError(f"cannot remove cgroup {self.name}")


class CgroupBackend:
    version = 0

    def create(self, name: str, *, run: bool = False,
               leave_out: tuple[str, ...] = ()) -> Cgroup:
        """A new group; ``run`` leaves out what only a slot's group needs, ``leave_out`` the
        controllers a ``SharedRunDirs`` will complete it with (``Cgroup.attach``)."""
        raise NotImplementedError

    def limit(self, cg: Cgroup, limits: CgroupLimits, was: CgroupLimits | None) -> None:
        raise NotImplementedError

    def stats(self, cg: Cgroup, failcnt: bool) -> CgroupStats:
        raise NotImplementedError

    def cpu_s(self, cg: Cgroup) -> float:
        raise NotImplementedError

    def leftover_groups(self) -> list[str]:
        """Groups left by a crashed pool (swept at start-up)."""
        raise NotImplementedError

    def shared_run_dirs(self, name: str) -> SharedRunDirs | None:
        """A slot's ``SharedRunDirs``, where this backend has any (v1)."""
        return None

    def kill_all(self, cg: Cgroup, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            pids = cg.pids()
            if not pids:
                return True
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)

    def _mkdirs(self, name: str, dirs: dict[str, str]) -> Cgroup:
        cg = Cgroup(self, name, dirs)
        try:
            for d in dict.fromkeys(dirs.values()):
                os.mkdir(d)
        except OSError as e:
            try:
                cg.remove()
            except CgroupError as e2:
                logger.debug("half-made cgroup %s not removed: %s", name, e2)
            raise CgroupError(f"cannot create cgroup {name}: {e}") from e
        return cg


class CgroupV1(CgroupBackend):
    version = 1

    def __init__(self, root: Path = CGROUP_ROOT) -> None:
        self.root = root
        self.controllers = [c for c in V1_CONTROLLERS if (root / c / "cgroup.procs").exists()]
        missing = [c for c in V1_REQUIRED if c not in self.controllers]
        if missing:
            raise CgroupError(f"cgroup v1 controllers missing: {', '.join(missing)}")
        self.has_memsw = (root / "memory" / "memory.memsw.limit_in_bytes").exists()
        # Co-mounted controllers share one hierarchy (systemd mounts "cpu,cpuacct" and links
        # cpu and cpuacct to it): resolve, so that such a pair maps to one directory.
        real = {c: os.path.realpath(root / c) for c in self.controllers}
        for d in set(real.values()):
            os.makedirs(f"{d}/{GROUP_NAME}", exist_ok=True)
        self._bases = {c: f"{real[c]}/{GROUP_NAME}/" for c in self.controllers}
        self._run_bases = {c: b for c, b in self._bases.items() if c not in V1_RUN_SKIP}

    def create(self, name: str, *, run: bool = False,
               leave_out: tuple[str, ...] = ()) -> Cgroup:
        bases = self._run_bases if run else self._bases
        return self._mkdirs(name, {c: b + name for c, b in bases.items() if c not in leave_out})

    def shared_run_dirs(self, name: str) -> SharedRunDirs:
        return SharedRunDirs(self, name)

    def limit(self, cg: Cgroup, limits: CgroupLimits, was: CgroupLimits | None) -> None:
        mem = cg.dirs["memory"]
        if was is None or was.memory_bytes != limits.memory_bytes:
            # memsw must stay >= the plain limit at every moment: lower the plain limit first,
            # raise memsw first (a fresh group is unlimited: plain first).
            files = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
            if was is not None and limits.memory_bytes > was.memory_bytes:
                files.reverse()
            for f in files:
                if f.startswith("memory.memsw") and not self.has_memsw:
                    continue  # without swap accounting the plain limit is all there is
                _write(f"{mem}/{f}", str(limits.memory_bytes))
        if "pids" in cg.dirs:  # else in the slot's SharedRunDirs, limited as the run begins
            self.limit_pids_cpu(cg.dirs, limits, was)

    @staticmethod
    def limit_pids_cpu(dirs: dict[str, str], limits: CgroupLimits,
                       was: CgroupLimits | None) -> None:
        if was is None or was.max_pids != limits.max_pids:
            _write(f"{dirs['pids']}/pids.max", str(limits.max_pids))
        if "cpu" in dirs:
            if was is None or was.cpus != limits.cpus:
                _write(f"{dirs['cpu']}/cpu.cfs_quota_us",
                       str(max(1000, int(limits.cpus * CFS_PERIOD_US))))
            if (was.weight if was is not None else 100) != limits.weight:  # fresh: 1024 shares
                _write(f"{dirs['cpu']}/cpu.shares", str(max(2, limits.weight * 1024 // 100)))

    def cpu_s(self, cg: Cgroup) -> float:
        if cg.shared is not None:
            return cg.shared.cpu_s()
        return int(_read_small(f"{cg.dirs['cpuacct']}/cpuacct.usage")) / 1e9

    def stats(self, cg: Cgroup, failcnt: bool) -> CgroupStats:
        mem = cg.dirs["memory"]
        peak = int(_read_small(f"{mem}/memory.memsw.max_usage_in_bytes" if self.has_memsw
                               else f"{mem}/memory.max_usage_in_bytes"))
        return CgroupStats(
            cpu_s=self.cpu_s(cg),
            peak_memory_bytes=peak,
            oom_killed=_kv(_read_small(f"{mem}/memory.oom_control")).get("oom_kill", 0) > 0,
            memory_failcnt=int(_read_small(f"{mem}/memory.failcnt")) if failcnt else 0,
        )

    def kill_all(self, cg: Cgroup, timeout_s: float) -> bool:
        # Freezing first stops a fork bomb from outrunning the kill loop (slot groups; a run
        # group needs no freezer, see the module docstring).
        fz = cg.dirs.get("freezer")
        if fz is not None:
            try:
                _write(f"{fz}/freezer.state", "FROZEN")
            except OSError as e:
                logger.debug("cannot freeze %s before killing it: %s", cg.name, e)
        try:
            for pid in cg.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            if fz is not None:
                try:
                    _write(f"{fz}/freezer.state", "THAWED")
                except OSError as e:
                    logger.debug("cannot thaw %s: %s", cg.name, e)
        return super().kill_all(cg, timeout_s)

    def leftover_groups(self) -> list[str]:
        out: list[str] = []
        for base in dict.fromkeys(self._bases.values()):
            if os.path.isdir(base):
                out.extend(str(p) for p in Path(base).iterdir() if p.is_dir())
        return out


class SharedRunDirs:
    """A slot's v1 run directories for pids, cpu and cpuacct, which its runs take turns in
    (module docstring): made once, with their files kept open."""

    def __init__(self, backend: CgroupV1, name: str) -> None:
        self.name = name
        self.dirs = {c: backend._run_bases[c] + name for c in V1_SHARED
                     if c in backend._run_bases}
        self._group = backend._mkdirs(name, self.dirs)  # removes what it made if one fails
        self.limits: CgroupLimits | None = None  # what the directories are set to
        self.procs_fds: list[int] = []
        self._usage = self._current = self._quota = -1
        try:
            self.procs_fds = self._group.procs_fds()
            self._usage = os.open(f"{self.dirs['cpuacct']}/cpuacct.usage",
                                  os.O_RDWR | os.O_CLOEXEC)
            self._current = os.open(f"{self.dirs['pids']}/pids.current",
                                    os.O_RDONLY | os.O_CLOEXEC)
            self._quota = (os.open(f"{self.dirs['cpu']}/cpu.cfs_quota_us",
                                   os.O_WRONLY | os.O_CLOEXEC) if "cpu" in self.dirs else -1)
        except OSError as e:
            self.close()
            raise CgroupError(f"cannot open the control files of cgroup {name}: {e}") from e

    def begin(self, limits: CgroupLimits) -> None:
        """Ready for the next run: empty (the last run's memory group is gone, and with it
        every process of that run: checked, as a run must never share its groups), with this
        run's limits, its CPU counter at zero."""
        left = int(os.pread(self._current, 32, 0))
        if left:
            raise CgroupError(f"cgroup {self.name} still holds {left} tasks of an earlier run")
        if self.limits != limits:
            CgroupV1.limit_pids_cpu(self.dirs, limits, self.limits)
            self.limits = limits
        if self._quota >= 0:
            # Writing the quota refills the group's CPU bandwidth and unthrottles it (the
            # kernel's tg_set_cfs_bandwidth): a run that spent its quota must not hold the
            # next one back until the period ends (up to 100 ms of its wall time).
            os.pwrite(self._quota, str(max(1000, int(limits.cpus * CFS_PERIOD_US))).encode(), 0)
        os.pwrite(self._usage, b"0", 0)

    def cpu_s(self) -> float:
        return int(os.pread(self._usage, 64, 0)) / 1e9

    def close(self) -> None:
        """Kill anything inside and remove the directories (CgroupError if they stay)."""
        for fd in (self._usage, self._current, self._quota):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._usage = self._current = self._quota = -1
        self.procs_fds = []
        self._group.remove()


class CgroupV2(CgroupBackend):
    """Unified hierarchy (``memory.peak`` needs Linux 5.19+)."""

    version = 2

    def __init__(self, root: Path = CGROUP_ROOT) -> None:
        self.root = root
        if not (root / "cgroup.controllers").exists():
            raise CgroupError(f"{root} is not a cgroup v2 mount")
        available = (root / "cgroup.controllers").read_text().split()
        missing = [c for c in V2_REQUIRED if c not in available]
        if missing:
            raise CgroupError(f"cgroup v2 controllers not available at {root}: {', '.join(missing)}")
        self.base = root / GROUP_NAME
        try:
            self._enable(root)
            self.base.mkdir(exist_ok=True)
            self._enable(self.base)
        except OSError as e:
            raise CgroupError(_delegation_error(root, self.base, e)) from e

    @staticmethod
    def _enable(d: Path) -> None:
        enabled = (d / "cgroup.subtree_control").read_text().split()
        todo = [c for c in V2_REQUIRED if c not in enabled]
        if todo:
            _write(str(d / "cgroup.subtree_control"), " ".join("+" + c for c in todo))

    def create(self, name: str, *, run: bool = False,
               leave_out: tuple[str, ...] = ()) -> Cgroup:
        return self._mkdirs(name, {"unified": str(self.base / name)})  # one directory: no sharing

    def limit(self, cg: Cgroup, limits: CgroupLimits, was: CgroupLimits | None) -> None:
        d = cg.dirs["unified"]
        if was is None:
            if not os.path.exists(f"{d}/memory.peak"):
                raise CgroupError(f"{d} has no memory.peak: peak memory needs Linux 5.19+")
            if os.path.exists(f"{d}/memory.swap.max"):
                _write(f"{d}/memory.swap.max", "0")
        if was is None or was.memory_bytes != limits.memory_bytes:
            _write(f"{d}/memory.max", str(limits.memory_bytes))
        if was is None or was.max_pids != limits.max_pids:
            _write(f"{d}/pids.max", str(limits.max_pids))
        if was is None or was.cpus != limits.cpus:
            _write(f"{d}/cpu.max",
                   f"{max(1000, int(limits.cpus * CFS_PERIOD_US))} {CFS_PERIOD_US}")
        if (was.weight if was is not None else 100) != limits.weight:  # fresh: weight 100
            _write(f"{d}/cpu.weight", str(limits.weight))

    def cpu_s(self, cg: Cgroup) -> float:
        return _kv(_read_small(f"{cg.dirs['unified']}/cpu.stat")).get("usage_usec", 0) / 1e6

    def stats(self, cg: Cgroup, failcnt: bool) -> CgroupStats:
        d = cg.dirs["unified"]
        ev = _kv(_read_small(f"{d}/memory.events"))  # one file: the failure count costs nothing
        return CgroupStats(
            cpu_s=self.cpu_s(cg),
            peak_memory_bytes=int(_read_small(f"{d}/memory.peak")),
            oom_killed=ev.get("oom_kill", 0) > 0,
            memory_failcnt=ev.get("max", 0),
        )

    def leftover_groups(self) -> list[str]:
        return [str(p) for p in self.base.iterdir() if p.is_dir()] if self.base.is_dir() else []


def _delegation_error(root: Path, base: Path, e: OSError) -> str:
    """Why the controllers could not be handed down to ``base``, and what to do about it."""
    what = f"cannot delegate {', '.join(V2_REQUIRED)} to {base}: {e}"
    if e.errno == errno.EBUSY:
        # cgroup v2's no-internal-processes rule: a non-root group that holds processes cannot
        # enable controllers for its children. Inside a container with its own cgroup
        # namespace, the container's root group is such a group and holds every process.
        return (f"{what}. {root} holds processes (typical inside a container with its own "
                "cgroup namespace), and cgroup v2 lets a group that holds processes give no "
                f"controller to child groups. Move them into a leaf group first: mkdir "
                f"{root}/init && for p in $(cat {root}/cgroup.procs); do echo $p > "
                f"{root}/init/cgroup.procs; done. Or run sandloop as a systemd unit with "
                "Delegate=yes")
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (f"{what}. The cgroup file system is not writable here (an unprivileged "
                "container?): give sandloop a writable cgroup mount (e.g. a privileged "
                "container) and run it as root")
    return what


def detect(root: Path = CGROUP_ROOT) -> CgroupBackend:
    """The best backend this host offers: v2 when it delegates memory+pids+cpu, else v1."""
    errors = []
    for cls in (CgroupV2, CgroupV1):
        try:
            return cls(root)
        except (CgroupError, OSError) as e:
            errors.append(f"v{cls.version}: {e}")
    raise CgroupError("; ".join(errors))


def sweep_leftovers(backend: CgroupBackend, alive: set[str]) -> int:
    """Remove groups whose pool process is gone, killing what is still inside."""
    n = 0
    for d in backend.leftover_groups():
        name = os.path.basename(d)
        pid_txt = name[1:].split("x", 1)[0] if name.startswith("p") else ""
        if not pid_txt.isdigit() or os.path.exists(f"/proc/{pid_txt}") or name in alive:
            continue
        cg = Cgroup(backend, name, {"x": d})
        try:
            backend.kill_all(cg, 1.0)
            os.rmdir(d)
            n += 1
        except (CgroupError, OSError) as e:
            logger.debug("cgroup %s of a dead pool not swept: %s", d, e)
    return n
