"""Withdrawing a running job kills its sandbox run and frees its slot."""

from __future__ import annotations

import asyncio
import time

from engine_helpers import assert_none_left, sandbox_processes

from sandloop import Engine, Limits, Program, Status


async def test_cancelling_a_running_job_kills_it_and_frees_the_slot() -> None:
    before = sandbox_processes()
    async with Engine(slots=1) as engine:
        handle = await engine.submit(Program(source="import time; time.sleep(60)"),
                                     Limits(time_s=120))
        await asyncio.sleep(0.8)  # running by now
        assert handle.cancel()
        t = time.monotonic()
        r = await engine.run(Program(source="print('after')"), Limits(time_s=10))
        assert r.status is Status.OK and r.stdout == "after\n"
        assert time.monotonic() - t < 10  # the slot did not wait for the 60 s sleeper
        assert engine.snapshot().running == 0
    assert_none_left(before)


async def test_engine_pool_scales_between_min_and_max_slots() -> None:
    before = sandbox_processes()
    async with Engine(slots=3, min_slots=1) as engine:
        pool = engine.backend.pool  # type: ignore[attr-defined]
        assert pool.slots_now == 1
        progs = [Program(source="import time; time.sleep(0.5)")] * 6
        results = [r async for _, r in engine.stream(progs, Limits(time_s=5, cpus=0.25))]
        assert all(r.status is Status.OK for r in results)
        assert pool.slots_now > 1
    assert_none_left(before)


async def test_leaving_a_stream_early_kills_its_running_jobs() -> None:
    # The stream's docstring: leaving the loop cancels the jobs not yet finished. A running one
    # must be killed, not waited for (Ctrl-C on `sandloop exec-batch` waited for every run).
    import contextlib

    before = sandbox_processes()
    t = 0.0
    async with Engine(slots=2) as engine:
        runs = engine.stream([(Program(source="print(1)"), Limits(time_s=10)),
                              (Program(source="import time; time.sleep(60)"), Limits(time_s=120))])
        async with contextlib.aclosing(runs):
            async for _i, r in runs:
                assert r.stdout == "1\n"
                await asyncio.sleep(0.8)  # the sleeper is running by now
                break
        t = time.monotonic()
    assert time.monotonic() - t < 10  # closing did not wait for the 60 s sleeper
    assert_none_left(before)
