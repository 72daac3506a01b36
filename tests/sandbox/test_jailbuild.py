"""Finding the C fast path of a child's isolation steps, built at install time (setup.py):
trust checks, the source check, and the fallback to the Python steps."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from sandloop import Limits, Program, SandboxPool, Status
from sandloop.sandbox import jailbuild
from sandloop.sandbox.jailbuild import find_jail

INSTALLED = jailbuild._library(jailbuild.PACKAGE_DIR)
needs_cc = pytest.mark.skipif(INSTALLED is None,
                              reason="sandloop was installed without a C compiler (no C helper)")


def _copy(to: Path) -> Path:
    """The installed library and its jail.c in a directory of our own (mode 0700)."""
    assert INSTALLED is not None
    to.mkdir(mode=0o700, exist_ok=True)
    shutil.copy(jailbuild.PACKAGE_DIR / "jail.c", to / "jail.c")
    lib = to / INSTALLED.name
    shutil.copy(INSTALLED, lib)
    lib.chmod(0o755)
    return lib


@needs_cc
def test_the_helper_built_at_install_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDLOOP_JAIL", raising=False)
    b = find_jail()
    assert b.path == str(INSTALLED) and "built at install" in b.detail


def test_python_steps_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDLOOP_JAIL", "python")
    b = find_jail()
    assert b.path is None and "SANDLOOP_JAIL" in b.detail


def test_no_helper_built_falls_back_to_python(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # What an install without a C compiler leaves: jail.c and no library. Nothing is compiled
    # at run time; the detail says how to get the helper.
    monkeypatch.delenv("SANDLOOP_JAIL", raising=False)
    shutil.copy(jailbuild.PACKAGE_DIR / "jail.c", tmp_path / "jail.c")
    b = find_jail(tmp_path)
    assert b.path is None and "no C helper was built" in b.detail and "reinstall" in b.detail
    assert os.listdir(tmp_path) == ["jail.c"]


@needs_cc
def test_a_helper_others_can_write_is_not_trusted(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The zygote loads the library as root: one that someone else could plant or rewrite
    # would run as root.
    monkeypatch.delenv("SANDLOOP_JAIL", raising=False)
    d = tmp_path / "pkg"
    lib = _copy(d)
    assert find_jail(d).path == str(lib)
    lib.chmod(0o777)
    b = find_jail(d)
    assert b.path is None and "not trusted" in b.detail and "writable by others" in b.detail
    lib.chmod(0o755)
    d.chmod(0o777)
    b = find_jail(d)
    assert b.path is None and "not trusted" in b.detail
    d.chmod(0o700)
    os.chown(lib, 12345, 12345)
    b = find_jail(d)
    assert b.path is None and "belongs to uid 12345" in b.detail


@needs_cc
def test_a_helper_built_from_another_jail_c_is_refused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # An install that predates the current jail.c (an editable checkout after a pull) would
    # speak an older protocol: the Python steps run until it is rebuilt.
    monkeypatch.delenv("SANDLOOP_JAIL", raising=False)
    _copy(tmp_path / "pkg")
    with open(tmp_path / "pkg" / "jail.c", "a") as f:
        f.write("/* changed */\n")
    b = find_jail(tmp_path / "pkg")
    assert b.path is None and "another version of jail.c" in b.detail


@needs_cc
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a noexec tmpfs needs root")
def test_a_library_that_cannot_load_falls_back(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Installed on a noexec mount: the library cannot be mapped executable. A zygote that tried
    # to load it would fail the slot; the check says so and uses the Python steps.
    monkeypatch.delenv("SANDLOOP_JAIL", raising=False)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec,mode=0700", "tmpfs", str(tmp_path)],
                   check=True)
    try:
        _copy(tmp_path / "pkg")
        b = find_jail(tmp_path / "pkg")
    finally:
        subprocess.run(["umount", "-l", str(tmp_path)], check=True)
    assert b.path is None and "does not load" in b.detail


@needs_cc
async def test_pool_uses_the_c_helper_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDLOOP_JAIL", raising=False)
    async with SandboxPool(1) as pool:
        r = await pool.run(Program(source="print('ok')"), Limits(time_s=5))
        assert pool.jail.path is not None
    assert r.status is Status.OK and r.stdout == "ok\n"


async def _fast_runs(pool: SandboxPool) -> int:
    reply = await pool._slots[0]._request({"op": "ping"})
    return int(reply["fast_runs"])


@needs_cc
async def test_steady_state_runs_are_served_by_the_c_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # The zygote's loop runs in jail.c while runs reuse the prepared child; anything else (a
    # first run, other tmpfs sizes, a session) goes through the Python loop and back.
    monkeypatch.delenv("SANDLOOP_JAIL", raising=False)
    async with SandboxPool(1) as pool:
        small, big = Limits(time_s=5, workdir_mb=32), Limits(time_s=5, workdir_mb=48)
        for i in range(4):
            r = await pool.run(Program(source=f"print({i})"), small)
            assert r.status is Status.OK and r.stdout == f"{i}\n"
        assert await _fast_runs(pool) == 3  # the first had no prepared child yet
        for _ in range(3):  # other sizes: the C loop hands the first back, then serves them
            r = await pool.run(Program(source="import os; print(os.statvfs('.').f_blocks * "
                                               "os.statvfs('.').f_frsize >> 20)"), big)
            assert r.status is Status.OK and r.stdout == "48\n"
        assert await _fast_runs(pool) == 5
        ws = await pool.open_workspace(small)  # session runs: the Python loop
        await pool.run_in(ws, Program(source="open('f', 'w').write('x')"), small)
        r = await pool.run_in(ws, Program(source="print(open('f').read())"), small)
        assert r.status is Status.OK and r.stdout == "x\n"
        await pool.close_workspace(ws)
        assert await _fast_runs(pool) == 5
        r = await pool.run(Program(source="print('after')"), small)
        assert r.status is Status.OK and r.stdout == "after\n"


async def test_python_steps_use_the_python_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDLOOP_JAIL", "python")
    async with SandboxPool(1) as pool:
        for _ in range(3):
            assert (await pool.run(Program(source="pass"), Limits(time_s=5))).status is Status.OK
        assert await _fast_runs(pool) == 0


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


@pytest.mark.parametrize("steps", [
    pytest.param("c", marks=needs_cc),
    "python",
])
async def test_a_prepared_child_killed_while_idle_is_replaced_fault_injected(
        steps: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fault injection: SIGKILL the idle prepared child. The loop (C or Python) must notice,
    # make another, and serve the next runs without restarting the slot.
    if steps == "python":
        monkeypatch.setenv("SANDLOOP_JAIL", "python")
    else:
        monkeypatch.delenv("SANDLOOP_JAIL", raising=False)
    lim = Limits(time_s=5)
    async with SandboxPool(1) as pool:
        assert (await pool.run(Program(source="pass"), lim)).status is Status.OK
        zygote = pool._slots[0].zygote_pid
        for _ in range(200):  # the next run's child is prepared just after this one ends
            prepared = _children(zygote)
            if prepared:
                break
            await asyncio.sleep(0.01)
        assert len(prepared) == 1
        os.kill(prepared[0], signal.SIGKILL)
        for i in range(3):
            r = await pool.run(Program(source=f"print({i})"), lim)
            assert r.status is Status.OK and r.stdout == f"{i}\n", r
        assert pool._slots[0].zygote_pid == zygote
