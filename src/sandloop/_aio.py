"""The event loop sandloop's own entry points run on (CLI commands, the sync APIs).

uvloop when it is installed (a dependency; it takes about a tenth of the supervisor's CPU per
run off compared with the default loop), else asyncio's own. Library calls made from the
caller's loop (``SandboxPool``, ``Engine``) run on whatever loop the caller chose.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on :func:`new_event_loop`."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)
