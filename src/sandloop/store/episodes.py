"""A durable log of episodes: the task, every tool call with its observation and timing, and the
outcome (SQLite in WAL mode; may share a file with the result store).

Rows are JSON text so the log stays readable without sandloop; ``sandloop episodes replay ID``
re-runs an episode from it. Each call is committed as it happens, so a crash keeps every call
that returned.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandloop.errors import StoreError
from sandloop.store.sqlite import open_wal

__all__ = ["CallRecord", "EpisodeLog", "EpisodeRecord"]

SCHEMA_VERSION = 1

_DDL = """
CREATE TABLE IF NOT EXISTS episode_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS episodes (
    id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    task TEXT NOT NULL,
    config TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    ended_by TEXT,
    reward REAL,
    verdict TEXT,
    outcome TEXT
);
CREATE TABLE IF NOT EXISTS episode_calls (
    episode_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    observation TEXT NOT NULL,
    started_at REAL NOT NULL,
    wall_s REAL NOT NULL,
    PRIMARY KEY (episode_id, seq)
);
"""


@dataclass(frozen=True)
class CallRecord:
    """One tool call as recorded."""

    seq: int
    tool: str
    arguments: dict[str, Any]
    observation: dict[str, Any]
    started_at: float
    wall_s: float


@dataclass(frozen=True)
class EpisodeRecord:
    """One episode as recorded: ``task`` is the task's JSON line, ``config`` the episode's."""

    id: str
    task_id: str
    task: str
    config: dict[str, Any]
    started_at: float
    ended_at: float | None
    ended_by: str | None
    reward: float | None
    verdict: str | None
    outcome: dict[str, Any] | None
    calls: list[CallRecord] = field(default_factory=list)


class EpisodeLog:
    """Episodes and their calls in one SQLite file (thread-safe, one connection)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = open_wal(
            self.path, _DDL, meta_table="episode_meta", schema_version=SCHEMA_VERSION,
            what="episode log", error=StoreError,
            hint="record new episodes in another file (--db)")

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError(f"the episode log {self.path} is closed")
        return self._db

    def _write(self, sql: str, args: tuple[Any, ...]) -> None:
        with self._lock:
            try:
                self._conn().execute(sql, args)
            except sqlite3.Error as e:
                raise StoreError(f"cannot write to the episode log {self.path}: {e}") from None

    def begin(self, episode_id: str, task_id: str, task: str, config: dict[str, Any],
              started_at: float) -> None:
        """Record a new episode."""
        self._write("INSERT INTO episodes (id, task_id, task, config, started_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (episode_id, task_id, task, json.dumps(config), started_at))

    def call(self, episode_id: str, rec: CallRecord) -> None:
        """Record one tool call."""
        self._write("INSERT INTO episode_calls VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (episode_id, rec.seq, rec.tool, json.dumps(rec.arguments),
                     json.dumps(rec.observation), rec.started_at, rec.wall_s))

    def end(self, episode_id: str, *, ended_at: float, ended_by: str, reward: float | None,
            verdict: str | None, outcome: dict[str, Any] | None) -> None:
        """Record how the episode ended."""
        self._write("UPDATE episodes SET ended_at=?, ended_by=?, reward=?, verdict=?, outcome=? "
                    "WHERE id=?", (ended_at, ended_by, reward, verdict,
                                   json.dumps(outcome) if outcome is not None else None,
                                   episode_id))

    def get(self, episode_id: str) -> EpisodeRecord | None:
        """The episode with its calls in order, or None."""
        with self._lock:
            db = self._conn()
            row = db.execute("SELECT id, task_id, task, config, started_at, ended_at, ended_by, "
                             "reward, verdict, outcome FROM episodes WHERE id=?",
                             (episode_id,)).fetchone()
            if row is None:
                return None
            calls = db.execute("SELECT seq, tool, arguments, observation, started_at, wall_s "
                               "FROM episode_calls WHERE episode_id=? ORDER BY seq",
                               (episode_id,)).fetchall()
        return EpisodeRecord(
            row[0], row[1], row[2], json.loads(row[3]), row[4], row[5], row[6], row[7], row[8],
            json.loads(row[9]) if row[9] is not None else None,
            [CallRecord(c[0], c[1], json.loads(c[2]), json.loads(c[3]), c[4], c[5])
             for c in calls])

    def ids(self, limit: int = 100) -> list[str]:
        """The most recent episode ids, newest first."""
        with self._lock:
            rows = self._conn().execute("SELECT id FROM episodes ORDER BY started_at DESC "
                                        "LIMIT ?", (limit,)).fetchall()
        return [r[0] for r in rows]

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
