"""The server's live state (one per app): the engine, sessions, loaded task sets, metrics."""

from __future__ import annotations

import asyncio

from sandloop.curation.sampler import TaskSampler
from sandloop.engine import Engine, EngineClosed, Session
from sandloop.monitor.live import LiveMonitor
from sandloop.monitor.signatures import TaskScanner
from sandloop.sandbox.models import ExecResult, Limits, Status
from sandloop.server.auth import KeyStore
from sandloop.server.config import ServerConfig
from sandloop.server.errors import RequestError
from sandloop.server.observability import Metrics
from sandloop.server.usage import UsageLedger
from sandloop.store import ResultStore
from sandloop.tasks import Task, load_tasks
from sandloop.tasks.repo import is_repo_set

__all__ = ["ServerState"]


class ServerState:
    """What the routes share, reached through ``request.app.state.sandloop`` (the dependency
    :func:`sandloop.server.dependencies.get_state`)."""

    def __init__(self, config: ServerConfig, keys: KeyStore,
                 ledger: UsageLedger | None = None) -> None:
        self.config = config
        self.keys = keys
        self.ledger = ledger
        self.engine: Engine | None = None
        self.metrics = Metrics(lambda: self.engine)
        self.ready = False
        self.sessions: dict[str, tuple[Session, str]] = {}  # id -> (session, owning key id)
        self.opening: dict[str, int] = {}  # sessions being opened, per key
        self.task_sets: dict[str, dict[str, Task]] = {}
        self.samplers: dict[str, TaskSampler] = {}  # curriculum per served task set
        self.set_is_repo: dict[str, bool] = {}  # served set -> holds repository tasks
        self.task_lock = asyncio.Lock()
        self.store: ResultStore | None = None
        self.resume_task: asyncio.Task[None] | None = None
        # Every served task loaded so far, for the monitor's task-aware hack signature (a
        # completion that answers a test's literal inputs with its expected output).
        self.known_tasks: dict[str, Task] = {}
        self.monitor = LiveMonitor(self.metrics.registry, log_path=config.rollout_log,
                                   scanner=TaskScanner(self.known_tasks),
                                   audit_share=config.audit_share)
        self.background: set[asyncio.Task[None]] = set()  # live audits in progress

    def running_engine(self) -> Engine:
        """The engine, or EngineClosed (503) while the server starts or drains."""
        if self.engine is None or not self.ready:
            raise EngineClosed("the engine is not running")
        return self.engine

    def check_limits(self, limits: Limits) -> None:
        """Refuse limits above this server's maxima (RequestError, 400, naming each)."""
        c = self.config
        problems = []
        if limits.time_s > c.max_time_s or limits.compile_time_limit_s > c.max_time_s:
            problems.append(f"time_s/compile_time_s at most {c.max_time_s:g}")
        if max(limits.memory_mb, limits.compile_memory_limit_mb) > c.max_memory_mb:
            problems.append(f"memory_mb/compile_memory_mb at most {c.max_memory_mb}")
        if max(limits.stdout_bytes, limits.stderr_bytes) > c.max_output_bytes:
            problems.append(f"stdout_bytes/stderr_bytes at most {c.max_output_bytes}")
        if limits.workdir_mb > c.max_workdir_mb:
            problems.append(f"workdir_mb at most {c.max_workdir_mb}")
        if problems:
            raise RequestError("limits beyond this server's maximum: " + "; ".join(problems))

    def observe(self, r: ExecResult, language: str) -> ExecResult:
        """Count a run's result in the metrics; returns it."""
        m = self.metrics
        m.runs.labels(r.status.value).inc()
        m.run_seconds.labels(language).observe(r.wall_time_s)
        if r.status is Status.SANDBOX_ERROR:
            m.infra_failures.inc()
        return r

    async def tasks_for(self, name: str | None) -> dict[str, Task]:
        """The scoring tasks of served set ``name`` (all served sets when None), loaded once.

        Repository task sets are episodes' (``/v1/episodes``), not scoring's: they are left out
        when every served set is merged, and a 400 when named."""
        if name is not None and name not in self.config.task_sets:
            raise RequestError(f"task set {name!r} is not served here; available: "
                               f"{', '.join(self.config.task_sets) or '(none)'}")
        async with self.task_lock:
            for n in self.config.task_sets if name is None else [name]:
                if n not in self.set_is_repo:
                    self.set_is_repo[n] = await asyncio.to_thread(is_repo_set, n)
            if name is not None and self.set_is_repo[name]:
                raise RequestError(f"task set {name!r} holds repository tasks: they are graded "
                                   "by episodes (POST /v1/episodes), not scored")
            names = [name] if name is not None else [
                n for n in self.config.task_sets if not self.set_is_repo[n]]
            for n in names:
                if n not in self.task_sets:
                    self.task_sets[n] = {t.id: t for t in await asyncio.to_thread(load_tasks, n)}
                    self.known_tasks.update(self.task_sets[n])
        merged: dict[str, Task] = {}
        for n in names:
            merged.update(self.task_sets[n])
        return merged

    async def sampler_for(self, name: str) -> TaskSampler:
        """The curriculum of served set ``name`` (its train split when it has one), made once."""
        sampler = self.samplers.get(name)
        if sampler is None:
            tasks = list((await self.tasks_for(name)).values())
            train = [t for t in tasks if t.split == "train"]
            if not tasks:
                raise RequestError(f"task set {name!r} has no tasks")
            sampler = self.samplers.setdefault(name, TaskSampler(train or tasks))
        return sampler
