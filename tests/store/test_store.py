"""The SQLite result store: WAL, idempotent by key, survives reopening, skips null rewards."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sandloop.store import ResultKey, ResultStore, StoreError


def _rec(reward: float | None, verdict: str = "passed") -> dict[str, object]:
    return {"task_id": "t", "reward": reward, "verdict": verdict, "tests": []}


def test_put_get_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    key = ResultKey("t", "v1", "c" * 32, "cfg")
    with ResultStore(path) as store:
        assert store.get(key) is None
        assert store.put(key, _rec(1.0))
        assert not store.put(key, _rec(0.0, "wrong_answer"))  # idempotent: first result kept
        assert store.get(key) == _rec(1.0)
    # A new process (new connection) sees everything committed.
    with ResultStore(path) as store:
        assert store.get(key) == _rec(1.0) and len(store) == 1
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_key_parts_all_matter(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.db") as store:
        base = ("t", "v1", "c", "cfg")
        store.put(ResultKey(*base), _rec(1.0))
        for i in range(4):
            other = list(base)
            other[i] += "x"
            assert store.get(ResultKey(*other)) is None


def test_null_rewards_are_not_stored(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.db") as store:
        key = ResultKey("t", "v", "c", "cfg")
        assert not store.put(key, _rec(None, "sandbox_error"))
        assert store.get(key) is None


def test_get_many_in_chunks(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.db") as store:
        keys = [ResultKey("t", "v", str(i), "cfg") for i in range(1200)]
        for k in keys[::2]:
            store.put(k, _rec(1.0))
        found = store.get_many(keys)
        assert set(found) == set(keys[::2])
        assert len(list(store.records("t"))) == 600


def test_committed_rows_survive_a_killed_writer(tmp_path: Path) -> None:
    # A writer process dies without closing: rows it committed must still be there.
    import subprocess
    import sys
    path = tmp_path / "r.db"
    code = (
        "import os, sys\n"
        "from sandloop.store import ResultKey, ResultStore\n"
        "s = ResultStore(sys.argv[1])\n"
        "for i in range(5):\n"
        "    s.put(ResultKey('t', 'v', str(i), 'c'), {'reward': 1.0, 'verdict': 'passed'})\n"
        "os._exit(9)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(path)], check=False)
    assert proc.returncode == 9
    with ResultStore(path) as store:
        assert len(store) == 5


def test_incompatible_schema(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    ResultStore(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value='99' WHERE key='schema'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema 99"):
        ResultStore(path)


def test_put_many_is_one_idempotent_transaction_that_skips_null_rewards(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.db") as store:
        a, b, c = (ResultKey("t", "v", x, "cfg") for x in "abc")
        store.put(a, _rec(1.0))
        assert store.put_many([(a, _rec(0.0, "wrong_answer")), (b, _rec(0.5)),
                               (c, _rec(None, "sandbox_error"))]) == 1
        assert store.get(a) == _rec(1.0)  # an existing record is kept, as put does
        assert store.get(b) == _rec(0.5) and store.get(c) is None
        assert store.put_many([]) == 0
    with ResultStore(tmp_path / "r.db") as store:  # committed: a new connection sees it
        assert len(store) == 2
