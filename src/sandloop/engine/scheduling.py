"""Pure scheduling logic: token buckets, a weighted-fair priority queue, resource admission.

Nothing here does I/O, reads a clock or knows about asyncio: callers pass ``now``. Each class is
O(1) or O(log clients) per operation, because the engine calls them on its dispatch hot path
(≥ 10,000 jobs/s).
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from sandloop.errors import EngineError, InputError

__all__ = [
    "Admission",
    "Demand",
    "FairQueue",
    "QueueFull",
    "ResourceTooLarge",
    "TokenBucket",
]


class QueueFull(EngineError, RuntimeError):
    """The engine's queue holds ``max_queued`` jobs already (backpressure).

    Wait for results before submitting more, submit with ``block=True`` (the default for
    ``Engine.run``/``stream``) to wait for room, or raise ``Engine(max_queued=...)``.
    """


class ResourceTooLarge(EngineError, InputError):
    """A job declares more memory or CPU than the whole engine may ever grant one job."""


class TokenBucket:
    """A token bucket: ``rate`` tokens per second, at most ``burst`` stored.

    ``take`` either takes the tokens (returns 0.0) or takes nothing and returns how long until
    it could; callers decide whether to wait or reject.
    """

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0 tokens/s, got {rate}")
        if burst < 1:
            raise ValueError(f"burst must be >= 1 token, got {burst}")
        self.rate = float(rate)
        self.burst = float(burst)
        self.tokens = float(burst)  # a new client may use its whole burst at once
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def take(self, now: float, n: float = 1.0) -> float:
        """Take ``n`` tokens if there are enough (returns 0.0); else the seconds to wait."""
        if n > self.burst:
            raise ValueError(f"cannot take {n} tokens from a bucket of burst {self.burst}")
        self._refill(now)
        if self.tokens >= n:
            self.tokens -= n
            return 0.0
        return (n - self.tokens) / self.rate

    def available(self, now: float) -> float:
        """Tokens available at ``now``."""
        self._refill(now)
        return self.tokens


class Demand(Protocol):
    """What the queue and admission need to know about a job."""

    priority: int
    client: str
    memory_mb: int
    cpus: float


T = TypeVar("T", bound=Demand)


class _Lane(Generic[T]):
    """One client's FIFO of jobs at one priority, with its virtual time (work done / weight)."""

    __slots__ = ("client", "entry", "items", "vtime")

    def __init__(self, client: str) -> None:
        self.client = client
        self.items: deque[T] = deque()
        self.vtime = 0.0
        self.entry = 0  # sequence number of this lane's live heap entry (older ones are stale)


class _Level(Generic[T]):
    """All lanes of one priority; a heap picks the lane with the least virtual time."""

    __slots__ = ("clock", "heap", "lanes", "size")

    def __init__(self) -> None:
        self.lanes: dict[str, _Lane[T]] = {}
        self.heap: list[tuple[float, int, _Lane[T]]] = []
        self.clock = 0.0  # virtual time of the last dispatch: where newly active lanes start
        self.size = 0


class FairQueue(Generic[T]):
    """A bounded queue: strict priority between levels, weighted fairness between clients.

    Within a priority level, the next job comes from the client with the least virtual time
    (start-time fair queuing): each dispatch advances the client's clock by ``1 / weight``, and a
    client that was idle restarts at the level's current clock, so it gets no credit for idling
    and cannot starve others with a burst. Each client's own jobs stay FIFO.

    ``pop(fits)`` is resource-aware: when the fairest job does not fit (``fits`` is False), a later
    job that does may go ahead (backfill), but at most ``max_bypass`` times for the same blocked
    job; after that nothing is backfilled until it fits, so large jobs are never starved.
    """

    def __init__(self, capacity: int, *, max_bypass: int = 16, scan_limit: int = 32) -> None:
        if capacity < 1:
            raise ValueError("queue capacity must be >= 1")
        self.capacity = capacity
        self.max_bypass = max_bypass
        self.scan_limit = scan_limit
        self._levels: dict[int, _Level[T]] = {}
        self._priorities: list[int] = []  # ascending; scanned from the end (highest first)
        self._weights: dict[str, float] = {}
        self._size = 0
        self._seq = 0
        self._blocked: T | None = None
        self._bypassed = 0

    def __len__(self) -> int:
        return self._size

    def set_weight(self, client: str, weight: float) -> None:
        """Share of dispatches ``client`` gets relative to others at the same priority."""
        if weight <= 0:
            raise ValueError(f"client weight must be > 0, got {weight}")
        self._weights[client] = float(weight)

    def push(self, item: T) -> None:
        """Append ``item`` to its client's lane; raises QueueFull at capacity."""
        if self._size >= self.capacity:
            raise QueueFull(
                f"engine queue is full ({self.capacity} jobs waiting); wait for results or "
                "raise Engine(max_queued=...)"
            )
        self._lane(item).items.append(item)
        self._size += 1

    def push_front(self, item: T) -> None:
        """Put ``item`` back at the head of its lane (a retry); ignores capacity, because the
        job was already admitted once and must not be lost to backpressure."""
        self._lane(item).items.appendleft(item)
        self._size += 1

    def _lane(self, item: T) -> _Lane[T]:
        level = self._levels.get(item.priority)
        if level is None:
            level = self._levels[item.priority] = _Level()
            insort(self._priorities, item.priority)
        lane = level.lanes.get(item.client)
        if lane is None:
            lane = level.lanes[item.client] = _Lane(item.client)
        if not lane.items:
            # Becoming active: no credit for the time it was idle.
            lane.vtime = max(lane.vtime, level.clock)
            self._schedule(level, lane)
        level.size += 1
        return lane

    def _schedule(self, level: _Level[T], lane: _Lane[T]) -> None:
        self._seq += 1
        lane.entry = self._seq
        heapq.heappush(level.heap, (lane.vtime, self._seq, lane))

    def _take(self, level: _Level[T], lane: _Lane[T], item: T) -> T:
        if lane.items[0] is item:
            lane.items.popleft()
        else:  # pragma: no cover - pop only ever takes lane heads
            lane.items.remove(item)
        level.size -= 1
        self._size -= 1
        level.clock = lane.vtime
        lane.vtime += 1.0 / self._weights.get(lane.client, 1.0)
        if lane.items:
            self._schedule(level, lane)
        else:
            lane.entry = 0
        return item

    @staticmethod
    def _top(level: _Level[T]) -> _Lane[T] | None:
        heap = level.heap
        while heap:
            _, seq, lane = heap[0]
            if seq == lane.entry and lane.items:
                return lane
            heapq.heappop(heap)  # stale entry
        return None

    def peek(self) -> T | None:
        """The job ``pop`` would return if resources allowed it."""
        for p in reversed(self._priorities):
            level = self._levels[p]
            if level.size:
                lane = self._top(level)
                if lane is not None:
                    return lane.items[0]
        return None

    def pop(self, fits: Callable[[T], bool] | None = None) -> T | None:
        """Remove and return the next job that ``fits`` (all fit when None), or None."""
        for p in reversed(self._priorities):
            level = self._levels[p]
            if not level.size:
                continue
            lane = self._top(level)
            if lane is None:
                continue
            head = lane.items[0]
            if fits is None or fits(head):
                heapq.heappop(level.heap)
                lane.entry = 0
                if head is self._blocked:
                    self._blocked, self._bypassed = None, 0
                return self._take(level, lane, head)
            return self._backfill(p, head, fits)
        return None

    def _backfill(self, priority: int, blocked: T, fits: Callable[[T], bool]) -> T | None:
        if blocked is not self._blocked:
            self._blocked, self._bypassed = blocked, 0
        if self._bypassed >= self.max_bypass:
            return None  # reserve: the blocked job goes next, whatever waits
        scanned = 0
        for p in reversed(self._priorities):
            if p > priority:
                continue
            level = self._levels[p]
            if not level.size:
                continue
            best: tuple[float, _Lane[T]] | None = None
            for vt, seq, lane in level.heap:
                if seq != lane.entry or not lane.items or lane.items[0] is blocked:
                    continue
                scanned += 1
                if fits(lane.items[0]) and (best is None or vt < best[0]):
                    best = (vt, lane)
                if scanned >= self.scan_limit:
                    break
            if best is not None:
                lane = best[1]
                self._bypassed += 1
                # Its heap entry becomes stale; _take pushes a fresh one if it has more jobs.
                lane.entry = 0
                return self._take(level, lane, lane.items[0])
            if scanned >= self.scan_limit:
                break
        return None

    def drain(self) -> list[T]:
        """Remove and return every queued job (engine shutdown)."""
        out: list[T] = []
        for level in self._levels.values():
            for lane in level.lanes.values():
                out.extend(lane.items)
                lane.items.clear()
                lane.entry = 0
            level.heap.clear()
            level.size = 0
        self._size = 0
        self._blocked, self._bypassed = None, 0
        return out


class Admission:
    """Admits jobs while their declared memory and CPU, and the slots they take, are free.

    A slot is one concurrent sandbox run. ``cpus`` is the CPU budget (cores): summing declared
    ``Limits.cpus`` against it keeps CPU-bound runs from being starved of the CPU time their
    wall-time limits assume, while runs that declare less than a core pack more densely.

    A reserve keeps high-priority jobs (``priority >= reserve_priority``) from waiting behind a
    saturating flood: ordinary jobs may use ``slots - reserve_slots`` slots and ``cpus``; high-
    priority jobs may use every slot and ``cpus + reserve_cpus`` (a brief, bounded overcommit
    instead of waiting for a long low-priority run to end: runs cannot be preempted).
    """

    __slots__ = ("_reserve_asked", "cpus", "free_cpus", "free_memory_mb", "free_slots",
                 "job_cpus", "job_memory_mb", "memory_mb", "reserve_cpus", "reserve_priority",
                 "reserve_slots", "slots")

    def __init__(self, slots: int, memory_mb: int, cpus: float, *, reserve_slots: int = 0,
                 reserve_cpus: float = 0.0, reserve_priority: int = 100) -> None:
        if slots < 1 or memory_mb < 1 or cpus <= 0:
            raise ValueError(f"admission needs slots >= 1, memory_mb >= 1, cpus > 0 "
                             f"(got {slots}, {memory_mb}, {cpus})")
        if not 0 <= reserve_slots < slots or reserve_cpus < 0:
            raise ValueError(f"reserve_slots must be in [0, slots) and reserve_cpus >= 0 "
                             f"(got {reserve_slots}, {reserve_cpus})")
        self.slots = slots
        self.memory_mb = memory_mb
        self.cpus = float(cpus)
        self.reserve_slots = reserve_slots
        self.reserve_cpus = float(reserve_cpus)
        self.reserve_priority = reserve_priority
        self.free_slots = slots
        self.free_memory_mb = memory_mb
        self.free_cpus = float(cpus)
        # The most one job may declare: the totals on one machine; one node's share on a
        # cluster, where a job runs on a single node (see ``resize``).
        self.job_memory_mb = memory_mb
        self.job_cpus = float(cpus)
        self._reserve_asked = reserve_slots

    def check(self, job: Demand) -> None:
        """Raise ResourceTooLarge when ``job`` could never be admitted."""
        if job.memory_mb > self.job_memory_mb:
            raise ResourceTooLarge(
                f"the job declares {job.memory_mb} MiB but the engine grants at most "
                f"{self.job_memory_mb} MiB to one job; lower Limits.memory_mb, raise "
                "Engine(memory_mb=...), or (on a cluster) add a node with more memory")
        if job.cpus > self.job_cpus + 1e-9:
            raise ResourceTooLarge(
                f"the job declares {job.cpus} CPUs but the engine grants at most "
                f"{self.job_cpus} to one job; lower Limits.cpus, raise Engine(cpus=...), or "
                "(on a cluster) add a node with more cores")

    def fits(self, job: Demand) -> bool:
        """Whether ``job`` can start now."""
        if job.memory_mb > self.free_memory_mb:
            return False
        if job.priority >= self.reserve_priority:
            return self.free_slots > 0 and job.cpus <= self.free_cpus + self.reserve_cpus + 1e-9
        return (self.free_slots > self.reserve_slots
                and job.cpus <= self.free_cpus + 1e-9)

    def acquire(self, job: Demand) -> None:
        """Take ``job``'s resources (call only when ``fits``)."""
        self.free_slots -= 1
        self.free_memory_mb -= job.memory_mb
        self.free_cpus -= job.cpus

    def release(self, job: Demand, *, cpus: bool = True) -> None:
        """Give back what ``acquire`` took (its CPU too unless ``release_cpus`` already did)."""
        self.free_slots += 1
        self.free_memory_mb += job.memory_mb
        if cpus:
            self.free_cpus += job.cpus

    def release_cpus(self, job: Demand) -> None:
        """Give back ``job``'s CPU early: its program has ended and only cleanup is left, so
        the next job's program can run meanwhile without sharing a core with it."""
        self.free_cpus += job.cpus

    def resize(self, slots: int, memory_mb: int, cpus: float, *, job_memory_mb: int,
               job_cpus: float, reserve_slots: int | None = None) -> None:
        """Change the totals while jobs hold resources (a cluster's nodes joined or left).

        What running jobs hold stays held: free amounts move by the change in totals and may go
        negative (nothing is admitted until enough running jobs end). ``job_memory_mb`` and
        ``job_cpus`` bound one job (the largest node's). With no slots at all, jobs wait.
        ``reserve_slots``: a new reserve (default: the one asked at creation), kept below
        ``slots``.
        """
        if reserve_slots is not None:
            self._reserve_asked = reserve_slots
        self.free_slots += slots - self.slots
        self.free_memory_mb += memory_mb - self.memory_mb
        self.free_cpus += float(cpus) - self.cpus
        self.slots, self.memory_mb, self.cpus = slots, memory_mb, float(cpus)
        self.job_memory_mb, self.job_cpus = job_memory_mb, float(job_cpus)
        self.reserve_slots = min(self._reserve_asked, max(0, slots - 1))

    @property
    def idle(self) -> bool:
        return self.free_slots == self.slots
