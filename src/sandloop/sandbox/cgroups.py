"""Per-slot control groups: memory (+swap), pids and CPU limits, and per-run measurements.

Each slot owns one group (one directory per v1 controller, or one v2 directory) that its zygote
joins at start; every run's child is then born inside it, so no process is ever migrated
between groups on the hot path (a migration takes the kernel's cgroup threadgroup lock, which
measured 1-11 ms per run here). Between runs the slot is idle, so the group is re-armed: limits
set to ``zygote baseline + run limit``, the peak counter reset, CPU and OOM counters read as
baselines. The zygote itself is protected from the OOM killer (oom_score_adj -1000) and from
the kill sweep, so a memory bomb always kills the run, never the slot.

Two backends with one interface: cgroup v2 (unified) where the host delegates the memory, pids
and cpu controllers, else cgroup v1. Groups are removed when the slot closes; groups left by a
crashed pool are swept at the next start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_NAME = "sandloop"
V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct", "freezer")
V1_REQUIRED = ("memory", "pids", "cpuacct")
V2_REQUIRED = ("memory", "pids", "cpu")
CFS_PERIOD_US = 100_000


class CgroupError(RuntimeError):
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
    memory_failcnt: int
    pids_limit_hit: bool


@dataclass(frozen=True)
class RunBaseline:
    memory_bytes: int
    cpu_ns: int
    oom_kills: int
    failcnt: int
    pids_max_events: int


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read_fresh(path: str) -> str:
    """Read through a new open file: v1 caches an open ``cgroup.procs``'s pid list for up to
    a second, so a re-read of a kept file could miss a process that just appeared."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


def _kv(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


class SlotCgroup:
    """The group(s) of one slot. Not thread-safe: a slot runs one step at a time."""

    def __init__(self, backend: CgroupBackend, name: str, dirs: dict[str, str]) -> None:
        self.backend = backend
        self.name = name
        self.dirs = dirs
        self._set: dict[str, str] = {}
        # Control files stay open for the slot's life: a run reads about ten of them, and
        # pread/pwrite at offset 0 regenerate their contents without an open/close each.
        self._fds: dict[tuple[str, int], int] = {}

    def _fd(self, path: str, mode: int) -> int:
        fd = self._fds.get((path, mode))
        if fd is None:
            fd = self._fds[path, mode] = os.open(path, mode | os.O_CLOEXEC)
        return fd

    def read(self, path: str) -> str:
        return os.pread(self._fd(path, os.O_RDONLY), 65536, 0).decode()

    def write(self, path: str, value: str, mode: int = os.O_WRONLY) -> None:
        os.pwrite(self._fd(path, mode), value.encode(), 0)

    def close_files(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    @property
    def procs_files(self) -> list[str]:
        """Files a process writes ``0`` to in order to join every controller of this slot."""
        return [os.path.join(d, "cgroup.procs") for d in dict.fromkeys(self.dirs.values())]

    def _set_once(self, path: str, value: str) -> None:
        if self._set.get(path) != value:
            self.write(path, value)
            self._set[path] = value

    def pids(self, *, all_controllers: bool = False) -> list[int]:
        """Processes in the group. Every process of a slot is in all of its controllers'
        groups, so one read suffices; the sweep at removal reads them all."""
        dirs = list(dict.fromkeys(self.dirs.values()))
        seen: set[int] = set()
        for d in dirs if all_controllers else dirs[:1]:
            with contextlib.suppress(FileNotFoundError):
                seen.update(int(x) for x in _read_fresh(os.path.join(d, "cgroup.procs")).split())
        return sorted(seen)

    def arm(self, limits: CgroupLimits, keep: int) -> RunBaseline:
        """Prepare for a run: limits relative to what the zygote already uses."""
        return self.backend.arm(self, limits, keep)

    def stats(self, base: RunBaseline) -> CgroupStats:
        return self.backend.stats(self, base)

    def kill_all(self, exclude: int | None, timeout_s: float = 2.0) -> bool:
        """SIGKILL every process in the group but ``exclude`` (the zygote); True when done."""
        return self.backend.kill_all(self, exclude, timeout_s)

    def remove(self) -> None:
        if self.pids(all_controllers=True) and not self.kill_all(None):
            raise CgroupError(f"cgroup {self.name} still has processes {self.pids()}")
        self.close_files()
        for d in dict.fromkeys(self.dirs.values()):
            for _ in range(100):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last exiting task is being released
                    time.sleep(0.005)
            else:
                raise CgroupError(f"cannot remove cgroup {d}")


class CgroupBackend:
    version = 0

    def create(self, name: str) -> SlotCgroup:
        raise NotImplementedError

    def arm(self, cg: SlotCgroup, limits: CgroupLimits, keep: int) -> RunBaseline:
        raise NotImplementedError

    def stats(self, cg: SlotCgroup, base: RunBaseline) -> CgroupStats:
        raise NotImplementedError

    def leftover_groups(self) -> list[str]:
        """Slot groups left by a crashed pool (swept at start-up)."""
        raise NotImplementedError

    def kill_all(self, cg: SlotCgroup, exclude: int | None, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            pids = [p for p in cg.pids() if p != exclude]
            if not pids:
                return True
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)


class CgroupV1(CgroupBackend):
    version = 1

    def __init__(self, root: Path = CGROUP_ROOT) -> None:
        self.root = root
        self.controllers = [c for c in V1_CONTROLLERS if (root / c / "cgroup.procs").exists()]
        missing = [c for c in V1_REQUIRED if c not in self.controllers]
        if missing:
            raise CgroupError(f"cgroup v1 controllers missing: {', '.join(missing)}")
        self.has_memsw = (root / "memory" / "memory.memsw.limit_in_bytes").exists()
        for c in self.controllers:
            (root / c / GROUP_NAME).mkdir(exist_ok=True)

    def create(self, name: str) -> SlotCgroup:
        dirs = {c: str(self.root / c / GROUP_NAME / name) for c in self.controllers}
        try:
            for d in dirs.values():
                os.mkdir(d)
        except OSError as e:
            SlotCgroup(self, name, dirs).remove()
            raise CgroupError(f"cannot create cgroup {name}: {e}") from e
        return SlotCgroup(self, name, dirs)

    def arm(self, cg: SlotCgroup, limits: CgroupLimits, keep: int) -> RunBaseline:
        mem = cg.dirs["memory"]
        usage = int(cg.read(f"{mem}/memory.memsw.usage_in_bytes" if self.has_memsw
                            else f"{mem}/memory.usage_in_bytes"))
        # Round the baseline up so that small drifts of the zygote's usage do not rewrite limits.
        base = -(-usage // (4 << 20)) * (4 << 20)
        limit = str(base + limits.memory_bytes)
        lim_file, sw_file = f"{mem}/memory.limit_in_bytes", f"{mem}/memory.memsw.limit_in_bytes"
        old = int(cg._set.get(lim_file, str(1 << 62)))
        # memsw must stay >= the plain limit at every moment: order the writes accordingly.
        order = [lim_file, sw_file] if int(limit) < old else [sw_file, lim_file]
        for f in order:
            if f == sw_file and not self.has_memsw:
                continue  # without swap accounting the plain limit is all there is
            cg._set_once(f, limit)
        cg._set_once(f"{cg.dirs['pids']}/pids.max", str(limits.max_pids + keep))
        if "cpu" in cg.dirs:
            cg._set_once(f"{cg.dirs['cpu']}/cpu.cfs_quota_us",
                         str(max(1000, int(limits.cpus * CFS_PERIOD_US))))
            cg._set_once(f"{cg.dirs['cpu']}/cpu.shares", str(max(2, limits.weight * 1024 // 100)))
        cg.write(f"{mem}/memory.memsw.max_usage_in_bytes" if self.has_memsw
                 else f"{mem}/memory.max_usage_in_bytes", "0")
        return RunBaseline(
            memory_bytes=usage,
            cpu_ns=int(cg.read(f"{cg.dirs['cpuacct']}/cpuacct.usage")),
            oom_kills=_kv(cg.read(f"{mem}/memory.oom_control")).get("oom_kill", 0),
            failcnt=int(cg.read(f"{mem}/memory.failcnt")),
            pids_max_events=self._pids_events(cg),
        )

    @staticmethod
    def _pids_events(cg: SlotCgroup) -> int:
        try:
            return _kv(cg.read(f"{cg.dirs['pids']}/pids.events")).get("max", 0)
        except FileNotFoundError:
            return 0

    def stats(self, cg: SlotCgroup, base: RunBaseline) -> CgroupStats:
        mem = cg.dirs["memory"]
        peak = int(cg.read(f"{mem}/memory.memsw.max_usage_in_bytes" if self.has_memsw
                           else f"{mem}/memory.max_usage_in_bytes"))
        return CgroupStats(
            cpu_s=(int(cg.read(f"{cg.dirs['cpuacct']}/cpuacct.usage")) - base.cpu_ns) / 1e9,
            peak_memory_bytes=max(0, peak - base.memory_bytes),
            oom_killed=_kv(cg.read(f"{mem}/memory.oom_control")).get("oom_kill", 0) > base.oom_kills,
            memory_failcnt=int(cg.read(f"{mem}/memory.failcnt")) - base.failcnt,
            pids_limit_hit=self._pids_events(cg) > base.pids_max_events,
        )

    def kill_all(self, cg: SlotCgroup, exclude: int | None, timeout_s: float) -> bool:
        # Freezing first stops a fork bomb from outrunning the kill loop; only possible when
        # the zygote is not among the victims' group (it would be frozen too, harmlessly).
        fz = cg.dirs.get("freezer")
        if fz is not None:
            with contextlib.suppress(OSError):
                cg.write(f"{fz}/freezer.state", "FROZEN")
        try:
            for pid in cg.pids():
                if pid != exclude:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        finally:
            if fz is not None:
                with contextlib.suppress(OSError):
                    cg.write(f"{fz}/freezer.state", "THAWED")
        return super().kill_all(cg, exclude, timeout_s)

    def leftover_groups(self) -> list[str]:
        out: list[str] = []
        for c in self.controllers:
            base = self.root / c / GROUP_NAME
            if base.is_dir():
                out.extend(str(p) for p in base.iterdir() if p.is_dir())
        return out


class CgroupV2(CgroupBackend):
    """Unified hierarchy. Needs Linux 6.12+ for a resettable ``memory.peak`` (per-fd)."""

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
            raise CgroupError(f"cannot delegate {', '.join(V2_REQUIRED)} to {self.base}: {e}") from e

    @staticmethod
    def _enable(d: Path) -> None:
        enabled = (d / "cgroup.subtree_control").read_text().split()
        todo = [c for c in V2_REQUIRED if c not in enabled]
        if todo:
            _write(str(d / "cgroup.subtree_control"), " ".join("+" + c for c in todo))

    def create(self, name: str) -> SlotCgroup:
        d = str(self.base / name)
        try:
            os.mkdir(d)
            if os.path.exists(f"{d}/memory.swap.max"):
                _write(f"{d}/memory.swap.max", "0")
            cg = SlotCgroup(self, name, {"unified": d})
            cg._fd(f"{d}/memory.peak", os.O_RDWR)  # its peak is reset per open file
        except OSError as e:
            with contextlib.suppress(OSError):
                os.rmdir(d)
            raise CgroupError(f"cannot set up cgroup {d} (needs memory.peak, Linux 6.12+): {e}") from e
        return cg

    def arm(self, cg: SlotCgroup, limits: CgroupLimits, keep: int) -> RunBaseline:
        d = cg.dirs["unified"]
        usage = int(cg.read(f"{d}/memory.current"))
        base = -(-usage // (4 << 20)) * (4 << 20)
        cg._set_once(f"{d}/memory.max", str(base + limits.memory_bytes))
        cg._set_once(f"{d}/pids.max", str(limits.max_pids + keep))
        cg._set_once(f"{d}/cpu.max", f"{max(1000, int(limits.cpus * CFS_PERIOD_US))} {CFS_PERIOD_US}")
        cg._set_once(f"{d}/cpu.weight", str(limits.weight))
        # Resets the peak as seen through this open file only (hence one fd for both).
        cg.write(f"{d}/memory.peak", "reset", os.O_RDWR)
        ev = _kv(cg.read(f"{d}/memory.events"))
        return RunBaseline(
            memory_bytes=usage,
            cpu_ns=_kv(cg.read(f"{d}/cpu.stat")).get("usage_usec", 0) * 1000,
            oom_kills=ev.get("oom_kill", 0),
            failcnt=ev.get("max", 0),
            pids_max_events=_kv(cg.read(f"{d}/pids.events")).get("max", 0),
        )

    def stats(self, cg: SlotCgroup, base: RunBaseline) -> CgroupStats:
        d = cg.dirs["unified"]
        ev = _kv(cg.read(f"{d}/memory.events"))
        peak = int(os.pread(cg._fd(f"{d}/memory.peak", os.O_RDWR), 64, 0).decode())
        return CgroupStats(
            cpu_s=(_kv(cg.read(f"{d}/cpu.stat")).get("usage_usec", 0) * 1000 - base.cpu_ns) / 1e9,
            peak_memory_bytes=max(0, peak - base.memory_bytes),
            oom_killed=ev.get("oom_kill", 0) > base.oom_kills,
            memory_failcnt=ev.get("max", 0) - base.failcnt,
            pids_limit_hit=_kv(cg.read(f"{d}/pids.events")).get("max", 0) > base.pids_max_events,
        )

    def leftover_groups(self) -> list[str]:
        return [str(p) for p in self.base.iterdir() if p.is_dir()] if self.base.is_dir() else []


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
    """Remove slot groups whose pool process is gone, killing what is still inside."""
    n = 0
    for d in backend.leftover_groups():
        name = os.path.basename(d)
        pid_txt = name[1:].split("x", 1)[0] if name.startswith("p") else ""
        if not pid_txt.isdigit() or os.path.exists(f"/proc/{pid_txt}") or name in alive:
            continue
        cg = SlotCgroup(backend, name, {"x": d})
        with contextlib.suppress(CgroupError, OSError):
            backend.kill_all(cg, None, 1.0)
            cg.close_files()
            os.rmdir(d)
            n += 1
    return n
