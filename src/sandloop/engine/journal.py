"""The engine's durable journal: submitted jobs and their outcomes (SQLite in WAL mode).

A job is keyed by its client and a caller-chosen idempotency key (or the hash of its program and
limits): keys are scoped per client, so one tenant's key never answers another's. Each row also
holds the digest of what the job runs (program and limits), so a key reused for a different
program is detected instead of answered with the other program's result. A job is recorded as
``pending`` before it is queued, and as ``done`` with its result before the result is handed to
the caller. After a crash, ``done`` jobs are answered from here (never recomputed) and
``pending`` ones are the jobs to run again. Infrastructure failures (``sandbox_error``) stay
``pending``: the run did not happen, so a later attempt must make it.

A job graph (``Engine.run_graph``) is one row of its own table, keyed like a job: the graph,
and its nodes' results inside the row as each node finishes. A graph submitted again after a
crash runs only the nodes the row does not hold; once every node ended without an
infrastructure failure the row is ``done`` and the whole result answers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from sandloop.errors import EngineError
from sandloop.sandbox.models import ExecResult, Limits, Program
from sandloop.store.sqlite import open_wal

__all__ = ["GraphEntry", "Journal", "JournalEntry", "JournalError", "PendingGraph", "PendingJob",
           "content_digest", "job_key", "model_from_json", "model_json"]

# 2: keys scoped per client (primary key (client, key)) and bound to the job's content digest.
SCHEMA_VERSION = 2

_DDL = """
CREATE TABLE IF NOT EXISTS engine_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS engine_jobs (
    client TEXT NOT NULL,
    key TEXT NOT NULL,
    digest TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'done')),
    priority INTEGER NOT NULL,
    program TEXT NOT NULL,
    limits TEXT NOT NULL,
    result TEXT,
    channel BLOB,
    attempts INTEGER NOT NULL DEFAULT 0,
    submitted_at REAL NOT NULL,
    finished_at REAL,
    PRIMARY KEY (client, key)
);
CREATE INDEX IF NOT EXISTS engine_jobs_pending ON engine_jobs (state) WHERE state = 'pending';
CREATE TABLE IF NOT EXISTS engine_graphs (
    client TEXT NOT NULL,
    key TEXT NOT NULL,
    digest TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'done')),
    priority INTEGER NOT NULL,
    graph TEXT NOT NULL,
    nodes TEXT NOT NULL DEFAULT '{}',
    submitted_at REAL NOT NULL,
    finished_at REAL,
    PRIMARY KEY (client, key)
);
"""
# The graph table joined schema 2 as a table of its own: a journal written before it gains
# it on open, and nothing of the jobs' table changed.


class JournalError(EngineError, RuntimeError):
    """The journal file cannot be opened or has an incompatible schema."""


M = TypeVar("M", bound=BaseModel)
_BYTES_TAG = "\x00bytes"  # no file name or field holds a NUL: cannot collide with content


def _tag_bytes(value: object) -> object:
    if isinstance(value, bytes):
        return {_BYTES_TAG: base64.b64encode(value).decode("ascii")}
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _untag_bytes(obj: dict[str, Any]) -> object:
    if len(obj) == 1 and _BYTES_TAG in obj:
        return base64.b64decode(obj[_BYTES_TAG])
    return obj


def model_json(model: BaseModel) -> str:
    """``model`` (a program, a graph of them) as JSON text, whatever its files and stdin hold.

    pydantic's JSON writes bytes as UTF-8 text and refuses bytes that are not (a binary input
    file, a native task's encoded values): those are written base64-tagged instead, so that a
    journaled job is never refused for its content. Bytes that are UTF-8 keep pydantic's form,
    so existing digests and rows stay what they were.
    """
    try:
        return model.model_dump_json()
    except PydanticSerializationError:
        return json.dumps(model.model_dump(), default=_tag_bytes, separators=(",", ":"))


def model_from_json(cls: type[M], text: str) -> M:
    """The ``cls`` that :func:`model_json` wrote (or pydantic's own JSON of one)."""
    return cls.model_validate(json.loads(text, object_hook=_untag_bytes))


def content_digest(program: Program, limits: Limits) -> str:
    """A hash of what runs and within which bounds (what an idempotency key is bound to)."""
    blob = model_json(program) + "\x1f" + limits.model_dump_json()
    return hashlib.sha256(blob.encode()).hexdigest()


def job_key(program: Program, limits: Limits) -> str:
    """The default idempotency key: a hash of what runs and within which bounds.

    Two submissions of the same program with the same limits by the same client are the same
    job: the second gets the first's result. Pass explicit keys to run identical programs
    independently.
    """
    return "h:" + content_digest(program, limits)


@dataclass(frozen=True)
class PendingJob:
    """A job recorded as submitted but without an outcome (to run again after a restart)."""

    key: str
    client: str
    priority: int
    program: Program
    limits: Limits
    attempts: int
    digest: str


@dataclass(frozen=True)
class JournalEntry:
    """What the journal holds for one (client, key): the job's content digest, and its result
    once done (None while pending)."""

    digest: str
    result: ExecResult | None


@dataclass(frozen=True)
class GraphEntry:
    """What the journal holds for one graph: its digest, whether every node is final, and the
    results of the nodes that finished (by node id)."""

    digest: str
    done: bool
    nodes: dict[str, ExecResult]


@dataclass(frozen=True)
class PendingGraph:
    """A graph recorded as submitted but not finished (to run again after a restart)."""

    key: str
    client: str
    priority: int
    graph: str  # its JSON form (sandloop.sandbox.graph.Graph)
    digest: str


def _node_json(result: ExecResult) -> dict[str, Any]:
    # A node's result with its channel (excluded from ExecResult's JSON form) alongside.
    return {"result": result.model_dump(mode="json"),
            "channel": None if result.channel is None else result.channel.hex()}


def _node_result(data: dict[str, Any]) -> ExecResult:
    r = ExecResult.model_validate(data["result"])
    channel = data.get("channel")
    return r if channel is None else r.model_copy(update={"channel": bytes.fromhex(channel)})


def _encode_result(result: ExecResult) -> tuple[str, bytes | None]:
    # The channel (fd 3 bytes) is excluded from the JSON form but harnesses need it back.
    return result.model_dump_json(), result.channel


def _decode_result(text: str, channel: bytes | None) -> ExecResult:
    r = ExecResult.model_validate_json(text)
    return r.model_copy(update={"channel": channel}) if channel is not None else r


class Journal:
    """SQLite-backed job records. Thread-safe (one connection, one lock); the engine calls the
    writing methods from a worker thread so commits never block its event loop."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._db = open_wal(self.path, _DDL, meta_table="engine_meta",
                            schema_version=SCHEMA_VERSION, what="engine journal",
                            error=JournalError, hint="use a new journal file")
        self._lock = threading.Lock()

    # -- reads ----------------------------------------------------------------------------------
    def done(self, keys: Sequence[str], client: str = "default") -> dict[str, ExecResult]:
        """Results of those of ``client``'s ``keys`` that are done."""
        found: dict[str, ExecResult] = {}
        with self._lock:
            for i in range(0, len(keys), 500):
                chunk = list(keys[i:i + 500])
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"SELECT key, result, channel FROM engine_jobs "
                    f"WHERE state='done' AND client=? AND key IN ({marks})",
                    [client, *chunk]).fetchall()
                for key, text, channel in rows:
                    found[key] = _decode_result(text, channel)
        return found

    def find(self, client: str, key: str) -> JournalEntry | None:
        """The entry for ``client``'s ``key`` (pending or done), or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT digest, state, result, channel FROM engine_jobs WHERE client=? AND key=?",
                (client, key)).fetchone()
        if row is None:
            return None
        digest, state, text, channel = row
        return JournalEntry(str(digest),
                            _decode_result(text, channel) if state == "done" else None)

    def pending(self) -> list[PendingJob]:
        """Jobs submitted but not finished, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT key, client, priority, program, limits, attempts, digest FROM engine_jobs"
                " WHERE state='pending' ORDER BY submitted_at, rowid").fetchall()
        return [PendingJob(k, c, int(p), model_from_json(Program, prog),
                           Limits.model_validate_json(lim), int(a), str(d))
                for k, c, p, prog, lim, a, d in rows]

    def counts(self) -> dict[str, int]:
        """Number of jobs per state."""
        with self._lock:
            rows = self._db.execute(
                "SELECT state, COUNT(*) FROM engine_jobs GROUP BY state").fetchall()
        return {str(s): int(n) for s, n in rows}

    def attempts(self, key: str, client: str = "default") -> int:
        """How many times ``client``'s ``key`` was dispatched to a sandbox (across restarts)."""
        with self._lock:
            row = self._db.execute("SELECT attempts FROM engine_jobs WHERE client=? AND key=?",
                                   (client, key)).fetchone()
        return int(row[0]) if row else 0

    # -- writes (one transaction per call: the engine batches them) -----------------------------
    def write(self, submitted: Iterable[tuple[str, str, int, Program, Limits, str]],
              started: Iterable[tuple[str, str]],
              finished: Iterable[tuple[str, str, ExecResult]]) -> None:
        """Record submissions ``(client, key, priority, program, limits, digest)`` (ignored if
        the client's key exists), dispatches ``(client, key)`` and outcomes
        ``(client, key, result)``, atomically."""
        now = time.time()
        sub = [(c, k, d, p, model_json(prog), lim.model_dump_json(), now)
               for c, k, p, prog, lim, d in submitted]
        fin = [(*_encode_result(r), now, c, k) for c, k, r in finished]
        st = list(started)
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                if sub:
                    self._db.executemany(
                        "INSERT OR IGNORE INTO engine_jobs (client, key, digest, state, priority,"
                        " program, limits, submitted_at) VALUES (?, ?, ?, 'pending', ?, ?, ?, ?)",
                        sub)
                if st:
                    self._db.executemany(
                        "UPDATE engine_jobs SET attempts = attempts + 1 WHERE client=? AND key=?",
                        st)
                if fin:
                    self._db.executemany(
                        "UPDATE engine_jobs SET state='done', result=?, channel=?, finished_at=? "
                        "WHERE client=? AND key=? AND state='pending'", fin)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    # -- graphs (one row each) ------------------------------------------------------------------
    def find_graph(self, client: str, key: str) -> GraphEntry | None:
        """The row of ``client``'s graph ``key``, or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT digest, state, nodes FROM engine_graphs WHERE client=? AND key=?",
                (client, key)).fetchone()
        if row is None:
            return None
        digest, state, nodes = row
        return GraphEntry(str(digest), state == "done",
                          {k: _node_result(v) for k, v in json.loads(nodes).items()})

    def pending_graphs(self) -> list[PendingGraph]:
        """Graphs submitted but not finished, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT key, client, priority, graph, digest FROM engine_graphs"
                " WHERE state='pending' ORDER BY submitted_at, rowid").fetchall()
        return [PendingGraph(k, c, int(p), g, str(d)) for k, c, p, g, d in rows]

    def graph_submitted(self, client: str, key: str, priority: int, graph: str,
                        digest: str) -> None:
        """Record a graph as submitted (ignored if the client's key exists)."""
        self._commit("INSERT OR IGNORE INTO engine_graphs (client, key, digest, state, priority,"
                     " graph, submitted_at) VALUES (?, ?, ?, 'pending', ?, ?, ?)",
                     (client, key, digest, priority, graph, time.time()))

    def graph_node(self, client: str, key: str, node: str, result: ExecResult) -> None:
        """Add one finished node's result to its graph's row (read and rewritten inside one
        write transaction: nodes finishing together lose nothing)."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                row = self._db.execute(
                    "SELECT nodes FROM engine_graphs WHERE client=? AND key=? AND "
                    "state='pending'", (client, key)).fetchone()
                if row is not None:
                    nodes = json.loads(row[0])
                    nodes[node] = _node_json(result)
                    self._db.execute(
                        "UPDATE engine_graphs SET nodes=? WHERE client=? AND key=?",
                        (json.dumps(nodes, separators=(",", ":")), client, key))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def graph_done(self, client: str, key: str) -> None:
        """Mark the graph final: from now on its row answers it whole."""
        self._commit("UPDATE engine_graphs SET state='done', finished_at=? "
                     "WHERE client=? AND key=?", (time.time(), client, key))

    def _commit(self, sql: str, args: tuple[Any, ...]) -> None:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute(sql, args)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
