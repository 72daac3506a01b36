"""Opening a SQLite file the way every durable record in sandloop needs it."""

from __future__ import annotations

import sqlite3


def open_wal(path: str, ddl: str, *, meta_table: str, schema_version: int, what: str,
             error: type[Exception], hint: str) -> sqlite3.Connection:
    """Open ``path`` in WAL mode, create the tables, and check the schema version.

    WAL: readers never block the writer, and a committed row survives a crash of the process;
    ``synchronous=NORMAL`` is durable across process crashes (not power loss). One connection,
    usable from any thread (callers serialise with their own lock). ``error`` is raised with a
    message naming ``what`` and the file; ``hint`` says what to do on a schema mismatch.
    """
    try:
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30.0)
        if path != ":memory:":
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise error(f"{path}: SQLite refused WAL mode (got {mode!r})")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(ddl)
        row = db.execute(f"SELECT value FROM {meta_table} WHERE key='schema'").fetchone()
    except sqlite3.Error as e:
        raise error(f"cannot open {what} {path}: {e}") from None
    if row is None:
        db.execute(f"INSERT INTO {meta_table} VALUES ('schema', ?)", (str(schema_version),))
    elif int(row[0]) != schema_version:
        raise error(f"{path} has {what} schema {row[0]}, this version uses {schema_version}; "
                    f"{hint}")
    return db
