"""HTTP errors: one reply shape for every error, and one table from exception class to status.

Every error reply, whoever raises it (a route, FastAPI's validation, Starlette's router, the body
limit, the direct lane), is :class:`ErrorBody`: ``{"error": message, "code": code}``, plus
``details`` on a 422. ``error`` is the sentence a person reads (it says what to do next);
``code`` is the stable name a program branches on.

:data:`STATUS` maps every exception class sandloop defines to its reply (tests/server/
test_errors_table.py walks the package and fails on a class without a deliberate entry). The
caller's mistakes (``InputError``) are 4xx; refusals under load are 429/503 with
``Retry-After``; everything else, and any exception not in the table (a bare ``ValueError``
included: pydantic's ``ValidationError`` raised inside a route is a bug of ours, not the
client's), is a 500 that carries only the request id, its traceback in the log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from sandloop.engine import (
    DeadlineExceeded,
    EngineClosed,
    IdempotencyConflict,
    QueueFull,
    RateLimited,
    ResourceTooLarge,
    SessionClosed,
    SessionExpired,
    SessionFull,
    SessionLimit,
    SessionLost,
)
from sandloop.engine.channel import RemoteInputError, RemoteRunError
from sandloop.engine.cluster import ClusterUnavailable, NodeLost
from sandloop.engine.journal import JournalError
from sandloop.envs.errors import EnvBuildError, EnvNotFound, SpecError
from sandloop.episodes.episode import EpisodeFinished
from sandloop.episodes.replay import ReplayError
from sandloop.episodes.snapshots import SetupFailed
from sandloop.errors import (
    EngineError,
    EnvError,
    EpisodeError,
    InputError,
    IntegrationError,
    MonitorError,
    RewardError,
    SandboxError,
    SandloopError,
    ServerError,
    StoreError,
    TaskError,
)
from sandloop.jsonl import JsonLineError
from sandloop.monitor.records import LogFormatError
from sandloop.monitor.rolloutlog import ParquetUnavailable, RolloutLogError
from sandloop.reward.scoring import CompletionFileError
from sandloop.sandbox.cgroups import CgroupError
from sandloop.sandbox.languages import LanguageUnavailable
from sandloop.sandbox.models import ProgramInputError
from sandloop.sandbox.pool import (
    IsolationUnavailable,
    WorkspaceFull,
    WorkspaceLost,
    WorkspaceWriteError,
)
from sandloop.sandbox.requests import BatchRequestError
from sandloop.sandbox.slot import SlotBroken
from sandloop.server.auth import KeysFileError, Refused
from sandloop.server.config import ConfigError
from sandloop.server.observability import Metrics, log
from sandloop.server.sandboxfusion import SFRequestError
from sandloop.server.usage import UsageLedgerError
from sandloop.tasks.labels import LabelError
from sandloop.tasks.loaders import TaskFormatError
from sandloop.tasks.patches import PatchError
from sandloop.tasks.signature import SignatureError
from sandloop.tasks.values import ValueCodecError

__all__ = [
    "ERROR_RESPONSES",
    "STATUS",
    "ClientGone",
    "ErrorBody",
    "ErrorDetail",
    "HttpError",
    "RequestError",
    "error_response",
    "http_error",
    "install",
]


class RequestError(ServerError, InputError):
    """A request the server refuses for what its schema cannot say (400): limits above this
    server's maxima, a batch longer than it takes, a task set it does not serve."""


class ClientGone(Exception):
    """The client disconnected while its job ran; the job was withdrawn (answered 499)."""


class ErrorDetail(BaseModel):
    loc: list[str | int] = Field(description="where in the request: body, field, index")
    msg: str


class ErrorBody(BaseModel):
    """Every HTTP error of this server, 4xx and 5xx alike."""

    error: str = Field(description="what went wrong and what to do about it")
    code: str = Field(description="a stable name for the kind of error (see docs/server.md)")
    details: list[ErrorDetail] | None = Field(
        None, description="422 only: each field that does not validate (at most 10)")


# Every route documents these (FastAPI then leaves out its own 422 schema, which is not ours).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorBody, "description": "the request is refused (see `code`)"},
    "5XX": {"model": ErrorBody, "description": "the server failed, or is overloaded or "
                                               "starting/stopping (503 with Retry-After)"},
}


@dataclass(frozen=True)
class HttpError:
    """How one exception class is answered."""

    status: int
    code: str
    retry_after_s: float | None = None  # Retry-After, unless the exception carries its own
    refused: str | None = None  # counted in sandloop_refused_total under this reason
    hint: str = ""  # appended to the exception's message


# One entry per exception class sandloop defines, deliberately (the completeness test fails on a
# new class until it is added here or inherits from a class here that is not a layer's base).
STATUS: Mapping[type[Exception], HttpError] = {
    SandloopError: HttpError(500, "internal_error"),
    # -- the caller's mistakes ------------------------------------------------------------------
    InputError: HttpError(400, "invalid_input"),
    RequestError: HttpError(400, "bad_request"),
    SFRequestError: HttpError(400, "bad_request"),
    ProgramInputError: HttpError(400, "invalid_program"),
    BatchRequestError: HttpError(400, "invalid_program"),
    JsonLineError: HttpError(400, "invalid_input"),
    LabelError: HttpError(400, "invalid_task"),
    TaskFormatError: HttpError(400, "invalid_task"),
    SignatureError: HttpError(400, "invalid_task"),
    ValueCodecError: HttpError(400, "invalid_task"),
    CompletionFileError: HttpError(400, "invalid_input"),
    ResourceTooLarge: HttpError(400, "resource_too_large"),
    PatchError: HttpError(400, "invalid_patch"),
    SpecError: HttpError(400, "invalid_environment_spec"),
    EnvNotFound: HttpError(400, "unknown_environment"),
    RemoteInputError: HttpError(400, "invalid_input"),  # a cluster node's InputError
    IdempotencyConflict: HttpError(409, "idempotency_conflict"),
    EpisodeFinished: HttpError(409, "episode_finished"),
    SessionFull: HttpError(413, "session_full"),
    # What a session's programs left in its work dir is in the way of the files written.
    WorkspaceWriteError: HttpError(409, "workspace_conflict"),
    WorkspaceFull: HttpError(413, "workspace_full"),
    # -- sessions -------------------------------------------------------------------------------
    SessionClosed: HttpError(404, "session_not_found"),
    SessionExpired: HttpError(410, "session_expired"),
    SessionLost: HttpError(410, "session_lost"),
    WorkspaceLost: HttpError(410, "session_lost"),
    # -- refused under load: retry later ---------------------------------------------------------
    RateLimited: HttpError(429, "rate_limited", refused="limit"),
    QueueFull: HttpError(503, "queue_full", 1.0, refused="queue_full"),
    SessionLimit: HttpError(503, "too_many_sessions", 5.0),
    EngineClosed: HttpError(503, "unavailable", 1.0,
                            hint=" (the server is starting or shutting down; retry)"),
    JournalError: HttpError(503, "journal_unavailable", 1.0),
    ClusterUnavailable: HttpError(503, "cluster_unavailable", 5.0),
    NodeLost: HttpError(503, "node_lost", 1.0),
    UsageLedgerError: HttpError(503, "quota_ledger_unavailable", 1.0),
    DeadlineExceeded: HttpError(504, "deadline_exceeded"),
    # -- this server cannot do it ----------------------------------------------------------------
    LanguageUnavailable: HttpError(501, "language_unavailable"),
    # -- failures of ours: 500, the message kept for the log ---------------------------------
    EngineError: HttpError(500, "internal_error"),
    RemoteRunError: HttpError(500, "internal_error"),  # the engine makes it a sandbox_error
    SandboxError: HttpError(500, "internal_error"),
    IsolationUnavailable: HttpError(500, "internal_error"),
    SlotBroken: HttpError(500, "internal_error"),
    CgroupError: HttpError(500, "internal_error"),
    TaskError: HttpError(500, "internal_error"),
    RewardError: HttpError(500, "internal_error"),
    StoreError: HttpError(500, "internal_error"),
    MonitorError: HttpError(500, "internal_error"),
    EpisodeError: HttpError(500, "internal_error"),
    EnvError: HttpError(500, "internal_error"),  # environments are the operator's builds
    EnvBuildError: HttpError(500, "internal_error"),
    ReplayError: HttpError(500, "internal_error"),
    # A task whose set-up command fails is the task set's defect (the operator's), not the
    # caller's: `sandloop tasks validate` reports it before training.
    SetupFailed: HttpError(500, "task_setup_failed"),
    # A rollout log the server reads is its own file, not the caller's input.
    LogFormatError: HttpError(500, "internal_error"),
    RolloutLogError: HttpError(500, "internal_error"),
    ParquetUnavailable: HttpError(500, "internal_error"),
    IntegrationError: HttpError(500, "internal_error"),
    ServerError: HttpError(500, "internal_error"),
    KeysFileError: HttpError(500, "internal_error"),  # the operator's file, checked at start
    ConfigError: HttpError(500, "internal_error"),  # the operator's settings, checked at start
}

INTERNAL = HttpError(500, "internal_error")

# Codes of the errors Starlette and FastAPI raise themselves, by status.
_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 413: "body_too_large", 415: "unsupported_media_type",
               429: "too_many_requests", 503: "unavailable"}


def http_error(exc: BaseException) -> HttpError:
    """The reply for ``exc``: its class's entry, or its nearest ancestor's; else a 500."""
    for cls in type(exc).__mro__:
        entry = STATUS.get(cls)
        if entry is not None:
            return entry
    return INTERNAL


def error_response(status: int, code: str, message: str, *, retry_after_s: float | None = None,
                   details: list[dict[str, Any]] | None = None,
                   headers: Mapping[str, str] | None = None,
                   extra: Mapping[str, Any] | None = None) -> JSONResponse:
    """An error reply in the one shape (:class:`ErrorBody`); ``extra`` fields go along (a
    probe's ``status``)."""
    body: dict[str, Any] = {"error": message, "code": code}
    if details is not None:
        body["details"] = details
    body.update(extra or {})
    out = dict(headers or {})
    if retry_after_s is not None:
        out["Retry-After"] = str(max(1, int(retry_after_s + 0.999)))
    return JSONResponse(body, status_code=status, headers=out or None)


def request_id(request: Request) -> str | None:
    rid = request.scope.get("state", {}).get("request_id")
    return str(rid) if rid is not None else None


def internal_error(request: Request, exc: BaseException) -> JSONResponse:
    """A 500: the traceback goes to the log, the client gets only the request id (no message:
    it may name host paths or internals)."""
    rid = request_id(request)
    log.error("internal error", exc_info=exc, extra={"request_id": rid})
    return error_response(500, "internal_error", f"internal error (request id {rid}); the "
                                                 "server's log has the details")


def install(app: FastAPI, metrics: Metrics) -> None:
    """Answer every exception ``app`` lets out in the one error shape, by :data:`STATUS`."""

    async def tabled(request: Request, exc: Exception) -> Response:
        entry = http_error(exc)
        if entry.status == 500:
            return internal_error(request, exc)
        if entry.refused is not None:
            metrics.refused.labels(entry.refused).inc()
        retry = getattr(exc, "retry_after_s", None)
        return error_response(entry.status, entry.code, f"{exc}{entry.hint}",
                              retry_after_s=retry if retry is not None else entry.retry_after_s)

    # One handler per class, not one for SandloopError: the handler is picked by the nearest
    # class in the exception's MRO (FastAPI's and the direct lane's rule alike).
    for cls in STATUS:
        app.add_exception_handler(cls, tabled)

    async def refused(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, Refused)
        metrics.refused.labels({401: "auth", 403: "forbidden", 503: "unavailable"}
                               .get(exc.status, "limit")).inc()
        return error_response(exc.status, exc.code, exc.message, retry_after_s=exc.retry_after_s)

    async def invalid(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errs = [{"loc": list(d.get("loc", ())), "msg": str(d.get("msg", ""))}
                for d in exc.errors()[:10]]
        first = errs[0] if errs else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(x) for x in first["loc"])
        return error_response(422, "validation_error", f"{where}: {first['msg']}", details=errs)

    async def starlette_http(_: Request, exc: Exception) -> Response:
        # Starlette's own: 404 and 405 from the router, 413 from the body limit, 400 for a
        # body it cannot read. No path in the message: /k/<key>/... holds a key.
        assert isinstance(exc, StarletteHTTPException)
        code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = "no such endpoint (GET /openapi.json lists them)"
        elif exc.status_code == 405:
            message = "method not allowed on this endpoint (see the Allow header)"
        return error_response(exc.status_code, code, message, headers=exc.headers)

    async def gone(request: Request, exc: Exception) -> Response:
        # The client is gone (mid-body, or while its job ran): nothing of ours failed, so no
        # traceback and no 5xx; 499, "client closed request". No one reads this answer.
        if isinstance(exc, ClientDisconnect):
            log.info("client disconnected before sending the whole body",
                     extra={"request_id": request_id(request)})
        return Response(status_code=499)

    async def crash(request: Request, exc: Exception) -> Response:
        return internal_error(request, exc)

    app.add_exception_handler(Refused, refused)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, starlette_http)
    app.add_exception_handler(ClientDisconnect, gone)
    app.add_exception_handler(ClientGone, gone)
    app.add_exception_handler(Exception, crash)
