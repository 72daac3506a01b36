"""The rollout log in SQLite: every scored completion that came with a training step.

One row per rollout, appended as scores come back (WAL: the dashboard and ``sandloop monitor
analyze`` read while the trainer writes). Export to JSON lines (the log-file format of
``records``) or Parquet (needs ``pyarrow``).
"""

from __future__ import annotations

import sqlite3
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


# The result store and older rollout logs also keep meta(schema=1): this key tells the rollout
# log from any other sandloop file.
KIND = "rollouts"
_OWN_TABLES = frozenset({"meta", "rollouts", "sqlite_sequence"})


def _kind_problem(db: sqlite3.Connection, path: str, *, writing: bool) -> str | None:
    """Why the open SQLite file is not a rollout log (None: it is one, or it is empty)."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    kind = None
    if "meta" in tables:
        try:
            row = db.execute("SELECT value FROM meta WHERE key='kind'").fetchone()
        except sqlite3.Error:  # someone else's meta table, without key/value columns
            row = None
        kind = None if row is None else str(row[0])
    if kind == KIND or (not tables and writing):
        return None
    # Logs written before the kind key was kept: a rollouts table and nothing foreign. Only
    # reading also takes a rollouts table among others (rollouts appended to another file by an
    # older version stay readable; nothing is written there).
    legacy = kind is None and "rollouts" in tables and (not writing or tables <= _OWN_TABLES)
    if legacy:
        return None
    what = (f"a {kind!r} file" if kind is not None
            else f"tables {', '.join(sorted(tables))}" if tables else "no tables")
    return (f"{path} is a SQLite file but not a rollout log ({what}); "
            + ("use a new file for the rollout log" if writing
               else "give a rollout log (sandloop serve/score --rollout-log)"))


def _open_readonly(path: str) -> sqlite3.Connection:
    try:
        uri = Path(path).resolve().as_uri() + "?mode=ro"
        db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None,
                             timeout=30.0)
        problem = _kind_problem(db, path, writing=False)
        if problem is None:
            row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is not None and int(row[0]) != SCHEMA_VERSION:
                problem = (f"{path} has rollout log schema {row[0]}, this version reads "
                           f"{SCHEMA_VERSION}")
    except (sqlite3.Error, ValueError) as e:
        raise RolloutLogError(f"cannot open rollout log {path}: {e}") from None
    if problem is not None:
        db.close()
        raise RolloutLogError(problem)
    return db


def _check_before_writing(path: str) -> None:
    """Refuse an existing SQLite file that is not a rollout log before anything is written to
    it (``open_wal`` creates its tables in whatever it opens)."""
    p = Path(path)
    if path == ":memory:" or not is_sqlite(p):
        return  # new, empty, or not SQLite at all (open_wal says so)
    try:
        db = sqlite3.connect(p.resolve().as_uri() + "?mode=ro", uri=True, timeout=30.0)
        try:
            problem = _kind_problem(db, path, writing=True)
        finally:
            db.close()
    except sqlite3.Error as e:
        raise RolloutLogError(f"cannot open rollout log {path}: {e}") from None
    if problem is not None:
        raise RolloutLogError(problem)


class RolloutLog:
    """Append-only SQLite log of rollouts. Thread-safe (one connection under a lock).

    ``readonly``: open an existing rollout log for reading only (``analyze``, ``report``,
    ``export``): nothing is created or written, not even the tables. Either way a SQLite file
    that is not a rollout log is refused with ``RolloutLogError``.
    """

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = str(path)
        self.readonly = readonly
        if readonly:
            self._db = _open_readonly(self.path)
        else:
            _check_before_writing(self.path)
            self._db = open_wal(self.path, _DDL, meta_table="meta",
                                schema_version=SCHEMA_VERSION, what="rollout log",
                                error=RolloutLogError, hint="use a new rollout log file")
            try:
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('kind', ?)", (KIND,))
            except sqlite3.Error as e:
                self._db.close()
                raise RolloutLogError(f"cannot open rollout log {self.path}: {e}") from None
        self._lock = threading.Lock()

    def append(self, rollouts: Iterable[Rollout], run_id: str = "default") -> int:
        """Record rollouts (one transaction); a rollout's own ``run_id`` wins over the
        argument. Returns how many were recorded."""
        if self.readonly:
            raise RolloutLogError(f"{self.path}: opened read-only")
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

