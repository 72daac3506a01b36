"""A durable, idempotent store of scored results (SQLite in WAL mode).

A result is keyed by (task id, task version, completion hash, config hash): the same completion of
the same task version under the same verifier/reward configuration is never recomputed, and a
result is committed as soon as it is known, so a crash loses only runs still in flight.
Results whose reward is null (the infrastructure failed) are not stored: a later run retries them.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from sandloop.errors import StoreError
from sandloop.store.sqlite import open_wal

__all__ = ["ResultKey", "ResultStore", "StoreError"]

SCHEMA_VERSION = 1

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    task_version TEXT NOT NULL,
    completion_hash TEXT NOT NULL,
    config_hash TEXT NOT NULL,
    reward REAL,
    verdict TEXT NOT NULL,
    record TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS results_task ON results (task_id, task_version);
"""



class ResultKey(tuple[str, str, str, str]):
    """(task id, task version, completion hash, config hash)."""

    __slots__ = ()

    def __new__(cls, task_id: str, task_version: str, completion_hash: str,
                config_hash: str) -> ResultKey:
        return super().__new__(cls, (task_id, task_version, completion_hash, config_hash))

    @property
    def digest(self) -> str:
        """Stable primary key string."""
        return hashlib.sha256("\x1f".join(self).encode()).hexdigest()


class ResultStore:
    """SQLite-backed result records. Thread-safe; one connection guarded by a lock.

    Usable as a context manager. ``path=":memory:"`` gives a throwaway store.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._db = open_wal(self.path, _DDL, meta_table="meta", schema_version=SCHEMA_VERSION,
                            what="result store", error=StoreError, hint="use a new --db file")
        self._lock = threading.Lock()

    def get(self, key: ResultKey) -> dict[str, Any] | None:
        """The stored record for ``key``, or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT record FROM results WHERE key=?", (key.digest,)
            ).fetchone()
        return json.loads(row[0]) if row else None

    def get_many(self, keys: Iterable[ResultKey]) -> dict[ResultKey, dict[str, Any]]:
        """Stored records for those of ``keys`` that have one."""
        wanted = {k.digest: k for k in keys}
        found: dict[ResultKey, dict[str, Any]] = {}
        digests = list(wanted)
        with self._lock:
            for i in range(0, len(digests), 500):
                chunk = digests[i:i + 500]
                marks = ",".join("?" * len(chunk))
                for digest, record in self._db.execute(
                    f"SELECT key, record FROM results WHERE key IN ({marks})", chunk
                ):
                    found[wanted[digest]] = json.loads(record)
        return found

    def put(self, key: ResultKey, record: dict[str, Any]) -> bool:
        """Store ``record`` (committed before returning). Null-reward records are not stored.

        Returns whether it was stored. An existing record for the key is kept (idempotent).
        """
        reward = record.get("reward")
        if reward is None:
            return False
        blob = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO results VALUES (?,?,?,?,?,?,?,?,?)",
                (key.digest, key[0], key[1], key[2], key[3], float(reward),
                 str(record.get("verdict", "")), blob, time.time()),
            )
        return cur.rowcount == 1

    def put_many(self, items: Iterable[tuple[ResultKey, dict[str, Any]]]) -> int:
        """Store many records in one transaction (committed before returning); null-reward
        records are skipped and existing keys kept, as :meth:`put`. Returns how many were new."""
        rows = [(key.digest, key[0], key[1], key[2], key[3], float(record["reward"]),
                 str(record.get("verdict", "")),
                 json.dumps(record, separators=(",", ":"), ensure_ascii=False), time.time())
                for key, record in items if record.get("reward") is not None]
        if not rows:
            return 0
        with self._lock:
            before = self._db.total_changes
            # The connection autocommits (isolation_level=None): one explicit transaction.
            self._db.execute("BEGIN")
            try:
                self._db.executemany(
                    "INSERT OR IGNORE INTO results VALUES (?,?,?,?,?,?,?,?,?)", rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return self._db.total_changes - before

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def records(self, task_id: str | None = None) -> Iterator[dict[str, Any]]:
        """All stored records (optionally of one task), oldest first."""
        sql = "SELECT record FROM results"
        args: tuple[str, ...] = ()
        if task_id is not None:
            sql += " WHERE task_id=?"
            args = (task_id,)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY created_at", args).fetchall()
        for (record,) in rows:
            yield json.loads(record)

    def close(self) -> None:
        """Close the connection (checkpointing the WAL)."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
