"""Operations: liveness, readiness, Prometheus metrics, the live reward dashboard."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sandloop.monitor.dashboard import DASHBOARD_HTML
from sandloop.server.auth import tenant_run, tenant_runs
from sandloop.server.dependencies import StateDep, UrlKey, url_key
from sandloop.server.errors import ERROR_RESPONSES, error_response

__all__ = ["router"]

router = APIRouter(responses=ERROR_RESPONSES)


@router.get("/healthz", tags=["operations"])
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz", tags=["operations"])
async def readyz(state: StateDep) -> Response:
    """Ready to accept work (slots started, not shutting down); else 503."""
    engine = state.engine
    if not state.ready or engine is None:
        # The error shape, with the probe's own "status" kept for those who read it.
        return error_response(503, "not_ready", "not ready: starting, or shutting down",
                              retry_after_s=1.0, extra={"status": "not ready"})
    s = engine.snapshot()
    return JSONResponse({"status": "ready", "slots": engine.backend.slots,
                         "queued": s.queued, "running": s.running})


@router.get("/metrics", tags=["operations"], response_class=PlainTextResponse)
async def metrics(request: Request, state: StateDep, api_key: str | None = None) -> Response:
    """Prometheus metrics (with API keys on, a key is needed unless --public-metrics)."""
    if not state.config.public_metrics:
        await url_key(request)
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/dashboard", tags=["monitor"], response_class=HTMLResponse)
async def dashboard() -> HTMLResponse:
    """The live reward-monitoring dashboard (self-contained page)."""
    return HTMLResponse(DASHBOARD_HTML)


@router.get("/dashboard/data", tags=["monitor"])
async def dashboard_data(key: UrlKey, state: StateDep, run: str | None = None,
                         since: int = -1) -> dict[str, Any]:
    """Per-step statistics after step ``since`` and the alerts of one of the key's runs
    (default: its latest); ``runs`` lists the key's runs only."""
    mine = tenant_runs(key.id, state.monitor.run_names())
    name = tenant_run(key.id, run) if run is not None else (mine[-1] if mine else None)
    if name is None or name not in mine:
        return {"runs": mine, "run": name, "steps": [], "alerts": []}
    return {**state.monitor.snapshot(name, since), "runs": mine}
