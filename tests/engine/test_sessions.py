"""Multi-turn sessions over real sandboxes: persistence, expiry, reaping, limits."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from engine_helpers import until

from sandloop import Limits, Program, Status
from sandloop.engine import (
    Engine,
    LocalBackend,
    SessionClosed,
    SessionExpired,
    SessionFull,
    SessionLimit,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


def workspaces(engine: Engine) -> int:
    assert isinstance(engine.backend, LocalBackend)
    return sum(len(s.workspaces) for s in engine.backend.pool._slots)


async def test_files_and_state_persist_between_turns(engine: Engine) -> None:
    async with engine.session(language="python") as s:
        await s.write_files({"sol.py": "import json\nprint(json.load(open('state.json'))['n'] + 1)"})
        await s.write_files({"state.json": '{"n": 41}'})
        r = await s.run("python3 sol.py")
        assert r.status is Status.OK and r.stdout == "42\n", (r.stderr, r.error)
        r = await s.run_code("open('made_by_run.txt', 'w').write('turn 2')")
        assert r.ok
        r = await s.run_program(Program(language="bash", source="cat made_by_run.txt"))
        assert r.stdout == "turn 2"
        assert await s.read_files(["made_by_run.txt", "nope"]) == {"made_by_run.txt": b"turn 2"}
        assert s.runs == 3
    assert s.closed and workspaces(engine) == 0
    with pytest.raises(SessionClosed):
        await s.run("true")


async def test_sessions_do_not_see_each_other(engine: Engine) -> None:
    async with engine.session() as a, engine.session() as b:
        await a.write_files({"secret": "a"})
        r = await b.run("ls")
        assert r.ok and "secret" not in r.stdout


async def test_sessions_opened_with_files_start_from_them_and_apart(engine: Engine) -> None:
    files = {f"src/f{i}.py": f"N = {i}\n".encode() for i in range(50)}
    async with engine.session(files=files) as a, engine.session(files=files) as b:
        assert (await a.run("rm src/f1.py; echo a > src/f2.py; ls src | wc -l")).stdout == "49\n"
        r = await b.run("ls src | wc -l; cat src/f2.py")
        assert r.stdout == "50\nN = 2\n", (r.stdout, r.stderr)
    assert workspaces(engine) == 0
    with pytest.raises(ValueError, match=r"'\.\.' components"):
        await engine.open_session(files={"../escape": b"x"})
    assert workspaces(engine) == 0 and engine._opening == 0 and engine._session_mb == 0


async def test_session_limits_apply_to_its_runs(engine: Engine) -> None:
    async with engine.session(limits=Limits(time_s=0.5, workdir_mb=2)) as s:
        assert (await s.run("sleep 5")).status is Status.TIMEOUT
        r = await s.run_code("open('big', 'wb').write(b'x' * (8 << 20))")
        assert r.status is Status.RUNTIME_ERROR
        assert (await s.run("echo still-alive")).stdout == "still-alive\n"


async def test_idle_session_expires_and_is_reaped(engine: Engine) -> None:
    s = await engine.open_session(idle_timeout_s=0.3)
    await s.write_files({"f": "x"})
    assert (await s.run("cat f")).stdout == "x"
    assert workspaces(engine) == 1
    idle_from = time.monotonic()
    await until(lambda: s.closed and workspaces(engine) == 0 and engine.stats.sessions == 0,
                "the idle session reaped")
    assert time.monotonic() - idle_from >= 0.3 - 0.05  # not before its idle timeout
    with pytest.raises(SessionExpired, match="idle"):
        await s.run("cat f")


async def test_ttl_expires_even_a_busy_session(engine: Engine) -> None:
    s = await engine.open_session(ttl_s=0.5, idle_timeout_s=60)
    for _ in range(3):
        await s.run("true")
    await asyncio.sleep(0.6)
    with pytest.raises(SessionExpired, match="ttl"):
        await s.run("true")
    await until(lambda: workspaces(engine) == 0, "the expired session's workspace freed")


async def test_session_limit() -> None:
    async with Engine(slots=1, max_sessions=2) as e:
        a = await e.open_session()
        b = await e.open_session()
        with pytest.raises(SessionLimit, match="max_sessions"):
            await e.open_session()
        await a.close()
        c = await e.open_session()
        await b.close()
        await c.close()
        assert workspaces(e) == 0


async def test_session_runs_are_never_answered_from_the_journal(tmp_path: Path) -> None:
    """A session run's output depends on the session's files: with a journal, the same command
    after the files changed, or in another session (another tenant), runs again."""
    async with Engine(slots=2, journal=tmp_path / "j.db") as e:
        async with e.session(client="alice") as a, e.session(client="bob") as b:
            await a.write_files({"f": "first"})
            assert (await a.run("cat f")).stdout == "first"
            await a.write_files({"f": "second"})
            assert (await a.run("cat f")).stdout == "second"
            await a.run("echo third > f")
            assert (await a.run("cat f")).stdout == "third\n"
            await b.write_files({"f": "bob's"})
            assert (await b.run("cat f")).stdout == "bob's"
        assert e.journal is not None and e.journal.counts() == {}


async def test_session_files_are_bounded_by_its_memory_limit(engine: Engine) -> None:
    """Files stay in memory between runs, outside any run's cgroup: a session with
    memory_mb=64 holds at most 64 MiB of them, whatever its workdir_mb."""
    statvfs = "import os; v = os.statvfs('.'); print(v.f_blocks * v.f_frsize >> 20)"
    async with engine.session(limits=Limits(memory_mb=64, workdir_mb=1024)) as s:
        assert s.storage_mb == 64
        assert (await s.run_code(statvfs)).stdout == "64\n"
        r = await s.run("head -c 200M /dev/zero > big")
        assert r.status in (Status.RUNTIME_ERROR, Status.MEMORY_LIMIT), (r.status, r.error)
        r = await s.run("du -sm . | cut -f1")
        assert r.ok and int(r.stdout) <= 64
        # Run by run, each within its own memory limit: the files still add up to 64 MiB at
        # most (each run's charge leaves with its cgroup; the tmpfs size is what bounds them).
        for i in range(4):
            await s.run(f"head -c 30M /dev/zero > part{i}")
        r = await s.run("du -sm . | cut -f1")
        assert r.ok and int(r.stdout) <= 64
        with pytest.raises(SessionFull, match="do not fit"):
            await s.write_files({"more": b"x" * (70 << 20)})
        assert (await s.run("echo alive")).stdout == "alive\n"


async def test_session_storage_budget() -> None:
    async with Engine(slots=1, session_memory_mb=100) as e:
        a = await e.open_session(limits=Limits(memory_mb=64, workdir_mb=64))
        with pytest.raises(SessionLimit, match="session_memory_mb"):
            await e.open_session(limits=Limits(memory_mb=512, workdir_mb=40))
        b = await e.open_session(limits=Limits(memory_mb=32, workdir_mb=1024))  # 32 MiB
        await a.close()
        c = await e.open_session(limits=Limits(workdir_mb=60))
        with pytest.raises(Exception, match="cobol"):  # a failed open gives its storage back
            await e.open_session(language="cobol", limits=Limits(workdir_mb=8))
        assert e._session_mb == 92 and workspaces(e) == 2
        await b.close()
        await c.close()
        assert e._session_mb == 0 and workspaces(e) == 0
