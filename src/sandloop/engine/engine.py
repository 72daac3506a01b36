"""The engine: one async entry point that schedules many sandbox runs and multi-turn sessions.

Jobs enter a bounded, weighted-fair priority queue (``scheduling.FairQueue``) after their client's
token bucket lets them; the dispatcher starts the next job whenever a slot and the job's declared
memory and CPU are free (``scheduling.Admission``). Dispatch is synchronous and event-driven (on
every submission and completion), never a polling loop, so its cost per job is a few dict and
heap operations. Infrastructure failures are retried with exponential backoff; program failures
are results. With a journal, jobs and outcomes are durable and idempotent by key.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Hashable,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from sandloop import _extensions
from sandloop.engine.backends import Backend, ElasticBackend, LocalBackend, declared_memory_mb
from sandloop.engine.errors import (
    DeadlineExceeded,
    EngineClosed,
    IdempotencyConflict,
    RateLimited,
    SessionFull,
    SessionLimit,
    SessionLost,
)
from sandloop.engine.journal import Journal, content_digest, job_key, model_from_json, model_json
from sandloop.engine.repeat import RepeatedResult, aggregate
from sandloop.engine.retry import RetryPolicy
from sandloop.engine.scheduling import Admission, FairQueue, QueueFull, TokenBucket
from sandloop.engine.session import Session
from sandloop.errors import InputError
from sandloop.sandbox.graph import Graph, GraphResult, Node, execute_nodes
from sandloop.sandbox.models import ExecResult, Limits, Program, Status, check_relative_path
from sandloop.sandbox.pool import SandboxPool, WorkspaceFull, WorkspaceLost, workspace_mb
from sandloop.sandbox.slot import DEFAULT_PRELOAD

if TYPE_CHECKING:
    from sandloop.tasks.repo import RepoTask

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Resumption(Generic[T]):
    """What :meth:`Engine.resume` and :meth:`Engine.resume_graphs` return: an async iterator of
    ``(key, result)`` as each job ends (``async for key, r in engine.resume()``), which can also
    be awaited for the whole list once every job has ended (``done = await engine.resume()``)."""

    __slots__ = ("_items",)

    def __init__(self, items: AsyncGenerator[T, None]) -> None:
        self._items = items

    def __aiter__(self) -> Resumption[T]:
        return self

    async def __anext__(self) -> T:
        return await self._items.__anext__()

    def __await__(self) -> Generator[Any, None, list[T]]:
        return self._all().__await__()

    async def _all(self) -> list[T]:
        async with contextlib.aclosing(self._items) as items:
            return [x async for x in items]

    async def aclose(self) -> None:
        """Stop early: what is still running goes on in the engine, nothing more is yielded."""
        await self._items.aclose()

__all__ = ["PRIORITIES", "ClientPolicy", "Engine", "EngineStats", "JobHandle"]

# Named priorities (higher runs first); any int works too.
PRIORITIES: dict[str, int] = {"eval": 100, "interactive": 50, "train": 0, "background": -100}
EVAL_CPU_WEIGHT = 1000  # 10x a default run's share of a contended core

ProgramItem = Program | tuple[Program, Limits]


# Integer priorities are bounded: the journal stores them as SQLite integers (64-bit), and a
# priority no store can hold must be the caller's error, not a failed job.
PRIORITY_MIN, PRIORITY_MAX = -(1 << 31), (1 << 31) - 1


def _priority(p: int | str) -> int:
    if isinstance(p, int):
        if not PRIORITY_MIN <= p <= PRIORITY_MAX:
            raise ValueError(f"priority {p} is out of range; use an int from {PRIORITY_MIN} to "
                             f"{PRIORITY_MAX} or one of {sorted(PRIORITIES)}")
        return p
    try:
        return PRIORITIES[p]
    except KeyError:
        raise ValueError(f"unknown priority {p!r}; use an int or one of {sorted(PRIORITIES)}") \
            from None


def _host_memory_mb() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError) as e:
        logger.debug("cannot read the host's memory size: %s", e)
    return 4096


@dataclass
class _Declared:
    """What a job would declare to admission (a Demand), without making the job."""

    priority: int
    client: str
    memory_mb: int
    cpus: float


@dataclass
class ClientPolicy:
    """How one client (a training job, an eval, a user) is treated.

    ``weight``: its share of dispatches relative to other clients at the same priority.
    ``rate``/``burst``: a token bucket (jobs per second, jobs at once); None = unlimited.
    ``on_limit``: ``"wait"`` delays submissions until tokens refill; ``"reject"`` raises
    ``RateLimited`` with the time to wait.
    """

    weight: float = 1.0
    rate: float | None = None
    burst: float | None = None
    on_limit: Literal["wait", "reject"] = "wait"


@dataclass
class EngineStats:
    """Counters since start, and the current queue and run state."""

    submitted: int = 0
    completed: int = 0
    from_journal: int = 0
    executed: int = 0  # backend calls, retries included
    retried: int = 0
    infra_failures: int = 0  # jobs whose result is sandbox_error after every retry
    deadline_exceeded: int = 0
    rejected: int = 0
    queued: int = 0
    running: int = 0
    sessions: int = 0
    sessions_reaped: int = 0


class _Job:
    """One unit of scheduling (kept small: 100,000 of them may wait at once)."""

    __slots__ = ("attempts", "client", "cpus", "deadline", "digest", "future", "id", "key",
                 "limits", "memory_mb", "priority", "program", "task", "timer", "waiters",
                 "workspace")

    def __init__(self, jid: int, program: Program, limits: Limits, priority: int, client: str,
                 memory_mb: int, future: asyncio.Future[ExecResult]) -> None:
        self.id = jid
        self.program = program
        self.limits = limits
        self.priority = priority
        self.client = client
        self.memory_mb = memory_mb
        self.cpus = limits.cpus
        self.future = future
        self.key: str | None = None  # the caller's idempotency key (scoped by ``client``)
        self.digest = ""  # what runs (program + limits as asked), with a key: see _submit
        self.deadline: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None
        self.attempts = 0
        self.waiters = 0
        self.workspace: Any = None


class JobHandle:
    """A submitted job: await ``result()``, or ``cancel()`` it."""

    __slots__ = ("_engine", "_job")

    def __init__(self, engine: Engine, job: _Job) -> None:
        self._engine = engine
        self._job = job
        job.waiters += 1

    @property
    def id(self) -> int:
        return self._job.id

    @property
    def key(self) -> str | None:
        """The job's idempotency key (None when neither a key nor a journal was given)."""
        return self._job.key

    def done(self) -> bool:
        return self._job.future.done()

    async def result(self) -> ExecResult:
        """The job's ExecResult; raises DeadlineExceeded, EngineClosed or CancelledError."""
        return await asyncio.shield(self._job.future)

    def cancel(self) -> bool:
        """Withdraw this handle's interest; the job is cancelled when no one else waits on it.

        A queued job then never runs; a running one is killed (its sandbox run is cancelled and
        every process of it ended before the slot is reused). Returns whether it was cancelled.
        """
        return self._engine._release_waiter(self._job)


class Engine:
    """Schedules sandbox runs and sessions over a backend (by default a local SandboxPool).

    Use as an async context manager::

        async with Engine() as engine:
            result = await engine.run(program, limits)
            async for i, result in engine.stream(programs, priority="train", client="rl-job-1"):
                ...
            async with engine.session(language="python") as s:
                await s.write_files({"sol.py": code})
                r = await s.run("python sol.py")

    Defaults: ``2 x cores`` slots, a CPU budget of ``cores`` (runs declaring ``Limits.cpus`` < 1
    pack more densely), 75 % of host memory as the memory budget, a queue of 100,000 jobs,
    ``RetryPolicy()`` for infrastructure failures (three attempts; the engine is the only layer
    that retries them), no journal (pass ``journal=path`` for durability).
    Jobs of priority >= ``PRIORITIES["eval"]`` have a reserve: one slot ordinary jobs never take
    (``reserve_slots``, default 1 with 4+ slots) and ``reserve_cpus`` of CPU overcommit, so an
    eval run starts at once even while a training flood saturates the engine. ``min_slots``
    keeps only that many slots warm; the pool then grows to ``slots`` under demand and shrinks
    back when idle (cheaper at rest; the first runs of a burst wait for new slots).
    """

    def __init__(
        self,
        backend: Backend | None = None,
        *,
        slots: int | None = None,
        min_slots: int | None = None,
        isolation: str = "full",
        cpus: float | None = None,
        memory_mb: int | None = None,
        max_queued: int = 100_000,
        journal: str | Path | Journal | None = None,
        retry: RetryPolicy | None = None,
        max_attempts: int | None = None,
        retry_backoff_s: float | None = None,
        session_idle_s: float = 600.0,
        session_ttl_s: float = 6 * 3600.0,
        max_sessions: int = 10_000,
        session_memory_mb: int | None = None,
        max_bypass: int = 16,
        reserve_slots: int | None = None,
        reserve_cpus: float = 1.0,
        preload: Sequence[str] | None = None,
        cluster: Literal["ray"] | None = None,
        address: str | None = None,
    ) -> None:
        cores = os.cpu_count() or 1
        if cluster is not None:
            if backend is not None:
                raise ValueError("pass either backend=... or cluster=..., not both")
            if cluster != "ray":
                raise ValueError(f"unknown cluster {cluster!r}; the one supported is 'ray'")
            # Imported here: Ray is an optional extra (pip install 'sandloop[ray]').
            from sandloop.engine.ray_backend import RayBackend

            backend = RayBackend(address=address, isolation=isolation, preload=preload)
        if backend is None:
            # ``slots`` (default 2 x cores) warm slots; with ``min_slots``, only that many stay
            # warm and the pool grows to ``slots`` under demand (a new slot takes ~0.2 s).
            n = slots or 2 * cores
            warm = n if min_slots is None else max(1, min(min_slots, n))
            backend = LocalBackend(SandboxPool(
                warm, max_slots=n, isolation=isolation,
                preload=DEFAULT_PRELOAD if preload is None else preload))
        self.backend = backend
        # ``max_attempts`` / ``retry_backoff_s`` are shorthands for the policy's two main knobs.
        policy = retry or RetryPolicy()
        if max_attempts is not None or retry_backoff_s is not None:
            policy = dataclasses.replace(
                policy,
                max_attempts=policy.max_attempts if max_attempts is None else max(1, max_attempts),
                backoff_s=policy.backoff_s if retry_backoff_s is None else retry_backoff_s)
        self.retry = policy
        self.session_idle_s = session_idle_s
        self.session_ttl_s = session_ttl_s
        self.max_sessions = max_sessions
        # Sessions' files stay in memory between runs: their work dirs' sizes (each capped at
        # the session's memory_mb) may add up to this much (default: half the host's memory).
        self.session_memory_mb = (session_memory_mb if session_memory_mb is not None
                                  else _host_memory_mb() // 2)
        self._session_mb = 0  # held by open (and opening) sessions
        self._opening = 0
        self._cpus = float(cpus if cpus is not None else cores)
        self._memory_mb = memory_mb if memory_mb is not None else _host_memory_mb() * 3 // 4
        # A cluster backend's capacity (its nodes' slots, memory and cores) replaces these
        # local defaults, and follows nodes as they join and leave.
        self._elastic = isinstance(backend, ElasticBackend)
        self._queue: FairQueue[_Job] = FairQueue(max_queued, max_bypass=max_bypass)
        self._admission: Admission | None = None
        self._reserve = (reserve_slots, reserve_cpus)
        self._journal_arg = journal
        self.journal: Journal | None = None
        self._writer: _JournalWriter | None = None
        self._clients: dict[str, ClientPolicy] = {}
        self._buckets: dict[str, TokenBucket] = {}
        # Idempotency keys are scoped by client: (client, key) -> the job answering it.
        self._inflight: dict[tuple[str, str], _Job] = {}
        # Graphs by (client, key): their content digest and the result their joiners await.
        self._graphs_inflight: dict[tuple[str, str],
                                    tuple[str, asyncio.Future[GraphResult]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._room: deque[asyncio.Future[None]] = deque()
        self._sessions: dict[str, Session] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._closed = False
        self.stats = EngineStats()

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the backend (warm slots), open the journal and the session reaper."""
        if self._started:
            return
        if self._closed:
            raise EngineClosed("this engine was closed; create a new Engine")
        self._loop = asyncio.get_running_loop()
        await self.backend.start()
        slots = self.backend.slots
        if self._elastic:
            assert isinstance(self.backend, ElasticBackend)
            cap = self.backend.capacity()
            slots, self._memory_mb, self._cpus = max(1, cap.slots), cap.memory_mb, cap.cpus
        rs = self._reserve[0] if self._reserve[0] is not None else (1 if slots >= 4 else 0)
        self._admission = Admission(slots, self._memory_mb, self._cpus, reserve_slots=rs,
                                    reserve_cpus=self._reserve[1],
                                    reserve_priority=PRIORITIES["eval"])
        if self._elastic:
            assert isinstance(self.backend, ElasticBackend)
            self._resize()
            self.backend.on_capacity(self._resize)
        if self._journal_arg is not None:
            self.journal = (self._journal_arg if isinstance(self._journal_arg, Journal)
                            else await asyncio.to_thread(Journal, self._journal_arg))
            self._writer = _JournalWriter(self.journal)
        self._reaper = self._loop.create_task(self._reap_loop())
        self._started = True

    async def close(self) -> None:
        """Cancel queued jobs, wait for running ones, close sessions, the journal and slots."""
        if self._closed:
            return
        self._closed = True
        for job in self._queue.drain():
            self._fail(job, EngineClosed("the engine closed before this job ran"))
        for fut in self._room:
            if not fut.done():
                fut.set_exception(EngineClosed("the engine is closing"))
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for s in list(self._sessions.values()):
            try:
                await s._shutdown("closed")
            except Exception as e:
                logger.debug("session %s did not shut down cleanly: %r", s.id, e)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._writer is not None:
            await self._writer.flush()
        if self.journal is not None and not isinstance(self._journal_arg, Journal):
            self.journal.close()
        if self._started:
            await self.backend.close()

    def _resize(self) -> None:
        """The cluster's capacity changed (a node joined or left): admit by the new totals."""
        assert isinstance(self.backend, ElasticBackend) and self._admission is not None
        cap = self.backend.capacity()
        adm = self._admission
        adm.resize(cap.slots, cap.memory_mb, cap.cpus,
                   # With no node at all, keep the last bounds: jobs wait for a node to join.
                   job_memory_mb=cap.node_memory_mb or adm.job_memory_mb,
                   job_cpus=cap.node_cpus or adm.job_cpus,
                   # The default reserve (one slot for eval jobs from 4 slots up) follows the
                   # cluster's size; one given explicitly stays.
                   reserve_slots=None if self._reserve[0] is not None
                   else (1 if cap.slots >= 4 else 0))
        if self._started and not self._closed:
            self._pump()

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # -- clients --------------------------------------------------------------------------------
    def configure_client(self, client: str, *, weight: float = 1.0, rate: float | None = None,
                         burst: float | None = None,
                         on_limit: Literal["wait", "reject"] = "wait") -> None:
        """Set ``client``'s fairness weight and token-bucket rate limit (see ClientPolicy)."""
        if on_limit not in ("wait", "reject"):
            raise ValueError(f"on_limit must be 'wait' or 'reject', got {on_limit!r}")
        self._queue.set_weight(client, weight)
        self._clients[client] = ClientPolicy(weight, rate, burst, on_limit)
        if rate is not None:
            self._buckets[client] = TokenBucket(rate, burst if burst is not None else max(1.0, rate),
                                                time.monotonic())
        else:
            self._buckets.pop(client, None)

    # -- submitting -----------------------------------------------------------------------------
    def check_admissible(self, program: Program, limits: Limits | None = None) -> None:
        """Raise ``ResourceTooLarge`` if ``program`` under ``limits`` could never be admitted
        (it declares more than the engine grants in total). Lets a caller vet a whole batch
        before anything runs, instead of failing it half-way."""
        self._check_open()
        assert self._admission is not None
        limits = limits or _DEFAULT_LIMITS
        self._admission.check(_Declared(0, "", declared_memory_mb(program, limits), limits.cpus))

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed("the engine is closed; no new jobs are accepted")
        if not self._started:
            raise RuntimeError("the engine is not started: use 'async with Engine() as engine' "
                               "or 'await engine.start()'")

    def _make_job(self, program: Program, limits: Limits | None, priority: int | str,
                  client: str, key: str | None, timeout_s: float | None, *,
                  journaled: bool = True, digest: str | None = None) -> _Job:
        assert self._loop is not None and self._admission is not None
        limits = limits or _DEFAULT_LIMITS
        if key is not None or (journaled and self.journal is not None):
            # Bound to the limits as asked (before the eval CPU weight below): a key names one
            # program run within one set of bounds, whatever its priority.
            digest = digest or content_digest(program, limits)
            if key is None:
                key = "h:" + digest
        prio = _priority(priority)
        if prio >= PRIORITIES["eval"] and limits.cpu_weight == 100:
            # Runs are not preemptible: an eval run that lands next to training runs gets the
            # larger share of the contended cores instead (cgroup CPU weight).
            limits = limits.model_copy(update={"cpu_weight": EVAL_CPU_WEIGHT})
        job = _Job(next(self._ids), program, limits, prio, client,
                   declared_memory_mb(program, limits), self._loop.create_future())
        self._admission.check(job)
        job.key = key
        job.digest = digest or ""
        if timeout_s is not None:
            if timeout_s <= 0:
                raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
            job.deadline = time.monotonic() + timeout_s
        return job

    async def _rate_limit(self, client: str, block: bool) -> None:
        bucket = self._buckets.get(client)
        if bucket is None:
            return
        while (wait := bucket.take(time.monotonic())) > 0:
            if not block or self._clients[client].on_limit == "reject":
                self.stats.rejected += 1
                raise RateLimited(client, wait)
            await asyncio.sleep(wait)

    async def _wait_room(self, block: bool) -> None:
        while len(self._queue) >= self._queue.capacity:
            if not block:
                self.stats.rejected += 1
                raise QueueFull(
                    f"engine queue is full ({self._queue.capacity} jobs waiting); wait for "
                    "results, submit with block=True, or raise Engine(max_queued=...)")
            assert self._loop is not None
            fut: asyncio.Future[None] = self._loop.create_future()
            self._room.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                # Pass a wake-up we may have consumed on to the next waiter.
                if fut.done() and not fut.cancelled():
                    self._wake_room()
                raise
            self._check_open()

    def _wake_room(self) -> None:
        room = self._room
        while room:
            fut = room.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def _same(self, job: _Job, other_digest: str) -> None:
        """Raise IdempotencyConflict unless the job holding ``job``'s key runs the same thing.

        Threat: a key reused (by mistake, or by a client racing itself) for another program
        would otherwise be answered with the first program's result: a wrong reward."""
        if other_digest != job.digest:
            raise IdempotencyConflict(job.client, job.key or "")

    async def _submit(self, job: _Job, block: bool) -> _Job:
        """Rate-limit, dedupe by (client, key), journal, enqueue; returns the job that will
        answer."""
        scoped = (job.client, job.key) if job.key is not None else None
        if scoped is not None:
            same = self._inflight.get(scoped)
            if same is not None:
                self._same(job, same.digest)
                return same
            if self.journal is not None:
                entry = self.journal.find(*scoped)
                if entry is not None:
                    self._same(job, entry.digest)
                    if entry.result is not None:
                        self.stats.from_journal += 1
                        job.future.set_result(entry.result)
                        return job
        await self._rate_limit(job.client, block)
        await self._wait_room(block)
        if scoped is not None:
            same = self._inflight.get(scoped)  # another submission won the race while we waited
            if same is not None:
                self._same(job, same.digest)
                return same
            self._inflight[scoped] = job
            if self._writer is not None:
                try:
                    await self._writer.submitted(job)
                except BaseException:
                    self._inflight.pop(scoped, None)
                    raise
                if len(self._queue) >= self._queue.capacity:  # filled while we committed
                    await self._wait_room(True)
        self._check_open()
        self._enqueue(job)
        return job

    def _enqueue(self, job: _Job) -> None:
        self._queue.push(job)
        self.stats.submitted += 1
        if job.deadline is not None:
            assert self._loop is not None
            job.timer = self._loop.call_at(job.deadline, self._expire, job)
        self._pump()

    def submit_nowait(self, program: Program, limits: Limits | None = None, *,
                      priority: int | str = 0, client: str = "default",
                      timeout_s: float | None = None) -> JobHandle:
        """Queue a job without waiting; raises QueueFull or RateLimited instead of waiting.

        The cheapest path (no journal, no idempotency key): for bulk submission from a loop.
        """
        self._check_open()
        if self.journal is not None:
            raise RuntimeError("submit_nowait cannot journal a job; use 'await engine.submit()'")
        job = self._make_job(program, limits, priority, client, None, timeout_s)
        bucket = self._buckets.get(client)
        if bucket is not None and (wait := bucket.take(time.monotonic())) > 0:
            self.stats.rejected += 1
            raise RateLimited(client, wait)
        if len(self._queue) >= self._queue.capacity:
            self.stats.rejected += 1
            raise QueueFull(f"engine queue is full ({self._queue.capacity} jobs waiting); wait "
                            "for results or raise Engine(max_queued=...)")
        self._enqueue(job)
        return JobHandle(self, job)

    async def submit(self, program: Program, limits: Limits | None = None, *,
                     priority: int | str = 0, client: str = "default", key: str | None = None,
                     timeout_s: float | None = None, block: bool = True) -> JobHandle:
        """Queue a job and return its handle once it is queued (and journaled).

        ``block=False`` raises QueueFull / RateLimited instead of waiting for room or tokens.
        ``key`` makes the job idempotent: while one with the same key is queued or running, or
        (with a journal) once one has finished, the same result answers. Keys are scoped by
        ``client`` (another client's identical key is another job), and bound to the program and
        limits: reusing a key for a different program raises IdempotencyConflict.
        """
        self._check_open()
        job = self._make_job(program, limits, priority, client, key, timeout_s)
        return JobHandle(self, await self._submit(job, block))

    async def run(self, program: Program, limits: Limits | None = None, *,
                  priority: int | str = 0, client: str = "default", key: str | None = None,
                  timeout_s: float | None = None, block: bool = True) -> ExecResult:
        """Run one program and return its ExecResult (program failures are results).

        Raises DeadlineExceeded when ``timeout_s`` passes first (the job is withdrawn),
        QueueFull / RateLimited with ``block=False``, EngineClosed on shutdown.
        """
        self._check_open()
        job = self._make_job(program, limits, priority, client, key, timeout_s)
        return await self._await_job(await self._submit(job, block))

    async def _await_job(self, job: _Job) -> ExecResult:
        """Wait for ``job``'s result; a caller that gives up withdraws its interest (and the job,
        running or not, when no one else waits on it)."""
        job.waiters += 1
        try:
            return await asyncio.shield(job.future)
        except asyncio.CancelledError:
            self._release_waiter(job)
            raise

    def runner(self, *, priority: int | str = 0, client: str = "default",
               timeout_s: float | None = None) -> Callable[[Program, Limits], Any]:
        """``async (program, limits) -> ExecResult`` bound to a priority and client (e.g. for
        ``sandloop.reward.Verifier(run=...)``)."""

        async def run(program: Program, limits: Limits) -> ExecResult:
            return await self.run(program, limits, priority=priority, client=client,
                                  timeout_s=timeout_s)

        return run

    async def stream(
        self,
        programs: Iterable[ProgramItem] | AsyncIterable[ProgramItem],
        limits: Limits | None = None,
        *,
        priority: int | str = 0,
        client: str = "default",
        keys: Sequence[str] | None = None,
        timeout_s: float | None = None,
        window: int | None = None,
    ) -> AsyncGenerator[tuple[int, ExecResult], None]:
        """Run many programs; yield ``(index, result)`` as each finishes (not in input order).

        ``programs`` may be lazy (any iterable or async iterable of Program or (Program, Limits));
        at most ``window`` jobs are outstanding at once (default: 4 x slots, at least 256), so
        memory stays bounded however many programs there are. A job whose ``timeout_s`` passes
        yields a ``sandbox_error`` result naming the deadline (masked, never a reward of 0).
        Leaving the loop early cancels the jobs not yet finished.
        """
        self._check_open()
        assert self._loop is not None
        limit = window or max(256, 4 * self.backend.slots)
        room = asyncio.Semaphore(limit)
        done: asyncio.Queue[tuple[int, asyncio.Future[ExecResult] | BaseException | None]] = \
            asyncio.Queue()
        outstanding: dict[int, _Job] = {}
        total: list[int] = []

        def finished(i: int, fut: asyncio.Future[ExecResult]) -> None:
            done.put_nowait((i, fut))

        async def feed() -> None:
            try:
                i = 0
                async for item in _aiter(programs):
                    await room.acquire()
                    prog, lim = item if isinstance(item, tuple) else (item, limits)
                    key = keys[i] if keys is not None else None
                    job = self._make_job(prog, lim, priority, client, key, timeout_s)
                    job = await self._submit(job, True)
                    job.waiters += 1
                    outstanding[i] = job
                    job.future.add_done_callback(functools.partial(finished, i))
                    i += 1
                total.append(i)
                done.put_nowait((-1, None))
            except asyncio.CancelledError:
                raise
            except BaseException as e:
                done.put_nowait((-1, e))

        feeder = self._loop.create_task(feed())
        yielded = 0
        try:
            while not total or yielded < total[0]:
                i, what = await done.get()
                if i < 0:
                    if isinstance(what, BaseException):
                        raise what
                    continue
                assert isinstance(what, asyncio.Future)
                job = outstanding.pop(i)
                job.waiters -= 1
                room.release()
                yielded += 1
                if what.cancelled():
                    raise EngineClosed("a job of this stream was cancelled")
                exc = what.exception()
                if isinstance(exc, DeadlineExceeded):
                    yield i, ExecResult.sandbox_error(str(exc))
                elif exc is not None:
                    raise exc
                else:
                    yield i, what.result()
        finally:
            feeder.cancel()
            try:
                await feeder
            except asyncio.CancelledError:
                pass
            except Exception as e:
                logger.debug("batch feeder failed: %r", e)
            for job in outstanding.values():
                # The stream's own interest (counted when submitted) goes: a job no one else
                # waits on is cancelled, and a running one killed, as the docstring says.
                self._release_waiter(job)

    async def run_graph(self, graph: Graph, *, priority: int | str = 0,
                        client: str = "default", key: str | None = None,
                        timeout_s: float | None = None) -> GraphResult:
        """Run a DAG of jobs (``sandloop.sandbox.graph``): each node once its parents ended
        ``ok``, with their collected files as its inputs; a failed parent cancels its
        descendants (``NodeState.CANCELLED``, with the reason and the failing status).

        The graph is one job: every node is admitted before any runs (one that could never
        run raises ResourceTooLarge for the whole graph), all run at the graph's priority
        and client, and with a journal it is one journal row (``key``, default a hash of the
        graph; bound to the graph's content like a job's key) holding each node's result as
        it finishes. Submitted again after a crash, the graph answers its finished nodes from
        that row and runs only the rest (a node whose run failed for the infrastructure's
        reasons is not recorded, so it runs again); once no node failed so, the row is final
        and answers the whole graph. The same key in flight twice runs once.
        ``timeout_s`` bounds the whole graph (DeadlineExceeded).
        """
        self._check_open()
        for n in graph.nodes:  # admission of the whole graph before anything runs
            self._make_job(n.program, n.limits, priority, client, None, None, journaled=False)
        if key is None and self.journal is None:
            return await self._graph(graph, priority, client, None, timeout_s, {})
        text = model_json(graph)
        digest = hashlib.sha256(text.encode()).hexdigest()
        scoped = (client, key if key is not None else "g:" + digest)
        same = self._graphs_inflight.get(scoped)
        if same is not None:
            if same[0] != digest:
                raise IdempotencyConflict(*scoped)
            return await asyncio.shield(same[1])
        assert self._loop is not None
        fut: asyncio.Future[GraphResult] = self._loop.create_future()
        self._graphs_inflight[scoped] = (digest, fut)
        try:
            result = await self._journalled_graph(graph, text, digest, scoped, priority,
                                                  timeout_s)
        except BaseException as e:
            if not fut.done():
                if isinstance(e, asyncio.CancelledError):
                    fut.cancel()
                else:
                    fut.set_exception(e)
                    fut.exception()  # retrieved: only joiners (if any) re-raise it
            raise
        else:
            fut.set_result(result)
            return result
        finally:
            self._graphs_inflight.pop(scoped, None)

    async def _journalled_graph(self, graph: Graph, text: str, digest: str,
                                scoped: tuple[str, str], priority: int | str,
                                timeout_s: float | None) -> GraphResult:
        finished: dict[str, ExecResult] = {}
        journal = self.journal
        if journal is not None:
            entry = await asyncio.to_thread(journal.find_graph, *scoped)
            if entry is not None:
                if entry.digest != digest:
                    raise IdempotencyConflict(*scoped)
                finished = entry.nodes
                if entry.done:
                    self.stats.from_journal += len(finished)
                    return await execute_nodes(graph, _answer(finished))
            else:
                await asyncio.to_thread(journal.graph_submitted, *scoped, _priority(priority),
                                        text, digest)
        result = await self._graph(graph, priority, scoped[0], scoped, timeout_s, finished)
        if journal is not None and not any(
                (n.result is not None and n.result.status is Status.SANDBOX_ERROR)
                or n.cause is Status.SANDBOX_ERROR for n in result.nodes.values()):
            await asyncio.to_thread(journal.graph_done, *scoped)
        return result

    async def _graph(self, graph: Graph, priority: int | str, client: str,
                     scoped: tuple[str, str] | None, timeout_s: float | None,
                     finished: dict[str, ExecResult]) -> GraphResult:
        """Run the nodes not in ``finished`` as unjournaled jobs (the graph's row journals
        them), recording each result in the row (when ``scoped`` and a journal are given)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        journal = self.journal if scoped is not None else None

        async def run(node: Node, program: Program) -> ExecResult:
            done = finished.get(node.id)
            if done is not None:
                self.stats.from_journal += 1
                return done
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise DeadlineExceeded(f"the graph's timeout_s={timeout_s} passed")
            job = self._make_job(program, node.limits, priority, client, None, left,
                                 journaled=False)
            r = await self._await_job(await self._submit(job, True))
            if journal is not None and scoped is not None and r.status is not Status.SANDBOX_ERROR:
                # Before the node's children start: a crash after this point never reruns it.
                await asyncio.to_thread(journal.graph_node, *scoped, node.id, r)
            return r

        return await execute_nodes(graph, run)

    def resume_graphs(self, *, priority: int | str | None = None,
                      ) -> Resumption[tuple[str, GraphResult]]:
        """Run again every graph the journal holds as submitted but unfinished (after a
        crash): only their unfinished nodes run. Yields ``(key, result)`` as each ends; or
        ``await`` it for the list of all."""
        return Resumption(self._resume_graphs(priority))

    async def _resume_graphs(self, priority: int | str | None,
                             ) -> AsyncGenerator[tuple[str, GraphResult], None]:
        self._check_open()
        if self.journal is None:
            raise RuntimeError("resume_graphs() needs a journal: Engine(journal=path)")
        pending = await asyncio.to_thread(self.journal.pending_graphs)
        tasks = {asyncio.ensure_future(self.run_graph(
            model_from_json(Graph, p.graph),
            priority=p.priority if priority is None else priority, client=p.client,
            key=p.key)): p.key for p in pending}
        remaining = set(tasks)
        try:
            while remaining:
                done, remaining = await asyncio.wait(remaining,
                                                     return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    yield tasks[t], t.result()
        finally:
            for t in remaining:
                t.cancel()

    def graph_runner(self, *, priority: int | str = 0, client: str = "default",
                     ) -> Callable[[Graph], Awaitable[GraphResult]]:
        """``async (graph) -> GraphResult`` bound to a priority and client (e.g. for
        ``sandloop.reward.Verifier(run=..., run_graph=...)``)."""

        async def run(graph: Graph) -> GraphResult:
            return await self.run_graph(graph, priority=priority, client=client)

        return run

    async def run_repeated(self, program: Program, limits: Limits | None = None, *, k: int = 3,
                           priority: int | str = 0, client: str = "default",
                           key: str | None = None, timeout_s: float | None = None,
                           verdict: Callable[[ExecResult], Hashable] | None = None,
                           ) -> RepeatedResult:
        """Run ``program`` ``k`` times and aggregate: majority verdict, mean measurements, and a
        ``flaky`` flag when repeats disagree (see ``repeat.aggregate``)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        base = key if key is not None else (job_key(program, limits or _DEFAULT_LIMITS)
                                            if self.journal is not None else None)
        results = await asyncio.gather(*(
            self.run(program, limits, priority=priority, client=client, timeout_s=timeout_s,
                     key=f"{base}#r{i}" if base is not None else None)
            for i in range(k)))
        return aggregate(results, verdict)

    def resume(self, *, priority: int | str | None = None,
               ) -> Resumption[tuple[str, ExecResult]]:
        """Run again every job the journal holds as submitted but unfinished (after a crash);
        yield ``(key, result)`` as each finishes (``async for``), or ``await`` it for the list
        of all. Each runs once; resubmitting the same key meanwhile joins it instead of running
        it twice."""
        return Resumption(self._resume(priority))

    async def _resume(self, priority: int | str | None,
                      ) -> AsyncGenerator[tuple[str, ExecResult], None]:
        self._check_open()
        if self.journal is None:
            raise RuntimeError("resume() needs a journal: Engine(journal=path)")
        pending = await asyncio.to_thread(self.journal.pending)
        handles: dict[asyncio.Future[ExecResult], str] = {}
        for p in pending:
            # The digest recorded at submission (the limits stored are those the job ran with).
            job = self._make_job(p.program, p.limits,
                                 p.priority if priority is None else priority, p.client, p.key,
                                 None, digest=p.digest)
            h = JobHandle(self, await self._submit(job, True))
            handles[h._job.future] = p.key
        remaining = set(handles)
        while remaining:
            finished, remaining = await asyncio.wait(remaining,
                                                     return_when=asyncio.FIRST_COMPLETED)
            for f in finished:
                yield handles[f], f.result()

    # -- sessions -------------------------------------------------------------------------------
    async def open_session(self, *, language: str = "python", limits: Limits | None = None,
                           ttl_s: float | None = None, idle_timeout_s: float | None = None,
                           priority: int | str = "interactive", client: str = "default",
                           environment: str | None = None,
                           files: Mapping[str, bytes] | None = None) -> Session:
        """Open a multi-turn session: a work dir whose files persist between runs.

        ``files``: what it starts with. On the local backend, sessions opened with the same
        files share one copy of them per slot, copy-on-write (opening costs a mount, not a
        copy, and ``workdir_mb`` counts only what the session writes); elsewhere they are
        copied in. Raises SessionFull when a copy does not fit.

        Idle, it costs only its files: at most ``limits.workdir_mb`` capped at
        ``limits.memory_mb``. It is reaped (files deleted) after ``idle_timeout_s`` without use
        or ``ttl_s`` after opening; close it yourself when done. Raises SessionLimit beyond
        ``max_sessions`` sessions or ``session_memory_mb`` of their storage. Its programs run
        in ``environment`` (a name or id; None: the backend's default).
        """
        self._check_open()
        for name in files or ():
            check_relative_path(name)
        if len(self._sessions) + self._opening >= self.max_sessions:
            raise SessionLimit(f"the engine holds {self.max_sessions} sessions; close some or "
                               "raise Engine(max_sessions=...)")
        limits = limits or _DEFAULT_LIMITS
        size = workspace_mb(limits)
        if self._session_mb + size > self.session_memory_mb:
            raise SessionLimit(
                f"open sessions may hold {self._session_mb} MiB of files, and this one "
                f"{size} MiB (workdir_mb capped at memory_mb) would pass the engine's "
                f"session_memory_mb={self.session_memory_mb}; close sessions, open smaller ones, "
                "or raise Engine(session_memory_mb=...)")
        # Reserved across the await: concurrent opens cannot overshoot either limit.
        self._session_mb += size
        self._opening += 1
        try:
            ws = await self.backend.open_workspace(limits, environment=environment, base=files)
        except WorkspaceFull as e:
            self._session_mb -= size
            raise SessionFull(f"cannot open a session with these files: {e}") from None
        except WorkspaceLost as e:
            self._session_mb -= size
            raise SessionLost(f"cannot open a session: {e}") from e
        except BaseException:
            self._session_mb -= size
            raise
        finally:
            self._opening -= 1
        try:
            s = Session(self, ws, language=language, limits=limits,
                        ttl_s=self.session_ttl_s if ttl_s is None else ttl_s,
                        idle_timeout_s=self.session_idle_s if idle_timeout_s is None
                        else idle_timeout_s,
                        priority=_priority(priority), client=client)
        except BaseException:  # e.g. an unknown language: no session, no files left behind
            self._session_mb -= size
            try:
                await self.backend.close_workspace(ws)
            except Exception as e:
                logger.debug("workspace of a session that failed to open not closed: %r", e)
            raise
        self._sessions[s.id] = s  # its storage, reserved above, is released by _session_gone
        self.stats.sessions = len(self._sessions)
        return s

    def episode(self, task: RepoTask, config: Any = None, *, log: Any = None,
                **overrides: Any) -> contextlib.AbstractAsyncContextManager[Any]:
        """``async with engine.episode(task) as ep: obs = await ep.call("run_tests")`` — a
        multi-turn, tool-using episode over a repository task (``sandloop.episodes.episode``:
        reset on entry, ``ep.observation``; closed on exit). ``config`` is an
        ``EpisodeConfig``; keyword ``overrides`` replace its fields (``max_turns=5``); ``log``
        an ``EpisodeLog`` to record it. Episodes sit above the engine in the layer table, so
        the package root provides this (sandloop/_extensions.py)."""
        opener = _extensions.episode_opener
        assert opener is not None, "set by sandloop/__init__.py, which runs first"
        cm: contextlib.AbstractAsyncContextManager[Any] = opener(self, task, config, log=log,
                                                                 **overrides)
        return cm

    @contextlib.asynccontextmanager
    async def session(self, *, language: str = "python", limits: Limits | None = None,
                      ttl_s: float | None = None, idle_timeout_s: float | None = None,
                      priority: int | str = "interactive", client: str = "default",
                      environment: str | None = None,
                      files: Mapping[str, bytes] | None = None) -> AsyncIterator[Session]:
        """``async with engine.session(...) as s:`` — ``open_session`` closed on exit."""
        s = await self.open_session(language=language, limits=limits, ttl_s=ttl_s,
                                    idle_timeout_s=idle_timeout_s, priority=priority,
                                    client=client, environment=environment, files=files)
        try:
            yield s
        finally:
            await s.close()

    def _session_gone(self, s: Session) -> None:
        if self._sessions.pop(s.id, None) is not None:
            self._session_mb -= s.storage_mb
        self.stats.sessions = len(self._sessions)

    async def _run_in_session(self, s: Session, program: Program, limits: Limits,
                              timeout_s: float | None) -> ExecResult:
        self._check_open()
        # Never deduplicated nor journaled: a session run's result depends on the session's
        # files, not only on its program, so keying it by content would answer a command with
        # its output from before the files changed (or from another session). Nor could a
        # restart replay it: the session's files die with the process (docs/engine.md).
        job = self._make_job(program, limits, s.priority, s.client, None, timeout_s,
                             journaled=False)
        job.workspace = s.workspace
        return await self._await_job(await self._submit(job, True))

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self._reap_interval())
            now = time.monotonic()
            for s in list(self._sessions.values()):
                reason = s._expiry(now)
                if reason is not None:
                    self.stats.sessions_reaped += 1
                    try:
                        await s._shutdown(reason)
                    except Exception as e:
                        logger.debug("reaped session %s did not shut down cleanly: %r", s.id, e)

    def _reap_interval(self) -> float:
        shortest = min((min(s.idle_timeout_s, s.ttl_s) for s in self._sessions.values()),
                       default=self.session_idle_s)
        return max(0.05, min(1.0, shortest / 4))

    # -- dispatch (synchronous: no await between picking a job and starting it) ----------------
    def _pump(self) -> None:
        adm = self._admission
        queue = self._queue
        assert adm is not None and self._loop is not None
        while adm.free_slots > 0 and len(queue):
            job = queue.pop(adm.fits)
            if job is None:
                return
            if self._room:
                self._wake_room()
            if job.future.done():  # cancelled or expired while queued
                self._forget(job)
                continue
            adm.acquire(job)
            self.stats.running += 1
            task = self._loop.create_task(self._execute(job))
            job.task = task
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _execute(self, job: _Job) -> None:
        limits = job.limits
        clamped = False
        if job.deadline is not None:
            # Bound the run by the job's deadline so its slot is not held for a dropped result.
            left = job.deadline - time.monotonic()
            if left < limits.time_s:
                limits = limits.model_copy(update={"time_s": max(left, 0.05)})
                clamped = True
        if self._writer is not None and job.key is not None:
            self._writer.started(job.client, job.key)
        self.stats.executed += 1
        lost: BaseException | None = None
        cpu_back = False

        def program_ended() -> None:
            # Its CPU goes to the next job now, not after the run's cleanup and result: the
            # slots (2 per core) outnumber the cores, so that job starts on another slot and
            # the cores are not left idle while the supervisor tidies up. At most `cpus`
            # programs still run at once.
            nonlocal cpu_back
            if not cpu_back:
                cpu_back = True
                assert self._admission is not None
                self._admission.release_cpus(job)
                self._pump()

        try:
            if job.workspace is None:
                result = await self.backend.execute(job.program, limits, on_end=program_ended)
            else:
                result = await self.backend.run_in(job.workspace, job.program, limits)
        except WorkspaceLost as e:
            lost = SessionLost(f"the session's sandbox was lost: {e}; open a new session")
            result = ExecResult.sandbox_error(str(e))
        except asyncio.CancelledError:
            # Withdrawn while running (or the engine is closing): the sandbox layer has killed
            # the run; its journal entry stays unfinished, so resume() would run it again.
            result = None
        except InputError as e:
            # The request's own fault (it names an environment that does not exist): raised to
            # its caller, never a sandbox_error (which would be retried, then scored null).
            lost = e
            result = ExecResult.sandbox_error(str(e))  # not delivered: _fail below
        except Exception as e:  # a backend bug or crash is an infrastructure failure
            # The result says what failed; the traceback (where) is for the operator.
            logger.debug("backend failed on job %s", job.id, exc_info=True)
            result = ExecResult.sandbox_error(f"backend failed: {type(e).__name__}: {e}")
        finally:
            assert self._admission is not None
            self._admission.release(job, cpus=not cpu_back)
            cpu_back = True  # a late call (a retried attempt) must not give it back twice
            self.stats.running -= 1
        self._pump()
        if result is None:
            return
        if lost is not None:
            self._fail(job, lost)
            return
        if result.status is Status.SANDBOX_ERROR:
            if (job.workspace is None and self.retry.allows(job.attempts + 1)
                    and not job.future.done() and not self._closed and self.backend.retryable):
                # Infrastructure failure: back off, then retry (the pool has replaced the slot).
                job.attempts += 1
                self.stats.retried += 1
                delay = self.retry.delay(job.attempts)
                assert self._loop is not None
                self._loop.call_later(delay, self._requeue, job)
                return
            self.stats.infra_failures += 1
        elif (clamped and result.status is Status.TIMEOUT):
            self._fail(job, DeadlineExceeded(
                f"job {job.id} reached its deadline while running"))
            return
        await self._complete(job, result)

    def _requeue(self, job: _Job) -> None:
        if job.future.done() or self._closed:
            self._forget(job)
            if not job.future.done():
                self._fail(job, EngineClosed("the engine closed before this job's retry"))
            return
        self._queue.push_front(job)
        self._pump()

    async def _complete(self, job: _Job, result: ExecResult) -> None:
        # With a journal, the outcome is committed before anyone sees it: a result a caller
        # received is never recomputed after a crash. Infrastructure failures stay pending.
        if (self._writer is not None and job.key is not None
                and result.status is not Status.SANDBOX_ERROR):
            await self._writer.finished(job.client, job.key, result)
        self._forget(job)
        if not job.future.done():
            self.stats.completed += 1
            job.future.set_result(result)

    def _fail(self, job: _Job, exc: BaseException) -> None:
        self._forget(job)
        if not job.future.done():
            if isinstance(exc, DeadlineExceeded):
                self.stats.deadline_exceeded += 1
            job.future.set_exception(exc)
            job.future.exception()  # retrieved: no "never retrieved" noise if no one waits

    def _forget(self, job: _Job) -> None:
        if job.timer is not None:
            job.timer.cancel()
            job.timer = None
        if job.key is not None and self._inflight.get((job.client, job.key)) is job:
            del self._inflight[(job.client, job.key)]

    def _expire(self, job: _Job) -> None:
        job.timer = None
        if not job.future.done():
            self._fail(job, DeadlineExceeded(
                f"job {job.id} did not finish within its timeout_s (queued or running); "
                "raise timeout_s, lower the load, or give it a higher priority"))

    def _release_waiter(self, job: _Job) -> bool:
        job.waiters -= 1
        if job.waiters <= 0 and not job.future.done():
            self._forget(job)
            job.future.cancel()
            if job.task is not None and not job.task.done():
                # A running job: no one wants its result, free its slot. Deferred one loop
                # turn, so a task created this turn has started (and will run its cleanup).
                task = job.task
                asyncio.get_running_loop().call_soon(task.cancel)
            return True
        return False

    # -- introspection --------------------------------------------------------------------------
    def snapshot(self) -> EngineStats:
        """A copy of the counters with the current queue length."""
        s = EngineStats(**vars(self.stats))
        s.queued = len(self._queue)
        return s


_DEFAULT_LIMITS = Limits()


async def _aiter(items: Iterable[ProgramItem] | AsyncIterable[ProgramItem],
                 ) -> AsyncIterator[ProgramItem]:
    if isinstance(items, AsyncIterable):
        async for x in items:
            yield x
    else:
        for x in items:
            yield x


def _answer(finished: dict[str, ExecResult]) -> Callable[[Node, Program],
                                                        Awaitable[ExecResult]]:
    """A node runner that answers every node from a final graph row."""

    async def run(node: Node, program: Program) -> ExecResult:
        return finished[node.id]

    return run


class _JournalWriter:
    """Group commit: journal writes made while a commit runs go into the next one, so many jobs
    share one transaction (and one fsync-free WAL append) off the event loop."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._submitted: list[tuple[str, str, int, Program, Limits, str]] = []
        self._started: list[tuple[str, str]] = []
        self._finished: list[tuple[str, str, ExecResult]] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._running: asyncio.Task[None] | None = None

    async def submitted(self, job: _Job) -> None:
        assert job.key is not None
        self._submitted.append((job.client, job.key, job.priority, job.program, job.limits,
                                job.digest))
        await self._commit()

    def started(self, client: str, key: str) -> None:
        self._started.append((client, key))  # rides along with the next commit

    async def finished(self, client: str, key: str, result: ExecResult) -> None:
        self._finished.append((client, key, result))
        await self._commit()

    async def flush(self) -> None:
        if self._submitted or self._started or self._finished:
            await self._commit()
        while self._running is not None:
            await asyncio.shield(self._running)

    async def _commit(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        if self._running is None:
            self._running = asyncio.get_running_loop().create_task(self._loop())
        await asyncio.shield(fut)

    async def _loop(self) -> None:
        try:
            while self._waiters:
                sub, st, fin, waiters = (self._submitted, self._started, self._finished,
                                         self._waiters)
                self._submitted, self._started, self._finished, self._waiters = [], [], [], []
                try:
                    await asyncio.to_thread(self.journal.write, sub, st, fin)
                except BaseException as e:
                    for w in waiters:
                        if not w.done():
                            w.set_exception(e)
                    continue
                for w in waiters:
                    if not w.done():
                        w.set_result(None)
        finally:
            self._running = None

