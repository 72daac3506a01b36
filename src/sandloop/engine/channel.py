"""A direct stream for runs between the driver and one node's pool actor (see docs/cluster.md).

Why not a Ray actor call per run: one costs ~1.3 ms of round trip and more than a millisecond of
CPU on each side on a 2-core node (task submission, ownership, the object store's bookkeeping),
about as much as the isolated run itself; a run's request and result are a few hundred bytes.
Ray still does everything else: it finds the nodes, places and starts their actors, ships large
inputs once through its object store, carries sessions, and reports a dead actor. The channel
carries only runs and their results, as framed JSON over one TCP connection per node.

Threats, and what stops each:

- Anyone who can reach the port could run programs on the node, or read results. The server
  binds to its node's address only, and the first bytes a client sends must be the secret the
  driver handed the actor through Ray's control plane; a peer without it is disconnected before
  anything else it sends is read (compared in constant time, within ``AUTH_TIMEOUT_S``).
- Anyone who can reach the port could hold connections open without the secret, each a file
  descriptor of the actor (its sandboxes need those) for ``AUTH_TIMEOUT_S``: at most
  ``MAX_UNAUTHENTICATED`` wait at once, and a new one drops the oldest (the driver presents the
  secret within a round trip, so a flood must outpace that to keep it out).
- A malformed or hostile frame (a compromised node, a bug): frames are bounded
  (``MAX_FRAME_BYTES``), payloads are JSON validated into the models, never unpickled; a
  protocol violation closes the connection, and the driver's runs on it end as ``NodeLost``
  (retried elsewhere), never as results.
- Confidentiality is what the network gives; Ray's own traffic is no better unless Ray's TLS is
  on, and then the cluster backend does not use a channel (``channel_allowed``).

Frames: a header ``HEADER`` (payload length, kind, request id) and the payload. A run's
payload is the program's JSON, ``SEP``, the limits' JSON; a result's is its JSON, then, when the
result carries harness bytes (``ExecResult.channel``, excluded from its JSON), ``SEP`` and those
bytes. JSON text never holds a raw ``SEP`` (control characters are escaped in JSON strings),
so the first one splits a payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import itertools
import json
import logging
import os
import socket
import struct
import sys
from collections.abc import Awaitable, Callable

from sandloop.engine.cluster import NodeLost
from sandloop.engine.journal import model_from_json, model_json
from sandloop.errors import EngineError, InputError
from sandloop.sandbox.models import ExecResult, Limits, Program

__all__ = ["AUTH_TIMEOUT_S", "SECRET_BYTES", "ChannelClient", "ChannelServer",
           "RemoteInputError", "RemoteRunError", "channel_allowed"]

log = logging.getLogger("sandloop.cluster")

HEADER = struct.Struct(">IBQ")  # payload length, kind, request id
SEP = b"\x1e"
MAX_FRAME_BYTES = 256 << 20  # larger inputs go through Ray's object store (SHIP_MIN_BYTES)
SECRET_BYTES = 32
AUTH_TIMEOUT_S = 5.0
MAX_UNAUTHENTICATED = 64
HELLO = b"sandloop-channel-1"

# Frame kinds. Driver -> node: RUN, CANCEL. Node -> driver: HELLO_K (after the secret),
# RESULT, FAILED (the run raised), BAD_INPUT (it raised an InputError: the request's fault).
RUN, CANCEL, HELLO_K, RESULT, FAILED, BAD_INPUT = 1, 2, 3, 4, 5, 6


class RemoteRunError(EngineError, RuntimeError):
    """A run raised on its node (not a result, not a lost node): the engine reports it as
    ``sandbox_error`` and retries it, as it does a local backend's failure."""


class RemoteInputError(EngineError, InputError):
    """A run's request was refused on its node as the caller's fault (for example an
    environment that node does not have): raised to the caller, never retried."""


def channel_allowed() -> bool:
    """Whether runs may use the channel: not when Ray's own traffic is TLS-protected
    (``RAY_USE_TLS``), since the channel is plain TCP and must not be weaker than Ray."""
    return os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("", "0", "false", "no")


def _frame(kind: int, rid: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), kind, rid) + payload


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, int, bytes]:
    length, kind, rid = HEADER.unpack(await reader.readexactly(HEADER.size))
    if length > MAX_FRAME_BYTES:
        raise ConnectionError(f"a frame of {length} bytes (at most {MAX_FRAME_BYTES})")
    return kind, rid, await reader.readexactly(length)


def _forget(runs: dict[int, asyncio.Task[None]], rid: int, _: object) -> None:
    runs.pop(rid, None)


def _keepalive(writer: asyncio.StreamWriter) -> None:
    # A node that vanishes without closing its sockets (power loss, partition) is also caught by
    # Ray's actor-death report (the client's watch); keep-alive is a second, slower net.
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)


def encode_result(result: ExecResult) -> bytes:
    body = result.model_dump_json().encode()
    return body if result.channel is None else body + SEP + result.channel


def decode_result(payload: bytes) -> ExecResult:
    body, sep, extra = payload.partition(SEP)
    result = ExecResult.model_validate_json(body)
    return result.model_copy(update={"channel": extra}) if sep else result


def encode_run(program: Program, limits: Limits) -> bytes:
    return model_json(program).encode() + SEP + limits.model_dump_json().encode()


def decode_run(payload: bytes) -> tuple[Program, Limits]:
    body, sep, limits = payload.partition(SEP)
    if not sep:
        raise ValueError("a run frame without limits")
    return model_from_json(Program, body.decode()), Limits.model_validate_json(limits)


def input_error(payload: bytes) -> InputError:
    """The driver's copy of an ``InputError`` a node raised: the same sandloop class where it
    is one this process has loaded (so the caller sees what a local run would raise, e.g.
    ``EnvNotFound``), else ``RemoteInputError``. Nothing is imported on a node's say-so."""
    try:
        data = json.loads(payload)
        name, message = str(data["type"]), str(data["message"])
    except (ValueError, KeyError, TypeError):
        return RemoteInputError(payload.decode(errors="replace"))
    module, _, qualname = name.rpartition(".")
    cls = getattr(sys.modules.get(module), qualname, None) \
        if module.split(".")[0] == "sandloop" else None
    if isinstance(cls, type) and issubclass(cls, InputError):
        try:
            return cls(message)
        except Exception:  # a class whose constructor wants more than a message
            pass
    return RemoteInputError(f"{qualname}: {message}")


class ChannelServer:
    """The node's end: accepts authenticated connections and runs what they send with ``run``.

    A connection's runs are stopped when it closes (the driver is gone, or gave up on them).
    """

    def __init__(self, secret: bytes,
                 run: Callable[[Program, Limits], Awaitable[ExecResult]]) -> None:
        if len(secret) != SECRET_BYTES:
            raise ValueError(f"the channel secret must be {SECRET_BYTES} bytes")
        self._secret = secret
        self._run = run
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._unauthenticated: dict[asyncio.Task[None], None] = {}  # oldest first
        self.refused = 0  # connections that did not present the secret

    async def start(self, host: str) -> int:
        """Listen on ``host`` (the node's own address, never all of them); returns the port."""
        self._server = await asyncio.start_server(self._accept, host, 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        if len(self._unauthenticated) >= MAX_UNAUTHENTICATED:
            oldest = next(iter(self._unauthenticated))
            del self._unauthenticated[oldest]  # now, not when it ends: a burst is still capped
            oldest.cancel()  # counted as refused there
        self._unauthenticated[task] = None
        try:
            try:
                token = await asyncio.wait_for(reader.readexactly(SECRET_BYTES), AUTH_TIMEOUT_S)
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                self.refused += 1
                return
            except asyncio.CancelledError:
                self.refused += 1
                raise
            finally:
                self._unauthenticated.pop(task, None)
            if not hmac.compare_digest(token, self._secret):
                self.refused += 1
                return
            _keepalive(writer)
            writer.write(_frame(HELLO_K, 0, HELLO))
            await self._serve(reader, writer)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        runs: dict[int, asyncio.Task[None]] = {}
        try:
            while True:
                kind, rid, payload = await _read_frame(reader)
                if kind == RUN and rid not in runs:
                    task = asyncio.get_running_loop().create_task(
                        self._one(rid, payload, writer))
                    runs[rid] = task
                    task.add_done_callback(functools.partial(_forget, runs, rid))
                elif kind == CANCEL:
                    if (running := runs.get(rid)) is not None:
                        running.cancel()
                else:
                    log.warning("cluster channel: protocol violation (frame kind %d); closing",
                                kind)
                    return
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            log.debug("cluster channel closed: %s", e)
        finally:
            for task in list(runs.values()):
                task.cancel()  # the driver is gone: its runs stop (their slots are freed)

    async def _one(self, rid: int, payload: bytes, writer: asyncio.StreamWriter) -> None:
        try:
            program, limits = decode_run(payload)
            out = _frame(RESULT, rid, encode_result(await self._run(program, limits)))
        except InputError as e:
            kind = f"{type(e).__module__}.{type(e).__qualname__}"
            out = _frame(BAD_INPUT, rid, json.dumps({"type": kind, "message": str(e)}).encode())
        except asyncio.CancelledError:
            raise
        except Exception as e:  # reported to the driver: it decides (retry, sandbox_error)
            out = _frame(FAILED, rid, f"{type(e).__name__}: {e}".encode(errors="replace"))
        if not writer.is_closing():
            writer.write(out)
            with contextlib.suppress(ConnectionError):
                await writer.drain()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()


class ChannelClient:
    """The driver's end, to one node: ``execute`` sends a run and waits for its result.

    When the connection ends (the node died, or broke the protocol), every run waiting on it
    and every later one raises ``NodeLost``.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 where: str) -> None:
        self._reader = reader
        self._writer = writer
        self._where = where
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[ExecResult]] = {}
        self._lost: str | None = None
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def open(cls, host: str, port: int, secret: bytes, *,
                   timeout_s: float = AUTH_TIMEOUT_S) -> ChannelClient:
        """Connect and authenticate; raises ``ConnectionError`` (or ``TimeoutError``) when the
        node's channel cannot be reached or does not answer as one."""
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
        try:
            _keepalive(writer)
            writer.write(secret)
            try:
                kind, _, payload = await asyncio.wait_for(_read_frame(reader), timeout_s)
            except asyncio.IncompleteReadError:  # refused, or not a channel: closed on us
                kind, payload = 0, b""
            if kind != HELLO_K or payload != HELLO:
                raise ConnectionError(f"{host}:{port} does not speak the sandloop channel "
                                      "(or refused this driver's secret)")
        except BaseException:
            writer.close()
            raise
        return cls(reader, writer, f"{host}:{port}")

    @property
    def lost(self) -> str | None:
        """Why the channel ended (None while it works)."""
        return self._lost

    async def execute(self, program: Program, limits: Limits) -> ExecResult:
        if self._lost is not None:
            raise NodeLost(self._lost)
        rid = next(self._ids)
        fut: asyncio.Future[ExecResult] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            self._writer.write(_frame(RUN, rid, encode_run(program, limits)))
            return await fut
        except asyncio.CancelledError:
            # The caller gave up (a cancelled job, a closing engine): stop the run on the node.
            if self._lost is None and not self._writer.is_closing():
                self._writer.write(_frame(CANCEL, rid, b""))
            raise
        finally:
            self._pending.pop(rid, None)

    async def _read_loop(self) -> None:
        reason = "the node closed the channel"
        try:
            while True:
                kind, rid, payload = await _read_frame(self._reader)
                fut = self._pending.get(rid)
                if kind not in (RESULT, FAILED, BAD_INPUT):
                    reason = f"protocol violation: frame kind {kind}"
                    return
                if fut is None or fut.done():
                    continue  # a run the driver cancelled
                if kind == RESULT:
                    try:
                        fut.set_result(decode_result(payload))
                    except ValueError as e:  # pydantic's ValidationError is one
                        reason = f"protocol violation: an invalid result ({e})"
                        return
                elif kind == BAD_INPUT:
                    fut.set_exception(input_error(payload))
                else:
                    fut.set_exception(RemoteRunError(
                        f"on node {self._where}: {payload.decode(errors='replace')}"))
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
            reason = f"the channel to {self._where} ended ({type(e).__name__}: {e})"
        finally:
            self.fail(reason)

    def fail(self, reason: str) -> None:
        """End the channel: the runs waiting on it (and any later) raise ``NodeLost``."""
        if self._lost is None:
            self._lost = reason
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(NodeLost(self._lost))
        self._writer.close()

    async def close(self) -> None:
        self.fail("the channel was closed")
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

