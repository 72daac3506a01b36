"""Exceptions the engine raises. Each says what happened and what the caller can do about it."""

from __future__ import annotations

from sandloop.engine.scheduling import QueueFull, ResourceTooLarge
from sandloop.errors import EngineError, InputError
from sandloop.sandbox.pool import WorkspaceWriteError

__all__ = [
    "DeadlineExceeded",
    "EngineClosed",
    "EngineError",
    "EngineOverloaded",
    "IdempotencyConflict",
    "QueueFull",
    "RateLimited",
    "ResourceTooLarge",
    "SessionClosed",
    "SessionExpired",
    "SessionFull",
    "SessionLimit",
    "SessionLost",
    "WorkspaceWriteError",
]

# The name the issue and the docs use for queue backpressure.
EngineOverloaded = QueueFull



class EngineClosed(EngineError, RuntimeError):
    """The engine is closed (or closing): no new jobs; queued ones were cancelled."""


class DeadlineExceeded(EngineError, TimeoutError):
    """The job's deadline (``timeout_s``) passed before its result was known.

    Unlike a ``timeout`` result, this is not the program's fault: the job waited too long in the
    queue, or the deadline was shorter than the run needed. Masked, never a reward of 0.
    """


class IdempotencyConflict(EngineError, InputError):
    """The client's idempotency key already names a job that runs a different program or
    limits. A key names one run: a retry resends the very same request; a new run needs a new
    key."""

    def __init__(self, client: str, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} (client {client!r}) was already used for a different "
            "program or limits; a key names one run: resend the same request to get its "
            "result, or use a new key for a new run")
        self.client = client
        self.key = key


class RateLimited(EngineError, RuntimeError):
    """The client used up its token bucket and its policy is ``on_limit="reject"``."""

    def __init__(self, client: str, retry_after_s: float) -> None:
        super().__init__(
            f"client {client!r} exceeded its rate limit; retry in {retry_after_s:.3f} s or "
            "configure the client with on_limit='wait'")
        self.client = client
        self.retry_after_s = retry_after_s


class SessionClosed(EngineError, RuntimeError):
    """The session was closed by its owner (or the engine shut down)."""


class SessionExpired(EngineError, RuntimeError):
    """The session passed its TTL or idle timeout and was reaped; its files are gone."""


class SessionLost(EngineError, RuntimeError):
    """The session's sandbox slot died, taking its files; open a new session."""


class SessionLimit(EngineError, RuntimeError):
    """The engine holds ``max_sessions`` open sessions, or their storage would pass
    ``session_memory_mb``; close some or raise the limit."""


class SessionFull(EngineError, InputError):
    """Files written to a session do not fit in its work dir (``workdir_mb`` capped at
    ``memory_mb``, ``workdir_inodes``); the session itself is intact."""
