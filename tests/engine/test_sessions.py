"""Multi-turn sessions over real sandboxes: persistence, expiry, reaping, limits."""

from __future__ import annotations

import asyncio

import pytest

from sandloop import Limits, Program, Status
from sandloop.engine import (
    Engine,
    LocalBackend,
    SessionClosed,
    SessionExpired,
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
    await asyncio.sleep(0.9)  # idle > 0.3 s, and the reaper has passed
    assert s.closed and workspaces(engine) == 0 and engine.stats.sessions == 0
    with pytest.raises(SessionExpired, match="idle"):
        await s.run("cat f")


async def test_ttl_expires_even_a_busy_session(engine: Engine) -> None:
    s = await engine.open_session(ttl_s=0.5, idle_timeout_s=60)
    for _ in range(3):
        await s.run("true")
    await asyncio.sleep(0.6)
    with pytest.raises(SessionExpired, match="ttl"):
        await s.run("true")
    await asyncio.sleep(0.3)
    assert workspaces(engine) == 0


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
