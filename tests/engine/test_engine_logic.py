"""Engine logic on an in-memory backend: retries, priorities, deadlines, idempotency, the journal.

No sandbox runs here (``ScriptedBackend`` answers in process), so these need no root and take
well under a second each; the real-sandbox behaviour is covered by the other engine tests.
Synchronisation is by events, never by sleeping.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sandloop.engine import DeadlineExceeded, Engine
from sandloop.engine.backends import Backend, Executor, Workspaces
from sandloop.engine.testing import ScriptedBackend
from sandloop.sandbox.models import ExecResult, Limits, Program, Status


def echo(program: Program, limits: Limits) -> ExecResult:
    return ExecResult(status=Status.OK, stdout=program.source)


def test_scripted_backend_implements_the_protocols() -> None:
    backend = ScriptedBackend()
    assert isinstance(backend, Executor) and isinstance(backend, Workspaces)
    assert isinstance(backend, Backend)


async def test_infrastructure_failures_are_retried_by_the_engine() -> None:
    backend = ScriptedBackend(echo, fail_first=2)
    async with Engine(backend, max_attempts=3, retry_backoff_s=0.0) as e:
        r = await e.run(Program(source="x"))
    assert r.status is Status.OK and r.stdout == "x"
    assert e.stats.retried == 2 and backend.calls == 3 and e.stats.infra_failures == 0


async def test_persistent_infrastructure_failure_is_a_sandbox_error_after_the_last_attempt() -> None:
    backend = ScriptedBackend(echo, fail_first=10)
    async with Engine(backend, max_attempts=3, retry_backoff_s=0.0) as e:
        r = await e.run(Program(source="x"))
    assert r.status is Status.SANDBOX_ERROR
    assert backend.calls == 3 and e.stats.infra_failures == 1


async def test_a_backend_that_cannot_isolate_is_not_retried() -> None:
    backend = ScriptedBackend(echo, fail_first=10, retryable=False)
    async with Engine(backend, max_attempts=3, retry_backoff_s=0.0) as e:
        r = await e.run(Program(source="x"))
    assert r.status is Status.SANDBOX_ERROR and backend.calls == 1


async def test_program_failures_are_results_and_never_retried() -> None:
    def crash(program: Program, limits: Limits) -> ExecResult:
        return ExecResult(status=Status.RUNTIME_ERROR, exit_code=1)

    backend = ScriptedBackend(crash)
    async with Engine(backend, retry_backoff_s=0.0) as e:
        r = await e.run(Program(source="x"))
    assert r.status is Status.RUNTIME_ERROR and backend.calls == 1 and e.stats.retried == 0


async def test_eval_jobs_overtake_queued_train_jobs() -> None:
    gate = asyncio.Event()
    order: list[str] = []

    async def held(program: Program, limits: Limits) -> ExecResult:
        await gate.wait()
        order.append(program.source)
        return ExecResult(status=Status.OK)

    backend = ScriptedBackend(held, slots=1)
    async with Engine(backend, cpus=1, reserve_slots=0, retry_backoff_s=0.0) as e:
        first = await e.submit(Program(source="running"), priority="train")
        trains = [await e.submit(Program(source=f"train{i}"), priority="train") for i in range(3)]
        ev = await e.submit(Program(source="eval"), priority="eval")
        gate.set()
        await asyncio.gather(first.result(), ev.result(), *(t.result() for t in trains))
    assert order[0] == "running" and order[1] == "eval"


async def test_a_deadline_withdraws_a_job_that_has_not_finished() -> None:
    never = asyncio.Event()

    async def hang(program: Program, limits: Limits) -> ExecResult:
        await never.wait()
        return ExecResult(status=Status.OK)

    async with Engine(ScriptedBackend(hang, slots=1), retry_backoff_s=0.0) as e:
        with pytest.raises(DeadlineExceeded):
            await e.run(Program(source="x"), timeout_s=0.05)
        assert e.stats.deadline_exceeded == 1


async def test_the_same_key_in_flight_runs_once() -> None:
    gate = asyncio.Event()

    async def held(program: Program, limits: Limits) -> ExecResult:
        await gate.wait()
        return ExecResult(status=Status.OK, stdout=program.source)

    backend = ScriptedBackend(held)
    async with Engine(backend) as e:
        a = await e.submit(Program(source="a"), key="k1")
        b = await e.submit(Program(source="a"), key="k1")
        gate.set()
        ra, rb = await asyncio.gather(a.result(), b.result())
    assert ra.stdout == rb.stdout == "a" and backend.calls == 1


async def test_a_journalled_result_is_never_recomputed(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    backend = ScriptedBackend(echo)
    async with Engine(backend, journal=db) as e:
        r1 = await e.run(Program(source="once"), key="job-1")
    backend2 = ScriptedBackend(echo)
    async with Engine(backend2, journal=db) as e2:
        r2 = await e2.run(Program(source="once"), key="job-1")
    assert r1.stdout == r2.stdout == "once"
    assert backend.calls == 1 and backend2.calls == 0 and e2.stats.from_journal == 1


async def test_resume_is_iterated_or_awaited(tmp_path: Path) -> None:
    # Jobs left pending by infrastructure failures; a new engine resumes them. `async for`
    # yields each as it ends; `await engine.resume()` (the README once showed it, and it raised
    # TypeError) gives the list of all.
    db = tmp_path / "jobs.db"
    async with Engine(ScriptedBackend(echo, fail_first=10), journal=db, max_attempts=1,
                      retry_backoff_s=0.0) as e:
        for k in ("a", "b"):
            assert (await e.run(Program(source=k), key=k)).status is Status.SANDBOX_ERROR
    async with Engine(ScriptedBackend(echo), journal=db) as e:
        done = await e.resume()
    assert sorted((k, r.stdout) for k, r in done) == [("a", "a"), ("b", "b")]
    async with Engine(ScriptedBackend(echo), journal=db) as e:
        assert [x async for x in e.resume()] == []  # nothing is left unfinished
        assert await e.resume_graphs() == []


async def test_session_files_persist_between_runs() -> None:
    def cat(program: Program, limits: Limits) -> ExecResult:
        content = program.files.get("state.txt", b"")
        text = content.decode() if isinstance(content, bytes) else content
        return ExecResult(status=Status.OK, stdout=text)

    backend = ScriptedBackend(cat)
    async with Engine(backend) as e, e.session(language="bash") as s:
        await s.write_files({"state.txt": "turn 1"})
        r1 = await s.run("cat state.txt")
        await s.write_files({"state.txt": "turn 2"})
        r2 = await s.run("cat state.txt")
    assert (r1.stdout, r2.stdout) == ("turn 1", "turn 2")
    assert backend.workspaces and all(ws.closed for ws in backend.workspaces)
