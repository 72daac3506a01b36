"""The HTTP service: the native API over the engine, SandboxFusion's ``/run_code``, OpenRLHF's
remote reward endpoint, health, readiness and Prometheus metrics. See docs/server.md."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import quote

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import ClientDisconnect

from sandloop.engine import (
    DeadlineExceeded,
    Engine,
    EngineClosed,
    IdempotencyConflict,
    QueueFull,
    RateLimited,
    ResourceTooLarge,
    Session,
    SessionClosed,
    SessionExpired,
    SessionFull,
    SessionLimit,
    SessionLost,
)
from sandloop.monitor.dashboard import DASHBOARD_HTML
from sandloop.monitor.live import LiveMonitor
from sandloop.reward import CompletionResult, RewardConfig, Verifier
from sandloop.reward.assemble import extract_code
from sandloop.reward.assemble import response_after_prompt as openrlhf_completion
from sandloop.reward.scoring import Completion, score_all
from sandloop.sandbox.models import ExecResult, Limits, Program, Status
from sandloop.sandbox.requests import ExecRequest
from sandloop.server import sandboxfusion as sf
from sandloop.server.auth import KeyPolicy, KeyStore, Refused
from sandloop.server.config import ServerConfig, is_loopback
from sandloop.server.direct import DirectRoute, DirectRoutes
from sandloop.server.observability import Metrics, RequestMiddleware, log
from sandloop.server.usage import UsageLedger, default_usage_path
from sandloop.store import ResultStore
from sandloop.tasks import LabelError, Task, TaskFormatError, load_tasks, resolve_task

__all__ = ["create_app"]

T = TypeVar("T")
Priority = int | Literal["eval", "interactive", "train", "background"]


# -- request bodies ---------------------------------------------------------------------------
class RunBody(ExecRequest):
    """One program (the exec-batch line format) and how to schedule it."""

    priority: Priority = "train"
    timeout_s: float | None = Field(None, gt=0, le=86400, description="queueing + running")
    key: str | None = Field(None, max_length=256, description="idempotency key")


class BatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requests: list[ExecRequest] = Field(min_length=1)
    priority: Priority = "train"
    timeout_s: float | None = Field(None, gt=0, le=86400)


class ScoreItemBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: str | dict[str, Any] = Field(description="a task id, a task record, or tests")
    completion: str
    completion_id: str | None = None
    language: str | None = None


class ScoreBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[ScoreItemBody] = Field(min_length=1)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    task_set: str | None = None
    priority: Priority = "train"
    step: int | None = Field(None, ge=0, description="training step: recorded by the monitor "
                                                     "(or header X-Sandloop-Step)")
    group: str | None = Field(None, description="rollout group (header X-Sandloop-Group)")
    run_id: str | None = Field(None, description="training run (header X-Sandloop-Run)")


class SessionOpenBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    language: str = "python"
    limits: Limits = Field(default_factory=Limits)
    ttl_s: float | None = Field(None, gt=0, le=7 * 86400)
    idle_timeout_s: float | None = Field(None, gt=0, le=86400)


class SessionRunBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str | None = Field(None, description="a bash command in the work dir")
    code: str | None = Field(None, description="source in the session's language")
    stdin: str | None = None
    limits: Limits | None = None
    timeout_s: float | None = Field(None, gt=0, le=86400)


class FilesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    files: dict[str, str] = Field(description="path -> content")
    encoding: Literal["utf-8", "base64"] = "utf-8"


class ReadFilesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    paths: list[str] = Field(min_length=1, max_length=1024)


class OpenRLHFBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    query: list[str]
    prompts: list[str] | None = None
    labels: list[Any] | None = None


class _ClientGone(Exception):
    pass


class _State:
    def __init__(self, config: ServerConfig, keys: KeyStore) -> None:
        self.config = config
        self.keys = keys
        self.engine: Engine | None = None
        self.metrics = Metrics(lambda: self.engine)
        self.ready = False
        self.sessions: dict[str, tuple[Session, str]] = {}
        self.opening: dict[str, int] = {}  # sessions being opened, per key
        self.task_sets: dict[str, dict[str, Task]] = {}
        self.task_lock = asyncio.Lock()
        self.store: ResultStore | None = None
        self.resume_task: asyncio.Task[None] | None = None
        self.monitor = LiveMonitor(self.metrics.registry, log_path=config.rollout_log)


def create_app(config: ServerConfig | None = None, *, keys: KeyStore | None = None) -> FastAPI:
    """The ASGI app. The engine starts in the app's lifespan and closes on shutdown."""
    config = config or ServerConfig()
    keys = keys if keys is not None else KeyStore.load(config.keys_file)
    ledger: UsageLedger | None = None
    usage_path = config.usage_db or (default_usage_path(config.keys_file)
                                     if config.keys_file is not None else None)
    if keys.enabled and usage_path is not None:
        # Quota use outlives the process: a restart must not hand out fresh quotas.
        ledger = UsageLedger(usage_path)
        keys.attach_ledger(ledger)
    st = _State(config, keys)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = Engine(slots=config.slots, isolation=config.isolation,
                        journal=config.journal, preload=config.preload,
                        max_sessions=config.max_sessions,
                        session_memory_mb=config.session_memory_mb,
                        cluster="ray" if config.ray_address else None,
                        address=config.ray_address)
        await engine.start()
        for pol in keys.policies():
            engine.configure_client(pol.id, weight=pol.record.weight)
        st.engine = engine
        if config.db is not None:
            config.db.parent.mkdir(parents=True, exist_ok=True)
            st.store = ResultStore(config.db)
        if engine.journal is not None:
            st.resume_task = asyncio.create_task(_resume(engine))
        st.ready = True
        log.info("ready", extra={"host": config.host, "port": config.port,
                                 "slots": engine.backend.slots, "keys": keys.enabled})
        try:
            yield
        finally:
            st.ready = False
            log.info("shutting down: finishing in-flight work")
            if st.resume_task is not None:
                st.resume_task.cancel()
            await engine.close()
            if st.store is not None:
                st.store.close()
            if ledger is not None:
                ledger.close()
            st.monitor.close()
            st.engine = None

    # With API keys on, the API's description and the metrics need a key too unless the operator
    # opens them (--public-docs / --public-metrics): they tell a stranger what runs here.
    docs_keyed = keys.enabled and not config.public_docs
    app = FastAPI(
        title="sandloop", version="1", lifespan=lifespan,
        openapi_url=None if docs_keyed else "/openapi.json",
        docs_url=None if docs_keyed else "/docs", redoc_url=None if docs_keyed else "/redoc",
        description="Isolated execution and trustworthy rewards for RL post-training: the "
                    "native API, SandboxFusion's /run_code and OpenRLHF's remote reward.")
    app.state.sandloop = st

    # -- errors -----------------------------------------------------------------------------
    def error(status: int, message: str, retry_after: float | None = None) -> JSONResponse:
        headers = {"Retry-After": str(max(1, int(retry_after + 0.999)))} \
            if retry_after is not None else None
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    @app.exception_handler(Refused)
    async def _refused(_: Request, e: Refused) -> JSONResponse:
        st.metrics.refused.labels({401: "auth", 403: "forbidden", 503: "unavailable"}
                                  .get(e.status, "limit")).inc()
        return error(e.status, e.message, e.retry_after_s)

    @app.exception_handler(RateLimited)
    async def _rate(_: Request, e: RateLimited) -> JSONResponse:
        st.metrics.refused.labels("limit").inc()
        return error(429, str(e), e.retry_after_s)

    @app.exception_handler(QueueFull)
    async def _full(_: Request, e: QueueFull) -> JSONResponse:
        st.metrics.refused.labels("queue_full").inc()
        return error(503, str(e), 1.0)

    @app.exception_handler(DeadlineExceeded)
    async def _deadline(_: Request, e: DeadlineExceeded) -> JSONResponse:
        return error(504, str(e))

    @app.exception_handler(EngineClosed)
    async def _closed(_: Request, e: EngineClosed) -> JSONResponse:
        return error(503, f"{e} (the server is shutting down; retry)", 1.0)

    @app.exception_handler(SessionLimit)
    async def _slimit(_: Request, e: SessionLimit) -> JSONResponse:
        return error(503, str(e), 5.0)

    for exc_type, code in ((SessionClosed, 404), (SessionExpired, 410), (SessionLost, 410),
                           (IdempotencyConflict, 409), (SessionFull, 413),
                           (ResourceTooLarge, 400), (LabelError, 400), (TaskFormatError, 400),
                           (sf.SFRequestError, 400), (ValueError, 400)):
        def make(code: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
            async def handler(_: Request, e: Exception) -> JSONResponse:
                return error(code, str(e))
            return handler
        app.add_exception_handler(exc_type, make(code))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        errs = [{"loc": list(d.get("loc", ())), "msg": str(d.get("msg", ""))}
                for d in e.errors()[:10]]
        first = errs[0] if errs else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(x) for x in first["loc"])
        return JSONResponse({"error": f"{where}: {first['msg']}", "details": errs},
                            status_code=422)

    @app.exception_handler(ClientDisconnect)
    async def _disconnected(request: Request, e: ClientDisconnect) -> Response:
        # The client hung up mid-body: nothing of ours failed, so no traceback and no 5xx (499,
        # "client closed request"); no one reads this answer.
        log.info("client disconnected before sending the whole body",
                 extra={"request_id": request.scope.get("state", {}).get("request_id")})
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _crash(request: Request, e: Exception) -> JSONResponse:
        rid = request.scope.get("state", {}).get("request_id")
        log.error("internal error", exc_info=e, extra={"request_id": rid})
        return error(500, f"internal error (request id {rid})")

    # -- helpers ----------------------------------------------------------------------------
    def engine() -> Engine:
        if st.engine is None or not st.ready:
            raise EngineClosed("the engine is not running")
        return st.engine

    def token_of(request: Request, url_key: str | None = None) -> str | None:
        auth = request.headers.get("authorization")
        if auth and auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return request.headers.get("x-api-key") or url_key

    def authenticate(request: Request, url_key: str | None = None) -> KeyPolicy:
        if not keys.enabled and request.client is not None and \
                not is_loopback(request.client.host):
            raise Refused(403, "this server has no API keys and serves loopback clients only")
        pol = keys.authenticate(token_of(request, url_key))
        request.scope.setdefault("state", {})["key_id"] = pol.id
        return pol

    @contextlib.contextmanager
    def charged(pol: KeyPolicy, runs: int) -> Any:
        pol.admit(runs)
        pol.inflight += 1
        try:
            yield
        finally:
            pol.inflight -= 1

    def check_limits(limits: Limits) -> None:
        c = config
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
            raise ValueError("limits beyond this server's maximum: " + "; ".join(problems))

    def observe(r: ExecResult, language: str) -> ExecResult:
        st.metrics.runs.labels(r.status.value).inc()
        st.metrics.run_seconds.labels(language).observe(r.wall_time_s)
        if r.status is Status.SANDBOX_ERROR:
            st.metrics.infra_failures.inc()
        return r

    async def until_disconnect(request: Request, coro: Awaitable[T]) -> T:
        """Await ``coro``; if the client goes away first, cancel it (the engine withdraws the
        job: a queued one never runs, a running one ends within its limits)."""
        me = asyncio.current_task()
        assert me is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            while True:
                msg = await request.receive()
                if msg["type"] == "http.disconnect":
                    gone = True
                    me.cancel()
                    return

        # The work runs in this task; a watcher cancels it if the client disconnects first.
        watcher = asyncio.ensure_future(watch())
        try:
            return await coro
        except asyncio.CancelledError:
            if not gone:
                raise
            me.uncancel()  # the cancellation was ours, and is handled here
        finally:
            watcher.cancel()
        log.info("client disconnected; job withdrawn",
                 extra={"request_id": request.scope.get("state", {}).get("request_id")})
        raise _ClientGone

    @app.exception_handler(_ClientGone)
    async def _gone(_: Request, e: _ClientGone) -> Response:
        return Response(status_code=499)

    async def tasks_for(name: str | None) -> dict[str, Task]:
        names = [name] if name is not None else list(config.task_sets)
        for n in names:
            if n not in config.task_sets:
                raise ValueError(f"task set {n!r} is not served here; available: "
                                 f"{', '.join(config.task_sets) or '(none)'}")
        async with st.task_lock:
            for n in names:
                if n not in st.task_sets:
                    st.task_sets[n] = {t.id: t for t in await asyncio.to_thread(load_tasks, n)}
        merged: dict[str, Task] = {}
        for n in names:
            merged.update(st.task_sets[n])
        return merged

    async def score(pol: KeyPolicy, items: list[ScoreItemBody], reward: RewardConfig,
                    task_set: str | None, priority: Priority) -> list[CompletionResult]:
        if len(items) > config.max_score_items:
            raise ValueError(f"at most {config.max_score_items} items per request; got "
                             f"{len(items)}")
        needs_set = any(isinstance(i.task, str) and not i.task.lstrip().startswith("{")
                        for i in items)
        known = await tasks_for(task_set) if needs_set and config.task_sets else {}
        by_id: dict[str, Task] = {}
        comps: list[Completion] = []
        for n, item in enumerate(items):
            try:
                task = resolve_task(item.task, known, language=item.language)
            except LabelError as e:
                raise LabelError(f"items[{n}].task: {e}") from None
            other = by_id.setdefault(task.id, task)
            if other.version != task.version:
                raise ValueError(f"items[{n}].task: two different tasks share id {task.id!r}")
            comps.append(Completion(task_id=task.id, completion=item.completion,
                                    completion_id=item.completion_id or str(n)))
        eng = engine()
        run = eng.runner(priority=priority, client=pol.id)

        async def observed(p: Program, lim: Limits) -> ExecResult:
            return observe(await run(p, lim), p.language)

        verifier = Verifier(observed, reward=reward)
        with charged(pol, len(items)):
            results = await score_all(by_id, comps, verifier, store=st.store,
                                      concurrency=4 * eng.backend.slots)
        for r in results:
            st.metrics.verdicts.labels(r.verdict.value).inc()
        return results

    def dump(r: ExecResult) -> dict[str, Any]:
        return r.model_dump(mode="json")

    # -- operations -------------------------------------------------------------------------
    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"], responses={503: {"description": "not ready"}})
    async def readyz() -> JSONResponse:
        """Ready to accept work (slots started, not shutting down)."""
        if not st.ready or st.engine is None:
            return JSONResponse({"status": "not ready"}, status_code=503)
        s = st.engine.snapshot()
        return JSONResponse({"status": "ready", "slots": st.engine.backend.slots,
                             "queued": s.queued, "running": s.running})

    @app.get("/metrics", tags=["operations"], response_class=PlainTextResponse)
    async def metrics(request: Request,
                      api_key: Annotated[str | None, Query()] = None) -> Response:
        """Prometheus metrics (with API keys on, a key is needed unless --public-metrics)."""
        if not config.public_metrics:
            authenticate(request, api_key)
        return Response(generate_latest(st.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    if docs_keyed:
        @app.get("/openapi.json", include_in_schema=False)
        async def openapi_keyed(request: Request,
                                api_key: Annotated[str | None, Query()] = None) -> JSONResponse:
            authenticate(request, api_key)
            return JSONResponse(app.openapi())

        def spec_url(api_key: str | None) -> str:
            # The page fetches the description itself: a key given in the URL goes along.
            return "/openapi.json" + (f"?api_key={quote(api_key)}" if api_key else "")

        @app.get("/docs", include_in_schema=False)
        async def docs_keyed_page(request: Request,
                                  api_key: Annotated[str | None, Query()] = None) -> HTMLResponse:
            authenticate(request, api_key)
            return get_swagger_ui_html(openapi_url=spec_url(api_key), title="sandloop - docs")

        @app.get("/redoc", include_in_schema=False)
        async def redoc_keyed_page(request: Request,
                                   api_key: Annotated[str | None, Query()] = None) -> HTMLResponse:
            authenticate(request, api_key)
            return get_redoc_html(openapi_url=spec_url(api_key), title="sandloop - docs")

    # -- native API -------------------------------------------------------------------------
    @app.post("/v1/run", tags=["runs"])
    async def run_one(request: Request, body: RunBody) -> dict[str, Any]:
        """Run one program; returns its ExecResult JSON."""
        pol = authenticate(request)
        check_limits(body.limits)
        program = body.program
        with charged(pol, 1):
            r = await until_disconnect(request, engine().run(
                program, body.limits, priority=body.priority, client=pol.id, key=body.key,
                timeout_s=body.timeout_s))
        return dump(observe(r, program.language))

    def batch_items(body: BatchBody) -> list[tuple[Program, Limits]]:
        if len(body.requests) > config.max_batch:
            raise ValueError(f"at most {config.max_batch} programs per batch; got "
                             f"{len(body.requests)}")
        items = []
        for n, req in enumerate(body.requests):
            try:
                check_limits(req.limits)
                items.append((req.program, req.limits))
            except ValueError as e:
                raise ValueError(f"requests[{n}]: {e}") from None
        return items

    @app.post("/v1/batch", tags=["runs"])
    async def run_batch(request: Request, body: BatchBody) -> dict[str, Any]:
        """Run many programs on all slots; results in input order."""
        pol = authenticate(request)
        items = batch_items(body)
        out: list[dict[str, Any] | None] = [None] * len(items)

        async def go() -> None:
            async for i, r in engine().stream(items, priority=body.priority, client=pol.id,
                                              timeout_s=body.timeout_s):
                out[i] = dump(observe(r, items[i][0].language))

        with charged(pol, len(items)):
            await until_disconnect(request, go())
        return {"results": out}

    @app.post("/v1/stream", tags=["runs"],
              responses={200: {"content": {"application/x-ndjson": {}}}})
    async def run_stream(request: Request, body: BatchBody) -> StreamingResponse:
        """Like /v1/batch, but NDJSON lines ``{"index", "result"}`` as each run finishes."""
        pol = authenticate(request)
        items = batch_items(body)
        pol.admit(len(items))
        eng = engine()

        async def lines() -> AsyncIterator[bytes]:
            pol.inflight += 1
            try:
                async for i, r in eng.stream(items, priority=body.priority, client=pol.id,
                                             timeout_s=body.timeout_s):
                    observe(r, items[i][0].language)
                    yield (json.dumps({"index": i, "result": dump(r)}) + "\n").encode()
            finally:
                pol.inflight -= 1

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.post("/v1/score", tags=["rewards"])
    async def score_endpoint(request: Request, body: ScoreBody) -> dict[str, Any]:
        """Score completions against tasks (by id from a served task set, or given inline)."""
        pol = authenticate(request)
        results = await until_disconnect(
            request, score(pol, body.items, body.reward, body.task_set, body.priority))
        record_rollouts(request, body, results)
        return {"results": [r.model_dump(mode="json") for r in results]}

    def record_rollouts(request: Request, body: ScoreBody,
                        results: list[CompletionResult]) -> None:
        """Scores that come with a training step go to the monitor (body field or header)."""
        h = request.headers
        step = body.step if body.step is not None else h.get("x-sandloop-step")
        if step is None:
            return
        try:
            step = int(step)
        except ValueError:
            raise ValueError(f"X-Sandloop-Step: not an integer: {step!r}") from None
        st.monitor.record(results, [i.completion for i in body.items], step=step,
                          group=body.group or h.get("x-sandloop-group"),
                          run_id=body.run_id or h.get("x-sandloop-run"))

    @app.get("/dashboard", tags=["monitor"], response_class=HTMLResponse)
    async def dashboard() -> HTMLResponse:
        """The live reward-monitoring dashboard (self-contained page)."""
        return HTMLResponse(DASHBOARD_HTML)

    @app.get("/dashboard/data", tags=["monitor"])
    async def dashboard_data(request: Request, run: str | None = None,
                             since: int = -1) -> dict[str, Any]:
        """Per-step statistics after step ``since`` and the alerts of a run (default: latest)."""
        authenticate(request)
        return st.monitor.snapshot(run, since)

    @app.get("/v1/tasksets", tags=["tasks"])
    async def task_sets(request: Request) -> dict[str, Any]:
        """The task sets this server scores against by id."""
        authenticate(request)
        return {"task_sets": [{"name": n, "loaded": n in st.task_sets,
                               "tasks": len(st.task_sets[n]) if n in st.task_sets else None}
                              for n in config.task_sets]}

    @app.get("/v1/tasksets/{name}/tasks", tags=["tasks"])
    async def task_list(request: Request, name: str,
                        offset: Annotated[int, Query(ge=0)] = 0,
                        limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> dict[str, Any]:
        """Tasks of a set as a model may see them: prompt and public tests (hidden tests are
        counted, never shown)."""
        authenticate(request)
        tasks = list((await tasks_for(name)).values())
        page = tasks[offset:offset + limit]
        return {"total": len(tasks), "tasks": [{
            "id": t.id, "version": t.version, "language": t.language, "prompt": t.prompt,
            "starter_code": t.starter_code, "entry_point": t.entry_point,
            "test_kind": t.test_kind,
            "public_tests": [x.model_dump(mode="json") for x in t.public_tests],
            "hidden_tests": len(t.hidden_tests)} for t in page]}

    # -- sessions ---------------------------------------------------------------------------
    def session_of(pol: KeyPolicy, sid: str) -> Session:
        entry = st.sessions.get(sid)
        if entry is None or entry[1] != pol.id:
            raise SessionClosed(f"no session {sid!r} (closed, expired, or not yours)")
        s = entry[0]
        if s.closed:
            st.sessions.pop(sid, None)
        return s

    def sessions_held(key_id: str) -> int:
        return sum(1 for s, k in st.sessions.values() if k == key_id and not s.closed) \
            + st.opening.get(key_id, 0)

    @app.post("/v1/sessions", tags=["sessions"], status_code=201)
    async def open_session(request: Request, body: SessionOpenBody) -> dict[str, Any]:
        """Open a multi-turn session: a work dir whose files persist between runs (at most
        ``limits.workdir_mb`` capped at ``limits.memory_mb``)."""
        pol = authenticate(request)
        check_limits(body.limits)
        for sid in [k for k, (x, _) in st.sessions.items() if x.closed]:
            st.sessions.pop(sid, None)
        # Threat: idle sessions pin memory; one key must not take the whole server's share.
        cap = pol.record.max_sessions if pol.record.max_sessions is not None \
            else config.max_sessions_per_key
        held = sessions_held(pol.id)
        if held >= cap:
            raise Refused(429, f"key {pol.id!r} already holds {held} open sessions (at most "
                               f"{cap}); close some (DELETE /v1/sessions/ID) or let them expire")
        st.opening[pol.id] = st.opening.get(pol.id, 0) + 1  # counted while the open awaits
        try:
            s = await engine().open_session(language=body.language, limits=body.limits,
                                            ttl_s=body.ttl_s, idle_timeout_s=body.idle_timeout_s,
                                            client=pol.id)
        finally:
            st.opening[pol.id] -= 1
        st.sessions[s.id] = (s, pol.id)
        return {"id": s.id, "language": s.language, "ttl_s": s.ttl_s,
                "idle_timeout_s": s.idle_timeout_s}

    @app.post("/v1/sessions/{sid}/run", tags=["sessions"])
    async def session_run(request: Request, sid: str, body: SessionRunBody) -> dict[str, Any]:
        """Run a bash ``command`` or ``code`` in the session's language, in its work dir."""
        pol = authenticate(request)
        s = session_of(pol, sid)
        if (body.command is None) == (body.code is None):
            raise ValueError("give exactly one of 'command' (bash) or 'code'")
        if body.limits is not None:
            check_limits(body.limits)
        with charged(pol, 1):
            if body.command is not None:
                coro = s.run(body.command, stdin=body.stdin, limits=body.limits,
                             timeout_s=body.timeout_s)
            else:
                assert body.code is not None
                coro = s.run_code(body.code, stdin=body.stdin, limits=body.limits,
                                  timeout_s=body.timeout_s)
            r = await until_disconnect(request, coro)
        return dump(observe(r, "bash" if body.command is not None else s.language))

    @app.put("/v1/sessions/{sid}/files", tags=["sessions"])
    async def session_write(request: Request, sid: str, body: FilesBody) -> dict[str, Any]:
        """Create or replace files in the session's work dir."""
        import base64
        import binascii

        pol = authenticate(request)
        s = session_of(pol, sid)
        files: dict[str, str | bytes] = {}
        for name, content in body.files.items():
            if body.encoding == "base64":
                try:
                    files[name] = base64.b64decode(content, validate=True)
                except (binascii.Error, ValueError):
                    raise ValueError(f"files[{name!r}]: not valid base64") from None
            else:
                files[name] = content
        await s.write_files(files)
        return {"written": sorted(files)}

    @app.post("/v1/sessions/{sid}/files/read", tags=["sessions"])
    async def session_read(request: Request, sid: str, body: ReadFilesBody) -> dict[str, Any]:
        """Read regular files (base64); missing files and symlinks are left out."""
        import base64

        pol = authenticate(request)
        s = session_of(pol, sid)
        got = await s.read_files(body.paths)
        return {"files": {k: base64.b64encode(v).decode() for k, v in got.items()}}

    @app.delete("/v1/sessions/{sid}", tags=["sessions"])
    async def session_close(request: Request, sid: str) -> dict[str, Any]:
        """Close the session and delete its files."""
        pol = authenticate(request)
        s = session_of(pol, sid)
        await s.close()
        st.sessions.pop(sid, None)
        return {"closed": sid}

    # -- SandboxFusion compatibility --------------------------------------------------------
    async def run_code(request: Request, body: sf.RunCodeRequest,
                       url_key: str | None) -> Response:
        pol = authenticate(request, url_key)
        answer = sf.unsupported(body)
        if answer is None:
            program, limits = sf.to_program(
                body, default_memory_mb=config.default_sf_memory_mb,
                max_memory_mb=config.max_memory_mb, max_time_s=config.max_time_s)
            with charged(pol, 1):
                r = await until_disconnect(request, engine().run(
                    program, limits, priority="train", client=pol.id))
            answer = sf.to_response(observe(r, program.language))
        # The model is already valid: serialise it once, without FastAPI re-validating it.
        return Response(answer.model_dump_json(), media_type="application/json")

    @app.post("/run_code", tags=["sandboxfusion"], response_model=sf.RunCodeResponse)
    async def run_code_plain(request: Request, body: sf.RunCodeRequest,
                             api_key: Annotated[str | None, Query()] = None) -> Response:
        """SandboxFusion's /run_code (verl's ``sandbox_fusion.url`` points here)."""
        return await run_code(request, body, api_key)

    @app.post("/k/{api_key}/run_code", tags=["sandboxfusion"],
              response_model=sf.RunCodeResponse)
    async def run_code_keyed(request: Request, api_key: str,
                             body: sf.RunCodeRequest) -> Response:
        """/run_code with the API key in the URL, for clients that cannot send headers."""
        return await run_code(request, body, api_key)

    @app.get("/v1/ping", tags=["sandboxfusion"], response_class=PlainTextResponse)
    async def ping() -> str:
        return "pong"

    # -- OpenRLHF remote reward -------------------------------------------------------------
    async def get_reward(request: Request, body: OpenRLHFBody,
                         url_key: str | None) -> JSONResponse:
        pol = authenticate(request, url_key)
        n = len(body.query)
        labels = body.labels or []
        prompts = body.prompts or [None] * n  # type: ignore[list-item]
        if len(labels) != n or len(prompts) != n:
            raise ValueError(f"query, prompts and labels must have the same length; got "
                             f"{n}, {len(prompts)}, {len(labels)}")
        items = []
        for q, p, lab in zip(body.query, prompts, labels, strict=True):
            completion = openrlhf_completion(q, p)
            items.append(ScoreItemBody(
                task=lab if isinstance(lab, str | dict) else json.dumps(lab),
                completion=completion))
        results = await until_disconnect(
            request, score(pol, items, RewardConfig(), None, "train"))
        if any(r.reward is None for r in results):
            reasons = sorted({r.reward_reason or "infrastructure failure"
                              for r in results if r.reward is None})
            st.metrics.refused.labels("infra").inc()
            return error(503, "infrastructure failure while scoring (rewards unknown, not 0): "
                              + "; ".join(reasons)[:500], 1.0)
        rewards = [float(r.reward or 0.0) for r in results]

        def frac(r: CompletionResult) -> float:
            total = len(r.tests)
            return sum(t.verdict.value == "passed" for t in r.tests) / total if total else 0.0

        return JSONResponse({
            "rewards": rewards,
            "scores": [min(1.0, max(0.0, x)) for x in rewards],
            "extra_logs": {
                "pass_fraction": [frac(r) for r in results],
                "compile_error": [float(r.verdict.value == "compile_error") for r in results],
                "timeout": [float(r.verdict.value == "timeout") for r in results],
                "fenced_code": [float(extract_code(i.completion)[1]) for i in items],
            }})

    @app.post("/get_reward", tags=["openrlhf"])
    async def get_reward_plain(request: Request, body: OpenRLHFBody,
                               api_key: Annotated[str | None, Query()] = None) -> JSONResponse:
        """OpenRLHF's remote reward protocol (``--reward.remote_url`` points here)."""
        return await get_reward(request, body, api_key)

    @app.post("/k/{api_key}/get_reward", tags=["openrlhf"])
    async def get_reward_keyed(request: Request, api_key: str,
                               body: OpenRLHFBody) -> JSONResponse:
        """/get_reward with the API key in the URL."""
        return await get_reward(request, body, api_key)

    # The SandboxFusion routes, called once per rollout, skip FastAPI's per-request machinery
    # (see server/direct.py); their FastAPI routes stay the description and the fallback.
    def route_of(endpoint: Callable[..., Any]) -> APIRoute:
        return next(r for r in app.routes if isinstance(r, APIRoute) and r.endpoint is endpoint)

    app.add_middleware(DirectRoutes, fastapi=app, routes=[
        DirectRoute(route_of(run_code_plain), sf.RunCodeRequest,
                    lambda request, body: run_code(request, body,
                                                   request.query_params.get("api_key"))),
        DirectRoute(route_of(run_code_keyed), sf.RunCodeRequest,
                    lambda request, body: run_code(request, body,
                                                   request.path_params["api_key"])),
    ])
    app.add_middleware(RequestMiddleware, metrics=st.metrics,
                       max_body_bytes=config.max_body_bytes)
    return app


async def _resume(engine: Engine) -> None:
    """Re-run jobs accepted before a crash (their results land in the journal, where a client
    retrying with the same key finds them)."""
    started = time.monotonic()
    n = 0
    try:
        async for _key, _r in engine.resume():
            n += 1
    except (EngineClosed, asyncio.CancelledError):
        return
    if n:
        log.info("resumed jobs from the journal",
                 extra={"jobs": n, "duration_s": round(time.monotonic() - started, 3)})
