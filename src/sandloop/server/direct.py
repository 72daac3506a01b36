"""A direct lane for the hottest POST routes: those a trainer calls once per rollout.

FastAPI's per-request machinery (routing through every route, dependency solving, body parsing
into a model field, its exception and exit-stack middlewares) costs ~0.6 ms of CPU per request
here: half of what the server spent on HTTP for a `/run_code` request, and a quarter of what
supervising the sandbox run costs it (docs/server.md). :class:`DirectRoutes` serves the routes given to it with only what they need:
match the path, read the body, validate it with the route's own model, call the endpoint.

The FastAPI route stays the description (OpenAPI) and the fallback: a request whose body does
not validate, whose content type is not JSON, or that the lane does not take for any other
reason goes to FastAPI unchanged (its body replayed), so every error a client can provoke is
answered by the same code as before. Exceptions the endpoint raises are answered by the app's
own exception handlers.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["DirectRoute", "DirectRoutes"]


@dataclass(frozen=True)
class DirectRoute:
    """One POST route served directly: FastAPI's ``route`` (its path pattern, and its name in
    metrics and logs), the body's ``model``, and ``endpoint(request, body)``."""

    route: APIRoute
    model: type[BaseModel]
    endpoint: Callable[[Request, Any], Awaitable[Response]]


class DirectRoutes:
    """ASGI middleware serving ``routes`` directly; everything else goes to ``app``."""

    def __init__(self, app: ASGIApp, *, fastapi: FastAPI, routes: list[DirectRoute]) -> None:
        self.app = app
        self.fastapi = fastapi
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        for d in self.routes:
            m = d.route.path_regex.match(path)
            if m is not None:
                await self._serve(d, m.groupdict(), scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _serve(self, d: DirectRoute, params: dict[str, str], scope: Scope,
                     receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            body = await request.body()
        except Exception as e:  # the body limit (413), a client gone: as FastAPI would answer
            scope["route"] = d.route  # counted under its route, not as "unmatched"
            await self._answer(e, request, scope, receive, send)
            return
        ctype = request.headers.get("content-type", "")
        model: BaseModel | None = None
        if ctype.split(";", 1)[0].strip().lower() == "application/json":
            with contextlib.suppress(ValidationError):  # FastAPI words the 422
                model = d.model.model_validate_json(body)
        if model is None:
            await self.app(scope, _replay(body, receive), send)
            return
        scope["route"] = d.route
        scope["endpoint"] = d.route.endpoint
        scope["path_params"] = params
        try:
            response = await d.endpoint(request, model)
        except Exception as e:
            await self._answer(e, request, scope, receive, send)
            return
        await response(scope, receive, send)

    async def _answer(self, exc: Exception, request: Request, scope: Scope, receive: Receive,
                      send: Send) -> None:
        """Answer ``exc`` with the handler FastAPI's exception middleware would pick; what it
        would not handle (500s) goes on up to the server-error middleware, as it would."""
        handlers = self.fastapi.exception_handlers
        for cls in type(exc).__mro__:
            if cls is Exception:
                break
            handler = handlers.get(cls)
            if handler is not None:
                response = handler(request, exc)
                if inspect.isawaitable(response):
                    response = await response
                await response(scope, receive, send)
                return
        raise exc


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with the already-read body given back first."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again
