"""The direct lane (server/direct.py) on a small FastAPI app served on 127.0.0.1: it serves what
it can, and everything else (bad bodies, other content types, other methods) gets FastAPI's own
answer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from live import LiveApp
from pydantic import BaseModel, Field

from sandloop.server.direct import DirectRoute, DirectRoutes


class Body(BaseModel):
    n: int = Field(ge=0)
    action: str = "ok"


class Teapot(Exception):
    pass


def make_app() -> FastAPI:
    app = FastAPI()

    @app.post("/thing")
    async def thing(body: Body, key: str | None = None) -> dict[str, Any]:
        return {"lane": "fastapi", "n": body.n, "key": key}

    @app.post("/k/{key}/thing")
    async def keyed(key: str, body: Body) -> dict[str, Any]:
        return {"lane": "fastapi", "n": body.n, "key": key}

    @app.exception_handler(Teapot)
    async def teapot(_: Request, e: Teapot) -> JSONResponse:
        return JSONResponse({"error": "teapot"}, status_code=418)

    async def direct(request: Request, body: Any, key: str | None) -> JSONResponse:
        if body.action == "teapot":
            raise Teapot()
        if body.action == "http":
            raise HTTPException(409, "conflict")
        if body.action == "crash":
            raise RuntimeError("boom")
        return JSONResponse({"lane": "direct", "n": body.n, "key": key,
                             "route": request.scope["route"].path})

    def route_of(endpoint: Any) -> Any:
        return next(r for r in app.routes if getattr(r, "endpoint", None) is endpoint)

    app.add_middleware(DirectRoutes, fastapi=app, routes=[
        DirectRoute(route_of(thing), Body,
                    lambda rq, b: direct(rq, b, rq.query_params.get("key"))),
        DirectRoute(route_of(keyed), Body,
                    lambda rq, b: direct(rq, b, rq.path_params["key"])),
    ])
    return app


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with LiveApp(make_app()) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        yield c


def test_a_valid_json_body_is_served_directly(client: httpx.Client) -> None:
    r = client.post("/thing?key=q", json={"n": 3})
    assert r.json() == {"lane": "direct", "n": 3, "key": "q", "route": "/thing"}
    r = client.post("/k/abc/thing", json={"n": 4})
    assert r.json() == {"lane": "direct", "n": 4, "key": "abc", "route": "/k/{key}/thing"}
    r = client.post("/thing", content=b'{"n": 5}',
                    headers={"content-type": "application/json; charset=utf-8"})
    assert r.json()["lane"] == "direct"


def test_what_the_lane_does_not_take_gets_fastapis_own_answer(client: httpx.Client) -> None:
    # A body that does not validate: FastAPI's 422, with its own details.
    r = client.post("/thing", json={"n": -1})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "n"]
    r = client.post("/thing", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    # Another content type, or none: FastAPI decides (it does not read such a body as JSON).
    for headers in ({"content-type": "text/plain"}, {}):
        r = client.post("/thing", content=b'{"n": 6}', headers=headers)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body"]
    # Other methods and paths.
    assert client.get("/thing").status_code == 405
    assert client.post("/k/a/b/thing", json={"n": 1}).status_code == 404


def test_exceptions_are_answered_by_the_apps_handlers(client: httpx.Client) -> None:
    r = client.post("/thing", json={"n": 1, "action": "teapot"})
    assert (r.status_code, r.json()) == (418, {"error": "teapot"})
    r = client.post("/thing", json={"n": 1, "action": "http"})
    assert (r.status_code, r.json()) == (409, {"detail": "conflict"})
    r = client.post("/thing", json={"n": 1, "action": "crash"})
    assert r.status_code == 500
    # uvicorn closes a connection whose request crashed; a new one is served as before.
    with httpx.Client(base_url=str(client.base_url), timeout=10) as c:
        assert c.post("/thing", json={"n": 7}).json()["lane"] == "direct"
