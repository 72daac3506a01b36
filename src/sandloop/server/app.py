"""The HTTP service: the ASGI app that serves the routers over the engine. See docs/server.md.

Layout (FastAPI's "bigger applications"): ``routers/`` holds the routes, one router per area
(runs, sessions, rewards, curriculum, monitor, compatibility, admin, docs); ``dependencies.py`` the caller's key,
the engine and the quota; ``errors.py`` the one error shape and the exception-to-status table;
``state.py`` what the routes share; ``bodies.py`` the request bodies. A new router is one
``include_router`` line below. Routers take no ``prefix``: each route spells its whole path,
which is the ``route`` label of the metrics and logs (FastAPI puts the router's own route, with
the router-relative path, in the request's scope).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI

from sandloop.engine import Engine, EngineClosed
from sandloop.server import errors
from sandloop.server.auth import KeyStore
from sandloop.server.config import ServerConfig, check_config
from sandloop.server.direct import DirectRoutes
from sandloop.server.observability import RequestMiddleware, log
from sandloop.server.routers import (
    admin,
    compatibility,
    curriculum,
    docs,
    monitor,
    rewards,
    runs,
    sessions,
)
from sandloop.server.routers.episodes import episodes_router
from sandloop.server.state import ServerState
from sandloop.server.usage import UsageLedger, default_usage_path
from sandloop.store import ResultStore

__all__ = ["create_app"]


def create_app(config: ServerConfig | None = None, *, keys: KeyStore | None = None) -> FastAPI:
    """The ASGI app. The engine starts in the app's lifespan and closes on shutdown. Raises
    ConfigError for settings it cannot honour (before anything starts)."""
    config = config or ServerConfig()
    check_config(config)
    keys = keys if keys is not None else KeyStore.load(config.keys_file)
    ledger: UsageLedger | None = None
    usage_path = config.usage_db or (default_usage_path(config.keys_file)
                                     if config.keys_file is not None else None)
    if keys.enabled and usage_path is not None:
        # Quota use outlives the process: a restart must not hand out fresh quotas.
        ledger = UsageLedger(usage_path)
        keys.attach_ledger(ledger)
    st = ServerState(config, keys, ledger)

    app = FastAPI(
        title="sandloop", version="1", lifespan=_lifespan,
        # Served by routers/docs.py: offline assets, and a key when keys are on.
        openapi_url=None, docs_url=None, redoc_url=None,
        description="Isolated execution and trustworthy rewards for RL post-training: the "
                    "native API, SandboxFusion's /run_code and OpenRLHF's remote reward. "
                    "Every error answers `{\"error\": message, \"code\": code}` "
                    "(see docs/server.md).")
    app.state.sandloop = st
    errors.install(app, st.metrics)

    app.include_router(runs.router)
    app.include_router(rewards.router)
    app.include_router(sessions.router)
    app.include_router(compatibility.router)
    app.include_router(curriculum.router)
    app.include_router(monitor.router)
    app.include_router(admin.router)
    app.include_router(docs.router)
    app.include_router(episodes_router(config))

    # The SandboxFusion routes, called once per rollout, skip FastAPI's per-request machinery
    # (see server/direct.py); their FastAPI routes stay the description and the fallback.
    app.add_middleware(DirectRoutes, fastapi=app, routes=compatibility.direct_routes())
    app.add_middleware(RequestMiddleware, metrics=st.metrics,
                       max_body_bytes=config.max_body_bytes)
    return app


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    st: ServerState = app.state.sandloop
    config = st.config
    engine = Engine(slots=config.slots, isolation=config.isolation,
                    journal=config.journal, preload=config.preload,
                    max_sessions=config.max_sessions,
                    session_memory_mb=config.session_memory_mb,
                    cluster="ray" if config.ray_address else None,
                    address=config.ray_address)
    await engine.start()
    for pol in st.keys.policies():
        engine.configure_client(pol.id, weight=pol.record.weight)
    st.engine = engine
    if config.db is not None:
        config.db.parent.mkdir(parents=True, exist_ok=True)
        st.store = ResultStore(config.db)
    if engine.journal is not None:
        st.resume_task = asyncio.create_task(_resume(engine))
    st.ready = True
    # "ready" itself is logged by `sandloop serve` once the port listens (server/cli.py).
    log.info("engine started", extra={"slots": engine.backend.slots, "keys": st.keys.enabled})
    try:
        yield
    finally:
        st.ready = False
        log.info("shutting down: finishing in-flight work")
        if st.resume_task is not None:
            st.resume_task.cancel()
        for task in list(st.background):  # live audits: the rollouts are recorded already
            task.cancel()
        await asyncio.gather(*st.background, return_exceptions=True)
        await engine.close()
        if st.store is not None:
            st.store.close()
        if st.ledger is not None:
            st.ledger.close()
        st.monitor.close()
        st.engine = None


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
