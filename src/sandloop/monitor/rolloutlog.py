"""The rollout log in SQLite: every scored completion that came with a training step.

One row per rollout, appended as scores come back (WAL: the dashboard and ``sandloop monitor
analyze`` read while the trainer writes). Export to JSON lines (the log-file format of
``records``) or Parquet (needs ``pyarrow``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from sandloop.errors import MonitorError
from sandloop.monitor.records import LOG_FIELDS, Rollout, write_log
from sandloop.store.sqlite import open_wal

__all__ = ["ParquetUnavailable", "RolloutLog", "RolloutLogError", "is_sqlite"]

SCHEMA_VERSION = 1

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rollouts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    grp TEXT,
    task_id TEXT NOT NULL,
    completion_id TEXT,
    completion TEXT NOT NULL,
    reward REAL,
    verdict TEXT,
    public_passed INTEGER, public_total INTEGER,
    hidden_passed INTEGER, hidden_total INTEGER,
    wall_time_s REAL,
    difficulty TEXT,
    source TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS rollouts_run_step ON rollouts (run_id, step);
"""

_COLUMNS = ("run_id", "step", "grp", "task_id", "completion_id", "completion", "reward",
            "verdict", "public_passed", "public_total", "hidden_passed", "hidden_total",
            "wall_time_s", "difficulty", "source")


class RolloutLogError(MonitorError, RuntimeError):
    """The rollout log cannot be opened or has an incompatible schema."""


class ParquetUnavailable(MonitorError, RuntimeError):
    """Parquet export needs pyarrow."""


def is_sqlite(path: Path) -> bool:
    """Whether ``path`` is a SQLite file (by its header)."""
    try:
        with path.open("rb") as fh:
            return fh.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def _difficulty(v: str | None) -> str | float | None:
    if v is None:
        return None
    try:
        return float(v)
    except ValueError:
        return v


class RolloutLog:
    """Append-only SQLite log of rollouts. Thread-safe (one connection under a lock)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._db = open_wal(self.path, _DDL, meta_table="meta", schema_version=SCHEMA_VERSION,
                            what="rollout log", error=RolloutLogError,
                            hint="use a new rollout log file")
        self._lock = threading.Lock()

    def append(self, rollouts: Iterable[Rollout], run_id: str = "default") -> int:
        """Record rollouts (one transaction); a rollout's own ``run_id`` wins over the
        argument. Returns how many were recorded."""
        now = time.time()
        rows = [(r.run_id or run_id, r.step, r.group, r.task_id, r.completion_id, r.completion,
                 r.reward, r.verdict, r.public_passed, r.public_total, r.hidden_passed,
                 r.hidden_total, r.wall_time_s,
                 None if r.difficulty is None else str(r.difficulty), r.source, now)
                for r in rollouts]
        if not rows:
            return 0
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(
                    f"INSERT INTO rollouts ({', '.join(_COLUMNS)}, created_at) "
                    f"VALUES ({', '.join('?' * (len(_COLUMNS) + 1))})", rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return len(rows)

    def runs(self) -> list[str]:
        """The run ids in the log, in order of first appearance."""
        with self._lock:
            rows = self._db.execute(
                "SELECT run_id FROM rollouts GROUP BY run_id ORDER BY MIN(id)").fetchall()
        return [r[0] for r in rows]

    def rollouts(self, run_id: str | None = None, *, after_id: int = 0) -> Iterator[Rollout]:
        """The rollouts of one run (all runs when None), in the order they were recorded."""
        sql = f"SELECT id, {', '.join(_COLUMNS)} FROM rollouts WHERE id > ?"
        args: list[Any] = [after_id]
        if run_id is not None:
            sql += " AND run_id = ?"
            args.append(run_id)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY id", args).fetchall()
        for row in rows:
            d = dict(zip(_COLUMNS, row[1:], strict=True))
            yield Rollout(step=d["step"], task_id=d["task_id"], completion=d["completion"],
                          reward=d["reward"], group=d["grp"], verdict=d["verdict"],
                          public_passed=d["public_passed"], public_total=d["public_total"],
                          hidden_passed=d["hidden_passed"], hidden_total=d["hidden_total"],
                          wall_time_s=d["wall_time_s"], run_id=d["run_id"],
                          completion_id=d["completion_id"],
                          difficulty=_difficulty(d["difficulty"]), source=d["source"])

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0])

    def export_jsonl(self, path: str | Path, run_id: str | None = None) -> int:
        """Write the log-file format (gzip when the name ends in .gz); returns the count."""
        return write_log(path, self.rollouts(run_id))

    def export_parquet(self, path: str | Path, run_id: str | None = None) -> int:
        """Write a Parquet file with the log-file columns; returns the count."""
        try:
            import pyarrow as pa  # type: ignore[import-not-found, unused-ignore]
            import pyarrow.parquet as pq  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise ParquetUnavailable(
                "Parquet export needs pyarrow: pip install pyarrow (or export JSON lines, "
                "-o FILE.jsonl)") from None
        rows = [r.to_dict() for r in self.rollouts(run_id)]
        cols: dict[str, list[Any]] = {f: [] for f in LOG_FIELDS}
        for d in rows:
            for f in LOG_FIELDS:
                v = d.get(f)
                cols[f].append(None if v is None else str(v) if f == "difficulty" else v)
        pq.write_table(pa.table(cols), str(path))
        return len(rows)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> RolloutLog:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

