"""Building the C fast path of a child's isolation steps: cache, trust checks, fallback."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path

import pytest

from sandloop import Limits, Program, SandboxPool, Status
from sandloop.sandbox.jailbuild import build_jail

needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                              reason="no C compiler on this host")


@needs_cc
def test_builds_once_then_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDLOOP_JAIL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = build_jail()
    assert first.path is not None and first.path.startswith(str(tmp_path / "sandloop"))
    st = os.stat(first.path)
    assert st.st_mode & 0o777 == 0o700
    again = build_jail()
    assert again.path == first.path and os.stat(again.path).st_mtime_ns == st.st_mtime_ns


@needs_cc
def test_a_cache_others_can_write_is_not_trusted(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The zygote loads the library as root: one planted in a shared directory would run as root.
    monkeypatch.delenv("SANDLOOP_JAIL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    shared = tmp_path / "sandloop"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    planted = build_jail()
    assert planted.path is not None and not planted.path.startswith(str(shared))
    shared.chmod(0o700)
    trusted = build_jail()
    assert trusted.path is not None and trusted.path.startswith(str(shared))
    # A library there that others could rewrite is rebuilt, not loaded.
    os.chmod(trusted.path, 0o666)
    rebuilt = build_jail()
    assert rebuilt.path == trusted.path and os.stat(rebuilt.path).st_mode & 0o777 == 0o700


def test_python_steps_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDLOOP_JAIL", "python")
    b = build_jail()
    assert b.path is None and "SANDLOOP_JAIL" in b.detail


def test_no_compiler_falls_back_to_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDLOOP_JAIL", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    b = build_jail()
    assert b.path is None and "no C compiler" in b.detail


@needs_cc
async def test_pool_uses_the_c_helper_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDLOOP_JAIL", raising=False)
    async with SandboxPool(1) as pool:
        r = await pool.run(Program(source="print('ok')"), Limits(time_s=5))
        assert pool.jail.path is not None
    assert r.status is Status.OK and r.stdout == "ok\n"


@needs_cc
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a noexec tmpfs needs root")
def test_a_library_that_cannot_load_falls_back(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # A cache on a noexec mount: the library builds but cannot be mapped executable. A zygote
    # that tried to load it would fail the slot; the build says so and uses the Python steps.
    import subprocess

    monkeypatch.delenv("SANDLOOP_JAIL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec,mode=0700", "tmpfs", str(tmp_path)],
                   check=True)
    try:
        b = build_jail()
    finally:
        subprocess.run(["umount", "-l", str(tmp_path)], check=True)
    assert b.path is None and "does not load" in b.detail


@needs_cc
async def test_one_off_build_dir_is_removed_with_the_pool(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDLOOP_JAIL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "sandloop").mkdir(mode=0o777)
    (tmp_path / "sandloop").chmod(0o777)  # not trusted: the pool builds its own copy
    async with SandboxPool(1) as pool:
        assert (await pool.run(Program(source="pass"), Limits(time_s=5))).status is Status.OK
        private = pool.jail.private_dir
        assert private is not None and os.path.isdir(private)
    assert not os.path.exists(private)


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
