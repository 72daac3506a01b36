"""FastAPI dependencies of the routes: the server's state, the caller's API key, the running
engine, and the key's quota. Plain functions, so the direct lane (server/direct.py) calls the
same ones by hand. They are ``async`` although they never wait: FastAPI runs a plain ``def``
dependency in its thread pool, a thread hop per dependency per request."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request

from sandloop.engine import Engine
from sandloop.server.auth import KeyPolicy, Refused
from sandloop.server.config import is_loopback
from sandloop.server.state import ServerState

__all__ = [
    "EngineDep",
    "Key",
    "Quota",
    "QuotaDep",
    "StateDep",
    "UrlKey",
    "UrlQuotaDep",
    "authenticate",
    "get_state",
    "state_of",
]


def state_of(request: Request) -> ServerState:
    state: ServerState = request.app.state.sandloop
    return state


async def get_state(request: Request) -> ServerState:
    return state_of(request)


StateDep = Annotated[ServerState, Depends(get_state)]


def _token(request: Request, url_key: str | None) -> str | None:
    auth = request.headers.get("authorization")
    if auth and auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key") or url_key


def authenticate(request: Request, url_key: str | None = None) -> KeyPolicy:
    """The caller's key policy (anonymous without keys); Refused 401/403 otherwise. The key id
    goes into the request's log line."""
    keys = state_of(request).keys
    # Threat: without keys anyone who reaches the port could run code; only loopback may.
    if not keys.enabled and request.client is not None and \
            not is_loopback(request.client.host):
        raise Refused(403, "this server has no API keys and serves loopback clients only")
    pol = keys.authenticate(_token(request, url_key))
    request.scope.setdefault("state", {})["key_id"] = pol.id
    return pol


async def header_key(request: Request) -> KeyPolicy:
    """The key from ``Authorization: Bearer`` or ``X-API-Key`` (native API)."""
    return authenticate(request)


async def url_key(request: Request) -> KeyPolicy:
    """The key from the headers, or from the URL (``/k/<key>/...`` or ``?api_key=``), for
    clients that cannot send headers (compatibility endpoints, docs, metrics)."""
    return authenticate(request, request.path_params.get("api_key")
                        or request.query_params.get("api_key"))


Key = Annotated[KeyPolicy, Depends(header_key)]
UrlKey = Annotated[KeyPolicy, Depends(url_key)]


async def running_engine(request: Request) -> Engine:
    """The engine; EngineClosed (503) while the server starts or drains."""
    return state_of(request).running_engine()


EngineDep = Annotated[Engine, Depends(running_engine)]


class Quota:
    """A key's quota and concurrency limits, charged by the route once it knows how many runs
    a request holds and that the request is valid (an invalid request spends nothing)."""

    def __init__(self, key: KeyPolicy) -> None:
        self.key = key

    def admit(self, runs: int) -> None:
        """Charge ``runs`` runs or raise Refused (429; 503 if the ledger cannot be written)."""
        self.key.admit(runs)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Count one request in flight for the key while the block runs."""
        self.key.inflight += 1
        try:
            yield
        finally:
            self.key.inflight -= 1

    @contextlib.contextmanager
    def charge(self, runs: int) -> Iterator[None]:
        """:meth:`admit` ``runs``, then hold a request in flight while the block runs."""
        self.admit(runs)
        with self.holding():
            yield


async def quota(key: Key) -> Quota:
    return Quota(key)


async def url_quota(key: UrlKey) -> Quota:
    return Quota(key)


QuotaDep = Annotated[Quota, Depends(quota)]
UrlQuotaDep = Annotated[Quota, Depends(url_quota)]
