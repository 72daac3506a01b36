"""Withdraw a job when its client hangs up: a queued job never runs, a running one ends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from sandloop.server.errors import ClientGone, request_id
from sandloop.server.observability import log

__all__ = ["until_disconnect"]

T = TypeVar("T")


async def until_disconnect(request: Request, coro: Awaitable[T]) -> T:
    """Await ``coro``; if the client goes away first, cancel it (the engine withdraws the job:
    a queued one never runs, a running one ends within its limits) and raise ClientGone (499)."""
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
    log.info("client disconnected; job withdrawn", extra={"request_id": request_id(request)})
    raise ClientGone
