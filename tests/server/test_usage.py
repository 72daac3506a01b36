"""Quota use is kept in a SQLite ledger: a restart, even a crash, hands out no fresh quota."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from live import free_port, serve_process

from sandloop.server import KeyStore, add_key
from sandloop.server.auth import Refused
from sandloop.server.usage import UsageLedger, default_usage_path


def test_ledger_charges_within_the_limit_and_remembers(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite"
    a = UsageLedger(path)
    assert a.used("k") == 0
    assert a.charge("k", 2, 3) == (True, 2)
    assert a.charge("k", 2, 3) == (False, 2)  # would exceed: nothing charged
    assert a.charge("k", 1, 3) == (True, 3)
    # A second connection (another server process) sees the same use and cannot overspend.
    b = UsageLedger(path)
    assert b.used("k") == 3 and b.charge("k", 1, 3) == (False, 3)
    assert b.charge("other", 1, 1) == (True, 1)
    a.close()
    b.close()
    assert UsageLedger(path).used("k") == 3


def test_keystore_starts_from_the_ledger(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    token = add_key(keys, "q", max_runs=3)
    free = add_key(keys, "free")
    ledger = UsageLedger(default_usage_path(keys))
    store = KeyStore.load(keys)
    store.attach_ledger(ledger)
    store.authenticate(token).admit(2)
    store.authenticate(free).admit(5)  # no quota: nothing to keep
    # As after a restart: a new store on the same files.
    again = KeyStore.load(keys)
    again.attach_ledger(UsageLedger(default_usage_path(keys)))
    pol = again.authenticate(token)
    assert pol.runs == 2
    pol.admit(1)
    with pytest.raises(Refused) as e:
        pol.admit(1)
    assert e.value.status == 429 and "quota of 3" in e.value.message
    assert again.authenticate(free).runs == 0


def test_ledger_write_failure_is_503_fault_injected(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    token = add_key(keys, "q", max_runs=10)
    ledger = UsageLedger(tmp_path / "u.sqlite")
    store = KeyStore.load(keys)
    store.attach_ledger(ledger)
    ledger._db.close()  # fault injection: the file can no longer be written
    with pytest.raises(Refused) as e:
        store.authenticate(token).admit(1)
    assert e.value.status == 503 and "quota" in e.value.message


def test_unusable_ledger_stops_serve_at_start(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    add_key(keys, "q", max_runs=1)
    bad = tmp_path / "not-a-db.sqlite"
    bad.write_text("this is not SQLite")
    r = subprocess.run([sys.executable, "-m", "sandloop", "serve", "--port",
                        str(free_port()), "--api-keys-file", str(keys), "--usage-db", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "quota ledger" in r.stderr and str(bad) in r.stderr


def _serve(port: int, keys: Path) -> subprocess.Popen[bytes]:
    return serve_process(port, "--slots", "1", "--api-keys-file", str(keys))


def test_quota_survives_a_crashed_server(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    token = add_key(keys, "q", max_runs=2)
    port = free_port()
    h = {"Authorization": f"Bearer {token}"}
    prog = {"code": "print(1)", "language": "python"}
    proc = _serve(port, keys)
    try:
        codes = [httpx.post(f"http://127.0.0.1:{port}/run_code", json=prog, headers=h,
                            timeout=60).status_code for _ in range(2)]
        assert codes == [200, 200]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # a crash: no graceful shutdown
        proc.wait(30)
    assert default_usage_path(keys).exists()
    proc = _serve(port, keys)
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/run_code", json=prog, headers=h, timeout=60)
        assert r.status_code == 429 and "used 2 of its quota of 2" in r.text, r.text
    finally:
        proc.terminate()
        proc.wait(30)

