"""Runs charged to each API key's quota, kept in SQLite so that a restart hands out no new quota.

The ledger is the authority for keys with ``max_runs``: the check and the charge are one
transaction, so several server processes sharing the file cannot together exceed a quota. Keys
without a quota are not written (their use costs no disk write per request). By default the
ledger lives next to the keys file (``keys.json`` -> ``keys.json.usage.sqlite``).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from sandloop.errors import ServerError
from sandloop.store.sqlite import open_wal

__all__ = ["UsageLedger", "UsageLedgerError", "default_usage_path"]

SCHEMA_VERSION = 1
_DDL = """
CREATE TABLE IF NOT EXISTS usage (key_id TEXT PRIMARY KEY, runs INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS usage_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class UsageLedgerError(ServerError, RuntimeError):
    """The quota ledger cannot be opened or written (the message names the file)."""


def default_usage_path(keys_file: Path) -> Path:
    return keys_file.with_name(keys_file.name + ".usage.sqlite")


class UsageLedger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = open_wal(str(path), _DDL, meta_table="usage_meta",
                            schema_version=SCHEMA_VERSION, what="quota ledger",
                            error=UsageLedgerError,
                            hint="move it aside to start every key's quota from zero")

    def used(self, key_id: str) -> int:
        """Runs charged to ``key_id`` so far."""
        with self._lock:
            row = self._db.execute("SELECT runs FROM usage WHERE key_id = ?", (key_id,)).fetchone()
        return int(row[0]) if row else 0

    def charge(self, key_id: str, runs: int, limit: int) -> tuple[bool, int]:
        """Add ``runs`` to ``key_id`` if that keeps it within ``limit``: (charged, runs used)."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    row = self._db.execute("SELECT runs FROM usage WHERE key_id = ?",
                                           (key_id,)).fetchone()
                    used = int(row[0]) if row else 0
                    if used + runs > limit:
                        self._db.execute("ROLLBACK")
                        return False, used
                    self._db.execute(
                        "INSERT INTO usage VALUES (?, ?) "
                        "ON CONFLICT(key_id) DO UPDATE SET runs = excluded.runs",
                        (key_id, used + runs))
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as e:
                raise UsageLedgerError(f"cannot record usage in {self.path}: {e}") from None
        return True, used + runs

    def close(self) -> None:
        with self._lock:
            self._db.close()
