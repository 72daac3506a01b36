"""Exceptions the engine raises. Each says what happened and what the caller can do about it."""

from __future__ import annotations

from sandloop.engine.scheduling import QueueFull, ResourceTooLarge
from sandloop.sandbox.pool import WorkspaceWriteError

__all__ = [
    "DeadlineExceeded",
    "EngineClosed",
    "EngineError",
    "EngineOverloaded",
    "QueueFull",
    "RateLimited",
    "ResourceTooLarge",
    "SessionClosed",
    "SessionExpired",
    "SessionLimit",
    "SessionLost",
    "WorkspaceWriteError",
]

# The name the issue and the docs use for queue backpressure.
EngineOverloaded = QueueFull


class EngineError(RuntimeError):
    """Base class of the engine's own failures (never a program's result)."""


class EngineClosed(EngineError):
    """The engine is closed (or closing): no new jobs; queued ones were cancelled."""


class DeadlineExceeded(EngineError, TimeoutError):
    """The job's deadline (``timeout_s``) passed before its result was known.

    Unlike a ``timeout`` result, this is not the program's fault: the job waited too long in the
    queue, or the deadline was shorter than the run needed. Masked, never a reward of 0.
    """


class RateLimited(EngineError):
    """The client used up its token bucket and its policy is ``on_limit="reject"``."""

    def __init__(self, client: str, retry_after_s: float) -> None:
        super().__init__(
            f"client {client!r} exceeded its rate limit; retry in {retry_after_s:.3f} s or "
            "configure the client with on_limit='wait'")
        self.client = client
        self.retry_after_s = retry_after_s


class SessionClosed(EngineError):
    """The session was closed by its owner (or the engine shut down)."""


class SessionExpired(EngineError):
    """The session passed its TTL or idle timeout and was reaped; its files are gone."""


class SessionLost(EngineError):
    """The session's sandbox slot died, taking its files; open a new session."""


class SessionLimit(EngineError):
    """The engine holds ``max_sessions`` open sessions; close some or raise the limit."""
