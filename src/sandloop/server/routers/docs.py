"""The API's description: ``/openapi.json``, ``/docs`` (Swagger UI) and ``/redoc``, their
assets served from the installed ``fastapi-offline`` package, so the pages work offline (no
CDN, no web fonts). With API keys on, all but the assets need a key unless ``--public-docs``:
the description tells a stranger what runs here. The assets are the generic viewers, no secret.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import fastapi_offline
from fastapi import APIRouter, HTTPException, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from sandloop.server.dependencies import StateDep, url_key

__all__ = ["ASSETS", "router"]

router = APIRouter(include_in_schema=False)

_STATIC = Path(fastapi_offline.__file__).parent / "static"
# The only files served (a fixed list: no path from the request reaches the file system).
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
_PREFIX = "/docs/assets/"


async def _check_key(request: Request, state: StateDep) -> str | None:
    """The ``?api_key=`` to pass on to the description the page loads, after checking the key
    when the docs are keyed."""
    if state.keys.enabled and not state.config.public_docs:
        await url_key(request)
        return request.query_params.get("api_key")
    return None


def _spec_url(api_key: str | None) -> str:
    # The page fetches the description itself: a key given in the URL goes along.
    return "/openapi.json" + (f"?api_key={quote(api_key)}" if api_key else "")


@router.get("/openapi.json")
async def openapi(request: Request, state: StateDep) -> JSONResponse:
    await _check_key(request, state)
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def swagger_ui(request: Request, state: StateDep) -> HTMLResponse:
    key = await _check_key(request, state)
    return get_swagger_ui_html(openapi_url=_spec_url(key), title="sandloop - docs",
                               swagger_js_url=_PREFIX + "swagger-ui-bundle.js",
                               swagger_css_url=_PREFIX + "swagger-ui.css",
                               swagger_favicon_url=_PREFIX + "favicon.png")


@router.get("/redoc")
async def redoc(request: Request, state: StateDep) -> HTMLResponse:
    key = await _check_key(request, state)
    return get_redoc_html(openapi_url=_spec_url(key), title="sandloop - docs",
                          redoc_js_url=_PREFIX + "redoc.standalone.js",
                          redoc_favicon_url=_PREFIX + "favicon.png", with_google_fonts=False)


@router.get(_PREFIX + "{name}")
async def asset(name: str) -> FileResponse:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise HTTPException(404, f"no docs asset {name[:64]!r}")
    return FileResponse(_STATIC / name, media_type=media_type,
                        headers={"Cache-Control": "public, max-age=86400"})
