"""Operations: Prometheus metrics, JSON logs with request ids, request-size limits (pure ASGI)."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Any, TextIO

from fastapi import HTTPException
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sandloop.engine.cluster import ClusterBackend

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from sandloop.engine import Engine

__all__ = ["JsonFormatter", "Metrics", "RequestMiddleware", "StderrHandler", "configure_logging",
           "log", "logging_configured"]

log = logging.getLogger("sandloop.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and any ``extra`` fields."""

    _skip = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3), "level": record.levelname.lower(),
            "logger": record.name, "msg": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in self._skip and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class StderrHandler(logging.StreamHandler[TextIO]):
    """A handler writing to whatever ``sys.stderr`` is when a record is emitted.

    ``logging.StreamHandler()`` keeps the ``sys.stderr`` of the moment it was made: a server
    configured while ``sys.stderr`` was a temporary stream (a test's capture, an embedding
    tool's redirect) then writes every later record to that stream, closed by then
    (``--- Logging error ---`` for each request). Looking it up per record, as logging's own
    last-resort handler does, cannot go stale."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        logging.Handler.__init__(self, level)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:  # StreamHandler.setStream; always sys.stderr
        pass


# The loggers ``sandloop serve`` writes: its own and uvicorn's (whose levels uvicorn.Config
# sets too, so they are restored with the rest).
_SERVER_LOGGERS = ("sandloop.server", "uvicorn", "uvicorn.error", "uvicorn.access",
                   "uvicorn.asgi")


def configure_logging(level: str = "info") -> None:
    """JSON log lines on stderr for the server's loggers, at ``level``. Idempotent: calling it
    again changes the level and leaves one handler, never a second. See also
    :func:`logging_configured`, which undoes it."""
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter())
    for name in _SERVER_LOGGERS:
        lg = logging.getLogger(name)
        # Only the server's own JSON handler is replaced; whatever else an embedding program
        # or a test framework attached stays (and sees nothing: propagation is off).
        lg.handlers[:] = [h for h in lg.handlers if not isinstance(h, StderrHandler)]
        lg.addHandler(handler)
        lg.setLevel(level.upper())
        lg.propagate = False


@contextlib.contextmanager
def logging_configured(level: str = "info") -> Iterator[None]:
    """:func:`configure_logging` for the block, then the loggers as they were (handlers, levels,
    propagation): ``sandloop serve`` run in-process (tests, tools) leaves logging unchanged."""
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate)
             for lg in map(logging.getLogger, _SERVER_LOGGERS)]
    configure_logging(level)
    try:
        yield
    finally:
        for lg, handlers, lvl, propagate in saved:
            lg.handlers[:] = handlers
            lg.setLevel(lvl)
            lg.propagate = propagate


class _EngineCollector(Collector):
    def __init__(self, engine: Callable[[], Engine | None]) -> None:
        self._engine = engine

    def collect(self) -> list[Metric]:
        engine = self._engine()
        if engine is None:
            return []
        s = engine.snapshot()
        out: list[Metric] = []
        for name, doc, value in (
            ("sandloop_queue_depth", "jobs waiting for a slot", s.queued),
            ("sandloop_slots_busy", "slots running a job", s.running),
            ("sandloop_slots", "sandbox slots", engine.backend.slots),
            ("sandloop_sessions_open", "open sessions", s.sessions),
            ("sandloop_engine_retried", "infrastructure retries since start", s.retried),
            ("sandloop_engine_infra_failures", "jobs that ended sandbox_error after retries",
             s.infra_failures),
            ("sandloop_engine_completed", "jobs completed since start", s.completed),
        ):
            out.append(GaugeMetricFamily(name, doc, value=value))
        if isinstance(engine.backend, ClusterBackend):
            out.extend(_cluster_metrics(engine.backend))
        return out


def _cluster_metrics(backend: ClusterBackend) -> list[Metric]:
    """Per-node gauges of a cluster engine (labelled by Ray node id and address)."""
    per_node = (
        ("sandloop_cluster_node_slots", "slots of the node's pool", "slots"),
        ("sandloop_cluster_node_running", "runs in flight on the node", "running"),
        ("sandloop_cluster_node_queued", "runs placed on the node waiting for a slot",
         "queued"),
        ("sandloop_cluster_node_runs", "runs finished on the node since the engine started",
         "runs"),
        ("sandloop_cluster_node_failures",
         "infrastructure failures on the node (sandbox_error results, loss)", "failures"),
        ("sandloop_cluster_node_runs_per_second", "runs/s on the node over the last 10 s",
         "runs_per_s"),
        ("sandloop_cluster_node_free_memory_mb", "declared memory free on the node",
         "free_memory_mb"),
    )
    status = backend.status()
    out: list[Metric] = []
    for name, doc, attr in per_node:
        g = GaugeMetricFamily(name, doc, labels=["node", "address", "state"])
        for st in status:
            g.add_metric([st.node_id, st.address, st.state], float(getattr(st, attr)))
        out.append(g)
    nodes = GaugeMetricFamily("sandloop_cluster_nodes", "cluster nodes by state",
                              labels=["state"])
    for state in ("ready", "starting", "refused", "retiring", "lost"):
        nodes.add_metric([state], sum(1 for st in status if st.state == state))
    out.append(nodes)
    out.append(GaugeMetricFamily(
        "sandloop_cluster_fragmentation",
        "share of free memory stranded on nodes with no free slot (0: all usable)",
        value=backend.fragmentation()))
    # A node whose runs fell back to Ray calls (its channel unreachable, or lost) is slower:
    # 1 while its runs take the direct channel.
    channel = GaugeMetricFamily("sandloop_cluster_node_channel",
                                "1 while the node's runs take the direct channel, 0 on Ray calls",
                                labels=["node", "address", "state"])
    for st in status:
        if st.transport in ("channel", "ray"):
            channel.add_metric([st.node_id, st.address, st.state],
                               1.0 if st.transport == "channel" else 0.0)
    out.append(channel)
    out.append(GaugeMetricFamily(
        "sandloop_cluster_stranded_memory_mb",
        "free memory on nodes with no free slot (unusable until a run ends)",
        value=backend.stranded_memory_mb()))
    return out


class Metrics:
    """The server's Prometheus registry (one per app, so tests can run several)."""

    def __init__(self, engine: Callable[[], Engine | None]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("sandloop_http_requests", "HTTP requests",
                                ["route", "method", "code"], registry=r)
        self.request_seconds = Histogram("sandloop_http_request_seconds", "HTTP request latency",
                                         ["route"], buckets=_LATENCY_BUCKETS, registry=r)
        self.runs = Counter("sandloop_runs", "sandbox runs by status", ["status"], registry=r)
        self.run_seconds = Histogram("sandloop_run_seconds", "sandbox run wall time",
                                     ["language"], buckets=_LATENCY_BUCKETS, registry=r)
        self.verdicts = Counter("sandloop_verdicts", "scored completions by verdict",
                                ["verdict"], registry=r)
        self.infra_failures = Counter("sandloop_infra_failures",
                                      "results that are sandbox_error (infrastructure)",
                                      registry=r)
        self.refused = Counter("sandloop_refused", "requests refused", ["reason"], registry=r)
        self.audits = Counter("sandloop_monitor_audits",
                              "posted rollouts re-scored on their hidden tests (live audit)",
                              registry=r)
        r.register(_EngineCollector(engine))


class RequestMiddleware:
    """Request ids (``X-Request-ID``), body-size limit (413), metrics and one JSON log line per
    request. The path is not logged for ``/k/<key>/...`` routes (the key is in the URL)."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics, max_body_bytes: int) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = None
        for k, v in scope.get("headers", []):
            if k == b"x-request-id":
                rid = v.decode("latin-1")[:64]
            elif k == b"content-length":
                try:
                    too_big = int(v) > self.max_body
                except ValueError:
                    too_big = False
                if too_big:
                    self.metrics.refused.labels("body_too_large").inc()
                    # The error shape of server/errors.py (ErrorBody), which imports us.
                    await _send_json(send, 413, {"error": f"request body exceeds "
                                                 f"{self.max_body} bytes",
                                                 "code": "body_too_large"})
                    return
        rid = rid or uuid.uuid4().hex[:16]
        scope.setdefault("state", {})["request_id"] = rid
        seen = 0
        max_body = self.max_body
        body_done = False
        gone_mid_body = False

        async def limited_receive() -> Message:
            nonlocal seen, body_done, gone_mid_body
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > max_body:
                    raise HTTPException(413, f"request body exceeds {max_body} bytes")
                body_done = not msg.get("more_body", False)
            elif msg["type"] == "http.disconnect" and not body_done:
                gone_mid_body = True
            return msg

        code = 500
        t0 = time.perf_counter()

        async def send_wrapped(msg: Message) -> None:
            nonlocal code
            if msg["type"] == "http.response.start":
                code = msg["status"]
                msg.setdefault("headers", [])
                msg["headers"] = [*msg["headers"], (b"x-request-id", rid.encode())]
            await send(msg)

        try:
            await self.app(scope, limited_receive, send_wrapped)
        finally:
            if gone_mid_body:
                # The client hung up before its request was whole: whatever the app made of the
                # cut body (FastAPI: a 400), no one got an answer and nothing of ours failed.
                code = 499
            elapsed = time.perf_counter() - t0
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(path, scope["method"], str(code)).inc()
            self.metrics.request_seconds.labels(path).observe(elapsed)
            client = scope.get("client") or ("-", 0)
            log.info("request", extra={
                "request_id": rid, "method": scope["method"], "route": path,
                "status": code, "duration_s": round(elapsed, 6), "client": client[0],
                "key_id": scope["state"].get("key_id"),
            })


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
